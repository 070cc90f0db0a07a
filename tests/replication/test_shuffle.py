"""The interop scenarios' accepted messages, admitted in random orders, converge.

A source store processes a scenario's accepted messages in their authored order. For each of
200 seeds, a fresh replica admits the same messages (with their data) in a shuffled order
through the closure loop, fetching what is missing from the source, then retries what was
deferred, as a later sync would, until a round changes nothing. The replica must then hold
exactly what the source holds: the same messages (bodies and indexes), the same data, one
event-log entry per stored message.

Some outcomes are order-dependent under 0.5.2's semantics (a message is judged against the
current state of what it depends on). ``docs/replication-apply.md`` lists them; ``DOCUMENTED``
below names the messages they concern in these scenarios and the only ways their closures may
end other than admitted. Where one of them is not admitted, its record may differ from the
source's only by missing messages; every other record must be identical.

Which scenarios: those whose accepted messages depend on each other (protocols, roles,
ancestry, grants, delegated grants, revocations, updates, deletes, prunes, data-less updates,
large data). Scenarios that accept one or two independent messages and otherwise test
queries, refusals or parsing add nothing to ordering and would only cost time; three with
dependent messages (protocols-anyone-read-and-published, records-delete,
p2psync-authored-grants) repeat cases the chosen ones have (a parent deleted later, deletes
before their records, grants) and are left out to keep the test near 30 s.
"""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict
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

SHUFFLED = (
    "protocols-roles",
    "protocols-actions-who",
    "protocols-reconfigure",
    "protocols-delete-and-prune",
    "permissions-grant-records-write",
    "permissions-delegated-grants",
    "permissions-revocation",
    "permissions-requests-and-grant-records",
    "permissions-protocols-grants",
    "records-updates",
    "records-publish-toggle",
    "records-large-data-updates",
    "p2psync-authored-protocols",
)

PARENT_GONE = ("failed", "ProtocolAuthorizationIncorrectProtocolPath")
ROLE_TAKEN = ("failed", "ProtocolAuthorizationDuplicateRoleRecipient")
PRUNED = ("deferred", "unresolved")

# scenario -> step note -> how its closure may end when it is not admitted: (status, what the
# outcome's detail says after the root CID starts with). See docs/replication-apply.md.
DOCUMENTED: dict[str, dict[str, set[tuple[str, str]]]] = {
    # a child written before its parent's delete: once the delete is here, the parent is no
    # longer live and 0.5.2 takes no children under it
    "protocols-actions-who": {
        "bob replies (author of thread: create)": {PARENT_GONE},
        "carol replies (recipient of thread: create)": {PARENT_GONE},
        "carol votes under her own reply (author of thread/reply)": {PARENT_GONE},
        "carol deletes her vote (delete)": {PARENT_GONE},
        "bob co-deletes carol's reply (author of thread: co-delete)": {PARENT_GONE},
    },
    "protocols-roles": {
        "dave in carol's thread too: another context, fine": {PARENT_GONE},
        # a role record for someone whose previous role record was deleted: before that
        # delete is here, the recipient still holds the role
        "a new friend record for bob (the old one is deleted)": {ROLE_TAKEN},
        "bob becomes a friend": {ROLE_TAKEN},
        "updating bob's own role record is fine": {ROLE_TAKEN},
        "alice removes bob's friend role": {ROLE_TAKEN},
    },
    # written under v1 of the protocol; once v2 is installed, v2's rules judge it
    "protocols-reconfigure": {
        "bob comments under v1 (anyone may)": {("failed", "ProtocolAuthorizationActionNotAllowed")}
    },
    # a write under a grant whose record was deleted afterwards
    "permissions-requests-and-grant-records": {"bob uses the grant": {("failed", "GrantAuthorizationGrantMissing")}},
    # records the source has since pruned: their children find no live parent, their messages
    # no dependency to fetch; the prune leaves nothing of them on either side
    "protocols-delete-and-prune": {
        "bob comments": {PARENT_GONE},
        "alice comments": {PARENT_GONE},
        "bob reacts with a large reaction": {PRUNED, PARENT_GONE},
        "tenant deletes comment 1 without prune": {PRUNED, ("failed", "Not Found")},
        "pruning the already deleted comment": {PRUNED},
    },
}


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
    for name in SHUFFLED:
        scenario = load_scenario(SCENARIO_DIR / f"{name}.json")
        accepted = [
            s for s in scenario.steps if s.op == "process" and s.expect is not None and s.expect.code in (202, 204)
        ]
        source = Dwn(Store(tmp_path_factory.mktemp(name) / "source.db"))
        for s in accepted:
            assert source.process_message(s.tenant or "", s.message, s.data).code == s.expect.code  # type: ignore[union-attr]
        tenants = [s.tenant or "" for s in accepted]
        steps = [Step(s.note or f"step {s.index}", s.message, s.data) for s in accepted]
        queries = [(s.tenant or "", s.message) for s in scenario.steps if s.op == "query"]
        expected = {t: snapshot(source.store, t) for t in set(tenants)}
        out.append(Case(name, steps, tenants, queries, source, expected))
    return out


