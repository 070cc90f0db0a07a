"""Structural rules of DWN messages and record payloads, as JSON-Schema-style dicts.

These state, in our own words, what the reference DWN (dwn-sdk-js 0.5.2) checks with its
JSON schemas before it looks at signatures or storage. ``p2psync.dwn.schemas`` compiles them.

Conventions of this file (they differ from plain JSON Schema 2020-12 in two ways):

* ``$ref`` names another entry of :data:`DEFINITIONS` by its key, not by URI.
* ``pattern`` is Python ``re`` syntax, applied with ``re.search``. Each pattern is written to
  accept exactly the strings the reference's ECMAScript ``u``-mode pattern accepts: ``\\A`` and
  ``\\Z`` instead of ``^``/``$`` (Python's ``$`` also matches before a final newline),
  ``[0-9]`` instead of ``\\d`` (Python's ``\\d`` matches other scripts' digits), and
  :data:`JS_DOT` where ECMAScript's ``.`` excludes line terminators.

Order is behaviour here: the reference reports only its *first* error, and whether that
error is an "additional property" or a plain failure decides the error code. The compiler
fixes the order of keywords; within ``properties`` the order of the keys below is the order
in which the reference checks them, so keep it when editing.
"""

from __future__ import annotations

from typing import Any, Final

Schema = dict[str, Any]

# ECMAScript's "." without the s flag: any code point except the four line terminators.
JS_DOT: Final = "[^\\n\\r\\u2028\\u2029]"


def ref(name: str) -> Schema:
    """A reference to another entry of :data:`DEFINITIONS`."""
    return {"$ref": name}


def string(**more: Any) -> Schema:
    return {"type": "string", **more}


def one_of_strings(*values: str) -> Schema:
    """A string that must be one of ``values``."""
    return {"type": "string", "enum": list(values)}


def record(
    properties: dict[str, Schema],
    *,
    required: tuple[str, ...] = (),
    closed: bool = True,
    **more: Any,
) -> Schema:
    """An object with named members; ``closed`` forbids members not named."""
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    schema.update(more)
    return schema


STRING: Final = string()
BOOLEAN: Final[Schema] = {"type": "boolean"}
NUMBER: Final[Schema] = {"type": "number"}
OBJECT: Final[Schema] = {"type": "object"}
EVERY_KEY: Final = ""  # a pattern that every property name satisfies

# --- atoms ----------------------------------------------------------------------------------

BASE64URL: Final = string(pattern=r"\A[A-Za-z0-9_-]+\Z")

# Timestamps are always UTC with exactly six fractional digits (Time.getCurrentTimestamp).
DATE_TIME: Final = string(
    pattern=(
        r"\A[0-9]{4}-[01][0-9]-[0-3][0-9]"
        r"T(?:[0-2][0-9]:[0-5][0-9]:[0-5][0-9]|23:59:60)\.[0-9]{6}Z\Z"
    )
)

# DID syntax: `did:`, a method name, then a colon-separated method-specific id whose last
# segment is not empty (percent escapes allowed), then optional ;params, /path, ?query and
# #fragment. The id is written as one run of its characters not ending in ":" rather than as
# segments: the same strings, matched several times faster by Python's engine (the possessive
# runs cannot change the outcome because nothing after the id may start with an id character).
DID: Final = string(
    pattern=(
        r"\Adid:[a-z0-9]++:"
        r"(?:[A-Za-z0-9._:-]++|%[0-9A-Fa-f]{2})++(?<!:)"
        r"(?:;[A-Za-z0-9_.:%-]+=[A-Za-z0-9_.:%-]*)*"
        r"(?:/[^#?]*)?"
        r"(?:\?[^#]*)?"
        rf"(?:#{JS_DOT}*)?\Z"
    )
)

# A context id is a slash-joined chain of record ids; a protocol path a chain of type names.
CONTEXT_ID: Final = string(pattern=r"\A[A-Za-z0-9]+(?:/[A-Za-z0-9]+)*\Z")
PROTOCOL_PATH: Final = string(pattern=r"\A[A-Za-z]+(?:/[A-Za-z]+)*\Z")

