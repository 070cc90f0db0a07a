"""Record data above the inline limit kept as files beside the store (schema 9, dwn/blobs.py):
a committed row never points at a missing file, a file without a committed row does not
outlive the next commit or open, and a damaged file is refused, never returned."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn import blobs as blobs_module
from p2psync.dwn import store as store_module
from p2psync.dwn.blobs import (
    SEAL_ATTRIBUTE,
    STAGED_MAX,
    STALE_TEMPORARY_SECONDS,
    BlobCorrupt,
    BlobFiles,
    parse_reference,
)
from p2psync.dwn.canonical import archived_data
from p2psync.dwn.datacid import data_cid
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records import create_records_delete
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import SCHEMA_VERSION, Store
from tests.replication.support import Clock, seeded, undo_schema_9

ALICE = seeded("alice")
BIG = 100_000  # above the 30,000-byte inline limit: out of line, as a file


def _big(tag: int) -> bytes:
    return tag.to_bytes(4, "big") * (BIG // 4)


def _write(dwn: Dwn, clock: Clock, data: bytes, *, source: RecordsWrite | None = None) -> RecordsWrite:
    now = clock.tick()
    if source is None:
        write = RecordsWrite.create(signer=ALICE, data=data, data_format="application/octet-stream",
                                    message_timestamp=now, date_created=now)
    else:
        write = RecordsWrite.create_from(source.message, signer=ALICE, data=data, message_timestamp=now)
    reply = dwn.process_message(ALICE.did, write.message, data)
    assert reply.code == 202, reply.detail
    return write


def references(store: Store) -> set[str]:
    """Every blob reference a row holds (the data rows' and the archive's)."""
    rows = store.conn.execute(
        "SELECT bytes FROM data WHERE typeof(bytes) = 'text'"
        " UNION SELECT data FROM archive WHERE typeof(data) = 'text'").fetchall()
    return {str(r[0]) for r in rows}


def assert_files_match_rows(store: Store) -> None:
    """Each referenced file is there and whole; each file is referenced."""
    held = references(store)
    for reference in held:
        assert len(store.blobs.read(reference)) == parse_reference(reference)[1]
    assert set(store.blobs.names()) == {parse_reference(r)[0] for r in held}


def test_large_data_is_a_file_and_reads_back(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    dwn, clock = Dwn(store), Clock()
    write = _write(dwn, clock, _big(1))
    value = store.conn.execute("SELECT bytes FROM data").fetchone()[0]
    assert value == f"{data_cid(_big(1))}:{BIG}"  # a reference, not the bytes
    assert store.data.get(ALICE.did, write.message["recordId"], data_cid(_big(1))) == _big(1)
    assert store.data.size(ALICE.did, write.message["recordId"], data_cid(_big(1))) == BIG
    assert os.path.getsize(store.blobs.path(data_cid(_big(1)))) == BIG
    # No row holds the bytes themselves.
    assert store.scalar("SELECT coalesce(max(length(CAST(data AS BLOB))), 0) FROM archive") < 1000
    assert store.usage(ALICE.did)[1] > BIG  # the usage counts the bytes the reference names
    assert_files_match_rows(store)


def test_the_same_data_under_two_records_is_one_file_kept_while_a_row_holds_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    cid, bob = data_cid(_big(1)), seeded("bob").did
    keys = [(ALICE.did, "record-1"), (ALICE.did, "record-2"), (bob, "record-1")]
    with store.transaction():
        for tenant, record in keys:
            store.data.put(tenant, record, cid, _big(1))
    assert store.blobs.names() == [cid]
    for n, (tenant, record) in enumerate(keys):
        with store.transaction():
            store.data.delete(tenant, record, cid)
            assert store.blobs.names() == [cid]  # never inside the transaction
        assert store.blobs.names() == ([cid] if n < len(keys) - 1 else [])
    assert_files_match_rows(store)


def test_pruned_records_keep_their_data_in_the_archive(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    dwn, clock = Dwn(store), Clock()
    first, second = _write(dwn, clock, _big(1)), _write(dwn, clock, _big(1))
    assert store.blobs.names() == [data_cid(_big(1))]
    for write in (first, second):
        delete = create_records_delete(record_id=write.message["recordId"], signer=ALICE,
                                       message_timestamp=clock.tick(), prune=True)
        assert dwn.process_message(ALICE.did, delete).code == 202
        assert_files_match_rows(store)
    assert store.conn.execute("SELECT count(*) FROM data").fetchone()[0] == 0
    assert store.blobs.names() == [data_cid(_big(1))]  # the archive's rows hold it


def test_an_update_keeps_the_superseded_data_for_the_archive(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    dwn, clock = Dwn(store), Clock()
    initial = _write(dwn, clock, _big(1))
    _write(dwn, clock, _big(2), source=initial)
    assert store.conn.execute("SELECT count(*) FROM data").fetchone()[0] == 1
    # The archive's row of the initial write took the reference over from the data row.
    assert set(store.blobs.names()) == {data_cid(_big(1)), data_cid(_big(2))}
    assert archived_data(store, ALICE.did, message_cid(initial.message)) == (True, _big(1))
    assert_files_match_rows(store)


def test_a_warp_that_undoes_and_redoes_finds_every_file(tmp_path: Path) -> None:
    """An older update arriving late: the warp undoes the newer update (its session changeset
    brings the deleted data row back, reference and all), processes the late one, and the
    newer one again. Every row then still finds its file; nothing was removed mid-way."""
    source, replica = Dwn(Store(tmp_path / "a.db")), Dwn(Store(tmp_path / "b.db"))
    clock = Clock()
    initial = _write(source, clock, _big(1))
    middle = _write(source, clock, _big(2), source=initial)
    newest = _write(source, clock, _big(3), source=middle)
    for write, data in ((initial, _big(1)), (newest, _big(3)), (middle, _big(2))):
        result = replica.apply_replicated_message(ALICE.did, write.message, data)
        assert result.kind in ("Applied", "Superseded"), result
        assert_files_match_rows(replica.store)
    assert replica.store.data.get(ALICE.did, initial.message["recordId"], data_cid(_big(3))) == _big(3)
    assert replica.history.verify(ALICE.did) == {"missing": [], "extra": [], "changed": [], "data": []}
    replica.history.rebuild(ALICE.did)  # every data row deleted and made again in one transaction
    assert_files_match_rows(replica.store)


def test_a_rolled_back_write_leaves_no_file(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    dwn, clock = Dwn(store), Clock()
    with pytest.raises(RuntimeError), store.transaction():
        _write(dwn, clock, _big(1))
        assert store.blobs.names() == [data_cid(_big(1))]  # durable before the commit
        raise RuntimeError("the batch fails")
    assert store.blobs.names() == []
    # A savepoint rolled back inside a transaction that commits: removed after the commit.
    with store.transaction():
        with pytest.raises(RuntimeError), store.transaction():
            _write(dwn, clock, _big(2))
            raise RuntimeError("one write fails")
        kept = _write(dwn, clock, _big(3))
    assert store.blobs.names() == [data_cid(_big(3))]
    assert store.data.get(ALICE.did, kept.message["recordId"], data_cid(_big(3))) == _big(3)


def test_open_collects_files_a_crash_left(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    _write(Dwn(store), Clock(), _big(1))
    store.close()
    blobs = Path(str(path) + ".blobs")
    orphan = data_cid(_big(9))
    (blobs / orphan).write_bytes(_big(9))  # renamed into place, its transaction never committed
    stale, fresh = blobs / ".tmp-stale", blobs / ".tmp-fresh"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")  # perhaps another process's, being written now
    old = time.time() - STALE_TEMPORARY_SECONDS - 60
    os.utime(stale, (old, old))
    reopened = Store(path)
    assert not (blobs / orphan).exists() and not stale.exists() and fresh.exists()
    assert reopened.blobs.names() == [data_cid(_big(1))]
    assert_files_match_rows(reopened)


@pytest.mark.parametrize("damage", ["truncated", "altered", "missing"])
def test_a_damaged_file_is_refused(tmp_path: Path, damage: str) -> None:
    store = Store(tmp_path / "s.db")
    write = _write(Dwn(store), Clock(), _big(1))
    path = store.blobs.path(data_cid(_big(1)))
    if damage == "truncated":
        path.write_bytes(_big(1)[:-1])
    elif damage == "altered":
        path.write_bytes(b"\xff" + _big(1)[1:])
    else:
        path.unlink()
    with pytest.raises(BlobCorrupt) as raised:
        store.data.get(ALICE.did, write.message["recordId"], data_cid(_big(1)))
    assert raised.value.code == "StoreDataCorrupt" and raised.value.status == 500


def test_a_file_written_here_is_sealed_and_read_without_hashing_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seal (dwn/blobs.py) spares a read the SHA-256 pass; a file without it is hashed."""
    store = Store(tmp_path / "s.db")
    write = _write(Dwn(store), Clock(), _big(1))
    path = store.blobs.path(data_cid(_big(1)))
    st = path.stat()
    assert os.getxattr(path, SEAL_ATTRIBUTE) == f"{st.st_mtime_ns}:{st.st_size}".encode()
    hashed: list[int] = []
    monkeypatch.setattr(blobs_module, "data_cid", lambda data: hashed.append(len(data)) or data_cid(data))

    def read() -> bytes | None:
        return store.data.get(ALICE.did, write.message["recordId"], data_cid(_big(1)))

    assert read() == _big(1) and hashed == []
    os.removexattr(path, SEAL_ATTRIBUTE)  # copied without its extended attributes, say
    assert read() == _big(1) and hashed == [BIG]


