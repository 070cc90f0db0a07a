"""Authorization of a message by a permission grant, as dwn-sdk-js 0.5.2 decides it.

Every grant-based check starts with :func:`perform_base_validation`
(``GrantAuthorization.performBaseValidation``):

1. the grant was given to the expected grantee (the message's author, or the delegate that
   signed) by the expected grantor (the tenant, or the delegating author/owner);
2. the grant is active *at the message's own timestamp*: ``dateGranted <= messageTimestamp <
   dateExpires``, and no revocation of it is stamped at or before ``messageTimestamp`` — so a
   message signed before a revocation stays authorized even when it arrives afterwards;
3. the grant's scope names the message's interface and method.

Then each interface adds its own scope checks (protocol, ``contextId`` prefix, protocol
path, publication condition...). All failures are 401-class ``DwnError``\\s with the
reference's codes. Timestamps compare as strings, as the reference compares them.

Each function takes the incoming message either raw (a dict) or parsed (anything with a
``.message`` dict, such as ``RecordsWrite`` or ``GenericMessage``).
"""

from __future__ import annotations

from typing import Any, Final

from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import get_oldest_message
from p2psync.dwn.js_values import (
    UNDEFINED,
    js_get,
    js_strict_equal,
    js_to_primitive_string,
    js_to_string,
    js_truthy,
)
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.permissions import (
    PERMISSIONS_PROTOCOL_URI,
    REVOCATION_PATH,
    get_scope_from_permission_record,
    has_protocol_scope,
)
from p2psync.dwn.records_util import is_records_write
from p2psync.dwn.records_write import fetch_newest_records_write
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import compare_timestamps

__all__ = [
    "authorize_messages_query_or_subscribe",
    "authorize_messages_read",
    "authorize_protocols_configure",
    "authorize_protocols_query",
    "authorize_records_delete",
    "authorize_records_query_or_subscribe",
    "authorize_records_read",
    "authorize_records_write",
    "perform_base_validation",
]

# Every grant authorization failure is answered 401 by the reference's handlers.
_UNAUTHORIZED: Final = 401

#: ``conditions.publication`` values (``PermissionConditionPublication``).
PUBLICATION_REQUIRED: Final = "Required"
PUBLICATION_PROHIBITED: Final = "Prohibited"


def _refuse(code: str, detail: str) -> DwnError:
    return DwnError(code, detail, _UNAUTHORIZED)


def _raw(message: Any) -> dict[str, Any]:
    """The message dict of a raw or parsed message."""
    inner = getattr(message, "message", None)
    if isinstance(inner, dict):
        return inner
    raw: dict[str, Any] = message
    return raw


# --------------------------------------------------------------------------- base validation


def perform_base_validation(
    incoming_message: Any,
    expected_grantor: str,
    expected_grantee: str,
    permission_grant: PermissionGrant,
    store: Store,
) -> None:
    """Grantor/grantee, active period, revocation and interface/method scope (see module doc).

    Does not look at the rest of the scope nor at ``conditions``.
    """
    descriptor = _raw(incoming_message)["descriptor"]
    _verify_expected_grantor_and_grantee(expected_grantor, expected_grantee, permission_grant)
    # The grantor is verified now; revocations live in the grantor's DWN.
    _verify_grant_active(expected_grantor, descriptor["messageTimestamp"], permission_grant, store)
    _verify_scope_interface_and_method(
        descriptor.get("interface"), descriptor.get("method"), permission_grant
    )


def _verify_expected_grantor_and_grantee(
    expected_grantor: str, expected_grantee: str, grant: PermissionGrant
) -> None:
    if not js_strict_equal(expected_grantee, grant.grantee):
        raise _refuse(
            "GrantAuthorizationNotGrantedToAuthor",
            f"Permission grant is granted to {js_to_string(grant.grantee)}, but need to be "
            f"granted to {expected_grantee}",
        )
    if not js_strict_equal(expected_grantor, grant.grantor):
        raise _refuse(
            "GrantAuthorizationNotGrantedForTenant",
            f"Permission grant is granted by {js_to_string(grant.grantor)}, but need to be "
            f"granted by {expected_grantor}",
        )


