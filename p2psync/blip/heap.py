"""Memory back to the system after connections that moved a lot of it (issue #15).

CPython takes every buffer above 512 bytes (frames, message bodies, replies) from the C
library's ``malloc``. glibc keeps what is freed in its heap for reuse and gives the kernel back
only the top of the heap, which a few live objects pin. Measured on a ``p2psync serve`` node
(72 MiB before): one proven peer that had 128 MiB of messages gathered left it at 214–221 MiB
RSS once closed, ten such peers at 684–688 MiB; with the trim, 70–72 MiB both times.
``malloc_trim(0)`` hands back every free page of the heap: 22 ms for 200 MB, under 1 ms when
there is nothing to give back.

Every connection tells :data:`TRIMMER` how many bytes it moved when it ends; the heap is trimmed
once connections that ended since the last trim moved :data:`TRIM_AFTER_BYTES`, so a node
whose connections are small never pays for it. glibc only (Linux); elsewhere nothing happens.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

#: Bytes that connections ended since the last trim moved (received after inflating, plus
#: sent) before the next end trims the heap. Ours: well above what a hello or a small sync
#: moves, well below what an abusive connection can make the node hold (128 MiB gathered).
TRIM_AFTER_BYTES = 32 * 1024 * 1024


class HeapTrimmer:
    """Trims the heap (``trim``) once ended connections moved ``threshold`` bytes."""

    __slots__ = ("pending", "threshold", "trims", "_trim")

    def __init__(self, trim: Callable[[], object] | None, threshold: int = TRIM_AFTER_BYTES) -> None:
        self._trim = trim
        self.threshold = threshold
        self.pending = 0  # bytes moved by connections ended since the last trim
        self.trims = 0

    @property
    def available(self) -> bool:
        """True where trimming does something (glibc)."""
        return self._trim is not None

    def connection_ended(self, moved: int) -> bool:
        """A connection that moved ``moved`` bytes ended; True when this trimmed the heap."""
        self.pending += moved
        if self._trim is None or self.pending < self.threshold:
            return False
        self.pending = 0
        self.trims += 1
        self._trim()
        return True


def glibc_malloc_trim() -> Callable[[], object] | None:
    """``malloc_trim(0)`` of the running glibc, or None (another C library, or no Linux)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        libc = ctypes.CDLL(None)
        function = libc.malloc_trim
    except (AttributeError, OSError, ValueError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int

    def trim() -> int:
        result: int = function(0)
        return result

    return trim


#: The process's trimmer: the heap is the process's, whichever connection used it.
TRIMMER = HeapTrimmer(glibc_malloc_trim())
