"""Closure audit: faults injected into copies of one engine-made store are found, and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from p2psync.pipeline.audit import DEPENDENCY_CLASSES, audit
from p2psync.pipeline.export import export_store
from tests.pipeline.worlds import audit_story, build_replica, copy_store, delete_messages

# replica -> the steps removed from a copy of the complete store
INJECTED: dict[str, list[str]] = {
    "clean": [],
    "no-thread": ["thread"],
    "no-role": ["participant"],
    "no-protocol": ["protocol"],
    "no-grant": ["grant"],
    "no-initial": ["note"],
}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("audit")
    story, world = audit_story()
    build_replica(root / "clean.db", story, story.steps).close()
    exports = []
    for rid, removed in INJECTED.items():
        path = root / f"{rid}.db"
        if rid != "clean":
            copy_store(root / "clean.db", path)
            delete_messages(path, world.tenant, [story.cid(n) for n in removed])
        exports.append(root / f"{rid}-export")
        export_store(path, exports[-1], replica_id=rid)
    summary = audit(spark, exports, root / "audit")
    violations = pq.read_table(str(root / "audit" / "violations")).to_pylist()
    return {"story": story, "world": world, "summary": summary, "violations": violations}


def test_audit_finds_the_injected_violations_and_nothing_else(result: dict[str, Any]) -> None:
    story = result["story"]
    rid = {n: s.message.get("recordId") for n, s in story.steps.items()}
    thread_ctx = story.steps["thread"].message["contextId"]
    chat_protocol = story.steps["protocol"].message["descriptor"]["definition"]["protocol"]
    got = {
        (v["replica_id"], story.names_of([v["message_cid"]]).pop(), v["dependency_class"], v["missing"])
        for v in result["violations"]
    }
    expected = {
        ("no-thread", "participant", "parent", rid["thread"]),
        ("no-thread", "chat", "parent", rid["thread"]),
        ("no-thread", "reaction", "context", rid["thread"]),
        ("no-role", "chat", "role", "thread/participant"),
        ("no-grant", "granted-note", "grant", rid["grant"]),
        ("no-initial", "note-delete", "initial-write", rid["note"]),
        *(
            ("no-protocol", name, "protocol", chat_protocol)
            for name in ("thread", "participant", "chat", "reaction", "note", "note-delete", "granted-note")
        ),
    }
    assert got == expected
    assert len(result["violations"]) == len(expected)
    for v in result["violations"]:
        assert v["code"] == DEPENDENCY_CLASSES[v["dependency_class"]]
        assert v["tenant"] == result["world"].tenant
    (role,) = [v for v in result["violations"] if v["dependency_class"] == "role"]
    assert role["role_context"] == thread_ctx


def test_audit_counts_by_class(result: dict[str, Any]) -> None:
    summary = result["summary"]
    assert summary["violations"] == 13
    missing = {c: t["missing"] for c, t in summary["byClass"].items()}
    assert missing == {"protocol": 7, "initial-write": 1, "parent": 2, "context": 1, "role": 1, "grant": 1}
    clean = summary["replicas"]["clean"]
    assert all(c["missing"] == 0 for c in clean["classes"].values())
    # what the clean replica had to check: every edge of the story
    checked = {c: t["checked"] for c, t in clean["classes"].items()}
    assert checked == {"protocol": 7, "initial-write": 1, "parent": 3, "context": 1, "role": 1, "grant": 1}
    assert clean["recordsMessages"] == 8  # thread participant chat reaction note note-delete grant granted-note


def test_output_directory_is_only_replaced_when_it_holds_an_earlier_result(tmp_path: Path) -> None:
    from p2psync.pipeline.audit import AUDIT_LAYOUT
    from p2psync.pipeline.errors import PipelineError

    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(PipelineError) as err:
            AUDIT_LAYOUT.prepare(out, overwrite)
        assert err.value.code == "AuditExists"
    (out / "violations").mkdir()
    (out / "violations" / "part-0.parquet").write_bytes(b"old")
    (out / "summary.json").write_text("{}")
    AUDIT_LAYOUT.prepare(out, True)
    assert sorted(p.name for p in out.iterdir()) == ["precious.txt"]  # only the audit's own entries went
