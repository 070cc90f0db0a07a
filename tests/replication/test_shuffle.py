"""Every interop scenario's accepted messages, admitted in random orders, reach one state.

A source store processes a scenario's accepted messages in their authored order (the
reference's answers, checked). For each of 200 seeds, a fresh replica admits the same messages
(with their data) in a shuffled order through the closure loop, fetching what is missing from
the source, then retries what was deferred, as a later sync would, until a round changes
nothing. The convergence contract (docs/replication-apply.md) says the replica then holds
exactly the canonical state of the set: the same messages (bodies and indexes), the same
data, one event-log entry per stored message, and the same answer to every query of the
scenario. No message the reference accepted may end anything but admitted.

Scenarios with fewer than two accepted messages have no order to vary and are left out.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from p2psync.conformance import load_scenario
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import Store
from tests.replication.support import Run, Snapshot, Step, admit_all, assert_log_matches_messages, key_of, snapshot

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "interop" / "scenarios"
# At least 200 orders per scenario (the bar); SHUFFLE_SEEDS lowers it for a quick local run.
SEEDS = range(int(os.environ.get("SHUFFLE_SEEDS", "200")))

@dataclass
class Case:
    name: str
    steps: list[Step]
    tenants: list[str]
    queries: list[tuple[str, dict[str, Any]]]
    source: Dwn
    expected: dict[str, Snapshot]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    out = []
    for path in sorted(SCENARIO_DIR.glob("*.json")):
        name = path.stem
        scenario = load_scenario(path)
        accepted = [
            s for s in scenario.steps if s.op == "process" and s.expect is not None and s.expect.code in (202, 204)
        ]
        if len(accepted) < 2:
            continue
        source = Dwn(Store(tmp_path_factory.mktemp(name) / "source.db"))
        for s in accepted:
            assert source.process_message(s.tenant or "", s.message, s.data).code == s.expect.code  # type: ignore[union-attr]
        tenants = [s.tenant or "" for s in accepted]
        steps = [Step(s.note or f"step {s.index}", s.message, s.data) for s in accepted]
        queries = [(s.tenant or "", s.message) for s in scenario.steps if s.op == "query"]
        expected = {t: snapshot(source.store, t) for t in set(tenants)}
        out.append(Case(name, steps, tenants, queries, source, expected))
    return out


def _compare(case: Case, replica: Dwn, run: Run, seed: int) -> None:
    """One seed: every root admitted, every tenant's store identical to the source's."""
    for step in case.steps:
        outcome = run.outcomes[step.cid]
        assert outcome.status == "admitted", (case.name, seed, step.name, outcome)
    for tenant, want in case.expected.items():
        got = snapshot(replica.store, tenant)
        assert_log_matches_messages(got, replica.store, tenant)
        assert got.messages == want.messages, (case.name, seed, _differences(want, got))
        assert got.data == want.data, (case.name, seed)
        assert got.replaced == want.replaced, (case.name, seed)  # replaced definitions travel too


def _differences(want: Snapshot, got: Snapshot) -> dict[str, list[str]]:
    """The differing records, named for a failure message."""
    def keys(snap: Snapshot, cids: set[str]) -> list[str]:
        return sorted({key_of(json.loads(snap.messages[c][0])) for c in cids})

    missing, extra = set(want.messages) - set(got.messages), set(got.messages) - set(want.messages)
    changed = {c for c in set(want.messages) & set(got.messages) if want.messages[c] != got.messages[c]}
    return {"missing": keys(want, missing), "extra": keys(got, extra), "changed": keys(got, changed)}


_NOT_SENT = ("encodedData", "initialWrite")


def _query_answers(dwn: Dwn, queries: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, list[str]]]:
    """Each query's code and entries. A MessagesQuery lists the event log, whose order is
    each replica's own (the order it stored things in), so its entries compare as a set."""
    answers = []
    for tenant, message in queries:
        reply = dwn.process_message(tenant, message)
        cids = [
            e if isinstance(e, str) else message_cid({k: v for k, v in e.items() if k not in _NOT_SENT})
            for e in reply.entries or []
        ]
        if message["descriptor"]["interface"] == "Messages":
            cids.sort()
        answers.append((reply.code, cids))
    return answers


@pytest.mark.slow
async def test_shuffled_admission_converges(cases: list[Case]) -> None:
    assert len(cases) >= 20  # every scenario with something to order
    for case in cases:
        want_answers = _query_answers(case.source, case.queries)
        for seed in SEEDS:
            order = list(range(len(case.steps)))
            random.Random(f"{seed}:{case.name}").shuffle(order)
            replica = Dwn(Store(":memory:"))
            run = await admit_all(
                replica, [case.tenants[i] for i in order], [case.steps[i] for i in order], case.source.store
            )
            _compare(case, replica, run, seed)
            assert replica.history.fallbacks == 0, (case.name, seed)  # the footprints missed nothing
            # identical stores answer every query of the scenario identically
            assert _query_answers(replica, case.queries) == want_answers, (case.name, seed)
            replica.close()
