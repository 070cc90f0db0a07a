"""The node's Prometheus metrics (the RFC's observability names) and their HTTP endpoint.

Two sources:

- the ledger, read at scrape time on the trio thread (the one thread that uses the store's
  connection): each link's state, failures and checkpoint positions;
- the peer's hooks (:class:`~p2psync.replication.observer.SyncObserver`), ledger events and the
  node's anti-entropy checks (:meth:`NodeMetrics.anti_entropy_checked`), counted in plain
  integers as they happen (everything runs on the trio thread, so no locks).

prometheus_client provides the metric families and the exposition format; the endpoint is a
tiny HTTP/1.1 responder on a trio socket (:func:`serve_metrics`) rather than
prometheus_client's own server thread, because a scrape reads the ledger, and the store's
SQLite connection must not be used from another thread.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Final

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from p2psync.dwn.replication_types import DependencyRef
from p2psync.node.anti_entropy import OUTCOMES, CheckResult
from p2psync.node.links import LINK_STATES
from p2psync.replication.scope import SyncScope
from p2psync.state.ledger import Direction, Ledger, LedgerEvent, LinkState, LinkTransition

__all__ = [
    "GAP_REASONS",
    "LinkView",
    "QUOTA_KINDS",
    "LATENCY_BUCKETS_MS",
    "METRIC_NAMES",
    "NodeMetrics",
    "serve_metrics",
]

log = logging.getLogger("p2psync.node.metrics")

#: Upper bounds (ms) of the apply latency histogram: a `rev` applies in about a millisecond on
#: a warm store (docs/benchmarks.md), a closure with fetched dependencies or a large attachment
#: takes seconds; beyond 10 s something is stuck.
LATENCY_BUCKETS_MS: Final = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)
#: A scrape request larger than this is not a scrape (Prometheus sends a few hundred bytes).
MAX_REQUEST_BYTES: Final = 8192
#: A client that has not sent its request line and headers in this time is dropped.
REQUEST_TIMEOUT: Final = 10.0

#: The RFC's metric names (its "Observability Requirements"), as exposed.
METRIC_NAMES: Final = (
    "sync_link_state",
    "sync_checkpoint_pull_received",
    "sync_checkpoint_pull_contiguous",
    "sync_checkpoint_push_received",
    "sync_checkpoint_push_contiguous",
    "sync_gap_repairs_total",
    "sync_closure_missing_total",
    "sync_apply_latency_ms",
    "sync_inflight_events",
)
_LINK_LABELS: Final = ("tenant", "remote", "scope")
#: The reasons a link enters ``repairing`` (the ledger transitions' ``reason``: a progress gap,
#: a new epoch, a pending-token overflow, a message not applied), exposed at 0 from the start so
#: that a rate over ``sync_gap_repairs_total{reason}`` has a series before the first repair.
#: Another reason, should one appear, gets its series when it first happens.
GAP_REASONS: Final = ("progress_gap", "epoch_changed", "pending_overflow", "unsettled")
#: The kinds of quota refusal (p2psync/state/quota.py), exposed at 0 from the start: a
#: tenant's storage quota (507 TenantQuotaExceeded) and a pusher's budget (429 PeerQuotaExceeded).
QUOTA_KINDS: Final = ("tenant", "peer")
#: Reasons the ledger already counts (a link entering `repairing`); the round's reconciliations
#: for other reasons (never_linked, checkpoint_mismatch) are counted when they finish.
LEDGER_COUNTED: Final = frozenset(GAP_REASONS)

#: The links a node runs now: (tenant, remote, scopeId) -> (state, consecutive failures, scope
#: label). ``remote`` is the ledger's ``DID?storeId=…`` once the node knows it, else the node's
#: own name of the peer (``url:…``, ``sid:…``): a link that never reached its peer has no
#: ledger row yet, and still has a state.
LinkView = Mapping[tuple[str, str, str], tuple[str, int, str]]


def scope_label(scope: SyncScope) -> str:
    """``global``, the protocol URL, or the scopeId of a subset (what an operator recognises)."""
    if scope.kind == "global":
        return "global"
    if scope.kind == "protocol" and scope.protocol is not None:
        return scope.protocol
    return scope.scope_id


class NodeMetrics:
    """The metrics of one node: a :class:`~p2psync.replication.observer.SyncObserver` for its peer and
    a collector over its ledger, in a registry of its own (two nodes in one process do not mix).

    ``node_facts``: called at each scrape for the node's own gauges (links by origin, peers
    discovered, passive connections), as ``{name: (help, {labels: value})}``. ``link_view``:
    called at each scrape for the state and failures of the links the node runs
    (:data:`LinkView`); a ledger link it does not run is ``idle``.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        node_facts: Callable[[], dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]] | None = None,
        link_view: Callable[[], LinkView] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.ledger = ledger
        self.node_facts = node_facts
        self.link_view = link_view
        self.clock = clock
        self.inflight = 0
        self.gap_repairs: dict[str, int] = dict.fromkeys(GAP_REASONS, 0)
        self.gap_repair_messages: dict[str, int] = {}
        self.pushes_refused = 0  # pushes for a tenant this node does not store (issue #15)
        #: refusals by a quota of this node's store (issue #15), by kind
        self.quota_refused_by_kind: dict[str, int] = dict.fromkeys(QUOTA_KINDS, 0)
        self.antientropy_rounds: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.antientropy_bytes = 0
        self.antientropy_round_trips = 0
        self.antientropy_differences = {"local_lacks": 0, "remote_lacks": 0}
        self.checkpoint_rewinds = 0
        self.closure_missing: dict[str, int] = {}
        self.closure_failures: dict[str, int] = {}
        self.apply_results: dict[str, int] = {}
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS_MS) + 1)  # the last one is +Inf
        self.latency_sum_ms = 0.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._unlisten = ledger.add_listener(self._on_ledger_event)

    def close(self) -> None:
        """Stop listening to the ledger."""
        self._unlisten()

    # -- SyncObserver (called by the peer on its hot path: cheap, never raises) -----------------

    def rev_started(self) -> float:
        self.inflight += 1
        return self.clock()

    def rev_finished(self, started: float, kind: str) -> None:
        self.inflight -= 1
        ms = (self.clock() - started) * 1000.0
        self.latency_buckets[bisect.bisect_left(LATENCY_BUCKETS_MS, ms)] += 1
        self.latency_sum_ms += ms
        self.apply_results[kind] = self.apply_results.get(kind, 0) + 1

    def dependencies_missing(self, refs: Sequence[DependencyRef]) -> None:
        for ref in refs:
            self.closure_missing[ref.type] = self.closure_missing.get(ref.type, 0) + 1

    def closure_failed(self, code: str) -> None:
        self.closure_failures[code] = self.closure_failures.get(code, 0) + 1

    def push_refused(self, tenant: str, remote: str) -> None:
        self.pushes_refused += 1

    def quota_refused(self, kind: str, tenant: str) -> None:
        self.quota_refused_by_kind[kind] = self.quota_refused_by_kind.get(kind, 0) + 1

    def gap_repaired(self, reason: str, fetched: int, taken: int) -> None:
        # A progress gap was counted when its link entered `repairing` (a ledger event, below);
        # a first sync or a checkpoint mismatch that reconciled instead of replaying enters no
        # such state, so it is counted here. What moved is counted here either way.
        if reason not in LEDGER_COUNTED:
            self.gap_repairs[reason] = self.gap_repairs.get(reason, 0) + 1
        self.gap_repair_messages[reason] = self.gap_repair_messages.get(reason, 0) + fetched + taken

    # -- the node's anti-entropy -----------------------------------------------------------------

    def anti_entropy_checked(self, result: CheckResult) -> None:
        """One periodic anti-entropy check of a link ended (p2psync/node/anti_entropy.py)."""
        self.antientropy_rounds[result.outcome] = self.antientropy_rounds.get(result.outcome, 0) + 1
        self.antientropy_bytes += result.bytes
        self.antientropy_round_trips += result.round_trips
        self.antientropy_differences["local_lacks"] += result.local_lacks
        self.antientropy_differences["remote_lacks"] += result.remote_lacks

    # -- ledger events ---------------------------------------------------------------------------

    def _on_ledger_event(self, event: LedgerEvent) -> None:
        # A repair is a link entering `repairing` (a progress gap, a new epoch, a pending-token
        # overflow, a closure hard-fail, a message answered Incomplete or Deferred): the RFC's
        # gap -> repair -> live cycle.
        if not isinstance(event, LinkTransition):
            return
        if event.kind == "state" and event.state_to == LinkState.REPAIRING:
            self.gap_repairs[event.reason] = self.gap_repairs.get(event.reason, 0) + 1
        elif event.kind == "checkpoint_rewind":
            self.checkpoint_rewinds += 1  # our checkpoint and the peer's copy disagreed (§4.4)

    # -- exposition ------------------------------------------------------------------------------

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The body and content type of one scrape (text format, or OpenMetrics if accepted)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def families(self) -> Iterator[Metric]:
        """Every metric family, read now."""
        yield from self._link_families()
        repairs = CounterMetricFamily("sync_gap_repairs",
                                      "Links that entered repairing, by reason (gap, epoch, overflow, not applied).",
                                      labels=["reason"])
        for reason, n in sorted(self.gap_repairs.items()):
            repairs.add_metric([reason], n)
        yield repairs
        repaired = CounterMetricFamily("sync_gap_repair_messages",
                                       "Messages fetched by a round's gap repairs, by reason.", labels=["reason"])
        for reason, n in sorted(self.gap_repair_messages.items()):
            repaired.add_metric([reason], n)
        yield repaired
        yield CounterMetricFamily("sync_pushes_refused",
                                  "Pushes refused because this node does not store their tenant.",
                                  value=self.pushes_refused)
        quota = CounterMetricFamily(
            "sync_quota_refused",
            "Requests, `rev`s and listings refused by a quota of this node: a tenant's (507) or a pusher's (429).",
            labels=["kind"])
        for kind, n in sorted(self.quota_refused_by_kind.items()):
            quota.add_metric([kind], n)
        yield quota
        yield from self._anti_entropy_families()
        rewinds = CounterMetricFamily("sync_checkpoint_rewinds",
                                      "Checkpoints rewound to the peer's lower copy at a round's start.")
        rewinds.add_metric([], self.checkpoint_rewinds)
        yield rewinds
        missing = CounterMetricFamily("sync_closure_missing", "Dependencies a closure had to fetch, by class.",
                                      labels=["class"])
        for cls, n in sorted(self.closure_missing.items()):
            missing.add_metric([cls], n)
        yield missing
        failures = CounterMetricFamily(
            "sync_closure_failures", "Closures that ended without a hard dependency, by strict-closure code.",
            labels=["code"])
        for code, n in sorted(self.closure_failures.items()):
            failures.add_metric([code], n)
        yield failures
        results = CounterMetricFamily("sync_apply_results", "Answered `rev`s by ReplicationApplyResult kind.",
                                      labels=["result"])
        for kind, n in sorted(self.apply_results.items()):
            results.add_metric([kind], n)
        yield results
        yield self._latency_family()
        inflight = GaugeMetricFamily("sync_inflight_events", "`rev`s received and not yet answered.")
        inflight.add_metric([], self.inflight)
        yield inflight
        if self.node_facts is not None:
            for name, (help_text, values) in self.node_facts().items():
                labels = sorted({k for key in values for k, _ in key})
                family = GaugeMetricFamily(name, help_text, labels=labels)
                for key, value in values.items():
                    given = dict(key)
                    family.add_metric([given.get(k, "") for k in labels], value)
                yield family

    def _anti_entropy_families(self) -> Iterable[Metric]:
        rounds = CounterMetricFamily("sync_antientropy_rounds", "Periodic anti-entropy checks of links, by outcome.",
                                     labels=["outcome"])
        for outcome, n in self.antientropy_rounds.items():
            rounds.add_metric([outcome], n)
        yield rounds
        sent = CounterMetricFamily("sync_antientropy_bytes",
                                   "Bytes both sides sent reconciling in anti-entropy checks (not messages moved).")
        sent.add_metric([], self.antientropy_bytes)
        yield sent
        trips = CounterMetricFamily("sync_antientropy_round_trips", "Reconcile round trips of anti-entropy checks.")
        trips.add_metric([], self.antientropy_round_trips)
        yield trips
        differences = CounterMetricFamily(
            "sync_antientropy_differences",
            "Messages anti-entropy checks found missing on one side (in the link's direction), before repair.",
            labels=["side"])
        for side, n in self.antientropy_differences.items():
            differences.add_metric([side], n)
        yield differences

    def _latency_family(self) -> HistogramMetricFamily:
        buckets: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*LATENCY_BUCKETS_MS, float("inf")), self.latency_buckets, strict=True):
            total += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
        family = HistogramMetricFamily("sync_apply_latency_ms",
                                       "Time from a `rev`'s arrival to its answer (apply durable), ms.")
        family.add_metric([], buckets, sum_value=self.latency_sum_ms)
        return family

    def _link_families(self) -> Iterable[Metric]:
        state = GaugeMetricFamily(
            "sync_link_state",
            "1 for the link's current state (one series per state; live: connected and caught up).",
            labels=[*_LINK_LABELS, "state"])
        failures = GaugeMetricFamily("sync_link_failures", "Consecutive failures of the link (0 when healthy).",
                                     labels=list(_LINK_LABELS))
        positions = {
            (direction, part): GaugeMetricFamily(
                f"sync_checkpoint_{direction}_{part}",
                f"{direction} checkpoint: log position of the {part} token (0: none yet).",
                labels=list(_LINK_LABELS),
            )
            for direction in ("pull", "push")
            for part in ("received", "contiguous")
        }
        unapplied = GaugeMetricFamily(
            "sync_link_unapplied",
            "Messages received and not applied (a `rev` answered Incomplete or Deferred, or failed), by direction.",
            labels=[*_LINK_LABELS, "direction"],
        )
        running = dict(self.link_view()) if self.link_view is not None else {}
        for link in self.ledger.links():
            labels = [link.key.tenant, link.key.remote, scope_label(link.scope)]
            now, failed, _ = running.pop((link.key.tenant, link.key.remote, link.key.scope_id),
                                         ("idle", link.failure_count, ""))
            for each in LINK_STATES:
                state.add_metric([*labels, each], 1.0 if now == each else 0.0)
            failures.add_metric(labels, failed)
            for direction in (Direction.PULL, Direction.PUSH):
                checkpoint, _ = self.ledger.get_checkpoint(link.key, direction)
                unapplied.add_metric([*labels, str(direction)], len(checkpoint.unapplied_tokens))
                received, contiguous = checkpoint.received_token, checkpoint.contiguous_applied_token
                positions[(str(direction), "received")].add_metric(labels, 0 if received is None else received.position)
                positions[(str(direction), "contiguous")].add_metric(
                    labels, 0 if contiguous is None else contiguous.position)
        for (tenant, remote, _), (now, failed, scope) in running.items():  # no ledger row yet
            for each in LINK_STATES:
                state.add_metric([tenant, remote, scope, each], 1.0 if now == each else 0.0)
            failures.add_metric([tenant, remote, scope], failed)
        yield state
        yield failures
        yield unapplied
        yield from positions.values()


