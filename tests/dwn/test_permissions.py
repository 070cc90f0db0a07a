"""Permission grants, requests and revocations, and authorization by grant.

Unit level against a real SQLite store (grants written into it the way the RecordsWrite handler
stores them), with real Ed25519 signatures. Expected codes are the reference's (dwn-sdk-js
0.5.2); ``test_permissions_interop.py`` replays scenarios through both engines.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn import grant_authorization as ga
from p2psync.dwn import js_values as jsv
from p2psync.dwn import jws
from p2psync.dwn import permissions as perms
from p2psync.dwn import records_util as ru
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import b64url_decode, b64url_encode, json_compact, message_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.permission_grant import JSON_SYNTAX_ERROR, PermissionGrant, PermissionRequest, parse_json_data
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store

PROTOCOL = "https://example.com/chat"
OTHER_PROTOCOL = "https://example.com/other"


def ts(second: int, minute: int = 0) -> str:
    """A DWN timestamp on a fixed day, so tests order messages without a clock."""
    return f"2030-01-01T00:{minute:02d}:{second:02d}.000000Z"


GRANTED = ts(10)
EXPIRES = ts(0, minute=30)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "dwn.sqlite")
    yield s
    s.close()


@pytest.fixture(scope="module")
def alice() -> Identity:
    return Identity.generate()


@pytest.fixture(scope="module")
def bob() -> Identity:
    return Identity.generate()


@pytest.fixture(scope="module")
def carol() -> Identity:
    return Identity.generate("jwk")


def put_write(
    store: Store, tenant: str, write: RecordsWrite, data: bytes | None, *, latest: bool = True
) -> dict[str, Any]:
    """Store a write as the RecordsWrite handler does: data inline, indexes of its state."""
    message = write.message if data is None else perms.with_encoded_data(write.message, data)
    store.messages.put(tenant, message, write.construct_indexes(latest))
    return message


def make_grant(
    store: Store | None,
    grantor: Identity,
    grantee: Identity,
    scope: dict[str, Any],
    **options: Any,
) -> PermissionGrant:
    """Author a grant (stored in the grantor's DWN when ``store`` is given) and parse it back."""
    options.setdefault("date_granted", GRANTED)
    options.setdefault("date_expires", EXPIRES)
    write, data = perms.create_grant(signer=grantor, granted_to=grantee.did, scope=scope, **options)
    perms.validate_schema(write.message, data)
    message = perms.with_encoded_data(write.message, data)
    if store is not None:
        put_write(store, grantor.did, write, data)
    return PermissionGrant.parse(message)


def revoke(
    store: Store, grantor: Identity, grant: PermissionGrant, when: str, *, with_data: bool = True
) -> None:
    write, data = perms.create_revocation(signer=grantor, grant=grant, date_revoked=when)
    perms.validate_schema(write.message, data)
    put_write(store, grantor.did, write, data if with_data else None, latest=with_data)


def records_write(
    author: Identity,
    when: str,
    *,
    protocol: str | None = PROTOCOL,
    protocol_path: str = "thread",
    **options: Any,
) -> RecordsWrite:
    kwargs: dict[str, Any] = (
        {"protocol": protocol, "protocol_path": protocol_path} if protocol else {}
    )
    return RecordsWrite.create(
        signer=author, data=b"hello", message_timestamp=when, date_created=when, **kwargs, **options
    )


def descriptor_message(interface: str, method: str, when: str, **descriptor: Any) -> dict[str, Any]:
    """A bare message of any interface: the grant checks read only its descriptor."""
    return {
        "descriptor": {
            "interface": interface,
            "method": method,
            "messageTimestamp": when,
            **descriptor,
        }
    }


def code_of(excinfo: pytest.ExceptionInfo[DwnError]) -> str:
    return excinfo.value.code


# --------------------------------------------------------------------------- protocol constants


def test_protocol_definition_is_built_in_and_not_shared() -> None:
    definition = perms.builtin_protocol_definition(perms.PERMISSIONS_PROTOCOL_URI)
    assert definition is not None
    assert definition["protocol"] == "https://tbd.website/dwn/permissions"
    assert set(definition["types"]) == {"request", "grant", "revocation"}
    assert definition["structure"]["grant"]["revocation"]["$size"] == {"max": 10_000}
    assert definition["structure"]["grant"]["$actions"] == [
        {"who": "recipient", "of": "grant", "can": ["read", "query"]}
    ]
    definition["published"] = False  # a caller's copy; the original must not change
    assert perms.PROTOCOL_DEFINITION["published"] is True
    assert perms.builtin_protocol_definition(PROTOCOL) is None


# --------------------------------------------------------------------------- authoring and parsing


def test_create_grant_shape_and_parse(alice: Identity, bob: Identity) -> None:
    write, data = perms.create_grant(
        signer=alice,
        granted_to=bob.did,
        date_granted=GRANTED,
        date_expires=EXPIRES,
        description="chat access",
        delegated=False,
        # unnormalized on purpose: the grant must carry the normalized URL in scope and tag
        scope={"interface": "Records", "method": "Write", "protocol": "example.com/chat/"},
        conditions={"publication": "Required"},
    )
    d = write.message["descriptor"]
    assert d["protocol"] == perms.PERMISSIONS_PROTOCOL_URI
    assert d["protocolPath"] == "grant"
    assert d["recipient"] == bob.did
    assert d["dataFormat"] == "application/json"
    assert d["dateCreated"] == d["messageTimestamp"] == GRANTED
    assert d["tags"] == {"protocol": "http://example.com/chat"}
    assert "published" not in d
    # the data members in the order the reference writes them
    assert (
        data
        == json_compact(
            {
                "dateExpires": EXPIRES,
                "description": "chat access",
                "delegated": False,
                "scope": {
                    "interface": "Records",
                    "method": "Write",
                    "protocol": "http://example.com/chat",
                },
                "conditions": {"publication": "Required"},
            }
        ).encode()
    )
    perms.validate_schema(write.message, data)

    grant = PermissionGrant.parse(perms.with_encoded_data(write.message, data))
    assert grant.id == write.message["recordId"]
    assert grant.grantor == alice.did
    assert grant.grantee == bob.did
    assert grant.date_granted == GRANTED
    assert grant.date_expires == EXPIRES
    assert grant.delegated is False
    assert grant.description == "chat access"
    assert grant.request_id is None
    assert grant.scope["protocol"] == "http://example.com/chat"
    assert grant.conditions == {"publication": "Required"}


def test_create_grant_without_protocol_for_records_is_refused(
    alice: Identity, bob: Identity
) -> None:
    with pytest.raises(DwnError) as e:
        perms.create_grant(
            signer=alice,
            granted_to=bob.did,
            date_expires=EXPIRES,
            scope={"interface": "Records", "method": "Read"},
        )
    assert code_of(e) == "PermissionsProtocolCreateGrantRecordsScopeMissingProtocol"
    with pytest.raises(DwnError) as e:
        perms.create_request(
            signer=bob, delegated=False, scope={"interface": "Records", "method": "Read"}
        )
    assert code_of(e) == "PermissionsProtocolCreateRequestRecordsScopeMissingProtocol"


def test_create_request_and_revocation(alice: Identity, bob: Identity) -> None:
    request, request_data = perms.create_request(
        signer=bob,
        delegated=True,
        scope={"interface": "Protocols", "method": "Query", "protocol": PROTOCOL},
        date_requested=ts(5),
    )
    assert request.message["descriptor"]["protocolPath"] == "request"
    assert request.message["descriptor"]["tags"] == {"protocol": PROTOCOL}
    assert "recipient" not in request.message["descriptor"]
    perms.validate_schema(request.message, request_data)
    parsed = PermissionRequest.parse(perms.with_encoded_data(request.message, request_data))
    assert (
        parsed.requester == bob.did
        and parsed.delegated is True
        and parsed.scope["method"] == "Query"
    )

    grant = make_grant(
        None, alice, bob, {"interface": "Protocols", "method": "Query", "protocol": PROTOCOL}
    )
    revocation, data = perms.create_revocation(
        signer=alice, grant=grant, date_revoked=ts(20), description="done"
    )
    d = revocation.message["descriptor"]
    assert d["protocolPath"] == "grant/revocation"
    assert d["parentId"] == grant.id
    assert revocation.message["contextId"] == f"{grant.id}/{revocation.message['recordId']}"
    assert d["tags"] == {"protocol": PROTOCOL}
    assert d["messageTimestamp"] == ts(20)
    assert data == b'{"description":"done"}'
    perms.validate_schema(revocation.message, data)

    unscoped = make_grant(None, alice, bob, {"interface": "Messages", "method": "Read"})
    revocation, _ = perms.create_revocation(signer=alice, grant=unscoped)
    assert "tags" not in revocation.message["descriptor"]


def test_grant_parse_needs_encoded_data(alice: Identity, bob: Identity) -> None:
    write, _ = perms.create_grant(
        signer=alice,
        granted_to=bob.did,
        date_expires=EXPIRES,
        scope={"interface": "Messages", "method": "Read"},
    )
    with pytest.raises(DwnError) as e:
        PermissionGrant.parse(write.message)
    assert code_of(e) == jsv.JS_TYPE_ERROR
    with pytest.raises(DwnError) as e:
        PermissionGrant.parse({**write.message, "encodedData": b64url_encode(b"null")})
    assert code_of(e) == jsv.JS_TYPE_ERROR
    with pytest.raises(DwnError) as e:
        PermissionGrant.parse({**write.message, "encodedData": b64url_encode(b"{nope")})
    assert code_of(e) == JSON_SYNTAX_ERROR
    # Any other JSON value parses, with every data member absent (JS reads them as undefined).
    odd = PermissionGrant.parse({**write.message, "encodedData": b64url_encode(b"[1,2]")})
    assert odd.scope is None and odd.date_expires is None and odd.grantee == bob.did


def test_parse_json_data_follows_javascript() -> None:
    assert parse_json_data(b'\xef\xbb\xbf{"a":1}') == {"a": 1}  # BOM dropped
    assert parse_json_data(b'"\xff"') == "\ufffd"  # invalid UTF-8 replaced
    for text in (b"NaN", b"[Infinity]", b"-Infinity", b"", b"{'a':1}", b"[1,]"):
        with pytest.raises(DwnError) as e:
            parse_json_data(text)
        assert code_of(e) == JSON_SYNTAX_ERROR, text
        assert e.value.status == jsv.THROWN_STATUS


# --------------------------------------------------------------------------- validate_schema


def _grant_write(
    alice: Identity,
    bob: Identity,
    data_obj: Any,
    *,
    tags: dict[str, Any] | None = None,
    path: str = "grant",
) -> tuple[dict[str, Any], bytes]:
    data = json_compact(data_obj).encode()
    write = RecordsWrite.create(
        signer=alice,
        recipient=bob.did,
        protocol=perms.PERMISSIONS_PROTOCOL_URI,
        protocol_path=path,
        data_format="application/json",
        data=data,
        tags=tags,
    )
    return write.message, data


@pytest.mark.parametrize(
    ("data_obj", "tags", "code"),
    [
        # codes and their order as the reference reports them (observed on 0.5.2)
        (
            {
                "dateExpires": EXPIRES,
                "scope": {"interface": "Records", "method": "Write", "protocol": PROTOCOL},
            },
            None,
            "PermissionsProtocolValidateScopeMissingProtocolTag",
        ),
        (
            {
                "dateExpires": EXPIRES,
                "scope": {"interface": "Records", "method": "Write", "protocol": PROTOCOL},
            },
            {"other": PROTOCOL},
            "PermissionsProtocolValidateScopeMissingProtocolTag",
        ),
        (
            {
                "dateExpires": EXPIRES,
                "scope": {"interface": "Records", "method": "Write", "protocol": PROTOCOL},
            },
            {"protocol": OTHER_PROTOCOL},
            "PermissionsProtocolValidateScopeProtocolMismatch",
        ),
        (
            {
                "dateExpires": EXPIRES,
                "scope": {
                    "interface": "Records",
                    "method": "Write",
                    "protocol": PROTOCOL,
                    "contextId": "a",
                    "protocolPath": "b",
                },
            },
            {"protocol": PROTOCOL},
            "PermissionsProtocolValidateScopeContextIdProhibitedProperties",
        ),
        (
            {
                "dateExpires": "2030-01-01T00:00:00Z",
                "scope": {"interface": "Messages", "method": "Read"},
            },
            None,
            "SchemaValidatorFailure",
        ),
        (
            {
                "dateExpires": EXPIRES,
                "extra": 1,
                "scope": {"interface": "Messages", "method": "Read"},
            },
            None,
            "SchemaValidatorAdditionalPropertyNotAllowed",
        ),
        ({"scope": {"interface": "Messages", "method": "Read"}}, None, "SchemaValidatorFailure"),
        (
            {
                "dateExpires": EXPIRES,
                "scope": {"interface": "Protocols", "method": "Query", "protocol": None},
            },
            None,
            "SchemaValidatorFailure",
        ),
        (None, None, "SchemaValidatorFailure"),
        # not answered 400 by the reference (it throws), but refused all the same
        (
            {
                "dateExpires": EXPIRES,
                "scope": {"interface": "Records", "method": "Write", "protocol": "example.com/x"},
            },
            {"protocol": "example.com/x"},
            "UrlProtocolNotNormalized",
        ),
        (
            # the schema's pattern takes it; Temporal does not
            {
                "dateExpires": "2030-19-01T00:00:00.000000Z",
                "scope": {"interface": "Messages", "method": "Read"},
            },
            None,
            "TimestampInvalid",
        ),
    ],
)
def test_validate_schema_refuses_grants(
    alice: Identity, bob: Identity, data_obj: Any, tags: dict[str, Any] | None, code: str
) -> None:
    message, data = _grant_write(alice, bob, data_obj, tags=tags)
    with pytest.raises(DwnError) as e:
        perms.validate_schema(message, data)
    assert code_of(e) == code
    # the status a handler falls back to when it does not catch the error, as the reference
    thrown = code in ("UrlProtocolNotNormalized", "TimestampInvalid")
    assert e.value.status == (jsv.THROWN_STATUS if thrown else 400)


@pytest.mark.parametrize(
    "data_obj",
    [
        {"dateExpires": EXPIRES, "scope": {"interface": "Messages", "method": "Read"}},
        # the grant schema lets a Records scope go without a protocol (only createGrant refuses it)
        {"dateExpires": EXPIRES, "scope": {"interface": "Records", "method": "Write"}},
        {
            "dateExpires": EXPIRES,
            "scope": {
                "interface": "Records",
                "method": "Read",
                "protocol": PROTOCOL,
                "contextId": "abc",
            },
            "conditions": {"publication": "Prohibited"},
        },
    ],
)
def test_validate_schema_accepts_grants(
    alice: Identity, bob: Identity, data_obj: dict[str, Any]
) -> None:
    tags = {"protocol": PROTOCOL} if "protocol" in data_obj["scope"] else None
    message, data = _grant_write(alice, bob, data_obj, tags=tags)
    perms.validate_schema(message, data)


def test_validate_schema_other_paths(alice: Identity, bob: Identity) -> None:
    message, data = _grant_write(alice, bob, "not json", path="request")
    with pytest.raises(DwnError) as e:
        perms.validate_schema(message, b"not json")
    assert code_of(e) == JSON_SYNTAX_ERROR

    message, data = _grant_write(
        alice, bob, {"scope": {"interface": "Messages", "method": "Read"}}, path="request"
    )
    with pytest.raises(DwnError) as e:
        perms.validate_schema(message, data)  # `delegated` is required in a request
    assert code_of(e) == "SchemaValidatorFailure"

    message, data = _grant_write(alice, bob, {"description": 5}, path="request")
    message = copy.deepcopy(message)
    message["descriptor"]["protocolPath"] = "grant/revocation"
    with pytest.raises(DwnError) as e:
        perms.validate_schema(message, data)
    assert code_of(e) == "SchemaValidatorFailure"

    message["descriptor"]["protocolPath"] = "elsewhere"
    with pytest.raises(DwnError) as e:
        perms.validate_schema(message, b"{}")
    assert code_of(e) == "PermissionsProtocolValidateSchemaUnexpectedRecord"


# --------------------------------------------------------------------------- fetch_grant


def test_fetch_grant(store: Store, alice: Identity, bob: Identity) -> None:
    grant = make_grant(store, alice, bob, {"interface": "Messages", "method": "Query"})
    fetched = perms.fetch_grant(alice.did, store, grant.id)
    assert (fetched.id, fetched.grantor, fetched.grantee) == (grant.id, alice.did, bob.did)
    assert fetched.scope == {"interface": "Messages", "method": "Query"}

    with pytest.raises(DwnError) as e:
        perms.fetch_grant(bob.did, store, grant.id)  # another tenant's DWN
    assert code_of(e) == "GrantAuthorizationGrantMissing"
    assert e.value.status == 401

    other = records_write(alice, ts(3))
    put_write(store, alice.did, other, b"hello")
    with pytest.raises(DwnError) as e:
        perms.fetch_grant(alice.did, store, other.message["recordId"])  # not a grant
    assert code_of(e) == "GrantAuthorizationGrantMissing"

    # a grant written without its data is not the latest base state, so it is not found
    write, _ = perms.create_grant(
        signer=alice,
        granted_to=bob.did,
        date_expires=EXPIRES,
        scope={"interface": "Messages", "method": "Read"},
    )
    put_write(store, alice.did, write, None, latest=False)
    with pytest.raises(DwnError) as e:
        perms.fetch_grant(alice.did, store, write.message["recordId"])
    assert code_of(e) == "GrantAuthorizationGrantMissing"


# --------------------------------------------------------------------------- base validation


def test_grant_active_window_is_judged_by_message_timestamp(
    store: Store, alice: Identity, bob: Identity
) -> None:
    grant = make_grant(store, alice, bob, {"interface": "Protocols", "method": "Query"})

    def check(when: str) -> None:
        ga.authorize_protocols_query(
            descriptor_message("Protocols", "Query", when), alice.did, bob.did, grant, store
        )

    check(GRANTED)  # inclusive start
    check(ts(59, minute=29))
    with pytest.raises(DwnError) as e:
        check(ts(9))
    assert code_of(e) == "GrantAuthorizationGrantNotYetActive"
    with pytest.raises(DwnError) as e:
        check(EXPIRES)  # exclusive end
    assert code_of(e) == "GrantAuthorizationGrantExpired"
    assert e.value.status == 401


def test_grantor_and_grantee_must_match(
    store: Store, alice: Identity, bob: Identity, carol: Identity
) -> None:
    grant = make_grant(store, alice, bob, {"interface": "Protocols", "method": "Query"})
    message = descriptor_message("Protocols", "Query", ts(30))
    with pytest.raises(DwnError) as e:
        ga.authorize_protocols_query(message, alice.did, carol.did, grant, store)
    assert code_of(e) == "GrantAuthorizationNotGrantedToAuthor"
    with pytest.raises(DwnError) as e:
        ga.authorize_protocols_query(message, carol.did, bob.did, grant, store)
    assert code_of(e) == "GrantAuthorizationNotGrantedForTenant"
    # grantee is checked first
    with pytest.raises(DwnError) as e:
        ga.authorize_protocols_query(message, carol.did, carol.did, grant, store)
    assert code_of(e) == "GrantAuthorizationNotGrantedToAuthor"


def test_interface_and_method_scope(store: Store, alice: Identity, bob: Identity) -> None:
    grant = make_grant(store, alice, bob, {"interface": "Protocols", "method": "Query"})
    with pytest.raises(DwnError) as e:
        ga.perform_base_validation(
            descriptor_message("Messages", "Query", ts(30)), alice.did, bob.did, grant, store
        )
    assert code_of(e) == "GrantAuthorizationInterfaceMismatch"
    with pytest.raises(DwnError) as e:
        ga.perform_base_validation(
            descriptor_message("Protocols", "Configure", ts(30)), alice.did, bob.did, grant, store
        )
    assert code_of(e) == "GrantAuthorizationMethodMismatch"


def test_revocation_is_judged_by_message_timestamps(
    store: Store, alice: Identity, bob: Identity
) -> None:
    grant = make_grant(store, alice, bob, {"interface": "Protocols", "method": "Query"})

    def check(when: str) -> None:
        ga.authorize_protocols_query(
            descriptor_message("Protocols", "Query", when), alice.did, bob.did, grant, store
        )

    # a revocation stored without its data does not count (not the latest base state)
    revoke(store, alice, grant, ts(20), with_data=False)
    check(ts(40))

    revoke(store, alice, grant, ts(40))
    revoke(store, alice, grant, ts(30))  # the oldest revocation decides
    check(ts(29))  # signed before the revocation: still authorized, whenever it arrives
    for when in (ts(30), ts(31), ts(45)):
        with pytest.raises(DwnError) as e:
            check(when)
        assert code_of(e) == "GrantAuthorizationGrantRevoked"


def test_revocation_of_another_grant_does_not_count(
    store: Store, alice: Identity, bob: Identity
) -> None:
    grant = make_grant(store, alice, bob, {"interface": "Protocols", "method": "Query"})
    other = make_grant(
        store, alice, bob, {"interface": "Protocols", "method": "Query"}, description="other"
    )
    assert other.id != grant.id
    revoke(store, alice, other, ts(15))
    ga.authorize_protocols_query(
        descriptor_message("Protocols", "Query", ts(20)), alice.did, bob.did, grant, store
    )


# --------------------------------------------------------------------------- Records scope


def test_records_write_scope(store: Store, alice: Identity, bob: Identity) -> None:
    grant = make_grant(
        store, alice, bob, {"interface": "Records", "method": "Write", "protocol": PROTOCOL}
    )
    ga.authorize_records_write(records_write(bob, ts(30)), alice.did, bob.did, grant, store)

    with pytest.raises(DwnError) as e:
        ga.authorize_records_write(
            records_write(bob, ts(30), protocol=OTHER_PROTOCOL), alice.did, bob.did, grant, store
        )
    assert code_of(e) == "RecordsGrantAuthorizationScopeProtocolMismatch"
    with pytest.raises(DwnError) as e:
        ga.authorize_records_write(
            records_write(bob, ts(30), protocol=None), alice.did, bob.did, grant, store
        )
    assert code_of(e) == "RecordsGrantAuthorizationScopeProtocolMismatch"


def test_records_grant_without_protocol_matches_only_records_without_one(
    store: Store, alice: Identity, bob: Identity
) -> None:
    # The grant schema allows it (only createGrant refuses it); the reference then compares the
    # two protocols strictly, undefined === undefined included.
    message, data = _grant_write(
        alice, bob, {"dateExpires": EXPIRES, "scope": {"interface": "Records", "method": "Write"}}
    )
    grant = PermissionGrant.parse(perms.with_encoded_data(message, data))
    ga.authorize_records_write(
        records_write(bob, ts(30), protocol=None), alice.did, bob.did, grant, store
    )
    with pytest.raises(DwnError) as e:
        ga.authorize_records_write(records_write(bob, ts(30)), alice.did, bob.did, grant, store)
    assert code_of(e) == "RecordsGrantAuthorizationScopeProtocolMismatch"


def test_records_context_and_protocol_path_scope(
    store: Store, alice: Identity, bob: Identity
) -> None:
    thread = records_write(alice, ts(1))
    context = thread.message["contextId"]
    by_context = make_grant(
        store,
        alice,
        bob,
        {"interface": "Records", "method": "Write", "protocol": PROTOCOL, "contextId": context},
    )
    reply = records_write(bob, ts(30), protocol_path="thread/reply", parent_context_id=context)
    ga.authorize_records_write(
        reply, alice.did, bob.did, by_context, store
    )  # a descendant: prefix match
    with pytest.raises(DwnError) as e:
        ga.authorize_records_write(
            records_write(bob, ts(30)), alice.did, bob.did, by_context, store
        )
    assert code_of(e) == "RecordsGrantAuthorizationScopeContextIdMismatch"

    by_path = make_grant(
        store,
        alice,
        bob,
        {"interface": "Records", "method": "Write", "protocol": PROTOCOL, "protocolPath": "thread"},
    )
    ga.authorize_records_write(records_write(bob, ts(30)), alice.did, bob.did, by_path, store)
    with pytest.raises(DwnError) as e:
        ga.authorize_records_write(reply, alice.did, bob.did, by_path, store)
    assert code_of(e) == "RecordsGrantAuthorizationScopeProtocolPathMismatch"


@pytest.mark.parametrize(
    ("publication", "published", "code"),
    [
        ("Required", None, "RecordsGrantAuthorizationConditionPublicationRequired"),
        ("Required", False, "RecordsGrantAuthorizationConditionPublicationRequired"),
        ("Required", True, None),
        ("Prohibited", True, "RecordsGrantAuthorizationConditionPublicationProhibited"),
        ("Prohibited", False, None),
        ("Prohibited", None, None),
    ],
)
def test_publication_condition(
    store: Store,
    alice: Identity,
    bob: Identity,
    publication: str,
    published: bool | None,
    code: str | None,
) -> None:
    grant = make_grant(
        store,
        alice,
        bob,
        {"interface": "Records", "method": "Write", "protocol": PROTOCOL},
        conditions={"publication": publication},
    )
    write = records_write(bob, ts(30), published=published)
    if code is None:
        ga.authorize_records_write(write, alice.did, bob.did, grant, store)
    else:
        with pytest.raises(DwnError) as e:
            ga.authorize_records_write(write, alice.did, bob.did, grant, store)
        assert code_of(e) == code


def test_records_read_query_delete_scope(store: Store, alice: Identity, bob: Identity) -> None:
    target = records_write(alice, ts(1))
    read_grant = make_grant(
        store, alice, bob, {"interface": "Records", "method": "Read", "protocol": PROTOCOL}
    )
    read = descriptor_message(
        "Records", "Read", ts(30), filter={"recordId": target.message["recordId"]}
    )
    ga.authorize_records_read(read, target, alice.did, bob.did, read_grant, store)
    with pytest.raises(DwnError) as e:
        ga.authorize_records_read(
            read,
            records_write(alice, ts(1), protocol=OTHER_PROTOCOL),
            alice.did,
            bob.did,
            read_grant,
            store,
        )
    assert code_of(e) == "RecordsGrantAuthorizationScopeProtocolMismatch"

    query_grant = make_grant(
        store, alice, bob, {"interface": "Records", "method": "Query", "protocol": PROTOCOL}
    )
    ga.authorize_records_query_or_subscribe(
        descriptor_message("Records", "Query", ts(30), filter={"protocol": PROTOCOL}),
        alice.did,
        bob.did,
        query_grant,
        store,
    )
    for flt in ({"protocol": OTHER_PROTOCOL}, {"schema": "https://example.com/s"}):
        with pytest.raises(DwnError) as e:
            ga.authorize_records_query_or_subscribe(
                descriptor_message("Records", "Query", ts(30), filter=flt),
                alice.did,
                bob.did,
                query_grant,
                store,
            )
        assert code_of(e) == "RecordsGrantAuthorizationQueryOrSubscribeProtocolScopeMismatch"

    delete_grant = make_grant(
        store, alice, bob, {"interface": "Records", "method": "Delete", "protocol": PROTOCOL}
    )
    delete = descriptor_message("Records", "Delete", ts(30), recordId=target.message["recordId"])
    ga.authorize_records_delete(delete, target, alice.did, bob.did, delete_grant, store)
    with pytest.raises(DwnError) as e:
        ga.authorize_records_delete(
            delete,
            records_write(alice, ts(1), protocol=None),
            alice.did,
            bob.did,
            delete_grant,
            store,
        )
    assert code_of(e) == "RecordsGrantAuthorizationDeleteProtocolScopeMismatch"


# --------------------------------------------------------------------------- Protocols scope


def test_protocols_configure_and_query_scope(store: Store, alice: Identity, bob: Identity) -> None:
    def configure(protocol: str) -> dict[str, Any]:
        return descriptor_message(
            "Protocols", "Configure", ts(30), definition={"protocol": protocol}
        )

    unrestricted = make_grant(store, alice, bob, {"interface": "Protocols", "method": "Configure"})
    ga.authorize_protocols_configure(
        configure(OTHER_PROTOCOL), alice.did, bob.did, unrestricted, store
    )

    scoped = make_grant(
        store, alice, bob, {"interface": "Protocols", "method": "Configure", "protocol": PROTOCOL}
    )
    ga.authorize_protocols_configure(configure(PROTOCOL), alice.did, bob.did, scoped, store)
    with pytest.raises(DwnError) as e:
        ga.authorize_protocols_configure(
            configure(OTHER_PROTOCOL), alice.did, bob.did, scoped, store
        )
    assert code_of(e) == "ProtocolsGrantAuthorizationScopeProtocolMismatch"

    query = make_grant(
        store, alice, bob, {"interface": "Protocols", "method": "Query", "protocol": PROTOCOL}
    )
    ga.authorize_protocols_query(
        descriptor_message("Protocols", "Query", ts(30), filter={"protocol": PROTOCOL}),
        alice.did,
        bob.did,
        query,
        store,
    )
    for descriptor in ({}, {"filter": {"protocol": OTHER_PROTOCOL}}):
        with pytest.raises(DwnError) as e:
            ga.authorize_protocols_query(
                descriptor_message("Protocols", "Query", ts(30), **descriptor),
                alice.did,
                bob.did,
                query,
                store,
            )
        assert code_of(e) == "ProtocolsGrantAuthorizationQueryProtocolScopeMismatch"


# --------------------------------------------------------------------------- Messages scope


def test_messages_query_scope(store: Store, alice: Identity, bob: Identity) -> None:
    grant = make_grant(
        store, alice, bob, {"interface": "Messages", "method": "Query", "protocol": PROTOCOL}
    )
    ok = descriptor_message("Messages", "Query", ts(30), filters=[{"protocol": PROTOCOL}])
    ga.authorize_messages_query_or_subscribe(ok, alice.did, bob.did, grant, store)
    for filters in (
        [],
        [{"protocol": PROTOCOL}, {"protocol": OTHER_PROTOCOL}],
        [{"interface": "Records"}],
    ):
        message = descriptor_message("Messages", "Query", ts(30), filters=filters)
        if not filters:
            ga.authorize_messages_query_or_subscribe(message, alice.did, bob.did, grant, store)
            continue
        with pytest.raises(DwnError) as e:
            ga.authorize_messages_query_or_subscribe(message, alice.did, bob.did, grant, store)
        # the reference's enum value for MessagesGrantAuthorizationMismatchedProtocol
        assert code_of(e) == "EventsGrantAuthorizationMismatchedProtocol"

    unscoped = make_grant(store, alice, bob, {"interface": "Messages", "method": "Query"})
    ga.authorize_messages_query_or_subscribe(
        descriptor_message("Messages", "Query", ts(30), filters=[{"protocol": OTHER_PROTOCOL}]),
        alice.did,
        bob.did,
        unscoped,
        store,
    )


def test_messages_read_scope(store: Store, alice: Identity, bob: Identity) -> None:
    grant = make_grant(
        store, alice, bob, {"interface": "Messages", "method": "Read", "protocol": PROTOCOL}
    )
    read = descriptor_message("Messages", "Read", ts(30), messageCid="bafy")

    def check(target: dict[str, Any]) -> None:
        ga.authorize_messages_read(read, target, alice.did, bob.did, grant, store)

    in_protocol = put_write(store, alice.did, records_write(alice, ts(1)), b"hello")
    check(in_protocol)
    # a delete is judged by its record's newest write
    check(descriptor_message("Records", "Delete", ts(2), recordId=in_protocol["recordId"]))
    # permission records about the protocol are in scope: grants, requests, and revocations of them
    about = make_grant(
        store, alice, bob, {"interface": "Records", "method": "Read", "protocol": PROTOCOL}
    )
    check(about.message)
    request, request_data = perms.create_request(
        signer=bob,
        delegated=False,
        scope={"interface": "Records", "method": "Read", "protocol": PROTOCOL},
    )
    check(perms.with_encoded_data(request.message, request_data))
    revocation, revocation_data = perms.create_revocation(
        signer=alice, grant=about, date_revoked=ts(3)
    )
    check(perms.with_encoded_data(revocation.message, revocation_data))
    check(descriptor_message("Protocols", "Configure", ts(2), definition={"protocol": PROTOCOL}))

    refused = [
        put_write(store, alice.did, records_write(alice, ts(1), protocol=OTHER_PROTOCOL), b"hello"),
        put_write(store, alice.did, records_write(alice, ts(1), protocol=None), b"hello"),
        make_grant(
            store,
            alice,
            bob,
            {"interface": "Records", "method": "Read", "protocol": OTHER_PROTOCOL},
        ).message,
        make_grant(store, alice, bob, {"interface": "Messages", "method": "Read"}).message,
        descriptor_message(
            "Protocols", "Configure", ts(2), definition={"protocol": OTHER_PROTOCOL}
        ),
    ]
    for target in refused:
        with pytest.raises(DwnError) as e:
            check(target)
        assert code_of(e) == "MessagesReadVerifyScopeFailed"

    with pytest.raises(DwnError) as e:
        check(descriptor_message("Records", "Delete", ts(2), recordId="bafyunknown"))
    assert code_of(e) == "RecordsWriteGetNewestWriteRecordNotFound"

    unscoped = make_grant(store, alice, bob, {"interface": "Messages", "method": "Read"})
    ga.authorize_messages_read(read, refused[0], alice.did, bob.did, unscoped, store)


# --------------------------------------------------------------------------- delegated grants


def _delegated_grant(
    alice: Identity,
    bob: Identity,
    *,
    delegated: bool | None = True,
    grantee: Identity | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    write, data = perms.create_grant(
        signer=alice,
        granted_to=(grantee or bob).did,
        date_granted=GRANTED,
        date_expires=EXPIRES,
        delegated=delegated,
        scope={"interface": "Records", "method": "Write", "protocol": PROTOCOL},
        description=description,
    )
    return perms.with_encoded_data(write.message, data)


def test_delegated_write_passes_referential_integrity(
    store: Store, alice: Identity, bob: Identity
) -> None:
    grant_message = _delegated_grant(alice, bob)
    write = records_write(bob, ts(30), delegated_grant=grant_message)
    parsed = RecordsWrite.parse(
        write.message
    )  # runs validate_delegated_grant_referential_integrity
    assert parsed.author == alice.did and parsed.signer == bob.did
    assert ru.is_signed_by_author_delegate(write.message)
    assert not ru.is_signed_by_owner_delegate(write.message)
    # and the delegate is authorized as the handler does it: expected grantor = author
    ga.authorize_records_write(
        write, parsed.author or "", parsed.signer or "", PermissionGrant.parse(grant_message), store
    )


def test_delegated_grant_must_be_delegated(alice: Identity, bob: Identity) -> None:
    for delegated in (False, None):
        write = records_write(
            bob, ts(30), delegated_grant=_delegated_grant(alice, bob, delegated=delegated)
        )
        with pytest.raises(DwnError) as e:
            ru.validate_delegated_grant_referential_integrity(
                write.message, write.signature_payload
            )
        assert code_of(e) == "RecordsAuthorDelegatedGrantNotADelegatedGrant"


def test_delegated_grant_must_be_granted_to_the_signer(
    alice: Identity, bob: Identity, carol: Identity
) -> None:
    write = records_write(bob, ts(30), delegated_grant=_delegated_grant(alice, bob, grantee=carol))
    with pytest.raises(DwnError) as e:
        ru.validate_delegated_grant_referential_integrity(write.message, write.signature_payload)
    assert code_of(e) == "RecordsAuthorDelegatedGrantGrantedToAndOwnerSignatureMismatch"


def test_delegated_grant_cid_and_existence(alice: Identity, bob: Identity) -> None:
    grant_message = _delegated_grant(alice, bob)
    write = records_write(bob, ts(30), delegated_grant=grant_message)
    payload = write.signature_payload
    assert payload is not None and payload["delegatedGrantId"] == message_cid(grant_message)

    swapped = copy.deepcopy(write.message)
    another = _delegated_grant(alice, bob, description="another")  # valid, but not the one signed
    swapped["authorization"]["authorDelegatedGrant"] = another
    with pytest.raises(DwnError) as e:
        ru.validate_delegated_grant_referential_integrity(swapped, payload)
    assert code_of(e) == "RecordsAuthorDelegatedGrantCidMismatch"

    missing = copy.deepcopy(write.message)
    del missing["authorization"]["authorDelegatedGrant"]
    with pytest.raises(DwnError) as e:
        ru.validate_delegated_grant_referential_integrity(missing, payload)
    assert code_of(e) == "RecordsAuthorDelegatedGrantAndIdExistenceMismatch"

    plain = records_write(bob, ts(30))
    with_grant = copy.deepcopy(plain.message)
    with_grant["authorization"]["authorDelegatedGrant"] = grant_message
    with pytest.raises(DwnError) as e:
        ru.validate_delegated_grant_referential_integrity(with_grant, plain.signature_payload)
    assert code_of(e) == "RecordsAuthorDelegatedGrantAndIdExistenceMismatch"
    ru.validate_delegated_grant_referential_integrity(plain.message, plain.signature_payload)


def test_owner_delegated_grant(alice: Identity, bob: Identity, carol: Identity) -> None:
    """Carol's record retained in Alice's DWN, owner-signed by Bob under Alice's delegated grant."""
    grant_message = _delegated_grant(alice, bob)
    write = records_write(carol, ts(30))
    message = copy.deepcopy(write.message)
    owner_payload = {
        "descriptorCid": jws.decode_payload(message["authorization"]["signature"])["descriptorCid"],
        "delegatedGrantId": message_cid(grant_message),
    }
    message["authorization"]["ownerSignature"] = jws.sign_payload(owner_payload, bob)
    message["authorization"]["ownerDelegatedGrant"] = grant_message
    ru.validate_delegated_grant_referential_integrity(
        message, write.signature_payload, owner_payload
    )

    parsed = RecordsWrite.parse(message)
    assert parsed.owner == alice.did and parsed.owner_signature_signer == bob.did

    with pytest.raises(DwnError) as e:
        ru.validate_delegated_grant_referential_integrity(message, write.signature_payload, None)
    assert code_of(e) == "RecordsOwnerDelegatedGrantAndIdExistenceMismatch"

    by_carol = copy.deepcopy(message)
    by_carol["authorization"]["ownerSignature"] = jws.sign_payload(owner_payload, carol)
    with pytest.raises(DwnError) as e:
        ru.validate_delegated_grant_referential_integrity(
            by_carol, write.signature_payload, owner_payload
        )
    assert code_of(e) == "RecordsOwnerDelegatedGrantGrantedToAndOwnerSignatureMismatch"

    wrong_id = {**owner_payload, "delegatedGrantId": message_cid(write.message)}
    with pytest.raises(DwnError) as e:
        ru.validate_delegated_grant_referential_integrity(
            message, write.signature_payload, wrong_id
        )
    assert code_of(e) == "RecordsOwnerDelegatedGrantCidMismatch"


def test_delegated_grant_with_odd_data_follows_javascript(
    store: Store, alice: Identity, bob: Identity
) -> None:
    """A delegated grant's data is never schema-checked; JS semantics decide what it means."""
    grant_message = _delegated_grant(alice, bob)
    data = {
        "delegated": True,
        "scope": {"interface": "Records", "method": "Write", "protocol": PROTOCOL},
    }
    # no dateExpires: `ts >= undefined` is false in JS, so the grant never expires
    odd = {**grant_message, "encodedData": b64url_encode(json_compact(data).encode())}
    grant = PermissionGrant.parse(odd)
    ga.authorize_records_write(
        records_write(bob, ts(0, minute=59)), alice.did, bob.did, grant, store
    )
    # an array dateExpires compares as its joined string
    odd_data = {**data, "dateExpires": [ts(20)]}
    grant = PermissionGrant.parse(
        {**grant_message, "encodedData": b64url_encode(json_compact(odd_data).encode())}
    )
    ga.authorize_records_write(records_write(bob, ts(19)), alice.did, bob.did, grant, store)
    with pytest.raises(DwnError) as e:
        ga.authorize_records_write(records_write(bob, ts(20)), alice.did, bob.did, grant, store)
    assert code_of(e) == "GrantAuthorizationGrantExpired"
    # a missing scope is a TypeError in the reference, after the time checks
    no_scope = {"delegated": True, "dateExpires": EXPIRES}
    grant = PermissionGrant.parse(
        {**grant_message, "encodedData": b64url_encode(json_compact(no_scope).encode())}
    )
    with pytest.raises(DwnError) as e:
        ga.authorize_records_write(records_write(bob, ts(30)), alice.did, bob.did, grant, store)
    assert code_of(e) == jsv.JS_TYPE_ERROR
    assert b64url_decode(grant_message["encodedData"])  # the original is untouched


# --------------------------------------------------------------------------- records_util helpers


def test_build_tag_indexes_and_parent_context() -> None:
    assert ru.build_tag_indexes({"a": 1, "b": ["x", "y"], "c": True}) == {
        "tag.a": 1,
        "tag.b": ["x", "y"],
        "tag.c": True,
    }
    assert ru.get_parent_context_from_of_context_id("a/b/c") == "a/b"
    assert ru.get_parent_context_from_of_context_id("a") == ""
    assert ru.get_parent_context_from_of_context_id(None) is None


def test_convert_filter() -> None:
    converted = ru.convert_filter(
        {
            "protocol": PROTOCOL,
            "tags": {"topic": {"startsWith": "sp"}, "n": 3, "list": ["a", "b"]},
            "dateCreated": {"from": ts(1), "to": ts(2)},
            "datePublished": {"from": ts(3)},
            "dateUpdated": {"to": ts(4)},
            "contextId": "ctx/1",
            "author": [],
            "recipient": ["did:example:x"],
        }
    )
    assert converted == {
        "protocol": PROTOCOL,
        "dateCreated": {"gte": ts(1), "lt": ts(2)},
        "datePublished": {"gte": ts(3)},
        "contextId": {"gte": "ctx/1", "lt": "ctx/1\uffff"},
        "recipient": ["did:example:x"],
        "tag.topic": {"gte": "sp", "lt": "sp\uffff"},
        "tag.n": 3,
        "tag.list": ["a", "b"],
        "published": True,
        "messageTimestamp": {"lt": ts(4)},
    }
    # key order as the reference's object spread leaves it
    assert list(converted) == [
        "protocol",
        "dateCreated",
        "datePublished",
        "contextId",
        "recipient",
        "tag.topic",
        "tag.n",
        "tag.list",
        "published",
        "messageTimestamp",
    ]
    assert ru.convert_filter({"schema": "s"}, "publishedDescending") == {
        "schema": "s",
        "published": True,
    }
    assert ru.convert_filter({"published": False}, "publishedAscending") == {"published": True}
    assert ru.convert_filter({"published": False}, "createdAscending") == {"published": False}
    # an empty range criterion and an empty contextId stay as given
    assert ru.convert_filter({"dateCreated": {}, "contextId": ""}) == {
        "dateCreated": {},
        "contextId": "",
    }


def test_normalize_filter() -> None:
    assert ru.normalize_filter(
        {"protocol": "example.com/p/", "schema": "HTTPS://Example.com/s", "x": 1}
    ) == {
        "protocol": "http://example.com/p",
        "schema": "https://example.com/s",
        "x": 1,
    }
    assert ru.normalize_filter({"recordId": "r"}) == {"recordId": "r"}
    with pytest.raises(DwnError) as e:
        ru.normalize_filter({"tags": {"a": None}})
    assert code_of(e) == jsv.JS_TYPE_ERROR


def test_published_filter_helpers() -> None:
    assert ru.filter_includes_published_records({})
    assert not ru.filter_includes_published_records({"published": False})
    assert ru.filter_includes_published_records(
        {"published": False, "datePublished": {"from": ts(1)}}
    )
    assert ru.filter_includes_unpublished_records({})
    assert ru.filter_includes_unpublished_records({"published": False})
    assert not ru.filter_includes_unpublished_records({"published": True})
    assert not ru.filter_includes_unpublished_records({"datePublished": {"from": ts(1)}})
    assert ru.should_build_unpublished_recipient_filter({}, "did:a")
    assert ru.should_build_unpublished_recipient_filter({"recipient": []}, "did:a")
    assert ru.should_build_unpublished_recipient_filter({"recipient": ["did:b", "did:a"]}, "did:a")
    assert not ru.should_build_unpublished_recipient_filter({"recipient": "did:b"}, "did:a")
    assert not ru.should_build_unpublished_author_filter({"author": ["did:b"]}, "did:a")


def test_can_perform_delete_against_record() -> None:
    write = {"descriptor": {"method": "Write"}}
    deleted = {"descriptor": {"method": "Delete"}}
    pruned = {"descriptor": {"method": "Delete", "prune": True}}
    delete = {"descriptor": {"method": "Delete"}}
    prune = {"descriptor": {"method": "Delete", "prune": True}}
    assert not ru.can_perform_delete_against_record(delete, None)
    assert ru.can_perform_delete_against_record(delete, write)
    assert not ru.can_perform_delete_against_record(delete, deleted)
    assert ru.can_perform_delete_against_record(prune, deleted)
    assert not ru.can_perform_delete_against_record(prune, pruned)


def test_js_value_rules() -> None:
    assert jsv.js_strict_equal("a", "a") and not jsv.js_strict_equal("a", "b")
    assert not jsv.js_strict_equal(True, 1) and jsv.js_strict_equal(1, 1.0)
    assert not jsv.js_strict_equal({}, {}) and not jsv.js_strict_equal([1], [1])
    assert not jsv.js_strict_equal(None, jsv.UNDEFINED) and jsv.js_strict_equal(
        jsv.UNDEFINED, jsv.UNDEFINED
    )
    assert jsv.js_truthy({}) and jsv.js_truthy([]) and not jsv.js_truthy("") and not jsv.js_truthy(0)
    assert jsv.js_to_string([1, None, "a", [2, 3], True]) == "1,,a,2,3,true"
    assert jsv.js_to_string({"a": 1}) == "[object Object]"
    assert (
        jsv.js_to_string(1e21) == "1e+21"
        and jsv.js_to_string(2.5) == "2.5"
        and jsv.js_to_string(3.0) == "3"
    )
    assert jsv.js_get("text", "protocol") is jsv.UNDEFINED
    with pytest.raises(DwnError):
        jsv.js_get(None, "protocol")