def _js_less_than(timestamp: str, value: Any) -> bool:
    """JS ``timestamp < value``: string order, or false when the comparison turns numeric."""
    other = js_to_primitive_string(value)
    return other is not None and compare_timestamps(timestamp, other) < 0


def _js_at_or_after(timestamp: str, value: Any) -> bool:
    """JS ``timestamp >= value``, with the same coercions as :func:`_js_less_than`."""
    other = js_to_primitive_string(value)
    return other is not None and compare_timestamps(timestamp, other) >= 0


def _verify_grant_active(
    granted_for: str, message_timestamp: str, grant: PermissionGrant, store: Store
) -> None:
    if _js_less_than(message_timestamp, grant.date_granted):
        raise _refuse(
            "GrantAuthorizationGrantNotYetActive",
            "The message has a timestamp before the associated permission grant becomes active",
        )
    if _js_at_or_after(message_timestamp, grant.date_expires):
        raise _refuse(
            "GrantAuthorizationGrantExpired",
            "The message has timestamp after the expiry of the associated permission grant",
        )
    # Only revocations with their data count (latest base state); the protocol is not checked,
    # as in the reference.
    revocations, _ = store.messages.query(
        granted_for,
        [{"parentId": grant.id, "protocolPath": REVOCATION_PATH, "isLatestBaseState": True}],
    )
    oldest = get_oldest_message(revocations)
    if (
        oldest is not None
        and compare_timestamps(oldest["descriptor"]["messageTimestamp"], message_timestamp) <= 0
    ):
        raise _refuse(
            "GrantAuthorizationGrantRevoked",
            f"Permission grant with CID {grant.id} has been revoked",
        )


def _verify_scope_interface_and_method(interface: Any, method: Any, grant: PermissionGrant) -> None:
    if not js_strict_equal(interface, js_get(grant.scope, "interface")):
        raise _refuse(
            "GrantAuthorizationInterfaceMismatch",
            "DWN Interface of incoming message is outside the scope of permission grant with "
            f"ID {grant.id}",
        )
    if not js_strict_equal(method, js_get(grant.scope, "method")):
        raise _refuse(
            "GrantAuthorizationMethodMismatch",
            "DWN Method of incoming message is outside the scope of permission grant with "
            f"ID {grant.id}",
        )


# --------------------------------------------------------------------------- Records


def authorize_records_write(
    records_write_message: Any,
    expected_grantor: str,
    expected_grantee: str,
    permission_grant: PermissionGrant,
    store: Store,
) -> None:
    """A RecordsWrite under a grant: base checks, record scope, publication condition."""
    message = _raw(records_write_message)
    perform_base_validation(message, expected_grantor, expected_grantee, permission_grant, store)
    _verify_records_scope(message, permission_grant.scope)
    _verify_conditions(message, permission_grant.conditions)


def authorize_records_read(
    records_read_message: Any,
    records_write_message_to_be_read: Any,
    expected_grantor: str,
    expected_grantee: str,
    permission_grant: PermissionGrant,
    store: Store,
) -> None:
    """A RecordsRead under a grant: base checks, then the record read must be in scope."""
    perform_base_validation(
        _raw(records_read_message), expected_grantor, expected_grantee, permission_grant, store
    )
    _verify_records_scope(_raw(records_write_message_to_be_read), permission_grant.scope)


def authorize_records_query_or_subscribe(
    incoming_message: Any,
    expected_grantor: str,
    expected_grantee: str,
    permission_grant: PermissionGrant,
    store: Store,
) -> None:
    """A RecordsQuery/RecordsSubscribe under a grant: a protocol-scoped grant needs the same
    ``filter.protocol``."""
    message = _raw(incoming_message)
    perform_base_validation(message, expected_grantor, expected_grantee, permission_grant, store)
    protocol_in_grant = js_get(permission_grant.scope, "protocol")
    protocol_in_message = js_get(js_get(message["descriptor"], "filter"), "protocol")
    if protocol_in_grant is not UNDEFINED and not js_strict_equal(
        protocol_in_message, protocol_in_grant
    ):
        raise _refuse(
            "RecordsGrantAuthorizationQueryOrSubscribeProtocolScopeMismatch",
            f"Grant protocol scope {js_to_string(protocol_in_grant)} does not match protocol in "
            f"message {js_to_string(protocol_in_message)}",
        )


