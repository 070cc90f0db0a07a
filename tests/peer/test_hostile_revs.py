"""A pusher that sends a malformed `rev` must not stall the connection (issue #15).

Reported: after one `rev` was answered ``400 BodyInvalid``, the next `rev` on that connection got
no reply. The active side here is driven by hand over a real connection: hello and
getCollections through a Peer's session, then raw ``proposeChanges`` and ``rev`` requests. With
these five malformed shapes the next `rev`s are answered (the report's exact shape is unknown;
this keeps the behaviour that must hold).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from p2psync import blip
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.scope import SyncScope
from p2psync.replication.source import message_entry
from p2psync.replication.wire import APP_ID, decode_body, encode_body
from tests.peer.support import Clock, new_store, seeded, served, write_notes

ALICE = seeded("hostile-revs")


def listing(store: Store) -> tuple[dict[str, object], list[tuple[str, str, dict[str, object]]]]:
    """The proposeChanges body for everything in ``store``'s log, and (position, cid, message)."""
    stream_id, epoch = store.events.stream(ALICE.did)
    rows = store.events.read(ALICE.did, after=-1)
    # The store keeps small data inline in the message (`encodedData`); a rev carries it apart.
    messages = [(str(p), c, _without_inline_data(store.messages.get(ALICE.did, c))) for p, c in rows]
    items = [[p, c, m["recordId"]] for p, c, m in messages if m is not None]
    return {"streamId": stream_id, "epoch": epoch, "items": items}, [(p, c, m) for p, c, m in messages if m]


def _without_inline_data(message: dict[str, object] | None) -> dict[str, object] | None:
    return None if message is None else {k: v for k, v in message.items() if k != "encodedData"}


BAD_REVS = {
    "not CBOR": b"\xff\xfe not cbor",
    "message not a map": encode_body({"message": "not a map"}),
    "not a map": encode_body([1, 2]),
    "negative dataSize": encode_body({"message": {"descriptor": {}}, "dataSize": -1}),
    "data and dataSize disagree": encode_body({"message": {"descriptor": {}}, "dataSize": 5, "data": b"xy"}),
}


@pytest.mark.parametrize("bad", list(BAD_REVS.values()), ids=list(BAD_REVS))
async def test_a_malformed_rev_is_refused_and_the_next_one_is_answered(tmp_path: Path, bad: bytes) -> None:
    source = new_store(tmp_path, "source")
    write_notes(source, ALICE, 3, clock=Clock())
    body, messages = listing(source)
    sink = new_store(tmp_path, "sink")
    pusher = Peer(source, ALICE)
    async with served(Peer(sink, ALICE)) as url, blip.connect(url, app_id=APP_ID,
                                                              handlers=pusher.handlers(active=True)) as conn:
        session = pusher.session_for(conn, active=True)
        await session.hello()
        index, _ = await session.run(session.proto.open_collection(ALICE.did, SyncScope.global_scope(), "cp-hostile"))
        reply = await conn.request("proposeChanges", {"collection": str(index)}, encode_body(body))
        assert decode_body(reply.body, empty_map=False) in ([], [0, 0, 0])  # send all three
        (p1, c1, _), (p2, c2, m2), (p3, c3, m3) = messages
        with trio.fail_after(5), pytest.raises(blip.BlipError) as info:
            await conn.request("rev", {"collection": str(index), "position": p1, "messageCid": c1}, bad)
        assert any(f"P2PSync {code}" in str(info.value) for code in (400, 424))  # BodyInvalid, AttachmentInvalid
        for position, cid, message in ((p2, c2, m2), (p3, c3, m3)):
            data = source.data.get(ALICE.did, str(message["recordId"]), str(message["descriptor"]["dataCid"]))
            entry = encode_body(message_entry(ReplicationEntry(message, data)))
            with trio.fail_after(5):  # used to hang: no reply at all
                answer = await conn.request("rev", {"collection": str(index), "position": position,
                                                    "messageCid": cid}, entry)
            assert decode_body(answer.body)["kind"] == "Applied"
    assert sorted(Store(tmp_path / "sink.db").messages.cids(ALICE.did)) == sorted([c2, c3])
