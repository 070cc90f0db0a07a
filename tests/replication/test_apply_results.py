"""Replicated apply: each result kind and each dependency ref, produced by a real scenario.

Messages are authored with our own classes and real Ed25519 keys; stores are SQLite files.
Each test applies messages out of their authored order and checks the exact result.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn import permissions
from p2psync.dwn.canonical import History
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import b64url_encode, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.pipe import PipeSession
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.replicated import apply_replicated_message_json
from p2psync.dwn.replication_types import (
    Ancestor,
    Applied,
    Deferred,
    Duplicate,
    Grant,
    Incomplete,
    InitialWrite,
    Invalid,
    Parent,
    ProgressToken,
    Protocol,
    RecordData,
    ReplicationApplyResult,
    Role,
    Superseded,
    telemetry_status,
)
from p2psync.dwn.store import Store
from p2psync.replication.closure import ClosureAdmitter
from p2psync.state.local import LocalApplier, LocalStoreFetcher
from tests.replication.support import (
    CHAT,
    ChatWorld,
    Clock,
    Step,
    assert_log_matches_messages,
    chat_world,
    grant_world,
    log_appends,
    process_all,
    seeded,
    snapshot,
)


@pytest.fixture
def replica(tmp_path: Path) -> Dwn:
    return Dwn(Store(tmp_path / "replica.db"))


@pytest.fixture
def source(tmp_path: Path) -> Dwn:
    return Dwn(Store(tmp_path / "source.db"))


def apply(dwn: Dwn, world: ChatWorld, step: Step, *, data: bool = True) -> Any:
    return dwn.apply_replicated_message(world.tenant, step.message, step.data if data else None)


# --------------------------------------------------------------------------- Incomplete: refs


def test_chat_before_its_thread_role_record_and_protocol(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    thread_id = s["thread"].message["recordId"]
    # each refusal names exactly what the handler found missing, and stores nothing
    assert apply(replica, w, s["chat"]) == Incomplete((Protocol(protocol=CHAT),))
    assert replica.store.messages.count(w.tenant) == 0
    assert apply(replica, w, s["protocol"]).kind == "Applied"
    assert apply(replica, w, s["chat"]) == Incomplete((Parent(record_id=thread_id, protocol=CHAT),))
    assert apply(replica, w, s["thread"]).kind == "Applied"
    assert apply(replica, w, s["chat"]) == Incomplete(
        (Role(protocol=CHAT, protocol_path="thread/participant", recipient=w.carol.did, context_prefix=thread_id),)
    )
    assert apply(replica, w, s["participant"]).kind == "Applied"
    assert apply(replica, w, s["chat"]).kind == "Applied"
    assert replica.store.messages.count(w.tenant) == 4


async def test_one_incomplete_names_the_whole_missing_ancestry(replica: Dwn, source: Dwn) -> None:
    w = chat_world()
    s = w.steps
    process_all(source, w.tenant, w.ordered())
    apply(replica, w, s["protocol"])
    result = apply(replica, w, s["reaction"])
    # root first, the immediate parent last: one fetch pass brings the chain
    assert result == Incomplete(
        (
            Ancestor(record_id=s["thread"].message["recordId"], protocol=CHAT),
            Parent(record_id=s["chat"].message["recordId"], protocol=CHAT),
        )
    )
    done = await ClosureAdmitter(w.tenant, s["reaction"].entry).admit(
        LocalApplier(replica), LocalStoreFetcher(source.store)
    )
    assert done.status == "admitted"
    # pass 1: ancestry fetched; pass 2: chat needs its role record; pass 3: all apply
    assert (done.passes, done.fetch_requests) == (3, 2)
    assert done.applied == (s["thread"].cid, s["participant"].cid, s["chat"].cid, s["reaction"].cid)


def test_ancestor_missing_while_constructing_the_record_chain(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    for name in ("protocol", "thread", "participant", "chat"):
        assert apply(replica, w, s[name]).kind == "Applied"
    # a replica restored from a partial backup: the thread is gone (state and archive), its chat is not
    replica.store.messages.delete(w.tenant, s["thread"].cid)
    replica.store.conn.execute("DELETE FROM archive WHERE cid=?", (s["thread"].cid,))
    result = apply(replica, w, s["reaction"])
    assert result == Incomplete((Ancestor(record_id=s["thread"].message["recordId"], protocol=CHAT),))


def test_grant_authorized_write_before_its_grant(replica: Dwn) -> None:
    w = grant_world()
    s = w.steps
    apply(replica, w, s["protocol"])
    grant_id = s["grant"].message["recordId"]
    assert apply(replica, w, s["granted-note"]) == Incomplete((Grant(permission_grant_id=grant_id),))
    assert apply(replica, w, s["grant"]).kind == "Applied"
    assert apply(replica, w, s["granted-note"]).kind == "Applied"


def test_update_before_its_initial_write(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    apply(replica, w, s["protocol"])
    note_id = s["note"].message["recordId"]
    # 0.5.2 refuses a non-tenant protocol update without its initial write as an action
    # not allowed; the initial write is what is missing
    assert apply(replica, w, s["note-update"]) == Incomplete((InitialWrite(record_id=note_id, protocol=CHAT),))
    # the tenant's own update of a plain record: RecordsWriteGetInitialWriteNotFound
    initial = RecordsWrite.create(
        signer=w.alice, data=b"v1", message_timestamp=w.clock.tick(), date_created=w.clock.now
    )
    update = RecordsWrite.create_from(initial.message, signer=w.alice, data=b"v2", message_timestamp=w.clock.tick())
    result = replica.apply_replicated_message(w.tenant, update.message, b"v2")
    assert result == Incomplete((InitialWrite(record_id=initial.record_id),))


def test_delete_before_its_record(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    note_id = s["note"].message["recordId"]
    assert apply(replica, w, s["note-delete"]) == Incomplete((InitialWrite(record_id=note_id),))


def test_update_without_data_whose_data_is_not_here(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    apply(replica, w, s["protocol"])
    note = s["note"]
    rid, protocol = note.message["recordId"], CHAT
    # the initial write came without its data (stored for ancestry only) ...
    assert apply(replica, w, note, data=False) == Applied(
        ancestry_only=True, position=_token(replica, w.tenant, note.cid)
    )
    publish = RecordsWrite.create_from(note.message, signer=w.bob, published=True, message_timestamp=w.clock.tick())
    # ... so an update that reuses the previous data has none to reuse
    result = replica.apply_replicated_message(w.tenant, publish.message)
    assert result == Incomplete(
        (RecordData(record_id=rid, data_cid=note.message["descriptor"]["dataCid"], protocol=protocol),)
    )


def test_large_update_without_data_whose_data_is_not_here(replica: Dwn) -> None:
    w = chat_world()
    big = os.urandom(40_000)  # above the 30,000-byte inline limit: the data store holds it
    initial = RecordsWrite.create(signer=w.alice, data=big, message_timestamp=w.clock.tick(), date_created=w.clock.now)
    assert replica.apply_replicated_message(w.tenant, initial.message).kind == "Applied"  # 204: no data
    publish = RecordsWrite.create_from(
        initial.message, signer=w.alice, published=True, message_timestamp=w.clock.tick()
    )
    result = replica.apply_replicated_message(w.tenant, publish.message)
    assert result == Incomplete((RecordData(record_id=initial.record_id, data_cid=initial.descriptor["dataCid"]),))


async def test_update_without_data_after_a_write_that_is_not_here(replica: Dwn, source: Dwn) -> None:
    w = chat_world()
    initial = RecordsWrite.create(
        signer=w.alice, data=b"v1", message_timestamp=w.clock.tick(), date_created=w.clock.now
    )
    v2 = RecordsWrite.create_from(initial.message, signer=w.alice, data=b"v2", message_timestamp=w.clock.tick())
    publish = RecordsWrite.create_from(v2.message, signer=w.alice, published=True, message_timestamp=w.clock.tick())
    for message, data in ((initial.message, b"v1"), (v2.message, b"v2"), (publish.message, None)):
        assert source.process_message(w.tenant, message, data).code == 202
    assert replica.apply_replicated_message(w.tenant, initial.message, b"v1").kind == "Applied"
    # v2 brought the data the publish refers to; 0.5.2 reports a data CID mismatch
    result = replica.apply_replicated_message(w.tenant, publish.message)
    assert result == Incomplete((RecordData(record_id=initial.record_id, data_cid=v2.descriptor["dataCid"]),))
    outcome = await ClosureAdmitter(w.tenant, Step("publish", publish.message).entry).admit(
        LocalApplier(replica), LocalStoreFetcher(source.store)
    )
    assert outcome.status == "admitted"
    read = replica.process_message(
        w.tenant, create_records_read(signer=w.alice, filter={"recordId": initial.record_id})
    )
    assert (read.code, read.data) == (200, b"v2")


# --------------------------------------------------------------------------- Applied, Duplicate, Superseded


def _token(dwn: Dwn, tenant: str, cid: str) -> ProgressToken:
    stream_id, epoch = dwn.store.events.stream(tenant)
    position = dwn.store.events.position_of(tenant, cid)
    assert position is not None
    return ProgressToken(stream_id, epoch, position, cid)


def test_applied_carries_this_stores_progress_token(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    first = apply(replica, w, s["protocol"])
    second = apply(replica, w, s["thread"])
    assert first == Applied(position=_token(replica, w.tenant, s["protocol"].cid))
    assert second == Applied(position=_token(replica, w.tenant, s["thread"].cid))
    assert first.position is not None and second.position is not None
    assert second.position.position > first.position.position
    assert second.to_json()["position"] == {
        "streamId": first.position.stream_id,
        "epoch": first.position.epoch,
        "position": str(second.position.position),
        "messageCid": s["thread"].cid,
    }


def test_applied_token_is_the_log_entry_in_and_out_of_order(replica: Dwn) -> None:
    """The token an Applied carries comes from the append its processing made (no second read)
    when the message sorts last, and is looked up after a warp: both are the log's entry."""
    alice, clock = seeded("token-alice"), Clock()
    writes = []
    for i in range(4):
        now = clock.tick()
        data = f"record {i}".encode()
        write = RecordsWrite.create(signer=alice, data=data, schema="https://example.org/token",
                                    data_format="text/plain", message_timestamp=now, date_created=now)
        writes.append((write.message, data))
    for message, data in [writes[1], writes[3], writes[0], writes[2]]:  # the 2nd and 4th sort before others
        result = replica.apply_replicated_message(alice.did, message, data)
        assert isinstance(result, Applied)
        assert result.position == _token(replica, alice.did, message_cid(message))


