"""The DWN permissions protocol: permission requests, grants and revocations as records.

dwn-sdk-js 0.5.2 (``src/protocols/permissions.ts``) makes permissions a built-in protocol,
``https://tbd.website/dwn/permissions``, with three record types:

* ``request`` — anyone may write one to ask the tenant for a permission;
* ``grant`` — written by the tenant (the grantor) with the grantee as ``recipient``; its JSON
  data holds ``dateExpires``, ``scope`` (interface, method and optionally protocol,
  ``contextId`` or ``protocolPath``), ``conditions``, ``delegated``...;
* ``grant/revocation`` — a child of the grant; a grant counts as revoked for every message
  whose ``messageTimestamp`` is at or after the oldest revocation's.

The definition is never stored: protocol authorization answers it directly for this URI
(see :func:`builtin_protocol_definition`). A grant's id is its ``recordId``; its grantor is
the signer of the grant record and ``dateGranted`` is its ``dateCreated``.

Permission records whose scope names a protocol carry that protocol as the ``protocol`` tag,
so a protocol-filtered sync picks up the permissions that belong with it.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from p2psync.dwn import schemas, urls
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import b64url_encode, json_compact
from p2psync.dwn.errors import DwnError
from p2psync.dwn.js_values import (
    JS_TYPE_ERROR,
    THROWN_STATUS,
    UNDEFINED,
    js_error,
    js_get,
    js_strict_equal,
    js_to_string,
)
from p2psync.dwn.permission_grant import PermissionGrant, PermissionRequest, parse_json_data
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import validate_timestamp

__all__ = [
    "GRANT_PATH",
    "PERMISSIONS_PROTOCOL_URI",
    "PROTOCOL_DEFINITION",
    "REQUEST_PATH",
    "REVOCATION_PATH",
    "builtin_protocol_definition",
    "create_grant",
    "create_request",
    "create_revocation",
    "fetch_grant",
    "get_scope_from_permission_record",
    "has_protocol_scope",
    "validate_revocation_protocol_tag",
    "validate_schema",
    "with_encoded_data",
]

#: URI of the built-in permissions protocol.
PERMISSIONS_PROTOCOL_URI: Final = "https://tbd.website/dwn/permissions"
#: Protocol path of a permission request record.
REQUEST_PATH: Final = "request"
#: Protocol path of a permission grant record.
GRANT_PATH: Final = "grant"
#: Protocol path of a grant revocation record (a child of the grant).
REVOCATION_PATH: Final = "grant/revocation"

#: Largest data of any permission record, in bytes (``$size.max`` in the reference definition).
PERMISSION_RECORD_MAX_SIZE: Final = 10_000

#: Data format of every permission record.
PERMISSION_DATA_FORMAT: Final = "application/json"

# Status of an authorization failure: every reference handler answers these with 401.
_UNAUTHORIZED: Final = 401

#: The permissions protocol as a ProtocolsConfigure would hold it (same members, same order).
PROTOCOL_DEFINITION: Final[dict[str, Any]] = {
    "published": True,
    "protocol": PERMISSIONS_PROTOCOL_URI,
    "types": {
        "request": {"dataFormats": [PERMISSION_DATA_FORMAT]},
        "grant": {"dataFormats": [PERMISSION_DATA_FORMAT]},
        "revocation": {"dataFormats": [PERMISSION_DATA_FORMAT]},
    },
    "structure": {
        "request": {
            "$size": {"max": PERMISSION_RECORD_MAX_SIZE},
            "$actions": [{"who": "anyone", "can": ["create"]}],
        },
        "grant": {
            "$size": {"max": PERMISSION_RECORD_MAX_SIZE},
            "$actions": [{"who": "recipient", "of": "grant", "can": ["read", "query"]}],
            "revocation": {
                "$size": {"max": PERMISSION_RECORD_MAX_SIZE},
                "$actions": [{"who": "anyone", "can": ["read"]}],
            },
        },
    },
}


def builtin_protocol_definition(protocol_uri: str) -> dict[str, Any] | None:
    """The definition of a built-in protocol, or ``None`` when it must be looked up.

    Protocol authorization asks this first, exactly where the reference's
    ``fetchProtocolDefinition`` short-circuits for the permissions protocol (it is never
    configured, so it is never stored). A fresh copy, so a caller cannot alter the original.
    """
    if protocol_uri == PERMISSIONS_PROTOCOL_URI:
        return copy.deepcopy(PROTOCOL_DEFINITION)
    return None


# --------------------------------------------------------------------------- scopes


def has_protocol_scope(scope: Any) -> bool:
    """Whether a scope names a protocol (``'protocol' in scope``; a ``null`` value counts)."""
    if isinstance(scope, dict):
        return "protocol" in scope
    if isinstance(scope, list):
        return False
    # The `in` operator throws on anything that is not an object.
    raise js_error(JS_TYPE_ERROR, "Cannot use 'in' operator to search for 'protocol' in scope")


def _is_records_scope(scope: Any) -> bool:
    return js_strict_equal(js_get(scope, "interface"), "Records")


# --------------------------------------------------------------------------- store access


def fetch_grant(tenant: str, store: Store, grant_id: str) -> PermissionGrant:
    """The grant with record ID ``grant_id`` in ``tenant``'s DWN.

    Only the latest state of a record that is a RecordsWrite at protocol path ``grant``
    counts (the reference does not check the protocol here); anything else is
    ``GrantAuthorizationGrantMissing``.
    """
    messages, _ = store.messages.query(tenant, [{"recordId": grant_id, "isLatestBaseState": True}])
    candidate = messages[0] if messages else None
    if (
        candidate is None
        or candidate["descriptor"].get("interface") != "Records"
        or candidate["descriptor"].get("method") != "Write"
        or candidate["descriptor"].get("protocolPath") != GRANT_PATH
    ):
        raise DwnError(
            "GrantAuthorizationGrantMissing",
            f"Could not find permission grant with record ID {grant_id}.",
            _UNAUTHORIZED,
        )
    return PermissionGrant.parse(candidate)


def get_scope_from_permission_record(tenant: str, store: Store, message: dict[str, Any]) -> Any:
    """The scope a permission record is about: its own, or for a revocation its grant's."""
    descriptor = message["descriptor"]
    protocol = descriptor.get("protocol", UNDEFINED)
    if protocol != PERMISSIONS_PROTOCOL_URI:
        raise DwnError(
            "PermissionsProtocolGetScopeInvalidProtocol",
            f"Unexpected protocol for permission record: {js_to_string(protocol)}",
        )
    path = descriptor.get("protocolPath")
    if path == REVOCATION_PATH:
        return fetch_grant(tenant, store, descriptor.get("parentId")).scope
    if path == GRANT_PATH:
        return PermissionGrant.parse(message).scope
    return PermissionRequest.parse(message).scope


