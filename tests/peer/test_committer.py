"""Group commit and the in-flight window, on their own."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
import trio

from p2psync.dwn.encoding import compute_cid
from p2psync.dwn.progress import ProgressToken
from p2psync.dwn.store import Store
from p2psync.replication.window import ProgressWindow
from p2psync.state.committer import GroupCommitter, StoreUnavailable


def _table(store: Store) -> None:
    store.conn.execute("CREATE TABLE IF NOT EXISTS t(v INTEGER)")


def _count(path: Path) -> int:
    # A second connection sees only what is committed.
    other = apsw.Connection(str(path))
    try:
        return int(other.execute("SELECT count(*) FROM t").fetchone()[0])
    finally:
        other.close()


async def test_writers_share_one_commit_and_wait_for_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    _table(store)
    committer = GroupCommitter(store)
    seen: list[int] = []

    async def writer(i: int) -> None:
        _, batch = committer.run(lambda: store.conn.execute("INSERT INTO t VALUES(?)", (i,)))
        await committer.durable(batch)
        seen.append(_count(tmp_path / "s.db"))  # durable: visible to another connection

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(writer, i)
    assert committer.commits == 1
    assert seen == [10] * 10


async def test_a_batch_is_cut_at_max_writes(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    _table(store)
    committer = GroupCommitter(store, max_writes=4)
    for i in range(10):
        committer.run(lambda i=i: store.conn.execute("INSERT INTO t VALUES(?)", (i,)))
    assert committer.commits == 2 and _count(tmp_path / "s.db") == 8
    committer.flush()
    assert committer.commits == 3 and _count(tmp_path / "s.db") == 10


async def test_writers_that_follow_one_another_join_the_open_batch(tmp_path: Path) -> None:
    # As a sink's `revs` handlers do: each is woken by the previous one's apply and writes
    # while that one waits for its commit; none returns before the one commit holding all.
    store = Store(tmp_path / "s.db")
    _table(store)
    committer = GroupCommitter(store)
    seen: list[tuple[int, int]] = []

    async def writer(i: int, nursery: trio.Nursery) -> None:
        _, batch = committer.run(lambda: store.conn.execute("INSERT INTO t VALUES(?)", (i,)))
        if i < 3:
            nursery.start_soon(writer, i + 1, nursery)
        await committer.durable(batch)
        seen.append((i, _count(tmp_path / "s.db")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, 0, nursery)
    assert committer.commits == 1
    assert sorted(seen) == [(0, 4), (1, 4), (2, 4), (3, 4)]
    # A writer after the commit opens the next batch.
    await committer.write(lambda: store.conn.execute("INSERT INTO t VALUES(4)"))
    assert committer.commits == 2 and _count(tmp_path / "s.db") == 5


async def test_a_batch_is_cut_at_max_bytes(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    _table(store)
    committer = GroupCommitter(store, max_bytes=1000)
    for i in range(3):
        committer.run(lambda i=i: store.conn.execute("INSERT INTO t VALUES(?)", (i,)), size=400)
    assert committer.commits == 1 and _count(tmp_path / "s.db") == 3  # 1,200 bytes: committed
    _, batch = committer.run(lambda: store.conn.execute("INSERT INTO t VALUES(3)"), size=999)
    assert committer.commits == 1 and committer.in_batch
    await committer.durable(batch)
    assert committer.commits == 2 and _count(tmp_path / "s.db") == 4


async def test_a_failed_commit_fails_every_writer_and_keeps_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    _table(store)
    committer = GroupCommitter(store)
    _, batch = committer.run(lambda: store.conn.execute("INSERT INTO t VALUES(1)"))

    def broken() -> None:
        raise apsw.IOError("disk gone")

    committer.before_commit(broken)
    with pytest.raises(StoreUnavailable):
        await committer.durable(batch)
    assert _count(tmp_path / "s.db") == 0
    assert not store.conn.in_transaction
    # The committer is usable again afterwards.
    await committer.write(lambda: store.conn.execute("INSERT INTO t VALUES(2)"))
    assert _count(tmp_path / "s.db") == 1


async def test_a_cancelled_leader_still_commits(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    _table(store)
    committer = GroupCommitter(store)
    _, first = committer.run(lambda: store.conn.execute("INSERT INTO t VALUES(1)"))
    _, second = committer.run(lambda: store.conn.execute("INSERT INTO t VALUES(2)"))
    assert first is second
    with trio.CancelScope() as scope:
        scope.cancel()
        await committer.durable(first)  # the leader: cancelled at its first checkpoint
    await committer.durable(second)  # must not hang
    assert _count(tmp_path / "s.db") == 2


def _token(position: int) -> ProgressToken:
    return ProgressToken("s", "e", position, compute_cid({"position": position}))


def test_window_hands_out_the_finished_prefix_in_order() -> None:
    window = ProgressWindow()
    a, b = window.add(_token(1)), window.add(_token(3))
    window.add(_token(5), settled=True)
    ProgressWindow.finish(b, settled=True)
    assert window.take_steps() == []  # 1 is still open: nothing may reach the ledger yet
    ProgressWindow.finish(a, settled=False)
    steps = window.take_steps()
    assert steps == [("received", _token(1)), ("received", _token(3)), ("applied", _token(3)),
                     ("received", _token(5)), ("applied", _token(5))]
    assert len(window) == 0
    with pytest.raises(ValueError):
        window.add(_token(4))  # not after the last token listed


def _locked_by_another(tmp_path: Path, busy_timeout: float = 5.0) -> tuple[Store, GroupCommitter, apsw.Connection]:
    """A store, its committer, and a second connection (to SQLite, another process's writer)
    holding the write lock."""
    store = Store(tmp_path / "s.db", busy_timeout=busy_timeout)
    _table(store)
    other = apsw.Connection(str(tmp_path / "s.db"))
    other.execute("BEGIN IMMEDIATE")
    return store, GroupCommitter(store), other


async def test_open_waits_for_another_connections_lock_with_the_loop_running(tmp_path: Path) -> None:
    """Another process's writer holds the lock: `open` lets other tasks run (here, the one that
    ends that writer's transaction) and returns with a batch open; `try_open` never waits."""
    store, committer, other = _locked_by_another(tmp_path)
    other.execute("INSERT INTO t VALUES(0)")
    assert committer.try_open() is None and not committer.in_batch
    ran: list[int] = []

    async def other_writer_finishes() -> None:
        for i in range(3):  # runs only if `open` does not stop the loop
            await trio.sleep(0.01)
            ran.append(i)
        other.execute("COMMIT")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_writer_finishes)
        batch = await committer.open()
    assert batch is not None and committer.in_batch and committer.lock_waits == 1 and ran == [0, 1, 2]
    committer.run(lambda: store.conn.execute("INSERT INTO t VALUES(1)"))
    await committer.durable(batch)
    assert _count(tmp_path / "s.db") == 2
    assert await committer.open() is not None and committer.lock_waits == 1  # free: no wait
    committer.flush()
    other.close()


async def test_open_gives_up_after_the_stores_busy_timeout(tmp_path: Path) -> None:
    _, committer, other = _locked_by_another(tmp_path, busy_timeout=0.2)
    assert await committer.open() is None and not committer.in_batch
    other.execute("ROLLBACK")
    assert await committer.open() is not None
    committer.flush()
    other.close()


async def test_a_write_that_cannot_take_the_lock_leaves_no_batch_behind(tmp_path: Path) -> None:
    store, committer, other = _locked_by_another(tmp_path, busy_timeout=0.05)
    with pytest.raises(apsw.BusyError):
        committer.run(lambda: store.conn.execute("INSERT INTO t VALUES(0)"))
    assert not committer.in_batch
    other.execute("ROLLBACK")
    await committer.write(lambda: store.conn.execute("INSERT INTO t VALUES(1)"))
    assert committer.commits == 1 and _count(tmp_path / "s.db") == 1
    other.close()
