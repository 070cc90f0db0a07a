"""Grant-based authorization end to end: one scenario, the reference's answers, and ours.

The scenario is authored in Python (grants, revocations, grant-authorized and delegated
writes, reads, queries, deletes, protocol configuration). Each step carries the status the
reference DWN (dwn-sdk-js 0.5.2) gives it, and the error code when the reply has one:

* ``test_reference_answers_as_expected`` replays it through the reference's pipe harness, so
  the expectations are the reference's behaviour, not our reading of it;
* ``test_engine_answers_as_the_reference`` replays it through our engine.

Several steps feed JavaScript edge cases through delegated grants, whose data no schema checks:
a missing ``dateExpires`` never expires, an array one compares as a string, a missing scope is a
TypeError (401 with no code), ``null`` and numbers in the scope compare strictly.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn import permissions as perms
from p2psync.dwn import records as rec
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import b64url_encode, json_compact, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from tests.dwn.oracle_utils import INTEROP_DIR, needs_reference

PROTOCOL = "https://example.com/chat"
OTHER_PROTOCOL = "https://example.com/other"
PRIVATE_PROTOCOL = "https://example.com/private"
#: How long the reference harness may take to exit after its input closes.
EXIT_TIMEOUT_SECONDS = 60
#: Our engine's answer to a method it does not implement yet.
NOT_IMPLEMENTED = 501


def ts(second: int, minute: int = 0) -> str:
    return f"2030-01-01T00:{minute:02d}:{second:02d}.000000Z"


EXPIRES = ts(0, minute=30)


@dataclass(frozen=True)
class Step:
    """One message to process, with the reference's answer."""

    label: str
    tenant: str
    message: dict[str, Any]
    data: bytes | None
    status: int
    code: str | None = None  # the error code the detail starts with, when the reply has one
    entries: int | None = None  # for a query: how many entries the reply lists


def _configure(
    signer: Identity,
    protocol: str,
    when: str,
    grant_id: str | None = None,
    *,
    published: bool = True,
) -> dict[str, Any]:
    descriptor = {
        "interface": "Protocols",
        "method": "Configure",
        "messageTimestamp": when,
        "definition": {
            "protocol": protocol,
            "published": published,
            "types": {"thread": {}, "reply": {}},
            "structure": {"thread": {"reply": {}}},
        },
    }
    authorization = rec.create_authorization(descriptor, signer, permission_grant_id=grant_id)
    return {"descriptor": descriptor, "authorization": authorization}


def _protocols_query(
    signer: Identity, when: str, grant_id: str, protocol: str | None
) -> dict[str, Any]:
    descriptor: dict[str, Any] = {
        "interface": "Protocols",
        "method": "Query",
        "messageTimestamp": when,
    }
    if protocol is not None:
        descriptor["filter"] = {"protocol": protocol}
    authorization = rec.create_authorization(descriptor, signer, permission_grant_id=grant_id)
    return {"descriptor": descriptor, "authorization": authorization}


def _write(
    signer: Identity,
    when: str,
    *,
    protocol: str | None = PROTOCOL,
    path: str = "thread",
    **options: Any,
) -> dict[str, Any]:
    if protocol is not None:
        options |= {"protocol": protocol, "protocol_path": path}
    write = RecordsWrite.create(
        signer=signer, data=b"hi", message_timestamp=when, date_created=when, **options
    )
    return write.message


def _raw_grant(
    grantor: Identity,
    grantee: Identity,
    data: bytes,
    when: str = ts(10),
    tags: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], bytes]:
    """A grant record with any data at all (``create_grant`` only writes well-formed ones)."""
    write = RecordsWrite.create(
        signer=grantor,
        recipient=grantee.did,
        protocol=perms.PERMISSIONS_PROTOCOL_URI,
        protocol_path="grant",
        data_format="application/json",
        data=data,
        message_timestamp=when,
        date_created=when,
        tags=tags,
    )
    return write.message, data


