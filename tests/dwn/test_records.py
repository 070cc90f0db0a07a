"""Records flows through the engine: the reference's status codes for writes, reads, deletes."""

from __future__ import annotations

import copy
import hashlib
import os

from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import b64url_encode, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records import create_records_delete, create_records_query, create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.timeutil import now_timestamp


def _write(signer: Identity, data: bytes, **kw: object) -> RecordsWrite:
    return RecordsWrite.create(signer=signer, data=data, data_format="text/plain", **kw)  # type: ignore[arg-type]


def _read(dwn: Dwn, tenant: str, reader: Identity | None, record_id: str) -> object:
    return dwn.process_message(tenant, create_records_read(signer=reader, filter={"recordId": record_id}))


def test_write_then_read_round_trips_data(dwn: Dwn, alice: Identity) -> None:
    data = b"hello, replica"
    w = _write(alice, data)
    assert dwn.process_message(alice.did, w.message, data).code == 202
    reply = _read(dwn, alice.did, alice, w.record_id)
    assert reply.code == 200  # type: ignore[attr-defined]
    assert reply.data == data  # type: ignore[attr-defined]
    assert message_cid(reply.entry["recordsWrite"]) == message_cid(w.message)  # type: ignore[attr-defined]


def test_initial_write_without_data_is_204_and_then_data_only_with_newer_write(dwn: Dwn, alice: Identity) -> None:
    data = b"later"
    w = _write(alice, data)
    assert dwn.process_message(alice.did, w.message).code == 204
    # The identical message with its data now conflicts: data can only come with a newer write.
    assert dwn.process_message(alice.did, w.message, data).code == 409
    update = RecordsWrite.create_from(w.message, signer=alice, data=data)
    assert dwn.process_message(alice.did, update.message, data).code == 202
    assert _read(dwn, alice.did, alice, w.record_id).data == data  # type: ignore[attr-defined]


def test_newest_write_wins_older_and_replay_conflict(dwn: Dwn, alice: Identity) -> None:
    w1 = _write(alice, b"v1")
    assert dwn.process_message(alice.did, w1.message, b"v1").code == 202
    w2 = RecordsWrite.create_from(w1.message, signer=alice, data=b"v2")
    w3 = RecordsWrite.create_from(w1.message, signer=alice, data=b"v3")
    assert dwn.process_message(alice.did, w3.message, b"v3").code == 202
    assert dwn.process_message(alice.did, w2.message, b"v2").code == 409  # older than newest
    assert dwn.process_message(alice.did, w3.message, b"v3").code == 409  # replay
    assert _read(dwn, alice.did, alice, w1.record_id).data == b"v3"  # type: ignore[attr-defined]


def test_update_without_data_reuses_previous_inline_data(dwn: Dwn, alice: Identity) -> None:
    w1 = _write(alice, b"keep me")
    assert dwn.process_message(alice.did, w1.message, b"keep me").code == 202
    w2 = RecordsWrite.create_from(w1.message, signer=alice, published=True)
    assert dwn.process_message(alice.did, w2.message).code == 202
    assert _read(dwn, alice.did, alice, w1.record_id).data == b"keep me"  # type: ignore[attr-defined]


def test_data_mismatch_is_refused_and_stores_nothing(dwn: Dwn, alice: Identity) -> None:
    w = _write(alice, b"the real data")
    reply = dwn.process_message(alice.did, w.message, b"other data!!!")
    assert reply.code == 400
    assert reply.detail.startswith("RecordsWriteDataCidMismatch")
    assert dwn.store.messages.count(alice.did) == 0
    assert dwn.store.events.count(alice.did) == 0


def test_large_data_goes_to_data_store_and_reads_back(dwn: Dwn, alice: Identity) -> None:
    data = os.urandom(300_000)  # above both the inline limit and one UnixFS chunk
    w = _write(alice, data)
    assert dwn.process_message(alice.did, w.message, data).code == 202
    assert dwn.store.data.size(alice.did, w.record_id, w.descriptor["dataCid"]) == len(data)
    reply = _read(dwn, alice.did, alice, w.record_id)
    assert hashlib.sha256(reply.data).digest() == hashlib.sha256(data).digest()  # type: ignore[attr-defined]


def test_delete_then_replay_is_404_and_write_after_delete_is_400(dwn: Dwn, alice: Identity) -> None:
    w = _write(alice, b"x")
    assert dwn.process_message(alice.did, w.message, b"x").code == 202
    delete = create_records_delete(record_id=w.record_id, signer=alice)
    assert dwn.process_message(alice.did, delete).code == 202
    assert dwn.process_message(alice.did, delete).code == 404
    later = RecordsWrite.create_from(w.message, signer=alice, data=b"y", message_timestamp=now_timestamp())
    reply = dwn.process_message(alice.did, later.message, b"y")
    assert reply.code == 400 and reply.detail.startswith("RecordsWriteNotAllowedAfterDelete")
    assert _read(dwn, alice.did, alice, w.record_id).code == 404  # type: ignore[attr-defined]