def test_a_file_altered_in_place_no_longer_matches_its_seal(tmp_path: Path) -> None:
    """Same inode, same size, the seal still attached: the new modification time gives it away."""
    store = Store(tmp_path / "s.db")
    write = _write(Dwn(store), Clock(), _big(1))
    path = store.blobs.path(data_cid(_big(1)))
    with open(path, "r+b") as f:
        f.write(b"\xff")
    assert os.getxattr(path, SEAL_ATTRIBUTE)
    with pytest.raises(BlobCorrupt, match="does not hash to its name"):
        store.data.get(ALICE.did, write.message["recordId"], data_cid(_big(1)))


@pytest.mark.parametrize("size", [30_001, 4096 * 300, (1 << 20) * 3 + 7])
@pytest.mark.parametrize("direct", ["taken", "refused at open", "refused at write"])
def test_a_file_is_written_whole_past_the_page_cache_or_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, direct: str
) -> None:
    """O_DIRECT from the aligned buffer (a tail padded, then cut), or, where the file system
    refuses it, the ordinary write: either way the same bytes, fsync'd and sealed."""
    data = os.urandom(size)
    real_open = os.open
    if direct == "refused at open":
        def no_direct(path: Any, flags: int, *args: Any) -> int:
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "O_DIRECT not supported")
            return real_open(path, flags, *args)
        monkeypatch.setattr(os, "open", no_direct)
    elif direct == "refused at write":
        def no_pwrite(fd: int, data: Any, offset: int) -> int:
            raise OSError(errno.EINVAL, "Invalid argument")
        monkeypatch.setattr(os, "pwrite", no_pwrite)
    buffered: list[int] = []
    monkeypatch.setattr(blobs_module, "_drop_cached", buffered.append)  # only the ordinary write calls it
    blobs = BlobFiles(tmp_path / "blobs")
    assert blobs.direct == hasattr(os, "O_DIRECT")
    assert blobs.write(data, "bafkfake") is True
    assert len(buffered) == (0 if direct == "taken" else 1)
    path = blobs.path("bafkfake")
    assert path.read_bytes() == data
    st = path.stat()
    assert os.getxattr(path, SEAL_ATTRIBUTE) == f"{st.st_mtime_ns}:{st.st_size}".encode()
    assert [p.name for p in blobs.directory.iterdir()] == ["bafkfake"]  # no temporary left


