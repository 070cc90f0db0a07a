"""A link is not ``live`` while a message it was offered did not apply (issue #13).

A `rev` answered with a result that leaves its token unapplied (``Incomplete``, ``Deferred``)
moves the link to ``repairing`` before the token is recorded; the link goes ``live`` again
only when a round catches up with everything it was offered settled. The unapplied count is
what the checkpoints hold (``p2psync status``, the ``sync_link_unapplied`` gauge).

``Deferred("tenant-inactive")`` is the message that cannot apply here: the receiving store
has the tenant disabled (``Store.set_tenant_active``), so every replicated message of it is
deferred, whatever the order, until the tenant is enabled again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from p2psync.cli.sync import status_lines, status_report
from p2psync.dwn.store import Store
from p2psync.node.config import NodeConfig, StaticPeer
from p2psync.node.node import Node
from p2psync.peer.peer import Peer
from p2psync.replication.checkpoint import Direction, LinkState
from p2psync.state.ledger import Ledger
from tests.node.support import free_port, metric_samples, scrape, until
from tests.peer.support import Clock, assert_same, new_store, seeded, served, write_notes

ALICE = seeded("alice-unsettled")


def unapplied(ledger: Ledger, direction: Direction) -> int:
    [link] = ledger.links()
    checkpoint, _ = ledger.get_checkpoint(link.key, direction)
    return len(checkpoint.unapplied_tokens)


def state(ledger: Ledger) -> LinkState:
    [link] = ledger.links()
    return link.state


@pytest.mark.parametrize("way", ["pull", "push"])
async def test_a_one_shot_sync_with_messages_that_did_not_apply_is_not_live(tmp_path: Path, way: str) -> None:
    """The receiving side defers every message: the sync ends ``repairing`` with them all
    unapplied; once they apply, the next sync ends ``live``."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    holder, receiver = (a, b) if way == "pull" else (b, a)
    write_notes(holder, ALICE, 3, clock=Clock())
    receiver.set_tenant_active(ALICE.did, False)
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    direction = Direction.PULL if way == "pull" else Direction.PUSH
    async with served(passive) as url:
        summary = await active.sync(url, tenant=ALICE.did, direction=way)  # type: ignore[arg-type]
        stats = summary.pull if way == "pull" else summary.push
        assert stats is not None and stats.results == {"Deferred": 3}
        assert summary.state == "repairing"
        assert unapplied(active.ledger, direction) == 3
        [moved] = [t for t in active.ledger.transitions() if t.kind == "state" and t.state_to == LinkState.REPAIRING]
        assert (moved.reason, moved.error_code, moved.direction) == ("unsettled", "Deferred", direction)
        [line] = [ln for ln in status_lines(status_report(b)) if ln.startswith(f"  {way}:")]
        assert line == f"  {way}: nothing applied yet (received 3, 3 not applied)"

        receiver.set_tenant_active(ALICE.did, True)
        again = await active.sync(url, tenant=ALICE.did, direction=way)  # type: ignore[arg-type]
    assert again.state == "live"
    assert unapplied(active.ledger, direction) == 0
    assert_same(a, b, ALICE)


async def test_a_live_link_leaves_live_at_once_when_a_message_does_not_apply(tmp_path: Path) -> None:
    """A continuous link that went ``live`` is ``repairing`` as soon as a message it is sent
    later does not apply — it is never seen ``live`` with it unapplied — and shows the count
    in its metrics. After a restart the message is offered again, applies, and the link is
    ``live``."""
    port = free_port()
    served_store = new_store(tmp_path, "b")
    server = Node(NodeConfig(host="127.0.0.1", port=port, discovery=False), served_store, ALICE)
    dialer_path = tmp_path / "a.db"

    def dialer(store: Store) -> Node:
        config = NodeConfig(host="127.0.0.1", port=0, peers=(StaticPeer(f"ws://127.0.0.1:{port}/_p2psync"),),
                            discovery=False, metrics_port=0)
        return Node(config, store, ALICE)

    write_notes(served_store, ALICE, 2, clock=Clock())
    dialer_store = Store(dialer_path)
    first = dialer(dialer_store)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        async with trio.open_nursery() as running:
            await running.start(first.run)
            ledger = first.peer.ledger
            await until(lambda: len(ledger.links()) == 1 and state(ledger) == LinkState.LIVE
                        and dialer_store.messages.count(ALICE.did) == 2)
            dialer_store.set_tenant_active(ALICE.did, False)
            seen: list[tuple[LinkState, int]] = []

            def look() -> bool:
                seen.append((state(ledger), unapplied(ledger, Direction.PULL)))
                return seen[-1][1] == 1

            write_notes(served_store, ALICE, 1, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="later")
            await until(look)
            assert (LinkState.LIVE, 1) not in seen
            assert state(ledger) == LinkState.REPAIRING
            assert first.metrics_url is not None
            _, body = await scrape(first.metrics_url)
            samples = metric_samples(body)
            assert {s["direction"]: v for s, v in samples["sync_link_unapplied"]} == {"pull": 1.0, "push": 0.0}
            states = {s["state"]: v for s, v in samples["sync_link_state"]}
            assert states["repairing"] == 1.0 and states["live"] == 0.0
            first.stop()
        # The tenant is served again; the restarted node's round offers the message again.
        dialer_store.set_tenant_active(ALICE.did, True)
        second = dialer(dialer_store)
        async with trio.open_nursery() as running:
            await running.start(second.run)
            ledger = second.peer.ledger
            await until(lambda: dialer_store.messages.count(ALICE.did) == 3 and state(ledger) == LinkState.LIVE)
            assert unapplied(ledger, Direction.PULL) == 0
            second.stop()
        server.stop()
    assert_same(dialer_store, served_store, ALICE)
