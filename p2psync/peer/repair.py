"""Fetch named messages from a peer: one replica's part of a reconcile repair plan.

``p2psync pipeline reconcile`` says which message CIDs a replica lacks and which replica holds
each (docs/pipeline.md). :func:`fetch_messages` (``Peer.fetch_messages``) carries that out
against one peer over the ordinary replication profiles — nothing new on the wire:

1. ``hello``, then ``getCollections`` for the tenant (global scope by default);
2. the CIDs the store does not hold yet are asked for in batches of up to 128 refs with
   ``getDependencies``, each ref carrying ``messageCid`` (§10: answered with exactly that
   message, data inline or by ``getAttachment``, §9.1);
3. every answer is admitted by :meth:`Sink.admit`, the closure loop of a pull: missing
   dependencies are fetched from the same peer, data is checked against ``dataSize`` and
   ``dataCid`` before anything is stored, and the engine refuses what does not verify.

Each CID ends with one :class:`MessageOutcome`: ``applied``, ``present`` (held before the
request), ``superseded`` (the engine keeps a newer state), ``not_found`` (the peer has no such
message), ``withheld`` (the peer may not show it to us: ``403`` or ``"withheld": true``),
``refused`` (did not verify, with the code) or ``deferred`` (its closure could not be
completed now, e.g. a dependency the peer does not hold).

The collection uses a **one-off checkpointId** (``repair-<random hex>``) and no ledger link: a
repair fetches by CID, outside any log order, so it has no frontier to keep. It never calls
``setCheckpoint``, so the passive stores no copy for it, and it can never be confused with (or
displace) the copy of a sync of the same collection, which resumes where it was; that sync's
next listing answers the repaired messages ``304``.
"""

from __future__ import annotations

import re
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, TypeAlias

from p2psync import blip
from p2psync.dwn.replication_types import DependencyRef, InitialWrite, Invalid
from p2psync.dwn.replication_types import Protocol as ProtocolRef
from p2psync.dwn.store import Store
from p2psync.peer.session import PeerSession
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.scope import SyncScope
from p2psync.replication.stats import SyncStats
from p2psync.replication.wire import MAX_REFS, PeerError

__all__ = [
    "CHECKPOINT_ID_PREFIX",
    "REPAIRED",
    "MessageOutcome",
    "RepairProgress",
    "RepairStatus",
    "RepairSummary",
    "WantedMessage",
    "fetch_messages",
    "one_off_collection",
]

RepairStatus: TypeAlias = Literal["applied", "present", "superseded", "not_found", "withheld", "refused", "deferred"]
#: Outcomes after which the replica holds what the plan asked for (or something newer).
REPAIRED: Final = frozenset({"applied", "present", "superseded"})
#: Order of statuses in summaries.
STATUS_ORDER: Final = ("applied", "present", "superseded", "not_found", "withheld", "refused", "deferred")
#: Prefix of a repair's one-off checkpointId (see the module doc).
CHECKPOINT_ID_PREFIX: Final = "repair-"
#: Random bytes in that id: 128 bits, so two repairs never share one.
_CHECKPOINT_ID_BYTES: Final = 16
# A DwnError code at the start of an Invalid reason ("RecordsWriteSignatureInvalid: ...").
_CODE_RE: Final = re.compile(r"([A-Z][A-Za-z0-9]+):")

Connector = Callable[[dict[str, Any]], AbstractAsyncContextManager[blip.Connection]]