def validate_revocation_protocol_tag(tenant: str, store: Store, message: dict[str, Any]) -> None:
    """Before storing a revocation: its ``protocol`` tag must equal its grant's scoped protocol.

    The reference's ``preProcessingForCoreRecordsWrite``; a no-op for any other record. A
    missing grant raises ``GrantAuthorizationGrantMissing`` (which the reference does not turn
    into a reply: it throws).
    """
    descriptor = message["descriptor"]
    if (
        descriptor.get("protocol") != PERMISSIONS_PROTOCOL_URI
        or descriptor.get("protocolPath") != REVOCATION_PATH
    ):
        return
    grant = fetch_grant(tenant, store, descriptor.get("parentId"))
    tags = descriptor.get("tags", UNDEFINED)
    revoke_tag = UNDEFINED if tags is UNDEFINED or tags is None else js_get(tags, "protocol")
    grant_protocol = js_get(grant.scope, "protocol")
    if not js_strict_equal(grant_protocol, revoke_tag):
        raise DwnError(
            "PermissionsProtocolValidateRevocationProtocolTagMismatch",
            f"Revocation protocol {js_to_string(revoke_tag)} does not match grant protocol "
            f"{js_to_string(grant_protocol)}",
        )


# --------------------------------------------------------------------------- schema checks


