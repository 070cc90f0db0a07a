"""A stored message's wire form (schema 8's ``messages.wire``, issue #17): the DAG-CBOR a source
sends as the `message` member of a MessageEntry, kept when the engine had it, so that listing
a message neither decodes its JSON nor encodes it again. What goes on the wire must be the
same bytes whichever way the listing took."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import SCHEMA_VERSION, Store
from p2psync.replication.closure import ReplicationEntry, StoredEntry
from p2psync.replication.source import encode_message_entry
from p2psync.replication.wire import encode_body
from p2psync.state.local import LocalStoreFetcher
from tests.replication.support import ChatWorld, chat_world, process_all, undo_schema_8


def world() -> ChatWorld:
    """The chat story, a 0-byte record (stored with ``encodedData: ""``) and a record whose
    data is kept out of line."""
    w = chat_world()
    w.write("empty", w.bob, "note", b"")
    w.write("large", w.bob, "note", b"x" * 40_000)
    thread = w.steps["thread"].message
    update = RecordsWrite.create_from(thread, signer=w.bob, data=b"a thread, edited", message_timestamp=w.clock.tick())
    w.add("thread-update", update.message, b"a thread, edited")
    return w


def authored_and_replicated(tmp_path: Path) -> tuple[ChatWorld, Dwn, Dwn]:
    """The world written by its authors into one store and replicated in order into another."""
    w = world()
    authored = Dwn(Store(tmp_path / "authored.db"))
    process_all(authored, w.tenant, w.ordered())
    replica = Dwn(Store(tmp_path / "replica.db"))
    for step in w.ordered():
        assert replica.apply_replicated_message(w.tenant, step.message, step.data).kind == "Applied", step.name
    return w, authored, replica


def listing(store: Store, tenant: str) -> list[tuple[str, Any, bytes | None, int | None, bytes]]:
    """Every log entry as a source lists and sends it: (CID, message, data, size, the bytes of
    its MessageEntry)."""
    fetcher = LocalStoreFetcher(store)
    out = []
    for _, cid, stored in fetcher.log_page(tenant, -1, 1000):
        listed = fetcher.listed_entry(tenant, cid, stored)
        assert listed is not None
        entry, size = listed
        out.append((entry.cid, entry.message, entry.data, size, encode_message_entry(entry, size=size)))
    return out


def without_wire(store: Store) -> None:
    store.conn.execute("UPDATE messages SET wire = NULL")


def test_a_stored_wire_form_is_the_message_as_it_travels(tmp_path: Path) -> None:
    w, authored, replica = authored_and_replicated(tmp_path)
    for dwn in (authored, replica):
        rows = dwn.store.conn.execute("SELECT body, wire FROM messages").fetchall()
        kept = [(json.loads(body), bytes(wire)) for body, wire in rows if wire is not None]
        # the replica's (the sink's) and the author's writes both keep it, for most messages
        assert len(kept) >= len(rows) - 2 > 0
        for message, wire in kept:
            assert wire == encode_body({k: v for k, v in message.items() if k != "encodedData"})
        dwn.close()


def test_a_listing_sends_the_same_bytes_from_the_wire_form_or_the_json(tmp_path: Path) -> None:
    w, authored, replica = authored_and_replicated(tmp_path)
    for dwn in (authored, replica):
        fast = listing(dwn.store, w.tenant)
        fetcher = LocalStoreFetcher(dwn.store)
        stored_entries = [fetcher.listed_entry(w.tenant, cid, stored)
                          for _, cid, stored in fetcher.log_page(w.tenant, -1, 1000)]
        # the writes with 1 to 30,000 bytes of data, the thread's and the deleted note's initial
        # writes included: demoted in place when their records were updated or deleted, they
        # keep their wire form (their data comes from the archive)
        assert sum(isinstance(e[0], StoredEntry) for e in stored_entries if e is not None) == 6
        without_wire(dwn.store)
        slow = listing(dwn.store, w.tenant)
        assert not any(isinstance(fetcher.listed_entry(w.tenant, cid, stored)[0], StoredEntry)  # type: ignore[index]
                       for _, cid, stored in fetcher.log_page(w.tenant, -1, 1000))
        assert fast == slow
        dwn.close()


def test_a_stored_entry_reads_as_the_entry_it_stands_for(tmp_path: Path) -> None:
    w, authored, replica = authored_and_replicated(tmp_path)
    fetcher = LocalStoreFetcher(replica.store)
    chat = w.steps["chat"]
    listed = [fetcher.listed_entry(w.tenant, cid, stored)
              for _, cid, stored in fetcher.log_page(w.tenant, -1, 1000) if cid == chat.cid]
    assert listed and listed[0] is not None
    entry, size = listed[0]
    assert isinstance(entry, StoredEntry) and size == len(b"hi all")
    assert entry.record_id == chat.message["recordId"]
    assert entry.message == chat.message and entry.data == chat.data and entry.cid == chat.cid
    assert entry.encoded == encode_body(chat.message)
    swapped = entry.with_data(b"other")
    assert swapped.message == chat.message and swapped.data == b"other" and swapped.encoded == entry.encoded
    plain = ReplicationEntry(chat.message, chat.data)
    assert plain.record_id == entry.record_id and plain.encoded == entry.encoded  # kept from its CID
    assert encode_message_entry(plain) == encode_message_entry(entry)
    authored.close()
    replica.close()


def test_a_schema_7_store_gets_the_column_and_lists_as_before(tmp_path: Path) -> None:
    w, authored, replica = authored_and_replicated(tmp_path)
    authored.close()
    want = listing(replica.store, w.tenant)
    undo_schema_8(replica.store.conn)
    replica.store.conn.execute("PRAGMA user_version=7")
    replica.close()

    reopened = Dwn(Store(tmp_path / "replica.db"))
    conn = reopened.store.conn
    assert reopened.store.scalar("PRAGMA user_version") == SCHEMA_VERSION == 10
    rows, kept = conn.execute("SELECT count(*), count(wire) FROM messages").fetchone()
    assert rows > 0 and kept == 0
    assert listing(reopened.store, w.tenant) == want  # every row from its JSON
    late = w.write("late note", w.bob, "note", b"late")
    assert reopened.apply_replicated_message(w.tenant, late.message, b"late").kind == "Applied"
    assert conn.execute("SELECT count(wire) FROM messages").fetchone() == (1,)  # new rows keep it
    assert listing(reopened.store, w.tenant)[-1][4] == encode_message_entry(ReplicationEntry(late.message, b"late"))
    reopened.close()


def test_a_sink_hands_the_bytes_it_hashed_to_the_store(tmp_path: Path) -> None:
    """A sink computes each entry's CID from its DAG-CBOR (ReplicationEntry): applied with both,
    the message keeps its wire form; with the CID alone (bytes not at hand) it does not."""
    w = world()
    handed = Dwn(Store(tmp_path / "handed.db"))
    bare = Dwn(Store(tmp_path / "bare.db"))
    for step in w.ordered():
        entry = ReplicationEntry(step.message, step.data)
        assert entry.encoded == encode_body(step.message)
        assert handed.apply_replicated_message(w.tenant, entry.message, entry.data, cid=entry.cid,
                                               encoded=entry.encoded).kind == "Applied"
        assert bare.apply_replicated_message(w.tenant, entry.message, entry.data, cid=entry.cid).kind == "Applied"
    assert handed.store.conn.execute("SELECT count(wire) FROM messages").fetchone()[0] >= 5
    assert bare.store.conn.execute("SELECT count(wire) FROM messages").fetchone()[0] == 0
    assert listing(handed.store, w.tenant) == listing(bare.store, w.tenant)
    handed.close()
    bare.close()