@dataclass(frozen=True)
class WantedMessage:
    """A message to fetch by CID, with what a plan row says about it (all optional).

    The extra members only choose the ref type that describes the message on the wire; the
    ``messageCid`` decides what is answered.
    """

    cid: str
    interface: str | None = None
    method: str | None = None
    record_id: str | None = None
    protocol: str | None = None

    @classmethod
    def of(cls, item: Any) -> WantedMessage:
        """From a CID string, a WantedMessage, or any object with ``message_cid`` and optionally
        ``interface``, ``method``, ``record_id``, ``protocol`` (a plan's ``RepairItem``)."""
        if isinstance(item, WantedMessage):
            return item
        if isinstance(item, str):
            return cls(item)
        return cls(
            str(item.message_cid),
            interface=getattr(item, "interface", None),
            method=getattr(item, "method", None),
            record_id=getattr(item, "record_id", None),
            protocol=getattr(item, "protocol", None),
        )

    def ref(self) -> DependencyRef:
        """The ref asking for exactly this message: ``Protocol`` for a ProtocolsConfigure,
        ``InitialWrite`` (the record, by recordId) for a Records message. Without the row's
        details, an ``InitialWrite`` naming the CID as its recordId: valid, and a source that
        honours ``messageCid`` (§10) answers it the same."""
        if self.interface == "Protocols" and self.protocol:
            return ProtocolRef(protocol=self.protocol, message_cid=self.cid)
        if self.interface == "Records" and self.record_id:
            return InitialWrite(record_id=self.record_id, protocol=self.protocol or None, message_cid=self.cid)
        return InitialWrite(record_id=self.cid, message_cid=self.cid)


@dataclass(frozen=True)
class MessageOutcome:
    """What became of one wanted CID (``code``/``detail`` say why for the unrepaired ones)."""

    cid: str
    status: RepairStatus
    code: str | None = None
    detail: str | None = None
    dependencies: tuple[str, ...] = ()  # CIDs stored with it: its closure's new messages

    @property
    def repaired(self) -> bool:
        return self.status in REPAIRED

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messageCid": self.cid, "status": self.status}
        if self.code is not None:
            out["code"] = self.code
        if self.detail is not None:
            out["detail"] = self.detail
        if self.dependencies:
            out["dependencies"] = list(self.dependencies)
        return out


@dataclass(frozen=True)
class RepairProgress:
    """A progress report after each CID (for a progress bar)."""

    done: int
    total: int
    applied: int  # messages stored so far, dependencies included
    bytes: int  # received so far


@dataclass
class RepairSummary:
    """What one :func:`fetch_messages` did, per CID and in total."""

    tenant: str
    remote: str
    outcomes: list[MessageOutcome] = field(default_factory=list)
    stats: SyncStats = field(default_factory=SyncStats)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every wanted CID is repaired (applied, present or superseded)."""
        return all(o.repaired for o in self.outcomes)

    @property
    def stored(self) -> int:
        """Distinct messages this repair stored, dependencies included."""
        stored = {o.cid for o in self.outcomes if o.status == "applied"}
        for o in self.outcomes:
            stored.update(o.dependencies)
        return len(stored)

    def counts(self) -> dict[str, int]:
        """Outcomes per status, in :data:`STATUS_ORDER` (statuses with none left out)."""
        counter = Counter(o.status for o in self.outcomes)
        return {s: counter[s] for s in STATUS_ORDER if counter[s]}

    def reasons(self) -> dict[str, int]:
        """The unrepaired CIDs counted by ``status`` or ``status code`` (for an exit message)."""
        counter = Counter(o.status if o.code is None else f"{o.status} {o.code}" for o in self.outcomes
                          if not o.repaired)
        return dict(sorted(counter.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "remote": self.remote,
            "seconds": round(self.seconds, 3),
            "requested": len(self.outcomes),
            "ok": self.ok,
            "counts": self.counts(),
            "reasons": self.reasons(),
            "stored": self.stored,
            "dependenciesFetched": self.stats.dependencies_fetched,
            "attachmentsFetched": self.stats.attachments_fetched,
            "bytesReceived": self.stats.bytes_received,
            "messages": [o.to_json() for o in self.outcomes],
        }


def one_off_checkpoint_id() -> str:
    """A checkpointId no sync uses and no other repair shares (see the module doc)."""
    return CHECKPOINT_ID_PREFIX + secrets.token_hex(_CHECKPOINT_ID_BYTES)


def _dedupe(items: Iterable[Any]) -> list[WantedMessage]:
    seen: dict[str, WantedMessage] = {}
    for item in items:
        wanted = WantedMessage.of(item)
        if not wanted.cid:
            raise ValueError("a wanted message CID must be a non-empty string")
        seen.setdefault(wanted.cid, wanted)
    return list(seen.values())


def _invalid_code(reason: str) -> str:
    """The DwnError code an Invalid result's reason starts with, else ``Invalid``."""
    match = _CODE_RE.match(reason)
    return match[1] if match else "Invalid"


