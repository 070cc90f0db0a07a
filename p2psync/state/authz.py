"""Who may read a tenant's messages over replication (``protocol/replication-profiles.md`` §5).

Two decisions, both taken from the store's own copy of the tenant's permission records (the
dwn-sdk-js 0.5.2 permissions protocol, :mod:`p2psync.dwn.permissions`):

**The reader decision** (:meth:`ReadAuthorizer.reader`), once per collection a peer asks for.
A peer is an *authorized reader* of ``tenant`` for a :class:`SyncScope` when

- its DID is the tenant's; or
- it holds, from the tenant, an active grant for ``Messages/Read`` **and** one for
  ``Messages/Query`` (0.5.2 has no ``Messages/Sync``; the pair is the RFC's delegated sync
  grant, part 1), and each grant that is protocol-scoped names the scope's protocol, the scope
  being a ``protocol`` or ``subset`` scope. A global collection lists every protocol, so it
  needs unscoped grants: a feed is never thinned by authorization (§5).

"Active" is the engine's own test (:func:`p2psync.dwn.grant_authorization.perform_base_validation`)
applied to a ``Messages/Read`` (resp. ``Query``) message stamped *now*: granted by the tenant to
the reader, ``dateGranted <= now < dateExpires``, no revocation stamped at or before now, and
the scope's interface and method. Only genuine permission grants count (records of the
permissions protocol at path ``grant`` addressed to the reader, latest state). When several
grants qualify, an unscoped one is preferred (it reads everything a scoped one reads), then the
one expiring last.

The protocol rule is ours, not the engine's: 0.5.2 accepts a ``MessagesQuery`` with an empty
``filters`` list under a protocol-scoped grant (its check loops over the filters), which would
list every protocol. We refuse a protocol-scoped grant for a global collection instead.

**The per-message decision** (:meth:`ReadAuthorizer.may_read`), for every message sent: what
our engine would answer a ``MessagesRead`` of that message's CID, stamped now and signed by the
reader under the read grant — 200 or not. With an unscoped read grant every stored message
passes; with one scoped to protocol P: a Records message whose record (its newest write, for a
delete) has protocol P, a permission record whose scope (a revocation's: its grant's) names P,
and P's ``ProtocolsConfigure``. The message may be given as stored (with ``encodedData``) or
as it travels (without); a permission record without ``encodedData`` is read back from the
store by its CID, as the engine reads the stored copy.

**Keeping decisions current.** A decision caches what it looked up (the grants' lapse time,
the read grant's protocol, records' newest writes, the scopes of grants that revocations
point at). The cache is keyed on the store's *generation* — this connection's change counter
and SQLite's ``data_version`` (commits by other connections, e.g. a ``p2psync grant`` run in
another process) — so any write to the store makes the next :meth:`~ReadAuthorizer.may_read`
re-check the grants from the store before answering; between writes it costs two counter
reads and a clock read. Time alone ends a decision at :attr:`ReaderDecision.recheck_at` (the
earliest expiry, or a revocation stamped in the future: the engine counts a revocation from
its own timestamp). :meth:`~ReadAuthorizer.still_valid` re-checks from the store
unconditionally; a source calls it when it applies a revocation or reaches ``recheck_at``, and
closes the feed when it turns false (§5: ``1008 P2PSync 403 SyncNotAuthorized``).

Not thread-safe: one authorizer belongs to whoever owns the store's connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import get_oldest_message
from p2psync.dwn.grant_authorization import perform_base_validation
from p2psync.dwn.handlers.records import STAGE_ERRORS
from p2psync.dwn.js_values import UNDEFINED, js_get, js_strict_equal
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.permissions import (
    GRANT_PATH,
    PERMISSIONS_PROTOCOL_URI,
    REVOCATION_PATH,
    create_grant,
    fetch_grant,
    get_scope_from_permission_record,
    has_protocol_scope,
)
from p2psync.dwn.records_util import is_records_write
from p2psync.dwn.records_write import fetch_newest_records_write
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import (
    compare_timestamps,
    datetime_from_timestamp,
    is_before,
    now_timestamp,
    timestamp_from_datetime,
)
from p2psync.replication.scope import SyncScope

__all__ = [
    "SYNC_GRANT_METHODS",
    "ReadAuthorizer",
    "ReaderDecision",
    "sync_grant_messages",
]

_MESSAGES: Final = "Messages"
_READ: Final = "Read"
_QUERY: Final = "Query"

#: The Messages methods a delegated sync grant is made of on dwn-sdk-js 0.5.2 (§5: ``Read`` to
#: fetch, ``Query`` to list; 0.5.2 defines no ``Sync``).
SYNC_GRANT_METHODS: Final[tuple[str, ...]] = (_READ, _QUERY)

# How many failing grants a refusal names: enough to say why, short enough for a 403 detail.
_REASONS_SHOWN: Final = 3

# A cache entry for a lookup that failed (the engine would not answer 200), and a cache miss.
_FAILED: Final = object()
_MISSING: Final = object()

_Generation = tuple[int, int]


@dataclass(eq=False, slots=True)
class _GrantState:
    """What an allowed grantee's decision relies on, and what it has looked up since."""

    read_id: str
    query_id: str
    generation: _Generation
    lapses_at: str | None
    read_protocol: Any  # the read grant's scoped protocol; UNDEFINED when unscoped
    valid: bool = True
    invalid_reason: str = ""
    # recordId -> the record's newest RecordsWrite (or _FAILED); for deletes
    newest_writes: dict[str, Any] = field(default_factory=dict)
    # ("grant", grant id) or ("data", recordId, dataCid) -> the scope a permission record is
    # about (or _FAILED)
    permission_scopes: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def forget(self, generation: _Generation) -> None:
        self.generation = generation
        self.newest_writes.clear()
        self.permission_scopes.clear()