def test_the_last_append_is_forgotten_when_rolled_back_or_removed(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    tenant, events = "did:example:alice", store.events
    before = events.appends
    with store.transaction():
        position = events.append(tenant, "bafy-one", {})
    assert events.appended_since(before, tenant, "bafy-one") == (position, *events.stream(tenant))
    assert events.appended_since(events.appends, tenant, "bafy-one") is None  # nothing since
    assert events.appended_since(before, tenant, "bafy-other") is None
    assert events.appended_since(before, "did:example:bob", "bafy-one") is None
    events.delete_events_by_cid(tenant, ["bafy-one"])
    assert events.appended_since(before, tenant, "bafy-one") is None
    before = events.appends
    with pytest.raises(RuntimeError), store.transaction():
        events.append(tenant, "bafy-two", {})
        raise RuntimeError("rolled back")
    assert events.position_of(tenant, "bafy-two") is None
    assert events.appended_since(before, tenant, "bafy-two") is None


def test_duplicate_before_any_handler_and_repairs_a_missing_log_entry(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    apply(replica, w, s["protocol"])
    apply(replica, w, s["thread"])
    appends = log_appends(replica.store, w.tenant)
    assert apply(replica, w, s["thread"]) == Duplicate()
    assert log_appends(replica.store, w.tenant) == appends  # nothing counted twice
    # a store that lost the entry (an interrupted import, an older version): Duplicate repairs it
    replica.store.events.delete_events_by_cid(w.tenant, [s["thread"].cid])
    assert replica.store.events.position_of(w.tenant, s["thread"].cid) is None
    assert apply(replica, w, s["thread"]) == Duplicate()
    assert replica.store.events.position_of(w.tenant, s["thread"].cid) is not None
    assert_log_matches_messages(snapshot(replica.store, w.tenant))
    # the protocol's configure too (dedup is by CID, whatever the interface)
    assert apply(replica, w, s["protocol"]) == Duplicate()


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_a_zero_byte_record_given_its_data_later_keeps_one_log_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """A 0-byte initial write admitted without its data is stored under its own CID; with its
    data, under the CID its ``encodedData: ""`` gives. The warp that attaches the data changes
    both stored CIDs, which share one log CID: the log keeps one entry for the message whichever
    of the two it looks at first (a set's order, which moved with the hash seed)."""
    looked: list[list[str]] = []
    reconcile = History._reconcile_log

    def in_order(self: History, tenant: str, tid: int, stored_cids: Any) -> None:
        cids = sorted(stored_cids, reverse=order == "reversed")
        looked.append(cids)
        reconcile(self, tenant, tid, cids)

    monkeypatch.setattr(History, "_reconcile_log", in_order)
    alice, clock = seeded("zero-byte-alice"), Clock("2030-01-01T00:00:00.000000Z")
    writes = []
    for data in (b"", b"after it"):
        now = clock.tick()
        writes.append((RecordsWrite.create(signer=alice, data=data, message_timestamp=now, date_created=now), data))
    (empty, _), (other, other_data) = writes
    replica = Dwn(Store(tmp_path / "replica.db"))
    assert replica.apply_replicated_message(alice.did, empty.message, None) == Superseded()
    assert isinstance(replica.apply_replicated_message(alice.did, other.message, other_data), Applied)
    assert isinstance(replica.apply_replicated_message(alice.did, empty.message, b""), Applied)
    assert any(len(cids) == 2 for cids in looked)  # the warp did see both stored CIDs
    assert replica.store.events.position_of(alice.did, empty.cid) is not None
    assert_log_matches_messages(snapshot(replica.store, alice.did))
    # and it is what a replica that got the data at once holds
    direct = Dwn(Store(tmp_path / "direct.db"))
    direct.apply_replicated_message(alice.did, empty.message, b"")
    direct.apply_replicated_message(alice.did, other.message, other_data)
    assert snapshot(replica.store, alice.did).messages == snapshot(direct.store, alice.did).messages
    replica.close()
    direct.close()


def test_a_record_dated_before_its_protocols_configure_is_superseded_not_deferred(tmp_path: Path) -> None:
    """A device whose clock ran behind wrote a record dated before the only configure of its
    protocol. At its canonical place there is no definition: the reference refuses it (400).
    Once that configure is here the refusal is the canonical one — Superseded, kept in the
    archive, the closure settled — not Incomplete for ever (a link that never settles). An
    earlier configure arriving later takes it up again (history full-11 of the order tests)."""
    alice, clock = seeded("skewed-alice"), Clock("2030-01-01T00:00:00.000000Z")
    definition = {"protocol": "https://p2psync.example/skew", "published": True,
                  "types": {"note": {}}, "structure": {"note": {}}}
    early, dated_before, late = clock.tick(), clock.tick(), clock.tick()
    first = ProtocolsConfigure.create(definition=definition, signer=alice, message_timestamp=early).message
    configure = ProtocolsConfigure.create(definition=definition, signer=alice, message_timestamp=late).message
    note = RecordsWrite.create(signer=alice, data=b"note", protocol=definition["protocol"], protocol_path="note",
                               data_format="text/plain", message_timestamp=dated_before, date_created=dated_before)
    replica = Dwn(Store(tmp_path / "replica.db"))
    missing = replica.apply_replicated_message(alice.did, note.message, b"note")
    assert isinstance(missing, Incomplete) and [type(r) for r in missing.missing] == [Protocol]  # none here yet
    assert isinstance(replica.apply_replicated_message(alice.did, configure), Applied)
    assert replica.apply_replicated_message(alice.did, note.message, b"note") == Superseded()
    assert not replica.store.messages.has(alice.did, note.cid)
    # The earlier configure (replaced by the later one, so Superseded itself): now the record
    # is authorized at its place, and stored.
    assert replica.apply_replicated_message(alice.did, first) == Superseded()
    assert replica.store.messages.has(alice.did, note.cid)
    assert replica.apply_replicated_message(alice.did, note.message, b"note") == Duplicate()
    replica.close()


def test_a_chat_dated_before_the_role_record_it_invokes_is_superseded_not_deferred(replica: Dwn) -> None:
    """carol's chat invokes her participant role, but is dated before the role record (or the
    same second and before it by CID: history full-56 of the order tests): at its place the
    reference finds no role (401). With the role record here, that refusal is the canonical
    one: Superseded, not Incomplete for ever. The role record was only visible in the archive:
    at the chat's place a warp has it undone in the state."""
    w = chat_world()
    s = w.steps
    ctx = s["thread"].message["contextId"]
    role_at = s["participant"].message["descriptor"]["messageTimestamp"]
    thread_at = s["thread"].message["descriptor"]["messageTimestamp"]
    before = thread_at[:-7] + "500000Z"  # half a second after the thread, before the role record
    early_chat = RecordsWrite.create(signer=w.carol, data=b"too soon", protocol=CHAT, protocol_path="thread/chat",
                                     parent_context_id=ctx, protocol_role="thread/participant",
                                     data_format="application/octet-stream", message_timestamp=before,
                                     date_created=before)
    assert thread_at < before < role_at
    for name in ("protocol", "thread", "participant"):
        assert apply(replica, w, s[name]).kind == "Applied"
    assert replica.apply_replicated_message(w.tenant, early_chat.message, b"too soon") == Superseded()
    assert not replica.store.messages.has(w.tenant, early_chat.cid)
    assert apply(replica, w, s["chat"]).kind == "Applied"  # the chat after the role record is held


def test_superseded_by_a_newer_write(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    older = RecordsWrite.create_from(
        s["note"].message, signer=w.bob, data=b"older", message_timestamp="2030-05-01T00:00:06.500000Z"
    )
    for name in ("protocol", "note", "note-update"):
        assert apply(replica, w, s[name]).kind == "Applied"
    before = snapshot(replica.store, w.tenant)
    assert replica.apply_replicated_message(w.tenant, older.message, b"older") == Superseded()
    assert snapshot(replica.store, w.tenant) == before


def test_write_beaten_by_a_delete_is_superseded(tmp_path: Path) -> None:
    """Two replicas: one deleted the note, the other updated it later without seeing the delete.

    In canonical order the update comes after the delete, and the reference refuses a write
    after a delete: the update is admitted (archived) but never part of the state.
    """
    w = chat_world()
    s = w.steps
    deleted = Dwn(Store(tmp_path / "a.db"))
    for name in ("protocol", "note", "note-delete"):
        assert apply(deleted, w, s[name]).kind == "Applied"
    before = snapshot(deleted.store, w.tenant)
    late = RecordsWrite.create_from(s["note"].message, signer=w.bob, data=b"late", message_timestamp=w.clock.tick())
    wrong = deleted.apply_replicated_message(w.tenant, late.message, b"late!")
    assert isinstance(wrong, Invalid) and wrong.reason.startswith("RecordsWriteDataCidMismatch")
    assert deleted.apply_replicated_message(w.tenant, late.message) == Superseded()
    assert deleted.history.holds(w.tenant, late.cid)
    # its data, arriving later, is kept with it; the verdict stands
    assert deleted.apply_replicated_message(w.tenant, late.message, b"late") == Superseded()
    assert deleted.history.archived_data(w.tenant, late.cid) == (True, b"late")
    read = deleted.process_message(w.tenant, create_records_read(signer=w.alice, filter={"recordId": late.record_id}))
    assert read.code == 404  # still deleted
    assert deleted.apply_replicated_message(w.tenant, late.message, b"late") == Duplicate()
    assert snapshot(deleted.store, w.tenant) == before


# --------------------------------------------------------------------------- Invalid


def test_invalid_signature_and_structure(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    apply(replica, w, s["protocol"])
    forged = json.loads(json.dumps(s["thread"].message))
    sig = forged["authorization"]["signature"]["signatures"][0]
    sig["signature"] = b64url_encode(bytes(64))
    result = replica.apply_replicated_message(w.tenant, forged, s["thread"].data)
    assert isinstance(result, Invalid) and result.reason.startswith("GeneralJwsVerifierInvalidSignature")
    no_method = {"descriptor": {"interface": "Records"}}
    assert replica.apply_replicated_message(w.tenant, no_method) == Invalid(
        "Both interface and method must be present, interface: Records, method: undefined"
    )
    assert replica.apply_replicated_message(w.tenant, "not a message").kind == "Invalid"
    # a query is never something to replicate
    query = create_records_read(signer=w.alice, filter={"recordId": s["thread"].message["recordId"]})
    assert replica.apply_replicated_message(w.tenant, query).kind == "Invalid"
    assert replica.store.messages.count(w.tenant) == 1


def test_delete_of_an_already_deleted_record_is_superseded(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    for name in ("protocol", "note", "note-delete"):
        apply(replica, w, s[name])
    from p2psync.dwn.records import create_records_delete

    again = create_records_delete(
        record_id=s["note"].message["recordId"], signer=w.alice, message_timestamp=w.clock.tick()
    )
    # the record is here (deleted): nothing is missing; in canonical order the reference
    # refuses the second delete (404), so it is admitted but changes nothing
    before = snapshot(replica.store, w.tenant)
    assert replica.apply_replicated_message(w.tenant, again) == Superseded()
    assert snapshot(replica.store, w.tenant) == before


# --------------------------------------------------------------------------- Deferred


def test_deferred_for_a_tenant_not_served_here(tmp_path: Path) -> None:
    w = chat_world()
    s = w.steps
    gated = Dwn(Store(tmp_path / "gated.db"), tenant_gate=lambda did: did != w.alice.did)
    assert apply(gated, w, s["protocol"]) == Deferred("tenant-inactive")
    assert gated.store.messages.count(w.tenant) == 0
    plain = Dwn(Store(tmp_path / "plain.db"))
    assert apply(plain, w, s["protocol"]).kind == "Applied"
    plain.store.set_tenant_active(w.tenant, False)
    assert apply(plain, w, s["thread"]) == Deferred("tenant-inactive")
    plain.store.set_tenant_active(w.tenant, True)
    assert apply(plain, w, s["thread"]).kind == "Applied"


def test_deferred_when_the_signing_key_cannot_be_resolved(replica: Dwn) -> None:
    w = chat_world()
    # the kid names no verification method of the DID document
    wrong_kid = Identity(w.alice.did, f"{w.alice.did}#not-a-key", w.alice.private_key)
    write = RecordsWrite.create(signer=wrong_kid, data=b"x", message_timestamp=w.clock.tick(), date_created=w.clock.now)
    assert replica.apply_replicated_message(w.tenant, write.message, b"x") == Deferred("resolver-unavailable")


def test_deferred_on_storage_errors(replica: Dwn) -> None:
    w = chat_world()
    # permission-request data that is not JSON makes the reference throw; the data is bad
    # whatever else is here, so it is refused up front and nothing is kept
    request = RecordsWrite.create(
        signer=w.bob,
        data=b"not json",
        data_format="application/json",
        protocol=permissions.PERMISSIONS_PROTOCOL_URI,
        protocol_path="request",
        message_timestamp=w.clock.tick(),
        date_created=w.clock.now,
    )
    bad = replica.apply_replicated_message(w.tenant, request.message, b"not json")
    assert isinstance(bad, Invalid) and "not valid JSON" in bad.reason
    assert not replica.history.holds(w.tenant, request.cid)
    # a store that cannot be written
    replica.store.conn.execute("PRAGMA query_only=1")
    assert apply(replica, w, w.steps["protocol"]) == Deferred("storage")


# --------------------------------------------------------------------------- mappings and the pipe


def test_telemetry_status_of_each_kind() -> None:
    results: list[ReplicationApplyResult] = [
        Applied(),
        Duplicate(),
        Superseded(),
        Incomplete((Protocol(protocol=CHAT),)),
        Invalid("x"),
        Deferred("storage"),
    ]
    assert [telemetry_status(r) for r in results] == [202, 409, 409, 424, 400, 503]


def test_pipe_apply_op(replica: Dwn) -> None:
    w = chat_world()
    s = w.steps
    session = PipeSession(
        replica, lambda tenant, message, data: apply_replicated_message_json(replica, tenant, message, data)
    )

    def line(step: Step) -> str:
        request: dict[str, Any] = {"op": "apply", "tenant": w.tenant, "message": step.message}
        if step.data is not None:
            request["data"] = b64url_encode(step.data)
        return json.dumps(request)

    assert session.handle_line(line(s["thread"])) == {
        "cid": s["thread"].cid,
        "result": {"kind": "Incomplete", "missing": [{"type": "Protocol", "protocol": CHAT}]},
    }
    reply = session.handle_line(line(s["protocol"]))
    assert reply["cid"] == s["protocol"].cid and reply["result"]["kind"] == "Applied"
    assert set(reply["result"]["position"]) == {"streamId", "epoch", "position", "messageCid"}
    assert session.handle_line(line(s["protocol"])) == {"cid": s["protocol"].cid, "result": {"kind": "Duplicate"}}


# --------------------------------------------------------------------------- helpers


def test_message_cid_of_steps_is_stable() -> None:
    # the worlds are deterministic: the same CIDs on every run (tests name messages by them)
    assert (
        chat_world().steps["chat"].cid
        == chat_world().steps["chat"].cid
        == message_cid(chat_world().steps["chat"].message)
    )


def test_the_engines_pipe_process_serves_apply(tmp_path: Path) -> None:
    import subprocess
    import sys

    w = chat_world()
    s = w.steps
    lines = []
    for name in ("thread", "protocol", "thread"):
        step = s[name]
        request: dict[str, Any] = {"op": "apply", "tenant": w.tenant, "message": step.message}
        if step.data is not None:
            request["data"] = b64url_encode(step.data)
        lines.append(json.dumps(request))
    done = subprocess.run(
        [sys.executable, "-m", "p2psync", "dwn", "pipe", "--store", str(tmp_path / "pipe.db")],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["result"]["kind"] for r in replies] == ["Incomplete", "Applied", "Applied"]
    assert [r["cid"] for r in replies] == [s["thread"].cid, s["protocol"].cid, s["thread"].cid]