class RepairingPeer(Protocol):
    """What a repair needs of the peer (:class:`~p2psync.peer.peer.Peer` is one)."""

    store: Store

    def handlers(self, *, active: bool) -> dict[str, Any]: ...

    def session_for(self, conn: blip.Connection, active: bool) -> PeerSession: ...


async def fetch_messages(
    peer: RepairingPeer,
    connect: Connector,
    *,
    tenant: str,
    cids: Iterable[Any],
    scope: SyncScope | None = None,
    on_progress: Callable[[RepairProgress], None] | None = None,
    batch: int = MAX_REFS,
) -> RepairSummary:
    """Fetch ``cids`` (strings, :class:`WantedMessage` objects or plan rows) of ``tenant`` from the
    peer ``connect`` reaches, admitting each through the closure loop (see the module doc).

    Raises :class:`PeerError` when the peer refuses the collection, ``HelloFailed`` for a
    failed hello, ``OSError``/``blip.ConnectionClosed`` when the connection fails; what was
    applied before a failure stays applied (and a second run reports it ``present``).
    """
    if not 1 <= batch <= MAX_REFS:
        raise ValueError(f"batch must be 1 to {MAX_REFS} (§10)")
    wanted = _dedupe(cids)
    scope = scope or SyncScope.global_scope()
    started = time.monotonic()
    async with one_off_collection(peer, connect, tenant, scope) as (session, index, remote):
        summary = RepairSummary(tenant, remote)
        session.proto.repair_sink(index).stats = summary.stats
        await _Repair(peer.store, session, index, tenant, summary, len(wanted), on_progress).run(wanted, batch)
    summary.seconds = time.monotonic() - started
    return summary


@asynccontextmanager
async def one_off_collection(
    peer: RepairingPeer, connect: Connector, tenant: str, scope: SyncScope
) -> AsyncIterator[tuple[PeerSession, int, str]]:
    """A connection with hello done and ``tenant``'s collection in ``scope`` open under a
    one-off checkpointId (module doc): ``(session, collection index, remote DID URL)``; the
    connection closes when the block ends."""
    async with connect(peer.handlers(active=True)) as conn:
        session = peer.session_for(conn, active=True)
        await session.hello()
        assert session.theirs is not None
        remote = f"{session.theirs.did}?storeId={session.theirs.store_id}"
        index, _ = await session.run(session.proto.open_collection(tenant, scope, one_off_checkpoint_id()))
        yield session, index, remote
        await conn.aclose()