def authorize_records_delete(
    records_delete_message: Any,
    records_write_to_delete: Any,
    expected_grantor: str,
    expected_grantee: str,
    permission_grant: PermissionGrant,
    store: Store,
) -> None:
    """A RecordsDelete under a grant: a protocol-scoped grant may delete only records of that
    protocol."""
    perform_base_validation(
        _raw(records_delete_message), expected_grantor, expected_grantee, permission_grant, store
    )
    protocol_in_grant = js_get(permission_grant.scope, "protocol")
    protocol_of_record = _raw(records_write_to_delete)["descriptor"].get("protocol", UNDEFINED)
    if protocol_in_grant is not UNDEFINED and not js_strict_equal(
        protocol_of_record, protocol_in_grant
    ):
        raise _refuse(
            "RecordsGrantAuthorizationDeleteProtocolScopeMismatch",
            f"Grant protocol scope {js_to_string(protocol_in_grant)} does not match protocol in "
            f"record to delete {js_to_string(protocol_of_record)}",
        )


def _verify_records_scope(records_write_message: dict[str, Any], scope: Any) -> None:
    descriptor = records_write_message["descriptor"]
    # Strict equality on purpose: a Records grant without a protocol (the grant schema allows
    # it) matches exactly the records without one.
    if not js_strict_equal(js_get(scope, "protocol"), descriptor.get("protocol", UNDEFINED)):
        raise _refuse(
            "RecordsGrantAuthorizationScopeProtocolMismatch",
            "Grant scope specifies different protocol than what appears in the record",
        )
    scope_context_id = js_get(scope, "contextId")
    if scope_context_id is not UNDEFINED:
        context_id = records_write_message.get("contextId", UNDEFINED)
        # `contextId.startsWith(x)` coerces x to a string; the record's contextId is a string.
        if context_id is UNDEFINED or not str(context_id).startswith(
            js_to_string(scope_context_id)
        ):
            raise _refuse(
                "RecordsGrantAuthorizationScopeContextIdMismatch",
                "Grant scope specifies different contextId than what appears in the record",
            )
    scope_protocol_path = js_get(scope, "protocolPath")
    if scope_protocol_path is not UNDEFINED and not js_strict_equal(
        scope_protocol_path, descriptor.get("protocolPath", UNDEFINED)
    ):
        raise _refuse(
            "RecordsGrantAuthorizationScopeProtocolPathMismatch",
            "Grant scope specifies different protocolPath than what appears in the record",
        )


def _verify_conditions(records_write_message: dict[str, Any], conditions: Any) -> None:
    # `conditions?.publication`: absent or null conditions impose nothing.
    publication = UNDEFINED if conditions is None else js_get(conditions, "publication")
    published = js_truthy(records_write_message["descriptor"].get("published"))
    if js_strict_equal(publication, PUBLICATION_REQUIRED) and not published:
        raise _refuse(
            "RecordsGrantAuthorizationConditionPublicationRequired",
            "Permission grant requires message to be published",
        )
    if js_strict_equal(publication, PUBLICATION_PROHIBITED) and published:
        raise _refuse(
            "RecordsGrantAuthorizationConditionPublicationProhibited",
            "Permission grant prohibits message from being published",
        )


# --------------------------------------------------------------------------- Protocols


def authorize_protocols_configure(
    protocols_configure_message: Any,
    expected_grantor: str,
    expected_grantee: str,
    permission_grant: PermissionGrant,
    store: Store,
) -> None:
    """A ProtocolsConfigure under a grant: a protocol-scoped grant configures only that
    protocol; one without a protocol configures any."""
    message = _raw(protocols_configure_message)
    perform_base_validation(message, expected_grantor, expected_grantee, permission_grant, store)
    scoped_protocol = js_get(permission_grant.scope, "protocol")
    if scoped_protocol is UNDEFINED:
        return
    configured = js_get(js_get(message["descriptor"], "definition"), "protocol")
    if not js_strict_equal(scoped_protocol, configured):
        raise _refuse(
            "ProtocolsGrantAuthorizationScopeProtocolMismatch",
            "Grant scope specifies different protocol than what appears in the configure message.",
        )


