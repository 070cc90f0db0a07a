"""The heap trimmer (p2psync/blip/heap.py): memory goes back to the system once connections
that moved enough of it have ended, and only then."""

from __future__ import annotations

import os

import pytest

from p2psync.blip.heap import TRIM_AFTER_BYTES, TRIMMER, HeapTrimmer, glibc_malloc_trim


def test_trims_once_ended_connections_moved_enough() -> None:
    calls: list[int] = []
    trimmer = HeapTrimmer(lambda: calls.append(1), threshold=100)
    assert not trimmer.connection_ended(60)
    assert trimmer.connection_ended(60)  # 120 moved since the last trim
    assert not trimmer.connection_ended(99)
    assert trimmer.connection_ended(1_000)
    assert calls == [1, 1] and trimmer.trims == 2 and trimmer.pending == 0


def test_without_glibc_nothing_happens() -> None:
    trimmer = HeapTrimmer(None, threshold=1)
    assert not trimmer.available and not trimmer.connection_ended(1 << 30)


@pytest.mark.skipif(not hasattr(os, "confstr") or "glibc" not in (os.confstr("CS_GNU_LIBC_VERSION") or ""),
                    reason="malloc_trim is glibc's")
def test_on_glibc_the_process_trimmer_calls_malloc_trim() -> None:
    trim = glibc_malloc_trim()
    assert trim is not None and trim() in (0, 1)
    assert TRIMMER.available and TRIMMER.threshold == TRIM_AFTER_BYTES