def validate_schema(records_write_message: dict[str, Any], data_bytes: bytes) -> None:
    """Check the data of a permission record against its JSON schema and the scope rules.

    Run on a permissions-protocol RecordsWrite whose data arrived with it. Raises 400-class
    ``SchemaValidator*`` / ``PermissionsProtocolValidate*`` errors (the reference answers
    those with 400); also ``SyntaxError`` for non-JSON data, ``UrlProtocolNotNormalized`` for
    an unnormalized scoped protocol and ``TimestampInvalid`` for a bad ``dateExpires`` — which
    the reference lets escape its RecordsWrite handler instead of answering 400, so they carry
    status 500 (:data:`~p2psync.dwn.js_values.THROWN_STATUS`).
    """
    data = parse_json_data(data_bytes)
    path = records_write_message["descriptor"].get("protocolPath", UNDEFINED)
    if path == REQUEST_PATH:
        schemas.validate("PermissionRequestData", data)
        _validate_scope_and_tags(data["scope"], records_write_message)
    elif path == GRANT_PATH:
        schemas.validate("PermissionGrantData", data)
        _validate_scope_and_tags(data["scope"], records_write_message)
        try:
            validate_timestamp(data["dateExpires"])
        except DwnError as exc:
            raise _escaping(exc) from None
    elif path == REVOCATION_PATH:
        schemas.validate("PermissionRevocationData", data)
    else:
        # Not reachable from outside: protocol authorization admits only the three paths.
        raise DwnError(
            "PermissionsProtocolValidateSchemaUnexpectedRecord",
            f"Unexpected permission record: {js_to_string(path)}",
        )


def _escaping(exc: DwnError) -> DwnError:
    # The RecordsWrite handler answers 400 only for PermissionsProtocolValidate*/SchemaValidator*
    # codes and lets these escape; keep the code, mark the status as thrown.
    return DwnError(exc.code, exc.detail, THROWN_STATUS)


def _validate_scope_and_tags(scope: Any, message: dict[str, Any]) -> None:
    if has_protocol_scope(scope):
        scoped_protocol = scope["protocol"]
        try:
            urls.validate_protocol_url_normalized(scoped_protocol)
        except DwnError as exc:
            raise _escaping(exc) from None
        _validate_tags(message, scoped_protocol)
    if not _is_records_scope(scope):
        return
    if "contextId" in scope and "protocolPath" in scope:
        raise DwnError(
            "PermissionsProtocolValidateScopeContextIdProhibitedProperties",
            "Permission grants cannot have both `contextId` and `protocolPath` present",
        )


def _validate_tags(message: dict[str, Any], scoped_protocol: Any) -> None:
    tags = message["descriptor"].get("tags", UNDEFINED)
    tagged = UNDEFINED if tags is UNDEFINED else js_get(tags, "protocol")
    if tagged is UNDEFINED:
        raise DwnError(
            "PermissionsProtocolValidateScopeMissingProtocolTag",
            "Permission grants must have a `tags` property that contains a protocol tag",
        )
    if not js_strict_equal(tagged, scoped_protocol):
        raise DwnError(
            "PermissionsProtocolValidateScopeProtocolMismatch",
            "Permission grants must have a scope with a protocol that matches the tagged "
            f"protocol: {js_to_string(tagged)}",
        )


# --------------------------------------------------------------------------- authoring


def with_encoded_data(message: dict[str, Any], data: bytes) -> dict[str, Any]:
    """The message with its data inline as ``encodedData`` (how a delegated grant travels)."""
    return {**message, "encodedData": b64url_encode(data)}


def _normalized_scope(scope: dict[str, Any]) -> dict[str, Any]:
    normalized = dict(scope)
    if has_protocol_scope(normalized):
        normalized["protocol"] = urls.normalize_protocol_url(normalized["protocol"])
    return normalized


def _data_bytes(members: list[tuple[str, Any]]) -> bytes:
    # JSON.stringify leaves out undefined members; the order is the reference's literal order.
    return json_compact({k: v for k, v in members if v is not None}).encode("utf-8")


