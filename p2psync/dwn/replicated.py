"""Replicated apply: a message that arrived by replication, judged by the engine, told apart.

``apply_replicated_message`` is the engine's entry point for messages that come from another
replica (``Dwn.applyReplicatedMessage`` of the wire-surface seed). It runs, in this order:

1. tenant check — a tenant this store does not serve (the ``tenant_gate`` says no, or the store
   has it disabled) gives ``Deferred('tenant-inactive')``;
2. integrity — interface/method and JSON schema, exactly ``Dwn.process_message``'s first checks;
   a failure is ``Invalid`` with the reply detail;
3. dedup — the exact message (by CID) is already stored: ``Duplicate`` before any handler runs,
   after repairing its event-log entry if that is missing;

(2 runs inside ``process_message``, right after 3: a stored message passed the integrity check
when it was stored, so looking it up first answers every message exactly as the seed's order
does, and saves checking the schema twice.)
4. process — ``Dwn.process_message``, unchanged: the handler is the dependency authority;
5. write beaten by delete — a RecordsWrite refused only because a delete of its record is
   newer state here is still stored (not as latest state) and reported ``Superseded``;
6. adapt — the reply becomes a :data:`ReplicationApplyResult`.

Adapting never relaxes authorization: it reads the refusal's error code (the text before the
first ``:`` of the detail), the message itself and what is present in the store, only to say
*what is missing*. After the dependency is fetched, the handler judges the message again.

Our engine is dwn-sdk-js 0.5.2, older than the reference the seed describes, and reports some
missing dependencies under other codes; each mapping below says which code 0.5.2 raises and
why it stands for a missing dependency only when the dependency is really absent here
(``docs/replication-apply.md`` lists them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import typing
from collections.abc import Sequence
from typing import Any, Final

import apsw

from p2psync.dwn import datacid, memo, permissions
from p2psync.dwn.authentication import authenticate
from p2psync.dwn.canonical import (
    AppendingRun,
    History,
    Placement,
    RunAborted,
    Verdict,
    archived_record,
    is_stateful,
    signature_payload,
    sort_key,
)
from p2psync.dwn.datacid import data_cid as compute_data_cid
from p2psync.dwn.encoding import in_dag_cbor_order, message_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import get_author, get_newest_message
from p2psync.dwn.handlers.records import STAGE_ERRORS, parse_signed_records_message
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records_write import RecordsWrite, fetch_initial_records_write_message, is_initial_write
from p2psync.dwn.replication_types import (
    Ancestor,
    Applied,
    Deferred,
    DependencyRef,
    Duplicate,
    Grant,
    Incomplete,
    InitialWrite,
    Invalid,
    Parent,
    ProgressToken,
    Protocol,
    RecordData,
    ReplicationApplyResult,
    Role,
    Superseded,
)
from p2psync.dwn.reply import Reply
from p2psync.dwn.store import Store

__all__ = [
    "MAX_RUN",
    "MIN_RUN",
    "MessageProcessor",
    "RunEntry",
    "apply_replicated_message",
    "apply_replicated_run",
    "apply_replicated_message_json",
    "dependency_refs",
    "error_code",
]

log = logging.getLogger(__name__)

Message = dict[str, Any]

# Data up to this size is kept inline with its message (the reference's
# DwnConstant.maxDataSizeAllowedToBeEncoded); larger data lives in the data store.
MAX_DATA_SIZE_ENCODED: Final = 30_000

# -- error codes the adapter reads (the reference's DwnErrorCode names) ----------------------
PROTOCOL_NOT_FOUND: Final = "ProtocolAuthorizationProtocolNotFound"
COMPOSED_PROTOCOL_NOT_INSTALLED: Final = "ProtocolsConfigureComposedProtocolNotInstalled"
PARENT_RECORD_NOT_FOUND: Final = "ProtocolAuthorizationParentRecordNotFound"
# 0.5.2 has no ParentRecordNotFound: a child whose parent is not here fails the protocol-path
# check ("Could not find matching parent record to verify declared protocol path").
INCORRECT_PROTOCOL_PATH: Final = "ProtocolAuthorizationIncorrectProtocolPath"
PARENT_NOT_FOUND_CONSTRUCTING_CHAIN: Final = "ProtocolAuthorizationParentNotFoundConstructingRecordChain"
INITIAL_WRITE_NOT_FOUND: Final = "RecordsWriteGetInitialWriteNotFound"
# 0.5.2 refuses a non-tenant protocol update whose initial write is not here with this: with no
# initial write it finds no action (update / co-update) to look rules up for.
ACTION_NOT_ALLOWED: Final = "ProtocolAuthorizationActionNotAllowed"
GRANT_MISSING: Final = "GrantAuthorizationGrantMissing"
ROLE_RECORD_NOT_FOUND: Final = "ProtocolAuthorizationMatchingRoleRecordNotFound"
MISSING_DATA_IN_PREVIOUS: Final = "RecordsWriteMissingDataInPrevious"
MISSING_ENCODED_DATA_IN_PREVIOUS: Final = "RecordsWriteMissingEncodedDataInPrevious"
# An update sent without data takes its data from the newest write here; when that write holds
# other data (the write that brought this data is not here yet) 0.5.2 reports a mismatch.
DATA_CID_MISMATCH: Final = "RecordsWriteDataCidMismatch"
DATA_SIZE_MISMATCH: Final = "RecordsWriteDataSizeMismatch"
NOT_ALLOWED_AFTER_DELETE: Final = "RecordsWriteNotAllowedAfterDelete"
RESOLVER_NOT_FOUND: Final = "GeneralJwsVerifierGetPublicKeyNotFound"
# Refusals that no other message can change: the author is not the tenant and names no grant
# (a protocol definition, or a record outside any protocol), or the owner is someone else.
NEVER_AUTHORIZED: Final = frozenset(
    {"ProtocolsConfigureAuthorizationFailed", "RecordsWriteAuthorizationFailed", "RecordsWriteOwnerAndTenantMismatch"}
)

# What a record looks like here, for deciding whether a refusal means "not here yet".
_ABSENT: Final = "absent"  # no message of the record at all
_INCOMPLETE: Final = "incomplete"  # only writes that are not latest state (an initial write without data)
_LIVE: Final = "live"  # a write is its latest state
_DELETED: Final = "deleted"  # its newest message is a delete

_PROTOCOL_IN_DETAIL = re.compile(r"protocol definition for (\S+)$")
_COMPOSED_PROTOCOL_IN_DETAIL = re.compile(r"composed protocol '([^']+)'")
_ANCESTOR_IN_DETAIL = re.compile(r"ID (\S+)")


class MessageProcessor(typing.Protocol):
    """What a replicated apply needs of the engine (:class:`p2psync.dwn.engine.Dwn` is one).

    Declared here so the engine depends on this module and not the other way round.
    """

    @property
    def store(self) -> Store: ...

    @property
    def history(self) -> History: ...

    def validate_tenant(self, tenant: str) -> Reply | None: ...

    def validate_message_integrity(self, message: Any) -> Reply | None: ...

    def process_message(self, tenant: str, message: Any, data: bytes | None = None) -> Reply: ...


# --------------------------------------------------------------------------- entry point


def apply_replicated_message(
    dwn: MessageProcessor, tenant: str, message: Any, data: bytes | None = None, *, cid: str | None = None,
    encoded: bytes | None = None,
) -> ReplicationApplyResult:
    """Apply one replicated message (with its record data, if any) to ``tenant``'s DWN.

    ``cid``: the CID the caller computed from ``message`` itself (it saves recomputing it);
    ``encoded``: the DAG-CBOR of ``message`` that CID hashes, when the caller has it (the store
    keeps it as the message's wire form).
    """
    known = cid if cid is not None and not cid.startswith("uncomputable:") else None
    with memo.processing(message, known) as held:
        if known is not None and encoded is not None and held.encoded is None and held.cid == known:
            held.encoded = encoded
        return _apply(dwn, tenant, message, data, cid)


def _apply(
    dwn: MessageProcessor, tenant: str, message: Any, data: bytes | None, cid: str | None
) -> ReplicationApplyResult:
    if not isinstance(tenant, str) or not tenant:
        return Invalid("tenant must be a DID string")
    if not _tenant_active(dwn, tenant):
        return Deferred("tenant-inactive")
    try:
        if cid is None or cid.startswith("uncomputable:"):
            cid = message_cid(message)
    except (DwnError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        integrity = dwn.validate_message_integrity(message)
        return Invalid(integrity.detail if integrity is not None else f"MessageCidUncomputable: {exc}")
    try:
        history = dwn.history
        # Dedup may look before the integrity check: an admitted message passed it when it
        # was admitted, and the same CID is the same message.
        bad_data = _bad_data(message, data)
        if bad_data is not None:
            return Invalid(bad_data)  # checked first: nothing is archived with the wrong data
        archived, archived_data = history.archived_data(tenant, cid)
        if archived or _stored_cid(dwn.store, tenant, message, cid) is not None:
            if archived and archived_data is None and data is not None and _is_records_write(message):
                # It came without its data before (its source had dropped it); now it has it.
                verdict = _Verdict(dwn.store, tenant, message, data, cid)
                return verdict.result(history.attach_data(tenant, message, data, cid, verdict))
            _repair_log_entry(dwn.store, tenant, message, cid)
            return Duplicate()
        integrity = dwn.validate_message_integrity(message)
        if integrity is not None:
            return Invalid(integrity.detail)
        if not is_stateful(message):
            return Invalid(f"MessageNotReplicable: {_kind(message)} changes no state and is never replicated")
        verdict = _Verdict(dwn.store, tenant, message, data, cid)
        return verdict.result(history.place(tenant, message, data, cid, verdict))
    except apsw.Error:
        log.exception("storage error while applying replicated message %s", cid)
        return Deferred("storage")
    except Exception:  # a bug here must not take a sync session down; the message stays pending
        log.exception("internal error while applying replicated message %s", cid)
        return Deferred("storage")


class RunEntry(typing.NamedTuple):
    """One message of :func:`apply_replicated_run`, as :func:`apply_replicated_message` takes it:
    its CID computed by the caller from this very object, the DAG-CBOR it hashed (if at hand),
    and the CID of ``data`` when the caller hashed that very object."""

    message: Any
    data: bytes | None
    cid: str
    encoded: bytes | None = None
    data_cid: str | None = None


#: Fewest messages a run is tried for: one alone gains nothing over :func:`apply_replicated_message`.
MIN_RUN: Final = 2
#: Most messages a run takes. Its one savepoint keeps, in memory, the first image of every page
#: the run changes (~8 a message, on random-key indexes): 64 a run made the puller's peak RSS
#: ~4 MB higher at 100,000 stored, 16 keeps it within ~1 MB of a savepoint a message; a run's
#: own statements (~8) are still half a statement a message. Ours, measured (docs/benchmarks.md).
MAX_RUN: Final = 16


def apply_replicated_run(
    dwn: MessageProcessor, tenant: str, entries: Sequence[RunEntry]
) -> list[ReplicationApplyResult]:
    """Apply the leading run of ``entries`` that a pull in log order brings — initial
    RecordsWrites of new records, each sorting after the one before it and after everything
    here, their data inline or none — together (issue #17's batched apply): one folded
    savepoint, one look for duplicates, one at the set journal, one statement for their archive
    rows. Each is checked, processed and answered exactly as :func:`apply_replicated_message`
    would at its turn, so each result is ``Applied``; the run ends before the first entry that is
    anything else, and the caller applies that one alone. Returns the run's results, possibly
    none (a run that did not store exactly what it should is rolled back whole and returns none).
    Inside the caller's write transaction (the group commit's), never beside it.
    """
    # Which entries may form a run does not depend on their members' order: looked at first,
    # so that a batch of updates (none can) costs no ordering of the entries after each.
    run = _run_candidates(entries)
    if len(run) < MIN_RUN or not isinstance(tenant, str) or not tenant or not _tenant_active(dwn, tenant):
        return []
    run = [entry._replace(message=message) if (message := in_dag_cbor_order(entry.message)) is not entry.message
           else entry for entry in run]
    held = _held(dwn.store, tenant, [entry.cid for entry in run])
    if held:
        run = run[: next(i for i, entry in enumerate(run) if entry.cid in held)]
        if len(run) < MIN_RUN:
            return []
    appending = dwn.history.appending_run(tenant, sort_key(run[0].message, run[0].cid))
    if appending is None:
        return []
    results: list[ReplicationApplyResult] = []
    try:
        with appending:
            for entry in run:
                result = _append_to_run(dwn, appending, entry)
                if result is None:
                    break
                results.append(result)
    except RunAborted as exc:
        log.info("a run of %d replicated writes is applied one by one instead: %s", len(run), exc)
        return []
    except Exception:  # a storage error or a bug: each message alone reports what it meets
        log.exception("a run of %d replicated writes failed; applying them one by one", len(run))
        return []
    return results


def _run_candidates(entries: Sequence[RunEntry]) -> list[RunEntry]:
    """The leading entries that may form a run, by what a look at each tells (its descriptor is
    a RecordsWrite's, dated as an initial write is, in increasing canonical order); whether each
    really is its record's initial write is checked when it is processed."""
    out: list[RunEntry] = []
    previous, seen = "", set()
    for entry in entries[:MAX_RUN]:
        message, data, cid = entry.message, entry.data, entry.cid
        if type(message) is not dict or "encodedData" in message or not cid or cid in seen:
            break
        d = message.get("descriptor")
        if type(d) is not dict or d.get("interface") != "Records" or d.get("method") != "Write":
            break
        size, timestamp = d.get("dataSize"), d.get("messageTimestamp")
        # A 0-byte record is stored under another CID, and larger data out of line: alone.
        if type(size) is not int or size <= 0 or (data is not None and size > MAX_DATA_SIZE_ENCODED):
            break
        # The reference dates an initial write at its creation; an update is dated later.
        if type(timestamp) is not str or d.get("dateCreated") != timestamp or cid.startswith("uncomputable:"):
            break
        key = f"{timestamp} {cid}"
        if key <= previous:
            break
        out.append(entry)
        seen.add(cid)
        previous = key
    return out


def _held(store: Store, tenant: str, cids: list[str]) -> set[str]:
    """Those of ``cids`` archived or stored here (the dedup of :func:`_apply`, for many)."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return set()
    # One statement whatever the count (a list of `?` per count would keep a prepared
    # statement per run length in the connection's cache: ~4 MB more RSS, measured).
    rows = store.conn.execute(_HELD_SQL, (tid, json.dumps(cids), tid)).fetchall()
    return {str(cid) for (cid,) in rows}


_HELD_SQL: Final = (
    "WITH run(cid) AS (SELECT value FROM json_each(?2))"
    " SELECT cid FROM archive WHERE tenant=?1 AND cid IN run"
    " UNION ALL SELECT cid FROM messages WHERE tenant=?3 AND cid IN run"
)


def _append_to_run(dwn: MessageProcessor, appending: AppendingRun, entry: RunEntry) -> ReplicationApplyResult | None:
    message, data, cid = entry.message, entry.data, entry.cid
    known = entry.data_cid
    facts = datacid.known(data, known) if known is not None and type(data) is bytes else _NOTHING_KNOWN
    with memo.processing(message, cid) as held, facts:
        if entry.encoded is not None and held.encoded is None and held.cid == cid:
            held.encoded = entry.encoded
        # What _apply checks before placing a message, in its order.
        if _bad_data(message, data) is not None or dwn.validate_message_integrity(message) is not None:
            return None
        if not is_initial_write(message):
            return None
        answer = appending.append(message, data, cid, sort_key(message, cid))
    if answer is None:
        return None
    reply, (position, stream_id, epoch) = answer
    return Applied(ancestry_only=reply.code == 204, position=ProgressToken(stream_id, epoch, position, cid))


_NOTHING_KNOWN: Final = contextlib.nullcontext()


def apply_replicated_message_json(
    dwn: MessageProcessor, tenant: str, message: Any, data: bytes | None
) -> dict[str, Any]:
    """``apply_replicated_message`` with its result as JSON (the interop pipe's ``apply`` op)."""
    return apply_replicated_message(dwn, tenant, message, data).to_json()


def _tenant_active(dwn: MessageProcessor, tenant: str) -> bool:
    if dwn.validate_tenant(tenant) is not None:
        return False
    return dwn.store.is_tenant_active(tenant)


def error_code(detail: str) -> str | None:
    """The error code a reply detail starts with (the text before its first ``:``)."""
    colon = detail.find(":")
    return None if colon == -1 else detail[:colon]


# --------------------------------------------------------------------------- the verdict


class _Verdict:
    """Reads a replicated message's reply at its canonical place (the history's judge).

    Accepted: admitted. Refused because something it needs is missing here: dropped, the
    result names what to fetch. Refused because the message itself is bad (its structure,
    a signature, its data): dropped, ``Invalid``. Refused by the state at its place — a
    write after its record's delete, a second delete, a child of a deleted parent, an
    action the protocol or a revoked grant does not allow: kept in the archive, reported
    ``Superseded``; it stays out of the state unless a message that sorts before it changes
    that state.
    """

    __slots__ = ("store", "tenant", "message", "data", "cid", "dropped", "appends")

    def __init__(self, store: Store, tenant: str, message: Message, data: bytes | None, cid: str) -> None:
        self.store, self.tenant, self.message, self.data, self.cid = store, tenant, message, data, cid
        self.dropped: ReplicationApplyResult = Deferred("storage")
        self.appends = store.events.appends  # the log's appends before this message's processing

    def __call__(self, reply: Reply) -> Verdict:
        code, detail = reply.code, reply.detail
        if code in (202, 204):
            return Verdict.ADMIT
        err = error_code(detail)
        if code == 409 or err == NOT_ALLOWED_AFTER_DELETE:
            return Verdict.KEEP
        if err == RESOLVER_NOT_FOUND:
            return self._drop(Deferred("resolver-unavailable"))
        try:
            missing = dependency_refs(self.store, self.tenant, self.message, self.data, code, detail)
        except STAGE_ERRORS:
            missing = []  # what is missing cannot be told from this message
        missing = [ref for ref in missing if not _admitted_later(self.store, self.tenant, ref)]
        if missing:
            return self._drop(Incomplete(tuple(missing)))
        if code >= 500:
            return self._drop(Deferred("storage"))
        if err in NEVER_AUTHORIZED or _intrinsically_invalid(self.message, self.data):
            return self._drop(Invalid(detail or f"replicated message rejected with status {code}"))
        return Verdict.KEEP

    def _drop(self, result: ReplicationApplyResult) -> Verdict:
        self.dropped = result
        return Verdict.DROP

    def result(self, placement: Placement) -> ReplicationApplyResult:
        if placement.verdict is Verdict.DROP:
            return self.dropped
        if placement.stored and placement.reply.code in (202, 204):
            position = None
            if placement.warped == 0:
                # Processed once, where it sorts: its entry is the one that processing appended
                # (a warp may append and remove entries again; then it is looked up).
                appended = self.store.events.appended_since(self.appends, self.tenant, self.cid)
                if appended is not None:
                    position = ProgressToken(appended[1], appended[2], appended[0], self.cid)
            if position is None:
                position = _position(self.store, self.tenant, self.cid)
            return Applied(ancestry_only=placement.reply.code == 204, position=position)
        return Superseded()


def _admitted_later(store: Store, tenant: str, ref: DependencyRef) -> bool:
    """Whether the record ``ref`` names was admitted here, so that it was missing at the
    message's canonical place only because it sorts after it (or was gone by then): the
    refusal is the canonical one, and fetching would bring nothing new. A record has one
    initial write, so nothing earlier can come.

    A protocol with a definition admitted here that sorts after the message (a device whose
    clock ran behind wrote under a configure dated later): the refusal is canonical too. An
    earlier definition may exist elsewhere, but every source lists every definition it
    admitted, replaced ones included, and its arrival takes the message up again (it reads
    the protocol's definition). Fetching instead would bring the same later definitions and
    leave the message deferred for ever, its link never settled."""
    if isinstance(ref, Protocol):
        return _definition_accepted(store, tenant, ref.protocol)
    if isinstance(ref, InitialWrite | Parent | Ancestor):
        return archived_record(store, tenant, ref.record_id)
    if isinstance(ref, Grant):
        return archived_record(store, tenant, ref.permission_grant_id)
    if isinstance(ref, Role):
        # A role record admitted here that was not live at the message's place (it sorts
        # after it, or was deleted before it) is the canonical answer. Looked up in the
        # archive: at the message's place a warp has the later ones undone in the state (a
        # role record dated the same second as the chat that uses it, and sorting after it by
        # CID, left the chat deferred for ever: history full-56 of the order tests). An
        # earlier one still to come is a message of its own: its arrival takes the message up
        # again (it reads that recipient's role records).
        return _role_record_archived(store, tenant, ref)
    return False


def _definition_accepted(store: Store, tenant: str, protocol: str) -> bool:
    """Whether a definition of ``protocol`` was admitted here and accepted at its place."""
    tid = store.tenant_id(tenant, create=False)
    return tid is not None and store.conn.execute(
        "SELECT 1 FROM archive WHERE tenant=? AND record_id IS NULL AND accepted=1"
        " AND json_extract(body, '$.descriptor.definition.protocol')=? LIMIT 1", (tid, protocol)
    ).fetchone() is not None


def _role_record_archived(store: Store, tenant: str, ref: Role) -> bool:
    """Whether a write of a role record ``ref`` names — its protocol path and recipient, its
    context under ``ref.context_prefix`` — was admitted here and accepted at its place (the
    archive rows whose footprint changes that recipient's role records). One refused at its
    place does not count: a role record minted by someone the protocol does not let hand the
    role out is kept aside, and must not settle the message that needs a real one."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return False
    rows = store.conn.execute(
        "SELECT a.body FROM archive_keys k JOIN archive a ON a.id = k.row"
        " WHERE k.tenant=? AND k.key=? AND k.writes=1 AND a.accepted=1",
        (tid, f"role:{ref.protocol}:{ref.recipient}"),
    )
    for (body,) in rows:
        message = json.loads(str(body))
        d = message.get("descriptor", {})
        if d.get("method") != "Write" or d.get("protocolPath") != ref.protocol_path:
            continue
        context = message.get("contextId")
        if ref.context_prefix is None or (isinstance(context, str) and context.startswith(ref.context_prefix)):
            return True
    return False


def _intrinsically_invalid(message: Message, data: bytes | None) -> bool:
    """Whether the message fails a check no other message can change: its structure, its
    signatures, the data it came with."""
    d = message["descriptor"]
    try:
        kind = (d["interface"], d["method"])
        if kind == ("Records", "Write"):
            RecordsWrite.parse(message)
            if data is not None:
                _validate_supplied_data(message, data)
        elif kind == ("Records", "Delete"):
            parse_signed_records_message(message)
        elif kind == ("Protocols", "Configure"):
            ProtocolsConfigure.parse(message)
        authenticate(message.get("authorization"))
    except STAGE_ERRORS:
        return True
    return False


def _bad_data(message: Any, data: bytes | None) -> str | None:
    """Why the data a write came with is not its data (None when it is, or there is none)."""
    if data is None or not _is_records_write(message):
        return None
    try:
        _validate_supplied_data(message, data)
    except STAGE_ERRORS as exc:
        return str(exc)
    except (KeyError, TypeError, ValueError):
        return None  # not a well-formed write: the integrity check says why
    return None


def _kind(message: Message) -> str:
    d = message["descriptor"]
    return f"{d.get('interface')}{d.get('method')}"


# --------------------------------------------------------------------------- dedup


def _stored_cid(store: Store, tenant: str, message: Message, cid: str) -> str | None:
    """The CID the message is stored under here, or None when it is not stored."""
    if store.messages.has(tenant, cid):
        return cid
    # A 0-byte record is stored with `encodedData: ""`, which stays inside the CID it is stored
    # under (the reference does the same); it is still this very message.
    if _is_records_write(message) and message["descriptor"].get("dataSize") == 0 and "encodedData" not in message:
        alternative = message_cid({**message, "encodedData": ""})
        if store.messages.has(tenant, alternative):
            return alternative
    return None


def _repair_log_entry(store: Store, tenant: str, message: Message, cid: str) -> None:
    """A stored message must have its event-log entry; restore one that went missing."""
    stored = _stored_cid(store, tenant, message, cid)
    if stored is None:
        return  # archived, not held: superseded in canonical order, no entry
    indexes = store.messages.get_indexes(tenant, stored)
    if indexes is not None:
        # The log lists a message under the CID of the message as sent (see the handlers).
        _, appended = store.events.ensure_entry(tenant, cid, indexes)
        if appended:
            log.info("repaired the missing event-log entry of %s for %s", cid, tenant)


def _validate_supplied_data(message: Message, data: bytes) -> None:
    descriptor = message["descriptor"]
    actual = compute_data_cid(data)
    if actual != descriptor["dataCid"]:
        raise DwnError(
            DATA_CID_MISMATCH,
            f"actual data CID {actual} does not match dataCid in descriptor: {descriptor['dataCid']}",
        )
    if len(data) != descriptor["dataSize"]:
        raise DwnError(
            DATA_SIZE_MISMATCH,
            f"actual data size {len(data)} bytes does not match dataSize in descriptor: {descriptor['dataSize']}",
        )
    if (
        descriptor["dataSize"] <= MAX_DATA_SIZE_ENCODED
        and descriptor.get("protocol") == permissions.PERMISSIONS_PROTOCOL_URI
    ):
        permissions.validate_schema(message, data)


# --------------------------------------------------------------------------- adapt


def _position(store: Store, tenant: str, cid: str) -> ProgressToken | None:
    position = store.events.position_of(tenant, cid)
    if position is None:
        return None
    stream_id, epoch = store.events.stream(tenant)
    return ProgressToken(stream_id, epoch, position, cid)


def dependency_refs(
    store: Store, tenant: str, message: Message, data: bytes | None, code: int, detail: str
) -> list[DependencyRef]:
    """What is missing for a refused message, from the refusal and the store; [] for nothing."""
    err = error_code(detail)
    descriptor = message.get("descriptor") if isinstance(message, dict) else None
    if not isinstance(descriptor, dict):
        return []
    protocol = _str(descriptor.get("protocol"))
    if err in (PROTOCOL_NOT_FOUND, COMPOSED_PROTOCOL_NOT_INSTALLED):
        missing_protocol = _protocol_from_detail(detail) or protocol or _str(_filter(descriptor).get("protocol"))
        return [] if missing_protocol is None else [Protocol(protocol=missing_protocol)]
    if err in (INCORRECT_PROTOCOL_PATH, PARENT_RECORD_NOT_FOUND):
        return _parent_refs(store, tenant, message)
    if err == PARENT_NOT_FOUND_CONSTRUCTING_CHAIN:
        return _ancestor_refs(store, tenant, message, detail)
    if err == INITIAL_WRITE_NOT_FOUND and _is_records_write(message):
        return [InitialWrite(record_id=message["recordId"], protocol=protocol)]
    if err == ACTION_NOT_ALLOWED and _is_records_write(message) and not is_initial_write(message):
        if fetch_initial_records_write_message(store, tenant, message["recordId"]) is None:
            return [InitialWrite(record_id=message["recordId"], protocol=protocol)]
        return []
    if err == GRANT_MISSING:
        return _grant_refs(store, tenant, message)
    if err == ROLE_RECORD_NOT_FOUND:
        return _role_refs(store, tenant, message)
    if err in (MISSING_DATA_IN_PREVIOUS, MISSING_ENCODED_DATA_IN_PREVIOUS):
        return _record_data_refs(message)
    if err in (DATA_CID_MISMATCH, DATA_SIZE_MISMATCH) and data is None:
        # Only an update sent without its data compares against a previous write's data.
        return _record_data_refs(message)
    if code == 404 and _is_records_delete(message):
        record_id = descriptor["recordId"]
        # 404 also answers a delete of a record already deleted here: nothing is missing then.
        if fetch_initial_records_write_message(store, tenant, record_id) is None:
            return [InitialWrite(record_id=record_id)]
    return []


def _parent_refs(store: Store, tenant: str, message: Message) -> list[DependencyRef]:
    """Parent (and every absent ancestor above it) of a child whose parent is not live here."""
    if not _is_records_write(message):
        return []
    descriptor = message["descriptor"]
    parent_id, protocol = _str(descriptor.get("parentId")), _str(descriptor.get("protocol"))
    if parent_id is None or protocol is None:
        return []
    # A parent that is live here makes the refusal a wrong path or context; a deleted one
    # takes no children. Either way nothing is missing.
    if _record_state(store, tenant, parent_id) not in (_ABSENT, _INCOMPLETE):
        return []
    above: list[DependencyRef] = []
    context_id = _str(message.get("contextId"))
    if context_id is not None:
        chain = context_id.split("/")[:-1]
        if parent_id in chain:
            for record_id in chain[: chain.index(parent_id)]:
                if _record_state(store, tenant, record_id) in (_ABSENT, _INCOMPLETE):
                    above.append(Ancestor(record_id=record_id, protocol=protocol))
    return [*above, Parent(record_id=parent_id, protocol=protocol)]


def _ancestor_refs(store: Store, tenant: str, message: Message, detail: str) -> list[DependencyRef]:
    """Every ancestor absent while building the record chain, root first, the named one last."""
    match = _ANCESTOR_IN_DETAIL.search(detail)
    if match is None:
        return []
    named = match.group(1)
    context_id, protocol = _record_context(store, tenant, message)
    ids: list[str] = [named]
    if context_id is not None:
        chain = context_id.split("/")[:-1]
        if named in chain:
            # Chain building walks up from the record, so everything below `named` was found.
            ids = [
                rid
                for rid in chain[: chain.index(named)]
                if fetch_initial_records_write_message(store, tenant, rid) is None
            ]
            ids.append(named)
    return [Ancestor(record_id=rid, protocol=protocol) for rid in ids]


def _grant_refs(store: Store, tenant: str, message: Message) -> list[DependencyRef]:
    grant_id = _str(message["descriptor"].get("permissionGrantId"))
    if grant_id is None:
        grant_id = _str(signature_payload(message).get("permissionGrantId"))
    if grant_id is None or _record_state(store, tenant, grant_id) not in (_ABSENT, _INCOMPLETE):
        return []
    return [Grant(permission_grant_id=grant_id)]


def _role_refs(store: Store, tenant: str, message: Message) -> list[DependencyRef]:
    role = _str(signature_payload(message).get("protocolRole"))
    recipient = get_author(message)
    context_id, protocol = _record_context(store, tenant, message)
    flt = _filter(message["descriptor"])
    if protocol is None:
        protocol = _str(flt.get("protocol"))
    if context_id is None:
        context_id = _str(flt.get("contextId"))
    if role is None or recipient is None or protocol is None:
        return []
    # A context role (`thread/participant`) is held within the first segments of the context.
    depth = len(role.split("/")) - 1
    prefix = "/".join(context_id.split("/")[:depth]) if depth > 0 and context_id is not None else None
    return [Role(protocol=protocol, protocol_path=role, recipient=recipient, context_prefix=prefix or None)]


def _record_data_refs(message: Message) -> list[DependencyRef]:
    if not _is_records_write(message):
        return []
    descriptor = message["descriptor"]
    data_cid = _str(descriptor.get("dataCid"))
    if data_cid is None:
        return []
    return [RecordData(record_id=message["recordId"], data_cid=data_cid, protocol=_str(descriptor.get("protocol")))]


# --------------------------------------------------------------------------- store probes


def _record_state(store: Store, tenant: str, record_id: str) -> str:
    messages, _ = store.messages.query(tenant, [{"interface": "Records", "recordId": record_id}])
    newest = get_newest_message(messages)
    if newest is None:
        return _ABSENT
    if newest["descriptor"].get("method") == "Delete":
        return _DELETED
    live = store.messages.query(
        tenant, [{"interface": "Records", "method": "Write", "recordId": record_id, "isLatestBaseState": True}]
    )[0]
    return _LIVE if live else _INCOMPLETE


def _record_context(store: Store, tenant: str, message: Message) -> tuple[str | None, str | None]:
    """(contextId, protocol) of the record a Records message is about."""
    descriptor = message["descriptor"]
    if _is_records_write(message):
        return _str(message.get("contextId")), _str(descriptor.get("protocol"))
    record_id = _str(descriptor.get("recordId"))
    if record_id is not None:
        # A delete carries neither: its record's initial write (here, or it would be a 404) does.
        initial = fetch_initial_records_write_message(store, tenant, record_id)
        if initial is not None:
            return _str(initial.get("contextId")), _str(initial["descriptor"].get("protocol"))
    return None, None


# --------------------------------------------------------------------------- small helpers


def _is_records_write(message: Any) -> bool:
    d = message.get("descriptor") if isinstance(message, dict) else None
    return (
        isinstance(d, dict)
        and d.get("interface") == "Records"
        and d.get("method") == "Write"
        and isinstance(message.get("recordId"), str)
    )


def _is_records_delete(message: Any) -> bool:
    d = message.get("descriptor") if isinstance(message, dict) else None
    return (
        isinstance(d, dict)
        and d.get("interface") == "Records"
        and d.get("method") == "Delete"
        and isinstance(d.get("recordId"), str)
    )


def _filter(descriptor: dict[str, Any]) -> dict[str, Any]:
    flt = descriptor.get("filter")
    return flt if isinstance(flt, dict) else {}


def _protocol_from_detail(detail: str) -> str | None:
    match = _COMPOSED_PROTOCOL_IN_DETAIL.search(detail) or _PROTOCOL_IN_DETAIL.search(detail)
    if match is None or match.group(1) == "undefined":
        return None
    return match.group(1)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