TIME_RANGE: Final = record(
    {"from": ref("DateTime"), "to": ref("DateTime")},
    minProperties=1,
)


def _exclusive_bounds(bound: Schema) -> Schema:
    """A range filter: at most one lower and one upper bound, each of type ``bound``."""
    return record(
        {"gt": bound, "gte": bound, "lt": bound, "lte": bound},
        minProperties=1,
        dependentSchemas={
            "gt": {"not": {"required": ["gte"]}},
            "gte": {"not": {"required": ["gt"]}},
            "lt": {"not": {"required": ["lte"]}},
            "lte": {"not": {"required": ["lt"]}},
        },
    )


def _did_or_dids() -> Schema:
    return {"oneOf": [ref("Did"), {"type": "array", "items": ref("Did")}]}


# --- keys and signatures --------------------------------------------------------------------

_STRING_MEMBERS: Final = ("alg", "kid", "crv", "use", "key_ops", "x5u", "x5c", "x5t", "x5t#S256")

GENERAL_JWK: Final[Schema] = {
    "type": "object",
    "required": ["kty"],
    "properties": {
        **{name: STRING for name in _STRING_MEMBERS[:2]},
        "kty": {"enum": ["EC", "RSA", "oct", "OKP"]},
        **{name: STRING for name in _STRING_MEMBERS[2:]},
    },
    # Exactly one key family must fit; `kty` absent counts as fitting every family here.
    "oneOf": [
        {
            "properties": {"kty": {"const": "EC"}, "crv": STRING, "x": STRING, "y": STRING,
                           "d": STRING},
            "required": ["crv", "x"],
        },
        {
            "properties": {"kty": {"const": "OKP"}, "crv": STRING, "x": STRING, "d": STRING},
            "required": ["crv", "x"],
        },
        {
            "properties": {
                "kty": {"const": "RSA"},
                **{name: STRING for name in ("n", "e", "d", "p", "q", "dp", "dq", "qi")},
                "oth": OBJECT,
            },
            "required": ["n", "e"],
        },
        {"properties": {"kty": {"const": "oct"}, "k": STRING}, "required": ["k"]},
    ],
}

_RSA_PRIVATE_MEMBERS: Final = ("d", "p", "q", "dp", "dq", "qi", "oth")

# A public key is a JWK that carries none of its family's private members.
PUBLIC_JWK: Final[Schema] = {
    "$ref": "GeneralJwk",
    "not": {
        "anyOf": [
            {"type": "object", "properties": {"kty": {"const": "EC"}}, "required": ["d"]},
            {"type": "object", "properties": {"kty": {"const": "OKP"}}, "required": ["d"]},
            {
                "type": "object",
                "properties": {"kty": {"const": "RSA"}, "oth": OBJECT},
                "anyOf": [{"required": [name]} for name in _RSA_PRIVATE_MEMBERS],
            },
        ]
    },
}

GENERAL_JWS: Final = record(
    {
        "payload": ref("Base64Url"),
        "signatures": {
            "type": "array",
            "minItems": 1,
            "items": record(
                {"protected": ref("Base64Url"), "signature": ref("Base64Url")}, closed=False
            ),
        },
    }
)

# --- RecordsWrite ---------------------------------------------------------------------------

_KEY_ENCRYPTION: Final = record(
    {
        "rootKeyId": STRING,
        "derivationScheme": one_of_strings(
            "dataFormats", "protocolContext", "protocolPath", "schemas"
        ),
        "derivedPublicKey": ref("PublicJwk"),
        "algorithm": one_of_strings("ECIES-ES256K"),
        "encryptedKey": ref("Base64Url"),
        "initializationVector": ref("Base64Url"),
        "ephemeralPublicKey": ref("PublicJwk"),
        "messageAuthenticationCode": ref("Base64Url"),
    },
    required=(
        "rootKeyId", "derivationScheme", "algorithm", "encryptedKey", "initializationVector",
        "ephemeralPublicKey", "messageAuthenticationCode",
    ),
)

