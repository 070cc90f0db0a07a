"""MessagesQuery / MessagesRead / MessagesSubscribe and RecordsSubscribe on a real store.

Expected codes are the reference's (dwn-sdk-js 0.5.2): the same cases run through it in
``interop/scenarios/messages-interface.json`` (pipe, no event stream) and, for subscriptions
with an event stream, through a reference DWN built with ``EventEmitterStream``.
"""

from __future__ import annotations

import base64
import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn import messages_interface as msg
from p2psync.dwn import permissions as perms
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import compute_cid, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.events import LocalEventStream, MessageEvent
from p2psync.dwn.handlers.messages_handlers import (
    SubscriptionReply,
    handle_messages_subscribe,
    handle_records_subscribe,
)
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_authorization, create_records_delete
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.reply import HandlerContext, Reply
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import add_seconds

CHAT = "https://example.com/chat"
OTHER = "https://example.com/other"
EPOCH = "2030-01-01T00:00:00.000000Z"
FEB_30 = "2030-02-30T00:00:00.000000Z"
#: Larger than the reference's inline limit (30,000 bytes): kept in the data store.
LARGE = 40_000


class Clock:
    """Strictly increasing timestamps, one second apart."""

    def __init__(self) -> None:
        self.seconds = 0

    def __call__(self) -> str:
        self.seconds += 1
        return add_seconds(EPOCH, self.seconds)


def _detail_code(reply: Reply) -> str:
    return reply.detail.split(":", 1)[0]


def _cids(reply: Reply) -> list[str]:
    assert reply.code == 200, reply.detail
    return [e["cid"] for e in reply.entries or []]


def _configure(dwn: Dwn, signer: Identity, protocol: str, when: str) -> dict[str, Any]:
    definition = {
        "protocol": protocol,
        "published": True,
        "types": {"thread": {}, "reply": {}},
        "structure": {"thread": {"reply": {}}},
    }
    message = ProtocolsConfigure.create(
        definition=definition, signer=signer, message_timestamp=when
    ).message
    assert dwn.process_message(signer.did, message).code == 202
    return message


def _write(
    dwn: Dwn, signer: Identity, data: bytes | None, when: str, *, send_data: bool = True, **kw: Any
) -> dict[str, Any]:
    write = RecordsWrite.create(
        signer=signer,
        data=data if data is not None else b"",
        data_format="text/plain",
        message_timestamp=when,
        date_created=when,
        **kw,
    )
    reply = dwn.process_message(signer.did, write.message, (data or b"") if send_data else None)
    assert reply.code in (202, 204), reply.detail
    return write.message


def _grant(
    dwn: Dwn, alice: Identity, bob: Identity, scope: dict[str, Any], when: str, expires: str
) -> tuple[dict[str, Any], bytes]:
    write, data = perms.create_grant(
        signer=alice, granted_to=bob.did, date_granted=when, date_expires=expires, scope=scope
    )
    assert dwn.process_message(alice.did, write.message, data).code == 202
    return write.message, data


def _signed(
    descriptor: dict[str, Any], signer: Identity, grant_id: str | None = None
) -> dict[str, Any]:
    """A message over any descriptor (authoring would refuse or normalize some)."""
    return {
        "descriptor": descriptor,
        "authorization": create_authorization(descriptor, signer, permission_grant_id=grant_id),
    }


@pytest.fixture
def clock() -> Clock:
    return Clock()


# --------------------------------------------------------------------------- MessagesQuery