def build_scenario() -> list[Step]:
    alice, bob, carol = Identity.generate(), Identity.generate(), Identity.generate("jwk")
    steps: list[Step] = []

    def step(
        label: str,
        message: dict[str, Any],
        data: bytes | None,
        status: int,
        code: str | None = None,
        entries: int | None = None,
    ) -> None:
        steps.append(Step(label, alice.did, message, data, status, code, entries))

    def grant(scope: dict[str, Any], **options: Any) -> str:
        write, data = perms.create_grant(
            signer=alice,
            granted_to=options.pop("to", bob).did,
            date_granted=ts(10),
            date_expires=EXPIRES,
            scope=scope,
            **options,
        )
        step(f"grant {scope}", write.message, data, 202)
        return str(write.message["recordId"])

    def delegated(
        data_obj: Any = None, *, raw: bytes | None = None, to: Identity = bob
    ) -> dict[str, Any]:
        message, data = _raw_grant(
            alice, to, raw if raw is not None else json_compact(data_obj).encode()
        )
        return perms.with_encoded_data(message, data)

    records_write = {"interface": "Records", "method": "Write", "protocol": PROTOCOL}

    step("configure", _configure(alice, PROTOCOL, ts(1)), None, 202)
    step("configure other", _configure(alice, OTHER_PROTOCOL, ts(1)), None, 202)
    thread = _write(alice, ts(2))
    step("thread by tenant", thread, b"hi", 202)
    other_record = _write(alice, ts(2), protocol=OTHER_PROTOCOL)
    step("record of another protocol", other_record, b"hi", 202)

    # --- the active window and revocation, judged by message timestamps
    write_grant = grant(records_write)
    step(
        "before dateGranted",
        _write(bob, ts(5), permission_grant_id=write_grant),
        b"hi",
        401,
        "GrantAuthorizationGrantNotYetActive",
    )
    step("within the window", _write(bob, ts(20), permission_grant_id=write_grant), b"hi", 202)
    step(
        "at dateExpires",
        _write(bob, ts(0, 30), permission_grant_id=write_grant),
        b"hi",
        401,
        "GrantAuthorizationGrantExpired",
    )
    step(
        "not the grantee",
        _write(carol, ts(20), permission_grant_id=write_grant),
        b"hi",
        401,
        "GrantAuthorizationNotGrantedToAuthor",
    )
    step(
        "unknown grant",
        _write(bob, ts(20), permission_grant_id=thread["recordId"]),
        b"hi",
        401,
        "GrantAuthorizationGrantMissing",
    )
    parsed = PermissionGrant.parse(
        perms.with_encoded_data(*_grant_message(steps, write_grant))
    )
    revocation, revocation_data = perms.create_revocation(
        signer=alice, grant=parsed, date_revoked=ts(35)
    )
    step("revocation without data", revocation.message, None, 204)
    step(
        "after a data-less revocation",
        _write(bob, ts(36), permission_grant_id=write_grant),
        b"hi",
        202,
    )
    revocation, revocation_data = perms.create_revocation(
        signer=alice, grant=parsed, date_revoked=ts(40)
    )
    step("revocation", revocation.message, revocation_data, 202)
    step(
        "signed before the revocation",
        _write(bob, ts(39), permission_grant_id=write_grant),
        b"hi",
        202,
    )
    step(
        "stamped at the revocation",
        _write(bob, ts(40), permission_grant_id=write_grant),
        b"hi",
        401,
        "GrantAuthorizationGrantRevoked",
    )
    bad_tag = RecordsWrite.create(
        signer=alice,
        parent_context_id=write_grant,
        protocol=perms.PERMISSIONS_PROTOCOL_URI,
        protocol_path="grant/revocation",
        data_format="application/json",
        data=b"{}",
        tags={"protocol": OTHER_PROTOCOL},
    )
    step(
        "revocation tagged with another protocol",
        bad_tag.message,
        b"{}",
        400,
        "PermissionsProtocolValidateRevocationProtocolTagMismatch",
    )

    # --- permission records themselves
    untagged = json_compact({"dateExpires": EXPIRES, "scope": records_write}).encode()
    step(
        "grant without protocol tag",
        *_raw_grant(alice, bob, untagged),
        400,
        "PermissionsProtocolValidateScopeMissingProtocolTag",
    )
    extra = json_compact(
        {"dateExpires": EXPIRES, "x": 1, "scope": {"interface": "Messages", "method": "Read"}}
    )
    step(
        "grant with an extra member",
        *_raw_grant(alice, bob, extra.encode()),
        400,
        "SchemaValidatorAdditionalPropertyNotAllowed",
    )
    # refused, but by an exception the reference does not catch (its harness answers 500)
    step("grant data not JSON", *_raw_grant(alice, bob, b"not json"), 500)
    unnormalized = {"interface": "Records", "method": "Write", "protocol": "example.com/x"}
    step(
        "scope protocol not normalized",
        *_raw_grant(
            alice,
            bob,
            json_compact({"dateExpires": EXPIRES, "scope": unnormalized}).encode(),
            tags={"protocol": "example.com/x"},
        ),
        500,
    )
    month_19 = json_compact(
        {
            "dateExpires": "2030-19-01T00:00:00.000000Z",
            "scope": {"interface": "Messages", "method": "Read"},
        }
    )
    step(
        "dateExpires of the right shape, not a date",
        *_raw_grant(alice, bob, month_19.encode()),
        500,
    )
    request, request_data = perms.create_request(signer=bob, delegated=False, scope=records_write)
    step("request by anyone", request.message, request_data, 202)

    # --- a Records grant without a protocol (schema-valid) matches only records without one
    no_protocol = json_compact(
        {"dateExpires": EXPIRES, "scope": {"interface": "Records", "method": "Write"}}
    )
    message, data = _raw_grant(alice, bob, no_protocol.encode())
    step("grant without protocol", message, data, 202)
    step(
        "  plain record",
        _write(bob, ts(20), protocol=None, permission_grant_id=message["recordId"]),
        b"hi",
        202,
    )
    step(
        "  protocol record",
        _write(bob, ts(21), permission_grant_id=message["recordId"]),
        b"hi",
        401,
        "RecordsGrantAuthorizationScopeProtocolMismatch",
    )

    # --- contextId, protocolPath and publication
    by_context = grant({**records_write, "contextId": thread["contextId"]})
    step(
        "reply in the context",
        _write(
            bob,
            ts(20),
            path="thread/reply",
            parent_context_id=thread["contextId"],
            permission_grant_id=by_context,
        ),
        b"hi",
        202,
    )
    step(
        "record outside the context",
        _write(bob, ts(20), permission_grant_id=by_context),
        b"hi",
        401,
        "RecordsGrantAuthorizationScopeContextIdMismatch",
    )
    by_path = grant(
        {**records_write, "protocolPath": "thread"}, conditions={"publication": "Required"}
    )
    step(
        "published thread",
        _write(bob, ts(22), published=True, permission_grant_id=by_path),
        b"hi",
        202,
    )
    step(
        "unpublished thread",
        _write(bob, ts(23), permission_grant_id=by_path),
        b"hi",
        401,
        "RecordsGrantAuthorizationConditionPublicationRequired",
    )
    step(
        "reply under a thread grant",
        _write(
            bob,
            ts(24),
            published=True,
            path="thread/reply",
            parent_context_id=thread["contextId"],
            permission_grant_id=by_path,
        ),
        b"hi",
        401,
        "RecordsGrantAuthorizationScopeProtocolPathMismatch",
    )

    # --- reads by grant
    read_grant = grant({"interface": "Records", "method": "Read", "protocol": PROTOCOL})
    step(
        "read",
        rec.create_records_read(
            filter={"recordId": thread["recordId"]},
            signer=bob,
            message_timestamp=ts(20),
            permission_grant_id=read_grant,
        ),
        None,
        200,
    )
    step(
        "read before dateGranted",
        rec.create_records_read(
            filter={"recordId": thread["recordId"]},
            signer=bob,
            message_timestamp=ts(5),
            permission_grant_id=read_grant,
        ),
        None,
        401,
        "GrantAuthorizationGrantNotYetActive",
    )
    step(
        "read with a write grant",
        rec.create_records_read(
            filter={"recordId": thread["recordId"]},
            signer=bob,
            message_timestamp=ts(20),
            permission_grant_id=by_context,
        ),
        None,
        401,
        "GrantAuthorizationMethodMismatch",
    )
    step(
        "read a record of another protocol",
        rec.create_records_read(
            filter={"recordId": other_record["recordId"]},
            signer=bob,
            message_timestamp=ts(20),
            permission_grant_id=read_grant,
        ),
        None,
        401,
        "RecordsGrantAuthorizationScopeProtocolMismatch",
    )

    # --- protocols by grant
    configure_grant = grant(
        {"interface": "Protocols", "method": "Configure", "protocol": "https://example.com/p3"}
    )
    step(
        "configure in scope",
        _configure(bob, "https://example.com/p3", ts(20), configure_grant),
        None,
        202,
    )
    step(
        "configure out of scope",
        _configure(bob, "https://example.com/p4", ts(20), configure_grant),
        None,
        401,
        "ProtocolsGrantAuthorizationScopeProtocolMismatch",
    )
    # A query outside the grant's scope is not refused: it sees the published protocols only.
    step(
        "configure unpublished",
        _configure(alice, PRIVATE_PROTOCOL, ts(1), published=False),
        None,
        202,
    )
    private_grant = grant(
        {"interface": "Protocols", "method": "Query", "protocol": PRIVATE_PROTOCOL}
    )
    public_grant = grant({"interface": "Protocols", "method": "Query", "protocol": PROTOCOL})
    step(
        "protocols query in scope",
        _protocols_query(bob, ts(20), private_grant, PRIVATE_PROTOCOL),
        None,
        200,
        entries=1,
    )
    step(
        "protocols query out of scope",
        _protocols_query(bob, ts(20), public_grant, PRIVATE_PROTOCOL),
        None,
        200,
        entries=0,
    )
    step(
        "protocols query before dateGranted",
        _protocols_query(bob, ts(5), private_grant, PRIVATE_PROTOCOL),
        None,
        401,
        "GrantAuthorizationGrantNotYetActive",
    )

    # --- delegated grants (never stored, never schema-checked)
    def as_alice(when: str, grant_message: dict[str, Any], **options: Any) -> dict[str, Any]:
        return _write(bob, when, delegated_grant=grant_message, **options)

    good = {"dateExpires": EXPIRES, "delegated": True, "scope": records_write}
    step("delegated write", as_alice(ts(20), delegated(good)), b"hi", 202)
    step(
        "grant not delegated",
        as_alice(ts(20), delegated({**good, "delegated": False})),
        b"hi",
        400,
        "RecordsAuthorDelegatedGrantNotADelegatedGrant",
    )
    step(
        "granted to someone else",
        as_alice(ts(20), delegated(good, to=carol)),
        b"hi",
        400,
        "RecordsAuthorDelegatedGrantGrantedToAndOwnerSignatureMismatch",
    )
    step("grant data not JSON", as_alice(ts(20), delegated(raw=b"nope")), b"hi", 400)
    step(
        "grant data an array",
        as_alice(ts(20), delegated([1, 2])),
        b"hi",
        400,
        "RecordsAuthorDelegatedGrantNotADelegatedGrant",
    )
    no_expiry = {"delegated": True, "scope": records_write}
    step("no dateExpires never expires", as_alice(ts(0, 59), delegated(no_expiry)), b"hi", 202)
    array_expiry = {**no_expiry, "dateExpires": [ts(20)]}
    step("array dateExpires, before", as_alice(ts(19), delegated(array_expiry)), b"hi", 202)
    step(
        "array dateExpires, at",
        as_alice(ts(20), delegated(array_expiry)),
        b"hi",
        401,
        "GrantAuthorizationGrantExpired",
    )
    step(
        "object dateExpires",
        as_alice(ts(21), delegated({**no_expiry, "dateExpires": {"a": 1}})),
        b"hi",
        202,
    )
    step(
        "no scope",
        as_alice(ts(22), delegated({"delegated": True, "dateExpires": EXPIRES})),
        b"hi",
        401,
    )
    step(
        "string scope",
        as_alice(ts(23), delegated({**good, "scope": "Records"})),
        b"hi",
        401,
        "GrantAuthorizationInterfaceMismatch",
    )
    step(
        "null protocol in scope",
        as_alice(ts(24), delegated({**good, "scope": {**records_write, "protocol": None}})),
        b"hi",
        401,
        "RecordsGrantAuthorizationScopeProtocolMismatch",
    )
    step(
        "number contextId in scope",
        as_alice(ts(25), delegated({**good, "scope": {**records_write, "contextId": 5}})),
        b"hi",
        401,
        "RecordsGrantAuthorizationScopeContextIdMismatch",
    )
    step("null conditions", as_alice(ts(26), delegated({**good, "conditions": None})), b"hi", 202)

    delete_scope = {"interface": "Records", "method": "Delete", "protocol": PROTOCOL}
    delete_grant = delegated({"dateExpires": EXPIRES, "delegated": True, "scope": delete_scope})
    step(
        "delegated delete out of scope",
        rec.create_records_delete(
            record_id=other_record["recordId"],
            signer=bob,
            message_timestamp=ts(30),
            delegated_grant=delete_grant,
        ),
        None,
        401,
        "RecordsGrantAuthorizationDeleteProtocolScopeMismatch",
    )
    step(
        "delegated delete",
        rec.create_records_delete(
            record_id=thread["recordId"],
            signer=bob,
            message_timestamp=ts(30),
            delegated_grant=delete_grant,
        ),
        None,
        202,
    )
    query_scope = {"interface": "Records", "method": "Query", "protocol": PROTOCOL}
    query_grant_message = delegated(
        {"dateExpires": EXPIRES, "delegated": True, "scope": query_scope}
    )
    step(
        "delegated query",
        rec.create_records_query(
            filter={"protocol": PROTOCOL},
            signer=bob,
            message_timestamp=ts(31),
            delegated_grant=query_grant_message,
        ),
        None,
        200,
    )
    step(
        "delegated query out of scope",
        rec.create_records_query(
            filter={"protocol": OTHER_PROTOCOL},
            signer=bob,
            message_timestamp=ts(31),
            delegated_grant=query_grant_message,
        ),
        None,
        401,
        "RecordsGrantAuthorizationQueryOrSubscribeProtocolScopeMismatch",
    )
    return steps