def test_delete_of_missing_record_is_404(dwn: Dwn, alice: Identity) -> None:
    delete = create_records_delete(record_id="bafyreigmissingmissingmissingmissingmissingmissingmiss", signer=alice)
    assert dwn.process_message(alice.did, delete).code == 404


def test_non_owner_write_without_protocol_is_unauthorized(dwn: Dwn, alice: Identity, bob: Identity) -> None:
    w = _write(bob, b"intruder")
    reply = dwn.process_message(alice.did, w.message, b"intruder")
    assert reply.code == 401
    assert dwn.store.messages.count(alice.did) == 0


def test_forged_signature_is_401_and_tampered_descriptor_is_refused(dwn: Dwn, alice: Identity) -> None:
    w = _write(alice, b"signed")
    forged = copy.deepcopy(w.message)
    sig = forged["authorization"]["signature"]["signatures"][0]
    raw = bytearray(sig["signature"].encode())
    raw[5] = ord("A") if raw[5] != ord("A") else ord("B")
    sig["signature"] = raw.decode()
    assert dwn.process_message(alice.did, forged, b"signed").code == 401
    tampered = copy.deepcopy(w.message)
    tampered["descriptor"]["dataFormat"] = "application/json"
    assert dwn.process_message(alice.did, tampered, b"signed").code == 400  # descriptorCid mismatch
    assert dwn.store.messages.count(alice.did) == 0


def test_unknown_property_is_rejected(dwn: Dwn, alice: Identity) -> None:
    w = _write(alice, b"x")
    message = copy.deepcopy(w.message)
    message["descriptor"]["colour"] = "blue"
    reply = dwn.process_message(alice.did, message, b"x")
    assert reply.code == 400 and "SchemaValidator" in reply.detail


def test_published_records_readable_by_anyone_unpublished_only_by_owner_and_recipient(
    dwn: Dwn, alice: Identity, bob: Identity, carol: Identity
) -> None:
    public = _write(alice, b"public", published=True)
    private = _write(alice, b"private")
    for_bob = _write(alice, b"for bob", recipient=bob.did)
    for w, d in ((public, b"public"), (private, b"private"), (for_bob, b"for bob")):
        assert dwn.process_message(alice.did, w.message, d).code == 202
    assert _read(dwn, alice.did, None, public.record_id).code == 200  # type: ignore[attr-defined]
    assert _read(dwn, alice.did, carol, private.record_id).code == 401  # type: ignore[attr-defined]
    assert _read(dwn, alice.did, bob, for_bob.record_id).code == 200  # type: ignore[attr-defined]
    # A non-owner's query sees published records and those addressed to it, nothing else.
    reply = dwn.process_message(alice.did, create_records_query(signer=bob, filter={"dataFormat": "text/plain"}))
    assert reply.code == 200
    assert {e["recordId"] for e in reply.entries or []} == {public.record_id, for_bob.record_id}


def test_owner_query_sort_and_pagination(dwn: Dwn, alice: Identity) -> None:
    writes = []
    for i in range(5):
        w = _write(alice, f"n{i}".encode(), schema="https://example.org/note")
        assert dwn.process_message(alice.did, w.message, f"n{i}".encode()).code == 202
        writes.append(w)
    q = create_records_query(signer=alice, filter={"schema": "https://example.org/note"},
                             date_sort="createdAscending", pagination={"limit": 2})
    first = dwn.process_message(alice.did, q)
    assert first.code == 200 and len(first.entries or []) == 2 and first.cursor is not None
    q2 = create_records_query(signer=alice, filter={"schema": "https://example.org/note"},
                              date_sort="createdAscending", pagination={"limit": 10, "cursor": first.cursor})
    rest = dwn.process_message(alice.did, q2)
    seen = [e["recordId"] for e in (first.entries or []) + (rest.entries or [])]
    assert sorted(seen) == sorted(w.record_id for w in writes)
    assert len(seen) == len(set(seen)) == 5


def test_zero_byte_record_keeps_empty_encoded_data_out_of_nothing(dwn: Dwn, alice: Identity) -> None:
    w = _write(alice, b"")
    assert dwn.process_message(alice.did, w.message, b"").code == 202
    reply = _read(dwn, alice.did, alice, w.record_id)
    assert reply.code == 200 and reply.data == b""  # type: ignore[attr-defined]