def test_query_lists_the_log_in_order_and_filters_it(
    dwn: Dwn, alice: Identity, clock: Clock
) -> None:
    config = _configure(dwn, alice, CHAT, clock())
    flat = _write(dwn, alice, b"flat", clock())
    thread = _write(dwn, alice, b"thread", clock(), protocol=CHAT, protocol_path="thread")
    no_data = _write(dwn, alice, b"later", clock(), send_data=False)
    every = [message_cid(m) for m in (config, flat, thread, no_data)]

    def query(filters: list[dict[str, Any]] | None = None) -> Reply:
        return dwn.process_message(
            alice.did,
            msg.create_messages_query(signer=alice, filters=filters, message_timestamp=clock()),
        )

    everything = query()
    assert _cids(everything) == every  # a 204 write is logged too
    assert everything.cursor == {
        "messageCid": every[-1],
        "value": dwn.store.events.position_of(alice.did, every[-1]),
    }
    assert _cids(query([{"interface": "Protocols"}])) == every[:1]
    assert _cids(query([{"interface": "Records", "method": "Write"}])) == every[1:]
    assert _cids(query([{"protocol": CHAT}])) == [every[0], every[2]]
    t = thread["descriptor"]["messageTimestamp"]
    assert _cids(query([{"messageTimestamp": {"from": t}}])) == every[2:]
    assert _cids(query([{"messageTimestamp": {"to": t}}])) == every[:2]
    assert _cids(query([{"method": "Delete"}])) == []
    assert query([{"method": "Delete"}]).cursor is None
    # filters are OR'ed, each lists in log order
    assert _cids(query([{"method": "Configure"}, {"protocol": CHAT}])) == [every[0], every[2]]


def test_query_cursor_resumes_after_the_last_entry_even_when_it_left_the_log(
    dwn: Dwn, alice: Identity, clock: Clock
) -> None:
    first = _write(dwn, alice, b"one", clock())
    update = RecordsWrite.create_from(
        source=first, signer=alice, data=b"two", message_timestamp=clock()
    ).message
    assert dwn.process_message(alice.did, update, b"two").code == 202
    page = dwn.process_message(
        alice.did, msg.create_messages_query(signer=alice, message_timestamp=clock())
    )
    assert _cids(page) == [message_cid(first), message_cid(update)]
    cursor = page.cursor
    assert cursor is not None

    # the update the cursor points at is superseded: its event leaves the log
    newer = RecordsWrite.create_from(
        source=update, signer=alice, data=b"three", message_timestamp=clock()
    ).message
    assert dwn.process_message(alice.did, newer, b"three").code == 202
    later = _write(dwn, alice, b"four", clock())
    resumed = dwn.process_message(
        alice.did, msg.create_messages_query(signer=alice, cursor=cursor, message_timestamp=clock())
    )
    assert _cids(resumed) == [message_cid(newer), message_cid(later)]
    assert resumed.cursor is not None
    end = dwn.process_message(
        alice.did,
        msg.create_messages_query(signer=alice, cursor=resumed.cursor, message_timestamp=clock()),
    )
    assert _cids(end) == [] and end.cursor is None


