"""Protocols interface handlers: Configure and Query, with the reference's checks and codes.

Mirrors dwn-sdk-js 0.5.2 ``handlers/protocols-configure.ts`` and ``handlers/protocols-query.ts``:
parse (400), authenticate and authorize (401), then the store. A newer ProtocolsConfigure of
the same protocol replaces the older ones; an older or identical one is answered 409.

One departure from the reference, invisible to every query: a definition pruned here keeps its
event-log entry. The reference drops it, but a replica must still receive it: records written
while it was in force are judged by it (protocol/replication-apply.md, "Superseded
definitions"). ``MessagesQuery`` skips such entries (:meth:`EventLog.query`), so it answers as
the reference does. A ProtocolsQuery that is not authorized still succeeds,
with the published definitions only.
"""

from __future__ import annotations

from typing import Any, Final

from p2psync.dwn import grant_authorization, permissions
from p2psync.dwn.authentication import authenticate
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import Message, get_newest_message, is_newer
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.protocols import CONFIGURE, PROTOCOLS, ProtocolsConfigure, ProtocolsQuery
from p2psync.dwn.reply import HandlerContext, Reply, reply_from_error
from p2psync.dwn.store import Store

__all__ = ["handle_protocols_configure", "handle_protocols_query"]

# Refusals after which a ProtocolsQuery falls back to the published definitions instead of
# answering 401: no signature at all, a signer who is neither the tenant nor holds a grant,
# and a grant scoped to another protocol (the reference's list, in its handler).
_PUBLISHED_ONLY_FALLBACK: Final = frozenset(
    {
        "AuthenticateJwsMissing",
        "ProtocolsQueryUnauthorized",
        "ProtocolsGrantAuthorizationQueryProtocolScopeMismatch",
    }
)


# --------------------------------------------------------------------------- Configure


def handle_protocols_configure(ctx: HandlerContext, tenant: str, message: Message) -> Reply:
    """Install (or refuse) a protocol definition in ``tenant``'s DWN."""
    store = ctx.store
    try:
        configure = ProtocolsConfigure.parse(message)
    except DwnError as e:
        return reply_from_error(e, 400)
    try:
        authenticate(message.get("authorization"))
        _authorize_configure(tenant, configure, store)
    except DwnError as e:
        return reply_from_error(e, 401)

    protocol = configure.definition["protocol"]
    existing, _ = store.messages.query(
        tenant, [{"interface": PROTOCOLS, "method": CONFIGURE, "protocol": protocol}]
    )
    newest = get_newest_message(existing)
    incoming_is_newest = newest is None or is_newer(message, newest)
    if incoming_is_newest:
        newest = message

    with store.transaction():
        if incoming_is_newest:
            indexes = configure.construct_indexes()
            store.messages.put(tenant, message, indexes)
            store.events.append(tenant, message_cid(message), indexes)
            reply = Reply(202, "Accepted")
        else:
            reply = Reply(409, "Conflict")
        # Whatever the outcome, only the newest definition of a protocol is kept (and every
        # one stays listed in the log: see the module's docstring).
        assert newest is not None
        for older in existing:
            if is_newer(newest, older):
                store.messages.delete(tenant, message_cid(older))
    return reply


def _authorize_configure(tenant: str, configure: ProtocolsConfigure, store: Store) -> None:
    """The tenant, or a grantee of the tenant's grant; an author-delegate's grant first."""
    authorization = configure.message["authorization"]
    if configure.is_signed_by_author_delegate:
        delegated = PermissionGrant.parse(authorization["authorDelegatedGrant"])
        assert configure.author is not None and configure.signer is not None
        grant_authorization.authorize_protocols_configure(
            configure.message, configure.author, configure.signer, delegated, store
        )
    if configure.author == tenant:
        return
    payload = configure.signature_payload or {}
    if configure.author is not None and "permissionGrantId" in payload:
        grant = permissions.fetch_grant(tenant, store, payload["permissionGrantId"])
        grant_authorization.authorize_protocols_configure(
            configure.message, tenant, configure.author, grant, store
        )
        return
    raise DwnError("ProtocolsConfigureAuthorizationFailed", "message failed authorization", 401)


# --------------------------------------------------------------------------- Query


def handle_protocols_query(ctx: HandlerContext, tenant: str, message: Message) -> Reply:
    """The protocol definitions of ``tenant`` the querier may see."""
    store = ctx.store
    try:
        query = ProtocolsQuery.parse(message)
    except DwnError as e:
        return reply_from_error(e, 400)
    try:
        authenticate(message.get("authorization"))
        _authorize_query(tenant, query, store)
    except DwnError as e:
        if e.code in _PUBLISHED_ONLY_FALLBACK:
            return Reply(200, "OK", entries=_fetch_configures(store, tenant, query, published=True))
        return reply_from_error(e, 401)
    return Reply(200, "OK", entries=_fetch_configures(store, tenant, query, published=None))


def _authorize_query(tenant: str, query: ProtocolsQuery, store: Store) -> None:
    if query.author == tenant:
        return
    payload = query.signature_payload or {}
    grant_id = payload.get("permissionGrantId")
    # The reference tests the grant ID for truthiness here (`""` is no grant).
    if query.author is not None and grant_id:
        grant = permissions.fetch_grant(tenant, store, grant_id)
        grant_authorization.authorize_protocols_query(
            query.message, tenant, query.author, grant, store
        )
        return
    raise DwnError("ProtocolsQueryUnauthorized", "The ProtocolsQuery failed authorization", 401)


def _fetch_configures(
    store: Store, tenant: str, query: ProtocolsQuery, *, published: bool | None
) -> list[dict[str, Any]]:
    """Stored ProtocolsConfigures matching the query's filter, oldest first."""
    flt: dict[str, Any] = {
        **query.message["descriptor"].get("filter", {}),
        "interface": PROTOCOLS,
        "method": CONFIGURE,
    }
    if published is not None:
        flt["published"] = published
    messages, _ = store.messages.query(tenant, [flt])
    return messages
