"""Anti-entropy between two real peers over WebSockets (p2psync/peer/anti_entropy.py).

Two stores share a history and then each gets its own writes; ``reconcile`` names exactly what
each lacks without changing anything, ``repair`` moves exactly those messages both ways, and a
check afterwards costs one round trip. A reader of part of a tenant may not reconcile it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from p2psync.dwn.store import Store, copy_store_files
from p2psync.peer.peer import Peer
from p2psync.replication.wire import PeerError
from p2psync.state.digest import store_digest
from tests.peer.support import Clock, new_store, query_result, seeded, served, write_notes
from tests.replication.support import snapshot

ALICE = seeded("anti-entropy-alice")
MALLORY = seeded("anti-entropy-mallory")


def diverged(tmp_path: Path, common: int, only_a: int, only_b: int) -> tuple[Store, Store, list[str], list[str]]:
    """Store a with ``common`` notes copied to b, then ``only_a``/``only_b`` more on each."""
    clock = Clock()
    a = new_store(tmp_path, "a")
    write_notes(a, ALICE, common, clock=clock)
    a.close()
    copy_store_files(tmp_path / "a.db", tmp_path / "b.db")
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    before_a = set(a.messages.cids(ALICE.did))
    write_notes(a, ALICE, only_a, clock=clock, prefix="a")
    write_notes(b, ALICE, only_b, clock=clock, prefix="b")
    a_new = sorted(set(a.messages.cids(ALICE.did)) - before_a)
    b_new = sorted(set(b.messages.cids(ALICE.did)) - before_a)
    return a, b, a_new, b_new


async def test_diff_names_exactly_what_each_side_lacks_and_changes_nothing(tmp_path: Path) -> None:
    a, b, a_new, b_new = diverged(tmp_path, 300, 7, 5)
    digests = store_digest(a), store_digest(b)
    async with served(Peer(b, ALICE)) as url:
        summary = await Peer(a, ALICE).reconcile(url, tenant=ALICE.did)
    assert not summary.equal
    assert [d["cid"] for d in summary.remote_only] == b_new
    assert [d["cid"] for d in summary.local_only] == a_new
    assert all(d["kind"] == "RecordsWrite" and d["recordId"] for d in summary.remote_only + summary.local_only)
    assert (summary.local_count, summary.remote_count) == (307, 305)
    # At a small d the estimator's 512 bytes dominate.
    assert summary.round_trips <= 2 and 0 < summary.bytes < 48 * 12 + 700
    assert (store_digest(a), store_digest(b)) == digests  # nothing moved


async def test_repair_moves_exactly_the_missing_messages_both_ways(tmp_path: Path) -> None:
    a, b, a_new, b_new = diverged(tmp_path, 300, 7, 5)
    async with served(Peer(b, ALICE)) as url:
        peer = Peer(a, ALICE)
        summary = await peer.reconcile(url, tenant=ALICE.did, repair=True)
        assert summary.equal and summary.unresolved is None
        assert summary.fetched is not None and summary.fetched.counts() == {"applied": 5}
        assert summary.pushed == {"Applied": 7}
        again = await peer.reconcile(url, tenant=ALICE.did)
    assert again.equal and again.round_trips == 1 and again.bytes < 100
    sa, sb = snapshot(a, ALICE.did), snapshot(b, ALICE.did)
    assert sorted(sa.messages) == sorted(sb.messages) and sa.data == sb.data
    assert query_result(a, ALICE) == query_result(b, ALICE)
    assert store_digest(a) == store_digest(b)


async def test_pull_only_repair_leaves_the_other_side_alone(tmp_path: Path) -> None:
    a, b, a_new, b_new = diverged(tmp_path, 50, 3, 4)
    async with served(Peer(b, ALICE)) as url:
        summary = await Peer(a, ALICE).reconcile(url, tenant=ALICE.did, repair=True, direction="pull")
    assert summary.fetched is not None and summary.fetched.counts() == {"applied": 4}
    # What b lacks is not a pull's to move: done, not unresolved, and no salted retry.
    assert not summary.pushed and not summary.equal and summary.unresolved is None and summary.attempts == 2
    assert set(b_new) <= set(a.messages.cids(ALICE.did))
    assert not set(a_new) & set(b.messages.cids(ALICE.did))


async def test_a_peer_that_may_not_read_everything_may_not_reconcile(tmp_path: Path) -> None:
    a, b, _, _ = diverged(tmp_path, 20, 1, 1)
    async with served(Peer(b, ALICE)) as url:
        with pytest.raises(PeerError) as info:
            await Peer(a, MALLORY).reconcile(url, tenant=ALICE.did)
    assert info.value.code == 403
