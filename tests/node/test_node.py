"""The node in one trio run over loopback: static peers, discovered peers (a fake LAN), a
graceful stop with checkpoints saved on both sides, and metrics scraped over HTTP."""

from __future__ import annotations

from pathlib import Path

import trio

from p2psync.node.node import Node
from p2psync.state.copies import CheckpointCopies, checkpoint_id
from p2psync.state.ledger import Direction
from tests.node.fakes import FakeLan, FakePeerGone, seen_of
from tests.node.support import free_port, make_node, metric_samples, scrape, until
from tests.peer.support import Clock, assert_same, seeded, write_notes

ALICE = seeded("alice-node")
BOB = seeded("bob-node")


def url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/_p2psync"


def count(node: Node) -> int:
    return node.store.messages.count(ALICE.did)


def assert_saved_on_both_sides(active: Node, passive: Node) -> None:
    """Every ledger link of ``active`` with ``passive`` has its pair, as the ledger holds it,
    in ``passive``'s copies (the final save of a graceful stop)."""
    links = [link for link in active.peer.ledger.links() if link.key.remote.endswith(passive.store_id)]
    assert links, "no link was ever opened"
    for link in links:
        pair = {str(d): active.peer.ledger.get_checkpoint(link.key, d)[0].to_wire()
                for d in (Direction.PULL, Direction.PUSH)}
        cid = checkpoint_id(active.store_id, passive.store_id, link.key.scope_id, link.key.tenant)
        copy = CheckpointCopies(passive.store).get(ALICE.did, cid)
        assert copy is not None and copy[0] == pair
        assert pair["pull"].get("contiguousAppliedToken") is not None


def pull_frontier_saved(active: Node, passive: Node) -> bool:
    """Whether ``active``'s link has left on ``passive`` a copy whose pull frontier is set."""
    links = active.peer.ledger.links()
    if len(links) != 1:
        return False
    cid = checkpoint_id(active.store_id, passive.store_id, links[0].key.scope_id, ALICE.did)
    copy = CheckpointCopies(passive.store).get(ALICE.did, cid)
    return copy is not None and copy[0]["pull"].get("contiguousAppliedToken") is not None


async def test_two_static_nodes_sync_both_ways_and_stop_with_checkpoints_saved(tmp_path: Path) -> None:
    pa, pb = free_port(), free_port()
    a = make_node(tmp_path, "a", ALICE, port=pa, peers=[url(pb)])
    b = make_node(tmp_path, "b", ALICE, port=pb, peers=[url(pa)])
    write_notes(a.store, ALICE, 5, clock=Clock(), prefix="before")
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        async with trio.open_nursery() as first:
            await first.start(a.run)
            await until(lambda: count(b) == 5)
            write_notes(a.store, ALICE, 3, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="on a")
            await until(lambda: count(b) == 8)
            write_notes(b.store, ALICE, 2, clock=Clock("2032-01-01T00:00:00.000000Z"), prefix="on b")
            await until(lambda: count(a) == 10)
            # Each node dials the other (both are static peers): b's first dial may have found
            # nobody listening yet; both links end up connected and live.
            await until(lambda: all(len(n.peer.ledger.links()) == 1 for n in (a, b)))
            await until(lambda: all(str(link.state) == "live" for n in (a, b) for link in n.peer.ledger.links()))
            # b's link has saved on a a pair with a pull frontier (it saves every 2 s while it
            # moves; its first save, at the start, may hold none yet, and under load a could
            # otherwise stop before the next one).
            await until(lambda: pull_frontier_saved(b, a))
            a.stop()
        # a has stopped: its link ended its round and saved the pair on b, which still runs.
        assert a.stopped_links == 1
        assert_saved_on_both_sides(a, b)
        b.stop()
    assert_same(a.store, b.store, ALICE)
    # b's link lost its connection when a stopped; the copy it left on a is never ahead of
    # what b's ledger holds (a copy behind only replays; one ahead would lose messages).
    [link] = b.peer.ledger.links()
    cid = checkpoint_id(b.store_id, a.store_id, link.key.scope_id, ALICE.did)
    copy = CheckpointCopies(a.store).get(ALICE.did, cid)
    assert copy is not None
    mine = b.peer.ledger.get_checkpoint(link.key, Direction.PULL)[0].contiguous_applied_token
    theirs = copy[0]["pull"].get("contiguousAppliedToken")
    assert mine is not None and theirs is not None and int(theirs["position"]) <= mine.position
    # Nothing applied twice: one event per message in each log.
    for node in (a, b):
        assert node.store.events.count(ALICE.did) == 10