def _protocol_tags(scope: dict[str, Any]) -> dict[str, Any] | None:
    return {"protocol": scope["protocol"]} if has_protocol_scope(scope) else None


def _permission_record(
    signer: Identity,
    protocol_path: str,
    data: bytes,
    timestamp: str | None,
    *,
    tags: dict[str, Any] | None,
    recipient: str | None = None,
    parent_context_id: str | None = None,
) -> tuple[RecordsWrite, bytes]:
    """A record of the permissions protocol, stamped ``timestamp`` (default now) as both its
    ``messageTimestamp`` and ``dateCreated``."""
    write = RecordsWrite.create(
        signer=signer,
        message_timestamp=timestamp,
        date_created=timestamp,
        recipient=recipient,
        parent_context_id=parent_context_id,
        protocol=PERMISSIONS_PROTOCOL_URI,
        protocol_path=protocol_path,
        data_format=PERMISSION_DATA_FORMAT,
        data=data,
        tags=tags,
    )
    return write, data


def create_request(
    *,
    signer: Identity,
    scope: dict[str, Any],
    delegated: bool,
    description: str | None = None,
    conditions: dict[str, Any] | None = None,
    date_requested: str | None = None,
) -> tuple[RecordsWrite, bytes]:
    """Author a permission request (``PermissionsProtocol.createRequest``).

    ``date_requested`` sets both ``messageTimestamp`` and ``dateCreated``; the reference sets
    only the former, which makes an initial write its own DWN refuses.
    """

    if js_strict_equal(scope.get("interface"), "Records") and "protocol" not in scope:
        raise DwnError(
            "PermissionsProtocolCreateRequestRecordsScopeMissingProtocol",
            "Permission request for Records must have a scope with a `protocol` property",
        )
    normalized = _normalized_scope(scope)
    data = _data_bytes(
        [
            ("description", description),
            ("delegated", delegated),
            ("scope", normalized),
            ("conditions", conditions),
        ]
    )
    return _permission_record(signer, REQUEST_PATH, data, date_requested, tags=_protocol_tags(normalized))


def create_grant(
    *,
    signer: Identity,
    granted_to: str,
    date_expires: str,
    scope: dict[str, Any],
    date_granted: str | None = None,
    request_id: str | None = None,
    description: str | None = None,
    delegated: bool | None = None,
    conditions: dict[str, Any] | None = None,
) -> tuple[RecordsWrite, bytes]:
    """Author a permission grant from ``signer`` to ``granted_to`` (``createGrant``).

    ``date_granted`` (default now) becomes ``dateCreated`` and ``messageTimestamp``: the grant
    is active for messages stamped from then until before ``date_expires``.
    """

    if js_strict_equal(scope.get("interface"), "Records") and "protocol" not in scope:
        raise DwnError(
            "PermissionsProtocolCreateGrantRecordsScopeMissingProtocol",
            "Permission grants for Records must have a scope with a `protocol` property",
        )
    normalized = _normalized_scope(scope)
    data = _data_bytes(
        [
            ("dateExpires", date_expires),
            ("requestId", request_id),
            ("description", description),
            ("delegated", delegated),
            ("scope", normalized),
            ("conditions", conditions),
        ]
    )
    return _permission_record(
        signer, GRANT_PATH, data, date_granted, tags=_protocol_tags(normalized), recipient=granted_to
    )


def create_revocation(
    *,
    signer: Identity,
    grant: PermissionGrant,
    date_revoked: str | None = None,
    description: str | None = None,
) -> tuple[RecordsWrite, bytes]:
    """Author the revocation of ``grant`` (``createRevocation``).

    ``date_revoked`` (default now) becomes ``messageTimestamp`` and ``dateCreated``; the
    reference accepts the option but ignores it.
    """

    tags = None
    if has_protocol_scope(grant.scope):
        tags = {"protocol": urls.normalize_protocol_url(grant.scope["protocol"])}
    data = _data_bytes([("description", description)])
    # The grant is a root record, so its record ID is also its context ID.
    return _permission_record(signer, REVOCATION_PATH, data, date_revoked, tags=tags, parent_context_id=grant.id)