def test_event_log_cursor_compares_keys_like_the_reference(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    tenant = "did:example:t"
    for cid in ("bafy-b", "bafy-a", "bafy-c"):
        store.events.append(tenant, cid, {"interface": "Records"})
    log = store.events
    assert log.query(tenant, [], {"messageCid": "bafy-z", "value": 1})[0] == ["bafy-a", "bafy-c"]
    # same position, smaller CID: the entry at the cursor's position is still after it
    assert log.query(tenant, [], {"messageCid": "bafy-0", "value": 1})[0] == [
        "bafy-b",
        "bafy-a",
        "bafy-c",
    ]
    # a string value encodes with a leading quote, before every (digit-encoded) position
    assert log.query(tenant, [], {"messageCid": "x", "value": "~"})[0] == [
        "bafy-b",
        "bafy-a",
        "bafy-c",
    ]
    assert log.query(tenant, [], {"messageCid": "x", "value": -5})[0] == [
        "bafy-b",
        "bafy-a",
        "bafy-c",
    ]
    assert log.query(tenant, [], {"messageCid": "x", "value": 3}) == ([], None)
    assert log.query(tenant, [{"interface": "Protocols"}]) == ([], None)
    store.events.append(tenant, "bafy-d", {"interface": "Records", "protocol": "Records"})
    # one-of lists; a value present in the text but under another property does not match
    assert log.query(tenant, [{"protocol": ["x", "Records"]}])[0] == ["bafy-d"]
    assert log.query(tenant, [{"interface": "Protocols"}, {"protocol": "Records"}])[0] == ["bafy-d"]
    assert log.query(tenant, [{"method": "Records"}]) == ([], None)
    assert log.query("did:example:nobody", []) == ([], None)
    store.close()


def test_superseded_pruned_and_reconfigured_messages_leave_the_log(
    dwn: Dwn, alice: Identity, clock: Clock
) -> None:
    config = _configure(dwn, alice, CHAT, clock())
    thread = _write(dwn, alice, b"t", clock(), protocol=CHAT, protocol_path="thread")
    reply = _write(
        dwn,
        alice,
        b"r",
        clock(),
        protocol=CHAT,
        protocol_path="thread/reply",
        parent_context_id=thread["contextId"],
    )
    prune = create_records_delete(
        record_id=thread["recordId"], signer=alice, message_timestamp=clock(), prune=True
    )
    assert dwn.process_message(alice.did, prune).code == 202
    config2 = ProtocolsConfigure.create(
        definition={
            **config["descriptor"]["definition"],
            "types": {"thread": {}, "reply": {}, "x": {}},
        },
        signer=alice,
        message_timestamp=clock(),
    ).message
    assert dwn.process_message(alice.did, config2).code == 202
    listed = dwn.process_message(
        alice.did, msg.create_messages_query(signer=alice, message_timestamp=clock())
    )
    assert _cids(listed) == [message_cid(thread), message_cid(prune), message_cid(config2)]
    assert message_cid(reply) not in _cids(listed)


def test_query_by_others_needs_a_grant_scoped_to_every_filter(
    dwn: Dwn, alice: Identity, bob: Identity, carol: Identity, clock: Clock
) -> None:
    config = _configure(dwn, alice, CHAT, clock())
    other = _configure(dwn, alice, OTHER, clock())
    thread = _write(dwn, alice, b"t", clock(), protocol=CHAT, protocol_path="thread")
    start = clock()
    grant, _ = _grant(
        dwn,
        alice,
        bob,
        {"interface": "Messages", "method": "Query", "protocol": CHAT},
        start,
        add_seconds(start, 600),
    )
    grant_id = grant["recordId"]

    def query(
        signer: Identity, filters: list[dict[str, Any]] | None, when: str | None = None
    ) -> Reply:
        m = msg.create_messages_query(
            signer=signer,
            filters=filters,
            permission_grant_id=grant_id,
            message_timestamp=when or clock(),
        )
        return dwn.process_message(alice.did, m)

    no_grant = dwn.process_message(
        alice.did, msg.create_messages_query(signer=bob, message_timestamp=clock())
    )
    assert (no_grant.code, _detail_code(no_grant)) == (401, "MessagesQueryAuthorizationFailed")
    # the grant itself is a permission record tagged with the chat protocol
    assert _cids(query(bob, [{"protocol": CHAT}])) == [
        message_cid(config),
        message_cid(thread),
        message_cid(grant),
    ]
    mixed = query(bob, [{"protocol": CHAT}, {"protocol": OTHER}])
    assert (mixed.code, _detail_code(mixed)) == (401, "EventsGrantAuthorizationMismatchedProtocol")
    assert query(bob, [{"interface": "Records"}]).code == 401
    # the reference checks each filter: with none there is nothing to refuse
    assert message_cid(other) in _cids(query(bob, None))
    expired = query(bob, [{"protocol": CHAT}], add_seconds(start, 600))
    assert (expired.code, _detail_code(expired)) == (401, "GrantAuthorizationGrantExpired")
    stolen = query(carol, [{"protocol": CHAT}])
    assert (stolen.code, _detail_code(stolen)) == (401, "GrantAuthorizationNotGrantedToAuthor")


def test_query_integrity_checks(dwn: Dwn, alice: Identity, clock: Clock) -> None:
    good = msg.create_messages_query(signer=alice, message_timestamp=clock())
    unnormalized = _signed(
        {**good["descriptor"], "filters": [{"protocol": "example.com/chat"}]}, alice
    )
    assert _detail_code(dwn.process_message(alice.did, unnormalized)) == "UrlProtocolNotNormalized"
    drifted = {**good, "descriptor": {**good["descriptor"], "filters": [{"method": "Write"}]}}
    reply = dwn.process_message(alice.did, drifted)
    assert (reply.code, _detail_code(reply)) == (400, "AuthenticateDescriptorCidMismatch")
    tampered = copy.deepcopy(good)
    sig = tampered["authorization"]["signature"]["signatures"][0]
    sig["signature"] = ("A" if sig["signature"][0] != "A" else "B") + sig["signature"][1:]
    assert dwn.process_message(alice.did, tampered).code == 401
    # MessagesQuery.parse checks no timestamp (MessagesRead and MessagesSubscribe do)
    assert (
        dwn.process_message(
            alice.did, _signed({**good["descriptor"], "messageTimestamp": FEB_30}, alice)
        ).code
        == 200
    )
    assert (
        dwn.process_message(alice.did, _signed({**good["descriptor"], "filters": [{}]}, alice)).code
        == 400
    )


# --------------------------------------------------------------------------- MessagesRead


def test_read_returns_the_message_and_its_data(dwn: Dwn, alice: Identity, clock: Clock) -> None:
    small = _write(dwn, alice, b"hello", clock())
    large_data = bytes(range(256)) * (LARGE // 256)
    large = _write(dwn, alice, large_data, clock())
    no_data = _write(dwn, alice, b"later", clock(), send_data=False)
    empty = _write(dwn, alice, b"", clock())

    def read(cid: str) -> Reply:
        return dwn.process_message(
            alice.did,
            msg.create_messages_read(signer=alice, message_cid=cid, message_timestamp=clock()),
        )

    got = read(message_cid(small))
    assert got.code == 200 and got.data == b"hello"
    assert got.entry == {"messageCid": message_cid(small), "message": small}  # no encodedData
    assert read(message_cid(large)).data == large_data
    without = read(message_cid(no_data))
    assert without.code == 200 and without.data is None
    # a 0-byte record is stored under the CID of the message with `encodedData: ""`
    assert read(message_cid(empty)).code == 404
    stored = read(compute_cid({**empty, "encodedData": ""}))
    assert stored.code == 200 and stored.data == b""
    query = msg.create_messages_query(signer=alice, message_timestamp=clock())
    assert read(message_cid(query)).code == 404


def test_read_authorization(dwn: Dwn, alice: Identity, bob: Identity, clock: Clock) -> None:
    config = _configure(dwn, alice, CHAT, clock())
    other = _configure(dwn, alice, OTHER, clock())
    thread = _write(dwn, alice, b"t", clock(), protocol=CHAT, protocol_path="thread")
    elsewhere = _write(dwn, alice, b"e", clock(), protocol=OTHER, protocol_path="thread")
    delete = create_records_delete(
        record_id=thread["recordId"], signer=alice, message_timestamp=clock()
    )
    assert dwn.process_message(alice.did, delete).code == 202
    start = clock()
    grant, grant_data = _grant(
        dwn,
        alice,
        bob,
        {"interface": "Messages", "method": "Read", "protocol": CHAT},
        start,
        add_seconds(start, 3600),
    )

    def read(
        target: dict[str, Any] | str,
        grant_id: str | None = grant["recordId"],
        when: str | None = None,
    ) -> Reply:
        cid = target if isinstance(target, str) else message_cid(target)
        m = msg.create_messages_read(
            signer=bob,
            message_cid=cid,
            permission_grant_id=grant_id,
            message_timestamp=when or clock(),
        )
        return dwn.process_message(alice.did, m)

    unauthorized = read(thread, grant_id=None)
    assert (unauthorized.code, _detail_code(unauthorized)) == (
        401,
        "MessagesReadAuthorizationFailed",
    )
    # the lookup comes before authorization
    assert read(message_cid({"not": "stored"}), grant_id=None).code == 404
    for target in (thread, delete, config, grant):
        assert read(target).code == 200
    for target in (other, elsewhere):
        refused = read(target)
        assert (refused.code, _detail_code(refused)) == (401, "MessagesReadVerifyScopeFailed")
    signed_before = msg.create_messages_read(
        signer=bob,
        message_cid=message_cid(thread),
        permission_grant_id=grant["recordId"],
        message_timestamp=clock(),
    )
    revocation, revocation_data = perms.create_revocation(
        signer=alice,
        grant=PermissionGrant.parse(perms.with_encoded_data(grant, grant_data)),
        date_revoked=clock(),
    )
    assert dwn.process_message(alice.did, revocation.message, revocation_data).code == 202
    assert dwn.process_message(alice.did, signed_before).code == 200
    revoked = read(thread)
    assert (revoked.code, _detail_code(revoked)) == (401, "GrantAuthorizationGrantRevoked")


def test_read_integrity_checks(dwn: Dwn, alice: Identity, clock: Clock) -> None:
    good = msg.create_messages_read(
        signer=alice, message_cid=compute_cid({"a": 1}), message_timestamp=clock()
    )
    bad_day = dwn.process_message(
        alice.did, _signed({**good["descriptor"], "messageTimestamp": FEB_30}, alice)
    )
    assert (bad_day.code, _detail_code(bad_day)) == (400, "TimestampInvalid")
    bad_cid = dwn.process_message(
        alice.did, _signed({**good["descriptor"], "messageCid": "hello"}, alice)
    )
    assert (bad_cid.code, _detail_code(bad_cid)) == (400, "MessagesReadInvalidCid")
    no_cid = {k: v for k, v in good["descriptor"].items() if k != "messageCid"}
    assert dwn.process_message(alice.did, _signed(no_cid, alice)).code == 400
    with pytest.raises(DwnError) as refused:
        msg.create_messages_read(signer=alice, message_cid="bafkreihello")
    assert refused.value.code == "MessagesReadInvalidCid"


# --------------------------------------------------------------------------- CID spellings


_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _b58(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def _b32(data: bytes) -> str:
    return "b" + base64.b32encode(data).decode().lower().rstrip("=")


_DIGEST = hashlib.sha256(b"stored").digest()
_CANONICAL = bytes([0x01, 0x71, 0x12, 0x20]) + _DIGEST
_CANONICAL_TEXT = _b32(_CANONICAL)
_NON_MINIMAL = bytes([0x01, 0xF1, 0x00, 0x12, 0x20]) + _DIGEST


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (_CANONICAL_TEXT, _CANONICAL_TEXT),
        ("z" + _b58(_CANONICAL), _CANONICAL_TEXT),  # other spellings are looked up canonically
        (_CANONICAL_TEXT + "====", _CANONICAL_TEXT + "===="),  # base32 is looked up verbatim
        (_b32(_NON_MINIMAL), _b32(_NON_MINIMAL)),
        ("z" + _b58(_NON_MINIMAL), _CANONICAL_TEXT),
        (
            _b32(bytes([0x01, 0x71, 0x12, 0x04]) + _DIGEST[:4]),
            _b32(bytes([0x01, 0x71, 0x12, 0x04]) + _DIGEST[:4]),
        ),
    ],
)
def test_message_cid_lookup_key_accepts_what_the_reference_parses(text: str, key: str) -> None:
    assert msg.message_cid_lookup_key(text) == key


@pytest.mark.parametrize(
    "text",
    [
        "B" + _CANONICAL_TEXT[1:].upper(),  # multibase B: not parsed without a decoder
        _b58(bytes([0x12, 0x20]) + _DIGEST),  # a CIDv0 (Qm…): dag-pb
        "z" + _b58(bytes([0x12, 0x20]) + _DIGEST),  # a CIDv0 with a multibase prefix
        _b32(bytes([0x01, 0x55, 0x12, 0x20]) + _DIGEST),  # raw codec
        _b32(bytes([0x01, 0x70, 0x12, 0x20]) + _DIGEST),  # dag-pb
        _b32(bytes([0x01, 0x71, 0x13, 0x40]) + _DIGEST * 2),  # sha2-512
        _b32(bytes([0x02, 0x71, 0x12, 0x20]) + _DIGEST),  # version 2
        _b32(_CANONICAL + b"\0"),  # trailing byte
        _b32(_CANONICAL[:-1]),  # short digest
        _CANONICAL_TEXT[:-1] + "b",  # non-zero padding bits (the last character ends in "a")
        "z0" + _b58(_CANONICAL),  # not base58btc
        "hello",
        "",
        "z",
        None,
        5,
    ],
)
def test_message_cid_lookup_key_refuses_what_the_reference_refuses(text: Any) -> None:
    with pytest.raises(DwnError) as refused:
        msg.message_cid_lookup_key(text)
    assert refused.value.code == "MessagesReadInvalidCid"


def test_base58_spelling_reads_the_stored_message(dwn: Dwn, alice: Identity, clock: Clock) -> None:
    write = _write(dwn, alice, b"hi", clock())
    raw = base64.b32decode(message_cid(write)[1:].upper() + "=" * 6)
    descriptor = msg.create_messages_read(
        signer=alice, message_cid=message_cid(write), message_timestamp=clock()
    )["descriptor"]
    reply = dwn.process_message(
        alice.did, _signed({**descriptor, "messageCid": "z" + _b58(raw)}, alice)
    )
    assert reply.code == 200 and reply.data == b"hi"


# --------------------------------------------------------------------------- authoring


def test_authoring_normalizes_query_filters_but_not_subscribe_filters(alice: Identity) -> None:
    query = msg.create_messages_query(signer=alice, filters=[{"protocol": "Example.com/chat/"}, {}])
    assert query["descriptor"]["filters"] == [{"protocol": "http://example.com/chat"}]
    assert "cursor" not in query["descriptor"]
    msg.MessagesQuery.parse(query)
    subscribe = msg.create_messages_subscribe(
        signer=alice, filters=[{"protocol": "Example.com/chat/"}]
    )
    assert subscribe["descriptor"]["filters"] == [{"protocol": "Example.com/chat/"}]
    with pytest.raises(DwnError) as refused:
        msg.MessagesSubscribe.parse(subscribe)
    assert refused.value.code == "UrlProtocolNotNormalized"
    records = msg.create_records_subscribe(filter={"schema": "Example.com/note"})
    assert records["descriptor"]["filter"] == {"schema": "http://example.com/note"}
    assert "authorization" not in records


def test_convert_filters_adds_permission_records_about_a_protocol() -> None:
    converted = msg.convert_filters(
        [{"protocol": CHAT, "messageTimestamp": {"from": EPOCH}}, {"method": "Write"}]
    )
    assert converted == [
        {
            "protocol": perms.PERMISSIONS_PROTOCOL_URI,
            "tag.protocol": CHAT,
            "messageTimestamp": {"gte": EPOCH},
        },
        {"protocol": CHAT, "messageTimestamp": {"gte": EPOCH}},
        {"method": "Write"},
    ]


# --------------------------------------------------------------------------- subscriptions


def test_subscriptions_without_an_event_stream_answer_501(
    dwn: Dwn, alice: Identity, clock: Clock
) -> None:
    subscribe = msg.create_messages_subscribe(signer=alice, message_timestamp=clock())
    reply = dwn.process_message(alice.did, subscribe)
    assert (reply.code, _detail_code(reply)) == (501, "MessagesSubscribeEventStreamUnimplemented")
    # the stream check comes before parsing: a bare-string timestamp the schema lets through
    assert (
        dwn.process_message(
            alice.did, _signed({**subscribe["descriptor"], "messageTimestamp": "x"}, alice)
        ).code
        == 501
    )
    assert (
        dwn.process_message(
            alice.did, _signed({**subscribe["descriptor"], "filters": [{}]}, alice)
        ).code
        == 400
    )
    records = dwn.process_message(
        alice.did, msg.create_records_subscribe(filter={"schema": "https://e.com/s"})
    )
    assert (records.code, _detail_code(records)) == (
        501,
        "RecordsSubscribeEventStreamUnimplemented",
    )


def _streaming(dwn: Dwn) -> tuple[HandlerContext, LocalEventStream]:
    ctx = HandlerContext(dwn.store)
    stream = LocalEventStream()
    setattr(ctx, "event_stream", stream)  # noqa: B010 - the engine's context has no such field yet
    return ctx, stream


def _emit(stream: LocalEventStream, tenant: str, write: dict[str, Any]) -> None:
    """What the reference's RecordsWrite handler emits for a write that is the latest state."""
    stream.emit(tenant, MessageEvent(write), RecordsWrite(write).construct_indexes(True))


def test_messages_subscribe_with_an_event_stream(
    dwn: Dwn, alice: Identity, bob: Identity, clock: Clock
) -> None:
    ctx, stream = _streaming(dwn)
    received: list[str] = []
    subscribe = msg.create_messages_subscribe(
        signer=alice, filters=[{"protocol": CHAT}], message_timestamp=clock()
    )
    reply = handle_messages_subscribe(
        ctx, alice.did, subscribe, lambda e: received.append(message_cid(e.message))
    )
    assert (
        isinstance(reply, SubscriptionReply)
        and reply.code == 200
        and reply.subscription is not None
    )
    assert reply.subscription.id == message_cid(subscribe)
    chat = RecordsWrite.create(
        signer=alice, data=b"c", protocol=CHAT, protocol_path="thread", message_timestamp=clock()
    ).message
    flat = RecordsWrite.create(signer=alice, data=b"f", message_timestamp=clock()).message
    for write in (chat, flat):
        _emit(stream, alice.did, write)
    _emit(stream, bob.did, chat)  # another tenant's event
    assert received == [message_cid(chat)]
    reply.subscription.close()
    _emit(stream, alice.did, chat)
    assert received == [message_cid(chat)] and stream.listener_count(alice.did) == 0

    refused = handle_messages_subscribe(
        ctx, alice.did, msg.create_messages_subscribe(signer=bob, message_timestamp=clock())
    )
    assert (refused.code, _detail_code(refused)) == (401, "MessagesSubscribeAuthorizationFailed")
    bad_day = handle_messages_subscribe(
        ctx, alice.did, _signed({**subscribe["descriptor"], "messageTimestamp": FEB_30}, alice)
    )
    assert (bad_day.code, _detail_code(bad_day)) == (400, "TimestampInvalid")
    # without a handler: the reference answers 200 (then fails its next write); we drop events
    silent = handle_messages_subscribe(
        ctx, alice.did, msg.create_messages_subscribe(signer=alice, message_timestamp=clock())
    )
    assert silent.code == 200
    _emit(stream, alice.did, flat)


def test_records_subscribe_filters_by_audience(
    dwn: Dwn, alice: Identity, bob: Identity, clock: Clock
) -> None:
    ctx, stream = _streaming(dwn)
    schema = "https://example.com/s"
    received: dict[str, list[str]] = {"anon": [], "owner": [], "bob": []}

    def subscribe(name: str, signer: Identity | None) -> Reply:
        m = msg.create_records_subscribe(
            filter={"schema": schema}, signer=signer, message_timestamp=clock()
        )
        return handle_records_subscribe(
            ctx, alice.did, m, lambda e: received[name].append(message_cid(e.message))
        )

    assert subscribe("anon", None).code == 200
    assert subscribe("owner", alice).code == 200
    assert subscribe("bob", bob).code == 200
    published = RecordsWrite.create(
        signer=alice, data=b"p", schema=schema, published=True, message_timestamp=clock()
    ).message
    private = RecordsWrite.create(
        signer=alice, data=b"q", schema=schema, message_timestamp=clock()
    ).message
    to_bob = RecordsWrite.create(
        signer=alice, data=b"r", schema=schema, recipient=bob.did, message_timestamp=clock()
    ).message
    elsewhere = RecordsWrite.create(
        signer=alice, data=b"s", schema="https://example.com/x", message_timestamp=clock()
    ).message
    for write in (published, private, to_bob, elsewhere):
        _emit(stream, alice.did, write)
    cid = message_cid
    assert received == {
        "anon": [cid(published)],
        "owner": [cid(published), cid(private), cid(to_bob)],
        "bob": [cid(published), cid(to_bob)],
    }

    anonymous_private = handle_records_subscribe(
        ctx,
        alice.did,
        msg.create_records_subscribe(filter={"published": False}, message_timestamp=clock()),
    )
    assert (anonymous_private.code, _detail_code(anonymous_private)) == (
        401,
        "AuthenticateJwsMissing",
    )
    role_without_path = msg.create_records_subscribe(
        filter={"protocol": CHAT}, signer=bob, protocol_role="friend", message_timestamp=clock()
    )
    refused = handle_records_subscribe(ctx, alice.did, role_without_path)
    assert (refused.code, _detail_code(refused)) == (
        400,
        "RecordsSubscribeFilterMissingRequiredProperties",
    )
