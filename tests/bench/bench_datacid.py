"""Throughput of data_cid and DataCidBuilder against plain sha256 (prints figures).

Run: .venv/bin/python tests/bench/bench_datacid.py  (or `make bench`)
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable

from p2psync.dwn.datacid import DataCidBuilder, data_cid

MIB = 1024 * 1024
SIZES_MIB = (10, 100)
REPEATS = 3  # best of three: the machine is shared, the minimum is the honest figure
STREAM_PIECE = 64 * 1024  # a typical socket/file read size


def _best_seconds(fn: Callable[[bytes], object], data: bytes) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn(data)
        best = min(best, time.perf_counter() - start)
    return best


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _streamed(data: bytes) -> str:
    builder = DataCidBuilder()
    view = memoryview(data)
    for start in range(0, len(view), STREAM_PIECE):
        builder.update(view[start : start + STREAM_PIECE])
    return builder.finish()


def main() -> None:
    for size_mib in SIZES_MIB:
        data = os.urandom(size_mib * MIB)
        size_mb = len(data) / 1e6
        cases: tuple[tuple[str, Callable[[bytes], object]], ...] = (
            ("hashlib.sha256 (one call)", _sha256),
            ("data_cid", data_cid),
            (f"DataCidBuilder, {STREAM_PIECE // 1024} KiB pieces", _streamed),
        )
        for label, fn in cases:
            seconds = _best_seconds(fn, data)
            print(
                f"{size_mib:>4} MiB  {label:<32} {seconds * 1e3:8.1f} ms  "
                f"{size_mb / seconds:8.0f} MB/s"
            )
        assert data_cid(data) == _streamed(data)


if __name__ == "__main__":
    main()