def _grant_message(steps: list[Step], record_id: str) -> tuple[dict[str, Any], bytes]:
    for s in steps:
        if s.message.get("recordId") == record_id and s.data is not None:
            return s.message, s.data
    raise LookupError(record_id)


Answer = tuple[int, str, int | None]  # status, detail, number of entries


def _mismatches(steps: list[Step], answers: list[Answer]) -> list[str]:
    out = []
    for s, (status, detail, entries) in zip(steps, answers, strict=True):
        code_ok = s.code is None or detail.startswith(f"{s.code}:")
        entries_ok = s.entries is None or entries == s.entries
        if status != s.status or not code_ok or not entries_ok:
            out.append(
                f"{s.label}: expected {s.status} {s.code or ''} entries={s.entries}, "
                f"got {status} {detail[:120]} entries={entries}"
            )
    return out


class ReferencePipe:
    """The reference DWN behind ``interop/harness.mjs``: one JSON line in, one JSON line out."""

    def __init__(self, store_dir: Path) -> None:
        self.process = subprocess.Popen(
            ["node", "harness.mjs", "--store", str(store_dir)],
            cwd=INTEROP_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def process_message(self, tenant: str, message: dict[str, Any], data: bytes | None) -> Answer:
        assert self.process.stdin is not None and self.process.stdout is not None
        op = "query" if message["descriptor"]["method"] == "Query" else "process"
        request: dict[str, Any] = {"op": op, "tenant": tenant, "message": message}
        if data is not None:
            request["data"] = b64url_encode(data)
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self.process.stdout.readline())
        entries = reply.get("entries")
        return (
            int(reply["status"]["code"]),
            str(reply["status"]["detail"]),
            None if entries is None else len(entries),
        )

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=EXIT_TIMEOUT_SECONDS)