async def test_discovered_peers_one_dialer_per_pair_and_gone_peers_lose_their_links(tmp_path: Path) -> None:
    lan = FakeLan()
    a = make_node(tmp_path, "a", ALICE, auto=True, discovery=lan.factory, gone_grace=0.2)
    b = make_node(tmp_path, "b", ALICE, auto=True, discovery=lan.factory, gone_grace=0.2)
    small, large = sorted((a, b), key=lambda n: n.store_id)
    write_notes(large.store, ALICE, 4, clock=Clock(), prefix="large")
    write_notes(small.store, ALICE, 3, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="small")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        await until(lambda: count(a) == 7 and count(b) == 7)
        # Only the smaller store id dials: one link (one tenant, one scope), on one side.
        assert len(small.links) == 1 and not large.links
        [link] = small.links.values()
        assert link.spec.origin == "discovered" and link.spec.remote == f"sid:{large.store_id}"
        assert not large.peer.ledger.links()  # the larger one only served
        # The same peer seen again (a re-announce) changes nothing.
        lan.announce(seen_of(large.advert()))
        await trio.sleep(0.1)
        assert list(small.links.values()) == [link]
        # Gone: after the grace period its link is cancelled.
        lan.announce(FakePeerGone("large", large.did, large.store_id))
        await until(lambda: not small.links and link.done.is_set())
        assert large.store_id not in small.seen
        # Back: linked again.
        lan.announce(seen_of(large.advert()))
        await until(lambda: len(small.links) == 1 and next(iter(small.links.values())).conn is not None)
        write_notes(large.store, ALICE, 1, clock=Clock("2033-01-01T00:00:00.000000Z"), prefix="again")
        await until(lambda: count(small) == 8)
        a.stop()
        b.stop()
    assert_same(a.store, b.store, ALICE)


async def test_discovery_respects_tenants_auto_and_a_peer_that_never_dials(tmp_path: Path) -> None:
    """No shared tenant: no link. A peer without `auto` is dialed whatever the store ids say."""
    lan = FakeLan()
    a = make_node(tmp_path, "a", ALICE, auto=True, discovery=lan.factory)
    other_tenant = make_node(tmp_path, "b", BOB, auto=True, discovery=lan.factory)
    passive_only = make_node(tmp_path, "c", ALICE, auto=False, discovery=lan.factory)
    write_notes(passive_only.store, ALICE, 2, clock=Clock())
    async with trio.open_nursery() as nursery:
        for node in (a, other_tenant, passive_only):
            await nursery.start(node.run)
        await until(lambda: count(a) == 2)
        assert {link.spec.remote for link in a.links.values()} == {f"sid:{passive_only.store_id}"}
        assert not other_tenant.links and not passive_only.links
        assert len(a.seen) == 2  # it sees both, links only where a tenant is shared
        for node in (a, other_tenant, passive_only):
            node.stop()


