"""A pulling sink's group commits span consecutive `revs`, and no reply leaves before its commit.

Each `revs` reply goes out only once every message it answers is durably committed (§8.2 step
4, §8.4); with the committer holding a batch across the `revs` that follow one another
(issue #17), the reply of the first waits for the commit of the last. Checked from a second
connection, which sees only what is committed, at the moment each reply is counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
import pytest
import trio

from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from p2psync.peer.session import PeerSession
from p2psync.replication.effects import Apply, ApplyBatch, SendReply, StoreCall
from tests.peer.support import Clock, assert_same, new_store, seeded, served, write_notes

ALICE = seeded("group-commit")
NOTES = 150  # one listing: `revs` of 64, 64 and 22


class CommittedAtReply:
    """Wraps a session's protocol so that each reply to a `rev` or `revs`, as the protocol gives
    it to the driver, is checked against how many messages the store holds durably (a second
    connection sees only committed transactions)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[tuple[int, int]] = []  # (messages answered so far, committed then)
        self.answered = 0

    def wrap(self, session: PeerSession) -> PeerSession:
        outputs = session.proto.outputs

        def checked() -> list[Any]:
            out = outputs()
            replies = [o for o in out if isinstance(o, SendReply) and o.kinds]
            if replies:
                other = apsw.Connection(str(self.path), flags=apsw.SQLITE_OPEN_READONLY)
                try:
                    committed = int(other.execute("SELECT count(*) FROM messages").fetchone()[0])
                finally:
                    other.close()
                for reply in replies:
                    self.answered += len(reply.kinds)
                    self.seen.append((self.answered, committed))
            return out

        session.proto.outputs = checked  # type: ignore[method-assign]
        return session


async def test_replies_wait_for_the_commit_that_holds_them(tmp_path: Path) -> None:
    source = new_store(tmp_path, "source")
    write_notes(source, ALICE, NOTES, clock=Clock())
    sink = new_store(tmp_path, "sink")
    puller = Peer(sink, ALICE)
    observer = CommittedAtReply(tmp_path / "sink.db")
    new_session = puller._new_session
    puller._new_session = lambda *args: observer.wrap(new_session(*args))  # type: ignore[method-assign]
    async with served(Peer(source, ALICE)) as url:
        summary = await puller.sync(url, tenant=ALICE.did, direction="pull")
    assert summary.pull is not None and summary.pull.results == {"Applied": NOTES}
    assert observer.answered == NOTES
    # The k-th message answered is answered after at least k messages were committed: the
    # messages are applied in order into an empty store, so anything less is a reply that
    # left before its commit.
    assert all(committed >= replies for replies, committed in observer.seen), observer.seen
    assert_same(source, sink, ALICE)



def _pull_beside_another_writer(tmp_path: Path, busy_timeout: float) -> tuple[Store, Store, Peer, apsw.Connection,
                                                                             trio.Event]:
    """A source of NOTES notes, a sink store and its puller, and a second connection to the sink
    (to SQLite, another process's writer) that takes the write lock when the protocol first asks
    the puller's driver to apply messages (``taken`` is set then)."""
    source = new_store(tmp_path, "source")
    write_notes(source, ALICE, NOTES, clock=Clock())
    sink = Store(tmp_path / "sink.db", busy_timeout=busy_timeout)
    puller = Peer(sink, ALICE)
    other = apsw.Connection(str(tmp_path / "sink.db"))
    taken = trio.Event()
    _other_writer_takes_the_lock_first(puller, other, taken)
    return source, sink, puller, other, taken


def _other_writer_takes_the_lock_first(puller: Peer, other: apsw.Connection, taken: trio.Event) -> None:
    """Have ``other`` (to SQLite, another process's writer) take the sink's write lock just as the
    protocol first asks its driver to apply messages, before the driver carries that out."""
    new_session = puller._new_session

    def session(*args: Any) -> PeerSession:
        made = new_session(*args)
        outputs = made.proto.outputs

        def other_writer_first() -> list[Any]:
            out = outputs()
            if not taken.is_set() and any(isinstance(o, StoreCall) and isinstance(o.request, Apply | ApplyBatch)
                                          for o in out):
                other.execute("BEGIN IMMEDIATE")
                taken.set()
            return out

        made.proto.outputs = other_writer_first  # type: ignore[method-assign]
        return made

    puller._new_session = session  # type: ignore[method-assign]


async def test_a_sink_waits_for_another_writers_lock_without_stopping_the_loop(tmp_path: Path) -> None:
    """Another process takes the sink's write lock just as the pull's first apply comes (a
    `p2psync write` beside a node). The sink waits for it with the event loop running: the task
    that ends that writer's transaction runs, then every message applies and none is refused.
    (Before, the apply waited in SQLite's busy handler with the loop stopped, so that task could
    not run, and after the busy timeout the apply failed.)"""
    source, sink, puller, other, taken = _pull_beside_another_writer(tmp_path, busy_timeout=3.0)
    ticks: list[int] = []

    async def other_writer_finishes() -> None:
        await taken.wait()
        while puller.committer.lock_waits == 0:
            await trio.sleep(0.005)
        for i in range(3):  # the loop runs while the sink waits for the lock
            await trio.sleep(0.01)
            ticks.append(i)
        other.execute("COMMIT")

    async with served(Peer(source, ALICE)) as url, trio.open_nursery() as nursery:
        nursery.start_soon(other_writer_finishes)
        try:
            summary = await puller.sync(url, tenant=ALICE.did, direction="pull")
        finally:
            nursery.cancel_scope.cancel()
            if other.in_transaction:
                other.execute("ROLLBACK")
    assert summary.pull is not None and summary.pull.results == {"Applied": NOTES}
    assert taken.is_set() and puller.committer.lock_waits >= 1 and ticks == [0, 1, 2]
    assert_same(source, sink, ALICE)
    other.close()


async def test_a_lock_held_past_the_busy_timeout_refuses_the_applies_and_loses_nothing(tmp_path: Path) -> None:
    """The other writer keeps the lock past the sink's busy timeout: the waiting applies fail at
    once (no second wait in SQLite's busy handler), the connection ends with 503, and the sync
    gives up when it cannot record that in its ledger either (the lock is still taken). Once the
    writer is gone, the next sync applies everything."""
    source, sink, puller, other, taken = _pull_beside_another_writer(tmp_path, busy_timeout=0.2)
    async with served(Peer(source, ALICE)) as url:
        with pytest.raises(apsw.BusyError):
            await puller.sync(url, tenant=ALICE.did, direction="pull")
        assert taken.is_set() and puller.committer.lock_waits >= 1 and not puller.committer.in_batch
        assert sink.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
        other.execute("ROLLBACK")
        summary = await puller.sync(url, tenant=ALICE.did, direction="pull")
    assert summary.pull is not None and summary.pull.results == {"Applied": NOTES}
    assert_same(source, sink, ALICE)
    other.close()
