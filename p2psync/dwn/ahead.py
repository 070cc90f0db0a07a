"""Signatures verified on a second core, ahead of the engine's turn (issue #17).

A sink receives messages in batches (a `revs` carries up to 64) and applies them one after the
other on its event loop's thread; the Ed25519 verify is ~15% of each apply. libsodium releases
the GIL while it verifies, so one worker thread can verify a batch's signatures while the engine
applies the messages before them: :class:`SignatureWorker` takes batches of messages and runs
:func:`p2psync.dwn.authentication.verify_ahead` on each, which keeps every acceptance in
:data:`p2psync.dwn.ed25519.AHEAD`, keyed by exactly the bytes verified. The engine still
verifies every signature it does not find there (see :class:`p2psync.dwn.ed25519.Ahead`):
nothing here decides whether a message is valid, only where the CPU is spent.

The thread starts with the first batch and ends after :data:`IDLE_SECONDS` without one (a new
batch starts it again), so an idle peer holds no thread and nobody has to stop it. It is worth
having only where a second core is free (:func:`second_core`); on one core it would take the
verify's CPU from the engine's own thread and add the GIL's hand-overs.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Sequence
from typing import Any, Final

from p2psync.dwn.authentication import verify_ahead
from p2psync.dwn.ed25519 import AHEAD

__all__ = ["IDLE_SECONDS", "MAX_PENDING", "SignatureWorker", "second_core"]

#: Seconds the worker waits for another batch before its thread ends. Ours: longer than a
#: sink's pause between `revs` under load, short enough that a finished sync leaves no thread.
IDLE_SECONDS: Final = 1.0
#: Messages queued and not verified yet past which a batch is not queued (the engine verifies
#: it inline): a worker that cannot keep up must not verify what was applied long ago. Half of
#: :data:`p2psync.dwn.ed25519.AHEAD_CAPACITY`, so what it verifies is still kept when used. Ours.
MAX_PENDING: Final = 1024


def second_core() -> bool:
    """Whether this process may run on more than one CPU."""
    try:
        return len(os.sched_getaffinity(0)) > 1
    except (AttributeError, OSError):  # not Linux
        return (os.cpu_count() or 1) > 1


class SignatureWorker:
    """One thread that verifies the signatures of batches of messages ahead of their apply."""

    def __init__(self, *, idle: float = IDLE_SECONDS, max_pending: int = MAX_PENDING) -> None:
        self.idle = idle
        self.max_pending = max_pending
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Event()
        self._idle.set()
        #: messages verified ahead; messages not queued (the worker was too far behind)
        self.verified = 0
        self.skipped = 0
        #: threads started so far (one per busy spell)
        self.started = 0

    def submit(self, messages: Sequence[Any]) -> bool:
        """Queue ``messages`` (decoded DWN messages) to have their signatures verified ahead;
        False when too many are queued already (the engine then verifies them itself)."""
        n = len(messages)
        if not n:
            return True
        with self._lock:
            if self._pending + n > self.max_pending:
                self.skipped += n
                return False
            self._pending += n
            AHEAD.expect(n)
            self._idle.clear()
            self._queue.put(tuple(messages))
            if self._thread is None:
                self.started += 1
                self._thread = threading.Thread(target=self._run, name="p2psync-verify-ahead", daemon=True)
                self._thread.start()
        return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Until every queued batch is verified (tests); False on timeout."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        while True:
            try:
                batch = self._queue.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():  # nothing was queued while we waited for the lock
                        self._thread = None
                        return
                continue
            try:
                for message in batch:
                    verify_ahead(message)
            finally:
                AHEAD.expect(-len(batch))
                with self._lock:
                    self._pending -= len(batch)
                    self.verified += len(batch)
                    if not self._pending:
                        self._idle.set()
