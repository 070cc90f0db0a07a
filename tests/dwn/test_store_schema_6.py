"""Schema 6 (issue #17): fewer index entries per message. A schema-5 store migrates on open
and answers every query, lookup and warp as it did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import p2psync.dwn.store as store_module
from p2psync.dwn.canonical import Footprint
from p2psync.dwn.encoding import in_dag_cbor_order, json_compact, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import SCHEMA_VERSION, Store
from tests.replication.support import ChatWorld, Step, chat_world, snapshot, undo_schema_7


def world() -> ChatWorld:
    """The chat story plus a 0-byte record (stored under another CID than it was sent as)."""
    w = chat_world()
    w.write("empty", w.bob, "note", b"")
    thread = w.steps["thread"].message
    update = RecordsWrite.create_from(thread, signer=w.bob, data=b"a thread, edited", message_timestamp=w.clock.tick())
    w.add("thread-update", update.message, b"a thread, edited")
    return w


def filters(w: ChatWorld) -> list[dict[str, Any]]:
    s = w.steps
    thread, chat, note = s["thread"].message, s["chat"].message, s["note"].message
    return [
        {"recordId": note["recordId"]},
        {"entryId": thread["recordId"]},  # an initial write: not in messages_entry any more
        {"entryId": RecordsWrite(s["thread-update"].message).entry_id},  # an update: still indexed
        {"parentId": thread["recordId"]},
        {"parentId": [thread["recordId"], chat["recordId"]]},
        {"contextId": chat["contextId"]},
        {"protocol": thread["descriptor"]["protocol"], "protocolPath": "thread/chat"},
        {"protocol": [thread["descriptor"]["protocol"], "https://nothing.example"]},
        {"interface": "Records", "method": "Write"},
        {"interface": "Protocols"},
        {},
    ]


def answers(dwn: Dwn, w: ChatWorld) -> list[Any]:
    out: list[Any] = [dwn.store.messages.query(w.tenant, [f]) for f in filters(w)]
    for step in w.ordered():
        out.append(dwn.history.archived_data(w.tenant, step.cid))
    return out


def v5_archive_keys(dwn: Dwn) -> None:
    """What schema 5 kept in archive_keys: every footprint key of every row, its own included."""
    conn = dwn.store.conn
    conn.execute("DELETE FROM archive_keys")
    for row_id, tid, key, touch in conn.execute("SELECT id, tenant, sort_key, touch FROM archive").fetchall():
        footprint = Footprint.parse(str(touch))
        conn.executemany(
            "INSERT INTO archive_keys(tenant, key, sort_key, row, writes) VALUES(?,?,?,?,?)",
            [(tid, k, key, row_id, int(k in footprint.writes)) for k in sorted(footprint.reads)],
        )


def open_v5(path: Path) -> Dwn:
    """A schema-5 store opened by this p2psync, which reads the archive's ``data_in`` (schema
    7) and writes the messages' ``wire`` (schema 8): the columns are there while it is open
    (:func:`close_v5` takes them out again)."""
    old = Dwn(Store(path))
    assert old.store.scalar("PRAGMA user_version") == 5
    old.store.conn.execute("ALTER TABLE archive ADD COLUMN data_in TEXT")
    old.store.conn.execute("ALTER TABLE messages ADD COLUMN wire BLOB")  # schema 8's, likewise
    return old


def close_v5(old: Dwn) -> None:
    undo_schema_7(old.store.conn)
    old.close()


def make_v5_store(path: Path, steps: list[Step], tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(store_module, "SCHEMA_VERSION", 5)
        old = open_v5(path)
        for step in steps:
            assert old.apply_replicated_message(tenant, step.message, step.data).kind == "Applied", step.name
        v5_archive_keys(old)
        close_v5(old)


def index_sql(store: Store, name: str) -> str:
    return str(store.scalar("SELECT sql FROM sqlite_master WHERE type='index' AND name=?", (name,)))


def test_a_schema_5_store_migrates_and_answers_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = world()
    path = tmp_path / "v5.db"
    make_v5_store(path, w.ordered(), w.tenant, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(store_module, "SCHEMA_VERSION", 5)
        old = open_v5(path)
        before, state = answers(old, w), snapshot(old.store, w.tenant)
        own = old.store.scalar("SELECT count(*) FROM archive_keys k JOIN archive a ON a.id = k.row"
                               " WHERE k.key IN ('rec:' || a.record_id, 'live:' || a.record_id)")
        keys = old.store.scalar("SELECT count(*) FROM archive_keys")
        close_v5(old)
    assert 0 < own < keys  # the migration has own keys to drop and others to keep

    migrated = Dwn(Store(path))
    store = migrated.store
    assert store.scalar("PRAGMA user_version") == SCHEMA_VERSION == 10
    for name in ("messages_entry", "messages_parent", "messages_context", "messages_protocol", "archive_stored"):
        assert " WHERE " in index_sql(store, name), name
    assert store.scalar("SELECT count(*) FROM archive_keys") == keys - own
    assert answers(migrated, w) == before
    assert snapshot(store, w.tenant) == state
    assert migrated.history.verify(w.tenant) == {"missing": [], "extra": [], "changed": [], "data": []}
    migrated.close()


def test_a_warp_on_a_migrated_store_reaches_the_canonical_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message that sorts before admitted ones, applied after the migration: the warp finds
    the rows it affects through the record index (own keys) and archive_keys (the others)."""
    w = world()
    late = {"participant", "note-update"}
    make_v5_store(tmp_path / "v5.db", [s for s in w.ordered() if s.name not in late and s.name != "chat"
                                       and s.name != "reaction"], w.tenant, monkeypatch)
    migrated = Dwn(Store(tmp_path / "v5.db"))
    fresh = Dwn(Store(tmp_path / "fresh.db"))
    for step in w.ordered():
        assert fresh.apply_replicated_message(w.tenant, step.message, step.data).kind == "Applied", step.name
    # the chat needs its author's role (participant): it comes after, and goes back in time
    for name in ("chat", "reaction", "note-update", "participant"):
        step = w.steps[name]
        migrated.apply_replicated_message(w.tenant, step.message, step.data)
    for name in ("chat", "reaction"):
        step = w.steps[name]
        assert migrated.apply_replicated_message(w.tenant, step.message, step.data).kind in ("Applied", "Duplicate")
    assert migrated.history.warps > 0
    assert snapshot(migrated.store, w.tenant).messages == snapshot(fresh.store, w.tenant).messages
    assert migrated.history.verify(w.tenant) == {"missing": [], "extra": [], "changed": [], "data": []}
    migrated.close()
    fresh.close()


def test_the_archive_keeps_each_message_as_admitted(tmp_path: Path) -> None:
    """The archive's body is taken from the messages row just stored when it is the same
    message (canonical.py's ``archived_body``): it must still be the message as admitted,
    whether it came with its data inline, inherited it, was demoted or came without it."""
    w = world()
    dwn = Dwn(Store(tmp_path / "store.db"))
    steps = w.ordered()
    for step in steps:
        dwn.process_message(w.tenant, step.message, step.data)
    data_less = RecordsWrite.create_from(w.steps["thread-update"].message, signer=w.bob,
                                         message_timestamp=w.clock.tick())  # keeps the data it has
    assert dwn.process_message(w.tenant, data_less.message, None).code == 202
    archived = dict(dwn.store.conn.execute("SELECT cid, body FROM archive").fetchall())
    expected = {step.cid: step.message for step in steps} | {message_cid(data_less.message): data_less.message}
    assert set(archived) == set(expected)
    for cid, message in expected.items():
        admitted = in_dag_cbor_order({k: v for k, v in message.items() if k != "encodedData"})  # as stored
        assert archived[cid] == json_compact(admitted), cid
    dwn.close()
