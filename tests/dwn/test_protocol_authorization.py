"""Protocol-based authorization of Records messages, through the engine.

One protocol exercises every kind of rule: a root role (``admin``), a context role
(``thread/participant``), ``author of`` / ``recipient of`` ancestors, ``recipient`` of the record
itself, ``$size``, ``$tags`` and a typed record (schema + data format). Records are authored by
several identities with our ``RecordsWrite.create``. Expected codes are the reference's: the
same sequence was run through dwn-sdk-js 0.5.2 and matched message for message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from p2psync.dwn import permissions
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.generic_message import GenericMessage
from p2psync.dwn.js_values import UNDEFINED
from p2psync.dwn.protocol_authorization import (
    fetch_protocol_definition,
    get_rule_set_at_protocol_path,
)
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_delete, create_records_query, create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.reply import Reply
from p2psync.dwn.timeutil import add_seconds, now_timestamp

P = "https://example.com/chat"
SCHEMA = "https://example.com/schema"

DEFINITION: dict[str, Any] = {
    "protocol": P,
    "published": True,
    "types": {
        "admin": {},
        "thread": {},
        "participant": {},
        "message": {},
        "reply": {},
        "sized": {},
        "tagged": {},
        "typed": {"schema": SCHEMA, "dataFormats": ["application/json"]},
    },
    "structure": {
        "admin": {"$role": True},
        "thread": {
            "$actions": [
                {"who": "anyone", "can": ["create"]},
                {"role": "admin", "can": ["read", "query", "subscribe", "co-delete", "co-update"]},
            ],
            "participant": {
                "$role": True,
                "$actions": [{"who": "author", "of": "thread", "can": ["create"]}],
            },
            "message": {
                "$actions": [
                    {"role": "thread/participant", "can": ["create", "read", "query", "subscribe"]},
                    {"who": "author", "of": "thread", "can": ["read"]},
                    {"who": "recipient", "of": "thread", "can": ["create"]},
                    {"who": "recipient", "can": ["co-delete"]},
                ],
                "reply": {
                    "$actions": [
                        {
                            "who": "author",
                            "of": "thread/message",
                            "can": ["create", "update", "delete"],
                        }
                    ]
                },
            },
        },
        "sized": {
            "$size": {"min": 2, "max": 5},
            "$actions": [{"who": "anyone", "can": ["create"]}],
        },
        "tagged": {
            "$tags": {
                "$requiredTags": ["status"],
                "status": {"type": "string", "enum": ["open", "closed"]},
                "n": {"type": "integer", "minimum": 0},
            },
            "$actions": [{"who": "anyone", "can": ["create", "update"]}],
        },
        "typed": {"$actions": [{"who": "anyone", "can": ["create"]}]},
    },
}


@dataclass
class Chat:
    """alice's DWN with the chat protocol, bob's thread and carol as its participant."""

    dwn: Dwn
    alice: Identity
    bob: Identity
    carol: Identity
    dave: Identity
    thread: RecordsWrite
    participant: RecordsWrite

    @property
    def tenant(self) -> str:
        return self.alice.did

    @property
    def thread_context(self) -> str:
        return self.thread.message["contextId"]  # type: ignore[no-any-return]

    def write(self, signer: Identity, path: str, data: bytes = b"hello", **kw: Any) -> RecordsWrite:
        return RecordsWrite.create(signer=signer, data=data, protocol=P, protocol_path=path, **kw)

    def send(self, message: dict[str, Any], data: bytes | None = None) -> Reply:
        return self.dwn.process_message(self.tenant, message, data)

    def put(self, write: RecordsWrite, data: bytes = b"hello") -> Reply:
        return self.send(write.message, data)


def _code(reply: Reply) -> tuple[int, str]:
    return reply.code, reply.detail.split(":")[0] if reply.code >= 300 else reply.detail


@pytest.fixture
def chat(dwn: Dwn, alice: Identity, bob: Identity, carol: Identity) -> Chat:
    dave = Identity.generate("key")
    configure = ProtocolsConfigure.create(definition=DEFINITION, signer=alice)
    assert dwn.process_message(alice.did, configure.message).code == 202
    c = Chat(dwn, alice, bob, carol, dave, thread=None, participant=None)  # type: ignore[arg-type]
    c.thread = c.write(bob, "thread")
    assert c.put(c.thread).code == 202  # anyone can create a thread
    c.participant = c.write(
        bob, "thread/participant", recipient=carol.did, parent_context_id=c.thread_context
    )
    assert c.put(c.participant).code == 202  # the thread's author names participants
    return c


def _message_by_carol(c: Chat, **kw: Any) -> RecordsWrite:
    message = c.write(
        c.carol,
        "thread/message",
        parent_context_id=c.thread_context,
        protocol_role="thread/participant",
        **kw,
    )
    assert c.put(message).code == 202
    return message


# --------------------------------------------------------------------------- roles


def test_role_records(chat: Chat) -> None:
    c = chat
    ctx = c.thread_context
    # carol already holds the role in this thread: a second grant is a structure error (400),
    # found before authorization, whoever sends it
    dup = c.write(c.dave, "thread/participant", recipient=c.carol.did, parent_context_id=ctx)
    assert _code(c.put(dup)) == (400, "ProtocolAuthorizationDuplicateRoleRecipient")
    not_author = c.write(c.dave, "thread/participant", recipient=c.dave.did, parent_context_id=ctx)
    assert _code(c.put(not_author)) == (401, "ProtocolAuthorizationActionNotAllowed")
    no_recipient = c.write(c.bob, "thread/participant", parent_context_id=ctx)
    assert _code(c.put(no_recipient)) == (400, "ProtocolAuthorizationRoleMissingRecipient")
    # the same person may hold the role in another thread
    other_thread = c.write(c.bob, "thread")
    assert c.put(other_thread).code == 202
    again = c.write(
        c.bob,
        "thread/participant",
        recipient=c.carol.did,
        parent_context_id=other_thread.message["contextId"],
    )
    assert c.put(again).code == 202
    # a root role, granted by the tenant, once per recipient
    assert c.put(c.write(c.alice, "admin", recipient=c.dave.did)).code == 202
    assert _code(c.put(c.write(c.alice, "admin", recipient=c.dave.did))) == (
        400,
        "ProtocolAuthorizationDuplicateRoleRecipient",
    )


def test_invoking_roles_to_write(chat: Chat) -> None:
    c = chat
    ctx = c.thread_context
    _message_by_carol(c)
    cases = [
        (
            "thread/participant",
            "ProtocolAuthorizationMatchingRoleRecordNotFound",
        ),  # dave has no role
        ("thread", "ProtocolAuthorizationNotARole"),
        ("nope/x", "ProtocolAuthorizationNotARole"),
        (None, "ProtocolAuthorizationActionNotAllowed"),
    ]
    for role, code in cases:
        w = c.write(c.dave, "thread/message", parent_context_id=ctx, protocol_role=role)
        assert _code(c.put(w)) == (401, code), role
    # the thread's author may read messages but not create them
    assert c.put(c.write(c.bob, "thread/message", parent_context_id=ctx)).code == 401


def test_tenant_skips_actions_but_not_structure(chat: Chat) -> None:
    c = chat
    assert c.put(c.write(c.alice, "thread/message", parent_context_id=c.thread_context)).code == 202
    assert _code(c.put(c.write(c.alice, "sized", data=b"z"), b"z")) == (
        400,
        "ProtocolAuthorizationMinSizeInvalid",
    )
    assert _code(c.put(c.write(c.alice, "thread/message"))) == (
        400,
        "ProtocolAuthorizationParentlessIncorrectProtocolPath",
    )


def test_recipient_of_ancestor_may_create(chat: Chat, dwn: Dwn) -> None:
    c = chat
    thread_for_dave = c.write(c.bob, "thread", recipient=c.dave.did)
    assert c.put(thread_for_dave).code == 202
    w = c.write(c.dave, "thread/message", parent_context_id=thread_for_dave.message["contextId"])
    assert c.put(w).code == 202


# --------------------------------------------------------------------------- reads and queries


def test_reads(chat: Chat) -> None:
    c = chat
    message = _message_by_carol(c)
    rid = message.record_id

    def read(reader: Identity | None, record_id: str = rid, role: str | None = None) -> Reply:
        return c.send(
            create_records_read(filter={"recordId": record_id}, signer=reader, protocol_role=role)
        )

    assert read(c.bob).code == 200  # author of the thread
    assert _code(read(c.dave)) == (401, "ProtocolAuthorizationActionNotAllowed")
    assert _code(read(None)) == (401, "ProtocolAuthorizationActionNotAllowed")
    assert read(c.carol, role="thread/participant").code == 200
    assert _code(read(c.carol, c.thread.record_id)) == (
        401,
        "ProtocolAuthorizationActionNotAllowed",
    )
    assert _code(read(c.dave, c.thread.record_id, role="admin")) == (
        401,
        "ProtocolAuthorizationMatchingRoleRecordNotFound",
    )
    assert c.put(c.write(c.alice, "admin", recipient=c.dave.did)).code == 202
    assert read(c.dave, c.thread.record_id, role="admin").code == 200


def _query(c: Chat, signer: Identity, role: str, **flt: Any) -> Reply:
    return c.send(
        create_records_query(filter={"protocol": P, **flt}, signer=signer, protocol_role=role)
    )


def test_role_queries(chat: Chat) -> None:
    c = chat
    m1 = _message_by_carol(c)
    m2 = _message_by_carol(c)
    reply = _query(
        c, c.carol, "thread/participant", protocolPath="thread/message", contextId=c.thread_context
    )
    assert reply.code == 200
    assert {e["recordId"] for e in reply.entries or []} == {m1.record_id, m2.record_id}
    assert _code(
        _query(
            c,
            c.dave,
            "thread/participant",
            protocolPath="thread/message",
            contextId=c.thread_context,
        )
    ) == (401, "ProtocolAuthorizationMatchingRoleRecordNotFound")
    # a context role needs the context to be found in
    assert _code(_query(c, c.carol, "thread/participant", protocolPath="thread/message")) == (
        401,
        "ProtocolAuthorizationMissingContextId",
    )

    assert c.put(c.write(c.alice, "admin", recipient=c.dave.did)).code == 202
    reply = _query(c, c.dave, "admin", protocolPath="thread")
    assert reply.code == 200
    assert [e["recordId"] for e in reply.entries or []] == [c.thread.record_id]
    # admin has no rule on messages; `sized` has rules but none for the role
    assert _code(_query(c, c.dave, "admin", protocolPath="thread/message")) == (
        401,
        "ProtocolAuthorizationActionNotAllowed",
    )
    # a path naming an Object.prototype member finds "a rule set" without rules in JS
    assert _code(_query(c, c.dave, "admin", protocolPath="toString")) == (
        401,
        "ProtocolAuthorizationActionRulesNotFound",
    )
    assert _code(_query(c, c.dave, "toString", protocolPath="thread")) == (
        401,
        "ProtocolAuthorizationNotARole",
    )


# --------------------------------------------------------------------------- updates and deletes


def test_updates_and_deletes(chat: Chat) -> None:
    c = chat
    base = now_timestamp()
    message = _message_by_carol(c, recipient=c.dave.did)
    # bob, the thread's author, may not write replies under carol's message
    assert (
        c.put(
            c.write(c.bob, "thread/message/reply", parent_context_id=message.message["contextId"])
        ).code
        == 401
    )
    reply = c.write(c.carol, "thread/message/reply", parent_context_id=message.message["contextId"])
    assert c.put(reply).code == 202
    update = RecordsWrite.create_from(
        reply.message, signer=c.carol, data=b"v2", message_timestamp=add_seconds(base, 1)
    )
    assert c.put(update, b"v2").code == 202
    foreign = RecordsWrite.create_from(
        update.message, signer=c.dave, data=b"v3", message_timestamp=add_seconds(base, 2)
    )
    assert _code(c.put(foreign, b"v3")) == (401, "ProtocolAuthorizationActionNotAllowed")
    stamp = add_seconds(base, 3)
    assert (
        c.send(
            create_records_delete(record_id=reply.record_id, signer=c.dave, message_timestamp=stamp)
        ).code
        == 401
    )
    assert (
        c.send(
            create_records_delete(
                record_id=reply.record_id, signer=c.carol, message_timestamp=stamp
            )
        ).code
        == 202
    )

    # the participant role allows creating messages, not updating them
    own_update = RecordsWrite.create_from(
        message.message, signer=c.carol, data=b"x2", message_timestamp=add_seconds(base, 4)
    )
    assert c.put(own_update, b"x2").code == 401
    # the message's recipient may co-delete it; the thread's author may not
    stamp = add_seconds(base, 5)
    assert (
        c.send(
            create_records_delete(
                record_id=message.record_id, signer=c.bob, message_timestamp=stamp
            )
        ).code
        == 401
    )
    assert (
        c.send(
            create_records_delete(
                record_id=message.record_id, signer=c.dave, message_timestamp=stamp
            )
        ).code
        == 202
    )


def test_role_co_delete(chat: Chat) -> None:
    c = chat
    stamp = add_seconds(now_timestamp(), 5)
    assert c.put(c.write(c.alice, "admin", recipient=c.dave.did)).code == 202
    by_carol = create_records_delete(
        record_id=c.thread.record_id, signer=c.carol, message_timestamp=stamp
    )
    assert c.send(by_carol).code == 401
    by_admin = create_records_delete(
        record_id=c.thread.record_id, signer=c.dave, message_timestamp=stamp, protocol_role="admin"
    )
    assert c.send(by_admin).code == 202


# --------------------------------------------------------------------------- structure


@pytest.mark.parametrize(("size", "code"), [(0, 400), (1, 400), (2, 202), (5, 202), (6, 400)])
def test_size_limits(chat: Chat, size: int, code: int) -> None:
    data = b"z" * size
    assert chat.put(chat.write(chat.bob, "sized", data=data), data).code == code


@pytest.mark.parametrize(
    ("tags", "ok"),
    [
        (None, False),
        ({"status": "x"}, False),
        ({"status": "open", "n": -1}, False),
        ({"status": "open", "n": 3}, True),
        ({"status": "open", "extra": 1}, False),
        ({"status": "closed", "n": 1.5}, False),
        ({"status": "open", "n": 2.0}, True),
    ],
)
def test_tags(chat: Chat, tags: dict[str, Any] | None, ok: bool) -> None:
    reply = chat.put(chat.write(chat.bob, "tagged", tags=tags))
    assert _code(reply) == (
        (202, "Accepted") if ok else (400, "ProtocolAuthorizationTagsInvalidSchema")
    )


def test_type_checks(chat: Chat) -> None:
    c = chat
    ctx = c.thread_context
    cases: list[tuple[RecordsWrite, tuple[int, str]]] = [
        (
            c.write(c.bob, "typed", data=b"{}", data_format="application/json"),
            (400, "ProtocolAuthorizationInvalidSchema"),
        ),
        (
            c.write(c.bob, "typed", data=b"{}", data_format="text/plain", schema=SCHEMA),
            (400, "ProtocolAuthorizationIncorrectDataFormat"),
        ),
        (
            c.write(c.bob, "typed", data=b"{}", data_format="application/json", schema=SCHEMA),
            (202, "Accepted"),
        ),
        (c.write(c.bob, "nope", data=b"{}"), (400, "ProtocolAuthorizationInvalidType")),
        (c.write(c.bob, "message", data=b"{}"), (400, "ProtocolAuthorizationMissingRuleSet")),
        # the path follows the parent, but no rule set is declared there
        (
            c.write(c.bob, "thread/reply", parent_context_id=ctx, data=b"{}"),
            (400, "ProtocolAuthorizationMissingRuleSet"),
        ),
        (
            c.write(c.bob, "thread/message/reply", parent_context_id=ctx, data=b"{}"),
            (400, "ProtocolAuthorizationIncorrectProtocolPath"),
        ),
    ]
    for write, expected in cases:
        assert _code(c.put(write, b"{}")) == expected, write.descriptor["protocolPath"]
    unknown = RecordsWrite.create(
        signer=c.bob, data=b"a", protocol="https://example.com/none", protocol_path="x"
    )
    assert _code(c.send(unknown.message, b"a")) == (400, "ProtocolAuthorizationProtocolNotFound")


def test_deleted_parent_takes_no_children(chat: Chat) -> None:
    c = chat
    stamp = add_seconds(now_timestamp(), 5)
    assert (
        c.send(
            create_records_delete(
                record_id=c.thread.record_id, signer=c.alice, message_timestamp=stamp
            )
        ).code
        == 202
    )
    w = c.write(c.alice, "thread/message", parent_context_id=c.thread_context)
    assert _code(c.put(w)) == (400, "ProtocolAuthorizationIncorrectProtocolPath")


# --------------------------------------------------------------------------- lookups


def test_rule_set_lookup_follows_js_property_access() -> None:
    assert get_rule_set_at_protocol_path("thread/message", DEFINITION)["$actions"]
    assert get_rule_set_at_protocol_path("thread/nope", DEFINITION) is UNDEFINED
    inherited = get_rule_set_at_protocol_path("constructor", DEFINITION)
    assert inherited is not UNDEFINED and "$actions" not in inherited


def test_permissions_protocol_definition_is_built_in(dwn: Dwn, alice: Identity) -> None:
    definition = fetch_protocol_definition(
        alice.did, permissions.PERMISSIONS_PROTOCOL_URI, dwn.store
    )
    assert set(definition["structure"]) == {"request", "grant"}


def test_generic_message_shape_for_reads(alice: Identity) -> None:
    # authorize_read/delete/query take the parsed GenericMessage; its payload carries the role
    read = GenericMessage(
        create_records_read(filter={"recordId": "x"}, signer=alice, protocol_role="admin")
    )
    assert read.author == alice.did
    assert read.signature_payload is not None and read.signature_payload["protocolRole"] == "admin"