def _allowed(documented: set[tuple[str, str]], status: str, detail: str | None) -> bool:
    text = (detail or "").split(": ", 1)[-1]  # the detail starts with the CID it is about
    return any(status == want and text.startswith(prefix) for want, prefix in documented)


def _compare(case: Case, replica: Dwn, run: Run, seed: int) -> set[str]:
    """Checks one seed; returns the documented notes that were not admitted in it."""
    documented = DOCUMENTED.get(case.name, {})
    not_admitted: set[str] = set()
    touched: set[str] = set()
    for step in case.steps:
        outcome = run.outcomes[step.cid]
        if outcome.status == "admitted":
            continue
        allowed = _allowed(documented.get(step.name, set()), outcome.status, outcome.detail)
        assert allowed, (case.name, seed, step.name, outcome)
        not_admitted.add(step.name)
        touched.add(key_of(step.message))
    for tenant, want in case.expected.items():
        got = snapshot(replica.store, tenant)
        assert_log_matches_messages(got)
        want_keys, got_keys = _by_key(want), _by_key(got)
        for key in set(want_keys) | set(got_keys):
            if key in touched:
                # only missing messages: nothing the source does not have
                assert set(got_keys.get(key, {})) <= set(want_keys.get(key, {})), (case.name, seed, key)
            else:
                assert got_keys.get(key) == want_keys.get(key), (case.name, seed, key)
        touched_records = {k.removeprefix("record:") for k in touched}
        assert {d for d in got.data if d[0] not in touched_records} == {
            d for d in want.data if d[0] not in touched_records
        }
    return not_admitted


def _by_key(snap: Snapshot) -> dict[str, dict[str, tuple[str, str]]]:
    out: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for cid, row in snap.messages.items():
        out[key_of(json.loads(row[0]))][cid] = row
    return out


def _query_answers(dwn: Dwn, queries: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, list[str]]]:
    answers = []
    for tenant, message in queries:
        reply = dwn.process_message(tenant, message)
        cids = [
            message_cid({k: v for k, v in e.items() if k not in ("encodedData", "initialWrite")})
            for e in reply.entries or []
        ]
        answers.append((reply.code, cids))
    return answers


@pytest.mark.slow
async def test_shuffled_admission_converges(cases: list[Case]) -> None:
    missed: dict[tuple[str, str], int] = defaultdict(int)
    queries_compared = 0
    for seed in SEEDS:
        for case in cases:
            order = list(range(len(case.steps)))
            random.Random(f"{seed}:{case.name}").shuffle(order)
            replica = Dwn(Store(":memory:"))
            run = await admit_all(
                replica, [case.tenants[i] for i in order], [case.steps[i] for i in order], case.source.store
            )
            for note in _compare(case, replica, run, seed):
                missed[(case.name, note)] += 1
            if seed < 3 and not any(o.status != "admitted" for o in run.outcomes.values()):
                # identical stores answer every query of the scenario identically
                assert _query_answers(replica, case.queries) == _query_answers(case.source, case.queries)
                queries_compared += len(case.queries)
            replica.close()
    assert queries_compared > 0
    if len(SEEDS) < 200:
        return  # a quick run (SHUFFLE_SEEDS) need not meet every case both ways
    # every documented case really depends on the order: seen both ways over the seeds
    for name, notes in DOCUMENTED.items():
        for note in notes:
            assert 0 < missed[(name, note)] < len(SEEDS), (name, note, missed[(name, note)])