_ENCRYPTION: Final = record(
    {
        "algorithm": one_of_strings("A256CTR"),
        "initializationVector": ref("Base64Url"),
        "keyEncryption": {"type": "array", "minItems": 1, "items": _KEY_ENCRYPTION},
    },
    required=("algorithm", "initializationVector", "keyEncryption"),
)

# Index values a record can be tagged with: a scalar or a short homogeneous list.
_TAG_VALUE: Final[Schema] = {
    "oneOf": [
        STRING,
        NUMBER,
        BOOLEAN,
        {"type": "array", "minItems": 1, "maxItems": 10, "items": STRING},
        {"type": "array", "minItems": 1, "maxItems": 10, "items": NUMBER},
    ]
}

# `published: true` needs a `datePublished`; `published: false` forbids one; with neither
# member present the record is simply unpublished.
_PUBLICATION_CONSISTENT: Final[Schema] = {
    "anyOf": [
        {
            "properties": {"published": {"type": "boolean", "enum": [True]}},
            "required": ["published", "datePublished"],
        },
        {
            "properties": {"published": {"type": "boolean", "enum": [False]}},
            "not": {"required": ["datePublished"]},
        },
        {
            "allOf": [
                {"not": {"required": ["published"]}},
                {"not": {"required": ["datePublished"]}},
            ]
        },
    ]
}

_RECORDS_WRITE_DESCRIPTOR: Final = record(
    {
        "interface": one_of_strings("Records"),
        "method": one_of_strings("Write"),
        "recipient": ref("Did"),
        "protocol": STRING,
        "protocolPath": PROTOCOL_PATH,
        "schema": STRING,
        "tags": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 10,
            "additionalProperties": _TAG_VALUE,
        },
        "parentId": STRING,
        "dataCid": STRING,
        "dataSize": NUMBER,
        "dateCreated": ref("DateTime"),
        "messageTimestamp": ref("DateTime"),
        "published": BOOLEAN,
        "datePublished": ref("DateTime"),
        "dataFormat": STRING,
    },
    required=(
        "interface", "method", "dataCid", "dataSize", "dateCreated", "messageTimestamp",
        "dataFormat",
    ),
    dependentRequired={"parentId": ["protocol"]},
    allOf=[_PUBLICATION_CONSISTENT],
)

# A protocol record carries `contextId`, `protocol` and `protocolPath` together; a flat record
# carries none of them.
_PROTOCOL_MEMBERS_TOGETHER: Final[list[Schema]] = [
    {
        "properties": {"descriptor": {"type": "object", "required": ["protocol", "protocolPath"]}},
        "required": ["contextId"],
    },
    {
        "allOf": [
            {"not": {"required": ["contextId"]}},
            {"properties": {"descriptor": {"type": "object", "not": {"required": ["protocol"]}}}},
            {"properties": {
                "descriptor": {"type": "object", "not": {"required": ["protocolPath"]}}
            }},
        ]
    },
]

# The members every RecordsWrite may have; RecordsWrite and RecordsWriteDataEncoded add their
# own requirements and forbid anything not named here (unevaluatedProperties).
RECORDS_WRITE_UNIDENTIFIED: Final = record(
    {
        "recordId": STRING,
        "contextId": CONTEXT_ID,
        "attestation": ref("GeneralJws"),
        "authorization": ref("AuthorizationOwner"),
        "encryption": _ENCRYPTION,
        "descriptor": _RECORDS_WRITE_DESCRIPTOR,
    },
    required=("descriptor",),
    closed=False,
    anyOf=_PROTOCOL_MEMBERS_TOGETHER,
)

RECORDS_WRITE: Final[Schema] = {
    "$ref": "RecordsWriteUnidentified",
    "type": "object",
    "required": ["recordId", "authorization"],
    "unevaluatedProperties": False,
}

RECORDS_WRITE_DATA_ENCODED: Final[Schema] = {
    "$ref": "RecordsWriteUnidentified",
    "type": "object",
    "required": ["recordId", "authorization", "encodedData"],
    "properties": {"encodedData": STRING},
    "unevaluatedProperties": False,
}

