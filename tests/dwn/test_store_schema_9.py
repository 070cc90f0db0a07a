"""Schema 9 (issue #17): the archive's record index without the sort key. A schema-8 store
migrates on open and answers every record read, lookup and warp as it did; the record queries
still go through the record index, not the tenant's whole archive."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import p2psync.dwn.store as store_module
from p2psync.dwn import canonical
from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import SCHEMA_VERSION, Store
from p2psync.state.records import record_history, removed_records
from tests.dwn.test_store_schema_6 import answers, index_sql, world
from tests.replication.support import ChatWorld, snapshot

#: Schema 8's record index, which sorted a record's rows by their sort key.
_V8_ARCHIVE_RECORD = "CREATE INDEX archive_record ON archive(tenant, record_id, sort_key)"


def make_v8_store(path: Path, w: ChatWorld, names: set[str] | None = None) -> None:
    """A store as schema 8 left it: this p2psync's rows, schema 8's record index."""
    dwn = Dwn(Store(path))
    for step in w.ordered():
        if names is None or step.name in names:
            assert dwn.apply_replicated_message(w.tenant, step.message, step.data).kind == "Applied", step.name
    conn = dwn.store.conn
    conn.execute("DROP INDEX archive_record")
    conn.execute(_V8_ARCHIVE_RECORD)
    conn.execute("PRAGMA user_version=8")
    dwn.close()


def record_answers(dwn: Dwn, w: ChatWorld) -> list[Any]:
    """Everything read through the record index: each record's archived messages in canonical
    order, its history, the protocol definitions, the removed records."""
    store, out = dwn.store, answers(dwn, w)
    record_ids = sorted({str(s.message["recordId"]) for s in w.ordered() if "recordId" in s.message})
    for record_id in record_ids:
        out.append(canonical.archived_messages(store, w.tenant, record_id=record_id))
        out.append(canonical.archived_record(store, w.tenant, record_id))
        history = record_history(store, w.tenant, record_id)
        out.append(None if history is None else replace(history, here=""))  # `here`: the store's id
    protocol = w.steps["thread"].message["descriptor"]["protocol"]
    out.append(canonical.archived_messages(store, w.tenant, protocol=protocol))
    out.append(removed_records(store, w.tenant))
    return out


def test_a_schema_8_store_migrates_and_answers_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = world()
    path = tmp_path / "v8.db"
    make_v8_store(path, w)
    with monkeypatch.context() as m:
        m.setattr(store_module, "SCHEMA_VERSION", 8)
        old = Dwn(Store(path))
        assert "sort_key" in index_sql(old.store, "archive_record")
        before, state = record_answers(old, w), snapshot(old.store, w.tenant)
        old.close()

    migrated = Dwn(Store(path))
    store = migrated.store
    assert store.scalar("PRAGMA user_version") == SCHEMA_VERSION == 9
    assert "sort_key" not in index_sql(store, "archive_record")
    assert record_answers(migrated, w) == before
    assert snapshot(store, w.tenant) == state
    assert migrated.history.verify(w.tenant) == {"missing": [], "extra": [], "changed": [], "data": []}
    fresh = Dwn(Store(tmp_path / "fresh.db"))  # and as a store made at schema 9
    for step in w.ordered():
        assert fresh.apply_replicated_message(w.tenant, step.message, step.data).kind == "Applied", step.name
    assert record_answers(fresh, w) == before
    migrated.close()
    fresh.close()


def test_record_queries_go_through_the_record_index(tmp_path: Path) -> None:
    """With no statistics SQLite would take archive_key for an ORDER BY or a range on the sort
    key, walking every later message of the tenant to find one record's."""
    dwn = Dwn(Store(tmp_path / "store.db"))
    conn = dwn.store.conn
    queries = [canonical._OWN_ROWS_SQL, canonical._LATER_OF_RECORD_SQL,
               "SELECT 1 FROM archive WHERE tenant=? AND record_id=? AND initial=1"]
    for sql in queries:
        plan = " ".join(str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, (1,) * sql.count("?")))
        assert "USING INDEX archive_record (tenant=? AND record_id=?)" in plan, (sql, plan)
    dwn.close()


def test_a_warp_on_a_migrated_store_reaches_the_canonical_state(tmp_path: Path) -> None:
    """Messages that sort before admitted ones, applied after the migration: the warp finds
    the record's later rows through the shorter index."""
    w = world()
    late = {"participant", "note-update", "chat", "reaction"}
    make_v8_store(tmp_path / "v8.db", w, {s.name for s in w.ordered()} - late)
    migrated = Dwn(Store(tmp_path / "v8.db"))
    fresh = Dwn(Store(tmp_path / "fresh.db"))
    for step in w.ordered():
        assert fresh.apply_replicated_message(w.tenant, step.message, step.data).kind == "Applied", step.name
    for name in ("chat", "reaction", "note-update", "participant"):
        step = w.steps[name]
        migrated.apply_replicated_message(w.tenant, step.message, step.data)
    for name in ("chat", "reaction"):
        step = w.steps[name]
        assert migrated.apply_replicated_message(w.tenant, step.message, step.data).kind in ("Applied", "Duplicate")
    assert migrated.history.warps > 0
    assert snapshot(migrated.store, w.tenant).messages == snapshot(fresh.store, w.tenant).messages
    assert record_answers(migrated, w) == record_answers(fresh, w)
    assert migrated.history.verify(w.tenant) == {"missing": [], "extra": [], "changed": [], "data": []}
    migrated.close()
    fresh.close()
