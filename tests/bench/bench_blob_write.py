"""What writing a large record's data to a fresh file costs: through the page cache, with its pages
dropped, or past the cache (O_DIRECT).

    .venv/bin/python tests/bench/bench_blob_write.py [--mib 10] [--files 30] [--rounds 2]

Writes ``--files`` new files of ``--mib`` MiB each into a temporary directory, the way the blob
store does (p2psync/dwn/blobs.py: a temporary file, written, fsync'd, renamed), alternating
three ways for ``--rounds`` rounds: *kept* leaves the written pages in the page cache (what the
store did first); *dropped* is the store's ``BlobFiles.write`` through the page cache, which
tells the kernel it may drop them after the fsync; *direct* is the store's ``BlobFiles.write``
as it runs where the file system allows, O_DIRECT from an aligned buffer. Prints the yardstick V
(Ed25519 verifies per CPU second, same run) and, for each way, CPU (user + system of this
process) and wall time a file.

On the VMs of this project, a page the page cache takes fresh is memory the guest had given back
to the host, and faulting it in again costs 3-10 µs a page: a 10 MiB file then costs ~29 ms of
CPU to write. Dropped pages are reused by the next file at memory speed; O_DIRECT takes none.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.blobs import BlobFiles  # noqa: E402
from tests.bench.bench_engine import verify_rate  # noqa: E402


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def kept(directory: Path, data: bytes, name: str) -> None:
    temporary = directory / f".tmp-{name}"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, directory / name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=10)
    ap.add_argument("--files", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    v = verify_rate()
    print(f"yardstick V = {v:,.0f} Ed25519 verifies/s on one core, measured now")
    base = os.urandom(args.mib * 1024 * 1024)
    with tempfile.TemporaryDirectory() as tmp:
        serial = 0
        for round_ in range(1, args.rounds + 1):
            for way in ("kept", "dropped", "direct"):
                directory = Path(tmp) / f"{way}-{round_}"
                directory.mkdir()
                blobs = BlobFiles(directory)
                blobs.direct = way == "direct"
                files = []
                for _ in range(args.files):  # distinct contents: distinct files, as records' are
                    serial += 1
                    data = serial.to_bytes(8, "big") + base[8:]
                    files.append((data, hashlib.sha256(data).hexdigest()))  # the store's name: the dataCid
                wall, spent = time.perf_counter(), cpu()
                for data, name in files:
                    if way == "kept":
                        kept(directory, data, name)
                    else:
                        blobs.write(data, name)
                spent, wall = cpu() - spent, time.perf_counter() - wall
                print(f"round {round_}, {way:7s}: {spent / args.files * 1e3:6.1f} ms CPU a {args.mib} MiB file "
                      f"({spent / args.files * v:,.0f} verifies), {wall / args.files * 1e3:6.1f} ms wall")
                # Left in place until the end, as a store's files are: a cache that only grows
                # takes fresh pages, while one whose files were just removed reuses theirs.


if __name__ == "__main__":
    main()