@dataclass(frozen=True, slots=True)
class ReaderDecision:
    """Whether ``reader_did`` may read ``tenant``'s messages in ``scope`` (§5), and on what.

    ``allowed``: the decision when it was taken; ``reason``: why not (a 403 detail), empty when
    allowed; ``grant_ids``: the grants relied on, ``(read grant, query grant)``, empty for the
    tenant itself. Pass it back to the :class:`ReadAuthorizer` that took it.
    """

    tenant: str
    reader_did: str
    scope: SyncScope
    allowed: bool
    reason: str = ""
    grant_ids: tuple[str, ...] = ()
    _state: _GrantState | None = field(default=None, repr=False, compare=False)

    @property
    def recheck_at(self) -> str | None:
        """When time alone ends the decision (earliest grant expiry or future-dated revocation),
        as of the last check; ``None`` for the tenant itself or a refusal."""
        return None if self._state is None or not self._state.valid else self._state.lapses_at

    @property
    def invalid_reason(self) -> str:
        """Why the last re-check found the grants no longer good (``""`` while they are)."""
        return "" if self._state is None else self._state.invalid_reason


class ReadAuthorizer:
    """Reader and per-message decisions over one store (see the module docstring).

    ``clock`` gives the current DWN timestamp; it stamps the ``Messages`` messages the
    decisions stand for.
    """

    def __init__(self, store: Store, *, clock: Callable[[], str] = now_timestamp) -> None:
        self._store = store
        self._clock = clock

    # -- the reader decision ---------------------------------------------------------------

    def reader(self, tenant: str, reader_did: str, scope: SyncScope) -> ReaderDecision:
        """May ``reader_did`` read ``tenant``'s collection of ``scope``? (§5, first part)"""
        if reader_did == tenant:
            return ReaderDecision(tenant, reader_did, scope, True)
        # Taken before the reads, so a write racing them makes the first may_read re-check.
        generation = self._generation()
        now = self._clock()
        candidates = self._sync_grants(tenant, reader_did)
        chosen: dict[str, PermissionGrant] = {}
        for method in SYNC_GRANT_METHODS:
            grants = candidates[method]
            if not grants:
                return self._refusal(
                    tenant, reader_did, scope, f"{reader_did} holds no grant from {tenant} for Messages/{method}"
                )
            failures: list[str] = []
            for grant in _by_preference(grants):
                problem = self._problem(tenant, reader_did, grant, method, scope, now)
                if problem is None:
                    chosen[method] = grant
                    break
                failures.append(f"grant {grant.id}: {problem}")
            else:
                return self._refusal(
                    tenant,
                    reader_did,
                    scope,
                    f"no usable Messages/{method} grant from {tenant}: " + "; ".join(failures[:_REASONS_SHOWN]),
                )
        read, query = chosen[_READ], chosen[_QUERY]
        state = _GrantState(
            read_id=read.id,
            query_id=query.id,
            generation=generation,
            lapses_at=_earliest(self._lapse(tenant, read, now), self._lapse(tenant, query, now)),
            read_protocol=js_get(read.scope, "protocol"),
        )
        return ReaderDecision(tenant, reader_did, scope, True, "", (read.id, query.id), state)

    def still_valid(self, tenant: str, decision: ReaderDecision) -> bool:
        """Re-check an allowed decision from the store now (expiry, revocation, the grant
        records themselves); always true for the tenant itself, false for a refusal."""
        if tenant != decision.tenant or not decision.allowed:
            return False
        state = decision._state
        if state is None:
            return True
        self._recheck(decision, state, self._clock())
        return state.valid

    # -- the per-message decision ----------------------------------------------------------

    def may_read(self, tenant: str, decision: ReaderDecision, message: dict[str, Any]) -> bool:
        """Whether ``message`` (one of ``tenant``'s stored messages) may be sent under
        ``decision``: what a ``MessagesRead`` of it by the reader under its read grant, stamped
        now, would get from our engine (200 → true). True for the tenant itself."""
        if tenant != decision.tenant or not decision.allowed:
            return False
        state = decision._state
        if state is None:
            return True
        generation = self._generation()
        now = self._clock()
        if generation != state.generation or (
            state.valid and state.lapses_at is not None and not is_before(now, state.lapses_at)
        ):
            self._recheck(decision, state, now, generation)
        if not state.valid:
            return False
        try:
            return self._in_read_scope(tenant, state, message)
        except STAGE_ERRORS:
            return False  # the engine answers a fault on the way with 401 (or 500): not read

    # -- grants ----------------------------------------------------------------------------

    def _generation(self) -> _Generation:
        conn = self._store.conn
        # data_version (the pragma) moves with other connections' commits; total_changes with
        # this connection's own writes.
        return conn.total_changes(), int(self._store.scalar("PRAGMA data_version"))

    def _sync_grants(self, tenant: str, reader_did: str) -> dict[str, list[PermissionGrant]]:
        """The tenant's permission grants to ``reader_did`` for Messages/Read and /Query."""
        found: dict[str, list[PermissionGrant]] = {method: [] for method in SYNC_GRANT_METHODS}
        messages, _ = self._store.messages.query(
            tenant,
            [
                {
                    "interface": "Records",
                    "method": "Write",
                    "protocol": PERMISSIONS_PROTOCOL_URI,
                    "protocolPath": GRANT_PATH,
                    "recipient": reader_did,
                    "isLatestBaseState": True,
                }
            ],
        )
        for message in messages:
            try:
                grant = PermissionGrant.parse(message)
                interface, method = js_get(grant.scope, "interface"), js_get(grant.scope, "method")
            except STAGE_ERRORS:
                continue  # not a grant anyone could use
            if interface == _MESSAGES and method in found:
                found[method].append(grant)
        return found

    def _problem(
        self, tenant: str, reader_did: str, grant: PermissionGrant, method: str, scope: SyncScope, now: str
    ) -> str | None:
        """Why ``grant`` cannot back ``method`` for this collection now, or ``None``."""
        probe = {"descriptor": {"interface": _MESSAGES, "method": method, "messageTimestamp": now}}
        try:
            perform_base_validation(probe, tenant, reader_did, grant, self._store)
            scoped = has_protocol_scope(grant.scope)
        except STAGE_ERRORS as exc:
            return str(exc)
        if not scoped:
            return None
        protocol = grant.scope["protocol"]
        if scope.kind == "global":
            return f"it is scoped to protocol {protocol}, and a global collection lists every protocol"
        if not js_strict_equal(protocol, scope.protocol):
            return f"it is scoped to protocol {protocol}, the collection to {scope.protocol}"
        return None

    def _lapse(self, tenant: str, grant: PermissionGrant, now: str) -> str | None:
        """When time alone ends ``grant`` (it passed :meth:`_problem` at ``now``)."""
        expires = grant.date_expires if isinstance(grant.date_expires, str) else None
        # The same revocations the engine counts (latest state, any protocol).
        revocations, _ = self._store.messages.query(
            tenant, [{"parentId": grant.id, "protocolPath": REVOCATION_PATH, "isLatestBaseState": True}]
        )
        oldest = get_oldest_message(revocations)
        revoked_at = None if oldest is None else oldest["descriptor"]["messageTimestamp"]
        return _earliest(expires, revoked_at if isinstance(revoked_at, str) and is_before(now, revoked_at) else None)

    def _recheck(
        self, decision: ReaderDecision, state: _GrantState, now: str, generation: _Generation | None = None
    ) -> None:
        """Re-read the relied-on grants from the store and re-test them at ``now``."""
        state.forget(self._generation() if generation is None else generation)
        lapses: list[str | None] = []
        for grant_id, method in ((state.read_id, _READ), (state.query_id, _QUERY)):
            try:
                grant = fetch_grant(decision.tenant, self._store, grant_id)
            except STAGE_ERRORS as exc:
                problem: str | None = str(exc)
            else:
                problem = self._problem(decision.tenant, decision.reader_did, grant, method, decision.scope, now)
            if problem is not None:
                state.valid = False
                state.invalid_reason = f"Messages/{method} grant {grant_id}: {problem}"
                return
            lapses.append(self._lapse(decision.tenant, grant, now))
            if method == _READ:
                state.read_protocol = js_get(grant.scope, "protocol")
        state.valid = True
        state.invalid_reason = ""
        state.lapses_at = _earliest(*lapses)

    # -- the read grant's scope over one message (the engine's MessagesRead scope check) ----

    def _in_read_scope(self, tenant: str, state: _GrantState, message: dict[str, Any]) -> bool:
        scoped = state.read_protocol
        if scoped is UNDEFINED:
            return True
        descriptor = message["descriptor"]
        interface = descriptor.get("interface")
        if interface == "Records":
            write = message if is_records_write(message) else self._newest_write(tenant, state, descriptor["recordId"])
            if write is _FAILED:
                return False
            record_protocol = write["descriptor"].get("protocol", UNDEFINED)
            if js_strict_equal(record_protocol, scoped):
                return True
            if record_protocol != PERMISSIONS_PROTOCOL_URI:
                return False
            permission_scope = self._permission_scope(tenant, state, write)
            return (
                permission_scope is not _FAILED
                and has_protocol_scope(permission_scope)
                and js_strict_equal(permission_scope["protocol"], scoped)
            )
        if interface == "Protocols":
            return js_strict_equal(js_get(js_get(descriptor, "definition"), "protocol"), scoped)
        return False

    def _newest_write(self, tenant: str, state: _GrantState, record_id: str) -> Any:
        cached = state.newest_writes.get(record_id, _MISSING)
        if cached is _MISSING:
            try:
                cached = fetch_newest_records_write(self._store, tenant, record_id)
            except STAGE_ERRORS:
                cached = _FAILED
            state.newest_writes[record_id] = cached
        return cached

    def _permission_scope(self, tenant: str, state: _GrantState, write: dict[str, Any]) -> Any:
        """The scope a permission record is about, or ``_FAILED`` where the engine fails."""
        descriptor = write["descriptor"]
        # A revocation is about its grant's scope (the grant's latest state); a grant or request
        # about the scope in its own data.
        revocation = descriptor.get("protocolPath") == REVOCATION_PATH
        key = (
            ("grant", descriptor.get("parentId"))
            if revocation
            else ("data", write.get("recordId"), descriptor.get("dataCid"))
        )
        cached = state.permission_scopes.get(key, _MISSING)
        if cached is _MISSING:
            cached = self._read_permission_scope(tenant, write, revocation)
            state.permission_scopes[key] = cached
        return cached

    def _read_permission_scope(self, tenant: str, write: dict[str, Any], revocation: bool) -> Any:
        if not revocation and "encodedData" not in write:
            # As it travels the record has no data; the engine reads the stored copy.
            stored = self._store.messages.get(tenant, message_cid(write))
            if stored is None:
                return _FAILED
            write = stored
        try:
            return get_scope_from_permission_record(tenant, self._store, write)
        except STAGE_ERRORS:
            return _FAILED

    @staticmethod
    def _refusal(tenant: str, reader_did: str, scope: SyncScope, reason: str) -> ReaderDecision:
        return ReaderDecision(tenant, reader_did, scope, False, reason)


