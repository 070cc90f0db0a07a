"""A peer stores only the tenants it is configured for (issue #15): a stranger who proves its
own DID cannot push its tenant's messages — or have them taken by reconciliation, or slip them
in as grants — into the store. Refused with ``403 PushRefused``, counted, and nothing stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2psync import blip
from p2psync.peer.peer import Peer
from p2psync.replication.observer import NoObserver
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import APP_ID, encode_body
from p2psync.state.digest import store_digest
from tests.peer.support import Clock, new_store, seeded, served, write_notes

ALICE = seeded("policy-alice")
MALLORY = seeded("policy-mallory")


class Counting(NoObserver):
    def __init__(self) -> None:
        self.refused: list[str] = []

    def push_refused(self, tenant: str, remote: str) -> None:
        self.refused.append(tenant)


async def test_a_push_for_a_tenant_the_node_does_not_store_is_refused(tmp_path: Path) -> None:
    node_store = new_store(tmp_path, "node")
    write_notes(node_store, ALICE, 2, clock=Clock())
    before = store_digest(node_store)
    node = Peer(node_store, ALICE, stores={ALICE.did})
    node.metrics = observer = Counting()
    stranger = new_store(tmp_path, "stranger")
    write_notes(stranger, MALLORY, 20, clock=Clock(), prefix="junk")
    pusher = Peer(stranger, MALLORY)
    async with served(node) as url, blip.connect(url, app_id=APP_ID, handlers=pusher.handlers(active=True)) as conn:
        # Driven by hand: our own pusher would not even try (it checks the sink may read).
        session = pusher.session_for(conn, active=True)
        await session.hello()
        index, _ = await session.run(session.proto.open_collection(MALLORY.did, SyncScope.global_scope(), "cp-x"))
        stream_id, epoch = stranger.events.stream(MALLORY.did)
        rows = stranger.events.read(MALLORY.did, after=-1)
        listing = {"streamId": stream_id, "epoch": epoch, "items": [[str(p), c] for p, c in rows]}
        with pytest.raises(blip.BlipError) as info:
            await conn.request("proposeChanges", {"collection": str(index)}, encode_body(listing))
        assert "403" in str(info.value) and "PushRefused" in str(info.value)
        take = {"f": [c for _, c in rows]}
        if index:
            take["c"] = index
        with pytest.raises(blip.BlipError) as info:
            await conn.request("reconcile", {}, encode_body(take))
        assert "403" in str(info.value) and "PushRefused" in str(info.value)
    assert store_digest(node_store) == before and MALLORY.did not in node_store.tenants()
    assert observer.refused and set(observer.refused) == {MALLORY.did}


async def test_the_node_still_takes_its_own_tenant(tmp_path: Path) -> None:
    node_store, laptop = new_store(tmp_path, "node"), new_store(tmp_path, "laptop")
    write_notes(laptop, ALICE, 5, clock=Clock())
    async with served(Peer(node_store, ALICE, stores={ALICE.did})) as url:
        summary = await Peer(laptop, ALICE).sync(url, tenant=ALICE.did, direction="push")
    assert summary.push is not None and summary.push.revs_applied == 5
    assert len(node_store.messages.cids(ALICE.did)) == 5
