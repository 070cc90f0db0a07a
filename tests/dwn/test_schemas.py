"""Unit tests of the JSON-schema validator (p2psync.dwn.schemas).

The examples here are written by hand; ``test_schemas_reference.py`` compares verdicts with
the reference DWN itself.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.dwn.errors import DwnError
from p2psync.dwn.schemas import (
    ADDITIONAL_PROPERTY_NOT_ALLOWED,
    SCHEMA_NAMES,
    SCHEMA_NOT_FOUND,
    SCHEMA_VALIDATION_FAILED,
    UNEVALUATED_PROPERTY_NOT_ALLOWED,
    SchemaCompileError,
    _Generator,
    validate,
)

Json = Any

OK = None
FAILURE = SCHEMA_VALIDATION_FAILED
ADDITIONAL = ADDITIONAL_PROPERTY_NOT_ALLOWED
UNEVALUATED = UNEVALUATED_PROPERTY_NOT_ALLOWED

# --- hand-written valid examples ------------------------------------------------------------

ALICE = "did:key:z6MkpTHR8VNsBxYAAWHut2Geadd9jSwuBV8xRoAnwWsdvktH"
BOB = "did:jwk:eyJrdHkiOiJPS1AiLCJjcnYiOiJFZDI1NTE5IiwieCI6IjExcWFCIn0"
STAMP = "2024-05-01T12:30:45.123456Z"
LATER = "2024-05-02T08:00:00.000001Z"
DATA_CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
RECORD_ID = "bafyreigq3vydnxpzoy7cjmtvtakzcpvwrzbqitfh3qc6gczl7slkyddr2e"


def b64url(value: Json) -> str:
    raw = json.dumps(value).encode() if not isinstance(value, bytes) else value
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def signature(**payload: str) -> Json:
    return {
        "payload": b64url({"descriptorCid": "bafyreiabc", **payload}),
        "signatures": [{
            "protected": b64url({"alg": "EdDSA", "kid": ALICE + "#z6Mkp"}),
            "signature": b64url(bytes(range(64))),
        }],
    }


def records_write() -> Json:
    """A flat (protocol-less) record, the commonest write."""
    return {
        "recordId": RECORD_ID,
        "descriptor": {
            "interface": "Records",
            "method": "Write",
            "schema": "https://example.org/note",
            "dataFormat": "application/json",
            "dataCid": DATA_CID,
            "dataSize": 1234,
            "dateCreated": STAMP,
            "messageTimestamp": STAMP,
        },
        "authorization": {"signature": signature(recordId=RECORD_ID)},
    }


def protocol_records_write() -> Json:
    """A protocol record with tags, a recipient and a publication date."""
    message = records_write()
    message["contextId"] = RECORD_ID + "/" + RECORD_ID
    message["descriptor"] |= {
        "protocol": "https://example.org/chat",
        "protocolPath": "thread/reply",
        "parentId": RECORD_ID,
        "recipient": BOB,
        "published": True,
        "datePublished": LATER,
        "tags": {"topic": "weather", "score": 4.5, "pinned": False, "labels": ["a", "b"],
                 "ranks": [1, 2, 3]},
    }
    return message


def protocol_definition() -> Json:
    return {
        "protocol": "https://example.org/chat",
        "published": True,
        "types": {
            "thread": {"schema": "https://example.org/thread",
                       "dataFormats": ["application/json"]},
            "reply": {"dataFormats": ["text/plain"]},
            "member": {},
        },
        "structure": {
            "member": {"$role": True},
            "thread": {
                "$actions": [
                    {"who": "anyone", "can": ["create", "read"]},
                    {"role": "member", "can": ["query", "subscribe", "read"]},
                ],
                "$size": {"max": 65536},
                "$tags": {
                    "$requiredTags": ["topic"],
                    "$allowUndefinedTags": True,
                    "topic": {"type": "string", "maxLength": 20},
                    "labels": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                },
                "$encryption": {
                    "rootKeyId": ALICE + "#enc",
                    "publicKeyJwk": {"kty": "OKP", "crv": "X25519", "x": "abc"},
                },
                "reply": {"$actions": [{"who": "author", "of": "thread", "can": ["create"]}]},
            },
        },
    }


def protocols_configure() -> Json:
    return {
        "descriptor": {
            "interface": "Protocols",
            "method": "Configure",
            "messageTimestamp": STAMP,
            "definition": protocol_definition(),
        },
        "authorization": {"signature": signature()},
    }


def records_query() -> Json:
    return {
        "descriptor": {
            "interface": "Records",
            "method": "Query",
            "messageTimestamp": STAMP,
            "filter": {"protocol": "https://example.org/chat", "author": [ALICE, BOB],
                       "tags": {"score": {"gte": 1, "lt": 5}, "topic": {"startsWith": "w"}},
                       "published": True, "datePublished": {"from": STAMP}},
            "dateSort": "createdDescending",
            "pagination": {"limit": 10, "cursor": {"messageCid": "bafyx", "value": 3}},
        },
        "authorization": {"signature": signature()},
    }


def records_delete() -> Json:
    return {
        "descriptor": {"interface": "Records", "method": "Delete", "messageTimestamp": STAMP,
                       "recordId": RECORD_ID, "prune": False},
        "authorization": {"signature": signature()},
    }


def messages_query() -> Json:
    return {
        "descriptor": {"interface": "Messages", "method": "Query", "messageTimestamp": STAMP,
                       "filters": [{"interface": "Records", "method": "Write"},
                                   {"messageTimestamp": {"from": STAMP, "to": LATER}}]},
        "authorization": {"signature": signature()},
    }


def grant_data() -> Json:
    return {"dateExpires": LATER, "delegated": True, "description": "write for me",
            "scope": {"interface": "Records", "method": "Write",
                      "protocol": "https://example.org/chat"},
            "conditions": {"publication": "Required"}}


VALID: dict[str, Json] = {
    "RecordsWrite": records_write(),
    "RecordsWriteUnidentified": protocol_records_write(),
    "RecordsWriteDataEncoded": {**records_write(), "encodedData": b64url({"hello": 1})},
    "ProtocolsConfigure": protocols_configure(),
    "ProtocolDefinition": protocol_definition(),
    "ProtocolRuleSet": protocol_definition()["structure"]["thread"],
    "ProtocolsQuery": {"descriptor": {"interface": "Protocols", "method": "Query",
                                      "messageTimestamp": STAMP,
                                      "filter": {"protocol": "https://example.org/chat"}}},
    "RecordsQuery": records_query(),
    "RecordsSubscribe": {"descriptor": {"interface": "Records", "method": "Subscribe",
                                        "messageTimestamp": STAMP,
                                        "filter": {"schema": "https://example.org/note"}}},
    "RecordsRead": {"descriptor": {"interface": "Records", "method": "Read",
                                   "messageTimestamp": STAMP,
                                   "filter": {"recordId": RECORD_ID}}},
    "RecordsDelete": records_delete(),
    "MessagesQuery": messages_query(),
    "MessagesRead": {"descriptor": {"interface": "Messages", "method": "Read",
                                    "messageTimestamp": STAMP, "messageCid": RECORD_ID},
                     "authorization": {"signature": signature()}},
    "MessagesSubscribe": {"descriptor": {"interface": "Messages", "method": "Subscribe",
                                         "messageTimestamp": "whenever", "filters": []},
                          "authorization": {"signature": signature()}},
    "PermissionGrantData": grant_data(),
    "PermissionRequestData": {"delegated": False, "scope": {"interface": "Messages",
                                                            "method": "Read"}},
    "PermissionRevocationData": {"description": "no longer needed"},
    "GenericSignaturePayload": {"descriptorCid": "bafyx", "permissionGrantId": "bafyg"},
    "RecordsWriteSignaturePayload": {"descriptorCid": "bafyx", "recordId": RECORD_ID,
                                     "contextId": RECORD_ID},
    "Authorization": {"signature": signature()},
    "AuthorizationOwner": {"signature": signature(), "ownerSignature": signature()},
    "AuthorizationDelegatedGrant": {
        "signature": signature(),
        "authorDelegatedGrant": {**protocol_records_write(), "encodedData": b64url(grant_data())},
    },
    "GeneralJws": signature(),
    "PublicJwk": {"kty": "EC", "crv": "secp256k1", "x": "abc", "y": "def"},
    "GeneralJwk": {"kty": "EC", "crv": "secp256k1", "x": "abc", "y": "def", "d": "secret"},
    "JwkVerificationMethod": {"id": "#key-1", "type": "JsonWebKey2020", "controller": ALICE,
                              "publicKeyJwk": {"kty": "OKP", "crv": "Ed25519", "x": "abc"}},
    "RecordsFilter": {"dateCreated": {"from": STAMP}},
    "MessagesFilter": {"protocol": "https://example.org/chat"},
    "PaginationCursor": {"messageCid": "bafyx", "value": "2024"},
    "StringRangeFilter": {"gt": "a", "lte": "m"},
    "NumberRangeFilter": {"gte": 0, "lt": 10.5},
    "Definitions": {},
    "PermissionsDefinitions": {"anything": "goes"},
    "PermissionsScopes": {},
}


def code_of(schema: str, payload: Json) -> str | None:
    try:
        validate(schema, payload)
    except DwnError as error:
        assert error.status == 400
        return error.code
    return None


def changed(schema: str, path: str, value: Json = None, *, delete: bool = False) -> Json:
    """A copy of VALID[schema] with the member at slash-separated ``path`` set or removed."""
    message = copy.deepcopy(VALID[schema])
    *parents, last = path.split("/")
    target = message
    for step in parents:
        target = target[int(step)] if isinstance(target, list) else target[step]
    key: str | int = int(last) if isinstance(target, list) else last
    if delete:
        del target[key]
    else:
        target[key] = value
    return message


# --- valid examples -------------------------------------------------------------------------


def test_every_exported_schema_has_a_valid_example() -> None:
    assert set(VALID) == SCHEMA_NAMES
    assert len(SCHEMA_NAMES) == 34


@pytest.mark.parametrize("schema", sorted(VALID))
def test_valid_example_passes(schema: str) -> None:
    validate(schema, VALID[schema])


@pytest.mark.parametrize("schema", sorted(VALID))
def test_non_objects_fail(schema: str) -> None:
    for value in (None, True, 0, 1.5, "x", [], [VALID[schema]]):
        assert code_of(schema, value) == FAILURE


def test_validation_does_not_modify_the_payload() -> None:
    before = copy.deepcopy(VALID)
    for schema, payload in VALID.items():
        validate(schema, payload)
    assert before == VALID


# --- unknown names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["RecordsFoo", "recordswrite", "", "toString", "Did", "DateTime", "Base64Url",
             "PermissionScope"]
)
def test_unknown_schema_name(name: str) -> None:
    with pytest.raises(DwnError) as caught:
        validate(name, {})
    assert caught.value.code == SCHEMA_NOT_FOUND
    assert caught.value.status == 400
    assert name in caught.value.detail


# --- invalid examples, schema by schema -----------------------------------------------------

INVALID: list[tuple[str, Json, str | None]] = [
    # RecordsWrite: closed descriptor, required members, patterns, unevaluated top level.
    ("RecordsWrite", changed("RecordsWrite", "descriptor/color", "red"), ADDITIONAL),
    ("RecordsWrite", changed("RecordsWrite", "shade", "red"), UNEVALUATED),
    ("RecordsWrite", changed("RecordsWrite", "recordId", delete=True), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "authorization", delete=True), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/dataCid", delete=True), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/interface", "Protocols"), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/dataSize", "12"), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/dataSize", True), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/dataSize", 10**400), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/dataSize", float("nan")), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/dateCreated", STAMP + "\n"), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/dateCreated", "2024-05-01T12:30:45Z"),
     FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/dateCreated",
                             "٢٠٢٤-05-01T12:30:45.123456Z"), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/recipient", "did:key"), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/recipient", ALICE + "\n"), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/published", 1), FAILURE),
    # published/datePublished must agree.
    ("RecordsWrite", changed("RecordsWrite", "descriptor/published", True), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/datePublished", STAMP), FAILURE),
    # protocol, protocolPath and contextId come together; parentId needs a protocol.
    ("RecordsWrite", changed("RecordsWrite", "contextId", RECORD_ID), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/protocol", "p"), FAILURE),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/parentId", RECORD_ID), FAILURE),
    ("RecordsWriteUnidentified", changed("RecordsWriteUnidentified", "contextId", "a/b\n"),
     FAILURE),
    ("RecordsWriteUnidentified", changed("RecordsWriteUnidentified",
                                         "descriptor/protocolPath", "thread/"), FAILURE),
    ("RecordsWriteUnidentified", changed("RecordsWriteUnidentified", "descriptor/tags", {}),
     FAILURE),
    ("RecordsWriteUnidentified", changed("RecordsWriteUnidentified", "descriptor/tags",
                                         {str(i): i for i in range(11)}), FAILURE),
    ("RecordsWriteUnidentified", changed("RecordsWriteUnidentified", "descriptor/tags/x", []),
     FAILURE),
    ("RecordsWriteUnidentified", changed("RecordsWriteUnidentified", "descriptor/tags/x",
                                         [1, "a"]), FAILURE),
    ("RecordsWriteUnidentified", changed("RecordsWriteUnidentified", "descriptor/tags/x",
                                         {"a": 1}), FAILURE),
    ("RecordsWriteUnidentified", changed("RecordsWriteUnidentified", "anything", 1), OK),
    ("RecordsWriteDataEncoded", changed("RecordsWriteDataEncoded", "encodedData", delete=True),
     FAILURE),
    ("RecordsWriteDataEncoded", changed("RecordsWriteDataEncoded", "encodedData", 5), FAILURE),
    ("RecordsWriteDataEncoded", changed("RecordsWriteDataEncoded", "extra", 5), UNEVALUATED),
    # The reference's evaluated-member lookup sees inherited ECMAScript names.
    ("RecordsWrite", changed("RecordsWrite", "constructor", 1), OK),
    ("RecordsWrite", changed("RecordsWrite", "toString", {}), OK),
    ("RecordsWrite", changed("RecordsWrite", "prototype", 1), UNEVALUATED),
    ("RecordsWrite", changed("RecordsWrite", "descriptor/constructor", 1), ADDITIONAL),
    # The first error decides the code: the descriptor is checked before unevaluated members.
    ("RecordsWrite", changed(
        "RecordsWrite", "descriptor", {**VALID["RecordsWrite"]["descriptor"], "x": 1}
    ) | {"y": 1}, ADDITIONAL),
    ("RecordsWrite", changed("RecordsWrite", "recordId", 7) | {
        "authorization": {"signature": signature(), "extra": 1}}, FAILURE),
    # Authorization containers and JWS.
    ("AuthorizationOwner", {"ownerSignature": signature()}, FAILURE),
    ("AuthorizationOwner", {"ownerSignature": signature(), "extra": 1}, ADDITIONAL),
    ("Authorization", {"signature": signature(), "authorDelegatedGrant": {}}, ADDITIONAL),
    ("GeneralJws", {}, OK),
    ("GeneralJws", {"payload": "not base64url!"}, FAILURE),
    ("GeneralJws", {"payload": "abc\n"}, FAILURE),
    ("GeneralJws", {"signatures": []}, FAILURE),
    ("GeneralJws", {"signatures": [{"protected": "a", "signature": "b", "header": {}}]}, OK),
    # Keys.
    ("PublicJwk", {"kty": "OKP", "crv": "Ed25519", "x": "abc", "d": "secret"}, FAILURE),
    ("PublicJwk", {"kty": "RSA", "n": "a", "e": "b", "qi": "c"}, FAILURE),
    ("PublicJwk", {"kty": "RSA", "n": "a", "e": "b"}, OK),
    ("GeneralJwk", {"crv": "x", "x": "y"}, FAILURE),  # fits EC and OKP: not exactly one
    ("GeneralJwk", {"kty": "EC", "crv": "x"}, FAILURE),
    ("GeneralJwk", {"kty": "oct", "k": "key", "extra": [1]}, OK),
    ("JwkVerificationMethod", changed("JwkVerificationMethod", "type", "Multikey"), FAILURE),
    ("JwkVerificationMethod", changed("JwkVerificationMethod", "extra", 1), ADDITIONAL),
    # Protocols.
    ("ProtocolsConfigure", changed("ProtocolsConfigure", "authorization", delete=True),
     FAILURE),
    ("ProtocolsConfigure", changed("ProtocolsConfigure", "descriptor/definition/extra", 1),
     ADDITIONAL),
    ("ProtocolDefinition", changed("ProtocolDefinition", "types/thread/dataFormats", []),
     FAILURE),
    ("ProtocolDefinition", changed("ProtocolDefinition", "types/thread/color", "red"),
     ADDITIONAL),
    ("ProtocolDefinition", changed("ProtocolDefinition", "published", "yes"), FAILURE),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$unknown", 1), ADDITIONAL),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "a\n", {}), ADDITIONAL),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "\n", {}), OK),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "child", {"$role": "yes"}), FAILURE),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$size/min", -1), FAILURE),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$size/min", -0.0), OK),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$actions", []), FAILURE),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$actions/0/can", ["query"]), FAILURE),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$actions/0/extra", 1), ADDITIONAL),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$actions/1/extra", 1), OK),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$actions/0/role", "member"), OK),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$tags", {}), FAILURE),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$tags/topic/format", "email"), ADDITIONAL),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$tags/topic/type", "object"), FAILURE),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$tags/a\n", "anything"), OK),
    ("ProtocolRuleSet", changed("ProtocolRuleSet", "$encryption/extra", 1), ADDITIONAL),
    ("ProtocolsQuery", changed("ProtocolsQuery", "descriptor/filter", {}), FAILURE),
    ("ProtocolsQuery", changed("ProtocolsQuery", "descriptor/filter/recipient", "bob"),
     FAILURE),
    # Queries and filters.
    ("RecordsQuery", changed("RecordsQuery", "descriptor/filter", {}), FAILURE),
    ("RecordsQuery", changed("RecordsQuery", "descriptor/filter/color", "red"), ADDITIONAL),
    ("RecordsQuery", changed("RecordsQuery", "descriptor/pagination/limit", 0), FAILURE),
    ("RecordsQuery", changed("RecordsQuery", "descriptor/dateSort", "newest"), FAILURE),
    ("RecordsQuery", changed("RecordsQuery", "descriptor/filter/published", False), FAILURE),
    ("RecordsQuery", changed("RecordsQuery", "descriptor/filter/published", delete=True), OK),
    ("RecordsQuery", changed("RecordsQuery", "descriptor/filter/tags/score", {"gt": 1, "gte": 2}),
     FAILURE),
    ("RecordsQuery", changed("RecordsQuery", "descriptor/filter/author", ["nobody"]), FAILURE),
    ("RecordsFilter", {"dataSize": {}}, FAILURE),
    ("RecordsFilter", {"dateUpdated": {"from": STAMP, "until": LATER}}, ADDITIONAL),
    ("StringRangeFilter", {"lt": "b", "lte": "c"}, FAILURE),
    ("NumberRangeFilter", {"gt": "1"}, FAILURE),
    ("PaginationCursor", {"messageCid": "c", "value": False}, FAILURE),
    ("PaginationCursor", {"messageCid": "c"}, FAILURE),
    ("MessagesQuery", changed("MessagesQuery", "descriptor/filters/0/method", "Read"), FAILURE),
    ("MessagesQuery", changed("MessagesQuery", "descriptor/filters/1", {}), FAILURE),
    ("MessagesQuery", changed("MessagesQuery", "authorization", delete=True), FAILURE),
    ("MessagesSubscribe", changed("MessagesSubscribe", "descriptor/messageTimestamp", 5),
     FAILURE),
    ("RecordsDelete", changed("RecordsDelete", "descriptor/prune", delete=True), FAILURE),
    ("RecordsDelete", changed("RecordsDelete", "descriptor/prune", 0), FAILURE),
    # Permissions: the first scope alternative that fails decides the code.
    ("PermissionGrantData", changed("PermissionGrantData", "scope/method", "Explode"), FAILURE),
    ("PermissionGrantData", changed("PermissionGrantData", "scope/extra", 1), ADDITIONAL),
    ("PermissionGrantData", changed("PermissionGrantData", "conditions/publication", "Maybe"),
     FAILURE),
    ("PermissionGrantData", changed("PermissionGrantData", "dateExpires", delete=True), FAILURE),
    ("PermissionRequestData", {"scope": {"interface": "Records", "method": "Read"}}, FAILURE),
    ("PermissionRevocationData", {"reason": "x"}, ADDITIONAL),
    ("GenericSignaturePayload", {"descriptorCid": "c", "recordId": "r"}, ADDITIONAL),
    ("RecordsWriteSignaturePayload", {"descriptorCid": "c"}, FAILURE),
]


@pytest.mark.parametrize(("schema", "payload", "expected"), INVALID)
def test_examples(schema: str, payload: Json, expected: str | None) -> None:
    assert code_of(schema, payload) == expected


# --- ECMAScript semantics -------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1.0, 1e308, -5, 2**64, 2**1023])
def test_any_finite_number_is_a_number(size: float) -> None:
    validate("RecordsWrite", changed("RecordsWrite", "descriptor/dataSize", size))


@pytest.mark.parametrize(
    "size", [True, False, None, "1", float("inf"), float("-inf"), float("nan"),
             2**1024 - 2**970, -(2**1024)],
)
def test_non_numbers(size: object) -> None:
    assert code_of("RecordsWrite", changed("RecordsWrite", "descriptor/dataSize", size)) == FAILURE


def test_last_integer_below_double_overflow_is_a_number() -> None:
    validate("RecordsWrite", changed("RecordsWrite", "descriptor/dataSize", 2**1024 - 2**970 - 1))


def test_integer_like_keys_are_visited_first() -> None:
    # ECMAScript enumerates "1" before "b" whatever the insertion order, so the type error
    # under "1" is reported rather than the unknown member under "b".
    structure = {"b": {"$unknown": 1}, "1": {"$size": "big"}}
    payload = changed("ProtocolDefinition", "structure", structure)
    assert code_of("ProtocolDefinition", payload) == FAILURE
    structure = {"b": {"$unknown": 1}, "01": {"$size": "big"}}  # "01" is not an index
    payload = changed("ProtocolDefinition", "structure", structure)
    assert code_of("ProtocolDefinition", payload) == ADDITIONAL


def nested_rule_sets(depth: int) -> Json:
    rules: Json = {"$role": True}
    for _ in range(depth):
        rules = {"child": rules}
    return rules


def test_deeply_nested_structure_is_validated() -> None:
    validate("ProtocolRuleSet", nested_rule_sets(300))
    bad = nested_rule_sets(300)
    bad["child"]["child"]["$role"] = "yes"
    assert code_of("ProtocolRuleSet", bad) == FAILURE


def test_absurd_nesting_is_refused_not_crashed() -> None:
    # Deeper than Python's stack allows: refused as malformed rather than a RecursionError.
    assert code_of("ProtocolRuleSet", nested_rule_sets(5000)) == FAILURE


# --- error details --------------------------------------------------------------------------


def test_detail_names_the_failing_location() -> None:
    with pytest.raises(DwnError) as caught:
        validate("RecordsWrite", changed("RecordsWrite", "descriptor/dataSize", "12"))
    assert caught.value.detail.startswith("/descriptor/dataSize:")
    assert str(caught.value).startswith(SCHEMA_VALIDATION_FAILED)


def test_detail_names_the_extra_member() -> None:
    with pytest.raises(DwnError) as caught:
        validate("RecordsWrite", changed("RecordsWrite", "descriptor/color", "red"))
    assert "/descriptor" in caught.value.detail
    assert "'color'" in caught.value.detail
    with pytest.raises(DwnError) as caught:
        validate("RecordsWrite", changed("RecordsWrite", "shade", "red"))
    assert caught.value.detail.startswith("RecordsWrite:")  # the top level has an empty path
    assert "'shade'" in caught.value.detail


def test_detail_of_nested_array_location() -> None:
    payload = changed("MessagesQuery", "descriptor/filters/1/interface", "Events")
    with pytest.raises(DwnError) as caught:
        validate("MessagesQuery", payload)
    assert caught.value.detail.startswith("/descriptor/filters/1/interface:")


def test_json_pointer_escapes_in_detail() -> None:
    payload = changed("RecordsWriteUnidentified", "descriptor/tags", {"a/b~c": None})
    with pytest.raises(DwnError) as caught:
        validate("RecordsWriteUnidentified", payload)
    assert caught.value.detail.startswith("/descriptor/tags/a~1b~0c:")


# --- the compiler refuses what it cannot reproduce ------------------------------------------


@pytest.mark.parametrize(
    "rule",
    [
        {"type": "string", "format": "date-time"},
        {"type": "integer"},
        {"$ref": "Nowhere"},
        {"type": "object", "patternProperties": {"x": {}}, "unevaluatedProperties": False},
        {"anyOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False},
    ],
)
def test_compiler_rejects_unsupported_rules(rule: Json) -> None:
    with pytest.raises(SchemaCompileError):
        _Generator({"Rule": rule}).build()


# --- properties over arbitrary input --------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
CODES = {SCHEMA_VALIDATION_FAILED, ADDITIONAL_PROPERTY_NOT_ALLOWED,
         UNEVALUATED_PROPERTY_NOT_ALLOWED}


@settings(max_examples=200, deadline=None)
@given(schema=st.sampled_from(sorted(SCHEMA_NAMES)), value=JSON_VALUES)
def test_arbitrary_json_only_ever_raises_dwn_error(schema: str, value: Json) -> None:
    try:
        validate(schema, value)
    except DwnError as error:
        assert error.code in CODES
        assert error.status == 400


@st.composite
def damaged_messages(draw: st.DrawFn) -> tuple[str, Json]:
    """A valid example with one member somewhere replaced by an arbitrary JSON value."""
    schema = draw(st.sampled_from(sorted(VALID)))
    message = copy.deepcopy(VALID[schema])
    target = message
    while isinstance(target, (dict, list)) and target and draw(st.booleans()):
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        key = draw(st.sampled_from(keys))
        if not isinstance(target[key], (dict, list)) or draw(st.booleans()):
            target[key] = draw(JSON_VALUES)
            break
        target = target[key]
    else:
        if isinstance(target, dict):
            target[draw(st.text(max_size=6))] = draw(JSON_VALUES)
    return schema, message


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=damaged_messages())
def test_damaged_messages_only_ever_raise_dwn_error(case: tuple[str, Json]) -> None:
    schema, message = case
    try:
        validate(schema, message)
    except DwnError as error:
        assert error.code in CODES
        assert error.status == 400