# --- authorization containers ---------------------------------------------------------------

AUTHORIZATION: Final = record({"signature": ref("GeneralJws")})

AUTHORIZATION_DELEGATED_GRANT: Final = record(
    {"signature": ref("GeneralJws"), "authorDelegatedGrant": ref("RecordsWriteDataEncoded")}
)

# An owner may countersign a record written by someone else, but only next to that signature.
AUTHORIZATION_OWNER: Final = record(
    {
        "signature": ref("GeneralJws"),
        "authorDelegatedGrant": ref("RecordsWriteDataEncoded"),
        "ownerSignature": ref("GeneralJws"),
        "ownerDelegatedGrant": ref("RecordsWriteDataEncoded"),
    },
    dependentRequired={"ownerSignature": ["signature"]},
)

# --- query filters --------------------------------------------------------------------------

RECORDS_FILTER: Final = record(
    {
        "protocol": STRING,
        "protocolPath": STRING,
        "author": _did_or_dids(),
        "attester": ref("Did"),
        "recipient": _did_or_dids(),
        "contextId": STRING,
        "schema": STRING,
        "tags": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {
                "oneOf": [
                    STRING,
                    NUMBER,
                    BOOLEAN,
                    record({"startsWith": STRING}, minProperties=1),
                    ref("StringRangeFilter"),
                    ref("NumberRangeFilter"),
                ]
            },
        },
        "recordId": STRING,
        "parentId": STRING,
        "published": BOOLEAN,
        "dataFormat": STRING,
        "dataSize": ref("NumberRangeFilter"),
        "dataCid": STRING,
        "dateCreated": TIME_RANGE,
        "datePublished": TIME_RANGE,
        "dateUpdated": TIME_RANGE,
    },
    minProperties=1,
    # Filtering on publication date only makes sense for published records.
    dependentSchemas={
        "datePublished": {
            "oneOf": [
                {"properties": {"published": {"enum": [True]}}, "required": ["published"]},
                {"not": {"required": ["published"]}},
            ]
        }
    },
)

PAGINATION_CURSOR: Final = record(
    {"messageCid": STRING, "value": {"type": ["string", "number"]}},
    required=("messageCid", "value"),
    minProperties=1,
)

MESSAGES_FILTER: Final = record(
    {
        "interface": one_of_strings("Protocols", "Records"),
        "method": one_of_strings("Configure", "Delete", "Write"),
        "protocol": STRING,
        "messageTimestamp": TIME_RANGE,
    },
    minProperties=1,
)

# --- message envelopes ----------------------------------------------------------------------


def _descriptor(interface: str, method: str, members: dict[str, Schema],
                required: tuple[str, ...]) -> Schema:
    return record(
        {
            "interface": one_of_strings(interface),
            "method": one_of_strings(method),
            **members,
        },
        required=("interface", "method", *required),
    )


def _message(authorization: str, descriptor: Schema, required: tuple[str, ...]) -> Schema:
    return record(
        {"authorization": ref(authorization), "descriptor": descriptor}, required=required
    )


_STAMP: Final = {"messageTimestamp": ref("DateTime")}

RECORDS_DELETE: Final = _message(
    "AuthorizationDelegatedGrant",
    _descriptor("Records", "Delete", {**_STAMP, "recordId": STRING, "prune": BOOLEAN},
                ("messageTimestamp", "recordId", "prune")),
    ("authorization", "descriptor"),
)

RECORDS_QUERY: Final = _message(
    "AuthorizationDelegatedGrant",
    _descriptor(
        "Records", "Query",
        {
            **_STAMP,
            "filter": ref("RecordsFilter"),
            "pagination": record({
                "limit": {"type": "number", "minimum": 1},
                "cursor": ref("PaginationCursor"),
            }),
            "dateSort": one_of_strings(
                "createdAscending", "createdDescending", "publishedAscending",
                "publishedDescending",
            ),
        },
        ("messageTimestamp", "filter"),
    ),
    ("descriptor",),
)

