"""The not-applied list's own writes never wait for another process's write lock on the event
loop: a write that finds the lock taken is put off to the node's next look (about once a second)
or to the end of the command, and a request to clear it stays until it can be answered.

"Another process" is a second SQLite connection to the same file holding ``BEGIN IMMEDIATE``.
Every busy-handler call is recorded, so a write that waited in SQLite's busy handler (the event
loop stopped) fails the test, with no clock involved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import apsw
import pytest

from p2psync.dwn import store as store_module
from p2psync.dwn.did import Identity
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from p2psync.replication.stats import NotApplied
from p2psync.state.copies import NotAppliedRecords

ALICE = Identity.generate()


@pytest.fixture
def busy_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each call of a store's busy handler (it gives up at once, so a test never hangs)."""
    calls: list[int] = []

    def handler(_timeout: float) -> Callable[[int], bool]:
        def busy(tries: int) -> bool:
            calls.append(tries)
            return False

        return busy

    monkeypatch.setattr(store_module, "_busy_handler", handler)
    return calls


@pytest.fixture
def peer(tmp_path: Path, busy_calls: list[int]) -> Iterator[Peer]:
    store = Store(tmp_path / "node.db")
    yield Peer(store, ALICE)
    store.close()


def _entry(n: int) -> NotApplied:
    return NotApplied(f"bafy-not-applied-{n}", ALICE.did, "Invalid", "RecordsWriteSignatureInvalid", "forged",
                      where="peer", peer="store-b")


def _kept(path: Path) -> list[str]:
    """The list as the store keeps it, read on a connection of its own (as `status` does)."""
    store = Store(path)
    try:
        return [e.message_cid for e in NotAppliedRecords(store).load().last]
    finally:
        store.close()


def _lock(path: Path) -> apsw.Connection:
    other = apsw.Connection(str(path))
    other.execute("BEGIN IMMEDIATE")
    return other


def test_a_write_that_finds_the_lock_taken_waits_for_the_nodes_next_look(peer: Peer, busy_calls: list[int]) -> None:
    path = peer.store.path
    peer.not_applied.add(_entry(1))  # no batch open, the lock free: written now
    assert _kept(path) == ["bafy-not-applied-1"]

    other = _lock(path)
    peer.not_applied.add(_entry(2))
    assert busy_calls == []  # it did not wait
    assert peer.tend_not_applied() is False  # still locked: put off again, nothing waited
    assert busy_calls == []
    other.execute("COMMIT")
    assert _kept(path) == ["bafy-not-applied-1"]

    assert peer.tend_not_applied() is False
    assert _kept(path) == ["bafy-not-applied-1", "bafy-not-applied-2"]
    assert busy_calls == []


def test_a_request_to_clear_is_answered_only_once_the_store_is_cleared(peer: Peer, busy_calls: list[int]) -> None:
    path = peer.store.path
    peer.not_applied.add(_entry(1))
    asker = Store(path)
    NotAppliedRecords(asker).request_clear()

    other = _lock(path)
    assert peer.tend_not_applied() is False  # emptied here, not yet in the store: no answer
    assert peer.not_applied.count == 0
    peer.answer_clear()  # (a node answers only after a True; it must not wait either)
    assert busy_calls == []
    other.execute("COMMIT")
    assert NotAppliedRecords(asker).clear_requested()
    assert _kept(path) == ["bafy-not-applied-1"]

    assert peer.tend_not_applied() is True
    assert _kept(path) == []
    peer.answer_clear()
    assert not NotAppliedRecords(asker).clear_requested()
    assert busy_calls == []
    asker.close()


def test_the_end_of_a_command_writes_what_was_put_off(peer: Peer, busy_calls: list[int]) -> None:
    path = peer.store.path
    other = _lock(path)
    peer.not_applied.add(_entry(1))
    other.execute("COMMIT")
    assert _kept(path) == []
    peer.save_not_applied()
    assert _kept(path) == ["bafy-not-applied-1"]


def test_no_busy_wait_scopes_nest(tmp_path: Path, busy_calls: list[int]) -> None:
    """An inner scope's end must not bring the waiting back inside an outer one (a refusal noted
    while a connection's held writes are released without waiting)."""
    store = Store(tmp_path / "s.db")
    store.conn.execute("CREATE TABLE t(x)")
    other = _lock(tmp_path / "s.db")
    with store.no_busy_wait():
        with store.no_busy_wait():
            pass
        with pytest.raises(apsw.BusyError):
            store.conn.execute("INSERT INTO t VALUES(1)")
        assert busy_calls == []
    with pytest.raises(apsw.BusyError):
        store.conn.execute("INSERT INTO t VALUES(1)")
    assert busy_calls == [0]  # outside every scope, the handler is asked again
    other.execute("COMMIT")
    store.close()