async def test_static_link_suppresses_a_discovered_link_to_the_same_node(tmp_path: Path) -> None:
    """A node reached through a static peer URL is not dialed again once discovered."""
    lan = FakeLan()
    pb = free_port()
    b = make_node(tmp_path, "b", ALICE, port=pb, auto=True, discovery=lan.factory)
    a = make_node(tmp_path, "a", ALICE, peers=[url(pb)], auto=True, discovery=lan.factory)
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        await nursery.start(a.run)
        # a's static link learns b's store id from hello; then only that one link remains on
        # a, and b does not dial a (a dials it already), whichever store id is smaller.
        await until(lambda: a.static_sids.get(url(pb)) == b.store_id)
        await until(lambda: len(a.links) == 1 and not b.links)
        [link] = a.links.values()
        assert link.spec.origin == "static"
        await trio.sleep(0.3)  # a few reconciles later, still one link for the pair
        assert len(a.links) == 1 and not b.links
        a.stop()
        b.stop()


async def test_metrics_over_http(tmp_path: Path) -> None:
    pb = free_port()
    b = make_node(tmp_path, "b", ALICE, port=pb)
    a = make_node(tmp_path, "a", ALICE, peers=[url(pb)], metrics=True)
    write_notes(b.store, ALICE, 6, clock=Clock())
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        await nursery.start(a.run)
        await until(lambda: count(a) == 6)
        await until(lambda: all(str(link.state) == "live" for link in a.peer.ledger.links()))
        await until(lambda: [a.link_state(link) for link in a.links.values()] == ["live"])
        assert a.metrics_url is not None
        status, body = await scrape(a.metrics_url)
        missing_status, _ = await scrape(a.metrics_url.replace("/metrics", "/nope"))
        a.stop()
        b.stop()
    assert status.endswith("200 OK") and missing_status.endswith("404 Not Found")
    samples = metric_samples(body)
    labels = {"tenant": ALICE.did, "remote": f"{ALICE.did}?storeId={b.store_id}", "scope": "global"}
    states = {s["state"]: v for s, v in samples["sync_link_state"] if {k: s[k] for k in labels} == labels}
    assert states["live"] == 1.0 and sum(states.values()) == 1.0
    [(_, contiguous)] = samples["sync_checkpoint_pull_contiguous"]
    assert contiguous == b.store.events.count(ALICE.did)
    applied = dict((s["result"], v) for s, v in samples["sync_apply_results_total"])
    assert applied["Applied"] == 6
    [(_, observed)] = samples["sync_apply_latency_ms_count"]
    assert observed == 6
    assert samples["sync_inflight_events"] == [({}, 0.0)]
    assert {v for _, v in samples["sync_gap_repairs_total"]} == {0.0}
    assert {s["outcome"] for s, _ in samples["sync_antientropy_rounds_total"]} == {
        "equal", "repaired", "unresolved", "failed"}
    assert ({"connected": "true", "origin": "static"}, 1.0) in samples["sync_node_links"]


async def test_a_refused_link_backs_off_alone_and_says_why(tmp_path: Path) -> None:
    """A peer that refuses one tenant (no grant) fails that link only; the other link syncs."""
    from p2psync.node.config import TenantConfig

    pa = free_port()
    a = make_node(tmp_path, "a", ALICE, port=pa)
    write_notes(a.store, ALICE, 2, clock=Clock())
    write_notes(a.store, BOB, 3, clock=Clock(), prefix="bob's")
    # b proves BOB: it may read BOB's tenant on a, not ALICE's (ALICE granted nothing). Only
    # pull BOB's: pushing it to a node proving ALICE would be disclosure, refused as well.
    b = make_node(tmp_path, "b", BOB, peers=[url(pa)], tenants=(TenantConfig(ALICE.did), TenantConfig(None, "pull")))
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        await until(lambda: b.store.messages.count(BOB.did) == 3)
        refused = next(link for link in b.links.values() if link.spec.tenant == ALICE.did)
        await until(lambda: refused.failures >= 1)
        assert refused.last_error is not None and "403 SyncNotAuthorized" in refused.last_error
        assert b.store.messages.count(ALICE.did) == 0
        status = b.status()
        assert {(link["tenant"], link["failures"] > 0) for link in status["links"]} == {
            (ALICE.did, True), (BOB.did, False)}
        a.stop()
        b.stop()
