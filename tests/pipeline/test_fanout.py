"""Fan-out planning on engine-made stores, checked against a plain-Python reading of the RFC.

The relay assignment below is written from the RFC's text independently of
p2psync.pipeline.fanout (Python's hmac module, math.log2, explicit lists), so the Spark job
is checked against a second implementation rather than against itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records_write import RecordsWrite
from p2psync.pipeline.errors import PipelineError
from p2psync.pipeline.fanout import fanout, fanout_frames, hmac_key_pads, load_endpoints, path_rules, relay_k
from p2psync.pipeline.formats import read_exports
from p2psync.pipeline.reconcile import load_messages
from tests.pipeline.worlds import FANOUT_PROTOCOL, Story, build_replica, chat_definition_with_reads
from tests.replication.support import Clock, Step, seeded

ORIGIN = "https://origin.example"
PROVIDERS = 20
PROGRESS = False  # stage lines on stderr (for timing runs)
BIG_THREAD = 24  # participants of thread B, on PROVIDERS providers (some share one), one at the origin
SMALL_THREAD = 3


def provider(i: int) -> str:
    return f"https://prov-{i:02d}.example"


def _independent_relay(endpoints: set[str], context_id: str, message_cid: str, origin: str) -> dict[str, Any]:
    """RFC part 2, Strategy 2, from its text: score, top-k coordinators, dealing, overlap.

    Decisions the RFC leaves open, as docs/pipeline.md records them: the remaining providers
    are dealt in score order, one each to the coordinators in score order, and the origin
    (which already holds the message) is not dealt; "adjacent" is the next coordinator.
    """
    scored = sorted(
        endpoints,
        key=lambda e: (-int.from_bytes(
            hmac.new(e.encode(), (context_id + message_cid).encode(), hashlib.sha256).digest(), "big"
        ), e),
    )
    p = len(scored)
    k = min(p, max(2, min(5, math.ceil(math.log2(p))))) if p > 1 else 0
    coordinators = scored[:k]
    rest = [e for e in scored[k:] if e != origin]
    lists: dict[str, list[str]] = {c: [] for c in coordinators}
    for n, e in enumerate(rest):  # dealt in score order, one each in coordinator order
        lists[coordinators[n % k]].append(e)
    overlap: dict[str, str] = {}
    for i, c in enumerate(coordinators):
        neighbour = coordinators[(i + 1) % k]
        if neighbour != c and lists[neighbour]:
            overlap[c] = lists[neighbour][0]
    return {"order": scored, "k": k, "coordinators": coordinators, "lists": lists, "overlap": overlap}


def _hops(relay: dict[str, Any], origin: str) -> set[tuple[str, str, int, str]]:
    """(sender, receiver, hop, kind) of every cross-network relay delivery."""
    out: set[tuple[str, str, int, str]] = set()
    for c in relay["coordinators"]:
        if c != origin:
            out.add((origin, c, 1, "coordinator"))
        hop = 1 if c == origin else 2
        for t in relay["lists"][c]:
            out.add((c, t, hop, "relay"))
        if c in relay["overlap"]:
            out.add((c, relay["overlap"][c], hop, "overlap"))
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fanout")
    alice, bob, dave = seeded("alice"), seeded("bob", "jwk"), seeded("dave")
    people = [seeded(f"p{i}") for i in range(BIG_THREAD)]
    ghost = seeded("ghost")  # a participant whose DWN endpoint nobody knows
    clock = Clock()
    story = Story()

    def add(name: str, message: dict[str, Any], data: bytes | None = None) -> None:
        story.add(alice.did, Step(name, message, data))

    def write(name: str, signer: Any, path: str, **kw: Any) -> RecordsWrite:
        now = clock.tick()
        w = RecordsWrite.create(signer=signer, data=name.encode(), protocol=FANOUT_PROTOCOL, protocol_path=path,
                                message_timestamp=now, date_created=now, **kw)
        add(name, w.message, name.encode())
        return w

    add("protocol", ProtocolsConfigure.create(definition=chat_definition_with_reads(), signer=alice,
                                              message_timestamp=clock.tick()).message)
    small = write("thread-a", bob, "thread", recipient=dave.did).message["contextId"]
    big = write("thread-b", bob, "thread").message["contextId"]
    for i in range(SMALL_THREAD):
        write(f"a-role-{i}", bob, "thread/participant", recipient=people[i].did, parent_context_id=small)
    for i, who in enumerate([*people, ghost]):
        write(f"b-role-{i}", bob, "thread/participant", recipient=who.did, parent_context_id=big)
    write("a-chat", people[0], "thread/chat", parent_context_id=small, protocol_role="thread/participant")
    for n in range(3):
        write(f"b-chat-{n}", people[1], "thread/chat", parent_context_id=big, protocol_role="thread/participant")

    endpoints: dict[str, Any] = {alice.did: ORIGIN, bob.did: provider(0), dave.did: [provider(7), provider(8)]}
    for i, who in enumerate(people):
        endpoints[who.did] = ORIGIN if i == BIG_THREAD - 1 else provider(i % PROVIDERS)
    (root / "endpoints.json").write_text(json.dumps(endpoints))

    build_replica(root / "r1.db", story, story.steps).close()
    build_replica(root / "r2.db", story, [n for n in story.steps if not n.startswith("b-")]).close()
    from p2psync.pipeline.export import export_store

    exports = [root / "r1-export", root / "r2-export"]
    export_store(root / "r1.db", exports[0], replica_id="r1")
    export_store(root / "r2.db", exports[1], replica_id="r2")
    report = fanout(spark, exports, root / "endpoints.json", root / "out", progress=PROGRESS)
    read = {name: pq.read_table(str(root / "out" / name)).to_pylist()
            for name in ("targets", "assignment", "manifests", "costs")}
    did_endpoint = {d: (v[0] if isinstance(v, list) else v) for d, v in endpoints.items()}
    return {"root": root, "story": story, "report": report, "out": root / "out", "exports": exports,
            "people": people, "dave": dave, "ghost": ghost, "alice": alice, "endpoints": did_endpoint, **read}


def _by_message(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        grouped[r["message_cid"]].append(r)
    return grouped


def test_delivery_targets_follow_the_protocol_rules(world: dict[str, Any]) -> None:
    story: Story = world["story"]
    people, dave, ghost = world["people"], world["dave"], world["ghost"]
    targets = _by_message(world["targets"])
    a_chat = {r["did"]: r["via"] for r in targets[story.cid("a-chat")]}
    assert a_chat == {
        **{p.did: ["role:thread/participant"] for p in people[:SMALL_THREAD]},
        dave.did: ["recipient:thread"],
    }
    for n in range(3):
        got = {r["did"] for r in targets[story.cid(f"b-chat-{n}")]}
        assert got == {p.did for p in people} | {ghost.did}
    # a role record is delivered to its recipient; the thread to its recipient; the open
    # thread B (no recipient, nobody may read threads by rule) to nobody
    assert {r["did"] for r in targets[story.cid("a-role-1")]} == {people[1].did}
    assert {r["did"] for r in targets[story.cid("thread-a")]} == {dave.did}
    assert story.cid("thread-b") not in targets
    unresolved = {r["did"] for r in world["targets"] if r["endpoint"] is None}
    assert unresolved == {ghost.did}
    assert world["report"]["unresolvedDids"] == [ghost.did]


def test_direct_manifests_group_targets_by_provider(world: dict[str, Any]) -> None:
    story: Story = world["story"]
    endpoints = world["endpoints"]
    manifests = _by_message([m for m in world["manifests"] if m["strategy"] == "direct"])
    for name in ("a-chat", "b-chat-0", "b-chat-2"):
        cid = story.cid(name)
        expected: dict[str, set[str]] = defaultdict(set)
        for t in world["targets"]:
            if t["message_cid"] == cid and t["endpoint"] is not None:
                expected[endpoints[t["did"]]].add(t["did"])
        got = {m["receiver"]: set(m["tenants"]) for m in manifests[cid]}
        assert got == expected
        for m in manifests[cid]:
            assert m["sender"] == ORIGIN
            assert (m["hop"], m["kind"]) == ((0, "local") if m["receiver"] == ORIGIN else (1, "direct"))
    # the big thread's co-located participant is processed locally at the origin
    local = [m for m in manifests[story.cid("b-chat-0")] if m["kind"] == "local"]
    assert [m["tenants"] for m in local] == [[world["people"][-1].did]]


def test_relay_assignment_equals_an_independent_computation(world: dict[str, Any]) -> None:
    story: Story = world["story"]
    assignment = _by_message(world["assignment"])
    relay_manifests = _by_message([m for m in world["manifests"] if m["strategy"] == "relay"])
    costs = {(c["message_cid"], c["strategy"]): c for c in world["costs"]}
    checked = 0
    for cid, rows in assignment.items():
        rows.sort(key=lambda r: r["rank"])
        context_id = rows[0]["context_id"]
        expected = _independent_relay({r["endpoint"] for r in rows}, context_id, cid, ORIGIN)
        assert [r["endpoint"] for r in rows] == expected["order"]
        assert {r["k"] for r in rows} == {expected["k"]}
        for r in rows:
            if r["endpoint"] in expected["coordinators"]:
                assert r["role"] == "coordinator" and r["coordinator"] == r["endpoint"]
                assert list(r["forward_to"]) == expected["lists"][r["endpoint"]]
                assert r["overlap_to"] == expected["overlap"].get(r["endpoint"])
            elif r["endpoint"] == ORIGIN:  # not a coordinator: it has the message already
                assert (r["role"], r["coordinator"], r["overlap_from"]) == ("origin", None, None)
            else:
                assert r["role"] == "target"
                assert r["endpoint"] in expected["lists"][r["coordinator"]]
        overlap_from = {r["endpoint"]: r["overlap_from"] for r in rows if r["overlap_from"] is not None}
        assert overlap_from == {t: c for c, t in expected["overlap"].items()}
        hops = {(m["sender"], m["receiver"], m["hop"], m["kind"]) for m in relay_manifests[cid] if m["kind"] != "local"}
        assert hops == _hops(expected, ORIGIN)
        p = len(rows)
        relay_cost, direct_cost = costs[(cid, "relay")], costs[(cid, "direct")]
        assert direct_cost["origin_load"] == direct_cost["cross_network"] == p - 1
        assert relay_cost["cross_network"] == p - 1 + len(expected["overlap"])
        assert relay_cost["origin_load"] == sum(1 for h in hops if h[0] == ORIGIN)
        assert relay_cost["max_hops"] <= 2
        checked += 1
    assert checked == len(world["costs"]) // 3
    # the big thread really exercises k = 5 and the overlap rule
    big = assignment[story.cid("b-chat-1")]
    assert len(big) > 16 and big[0]["k"] == 5
    assert sum(r["overlap_from"] is not None for r in big) == 5


def test_relay_assignment_is_deterministic(world: dict[str, Any], spark: SparkSession) -> None:
    """Another run, on the exports in the other order and split differently, assigns the same."""
    infos = read_exports(list(reversed(world["exports"])))
    rules = path_rules(world["alice"].did, chat_definition_with_reads())
    rows = load_messages(spark, infos).repartition(3)
    endpoints = load_endpoints(world["root"] / "endpoints.json")
    again = fanout_frames(spark, rows, rules, endpoints).assignment.select(
        "message_cid", "endpoint", "rank", "role", "coordinator", "overlap_from", "score"
    ).collect()
    first = {(r["message_cid"], r["endpoint"]): (r["rank"], r["role"], r["coordinator"], r["overlap_from"], r["score"])
             for r in world["assignment"]}
    assert {(r["message_cid"], r["endpoint"]): (r["rank"], r["role"], r["coordinator"], r["overlap_from"], r["score"])
            for r in again} == first


def test_cost_report_and_plot(world: dict[str, Any]) -> None:
    report = world["report"]
    story: Story = world["story"]
    assert set(report["strategies"]) == {"direct", "relay", "subscribe"}
    n = report["messages"]
    assert n == len(world["costs"]) // 3
    # every protocol write is planned (thread B and the ghost's role have only the origin: P = 1)
    assert n == len([s for s in story.steps if s != "protocol"])
    assert report["recommended"] == {"direct": n - 3, "relay": 3}  # the big thread's chats
    direct, relay = report["strategies"]["direct"], report["strategies"]["relay"]
    assert relay["originLoad"]["max"] < direct["originLoad"]["max"]
    assert direct["maxHops"] == 1 and relay["maxHops"] == 2
    assert [e["providers"] for e in report["byProviders"]] == sorted(e["providers"] for e in report["byProviders"])
    png = (world["out"] / "origin_load.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5_000


def test_hmac_pads_and_k() -> None:
    for endpoint in ("https://a.example", "x" * 100):
        ipad, opad = hmac_key_pads(endpoint)
        inner = hashlib.sha256(ipad + b"ctxcid").digest()
        assert hashlib.sha256(opad + inner).digest() == hmac.new(endpoint.encode(), b"ctxcid", hashlib.sha256).digest()
    assert [relay_k(p) for p in (0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 1000)] == [0, 0, 2, 2, 2, 3, 3, 4, 4, 5, 5]


def test_endpoint_map_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not-a-did": "https://x"}))
    with pytest.raises(PipelineError) as err:
        load_endpoints(bad)
    assert err.value.code == "EndpointMapInvalid"
    with pytest.raises(PipelineError) as err:
        load_endpoints(tmp_path / "none.json")
    assert err.value.code == "EndpointMapNotFound"
