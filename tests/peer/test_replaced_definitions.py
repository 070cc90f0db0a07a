"""Replaced protocol definitions reach a replica that meets its source by reconciliation.

A set reconciliation compares the stored messages, and a definition a newer one replaced is not
stored (protocol/replication-apply.md, *Superseded definitions travel*): two replicas whose
stored sets are equal may still differ by one. A round that reconciles instead of replaying the
log (a first sync of overlapping replicas, a repaired gap) and `p2psync anti-entropy --repair`
therefore also exchange the definitions of each protocol both hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from p2psync.dwn.canonical import archived_data
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from tests.peer.support import Clock, assert_same, new_store, seeded, served, write_notes
from tests.replication.support import snapshot

ALICE = seeded("replaced-definitions-alice")
CHAT = "https://p2psync.example/protocols/replaced"


def _configure(store: Store, clock: Clock, version: int) -> str:
    definition: dict[str, Any] = {"protocol": CHAT, "published": True,
                                  "types": {f"v{n}": {} for n in range(version + 1)}, "structure": {"v0": {}}}
    message = ProtocolsConfigure.create(definition=definition, signer=ALICE, message_timestamp=clock.tick()).message
    assert Dwn(store).process_message(ALICE.did, message).code == 202
    return message_cid(message)


async def _replicas(tmp_path: Path) -> tuple[Store, Store, str]:
    """``a`` wrote notes and two definitions, the first replaced before any sync; ``b`` holds
    every stored message of ``a`` (fetched by CID) and not the replaced definition."""
    a, b, clock = new_store(tmp_path, "a"), new_store(tmp_path, "b"), Clock()
    write_notes(a, ALICE, 5, clock=clock)
    replaced = _configure(a, clock, 1)
    _configure(a, clock, 2)
    async with served(Peer(a, ALICE)) as url:
        await Peer(b, ALICE).fetch_messages(url, tenant=ALICE.did, cids=a.messages.cids(ALICE.did))
    assert sorted(snapshot(a, ALICE.did).messages) == sorted(snapshot(b, ALICE.did).messages)
    assert snapshot(a, ALICE.did).replaced == (replaced,) and snapshot(b, ALICE.did).replaced == ()
    return a, b, replaced


def _has(store: Store, cid: str) -> bool:
    """``cid`` archived here and listed in the log (so that it travels on from here)."""
    return archived_data(store, ALICE.did, cid)[0] and snapshot(store, ALICE.did).replaced == (cid,)


async def test_a_first_round_that_reconciles_brings_the_replaced_definition(tmp_path: Path) -> None:
    a, b, replaced = await _replicas(tmp_path)
    async with served(Peer(a, ALICE)) as url:
        summary = await Peer(b, ALICE).sync(url, tenant=ALICE.did, direction="pull")
    assert summary.pull is not None and summary.pull.revs_received == 0  # reconciled, not replayed
    assert _has(b, replaced)
    assert_same(a, b, ALICE, events=False)


async def test_a_first_round_that_pushes_hands_the_replaced_definition_over(tmp_path: Path) -> None:
    a, b, replaced = await _replicas(tmp_path)
    async with served(Peer(b, ALICE)) as url:
        summary = await Peer(a, ALICE).sync(url, tenant=ALICE.did, direction="both")
    assert summary.push is not None and summary.push.revs_sent == 0
    assert _has(b, replaced)
    assert_same(a, b, ALICE, events=False)


async def test_an_anti_entropy_repair_exchanges_replaced_definitions_both_ways(tmp_path: Path) -> None:
    a, b, replaced = await _replicas(tmp_path)
    async with served(Peer(a, ALICE)) as url:
        pulled = await Peer(b, ALICE).reconcile(url, tenant=ALICE.did, repair=True, direction="pull")
    assert pulled.equal and pulled.definitions == {"fetched": {"Superseded": 1}, "taken": {}}
    assert pulled.to_json()["definitions"] == {"fetched": {"Superseded": 1}}
    assert _has(b, replaced)

    c = new_store(tmp_path, "c")
    async with served(Peer(a, ALICE)) as url:
        await Peer(c, ALICE).fetch_messages(url, tenant=ALICE.did, cids=a.messages.cids(ALICE.did))
    async with served(Peer(c, ALICE)) as url:
        pushed = await Peer(b, ALICE).reconcile(url, tenant=ALICE.did, repair=True)  # b hands it on
    assert pushed.definitions["taken"] == {"Superseded": 1}
    assert _has(c, replaced)
    assert_same(a, c, ALICE, events=False)


async def test_a_periodic_check_of_equal_sets_stays_one_round_trip(tmp_path: Path) -> None:
    """A node's periodic check passes ``definitions=False``: with equal sets it exchanges
    nothing more (the log carries replaced definitions); once the sets differ it looks."""
    a, b, replaced = await _replicas(tmp_path)
    async with served(Peer(a, ALICE)) as url:
        equal = await Peer(b, ALICE).reconcile(url, tenant=ALICE.did, repair=True, definitions=False)
        assert equal.equal and equal.round_trips == 1 and equal.definitions == {}
        assert not archived_data(b, ALICE.did, replaced)[0]
        write_notes(a, ALICE, 1, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="later")
        differed = await Peer(b, ALICE).reconcile(url, tenant=ALICE.did, repair=True, definitions=False)
    assert differed.equal and differed.definitions["fetched"] == {"Superseded": 1}
    assert _has(b, replaced)
