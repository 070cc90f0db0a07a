"""Idempotency: applying everything twice, or from two sources at once, changes nothing twice."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import trio

from p2psync.conformance import load_scenario
from p2psync.dwn.engine import Dwn
from p2psync.dwn.replication_types import DependencyRef, ReplicationApplyResult
from p2psync.dwn.store import Store
from p2psync.replication.closure import ClosureAdmitter, ClosureOutcome, ReplicationEntry
from p2psync.state.local import LocalApplier, LocalStoreFetcher
from tests.replication.support import (
    Step,
    admit_all,
    assert_log_matches_messages,
    chat_world,
    log_appends,
    process_all,
    snapshot,
)

SCENARIO = Path(__file__).resolve().parents[2] / "interop" / "scenarios" / "permissions-revocation.json"


def _scenario_steps() -> tuple[str, list[Step]]:
    scenario = load_scenario(SCENARIO)
    accepted = [s for s in scenario.steps if s.op == "process" and s.expect is not None and s.expect.code in (202, 204)]
    tenants = {s.tenant for s in accepted}
    assert len(tenants) == 1
    return accepted[0].tenant or "", [Step(s.note or "", s.message, s.data) for s in accepted]


async def test_applying_everything_twice_changes_nothing(tmp_path: Path) -> None:
    w = chat_world()
    source = Dwn(Store(tmp_path / "source.db"))
    process_all(source, w.tenant, w.ordered())
    replica = Dwn(Store(tmp_path / "replica.db"))
    steps = w.ordered()
    random.Random(7).shuffle(steps)
    first = await admit_all(replica, w.tenant, steps, source.store)
    assert all(o.status == "admitted" for o in first.outcomes.values())
    after_first, appends = snapshot(replica.store, w.tenant), log_appends(replica.store, w.tenant)
    assert after_first == snapshot(source.store, w.tenant)
    for order in (steps, list(reversed(steps)), w.ordered()):
        again = await admit_all(replica, w.tenant, order, source.store)
        assert all(o.status == "admitted" and o.applied == () for o in again.outcomes.values())
        assert snapshot(replica.store, w.tenant) == after_first
        assert log_appends(replica.store, w.tenant) == appends
    # one message at a time, straight to the engine: Duplicate or Superseded, never Applied
    kinds = {replica.apply_replicated_message(w.tenant, s.message, s.data).kind for s in steps}
    assert kinds <= {"Duplicate", "Superseded"}
    assert log_appends(replica.store, w.tenant) == appends


class Interleaving:
    """A local applier and fetcher that yield to other tasks around every call."""

    def __init__(self, replica: Dwn, source: Store, trace: list[int], index: int) -> None:
        self.applier = LocalApplier(replica)
        self.fetcher = LocalStoreFetcher(source)
        self.results: list[tuple[str, str]] = []
        self.trace, self.index = trace, index

    async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
        await trio.lowlevel.checkpoint()
        result = await self.applier.apply(tenant, entry)
        self.results.append((entry.cid, result.kind))
        self.trace.append(self.index)
        await trio.lowlevel.checkpoint()
        return result

    async def fetch(self, tenant: str, refs: Sequence[DependencyRef]) -> list[list[ReplicationEntry]]:
        await trio.lowlevel.checkpoint()
        return await self.fetcher.fetch(tenant, refs)


async def test_two_sources_at_once(tmp_path: Path) -> None:
    tenant, steps = _scenario_steps()
    sources = []
    for name in ("a", "b"):
        source = Dwn(Store(tmp_path / f"source-{name}.db"))
        process_all(source, tenant, steps)
        sources.append(source)
    expected = snapshot(sources[0].store, tenant)
    for seed in (3, 11, 19):
        replica = Dwn(Store(tmp_path / f"replica-{seed}.db"))
        trace: list[int] = []
        streams = [Interleaving(replica, s.store, trace, i) for i, s in enumerate(sources)]
        outcomes: list[list[ClosureOutcome]] = [[], []]

        async def pull(stream: Interleaving, out: list[ClosureOutcome], order: list[Step]) -> None:
            for step in order:
                out.append(await ClosureAdmitter(tenant, step.entry).admit(stream, stream))

        orders = [list(steps), list(steps)]
        random.Random(seed).shuffle(orders[0])
        random.Random(seed + 1000).shuffle(orders[1])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pull, streams[0], outcomes[0], orders[0])
            nursery.start_soon(pull, streams[1], outcomes[1], orders[1])

        switches = sum(1 for a, b in zip(trace, trace[1:], strict=False) if a != b)
        assert switches > len(steps) // 2  # the two streams really ran interleaved
        applied = [cid for s in streams for cid, kind in s.results if kind == "Applied"]
        assert len(applied) == len(set(applied)), "a message was applied twice"
        assert len(applied) == log_appends(replica.store, tenant)  # one log entry per Applied
        got = snapshot(replica.store, tenant)
        assert_log_matches_messages(got, replica.store, tenant)
        assert all(o.status == "admitted" for run in outcomes for o in run)
        assert got == expected
        # and once more from either source: nothing new
        appends = log_appends(replica.store, tenant)
        await admit_all(replica, tenant, steps, sources[1].store)
        assert log_appends(replica.store, tenant) == appends
        assert snapshot(replica.store, tenant) == got
