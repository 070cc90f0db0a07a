"""NodeMetrics on its own: the hooks' counters, ledger events, anti-entropy checks, and the
exposition format."""

from __future__ import annotations

from pathlib import Path

from p2psync.dwn.replication_types import Grant, InitialWrite, Parent
from p2psync.node.anti_entropy import CheckResult
from p2psync.node.metrics import GAP_REASONS, LATENCY_BUCKETS_MS, METRIC_NAMES, NodeMetrics
from p2psync.replication.scope import SyncScope
from p2psync.state.ledger import Ledger, LinkState
from tests.node.support import metric_samples
from tests.peer.support import new_store

TENANT = "did:key:z6MkmetricsTenant"
REMOTE = "did:key:z6MkmetricsRemote?storeId=1234"


def test_hooks_ledger_events_and_exposition(tmp_path: Path) -> None:
    store = new_store(tmp_path, "m")
    ledger = Ledger.for_store(store)
    now = [0.0]
    # The node runs this link (connected, repairing) and one that never reached its peer.
    running = {(TENANT, REMOTE, SyncScope.for_protocol("https://example.org/notes").scope_id):
               ("repairing", 1, "https://example.org/notes"),
               (TENANT, "url:ws://127.0.0.1:9/_p2psync", SyncScope.global_scope().scope_id): ("backoff", 4, "global")}
    metrics = NodeMetrics(ledger, clock=lambda: now[0], link_view=lambda: running)
    # Three `rev`s: 0.5 ms, 30 ms, and one still in flight.
    first = metrics.rev_started()
    now[0] += 0.0005
    metrics.rev_finished(first, "Applied")
    second = metrics.rev_started()
    now[0] += 0.030
    metrics.rev_finished(second, "Duplicate")
    metrics.rev_started()
    metrics.dependencies_missing([InitialWrite(record_id="r1"), Parent(record_id="p", protocol="https://x.org/p"),
                                  InitialWrite(record_id="r2")])
    metrics.dependencies_missing([Grant(permission_grant_id="g")])
    metrics.closure_failed("ClosureParentChainMissing")
    metrics.closure_failed("ClosureParentChainMissing")
    metrics.closure_failed("ClosureDependencyForbidden")
    link = ledger.open_link(TENANT, REMOTE, SyncScope.for_protocol("https://example.org/notes"))
    ledger.transition(link.key, LinkState.REPAIRING, reason="progress_gap")
    ledger.transition(link.key, LinkState.LIVE, reason="caught_up")
    ledger.transition(link.key, LinkState.REPAIRING, reason="progress_gap")
    ledger.record_failure(link.key, "503 ConnectionLost")
    metrics.gap_repaired("progress_gap", 3, 0)  # what the round's repair fetched
    metrics.gap_repaired("progress_gap", 0, 0)
    metrics.gap_repaired("never_linked", 4, 2)  # a first sync reconciled: no ledger transition
    metrics.push_refused("did:key:zStranger", "did:key:zStranger?storeId=x")
    metrics.quota_refused("peer", TENANT)
    metrics.quota_refused("peer", TENANT)
    metrics.anti_entropy_checked(CheckResult("equal", round_trips=1, bytes=75))
    metrics.anti_entropy_checked(CheckResult("repaired", local_lacks=2, remote_lacks=1, round_trips=2, bytes=900))
    metrics.anti_entropy_checked(CheckResult("failed", detail="cannot connect"))

    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    samples = metric_samples(body.decode())
    for name in METRIC_NAMES:  # every RFC name is exposed (a histogram by its series)
        assert any(s == name or s.startswith(name + "_") for s in samples), name
    assert samples["sync_inflight_events"] == [({}, 1.0)]
    assert dict((s["result"], v) for s, v in samples["sync_apply_results_total"]) == {"Applied": 1, "Duplicate": 1}
    buckets = {s["le"]: v for s, v in samples["sync_apply_latency_ms_bucket"]}
    assert buckets["1.0"] == 1 and buckets["25.0"] == 1 and buckets["50.0"] == 2 and buckets["+Inf"] == 2
    assert len(buckets) == len(LATENCY_BUCKETS_MS) + 1
    [(_, total)] = samples["sync_apply_latency_ms_sum"]
    assert abs(total - 30.5) < 1e-6
    assert dict((s["class"], v) for s, v in samples["sync_closure_missing_total"]) == {
        "Grant": 1, "InitialWrite": 2, "Parent": 1}
    assert dict((s["code"], v) for s, v in samples["sync_closure_failures_total"]) == {
        "ClosureDependencyForbidden": 1, "ClosureParentChainMissing": 2}
    repairs = {s["reason"]: v for s, v in samples["sync_gap_repairs_total"]}
    # A gap counted once, by the ledger; a first sync's reconciliation by the round.
    assert repairs == {**dict.fromkeys(GAP_REASONS, 0.0), "progress_gap": 2.0, "never_linked": 1.0}
    assert {s["reason"]: v for s, v in samples["sync_gap_repair_messages_total"]} == {
        "progress_gap": 3.0, "never_linked": 6.0}
    assert samples["sync_pushes_refused_total"] == [({}, 1.0)]
    # both kinds exposed from the start, so a rate has a series before the first refusal
    assert {s["kind"]: v for s, v in samples["sync_quota_refused_total"]} == {"tenant": 0.0, "peer": 2.0}
    assert {s["outcome"]: v for s, v in samples["sync_antientropy_rounds_total"]} == {
        "equal": 1, "repaired": 1, "unresolved": 0, "failed": 1}
    assert {s["side"]: v for s, v in samples["sync_antientropy_differences_total"]} == {
        "local_lacks": 2, "remote_lacks": 1}
    assert samples["sync_antientropy_round_trips_total"] == [({}, 3.0)]
    assert samples["sync_antientropy_bytes_total"] == [({}, 975.0)]
    labels = {"tenant": TENANT, "remote": REMOTE, "scope": "https://example.org/notes"}
    states = {s["state"]: v for s, v in samples["sync_link_state"] if s["remote"] == REMOTE}
    assert states == {"connecting": 0, "backoff": 0, "unresponsive": 0, "catching-up": 0, "repairing": 1, "live": 0,
                      "idle": 0}
    # A link with no ledger row yet has its state too, by the node's name of the peer.
    never = {s["state"]: v for s, v in samples["sync_link_state"] if s["remote"].startswith("url:")}
    assert never["backoff"] == 1 and sum(never.values()) == 1
    assert samples["sync_link_failures"] == [
        (labels, 1.0), ({"tenant": TENANT, "remote": "url:ws://127.0.0.1:9/_p2psync", "scope": "global"}, 4.0)]
    assert samples["sync_checkpoint_pull_contiguous"] == [(labels, 0.0)]  # nothing applied yet
    # OpenMetrics when the scraper asks for it.
    _, openmetrics = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert openmetrics.startswith("application/openmetrics-text")
    metrics.close()
    ledger.transition(link.key, LinkState.LIVE, reason="caught_up")
    ledger.transition(link.key, LinkState.REPAIRING, reason="progress_gap")
    assert metrics.gap_repairs["progress_gap"] == 2  # no longer listening


def test_a_ledger_link_no_node_runs_is_idle(tmp_path: Path) -> None:
    """The ledger says where the last round left a link (``live``); with no node running it,
    nothing moves: the gauge says ``idle``, and the failures are the ledger's."""
    ledger = Ledger.for_store(new_store(tmp_path, "m"))
    link = ledger.open_link(TENANT, REMOTE, SyncScope.global_scope())
    ledger.transition(link.key, LinkState.LIVE, reason="caught_up")
    metrics = NodeMetrics(ledger)
    samples = metric_samples(metrics.exposition()[0].decode())
    metrics.close()
    states = {s["state"]: v for s, v in samples["sync_link_state"]}
    assert states["idle"] == 1 and sum(states.values()) == 1
