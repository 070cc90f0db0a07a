"""Export: the rows say what the store holds, batches bound memory, refusals are typed."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from p2psync.dwn.store import Store
from p2psync.pipeline import export as export_module
from p2psync.pipeline.errors import PipelineError
from p2psync.pipeline.export import export_store
from p2psync.pipeline.formats import EXPORT_FORMAT, MESSAGE_SCHEMA, read_export_info, read_exports
from p2psync.pipeline.session import check_java
from tests.pipeline.worlds import audit_story, build_replica


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    story, _ = audit_story()
    build_replica(tmp_path / "s.db", story, story.steps).close()
    return tmp_path / "s.db"


def test_rows_describe_every_stored_message(store_path: Path, tmp_path: Path) -> None:
    story, world = audit_story()
    result = export_store(store_path, tmp_path / "e", replica_id="one")
    rows = {r["message_cid"]: r for r in pq.read_table(str(tmp_path / "e" / "messages")).to_pylist()}
    store = Store(store_path)
    try:
        assert set(rows) == set(store.messages.cids(world.tenant))
        for cid, row in rows.items():
            assert row["position"] == store.events.position_of(world.tenant, cid)
        stream = store.events.stream(world.tenant)
    finally:
        store.close()
    assert result.messages == len(rows) == 9 and result.protocols == 1 and result.without_position == 0
    by_name = {name: rows[story.cid(name)] for name in story.steps if story.cid(name) in rows}
    assert "note-update" not in by_name  # pruned by the delete: not in the store, not in the export
    chat = by_name["chat"]
    assert (chat["interface"], chat["method"], chat["protocol_path"]) == ("Records", "Write", "thread/chat")
    assert chat["protocol_role"] == "thread/participant" and chat["author"] == world.carol.did
    assert chat["parent_id"] == story.steps["thread"].message["recordId"]
    assert chat["is_initial_write"] and chat["is_latest_base_state"] and chat["data_size"] == 6
    assert (chat["stream_id"], chat["epoch"]) == stream and chat["replica_id"] == "one"
    note, delete = by_name["note"], by_name["note-delete"]
    assert note["is_initial_write"] and note["is_latest_base_state"] is False
    assert delete["method"] == "Delete" and delete["prune"] is False and not delete["is_initial_write"]
    assert delete["record_id"] == note["record_id"] and delete["context_id"] == note["context_id"]
    assert by_name["granted-note"]["permission_grant_id"] == story.steps["grant"].message["recordId"]
    assert by_name["protocol"]["interface"] == "Protocols" and by_name["protocol"]["context_id"] is None
    (definition,) = pq.read_table(str(tmp_path / "e" / "protocols")).to_pylist()
    assert json.loads(definition["definition"]) == story.steps["protocol"].message["descriptor"]["definition"]
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert manifest["format"] == EXPORT_FORMAT and manifest["replicaId"] == "one" and manifest["messages"] == 9
    assert manifest["tenants"] == [{"did": world.tenant, "streamId": stream[0], "epoch": stream[1]}]
    assert pq.read_schema(str(tmp_path / "e" / "messages" / "part-00000.parquet")).equals(MESSAGE_SCHEMA)


def test_batches_bound_memory(store_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export_module, "EXPORT_BATCH_ROWS", 4)
    seen: list[int] = []
    export_store(store_path, tmp_path / "e", replica_id="one", progress=seen.append)
    meta = pq.ParquetFile(str(tmp_path / "e" / "messages" / "part-00000.parquet")).metadata
    assert meta.num_rows == 9 and meta.num_row_groups == 3  # 4 + 4 + 1: never more than a batch held
    assert seen == [4, 8, 9]


def test_replica_id_defaults_to_the_store_id_and_refusals(store_path: Path, tmp_path: Path) -> None:
    from p2psync.state.copies import store_id

    first = export_store(store_path, tmp_path / "a")
    store = Store(store_path)
    try:
        assert first.replica_id == store_id(store)
    finally:
        store.close()
    with pytest.raises(PipelineError) as err:
        export_store(store_path, tmp_path / "a")
    assert err.value.code == "ExportExists"
    again = export_store(store_path, tmp_path / "a", overwrite=True)  # an earlier export may be replaced
    assert again.messages == first.messages
    with pytest.raises(PipelineError) as err:
        read_exports([tmp_path / "a", tmp_path / "a"])
    assert err.value.code == "ReplicaIdDuplicate"
    (tmp_path / "a" / "manifest.json").write_text(json.dumps({"format": "other/9", "replicaId": "x"}))
    with pytest.raises(PipelineError) as err:
        read_export_info(tmp_path / "a")
    assert err.value.code == "ExportFormatUnknown"
    with pytest.raises(PipelineError) as err:
        export_store(tmp_path / "absent.db", tmp_path / "b")
    assert err.value.code == "StoreNotFound" and not (tmp_path / "absent.db").exists()


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(PipelineError) as err:
        check_java()
    assert err.value.code == "JavaMissing" and "default-jre-headless" in err.value.detail
    old = tmp_path / "java"
    old.write_text('#!/bin/sh\necho \'openjdk version "1.8.0_412"\' >&2\n')
    old.chmod(0o755)
    with pytest.raises(PipelineError) as err:
        check_java()
    assert err.value.code == "JavaTooOld" and "Java 8" in err.value.detail