RECORDS_SUBSCRIBE: Final = _message(
    "AuthorizationDelegatedGrant",
    _descriptor("Records", "Subscribe", {**_STAMP, "filter": ref("RecordsFilter")},
                ("messageTimestamp", "filter")),
    ("descriptor",),
)

RECORDS_READ: Final = _message(
    "AuthorizationDelegatedGrant",
    _descriptor("Records", "Read", {**_STAMP, "filter": ref("RecordsFilter")},
                ("messageTimestamp", "filter")),
    ("descriptor",),
)

MESSAGES_QUERY: Final = _message(
    "Authorization",
    _descriptor(
        "Messages", "Query",
        {
            **_STAMP,
            "filters": {"type": "array", "items": ref("MessagesFilter")},
            "cursor": ref("PaginationCursor"),
        },
        ("messageTimestamp", "filters"),
    ),
    ("authorization", "descriptor"),
)

MESSAGES_READ: Final = _message(
    "Authorization",
    _descriptor("Messages", "Read", {**_STAMP, "messageCid": STRING}, ("messageTimestamp",)),
    ("authorization", "descriptor"),
)

# The reference leaves this timestamp as a bare string (no date-time pattern).
MESSAGES_SUBSCRIBE: Final = _message(
    "Authorization",
    _descriptor(
        "Messages", "Subscribe",
        {"messageTimestamp": STRING,
         "filters": {"type": "array", "items": ref("MessagesFilter")}},
        ("messageTimestamp", "filters"),
    ),
    ("descriptor", "authorization"),
)

PROTOCOLS_CONFIGURE: Final = _message(
    "AuthorizationDelegatedGrant",
    _descriptor("Protocols", "Configure", {**_STAMP, "definition": ref("ProtocolDefinition")},
                ("messageTimestamp", "definition")),
    ("authorization", "descriptor"),
)

PROTOCOLS_QUERY: Final = _message(
    "Authorization",
    _descriptor(
        "Protocols", "Query",
        {**_STAMP, "filter": record({"protocol": STRING, "recipient": ref("Did")},
                                    minProperties=1)},
        ("messageTimestamp",),
    ),
    ("descriptor",),
)

# --- protocol definitions -------------------------------------------------------------------

# A rule for a party (anyone, the author or recipient of some record) is closed.
_WHO_ACTION: Final[Schema] = {
    "required": ["who", "can"],
    "additionalProperties": False,
    "properties": {
        "who": one_of_strings("anyone", "author", "recipient"),
        "of": STRING,
        "can": {
            "type": "array",
            "minItems": 1,
            "items": one_of_strings(
                "co-delete", "co-prune", "co-update", "create", "delete", "prune", "read",
                "update",
            ),
        },
    },
}

# A role-based rule is open: the reference does not close it to other members.
_ROLE_ACTION: Final[Schema] = {
    "required": ["role", "can"],
    "properties": {
        "role": STRING,  # the protocol path of a role record type
        "can": {
            "type": "array",
            "minItems": 1,
            "items": one_of_strings(
                "co-delete", "co-update", "create", "delete", "query", "subscribe", "read",
                "update",
            ),
        },
    },
}

_SCALAR_TAG_KEYWORDS: Final = (
    "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
    "maxLength",
)
_ARRAY_TAG_KEYWORDS: Final = (
    *_SCALAR_TAG_KEYWORDS, "minItems", "maxItems", "uniqueItems", "minContains", "maxContains",
)


def _keyword_names(names: tuple[str, ...]) -> str:
    return r"\A(?:" + "|".join(names) + r")\Z"


_TAG_ITEM_RULE: Final[Schema] = {
    "type": "object",
    "properties": {"type": {"enum": ["string", "number", "integer"]}},
}

# A tag rule is itself a small JSON schema; only a known subset of keywords may appear.
_TAG_RULE: Final = record(
    {
        "type": {"enum": ["string", "number", "integer", "boolean", "array"]},
        "items": _TAG_ITEM_RULE,
        "contains": _TAG_ITEM_RULE,
    },
    patternProperties={_keyword_names(_ARRAY_TAG_KEYWORDS): {}},
)