def test_event_log_positions_increase_and_survive_reopen(tmp_path: object, alice: Identity) -> None:
    from pathlib import Path

    from p2psync.dwn.store import Store

    path = Path(str(tmp_path)) / "s.db"
    dwn = Dwn(Store(path))
    for i in range(3):
        w = _write(alice, bytes([i]))
        assert dwn.process_message(alice.did, w.message, bytes([i])).code == 202
    stream = dwn.store.events.stream(alice.did)
    positions = [p for p, _ in dwn.store.events.read(alice.did)]
    dwn.close()
    again = Dwn(Store(path))
    assert again.store.events.stream(alice.did) == stream  # streamId and epoch are stable
    w = _write(alice, b"next")
    assert again.process_message(alice.did, w.message, b"next").code == 202
    later = [p for p, _ in again.store.events.read(alice.did)]
    again.close()
    assert positions == [1, 2, 3] and later == [1, 2, 3, 4]


def test_bad_inline_base64_never_reaches_store(dwn: Dwn, alice: Identity) -> None:
    w = _write(alice, b"abc")
    message = {**w.message, "encodedData": b64url_encode(b"abc") + "="}
    reply = dwn.process_message(alice.did, message, b"abc")
    assert reply.code == 400
    assert dwn.store.messages.count(alice.did) == 0


def _stored_row(dwn: Dwn, cid: str) -> tuple[int, dict[str, object], dict[str, object]] | None:
    """(rowid, body, indexes) of the messages row stored under ``cid``."""
    import json

    row = dwn.store.conn.execute("SELECT id, body, indexes FROM messages WHERE cid=?", (cid,)).fetchone()
    return None if row is None else (int(row[0]), json.loads(row[1]), json.loads(row[2]))


def _journaled(dwn: Dwn, cid: str) -> list[int]:
    return [int(d) for (d,) in dwn.store.conn.execute("SELECT delta FROM set_journal WHERE cid=? ORDER BY seq", (cid,))]


def test_an_update_demotes_the_initial_write_in_place(dwn: Dwn, alice: Identity) -> None:
    """An update leaves the record's initial write stored, less its data and no longer its
    latest state, in the very row it had (the reference deletes and puts it again; the
    state is the same, less the index rewrites, issue #17); later updates leave it as it is."""
    w1 = _write(alice, b"v1")
    assert dwn.process_message(alice.did, w1.message, b"v1").code == 202
    initial_cid = message_cid(w1.message)
    before = _stored_row(dwn, initial_cid)
    assert before is not None and before[1]["encodedData"] and before[2]["isLatestBaseState"] is True
    previous = w1.message
    for i in range(2, 5):
        update = RecordsWrite.create_from(previous, signer=alice, data=f"v{i}".encode())
        assert dwn.process_message(alice.did, update.message, f"v{i}".encode()).code == 202
        after = _stored_row(dwn, initial_cid)
        assert after is not None
        assert after[0] == before[0]  # the same row, not a new one
        assert "encodedData" not in after[1] and after[2]["isLatestBaseState"] is False
        assert {k: v for k, v in before[1].items() if k != "encodedData"} == after[1]
        if previous is not w1.message:  # the update before is gone, with its log entry
            assert _stored_row(dwn, message_cid(previous)) is None
            assert dwn.store.events.position_of(alice.did, message_cid(previous)) is None
        previous = update.message
    # Never taken out of the stored set and put back, so the set digests see no churn.
    assert _journaled(dwn, initial_cid) == [1]
    assert _read(dwn, alice.did, alice, w1.record_id).data == b"v4"  # type: ignore[attr-defined]


def test_an_update_of_a_zero_byte_record_stores_its_initial_write_under_its_own_cid(
    dwn: Dwn, alice: Identity
) -> None:
    """A 0-byte initial write is stored under the CID of the message with ``encodedData: ""``;
    demoted, it has no encodedData, so it moves to its own CID, as in the reference."""
    w1 = _write(alice, b"")
    assert dwn.process_message(alice.did, w1.message, b"").code == 202
    with_empty = message_cid({**w1.message, "encodedData": ""})
    own = message_cid(w1.message)
    assert with_empty != own and _stored_row(dwn, with_empty) is not None
    update = RecordsWrite.create_from(w1.message, signer=alice, data=b"now some")
    assert dwn.process_message(alice.did, update.message, b"now some").code == 202
    assert _stored_row(dwn, with_empty) is None
    demoted = _stored_row(dwn, own)
    assert demoted is not None and demoted[2]["isLatestBaseState"] is False and "encodedData" not in demoted[1]
    assert _journaled(dwn, with_empty) == [1, -1] and _journaled(dwn, own) == [1]