class _Collector(Collector):
    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self.metrics.families())


# --------------------------------------------------------------------------- the endpoint


async def serve_metrics(
    metrics: NodeMetrics, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Answer ``GET /metrics`` on ``host:port`` until cancelled; reports the bound port."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(partial(_answer, metrics), listeners)


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    data = b""
    with trio.move_on_after(REQUEST_TIMEOUT):
        while b"\r\n\r\n" not in data and len(data) <= MAX_REQUEST_BYTES:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return None
            data += chunk
        return data if b"\r\n\r\n" in data else None
    return None


async def _answer(metrics: NodeMetrics, stream: trio.SocketStream) -> None:
    try:
        head = await _read_head(stream)
        if head is None:
            return
        lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
        if method not in ("GET", "HEAD"):
            status, body, ctype = "405 Method Not Allowed", b"GET /metrics\n", "text/plain; charset=utf-8"
        elif path == "/metrics":
            try:
                body, ctype = metrics.exposition(headers.get("accept"))
                status = "200 OK"
            except Exception:  # a broken scrape must not end the endpoint; say so in the log
                log.exception("metrics scrape failed")
                status, body, ctype = "500 Internal Server Error", b"scrape failed\n", "text/plain; charset=utf-8"
        elif path == "/":
            status, body, ctype = "200 OK", b"p2psync node: metrics at /metrics\n", "text/plain; charset=utf-8"
        else:
            status, body, ctype = "404 Not Found", b"not found; try /metrics\n", "text/plain; charset=utf-8"
        response = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n").encode("latin-1")
        await stream.send_all(response + (b"" if method == "HEAD" else body))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the client went away; nothing to tell it
    finally:
        await stream.aclose()