def authorize_protocols_query(
    protocols_query_message: Any,
    expected_grantor: str,
    expected_grantee: str,
    permission_grant: PermissionGrant,
    store: Store,
) -> None:
    """A ProtocolsQuery under a grant: a protocol-scoped grant needs the same
    ``filter.protocol``."""
    message = _raw(protocols_query_message)
    perform_base_validation(message, expected_grantor, expected_grantee, permission_grant, store)
    protocol_in_grant = js_get(permission_grant.scope, "protocol")
    query_filter = message["descriptor"].get("filter", UNDEFINED)
    # `filter?.protocol`: an absent (or null) filter has no protocol.
    protocol_in_message = UNDEFINED
    if query_filter is not UNDEFINED and query_filter is not None:
        protocol_in_message = js_get(query_filter, "protocol")
    if protocol_in_grant is not UNDEFINED and not js_strict_equal(
        protocol_in_message, protocol_in_grant
    ):
        raise _refuse(
            "ProtocolsGrantAuthorizationQueryProtocolScopeMismatch",
            f"Grant protocol scope {js_to_string(protocol_in_grant)} does not match protocol in "
            f"message {js_to_string(protocol_in_message)}",
        )


# --------------------------------------------------------------------------- Messages


def authorize_messages_read(
    messages_read_message: Any,
    message_to_read: dict[str, Any],
    expected_grantor: str,
    expected_grantee: str,
    permission_grant: PermissionGrant,
    store: Store,
) -> None:
    """A MessagesRead under a grant: base checks, then the message read must be in scope.

    With a protocol-scoped grant, a Records message is in scope when its record (its newest
    write, for a delete) has that protocol, or is a permission record about that protocol;
    a ProtocolsConfigure when it configures that protocol.
    """
    perform_base_validation(
        _raw(messages_read_message), expected_grantor, expected_grantee, permission_grant, store
    )
    _verify_messages_scope(expected_grantor, _raw(message_to_read), permission_grant.scope, store)


def authorize_messages_query_or_subscribe(
    incoming_message: Any,
    expected_grantor: str,
    expected_grantee: str,
    permission_grant: PermissionGrant,
    store: Store,
) -> None:
    """A MessagesQuery/MessagesSubscribe under a grant: with a protocol-scoped grant, every
    filter must name that protocol."""
    message = _raw(incoming_message)
    perform_base_validation(message, expected_grantor, expected_grantee, permission_grant, store)
    if not has_protocol_scope(permission_grant.scope):
        return
    scoped_protocol = permission_grant.scope["protocol"]
    for message_filter in message["descriptor"]["filters"]:
        filter_protocol = js_get(message_filter, "protocol")
        if not js_strict_equal(filter_protocol, scoped_protocol):
            # The reference's enum member MessagesGrantAuthorizationMismatchedProtocol carries
            # this (older) string, and the string is what a reply shows.
            raise _refuse(
                "EventsGrantAuthorizationMismatchedProtocol",
                f"The protocol {js_to_string(filter_protocol)} does not match the scoped "
                f"protocol {js_to_string(scoped_protocol)}",
            )


def _verify_messages_scope(
    tenant: str, message_to_read: dict[str, Any], scope: Any, store: Store
) -> None:
    scoped_protocol = js_get(scope, "protocol")
    if scoped_protocol is UNDEFINED:
        return  # no protocol in the scope: every message is in scope
    descriptor = message_to_read["descriptor"]
    interface = descriptor.get("interface")
    if interface == "Records":
        if is_records_write(message_to_read):
            records_write = message_to_read
        else:
            records_write = fetch_newest_records_write(store, tenant, descriptor["recordId"])
        record_protocol = records_write["descriptor"].get("protocol", UNDEFINED)
        if js_strict_equal(record_protocol, scoped_protocol):
            return
        if record_protocol == PERMISSIONS_PROTOCOL_URI:
            permission_scope = get_scope_from_permission_record(tenant, store, records_write)
            if has_protocol_scope(permission_scope) and js_strict_equal(
                permission_scope["protocol"], scoped_protocol
            ):
                return
    elif interface == "Protocols":
        configured = js_get(js_get(descriptor, "definition"), "protocol")
        if js_strict_equal(configured, scoped_protocol):
            return
    raise _refuse("MessagesReadVerifyScopeFailed", "record message failed scope authorization")
