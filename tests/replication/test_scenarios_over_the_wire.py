"""Every interop scenario's accepted messages, pulled over the replication protocol, in `revs`
batches and in single `rev`s alike (issue #17: the batched path and its fallback).

A source store holds a scenario's accepted messages (the reference's answers, checked). A fresh
replica pulls each tenant of the scenario from it through two ReplicationProtocol objects
pumped against each other (tests/replication/test_protocol_pump.py's driver: real SQLite
stores, the group committer, no sockets), deliveries in a seeded random order. Whichever path
the hellos negotiate, the replica must end holding exactly what the source holds (bodies,
indexes, data, one log entry per message) and answer every query of the scenario the same, and
the sink must have been sent the path asked for: `revs` requests when both sides offer it
(a message whose data is too big to travel inline still comes by `rev`), none when one does not.

The scenarios' tenants signed with keys the files do not hold, so the replica cannot prove it is
the tenant in hello; the source's read authorization (§5) is told to take the authenticated peer
for the tenant, and decides from there as for an owner. Authorization itself is tested in
tests/replication/test_authz.py and tests/peer.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import Store, copy_store_files
from p2psync.replication.hello import new_hello
from p2psync.replication.protocol import ReplicationProtocol
from p2psync.replication.scope import SyncScope
from p2psync.state.authz import ReadAuthorizer, ReaderDecision
from p2psync.state.committer import GroupCommitter
from p2psync.state.copies import CheckpointCopies, store_id
from p2psync.state.ledger import Ledger
from p2psync.state.service import StoreService
from tests.replication.support import assert_log_matches_messages, scenario_sources, snapshot
from tests.replication.test_protocol_pump import ALICE, Side, Wire, run
from tests.replication.test_shuffle import SCENARIO_DIR, _differences, _query_answers

#: Who offers the batched `revs` profile (§8.4) in hello: both, or only one side (the other
#: answers and sends single `rev`s, the fallback).
PATHS = {"revs": (("revs",), ("revs",)), "rev-source-without": ((), ("revs",)), "rev-sink-without": (("revs",), ())}


@dataclass
class Scenario:
    name: str
    path: Path  # the source store, built once and copied for each run
    tenants: list[str]
    queries: list[tuple[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> list[Scenario]:
    out = []
    for name, path, scenario, accepted in scenario_sources(SCENARIO_DIR, tmp_path_factory.mktemp):
        tenants = sorted({s.tenant or "" for s in accepted})
        queries = [(s.tenant or "", s.message) for s in scenario.steps if s.op == "query"]
        out.append(Scenario(name, path, tenants, queries))
    return out


_READER = ReadAuthorizer.reader


def _as_owner(self: ReadAuthorizer, tenant: str, _reader: str, scope: SyncScope) -> ReaderDecision:
    """The reader's decision as if the owner read: the scenarios' pulls read as the tenant.
    Wraps the method as imported, not whatever is patched in now: hypothesis shares one
    monkeypatch between its examples, and each would wrap the last."""
    return _READER(self, tenant, tenant, scope)


def _side(path: Path, name: str, *, active: bool, capabilities: tuple[str, ...]) -> Side:
    store = Store(path)
    service = StoreService(store, dwn=Dwn(store), ledger=Ledger.for_store(store), copies=CheckpointCopies(store),
                           committer=GroupCommitter(store))
    mine = new_hello(ALICE.did, store_id(store), "scenarios", capabilities=capabilities)
    return Side(name, store, service, ReplicationProtocol(identity=ALICE, mine=mine, active=active))


def _pull_everything(
    scenario: Scenario, tmp_path: Path, path_name: str, seed: int
) -> tuple[Side, Side, dict[str, int]]:
    offers_source, offers_sink = PATHS[path_name]
    copy = tmp_path / "source.db"
    copy_store_files(scenario.path, copy)  # closed, so its WAL is checkpointed into the file
    source = _side(copy, "source", active=False, capabilities=offers_source)
    replica = _side(tmp_path / "replica.db", "replica", active=True, capabilities=offers_sink)
    wire = Wire(source, replica, random.Random(f"{seed}:{scenario.name}"))
    requests: dict[str, int] = {}
    receive = replica.proto.receive_request

    def counted(rid: int, profile: str, *args: Any) -> None:
        requests[profile] = requests.get(profile, 0) + 1
        receive(rid, profile, *args)

    replica.proto.receive_request = counted  # type: ignore[method-assign,assignment]
    source.proto.start_hello()
    run(wire, replica.proto.start_hello())
    for tenant in scenario.tenants:
        totals: dict[str, Any] = {}
        # A small batch, so a scenario's messages span several `revs` and several listings.
        operation, _ = replica.proto.sync(tenant=tenant, scope=SyncScope.global_scope(),
                                          local_store_id=store_id(replica.store), pull=True, push=False, batch=3,
                                          totals=totals)
        run(wire, operation)
    assert wire.closed == []
    return source, replica, requests


@pytest.mark.parametrize("path_name", list(PATHS))
def test_every_scenario_replicates_exactly_by_either_path(scenarios: list[Scenario], tmp_path: Path,
                                                          path_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ReadAuthorizer, "reader", _as_owner)
    assert len(scenarios) >= 25  # every scenario that stores something
    batched = in_runs = 0
    for number, scenario in enumerate(scenarios):
        where = tmp_path / scenario.name
        where.mkdir()
        source, replica, requests = _pull_everything(scenario, where, path_name, seed=number)
        assert requests.get("rev", 0) + requests.get("revs", 0) > 0, scenario.name  # something moved
        history = replica.service.dwn.history
        assert history.run_aborts == 0, scenario.name
        if path_name == "revs":
            batched += requests.get("revs", 0)  # (data too big to go inline still goes by `rev`)
            in_runs += history.run_applied  # a `revs`'s new records in log order: applied in runs
        else:
            assert requests.get("revs", 0) == 0, (scenario.name, requests)
            assert history.run_applied == 0, scenario.name  # a `rev` is one message: never a run
        for tenant in scenario.tenants:
            want, got = snapshot(source.store, tenant), snapshot(replica.store, tenant)
            assert_log_matches_messages(got, replica.store, tenant)
            # The same text: an authored message is stored in the wire's (DAG-CBOR) key order.
            assert got.messages == want.messages, (scenario.name, path_name, _differences(want, got))
            assert got.data == want.data, (scenario.name, path_name)
        answers = _query_answers(Dwn(replica.store), scenario.queries)
        assert answers == _query_answers(Dwn(source.store), scenario.queries), (scenario.name, path_name)
        for side in (source, replica):
            side.store.close()
    if path_name == "revs":
        assert batched >= len(scenarios)
        assert in_runs >= 50, in_runs  # the batched path took runs, and they replicated exactly


@settings(max_examples=int(os.environ.get("WIRE_EXAMPLES", "80")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_head_start_batch_and_delivery_order_ends_identical(
    scenarios: list[Scenario], tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    data: st.DataObject,
) -> None:
    """A property over both paths: whatever the replica already held (any subset of the
    source's messages, admitted beforehand in any order, some without their data), the listing batch, the path the
    hellos negotiate and the delivery order, one pull leaves it holding what the source holds."""
    monkeypatch.setattr(ReadAuthorizer, "reader", _as_owner)
    scenario = data.draw(st.sampled_from(scenarios), label="scenario")
    path_name = data.draw(st.sampled_from(list(PATHS)), label="path")
    batch = data.draw(st.integers(1, 8), label="batch")
    seed = data.draw(st.integers(0, 2**16), label="delivery seed")
    where = tmp_path_factory.mktemp("property")
    copy = where / "source.db"
    copy_store_files(scenario.path, copy)
    held = Store(copy)
    everything = [(t, json.loads(body), held.read_data(data_)) for t in scenario.tenants
                  for body, data_ in held.conn.execute(
                      "SELECT a.body, a.data FROM archive a JOIN tenants t ON t.id = a.tenant WHERE t.did=?", (t,))]
    held.close()
    head_start = data.draw(st.lists(st.sampled_from(everything), unique_by=lambda m: json.dumps(m[1], sort_keys=True),
                                    max_size=len(everything)) if everything else st.just([]), label="head start")
    # Some it got without their data, a 0-byte record's too, as a source that had dropped it
    # sends them (a large record's archive row names its data row rather than holding the
    # bytes: read as None too).
    without = data.draw(st.lists(st.booleans(), min_size=len(head_start), max_size=len(head_start)),
                        label="without data")
    replica_dwn = Dwn(Store(where / "replica.db"))
    for (tenant, message, data_), dropped in zip(head_start, without, strict=True):
        replica_dwn.apply_replicated_message(tenant, message, None if data_ is None or dropped else bytes(data_))
    replica_dwn.close()

    offers_source, offers_sink = PATHS[path_name]
    source = _side(copy, "source", active=False, capabilities=offers_source)
    replica = _side(where / "replica.db", "replica", active=True, capabilities=offers_sink)
    wire = Wire(source, replica, random.Random(seed))
    source.proto.start_hello()
    run(wire, replica.proto.start_hello())
    for tenant in scenario.tenants:
        operation, _ = replica.proto.sync(tenant=tenant, scope=SyncScope.global_scope(),
                                          local_store_id=store_id(replica.store), pull=True, push=False, batch=batch)
        run(wire, operation)
    for tenant in scenario.tenants:
        want, got = snapshot(source.store, tenant), snapshot(replica.store, tenant)
        assert_log_matches_messages(got, replica.store, tenant)
        assert got.messages == want.messages, (scenario.name, path_name, _differences(want, got))
        assert got.data == want.data
    for side in (source, replica):
        side.store.close()
