"""Reconcile four replicas built by the engine from known subsets of one story."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from p2psync.pipeline.errors import PipelineError
from p2psync.pipeline.reconcile import read_plan_summary, read_repair_items, reconcile
from tests.pipeline.worlds import NOTES, REPLICA_SUBSETS, Story, build_and_export, held, reconcile_story

# What each replica must be told to pull, by step name (worked out by hand from the subsets;
# see REPLICA_SUBSETS). note-update is pruned wherever note-delete was applied, so r1 and r2
# do not need it (they hold the delete); r3 holds neither, so it is told to pull both.
EXPECTED_MISSING: dict[str, set[str]] = {
    "r1": set(),
    "r2": {"chat", "reaction", "b4"},
    "r3": {"note-update", "note-delete", *NOTES},
    "r4": {"note-delete"},
}
EXPECTED_SUPERSEDED = {("r1", "note-update", "record-deleted"), ("r2", "note-update", "record-deleted")}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("reconcile")
    story, _ = reconcile_story()
    exports = build_and_export(root, story, REPLICA_SUBSETS)
    plan = root / "plan"
    summary = reconcile(spark, list(exports.values()), plan)
    return {"root": root, "story": story, "exports": exports, "plan": plan, "summary": summary}


def _rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(str(path)).to_pylist()
    return rows


def test_plan_names_exactly_the_missing_cids_with_valid_sources(world: dict[str, Any]) -> None:
    story: Story = world["story"]
    root: Path = world["root"]
    holdings = {rid: held(root / f"{rid}.db") for rid in REPLICA_SUBSETS}
    for rid, expected in EXPECTED_MISSING.items():
        items = read_repair_items(world["plan"], rid)
        assert story.names_of(i.message_cid for i in items) == expected, rid
        assert len(items) == len(expected)  # no CID twice
        for item in items:
            tenant = story.tenant_of[story.names_of([item.message_cid]).pop()]
            assert item.tenant == tenant
            assert item.message_cid not in holdings[rid].get(tenant, set())
            # the source really holds it, and so does every listed holder
            assert item.source_replica in item.holders
            for holder in item.holders:
                assert item.message_cid in holdings[holder][tenant]
            assert item.source_position is not None
    # bob's tenant lives on r1 and r2 only: r3 and r4 are never asked to take his records.
    alice = story.tenant_of["n00"]
    assert [i for rid in ("r3", "r4") for i in read_repair_items(world["plan"], rid) if i.tenant != alice] == []


def test_sources_are_spread_over_holders(world: dict[str, Any]) -> None:
    items = read_repair_items(world["plan"], "r3")
    story: Story = world["story"]
    notes = [i for i in items if story.names_of([i.message_cid]) <= set(NOTES)]
    assert len(notes) == len(NOTES)
    by_source = Counter(i.source_replica for i in notes)
    assert set(by_source) == {"r1", "r2", "r4"}  # all three holders serve some
    assert max(by_source.values()) < len(NOTES)
    # the summary's per-source counts are the plan's
    summary = world["summary"]
    assert summary["targets"]["r3"]["messages"] == len(EXPECTED_MISSING["r3"])
    assert sum(summary["targets"]["r3"]["sources"].values()) == len(EXPECTED_MISSING["r3"])
    # a repair connected to one peer takes only that peer's share
    only_r4 = read_repair_items(world["plan"], "r3", source="r4")
    assert {i.source_replica for i in only_r4} == {"r4"}
    assert story.names_of(i.message_cid for i in only_r4) >= {"note-update"}  # r4 alone holds it


def test_superseded_are_kept_out_of_the_plan(world: dict[str, Any]) -> None:
    story: Story = world["story"]
    rows = _rows(world["plan"] / "superseded")
    got = {(r["target_replica"], story.names_of([r["message_cid"]]).pop(), r["superseded_reason"]) for r in rows}
    assert got == EXPECTED_SUPERSEDED
    assert world["summary"]["supersededByReason"] == {"record-deleted": 2}


def test_digests_and_divergent_groups(world: dict[str, Any]) -> None:
    story: Story = world["story"]
    alice = story.tenant_of["n00"]
    digests = _rows(world["plan"] / "digests")
    divergent = _rows(world["plan"] / "divergent")
    # The protocol's own group (a ProtocolsConfigure has no context) is the same everywhere.
    configure = [d for d in digests if d["tenant"] == alice and d["context_root"] is None]
    assert {d["replica_id"] for d in configure} == {"r1", "r2", "r3", "r4"}
    assert len({d["digest"] for d in configure}) == 1 and {d["message_count"] for d in configure} == {1}
    assert not any(g["tenant"] == alice and g["context_root"] is None for g in divergent)
    # Each extra note is its own root context, lacking on r3 only.
    note_ctx = {json.loads(json.dumps(story.steps[n].message))["contextId"]: n for n in NOTES}
    lacking = {g["context_root"]: g["lacking_replicas"] for g in divergent if g["context_root"] in note_ctx}
    assert lacking == {ctx: ["r3"] for ctx in note_ctx}
    # The thread's context diverges because r2 lacks chat and reaction; digests differ there.
    thread_ctx = story.steps["thread"].message["contextId"]
    (thread,) = [g for g in divergent if g["context_root"] == thread_ctx]
    assert thread["lacking_replicas"] == [] and thread["fleet_size"] == 4
    assert len({r["digest"] for r in thread["replicas"]}) == 2
    # bob's plain records have no protocol and no context: one group, r2 lacks one of them.
    (bob,) = [g for g in divergent if g["tenant"] == story.tenant_of["b0"]]
    assert bob["protocol"] is None and bob["context_root"] is None and bob["fleet_size"] == 2
    assert world["summary"]["divergentGroups"] == len(divergent) == len(NOTES) + 3  # notes, thread, note, bob


def test_summary_and_refusals(world: dict[str, Any], spark: SparkSession) -> None:
    summary = read_plan_summary(world["plan"])
    assert summary["missingMessages"] == sum(len(v) for v in EXPECTED_MISSING.values())
    assert {f["tenant"]: f["replicas"] for f in summary["fleets"]}[world["story"].tenant_of["b0"]] == ["r1", "r2"]
    with pytest.raises(PipelineError) as err:
        reconcile(spark, list(world["exports"].values()), world["plan"])
    assert err.value.code == "PlanExists"
    with pytest.raises(PipelineError) as err:
        reconcile(spark, [world["exports"]["r1"], world["exports"]["r1"]], world["root"] / "plan2")
    assert err.value.code == "ReplicaIdDuplicate"
    with pytest.raises(PipelineError) as err:
        read_repair_items(world["root"], "r1")
    assert err.value.code == "PlanNotFound"
