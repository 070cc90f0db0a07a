"""Group commit: one write transaction at a time on a store's connection, shared by every task.

Replication applies many small messages; a commit per message costs an fsync-ordered WAL
write each and caps a sink near 1,000 messages/s (docs/benchmarks.md). A :class:`GroupCommitter`
lets the tasks of a peer (every `rev` of every connection, checkpoint updates) write into one
open transaction and releases each writer only after the COMMIT that holds its writes — the
`rev` rule "reply after the apply is durably committed; several `rev`s may share one commit"
(replication-profiles.md §8.2). A sink that has the next `revs` at hand when one is applied
applies it into the same batch, so a catch-up commits a listing's `revs` together (issue #17:
a commit's pages of the random-key indexes are shared by more messages).

Everything runs on the trio thread, so there is no lock: :meth:`run` executes a synchronous
write now, inside the open transaction, and returns a ticket; :meth:`durable` yields a few
scheduling rounds (so writers that are already runnable join the batch), then commits.
Writes that must be atomic with a batch (ledger steps for the applied messages) register a
:meth:`before_commit` hook.

Opening a batch takes the store's write lock (``BEGIN IMMEDIATE``). When another process holds
it (a ``p2psync write`` or ``sync`` on the same store), :meth:`run` would wait in SQLite's busy
handler with the event loop stopped, every connection with it. A driver that can wait instead
calls :meth:`open` first: it polls the lock with trio sleeps, so the loop goes on serving, and
returns with a batch open (p2psync/peer/session.py does, before a connection's writes).

:meth:`after_commit` registers a function called after every successful COMMIT, before any
other task runs (so before another batch opens): the set index folds its journal there
(p2psync/state/setindex.py), which it must not do inside an open batch.

A failed COMMIT rolls the batch back and fails every writer of it with
:class:`StoreUnavailable`: their results were never durable, so nobody may be told otherwise.
Callers must then drop any in-memory progress they derived (the peer closes the connection
and resumes from the ledger).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, TypeVar

import apsw
import trio

from p2psync.dwn.store import Store
from p2psync.errors import LocalFailure, Refusal

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_WRITES", "GroupCommitter", "StoreUnavailable"]

log = logging.getLogger("p2psync.peer.commit")

T = TypeVar("T")

#: Writes per transaction before a commit is forced. Ours: the fsync is amortized by ~64, but
#: a commit also writes every page its messages dirtied, and the pages of five random-key
#: indexes are shared by more messages in a longer batch: WAL frames a message 8.47 at 64 a
#: commit and 6.23 at 200 with 8,000 stored; 10.48, 9.67 and 9.43 at 64, 200 and 256 with
#: 90,000 (tests/bench/bench_apply_pages.py). The cost is latency: a reply waits for the
#: batch's last write (~0.1 s for 256 small messages), only while writes arrive back to back.
MAX_BATCH_WRITES: Final = 256
#: Bytes of record data per transaction before a commit is forced: a batch of large records
#: (data fetched out of line, up to 100 MiB each) commits as soon as this much waits, so the
#: WAL and the reply's wait stay bounded whatever the count. Ours: the sink's prefetch budget.
MAX_BATCH_BYTES: Final = 32 * 1024 * 1024
#: Idle scheduling rounds before committing: enough for a `rev` handler that was woken by the
#: previous apply to reach :meth:`run` (it needs one round to wake, one to decode and apply).
_IDLE_ROUNDS: Final = 3
#: :meth:`GroupCommitter.open`'s first and longest wait between two tries of the write lock, in
#: seconds (it doubles). Ours: as often as the other processes' busy handlers try
#: (p2psync/dwn/store.py, every 0.5–5 ms), so the node keeps its turns among them; a try costs
#: ~8 µs.
_OPEN_POLL_FIRST: Final = 0.0005
_OPEN_POLL_MAX: Final = 0.005


class StoreUnavailable(LocalFailure):
    """The commit that held a write failed; the write is not in the store. A peer is told
    ``503 StoreUnavailable`` (:meth:`as_refusal`, §13)."""

    def as_refusal(self) -> Refusal:
        return Refusal(503, "StoreUnavailable", str(self))


class _Batch:
    __slots__ = ("bytes", "done", "error", "hooks", "led", "number", "writes")

    def __init__(self, number: int) -> None:
        self.number = number
        self.writes = 0
        self.bytes = 0  # record data written, as its writers said (``run(..., size=)``)
        self.led = False  # one waiter drives the commit; the others just wait for it
        self.done = trio.Event()
        self.error: BaseException | None = None
        self.hooks: list[Callable[[], None]] = []


class GroupCommitter:
    """The one writer of ``store``'s connection for the tasks of a peer (see the module doc)."""

    def __init__(self, store: Store, *, max_writes: int = MAX_BATCH_WRITES,
                 max_bytes: int = MAX_BATCH_BYTES) -> None:
        self.store = store
        self.max_writes = max_writes
        self.max_bytes = max_bytes
        self._batch: _Batch | None = None
        self._numbers = 0
        self._committed = trio.Event()
        self._after_commit: list[Callable[[], object]] = []
        #: commits so far (for tests and metrics)
        self.commits = 0
        #: times :meth:`open` found the write lock taken by another connection and waited
        self.lock_waits = 0

    @property
    def in_batch(self) -> bool:
        return self._batch is not None

    def try_open(self) -> _Batch | None:
        """Open a batch if the store's write lock is free now (never waits); the batch now
        open, or None when another connection holds the lock. A batch opened here has no
        writer that will commit it yet: the caller leads it (:meth:`durable`)."""
        if self._batch is not None:
            return self._batch
        if not self.store.try_begin_immediate():
            return None
        return self._opened()

    async def open(self) -> _Batch | None:
        """Until a batch is open: at once if one is or the lock is free, else trying the lock
        again after a trio sleep (the event loop runs meanwhile), for up to the store's busy
        timeout. The batch, or None if another connection held the lock all that time."""
        batch = self.try_open()
        if batch is not None:
            return batch
        self.lock_waits += 1
        delay, deadline = _OPEN_POLL_FIRST, trio.current_time() + self.store.busy_timeout
        while batch is None and trio.current_time() < deadline:
            await trio.sleep(delay)
            delay = min(2 * delay, _OPEN_POLL_MAX)
            batch = self.try_open()
        return batch

    def run(self, fn: Callable[[], T], *, size: int = 0, writes: Callable[[T], int] | None = None) -> tuple[T, _Batch]:
        """Run the synchronous write ``fn`` inside the open batch (opening one); returns its
        result and the batch to pass to :meth:`durable`. ``fn``'s exceptions propagate; its
        own nested savepoints decide what of it is undone. ``size``: the bytes of record data
        it writes (counted against ``max_bytes``); ``writes``: how many writes its result
        stands for (one when not given), counted against ``max_writes``."""
        batch = self._batch
        if batch is None:
            # IMMEDIATE: take the write lock now, so another process's writer waits here
            # instead of failing this batch at COMMIT. (A BUSY here leaves no batch behind.)
            self.store.conn.execute("BEGIN IMMEDIATE")
            batch = self._opened()
        result = fn()
        batch.writes += 1 if writes is None else writes(result)
        batch.bytes += size
        if batch.writes >= self.max_writes or batch.bytes >= self.max_bytes:
            self._commit(batch)
        return result, batch

    def _opened(self) -> _Batch:
        """The batch of the transaction just begun."""
        self._numbers += 1
        self._batch = _Batch(self._numbers)
        return self._batch

    def before_commit(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` inside the open batch just before it commits (once)."""
        if self._batch is None:
            hook()  # nothing open: the hook's own writes commit by themselves
            return
        if hook not in self._batch.hooks:
            self._batch.hooks.append(hook)

    def after_commit(self, fn: Callable[[], object]) -> Callable[[], None]:
        """Call ``fn`` after every successful commit, outside any transaction (until the
        returned function is called). Its exceptions are logged: the commit stands."""
        self._after_commit.append(fn)

        def remove() -> None:
            if fn in self._after_commit:
                self._after_commit.remove(fn)

        return remove

    async def durable(self, batch: _Batch) -> None:
        """Return once ``batch`` is committed; :class:`StoreUnavailable` if its commit failed."""
        if not batch.led:
            batch.led = True
            try:
                while self._batch is batch:
                    before = batch.writes
                    for _ in range(_IDLE_ROUNDS):
                        await trio.lowlevel.checkpoint()
                    if self._batch is batch and batch.writes == before:
                        self._commit(batch)
            finally:
                if self._batch is batch:  # the leader was cancelled: nobody else would commit
                    self._commit(batch)
        await batch.done.wait()
        if batch.error is not None:
            raise StoreUnavailable(f"the commit failed: {batch.error}") from batch.error

    async def write(self, fn: Callable[[], T]) -> T:
        """:meth:`run` then :meth:`durable`: a write whose caller continues only once it is durable."""
        result, batch = self.run(fn)
        await self.durable(batch)
        return result

    def flush(self) -> None:
        """Commit the open batch now (synchronously); raises :class:`StoreUnavailable` on failure."""
        batch = self._batch
        if batch is not None:
            self._commit(batch)
            if batch.error is not None:
                raise StoreUnavailable(f"the commit failed: {batch.error}") from batch.error

    async def wait_commit(self) -> None:
        """Wait for the next commit (feeds use it to notice new log entries)."""
        await self._committed.wait()

    def _commit(self, batch: _Batch) -> None:
        conn = self.store.conn
        try:
            for hook in batch.hooks:
                hook()
            conn.execute("COMMIT")
        except (apsw.Error, Exception) as exc:
            log.error("group commit of %d writes failed: %s", batch.writes, exc)
            batch.error = exc
            self.store.rollback()
        finally:
            self._batch = None
            batch.done.set()
            self.commits += 1
            self._committed.set()
            self._committed = trio.Event()
        if batch.error is None:
            self.store.transaction_ended()  # the blob files the batch left unreferenced (dwn/blobs.py)
            for fn in list(self._after_commit):
                try:
                    fn()
                except Exception as exc:  # a follower's failure is not the writers'
                    log.error("after-commit %r failed: %s", fn, exc)
