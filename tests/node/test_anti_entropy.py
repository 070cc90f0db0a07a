"""The node's periodic anti-entropy between real nodes over loopback: messages the log sync
cannot carry (stored without a log entry, behind the sync's back) are found and moved by the
link's next check, counted in the metrics and shown in the status; the checks end with the link."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from p2psync.cli.sync import status_lines, status_report
from p2psync.dwn.did import Identity
from p2psync.dwn.store import Store
from p2psync.node.browse import anti_entropy_line
from p2psync.node.node import Node
from tests.node.fakes import FakeLan, FakePeerGone
from tests.node.support import free_port, make_node, metric_samples, scrape, until
from tests.peer.support import Clock, seeded, write_notes

ALICE = seeded("alice-node-anti-entropy")
#: Short periods so that a test sees several checks in a second or two (the configuration
#: refuses less than 1 s; NodeConfig built directly does not check).
FAST: dict[str, Any] = {"anti_entropy_interval": 0.2, "anti_entropy_jitter": 0.25, "anti_entropy_max_interval": 0.8}


def url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/_p2psync"


def cids(node: Node) -> set[str]:
    return set(node.store.messages.cids(ALICE.did))


def write_unlogged(store: Store, author: Identity, count: int, *, clock: Clock, prefix: str) -> set[str]:
    """``count`` notes stored without an entry in the event log (as a canonical replay does
    while it runs): no log sync ever offers them, only a comparison of the sets finds them."""
    before = set(store.messages.cids(author.did))
    positions = store.events.count(author.did)
    store.events.frozen = True
    try:
        write_notes(store, author, count, clock=clock, prefix=prefix)
    finally:
        store.events.frozen = False
    assert store.events.count(author.did) == positions
    return set(store.messages.cids(author.did)) - before


async def test_the_periodic_check_repairs_what_the_log_sync_did_not_carry(tmp_path: Path) -> None:
    pb = free_port()
    b = make_node(tmp_path, "b", ALICE, port=pb)
    a = make_node(tmp_path, "a", ALICE, peers=[url(pb)], metrics=True, **FAST)
    a.status_path = tmp_path / "a-status.json"
    write_notes(a.store, ALICE, 3, clock=Clock(), prefix="logged a")
    write_notes(b.store, ALICE, 2, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="logged b")
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        await nursery.start(a.run)
        await until(lambda: cids(a) == cids(b) and len(cids(a)) == 5)
        [link] = a.links.values()
        # Equal replicas: checks run and find nothing; the interval grows to the cap.
        await until(lambda: link.anti_entropy.checks >= 2 and link.anti_entropy.interval == 0.8)
        assert link.anti_entropy.last is not None and link.anti_entropy.last.outcome == "equal"
        # Behind the sync's back: one message only a holds, two only b holds.
        only_a = write_unlogged(a.store, ALICE, 1, clock=Clock("2032-01-01T00:00:00.000000Z"), prefix="unlogged a")
        only_b = write_unlogged(b.store, ALICE, 2, clock=Clock("2033-01-01T00:00:00.000000Z"), prefix="unlogged b")
        await until(lambda: cids(a) == cids(b))
        assert cids(a) >= only_a | only_b and len(cids(a)) == 8
        await until(lambda: a.metrics.antientropy_rounds["repaired"] == 1)
        # The repair brought the interval back to the base; later checks are equal again.
        await until(lambda: link.anti_entropy.checks >= 1 and link.anti_entropy.last is not None
                    and link.anti_entropy.last.outcome == "equal")
        assert a.metrics_url is not None
        _, body = await scrape(a.metrics_url)
        await until(lambda: a.status_path is not None and a.status_path.exists()
                    and json.loads(a.status_path.read_text())["links"][0]["antiEntropy"]["checks"] >= 3)
        assert a.status_path is not None
        status = json.loads(a.status_path.read_text())
        report = status_report(a.store, status)  # `p2psync status` beside the running node
        a.stop()
        b.stop()
    samples = metric_samples(body)
    rounds = {s["outcome"]: v for s, v in samples["sync_antientropy_rounds_total"]}
    assert rounds["repaired"] == 1 and rounds["equal"] >= 2 and rounds["failed"] == 0 and rounds["unresolved"] == 0
    differences = {s["side"]: v for s, v in samples["sync_antientropy_differences_total"]}
    assert differences == {"local_lacks": 2, "remote_lacks": 1}
    [(_, trips)] = samples["sync_antientropy_round_trips_total"]
    [(_, sent)] = samples["sync_antientropy_bytes_total"]
    assert trips >= rounds["equal"] + 1 and sent > 0
    # The status file shows the last check and the next one.
    [shown] = status["links"]
    check = shown["antiEntropy"]
    assert check["enabled"] and check["checks"] >= 3 and check["lastCheck"] is not None
    assert check["outcome"] in ("equal", "repaired") and (check["nextCheck"] is not None or check["running"])
    line = anti_entropy_line(check)
    assert line is not None and line.startswith("anti-entropy: last check ")
    [ledger_link] = report["links"]
    assert ledger_link["antiEntropy"] == check
    assert f"  {line}" in status_lines(report)
    assert "antiEntropy" not in status_report(a.store, {**status, "storeId": b.store_id})["links"][0]  # not a's node


async def test_a_pull_only_link_fetches_what_it_lacks_and_leaves_the_rest(tmp_path: Path) -> None:
    """A pulling link repairs its side; what only it holds is not its to move (``equal``)."""
    from p2psync.node.config import TenantConfig

    pb = free_port()
    b = make_node(tmp_path, "b", ALICE, port=pb)
    a = make_node(tmp_path, "a", ALICE, peers=[url(pb)], tenants=(TenantConfig(None, "pull"),), **FAST)
    write_notes(b.store, ALICE, 2, clock=Clock(), prefix="logged b")
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        await nursery.start(a.run)
        await until(lambda: len(cids(a)) == 2)
        [link] = a.links.values()
        await until(lambda: link.anti_entropy.checks >= 1)
        mine = write_unlogged(a.store, ALICE, 2, clock=Clock("2032-01-01T00:00:00.000000Z"), prefix="mine")
        theirs = write_unlogged(b.store, ALICE, 1, clock=Clock("2033-01-01T00:00:00.000000Z"), prefix="theirs")
        await until(lambda: theirs <= cids(a))
        await until(lambda: a.metrics.antientropy_rounds["repaired"] == 1)
        checks = link.anti_entropy.checks
        await until(lambda: link.anti_entropy.checks >= checks + 2)
        a.stop()
        b.stop()
    assert not mine & cids(b)  # never pushed
    assert a.metrics.antientropy_differences == {"local_lacks": 1, "remote_lacks": 0}
    assert a.metrics.antientropy_rounds["unresolved"] == 0 and a.metrics.antientropy_rounds["failed"] == 0
    assert link.anti_entropy.last is not None and link.anti_entropy.last.outcome == "equal"


async def test_checks_end_with_the_link(tmp_path: Path) -> None:
    lan = FakeLan()
    a = make_node(tmp_path, "a", ALICE, auto=True, discovery=lan.factory, gone_grace=0.2, **FAST)
    b = make_node(tmp_path, "b", ALICE, auto=True, discovery=lan.factory, gone_grace=0.2, **FAST)
    small, large = sorted((a, b), key=lambda n: n.store_id)
    write_notes(large.store, ALICE, 2, clock=Clock(), prefix="large")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        await until(lambda: len(cids(small)) == 2 and len(small.links) == 1)
        [link] = small.links.values()
        await until(lambda: link.anti_entropy.checks >= 2)
        # The peer leaves: after the grace period the link is retired, its checks with it.
        lan.announce(FakePeerGone("large", large.did, large.store_id))
        await until(lambda: not small.links and link.done.is_set())
        done = link.anti_entropy.checks
        counted = sum(small.metrics.antientropy_rounds.values())
        await trio.sleep(1.0)  # several periods
        assert link.anti_entropy.checks == done and sum(small.metrics.antientropy_rounds.values()) == counted
        assert link.anti_entropy.next_at is None and not link.anti_entropy.running
        a.stop()
        b.stop()
    assert small.metrics.antientropy_rounds["equal"] == counted  # nothing failed on the way out


async def test_a_down_peer_fails_the_check_until_it_is_back(tmp_path: Path) -> None:
    pb = free_port()
    b = make_node(tmp_path, "b", ALICE, port=pb)
    a = make_node(tmp_path, "a", ALICE, peers=[url(pb)], **FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with trio.open_nursery() as inner:
            await inner.start(b.run)
            await until(lambda: len(a.links) == 1 and next(iter(a.links.values())).anti_entropy.checks >= 1)
            b.stop()
        [link] = a.links.values()
        await until(lambda: a.metrics.antientropy_rounds["failed"] >= 2)
        last = link.anti_entropy.last
        assert last is not None and last.detail is not None and last.detail.startswith(f"cannot connect to {url(pb)}")
        assert link.ae_failure == last.detail and a.links == {link.spec.key: link}  # the link goes on
        # Back on the same address: the link reconnects, and the checks succeed again.
        again = Node(b.config, b.store, ALICE)
        await nursery.start(again.run)
        await until(lambda: link.ae_failure is None and link.anti_entropy.last is not None
                    and link.anti_entropy.last.outcome == "equal")
        a.stop()
        again.stop()