_TAGS_RULE: Final = record(
    {"$requiredTags": {"type": "array", "items": STRING}, "$allowUndefinedTags": BOOLEAN},
    closed=False,
    minProperties=1,
    patternProperties={
        rf"\A(?!\$requiredTags\Z|\$allowUndefinedTags\Z){JS_DOT}*\Z": _TAG_RULE,
    },
)

# Members starting with `$` are directives; every other member names a nested record type.
PROTOCOL_RULE_SET: Final = record(
    {
        "$encryption": record(
            {"rootKeyId": STRING, "publicKeyJwk": ref("PublicJwk")},
            required=("rootKeyId", "publicKeyJwk"),
        ),
        "$actions": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "oneOf": [_WHO_ACTION, _ROLE_ACTION]},
        },
        "$role": BOOLEAN,
        "$size": record({
            "min": {"type": "number", "minimum": 0},
            "max": {"type": "number", "minimum": 0},
        }),
        "$tags": _TAGS_RULE,
    },
    patternProperties={rf"\A[^$]{JS_DOT}*\Z": ref("ProtocolRuleSet")},
)

PROTOCOL_DEFINITION: Final = record(
    {
        "protocol": STRING,
        "published": BOOLEAN,
        "types": {
            "type": "object",
            "patternProperties": {
                EVERY_KEY: record({
                    "schema": STRING,
                    "dataFormats": {"type": "array", "minItems": 1, "items": STRING},
                })
            },
        },
        "structure": {
            "type": "object",
            "patternProperties": {EVERY_KEY: ref("ProtocolRuleSet")},
        },
    },
    required=("protocol", "published", "types", "structure"),
)

# --- permissions ----------------------------------------------------------------------------


def _scope(interface: str, method: str) -> Schema:
    members: dict[str, Schema] = {
        "interface": {"const": interface},
        "method": {"const": method},
        "protocol": STRING,
    }
    if interface == "Records":
        members |= {"contextId": STRING, "protocolPath": STRING}
    return record(members, required=("interface", "method"))


# The reference tries the scopes in this order; the first one decides the reported error.
_SCOPE_ORDER: Final = (
    ("Messages", "Query"), ("Messages", "Read"), ("Messages", "Subscribe"),
    ("Protocols", "Configure"), ("Protocols", "Query"),
    ("Records", "Read"), ("Records", "Delete"), ("Records", "Write"), ("Records", "Query"),
    ("Records", "Subscribe"),
)

PERMISSION_SCOPE: Final[Schema] = {"oneOf": [_scope(i, m) for i, m in _SCOPE_ORDER]}

PERMISSION_CONDITIONS: Final = record(
    {"publication": one_of_strings("Required", "Prohibited")}
)

PERMISSION_GRANT_DATA: Final = record(
    {
        "description": STRING,
        "dateExpires": ref("DateTime"),
        "requestId": STRING,
        "delegated": BOOLEAN,
        "scope": ref("PermissionScope"),
        "conditions": ref("PermissionConditions"),
    },
    required=("dateExpires", "scope"),
)

PERMISSION_REQUEST_DATA: Final = record(
    {
        "description": STRING,
        "delegated": BOOLEAN,
        "scope": ref("PermissionScope"),
        "conditions": ref("PermissionConditions"),
    },
    required=("delegated", "scope"),
)

PERMISSION_REVOCATION_DATA: Final = record({"description": STRING})

# --- signature payloads ---------------------------------------------------------------------

GENERIC_SIGNATURE_PAYLOAD: Final = record(
    {name: STRING for name in
     ("descriptorCid", "delegatedGrantId", "permissionGrantId", "protocolRole")},
    required=("descriptorCid",),
)

RECORDS_WRITE_SIGNATURE_PAYLOAD: Final = record(
    {name: STRING for name in (
        "descriptorCid", "recordId", "contextId", "attestationCid", "encryptionCid",
        "delegatedGrantId", "permissionGrantId", "protocolRole",
    )},
    required=("descriptorCid", "recordId"),
)