@pytest.fixture
def reference(tmp_path: Path) -> Iterator[ReferencePipe]:
    pipe = ReferencePipe(tmp_path / "reference")
    yield pipe
    pipe.close()


def build_messages_scenario() -> list[Step]:
    """MessagesRead and MessagesQuery under protocol-scoped grants."""
    alice, bob = Identity.generate(), Identity.generate()
    steps: list[Step] = []

    def step(
        label: str,
        message: dict[str, Any],
        data: bytes | None,
        status: int,
        code: str | None = None,
    ) -> None:
        steps.append(Step(label, alice.did, message, data, status, code))

    def grant(scope: dict[str, Any], when: str = ts(10)) -> tuple[dict[str, Any], bytes]:
        write, data = perms.create_grant(
            signer=alice, granted_to=bob.did, date_granted=when, date_expires=EXPIRES, scope=scope
        )
        step(f"grant {scope}", write.message, data, 202)
        return write.message, data

    def read(target: dict[str, Any], grant_id: str) -> dict[str, Any]:
        descriptor = {
            "interface": "Messages",
            "method": "Read",
            "messageTimestamp": ts(50),
            "messageCid": message_cid(target),
        }
        return {
            "descriptor": descriptor,
            "authorization": rec.create_authorization(
                descriptor, bob, permission_grant_id=grant_id
            ),
        }

    def query(protocols: list[str], grant_id: str) -> dict[str, Any]:
        descriptor = {
            "interface": "Messages",
            "method": "Query",
            "messageTimestamp": ts(50),
            "filters": [{"protocol": p} for p in protocols],
        }
        return {
            "descriptor": descriptor,
            "authorization": rec.create_authorization(
                descriptor, bob, permission_grant_id=grant_id
            ),
        }

    configure, configure_other = (
        _configure(alice, PROTOCOL, ts(1)),
        _configure(alice, OTHER_PROTOCOL, ts(1)),
    )
    step("configure", configure, None, 202)
    step("configure other", configure_other, None, 202)
    thread, other_record = _write(alice, ts(2)), _write(alice, ts(2), protocol=OTHER_PROTOCOL)
    step("thread", thread, b"hi", 202)
    step("record of another protocol", other_record, b"hi", 202)
    read_grant, read_grant_data = grant(
        {"interface": "Messages", "method": "Read", "protocol": PROTOCOL}
    )
    read_id = read_grant["recordId"]
    about_other, _ = grant({"interface": "Records", "method": "Read", "protocol": OTHER_PROTOCOL})
    revocation, revocation_data = perms.create_revocation(
        signer=alice,
        grant=PermissionGrant.parse(perms.with_encoded_data(read_grant, read_grant_data)),
        date_revoked=ts(0, 20),
    )
    step("revocation (after the reads' timestamp)", revocation.message, revocation_data, 202)
    delete = rec.create_records_delete(
        record_id=thread["recordId"], signer=alice, message_timestamp=ts(3)
    )
    step("delete the thread", delete, None, 202)

    step("read a record of the protocol", read(thread, read_id), None, 200)
    step("read a delete of such a record", read(delete, read_id), None, 200)
    step("read the grant itself", read(read_grant, read_id), None, 200)
    step("read a revocation of it", read(revocation.message, read_id), None, 200)
    step("read the protocol's configuration", read(configure, read_id), None, 200)
    step(
        "read a record of another protocol",
        read(other_record, read_id),
        None,
        401,
        "MessagesReadVerifyScopeFailed",
    )
    step(
        "read a grant about another protocol",
        read(about_other, read_id),
        None,
        401,
        "MessagesReadVerifyScopeFailed",
    )
    step(
        "read another configuration",
        read(configure_other, read_id),
        None,
        401,
        "MessagesReadVerifyScopeFailed",
    )

    query_grant, _ = grant({"interface": "Messages", "method": "Query", "protocol": PROTOCOL})
    step("query the protocol", query([PROTOCOL], query_grant["recordId"]), None, 200)
    step(
        "query another protocol too",
        query([PROTOCOL, OTHER_PROTOCOL], query_grant["recordId"]),
        None,
        401,
        "EventsGrantAuthorizationMismatchedProtocol",
    )
    return steps


SCENARIOS = {"records-and-protocols": build_scenario, "messages": build_messages_scenario}


@needs_reference
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_reference_answers_as_expected(reference: ReferencePipe, scenario: str) -> None:
    steps = SCENARIOS[scenario]()
    answers = [reference.process_message(s.tenant, s.message, s.data) for s in steps]
    assert _mismatches(steps, answers) == []


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_engine_answers_as_the_reference(tmp_path: Path, scenario: str) -> None:
    dwn = Dwn(Store(tmp_path / "dwn.sqlite"))
    steps = SCENARIOS[scenario]()
    answers: list[Answer] = []
    for s in steps:
        reply = dwn.process_message(s.tenant, s.message, s.data)
        if reply.code == NOT_IMPLEMENTED:
            dwn.close()
            pytest.skip(f"the engine does not implement {s.message['descriptor']['interface']} yet")
        answers.append(
            (reply.code, reply.detail, None if reply.entries is None else len(reply.entries))
        )
    dwn.close()
    assert _mismatches(steps, answers) == []
