"""What a tenant's admitted history takes (schema 4's ``tenant_usage``, read by the tenant
quotas of issue #15): every writer counts, through triggers on the archive, and the counts
always equal a scan of the archive."""

from __future__ import annotations

import os
from pathlib import Path

from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import SCHEMA_VERSION, Store
from tests.replication.support import chat_world, process_all, undo_schema_7


def scanned(store: Store, tenant: str) -> tuple[int, int]:
    tid = store.tenant_id(tenant, create=False)
    row = store.conn.execute(
        "SELECT count(*), coalesce(sum(length(CAST(body AS BLOB)) + coalesce(CASE typeof(data)"
        " WHEN 'text' THEN CAST(substr(data, instr(data, ':') + 1) AS INTEGER) ELSE length(data) END, 0)), 0)"
        " FROM archive WHERE tenant=?", (tid,)).fetchone()
    return int(row[0]), int(row[1])


def test_local_writes_and_replicated_applies_are_counted(tmp_path: Path) -> None:
    w = chat_world()
    source, replica = Dwn(Store(tmp_path / "source.db")), Dwn(Store(tmp_path / "replica.db"))
    assert replica.store.usage(w.tenant) == (0, 0)
    process_all(source, w.tenant, w.ordered())
    assert source.store.usage(w.tenant) == scanned(source.store, w.tenant)
    assert source.store.usage(w.tenant)[0] == len(w.ordered())
    # Out of order, so that some arrive before what they need (Incomplete), again (Duplicate),
    # and late (a warp over what was already admitted).
    for step in reversed(w.ordered()):
        replica.apply_replicated_message(w.tenant, step.message, step.data)
        assert replica.store.usage(w.tenant) == scanned(replica.store, w.tenant)
    for step in w.ordered():
        replica.apply_replicated_message(w.tenant, step.message, step.data)
        assert replica.store.usage(w.tenant) == scanned(replica.store, w.tenant)
    assert replica.store.usage(w.tenant) == source.store.usage(w.tenant)


def test_data_that_comes_after_its_message_is_counted_then(tmp_path: Path) -> None:
    w = chat_world()
    replica = Dwn(Store(tmp_path / "replica.db"))
    big = os.urandom(40_000)
    initial = RecordsWrite.create(signer=w.alice, data=big, message_timestamp=w.clock.tick(), date_created=w.clock.now)
    assert replica.apply_replicated_message(w.tenant, initial.message).kind == "Applied"  # ancestry only
    without = replica.store.usage(w.tenant)
    assert without == scanned(replica.store, w.tenant) and without[1] < 40_000
    replica.apply_replicated_message(w.tenant, initial.message, big)
    assert replica.store.usage(w.tenant) == scanned(replica.store, w.tenant) == (without[0], without[1] + 40_000)


def test_a_schema_3_store_gets_its_counts(tmp_path: Path) -> None:
    w = chat_world()
    path = tmp_path / "old.db"
    old = Dwn(Store(path))
    process_all(old, w.tenant, w.ordered())
    want = scanned(old.store, w.tenant)
    conn = old.store.conn
    for trigger in ("tenant_usage_insert", "tenant_usage_delete", "tenant_usage_update"):
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute("DROP TABLE tenant_usage")
    undo_schema_7(conn)
    conn.execute("PRAGMA user_version=3")
    old.close()
    reopened = Dwn(Store(path))
    assert reopened.store.scalar("PRAGMA user_version") == SCHEMA_VERSION == 10
    assert reopened.store.usage(w.tenant) == want
    extra = w.write("late note", w.bob, "note", b"late")
    assert reopened.process_message(w.tenant, extra.message, b"late").code == 202
    assert reopened.store.usage(w.tenant) == scanned(reopened.store, w.tenant)
    assert reopened.store.usage(w.tenant)[0] == want[0] + 1
    assert reopened.store.usage("did:key:zNobody") == (0, 0)