class _Repair:
    """The per-CID loop of one :func:`fetch_messages` over an open collection."""

    def __init__(
        self, store: Store, session: PeerSession, index: int, tenant: str, summary: RepairSummary, total: int,
        on_progress: Callable[[RepairProgress], None] | None,
    ) -> None:
        self.store = store
        self.session = session
        self.index = index
        self.tenant = tenant
        self.stats = summary.stats
        self.summary = summary
        self.total = total
        self.on_progress = on_progress
        self.stored_here: set[str] = set()  # CIDs this run applied (roots and dependencies)
        self.forbidden: PeerError | None = None

    def _record(self, outcome: MessageOutcome) -> None:
        self.summary.outcomes.append(outcome)
        self.stored_here.update(outcome.dependencies)
        if outcome.status == "applied":
            self.stored_here.add(outcome.cid)
        if self.on_progress is not None:
            self.on_progress(RepairProgress(len(self.summary.outcomes), self.total, self.summary.stored,
                                            self.summary.stats.bytes_received))

    def _held(self, cid: str) -> MessageOutcome | None:
        """An outcome without asking when the store holds ``cid`` already."""
        if not self.store.messages.has(self.tenant, cid):
            return None
        # Held because an earlier message of this run brought it as a dependency: applied.
        return MessageOutcome(cid, "applied" if cid in self.stored_here else "present")

    async def run(self, wanted: Sequence[WantedMessage], batch: int) -> None:
        for start in range(0, len(wanted), batch):
            todo: list[WantedMessage] = []
            for w in wanted[start : start + batch]:
                held = self._held(w.cid)
                if held is not None:
                    self._record(held)
                elif self.forbidden is not None:
                    self._record(MessageOutcome(w.cid, "withheld", self.forbidden.name, self.forbidden.detail))
                else:
                    todo.append(w)
            if not todo:
                continue
            try:
                answers = await self._request(todo)
            except PeerError as exc:
                if exc.code != 403:
                    raise
                # Not an authorized reader at all (§5): every later request would say the same.
                self.forbidden = exc
                for w in todo:
                    self._record(MessageOutcome(w.cid, "withheld", exc.name, exc.detail))
                continue
            for w, answer in zip(todo, answers, strict=True):
                self._record(await self._admit(w, answer))
        # Held ones were recorded before their batch was asked for: report in the asked order.
        order = {w.cid: i for i, w in enumerate(wanted)}
        self.summary.outcomes.sort(key=lambda o: order[o.cid])

    async def _request(self, todo: Sequence[WantedMessage]) -> list[Any]:
        answers: list[Any] = await self.session.run(
            self.session.proto.get_dependencies(self.index, [w.ref() for w in todo])
        )
        return answers

    async def _admit(self, wanted: WantedMessage, answer: Any) -> MessageOutcome:
        cid = wanted.cid
        raw = answer.get("entries") if isinstance(answer, dict) else None
        items = raw if isinstance(raw, list) else []
        # §10: a messageCid ref takes exactly that message; anything else is not an answer.
        matching = [i for i in items if isinstance(i, dict) and isinstance(i.get("message"), dict)
                    and ReplicationEntry(i["message"]).cid == cid]
        if not matching:
            if isinstance(answer, dict) and answer.get("withheld") is True:
                return MessageOutcome(cid, "withheld", "ReadNotAllowed", "the peer holds it but may not show it to us")
            if items:
                return MessageOutcome(cid, "refused", "AnswerMismatch", "the peer answered with other messages")
            return MessageOutcome(cid, "not_found", "MessageNotFound", "the peer does not hold it")
        held = self._held(cid)  # an earlier answer's closure may have brought it meanwhile
        if held is not None:
            return held
        try:
            # Data fetched and checked, the closure admitted, the commit durable.
            _, result, outcome = await self.session.run(self.session.proto.admit(self.index, matching[0]))
        except PeerError as exc:
            if exc.name == "StoreUnavailable":
                raise
            return MessageOutcome(cid, "refused", exc.name, exc.detail)
        self.stats.revs_received += 1
        self.stats.results[result.kind] = self.stats.results.get(result.kind, 0) + 1
        dependencies = tuple(c for c in outcome.applied if c != cid)
        kind = result.kind
        if kind == "Applied":
            self.stats.revs_applied += 1
            return MessageOutcome(cid, "applied", dependencies=dependencies)
        if kind == "Duplicate":
            return MessageOutcome(cid, "applied" if cid in self.stored_here else "present", dependencies=dependencies)
        if kind == "Superseded":
            return MessageOutcome(cid, "superseded", dependencies=dependencies)
        if isinstance(result, Invalid):
            return MessageOutcome(cid, "refused", _invalid_code(result.reason), result.reason or None, dependencies)
        if outcome.status == "failed":
            # The root is fine as far as it goes, but a dependency is invalid or unreachable.
            code = outcome.code or ("DependencyInvalid" if outcome.failure == "invalid" else "DependencyUnreachable")
            return MessageOutcome(cid, "refused", code, outcome.detail, dependencies)
        # Incomplete: a dependency the peer could not give (named by its closure code);
        # Deferred: not now (storage, ...).
        code = outcome.code or ("DependencyUnresolved" if kind == "Incomplete" else "Deferred")
        return MessageOutcome(cid, "deferred", code, outcome.detail or result.to_json().get("reason"), dependencies)