JWK_VERIFICATION_METHOD: Final = record(
    {
        "id": STRING,
        "type": {"enum": ["JsonWebKey", "JsonWebKey2020"]},
        "controller": ref("Did"),
        "publicKeyJwk": ref("PublicJwk"),
    },
    required=("id", "type", "controller", "publicKeyJwk"),
)

# --- the registry ---------------------------------------------------------------------------

# Every rule by name. `$ref` resolves here, so helper entries (Did, DateTime, ...) live here too.
DEFINITIONS: Final[dict[str, Schema]] = {
    "Base64Url": BASE64URL,
    "DateTime": DATE_TIME,
    "Did": DID,
    "GeneralJwk": GENERAL_JWK,
    "PublicJwk": PUBLIC_JWK,
    "GeneralJws": GENERAL_JWS,
    "JwkVerificationMethod": JWK_VERIFICATION_METHOD,
    "Authorization": AUTHORIZATION,
    "AuthorizationDelegatedGrant": AUTHORIZATION_DELEGATED_GRANT,
    "AuthorizationOwner": AUTHORIZATION_OWNER,
    "RecordsWriteUnidentified": RECORDS_WRITE_UNIDENTIFIED,
    "RecordsWrite": RECORDS_WRITE,
    "RecordsWriteDataEncoded": RECORDS_WRITE_DATA_ENCODED,
    "RecordsDelete": RECORDS_DELETE,
    "RecordsQuery": RECORDS_QUERY,
    "RecordsSubscribe": RECORDS_SUBSCRIBE,
    "RecordsRead": RECORDS_READ,
    "RecordsFilter": RECORDS_FILTER,
    "StringRangeFilter": _exclusive_bounds(STRING),
    "NumberRangeFilter": _exclusive_bounds(NUMBER),
    "PaginationCursor": PAGINATION_CURSOR,
    "MessagesFilter": MESSAGES_FILTER,
    "MessagesQuery": MESSAGES_QUERY,
    "MessagesRead": MESSAGES_READ,
    "MessagesSubscribe": MESSAGES_SUBSCRIBE,
    "ProtocolsConfigure": PROTOCOLS_CONFIGURE,
    "ProtocolsQuery": PROTOCOLS_QUERY,
    "ProtocolDefinition": PROTOCOL_DEFINITION,
    "ProtocolRuleSet": PROTOCOL_RULE_SET,
    "PermissionScope": PERMISSION_SCOPE,
    "PermissionConditions": PERMISSION_CONDITIONS,
    "PermissionGrantData": PERMISSION_GRANT_DATA,
    "PermissionRequestData": PERMISSION_REQUEST_DATA,
    "PermissionRevocationData": PERMISSION_REVOCATION_DATA,
    "GenericSignaturePayload": GENERIC_SIGNATURE_PAYLOAD,
    "RecordsWriteSignaturePayload": RECORDS_WRITE_SIGNATURE_PAYLOAD,
    # Containers whose own rule is only "an object" (their parts are referenced above).
    "Definitions": OBJECT,
    "PermissionsDefinitions": OBJECT,
    "PermissionsScopes": OBJECT,
}

# The names the reference's validator answers to; any other name is "schema not found".
EXPORTED_NAMES: Final = frozenset({
    "Authorization", "AuthorizationDelegatedGrant", "AuthorizationOwner", "Definitions",
    "GeneralJwk", "GeneralJws", "GenericSignaturePayload", "JwkVerificationMethod",
    "MessagesFilter", "MessagesQuery", "MessagesRead", "MessagesSubscribe",
    "NumberRangeFilter", "PaginationCursor", "PermissionGrantData", "PermissionRequestData",
    "PermissionRevocationData", "PermissionsDefinitions", "PermissionsScopes",
    "ProtocolDefinition", "ProtocolRuleSet", "ProtocolsConfigure", "ProtocolsQuery",
    "PublicJwk", "RecordsDelete", "RecordsFilter", "RecordsQuery", "RecordsRead",
    "RecordsSubscribe", "RecordsWrite", "RecordsWriteDataEncoded", "RecordsWriteSignaturePayload",
    "RecordsWriteUnidentified", "StringRangeFilter",
})