def test_staged_data_is_installed_by_the_write_and_bounded(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    dwn, clock = Dwn(store), Clock()
    store.blobs.stage(_big(1), data_cid(_big(1)))
    assert store.blobs.names() == []  # staged under a temporary name only
    _write(dwn, clock, _big(1))
    assert store.blobs.names() == [data_cid(_big(1))]
    assert [p for p in os.listdir(store.blobs.directory) if p.startswith(".tmp-")] == []  # renamed, not copied
    for tag in range(10, 10 + STAGED_MAX + 2):  # never kept: only the newest few wait
        store.blobs.stage(_big(tag), data_cid(_big(tag)))
    assert len(os.listdir(store.blobs.directory)) == 1 + STAGED_MAX
    store.close()
    assert os.listdir(store.blobs.directory) == [data_cid(_big(1))]


def test_a_schema_8_store_with_its_data_in_sqlite_reads_both(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = Store(path)
    dwn, clock = Dwn(store), Clock()
    old = _write(dwn, clock, _big(1))
    undo_schema_9(store.conn)  # the data back into SQLite, as schema 8 kept it
    store.conn.execute("PRAGMA user_version=8")
    store.close()
    for name in os.listdir(str(path) + ".blobs"):
        os.unlink(os.path.join(str(path) + ".blobs", name))
    reopened = Store(path)
    assert reopened.scalar("PRAGMA user_version") == SCHEMA_VERSION == 10
    assert type(reopened.conn.execute("SELECT bytes FROM data").fetchone()[0]) is bytes
    new = _write(Dwn(reopened), clock, _big(2))
    assert reopened.data.get(ALICE.did, old.message["recordId"], data_cid(_big(1))) == _big(1)
    assert reopened.data.get(ALICE.did, new.message["recordId"], data_cid(_big(2))) == _big(2)
    _write(Dwn(reopened), clock, _big(3), source=old)  # an update moves old bytes to the archive
    assert archived_data(reopened, ALICE.did, message_cid(old.message)) == (True, _big(1))
    assert_files_match_rows(reopened)


def test_collecting_never_waits_for_another_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collection that finds the store locked by another connection gives up at once (its
    busy handler is never asked to wait) and keeps its candidates; the files are untouched."""
    asked: list[int] = []

    def recording(timeout: float) -> Callable[[int], bool]:
        def busy(tries: int) -> bool:
            asked.append(tries)
            return False  # a real handler would sleep and try again

        return busy

    path = tmp_path / "s.db"
    store = Store(path)
    _write(Dwn(store), Clock(), _big(1))
    monkeypatch.setattr(store_module, "_busy_handler", recording)
    other = Store(path)
    with store.transaction():
        store.data.delete(ALICE.did, "no-such-record", "x")  # takes the write lock
        assert other.collect_blobs(everything=True) == 0
    assert asked == []
    assert other.collect_blobs(everything=True) == 0  # referenced: kept
    assert store.blobs.names() == [data_cid(_big(1))]