def _by_preference(grants: list[PermissionGrant]) -> list[PermissionGrant]:
    """Unscoped grants first, then the one expiring last; the id settles ties."""
    ordered = sorted(grants, key=lambda g: g.id)
    ordered.sort(key=lambda g: g.date_expires if isinstance(g.date_expires, str) else "", reverse=True)
    ordered.sort(key=lambda g: isinstance(g.scope, dict) and "protocol" in g.scope)
    return ordered


def _earliest(*timestamps: str | None) -> str | None:
    present = [t for t in timestamps if t is not None]
    if not present:
        return None
    earliest = present[0]
    for t in present[1:]:
        if compare_timestamps(t, earliest) < 0:
            earliest = t
    return earliest


# --------------------------------------------------------------------------- authoring


def _one_year_after(timestamp: str) -> str:
    moment = datetime_from_timestamp(timestamp)
    try:
        later = moment.replace(year=moment.year + 1)
    except ValueError:
        if moment.year >= datetime.max.year:
            raise DwnError("SyncGrantExpiryInvalid", f"no expiry one year after {timestamp}") from None
        later = moment.replace(year=moment.year + 1, day=28)  # 29 February: the last day of February
    return timestamp_from_datetime(later)


def sync_grant_messages(
    tenant: Identity,
    grantee_did: str,
    *,
    protocol: str | None = None,
    expires: str | None = None,
    date_granted: str | None = None,
) -> list[tuple[dict[str, Any], bytes]]:
    """The delegated sync grant from ``tenant`` to ``grantee_did``: two permission grants,
    ``Messages/Read`` and ``Messages/Query`` (scoped to ``protocol`` when given), as
    ``(RecordsWrite message, data)`` pairs for ``Dwn.process_message(tenant.did, message, data)``.

    ``date_granted`` defaults to now, ``expires`` to the same instant one year later (29
    February → 28 February). Raises ``DwnError(SyncGrantExpiryInvalid)`` when ``expires`` is
    not after ``date_granted``.
    """
    granted = date_granted or now_timestamp()
    expiry = expires or _one_year_after(granted)
    if not is_before(granted, expiry):
        raise DwnError("SyncGrantExpiryInvalid", f"expiry {expiry} is not after the grant date {granted}")
    pairs: list[tuple[dict[str, Any], bytes]] = []
    for method in SYNC_GRANT_METHODS:
        scope: dict[str, Any] = {"interface": _MESSAGES, "method": method}
        if protocol is not None:
            scope["protocol"] = protocol
        write, data = create_grant(
            signer=tenant,
            granted_to=grantee_did,
            date_expires=expiry,
            scope=scope,
            date_granted=granted,
            description=f"p2psync delegated sync (Messages/{method})",
        )
        pairs.append((write.message, data))
    return pairs
