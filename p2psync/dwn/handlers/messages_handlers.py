"""Messages interface handlers (Query, Read, Subscribe) and RecordsSubscribe, as in the reference.

Mirrors dwn-sdk-js 0.5.2 ``handlers/messages-query.ts``, ``messages-read.ts``,
``messages-subscribe.ts`` and ``records-subscribe.ts``: parse (400), authenticate and authorize
(401: the tenant itself, or a grantee invoking the tenant's grant by ``permissionGrantId``).

- MessagesQuery lists the tenant's event log (message CIDs in log order) matching the filters,
  after the optional cursor. Reply entries are ``{"cid": <message CID>}``; the reply cursor
  is ``{"messageCid", "value"}`` with our log position as ``value`` (the reference's is its
  ULID watermark; see :meth:`p2psync.dwn.store.EventLog.query`).
- MessagesRead returns one stored message by CID, and the data of a RecordsWrite when it is
  still held. The lookup happens after authentication but before authorization, so a
  non-owner learns 404 for an unknown CID and 401 for a known one, as with the reference.
- MessagesSubscribe and RecordsSubscribe need an event stream. The engine has none yet, so
  both answer 501 (``…EventStreamUnimplemented``) to any schema-valid message — what the
  reference answers when built without one, before it looks at the message further. Given an
  event stream (``ctx.event_stream``), they run the reference's checks and subscribe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from p2psync.dwn import grant_authorization, permissions, protocol_authorization, records_util
from p2psync.dwn.authentication import authenticate
from p2psync.dwn.encoding import b64url_decode, message_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.events import EventStream, EventSubscription, MessageEvent
from p2psync.dwn.generic_message import GenericMessage, Message
from p2psync.dwn.handlers.records import STAGE_ERRORS
from p2psync.dwn.messages_interface import (
    MessagesQuery,
    MessagesRead,
    MessagesSubscribe,
    RecordsSubscribe,
    convert_filters,
)
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.reply import HandlerContext, Reply, reply_from_error
from p2psync.dwn.store import Store, match_any_filter

__all__ = [
    "SubscriptionHandler",
    "SubscriptionReply",
    "handle_messages_query",
    "handle_messages_read",
    "handle_messages_subscribe",
    "handle_records_subscribe",
]

#: Receives each event a subscription matches.
SubscriptionHandler = Callable[[MessageEvent], None]

# The reference's status for a subscription on a DWN built without an event stream.
_NOT_IMPLEMENTED = 501

# RecordsSubscribe follows both writes and deletes, so a subscriber can keep its state current.
_WRITE_OR_DELETE = ["Write", "Delete"]


@dataclass
class SubscriptionReply(Reply):
    """A subscribe reply; ``subscription`` is set when the subscription was opened (200)."""

    subscription: EventSubscription | None = None


def _event_stream(ctx: HandlerContext) -> EventStream | None:
    # The engine's context carries no event stream yet; one that does gets live subscriptions.
    stream: EventStream | None = getattr(ctx, "event_stream", None)
    return stream


def _authorize_by_tenant_or_grant(
    tenant: str,
    incoming: GenericMessage,
    store: Store,
    failure_code: str,
    failure_detail: str,
    check_grant: Callable[[PermissionGrant, str], None],
) -> None:
    """The tenant may; a grantee may through ``permissionGrantId``; nobody else.

    ``check_grant(grant, grantee)`` applies the interface's grant rules.
    """
    if incoming.author == tenant:
        return
    payload = incoming.signature_payload or {}
    if incoming.author is not None and "permissionGrantId" in payload:
        grant = permissions.fetch_grant(tenant, store, payload["permissionGrantId"])
        check_grant(grant, incoming.author)
        return
    raise DwnError(failure_code, failure_detail, 401)


# --------------------------------------------------------------------------- MessagesQuery


def handle_messages_query(ctx: HandlerContext, tenant: str, message: Message) -> Reply:
    """The CIDs of ``tenant``'s logged messages that match the query's filters, in log order."""
    store = ctx.store
    try:
        query = MessagesQuery.parse(message)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 400)
    try:
        authenticate(message.get("authorization"))
        _authorize_by_tenant_or_grant(
            tenant,
            query,
            store,
            "MessagesQueryAuthorizationFailed",
            "message failed authorization",
            lambda grant, grantee: grant_authorization.authorize_messages_query_or_subscribe(
                message, tenant, grantee, grant, store
            ),
        )
    except STAGE_ERRORS as e:
        return reply_from_error(e, 401)
    descriptor = message["descriptor"]
    filters = convert_filters(descriptor["filters"])
    cids, cursor = store.events.query(tenant, filters, descriptor.get("cursor"))
    return Reply(200, "OK", entries=[{"cid": cid} for cid in cids], cursor=cursor)


# --------------------------------------------------------------------------- MessagesRead


def handle_messages_read(ctx: HandlerContext, tenant: str, message: Message) -> Reply:
    """One stored message by CID (``entry``: ``messageCid``, ``message``), with its record data."""
    store = ctx.store
    try:
        read = MessagesRead.parse(message)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 400)
    try:
        authenticate(message.get("authorization"))
    except STAGE_ERRORS as e:
        return reply_from_error(e, 401)
    found = store.messages.get(tenant, read.lookup_key)
    if found is None:
        return Reply(404, "Not Found")
    try:
        _authorize_by_tenant_or_grant(
            tenant,
            read,
            store,
            "MessagesReadAuthorizationFailed",
            "protocol message failed authorization",
            lambda grant, grantee: grant_authorization.authorize_messages_read(
                message, found, tenant, grantee, grant, store
            ),
        )
    except STAGE_ERRORS as e:
        return reply_from_error(e, 401)
    data: bytes | None = None
    if records_util.is_records_write(found):
        # Small data travels inside the stored message; larger data is in the data store
        # (and may be gone, e.g. after an update replaced it: then no data).
        if "encodedData" in found:
            data = b64url_decode(found.pop("encodedData"))
        else:
            data = store.data.get(tenant, found["recordId"], found["descriptor"]["dataCid"])
    entry = {"messageCid": message["descriptor"]["messageCid"], "message": found}
    return Reply(200, "OK", entry=entry, data=data)


# --------------------------------------------------------------------------- MessagesSubscribe


def handle_messages_subscribe(
    ctx: HandlerContext,
    tenant: str,
    message: Message,
    subscription_handler: SubscriptionHandler | None = None,
) -> Reply:
    """Open a live feed of ``tenant``'s events matching the filters (501 without an event stream).

    Without a ``subscription_handler`` the reference still answers 200, and its next matching
    write then fails on the missing handler; here such a subscription just drops its events.
    """
    stream = _event_stream(ctx)
    if stream is None:
        return reply_from_error(
            DwnError(
                "MessagesSubscribeEventStreamUnimplemented", "Subscriptions are not supported"
            ),
            _NOT_IMPLEMENTED,
        )
    store = ctx.store
    try:
        subscribe = MessagesSubscribe.parse(message)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 400)
    try:
        authenticate(message.get("authorization"))
        _authorize_by_tenant_or_grant(
            tenant,
            subscribe,
            store,
            "MessagesSubscribeAuthorizationFailed",
            "message failed authorization",
            lambda grant, grantee: grant_authorization.authorize_messages_query_or_subscribe(
                message, tenant, grantee, grant, store
            ),
        )
    except STAGE_ERRORS as e:
        return reply_from_error(e, 401)
    filters = convert_filters(message["descriptor"]["filters"])
    listener = _listener(tenant, filters, subscription_handler)
    subscription = stream.subscribe(tenant, message_cid(message), listener)
    return SubscriptionReply(200, "OK", subscription=subscription)


def _listener(
    tenant: str, filters: list[dict[str, Any]], handler: SubscriptionHandler | None
) -> Callable[[str, MessageEvent, dict[str, Any]], None]:
    def listener(event_tenant: str, event: MessageEvent, indexes: dict[str, Any]) -> None:
        if handler is not None and event_tenant == tenant and match_any_filter(indexes, filters):
            handler(event)

    return listener


# --------------------------------------------------------------------------- RecordsSubscribe


def handle_records_subscribe(
    ctx: HandlerContext,
    tenant: str,
    message: Message,
    subscription_handler: SubscriptionHandler | None = None,
) -> Reply:
    """Open a live feed of the records a RecordsQuery by the same author would list.

    Anonymous subscribers see published records only; the tenant sees everything; others see
    published records, their own unpublished ones, those addressed to them, and with a role
    the unpublished records of that protocol path. 501 without an event stream.
    """
    stream = _event_stream(ctx)
    if stream is None:
        return reply_from_error(
            DwnError("RecordsSubscribeEventStreamUnimplemented", "Subscriptions are not supported"),
            _NOT_IMPLEMENTED,
        )
    store = ctx.store
    try:
        subscribe = RecordsSubscribe.parse(message)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 400)
    flt = message["descriptor"]["filter"]
    if records_util.filter_includes_published_records(flt) and subscribe.author is None:
        filters = [_records_filter(flt, published=True)]
    else:
        try:
            authenticate(message.get("authorization"))
            _authorize_records_subscribe(tenant, subscribe, store)
        except STAGE_ERRORS as e:
            return reply_from_error(e, 401)
        author = subscribe.author
        assert author is not None  # authenticated above
        if author == tenant:
            filters = [_records_filter(flt)]
        else:
            filters = _non_owner_filters(flt, author, subscribe.signature_payload or {})
    listener = _listener(tenant, filters, subscription_handler)
    subscription = stream.subscribe(tenant, message_cid(message), listener)
    return SubscriptionReply(200, "OK", subscription=subscription)


def _records_filter(flt: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        **records_util.convert_filter(flt),
        "interface": "Records",
        "method": _WRITE_OR_DELETE,
        **extra,
    }


def _non_owner_filters(
    flt: dict[str, Any], author: str, payload: dict[str, Any]
) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = []
    if records_util.filter_includes_published_records(flt):
        filters.append(_records_filter(flt, published=True))
    if records_util.filter_includes_unpublished_records(flt):
        if records_util.should_build_unpublished_author_filter(flt, author):
            filters.append(
                {
                    **records_util.convert_filter(flt),
                    "author": author,
                    "interface": "Records",
                    "method": _WRITE_OR_DELETE,
                    "published": False,
                }
            )
        if records_util.should_protocol_authorize(payload):
            filters.append(_records_filter(flt, published=False))
        if records_util.should_build_unpublished_recipient_filter(flt, author):
            filters.append(_records_filter(flt, recipient=author, published=False))
    return filters


def _authorize_records_subscribe(tenant: str, subscribe: RecordsSubscribe, store: Store) -> None:
    if subscribe.is_signed_by_author_delegate:
        delegated = subscribe.message["authorization"]["authorDelegatedGrant"]
        grant = PermissionGrant.parse(delegated)
        assert subscribe.author is not None and subscribe.signer is not None
        grant_authorization.authorize_records_query_or_subscribe(
            subscribe.message, subscribe.author, subscribe.signer, grant, store
        )
    # Only a subscription that invokes a role is checked against the protocol's rules; the
    # filters above already limit what everyone else receives.
    if records_util.should_protocol_authorize(subscribe.signature_payload or {}):
        protocol_authorization.authorize_query_or_subscribe(tenant, subscribe, store)
