"""Large record data as files beside the store: ``<store file>.blobs/<dataCid>``.

Record data above the inline limit (the ``data`` table's, and the archive's copies of it) is
kept as one immutable file per distinct content, named by its ``dataCid``, rather than as a
SQLite BLOB: a 10 MiB blob in SQLite is written twice (WAL, then the checkpoint) and read back
through a chain of overflow pages (issue #17). The SQLite row keeps a *blob reference*: the
TEXT value ``"<dataCid>:<size>"`` in the very column that holds bytes otherwise (``data.bytes``,
``archive.data``). Real data is always bound as a BLOB, so the value's type tells the two
apart, and whatever copies a value — the archive's delete trigger, a session changeset, an
undo — carries the reference with it.

The rules that keep a committed row from pointing at a missing file (p2psync/dwn/store.py
applies them):

- a file is written to a temporary name, fsync'd, renamed to its final name and the directory
  fsync'd, all before the transaction that references it commits;
- final names are created and removed only by a connection holding the store's write lock, so
  a collector (which holds it) never sees a file that a transaction in flight is about to
  reference;
- a file is removed only after a commit, and only when no committed row references it: never
  inside a transaction that could roll back and bring its row back.

Every read checks a file's size; its content is checked against its name (the dataCid) unless
the file carries this store's *seal*: the extended attribute :data:`SEAL_ATTRIBUTE`, written
when the file was written from bytes already checked, holding the file's modification time
and size as they were then. A write through the file system gives the file a new modification
time (Linux 6.13+ gives it a distinct fine-grained one even within the same clock tick, once
the time was read, as the seal reads it; older kernels leave a window of one coarse tick after
our write), so an altered file no longer matches its seal and is hashed, and refused. What the
seal does not catch is what SQLite does not catch in its own pages either: the medium
changing bytes under an unchanged inode, or a writer that puts the old time back on purpose.
A peer that receives the data checks it anyway (replication-profiles.md §9.1), so nothing
damaged is ever *admitted*; and a file whose seal is missing or stale (a copy made without
extended attributes, a file system without them) is hashed on every read, as before. The
seal saves a SHA-256 pass over the data on every serve: ~6 ms of CPU for 10 MiB, ~20% of a
source's CPU in the 10 MiB pull (docs/benchmarks.md).

Content addressing shares one file between every row that holds the same data (two records,
two tenants, a data row and the archive's row of the same write); the rows themselves are the
reference count (indexed, see schema 9), so nothing has to keep a counter right under undo.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Final

from p2psync.dwn.datacid import data_cid
from p2psync.dwn.errors import DwnError

#: Data longer than this is kept as a file (the reference's limit for data kept inline in a
#: message, handlers/records.py ``MAX_DATA_SIZE_ENCODED``: larger data is what the ``data``
#: table held).
BLOB_THRESHOLD: Final = 30_000

#: A temporary file older than this is a writer's leftover (it crashed mid-write): removed by
#: the collector on open. A live writer's temporary file is younger (it renames it within one
#: transaction of writing it).
STALE_TEMPORARY_SECONDS: Final = 3600.0

#: Staged files (:meth:`BlobFiles.stage`) kept waiting for the write that installs them; an
#: older one is dropped (its data was refused, or arrived twice). A sink stages what it fetched
#: ahead of its turn: 32 MiB of prefetch (replication/sink.py) is three 10 MiB records.
STAGED_MAX: Final = 8

_TEMPORARY_PREFIX: Final = ".tmp-"

#: The extended attribute that seals a file as checked (see the module doc); its value is
#: ``"<st_mtime_ns>:<st_size>"`` of the file when it was sealed.
SEAL_ATTRIBUTE: Final = "user.p2psync.checked"


def _seal_value(st: os.stat_result) -> bytes:
    return f"{st.st_mtime_ns}:{st.st_size}".encode()


def _seal(fd: int) -> None:
    """Seal a file just written (and fsync'd) from checked bytes; quietly nothing where the
    file system or the platform has no extended attributes."""
    with contextlib.suppress(OSError, AttributeError):
        os.setxattr(fd, SEAL_ATTRIBUTE, _seal_value(os.fstat(fd)))


def _sealed(fd: int, st: os.stat_result) -> bool:
    """Whether the open file ``fd``, whose status is ``st``, carries a seal that matches it."""
    try:
        return os.getxattr(fd, SEAL_ATTRIBUTE) == _seal_value(st)
    except (OSError, AttributeError):
        return False


def _drop_cached(fd: int) -> None:
    """Let the kernel drop a written and fsync'd file's pages from its cache.

    A fresh file's pages are new page-cache memory, and a busy cache takes them from memory
    the kernel has given back (on these VMs, the host's: 3-10 µs a page to fault in again):
    writing 10 MiB cost 29 ms of CPU that way, against 4 ms when each file's clean pages are
    dropped after its fsync and the next file reuses them (tests/bench/bench_blob_write.py).
    A replica rarely reads large data right after storing it, and reads it from disk when it
    does."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


#: Write blob files past the page cache (O_DIRECT) where the platform and file system allow.
DIRECT_WRITES: Final = hasattr(os, "O_DIRECT")
#: O_DIRECT wants the buffer, the offset and the length aligned; 4096 covers the logical block
#: sizes of the disks here (512 or 4096).
_DIRECT_ALIGN: Final = 4096
#: The aligned buffer each writing thread copies data through (reused: a fresh one would be
#: fresh pages, the very cost this avoids).
_DIRECT_BUFFER: Final = 1 << 20
_direct_buffers = threading.local()


def _write_direct(path: Path, data: bytes | bytearray | memoryview) -> bool:
    """Write ``data`` to the new file ``path`` with O_DIRECT, fsync and seal it; False (and no
    file) where the file system refuses O_DIRECT (tmpfs, some network file systems): the caller
    then writes it through the page cache.

    Through the page cache, a new 10 MiB file costs ~4 ms of CPU even with its pages dropped
    after the fsync (29 ms without, on these VMs); straight from an aligned buffer, ~2 ms
    (tests/bench/bench_blob_write.py). The tail is padded to the alignment, then cut back by
    ``ftruncate``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
    except OSError:
        return False
    try:
        buffer = getattr(_direct_buffers, "buffer", None)
        if buffer is None:
            buffer = _direct_buffers.buffer = mmap.mmap(-1, _DIRECT_BUFFER)  # page-aligned
        view = memoryview(data).cast("B")
        size = len(view)
        done = 0
        while done < size:
            n = min(_DIRECT_BUFFER, size - done)
            buffer[:n] = view[done : done + n]
            aligned = -(-n // _DIRECT_ALIGN) * _DIRECT_ALIGN
            if aligned != n:
                buffer[n:aligned] = bytes(aligned - n)
            with memoryview(buffer)[:aligned] as chunk:
                written = os.pwrite(fd, chunk, done)
            if written != aligned:
                raise OSError(f"short O_DIRECT write: {written} of {aligned} bytes")
            done += n
        if size % _DIRECT_ALIGN:
            os.ftruncate(fd, size)
        os.fsync(fd)
        _seal(fd)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        if exc.errno == errno.EINVAL:  # opened, but the file system would not write that way
            return False
        raise
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return True


def blob_reference(cid: str, size: int) -> str:
    """The TEXT value a row keeps for data held as the file ``cid``."""
    return f"{cid}:{size}"


def parse_reference(reference: str) -> tuple[str, int]:
    """(dataCid, size) of a blob reference."""
    cid, _, size = reference.partition(":")
    return cid, int(size)


class BlobCorrupt(DwnError):
    """A blob file is missing, truncated or does not hash to its name: never served."""

    def __init__(self, detail: str) -> None:
        super().__init__("StoreDataCorrupt", detail, 500)


class BlobFiles:
    """The directory of blob files; knows files, not rows (the store decides what is live).

    ``directory`` None: a store with no file (SQLite's ``:memory:``) keeps its data in its
    rows, and this holds nothing (``enabled`` is False).
    """

    def __init__(self, directory: Path | None) -> None:
        self.enabled = directory is not None
        self.directory = directory if directory is not None else Path()
        #: whether the directory is known to exist (made on the first write)
        self._made = directory is not None and directory.is_dir()
        # dataCid -> a written, fsync'd temporary file holding it, not yet installed
        self._staged: OrderedDict[str, Path] = OrderedDict()
        self._lock = threading.Lock()  # `stage` runs on worker threads
        #: write files with O_DIRECT where the file system takes it (see :func:`_write_direct`)
        self.direct = DIRECT_WRITES

    def path(self, cid: str) -> Path:
        return self.directory / cid

    def write(self, data: bytes | bytearray | memoryview, cid: str) -> bool:
        """Make the file ``cid`` hold ``data`` (which hashes to ``cid``: the caller checked),
        durably, unless a whole one is already there. Returns whether it wrote one.

        The caller holds the store's write lock (see the module's rules)."""
        final = self.path(cid)
        try:
            if final.stat().st_size == len(data):
                return False
        except FileNotFoundError:
            pass
        with self._lock:
            staged = self._staged.pop(cid, None)
        if staged is not None:
            try:
                if staged.stat().st_size == len(data):
                    self.install(staged, cid)
                    return True
            except FileNotFoundError:
                pass
            staged.unlink(missing_ok=True)
        temporary = self._written(data)
        try:
            self.install(temporary, cid)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        return True

    def _written(self, data: bytes | bytearray | memoryview) -> Path:
        """A new temporary file holding ``data``, fsync'd (none is left behind on failure)."""
        temporary = self.temporary()
        try:
            if not (self.direct and _write_direct(temporary, data)):
                with open(temporary, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                    _seal(f.fileno())
                    _drop_cached(f.fileno())
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        return temporary

    def stage(self, data: bytes | bytearray | memoryview, cid: str) -> None:
        """Write ``data`` (which hashes to ``cid``) to a temporary file and fsync it, ahead of
        the transaction that will keep it: :meth:`write` then only renames it into place.

        Touches no row and takes no lock, so it runs on a worker thread while the caller's
        event loop goes on (a sink stages an attachment as soon as it has it all, issue #17).
        A staged file nobody installs is dropped after :data:`STAGED_MAX` newer ones, on
        :meth:`discard_staged`, or (after a crash) as a stale temporary file.
        """
        if not self.enabled:
            return
        try:
            if self.path(cid).stat().st_size == len(data):
                return
        except FileNotFoundError:
            pass
        temporary = self._written(data)
        dropped: list[Path] = []
        with self._lock:
            previous = self._staged.pop(cid, None)
            if previous is not None:
                dropped.append(previous)
            self._staged[cid] = temporary
            while len(self._staged) > STAGED_MAX:
                dropped.append(self._staged.popitem(last=False)[1])
        for path in dropped:
            path.unlink(missing_ok=True)

    def discard_staged(self) -> None:
        """Remove every staged file not installed (the store is closing)."""
        with self._lock:
            staged = list(self._staged.values())
            self._staged.clear()
        for path in staged:
            path.unlink(missing_ok=True)

    def temporary(self) -> Path:
        """A fresh temporary name in the directory (made if need be)."""
        if not self._made:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._made = True
        return self.directory / f"{_TEMPORARY_PREFIX}{uuid.uuid4().hex}"

    def install(self, temporary: Path, cid: str) -> None:
        """Rename a written and fsync'd temporary file to ``cid`` and make the rename durable."""
        os.replace(temporary, self.path(cid))
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self, reference: str) -> bytes:
        """The data a reference names, checked: its size, and its dataCid unless the file's
        seal still matches it (see the module doc). A truncated, altered or missing file
        raises :class:`BlobCorrupt`; it is never returned."""
        cid, size = parse_reference(reference)
        try:
            with open(self.path(cid), "rb") as f:
                fd = f.fileno()
                before = os.fstat(fd)
                data = f.read(size + 1)
                # Sealed, and not changed while we read it.
                trusted = _sealed(fd, before) and _seal_value(os.fstat(fd)) == _seal_value(before)
        except FileNotFoundError:
            raise BlobCorrupt(f"the data file {cid} is missing from {self.directory}") from None
        if len(data) != size:
            raise BlobCorrupt(f"the data file {cid} holds {len(data)} bytes, not {size}")
        if not trusted and data_cid(data) != cid:
            raise BlobCorrupt(f"the data file {cid} does not hash to its name")
        return data

    def names(self) -> list[str]:
        """The final names present (the dataCids held); removes stale temporary files."""
        if not self.enabled or not self.directory.is_dir():
            return []
        out: list[str] = []
        now = time.time()
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.startswith(_TEMPORARY_PREFIX):
                    try:
                        if now - entry.stat().st_mtime > STALE_TEMPORARY_SECONDS:
                            os.unlink(entry.path)
                    except FileNotFoundError:
                        pass
                elif entry.is_file():
                    out.append(entry.name)
        return out

    def remove(self, cid: str) -> None:
        self.path(cid).unlink(missing_ok=True)
