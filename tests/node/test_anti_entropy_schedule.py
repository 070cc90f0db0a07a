"""A link's periodic anti-entropy, step by step (p2psync.node.anti_entropy and Node._anti_entropy,
_check), with ``Peer.reconcile`` replaced by a script and trio's MockClock: when checks run,
how the interval backs off and comes back, how outcomes are read and failures reported."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from p2psync.node.anti_entropy import CHECK_TIMEOUT, AntiEntropySchedule, check_result
from p2psync.node.links import LinkSpec
from p2psync.node.node import Node, NodeLink
from p2psync.peer.anti_entropy import ReconcileSummary
from p2psync.peer.repair import MessageOutcome, RepairSummary
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import PeerError
from tests.node.support import make_node, metric_samples
from tests.peer.support import seeded

ALICE = seeded("alice-anti-entropy-schedule")
URL = "ws://10.77.0.9:4984/_p2psync"
BASE, JITTER, CAP = 40.0, 0.25, 300.0


def _node(tmp_path: Path) -> Node:
    node = make_node(tmp_path, "n", ALICE, anti_entropy_interval=BASE, anti_entropy_jitter=JITTER,
                     anti_entropy_max_interval=CAP)
    node._rng = random.Random(11)
    return node


def _link(direction: str = "both") -> NodeLink:
    spec = LinkSpec(remote=f"url:{URL}", tenant=ALICE.did, scope=SyncScope.global_scope(),
                    direction=direction, url=URL, origin="static", label="phone")  # type: ignore[arg-type]
    return NodeLink(spec)


def _caught_up(link: NodeLink) -> None:
    """What Node._learn_from_round does when a round on a new connection catches up."""
    link.connections += 1
    link.caught_up_on = link.connections
    link.caught_up.set()
    link.caught_up = trio.Event()


def _summary(*, equal: bool = True, remote_only: int = 0, local_only: int = 0, **extra: Any) -> ReconcileSummary:
    scope = SyncScope.global_scope()
    return ReconcileSummary(ALICE.did, "did:key:z6Mkpeer?storeId=1", scope, equal=equal,
                            remote_only=[{"cid": f"r{i}"} for i in range(remote_only)],
                            local_only=[{"cid": f"l{i}"} for i in range(local_only)],
                            round_trips=1, bytes=40, **extra)


def _scripted(node: Node, answer: Callable[[int], ReconcileSummary | BaseException]) -> list[float]:
    """Make ``node.peer.reconcile`` answer ``answer(call number)``; returns the start times."""
    starts: list[float] = []

    async def reconcile(target: Any, **kwargs: Any) -> ReconcileSummary:
        assert callable(target) and kwargs["repair"] is True and kwargs["tenant"] == ALICE.did
        starts.append(trio.current_time())
        outcome = answer(len(starts))
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    node.peer.reconcile = reconcile  # type: ignore[method-assign,assignment]
    return starts


def _bounds(interval: float) -> tuple[float, float]:
    return interval * (1 - JITTER), min(interval * (1 + JITTER), CAP)


def _assert_waits(starts: list[float], intervals: list[float], since: float) -> None:
    waits = [b - a for a, b in zip([since, *starts], starts, strict=False)]
    assert len(waits) >= len(intervals)
    for wait, interval in zip(waits, intervals, strict=False):
        low, high = _bounds(interval)
        assert low - 1e-9 <= wait <= high + 1e-9, (wait, interval)


def test_the_schedule_jitters_doubles_while_equal_caps_and_resets() -> None:
    schedule = AntiEntropySchedule(45, 1 / 3, 600, random.Random(3))
    draws = [schedule.delay() for _ in range(200)]
    assert min(draws) >= 30 and max(draws) <= 60 and max(draws) - min(draws) > 20  # 30-60 s, spread
    seen = []
    for _ in range(6):
        schedule.after("equal")
        seen.append(schedule.interval)
    assert seen == [90, 180, 360, 600, 600, 600]
    assert all(400 <= schedule.delay() <= 600 for _ in range(100))  # never above the cap
    schedule.after("failed")
    assert schedule.interval == 600  # a failure retries at the same period
    schedule.after("repaired")
    assert schedule.interval == 45
    schedule.after("unresolved")
    assert schedule.interval == 90  # retrying at once would not change what could not move
    schedule.reset()
    assert schedule.interval == 45
    with pytest.raises(ValueError):
        AntiEntropySchedule(45, 1.0, 600, random.Random())


def test_outcomes_are_read_in_the_links_direction() -> None:
    assert check_result(_summary(), "both").outcome == "equal"
    repaired = check_result(_summary(equal=True, remote_only=2, local_only=1), "both")
    assert (repaired.outcome, repaired.local_lacks, repaired.remote_lacks) == ("repaired", 2, 1)
    assert (repaired.round_trips, repaired.bytes) == (1, 40)
    stuck = check_result(_summary(equal=False, remote_only=1, unresolved="1 here lack remains"), "both")
    assert stuck.outcome == "unresolved" and stuck.detail == "1 here lack remains"
    # A pulling link: what the peer lacks is not its to move, and not counted.
    theirs = check_result(_summary(equal=False, local_only=3, unresolved="3 there lack"), "pull")
    assert (theirs.outcome, theirs.local_lacks, theirs.remote_lacks) == ("equal", 0, 0)
    fetched = RepairSummary(ALICE.did, "peer", [MessageOutcome("r0", "applied"), MessageOutcome("r1", "present")])
    pulled = check_result(_summary(equal=False, remote_only=2, local_only=3, fetched=fetched), "pull")
    assert (pulled.outcome, pulled.local_lacks) == ("repaired", 2)
    failed = RepairSummary(ALICE.did, "peer", [MessageOutcome("r0", "applied"),
                                                 MessageOutcome("r1", "refused", code="Invalid")])
    refused = check_result(_summary(equal=False, remote_only=2, fetched=failed), "pull")
    assert refused.outcome == "unresolved" and refused.detail == "1 refused Invalid"
    # A pushing link: what the peer took.
    pushed = check_result(_summary(equal=False, local_only=2, remote_only=5, pushed={"Applied": 2}), "push")
    assert (pushed.outcome, pushed.local_lacks, pushed.remote_lacks) == ("repaired", 0, 2)
    refusal = check_result(_summary(equal=False, local_only=2, pushed={"PushRefused": 2}), "push")
    assert refusal.outcome == "unresolved" and refusal.detail == "2 PushRefused"


async def test_no_check_before_a_round_caught_up_then_equal_replicas_back_off(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    node = _node(tmp_path)
    starts = _scripted(node, lambda _: _summary())
    link = _link()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node._anti_entropy, link)
        await trio.sleep(10 * CAP)
        assert starts == [] and link.anti_entropy.next_at is None  # the link never caught up
        caught_up_at = trio.current_time()
        _caught_up(link)
        await trio.sleep(0.001)  # the loop wakes and schedules its first check (30-50 s away)
        assert link.anti_entropy.next_at is not None and not starts
        while len(starts) < 7:
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    # 40 s (±25 %), then doubling while equal: 80, 160, then the 300 s cap.
    _assert_waits(starts, [40, 80, 160, 300, 300, 300, 300], caught_up_at)
    status = link.anti_entropy.to_json()
    assert status["checks"] == 7 and status["outcome"] == "equal" and status["interval"] == CAP
    assert (status["localLacks"], status["remoteLacks"], status["roundTrips"]) == (0, 0, 1)
    rounds = {s["outcome"]: v for s, v in metric_samples(node.metrics.exposition()[0].decode())[
        "sync_antientropy_rounds_total"]}
    assert rounds == {"equal": 7, "repaired": 0, "unresolved": 0, "failed": 0}


async def test_a_difference_or_a_reconnect_brings_the_interval_back(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    node = _node(tmp_path)
    # Equal, equal, equal, then a difference repaired, then equal again.
    starts = _scripted(node, lambda n: _summary(remote_only=1 if n == 4 else 0))
    link = _link()
    _caught_up(link)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node._anti_entropy, link)
        while len(starts) < 5:
            await trio.sleep(1)
        assert link.anti_entropy.interval == 2 * BASE  # one equal check after the repair
        # The link reconnects and its new round catches up: the next check comes within the
        # base interval instead of after the doubled one.
        reconnected = trio.current_time()
        _caught_up(link)
        while len(starts) < 6:
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert starts[5] - reconnected <= BASE * (1 + JITTER)
    # Equal three times (doubling to the cap), the repair (back to the base), equal (doubled).
    _assert_waits(starts[1:5], [80, 160, 300, 40], starts[0])
    samples = metric_samples(node.metrics.exposition()[0].decode())
    assert dict((s["side"], v) for s, v in samples["sync_antientropy_differences_total"]) == {
        "local_lacks": 1, "remote_lacks": 0}
    assert dict((s["outcome"], v) for s, v in samples["sync_antientropy_rounds_total"])["repaired"] == 1
    assert samples["sync_antientropy_round_trips_total"] == [({}, 6.0)]
    assert samples["sync_antientropy_bytes_total"] == [({}, 240.0)]


async def test_a_failing_check_is_logged_once_and_retried_at_the_next_period(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    node = _node(tmp_path)
    refused = PeerError(403, "ReconcileNotAuthorized", "set reconciliation is for readers of the whole scope")
    answers: list[ReconcileSummary | BaseException] = [
        OSError(111, "Connection refused"), OSError(111, "Connection refused"), refused, _summary()]
    starts = _scripted(node, lambda n: answers[n - 1])
    link = _link()
    _caught_up(link)
    caplog.set_level(logging.INFO, logger="p2psync.node")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node._anti_entropy, link)
        while len(starts) < 4:
            await trio.sleep(1)
        await trio.sleep(0)
        nursery.cancel_scope.cancel()
    _assert_waits(starts, [BASE, BASE, BASE, BASE], starts[0] - BASE)  # failures keep the period
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # the same failure twice is logged once; a new one again
    assert f"cannot connect to {URL}" in warnings[0] and "403 ReconcileNotAuthorized" in warnings[1]
    assert any("works again" in r.getMessage() for r in caplog.records)
    assert link.failures == 0 and link.last_error is None  # the link's own rounds are not touched
    rounds = {s["outcome"]: v for s, v in metric_samples(node.metrics.exposition()[0].decode())[
        "sync_antientropy_rounds_total"]}
    assert rounds == {"equal": 1, "repaired": 0, "unresolved": 0, "failed": 3}


async def test_checks_never_overlap(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """A check slower than the period: the next one waits for it, then for its own period."""
    node = _node(tmp_path)
    running, most, ends = 0, 0, []

    async def reconcile(target: Any, **kwargs: Any) -> ReconcileSummary:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await trio.sleep(CHECK_TIMEOUT - 1)  # longer than any period, within the timeout
        finally:
            running -= 1
        ends.append(trio.current_time())
        return _summary(remote_only=1)

    node.peer.reconcile = reconcile  # type: ignore[method-assign,assignment]
    link = _link()
    _caught_up(link)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node._anti_entropy, link)
        while len(ends) < 3:
            await trio.sleep(1)
            if running:
                assert link.anti_entropy.running and link.anti_entropy.to_json()["nextCheck"] is None
        nursery.cancel_scope.cancel()
    assert most == 1


async def test_a_check_that_hangs_is_abandoned(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    node = _node(tmp_path)

    async def reconcile(target: Any, **kwargs: Any) -> ReconcileSummary:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    node.peer.reconcile = reconcile  # type: ignore[method-assign,assignment]
    link = _link()
    _caught_up(link)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node._anti_entropy, link)
        while link.anti_entropy.checks < 2:
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    last = link.anti_entropy.last
    assert last is not None and last.outcome == "failed"
    assert last.detail == f"{URL} did not finish the check in {CHECK_TIMEOUT:.0f} s"
