"""What the sans-I/O replication protocol asks of the world, and what it gives back.

:class:`~p2psync.replication.protocol.ReplicationProtocol` runs each profile exchange as a
small generator (an *operation*). An operation ``yield``s an effect and is resumed with its
answer:

- :class:`Call` — a BLIP request to the other peer; resumed with a :class:`Response`, or with
  the :class:`~p2psync.replication.wire.PeerError` the other peer answered;
- :class:`Notify` — a request with no reply (``norev``); resumed at once;
- a :class:`StoreRequest` — a read or write of the local store, carried out by the driver;
  resumed with its result or its exception;
- a :class:`Signal` — park until something in the protocol changes (a `rev`'s turn, freed
  budget, hello done);
- :data:`YIELD` — let the other runnable operations go first.

The protocol turns the effects it cannot answer itself into :data:`Output` items for its
driver (p2psync/peer for trio and BLIP; a plain loop in a test): requests and replies to
send, store requests to carry out, a close, an operation that finished. Nothing here reads a
clock, a socket or a database.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from p2psync.dwn.progress import ProgressToken
from p2psync.dwn.replication_types import DependencyRef
from p2psync.replication.scope import RoleRecordsRef, SyncScope
from p2psync.replication.wire import PeerError

__all__ = [
    "LogDomain",
    "RecordSuccess",
    "Transition",
    "ResetCheckpoint",
    "RewindCheckpoint",
    "ReadCheckpoint",
    "OpenLink",
    "YIELD",
    "AnswerReconcile",
    "LocalCids",
    "LocalDefinitions",
    "LocalSetView",
    "AnswerRefs",
    "Apply",
    "ApplyBatch",
    "ApplyGrant",
    "AwaitClaim",
    "ClaimMessages",
    "ReleaseClaims",
    "Authorize",
    "Call",
    "CloseConnection",
    "Collection",
    "ConnectionLost",
    "Durable",
    "Effect",
    "FlushCommits",
    "HeldMessages",
    "Notify",
    "OpenFeed",
    "Operation",
    "OperationFinished",
    "Output",
    "PageRow",
    "QuotaFit",
    "ReadCopy",
    "ReadDecision",
    "ReadOffered",
    "ReadPage",
    "RecordSteps",
    "Response",
    "SendError",
    "SendReply",
    "SendRequest",
    "Signal",
    "Slots",
    "StillValid",
    "StoreCall",
    "StoreRequest",
    "VerifyAhead",
    "WaitForLog",
    "WriteCopy",
]


class ConnectionLost(PeerError):
    """The connection ended while an operation waited on the other peer."""

    def __init__(self, detail: str = "closed") -> None:
        super().__init__(503, "ConnectionLost", detail)


# --------------------------------------------------------------------------- effects


@dataclass(slots=True)
class Call:
    """A request to the other peer. ``max_reply``: a reply body longer than this is refused
    (``424 AttachmentInvalid``) and the connection closed, read as it streams (§9.1)."""

    profile: str
    properties: dict[str, str]
    body: bytes = b""
    urgent: bool = False
    compress: bool = False
    max_reply: int | None = None


@dataclass(slots=True)
class Notify:
    """A request with no reply (``norev``)."""

    profile: str
    properties: dict[str, str]
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Response:
    """The other peer's reply to a :class:`Call`."""

    properties: dict[str, str]
    body: bytes


class _Yield:
    __slots__ = ()


#: Let every other runnable operation run before this one goes on.
YIELD: Final = _Yield()


class Signal:
    """A condition operations park on (``yield signal``) until :meth:`fire` wakes them all."""

    __slots__ = ("_ready", "_waiters")

    def __init__(self, ready: deque[Any]) -> None:
        self._ready = ready
        self._waiters: list[Any] = []

    def park(self, task: Any) -> None:
        self._waiters.append(task)

    def fire(self) -> None:
        if self._waiters:
            for task in self._waiters:
                self._ready.append((task, None, None))
            self._waiters = []


# --------------------------------------------------------------------------- store requests


class StoreRequest:
    """A request the driver carries out against the local store (the subclasses below).

    ``durable``: the driver answers only after a durable commit (it awaits the group commit);
    the others are answered synchronously."""

    __slots__ = ()
    durable: bool = False


@dataclass(frozen=True, slots=True)
class ReadCopy(StoreRequest):
    """The passive's copy of a checkpoint pair: ``(pair, rev)`` or None (§4.2)."""

    peer_did: str
    checkpoint_id: str


@dataclass(frozen=True, slots=True)
class WriteCopy(StoreRequest):
    """Store a checkpoint pair under MVCC ``rev``; answers the new rev once durable (§4.3).
    Raises the store's rev conflict, an invalid pair, or a failed commit."""

    peer_did: str
    checkpoint_id: str
    pair: dict[str, Any]
    rev: str | None
    durable = True


@dataclass(frozen=True, slots=True)
class ApplyGrant(StoreRequest):
    """Apply a grant the active brought in ``getCollections`` (§4.1), durably."""

    tenant: str
    message: dict[str, Any]
    data: bytes | None
    durable = True


@dataclass(frozen=True, slots=True)
class Authorize(StoreRequest):
    """May ``reader`` read ``tenant`` within ``scope``? Answers a :class:`ReadDecision` (§5)."""

    tenant: str
    reader: str
    scope: SyncScope


@dataclass(frozen=True, slots=True)
class StillValid(StoreRequest):
    """Is the grant behind ``decision`` still in force (a feed re-checks it on every pass)?"""

    tenant: str
    decision: ReadDecision


@dataclass(frozen=True, slots=True)
class OpenFeed(StoreRequest):
    """Open a pull feed of ``tenant``'s log: answers ``(gap, latest)`` — the ProgressGap when
    ``since`` cannot be served here (else None) and the newest token (None: no log)."""

    tenant: str
    since: ProgressToken | None


@dataclass(frozen=True, slots=True)
class PageRow:
    """One log entry of a :class:`ReadPage`: ``kind`` is ``listed``, ``echo`` (it came from the
    sink's store) or ``out_of_scope``; ``entry`` is None when the message left the log."""

    token: ProgressToken
    kind: str
    entry: Any = None
    size: int | None = None
    readable: bool = True


@dataclass(frozen=True, slots=True)
class ReadPage(StoreRequest):
    """Up to ``limit`` entries of ``tenant``'s log after ``after``, classified (a list of
    :class:`PageRow`). Echoes are entries that came from ``suppress_origin``'s store, above
    position ``replay_until``; ``readable`` says whether ``decision``'s reader may read each."""

    tenant: str
    after: int
    limit: int
    scope: SyncScope
    decision: ReadDecision
    suppress_origin: str | None = None
    replay_until: int = -1


@dataclass(frozen=True, slots=True)
class AnswerRefs(StoreRequest):
    """Answer dependency refs from the local store for ``decision``'s reader: one
    ``(entries, withheld, next)`` per ref, at most ``limit`` entries each (§10); ``next`` is the
    continuation of a ``RoleRecords`` ref's page (§10.2), None for any other ref."""

    tenant: str
    refs: tuple[DependencyRef | RoleRecordsRef, ...]
    decision: ReadDecision
    limit: int


@dataclass(frozen=True, slots=True)
class AnswerReconcile(StoreRequest):
    """Answer one ``reconcile`` request body over ``tenant``'s messages in ``scope``
    (protocol/anti-entropy.md): the reply body, or a ``PeerError``. ``resolve`` requests
    (``r``: ids to CIDs) are answered here too."""

    tenant: str
    scope: SyncScope
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LocalSetView(StoreRequest):
    """This store's set of ``tenant``'s messages in ``scope`` for reconciling under ``coder``
    (a :class:`~p2psync.replication.recon.SetView`), and the tenant's log head token (wire
    form, None for an empty log) read at the same committed state."""

    tenant: str
    scope: SyncScope
    coder: Any = None


@dataclass(frozen=True, slots=True)
class LocalDefinitions(StoreRequest):
    """What a reconciled set leaves out (it holds stored messages): ``(protocols, replaced)``,
    the protocols this store holds a definition of in ``scope``, and the CIDs of the
    definitions in ``scope`` that a newer one replaced here (listed in the log, not stored;
    protocol/replication-apply.md, *Superseded definitions travel*)."""

    tenant: str
    scope: SyncScope


@dataclass(frozen=True, slots=True)
class LocalCids(StoreRequest):
    """The CIDs this store holds under the short ``ids`` of ``coder``."""

    tenant: str
    scope: SyncScope
    coder: Any
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReadOffered(StoreRequest):
    """The data of an offered message (§9): bytes, or None when it left the store."""

    tenant: str
    record_id: str
    data_cid: str
    message_cid: str


@dataclass(frozen=True, slots=True)
class HeldMessages(StoreRequest):
    """Which of these message CIDs the store holds (a set). ``with_data``: those the peer
    offers with data; one admitted here without its data is not held (it should come again
    with it)."""

    tenant: str
    cids: tuple[str, ...]
    with_data: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimMessages(StoreRequest):
    """Claim these wanted message CIDs for ``claimant`` (a sink) in the store's
    :class:`~p2psync.replication.inflight.InFlightClaims`; answers those another sink of this
    store is receiving already, each with that claim's serial (issue #17)."""

    tenant: str
    cids: tuple[str, ...]
    claimant: object


@dataclass(frozen=True, slots=True)
class ReleaseClaims(StoreRequest):
    """``claimant``'s claims on these CIDs end; ``held``: its apply of them is durable."""

    tenant: str
    cids: tuple[str, ...]
    claimant: object
    held: bool


@dataclass(frozen=True, slots=True)
class AwaitClaim(StoreRequest):
    """Until another sink's claim on ``cid`` numbered ``serial`` (None: the current one) ends;
    answers whether the store durably holds it."""

    tenant: str
    cid: str
    serial: int | None = None
    durable = True


@dataclass(frozen=True, slots=True)
class Apply(StoreRequest):
    """Apply one replicated message inside the open group commit; answers ``(result,
    ticket)`` — pass the ticket to :class:`Durable`. ``origin``: the store it came from.
    ``payer``: the DID whose push budget what it stores is charged to (None: nobody; this
    peer pulled it, or the pusher may read the tenant). Raises
    :class:`~p2psync.errors.QuotaExceeded`, with nothing written, when it would take the
    tenant past its quota or the payer past its budget (issue #15)."""

    tenant: str
    entry: Any
    origin: str | None
    payer: str | None = None


@dataclass(frozen=True, slots=True)
class ApplyBatch(StoreRequest):
    """Apply several replicated messages in order inside the open group commit, each exactly as
    its own :class:`Apply` would be (origin, payer, quotas), in one store request: a `revs`
    (§8.4) costs one request, not one per message (issue #17). It stops after the first entry
    whose result is ``Incomplete`` (its closure must run before the next is applied) or whose
    apply raised. Answers ``(done, error)``: the ``(result, ticket)`` of each entry applied,
    in order, and the exception that stopped it (None when none did)."""

    tenant: str
    entries: tuple[Any, ...]
    origin: str | None
    payer: str | None = None


@dataclass(frozen=True, slots=True)
class VerifyAhead(StoreRequest):
    """Messages received and about to be applied: the driver may verify their signatures on
    another core meanwhile (issue #17; p2psync/dwn/ahead.py). Nobody waits for it, and it
    decides nothing: the engine still verifies whatever was not found valid ahead."""

    messages: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class QuotaFit(StoreRequest):
    """How many of a listing's items (their data sizes, in order; None: no data) the store's
    quotas take for ``tenant`` (charged to ``payer``, as for :class:`Apply`): ``(count,
    refusal)``, the refusal (a :class:`~p2psync.errors.QuotaExceeded`) None when all fit."""

    tenant: str
    payer: str | None
    sizes: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class Durable(StoreRequest):
    """Until the commit that holds ``ticket``'s writes is durable (raises when it failed)."""

    ticket: Any
    durable = True


@dataclass(frozen=True, slots=True)
class RecordSteps(StoreRequest):
    """Give the ledger a direction's finished window prefix. ``at_commit``: inside the open
    group commit, just before it commits (the applies the steps describe are in it); a
    failure there is reported with :meth:`ReplicationProtocol.fail_feed`."""

    key: Any
    direction: Any
    steps: tuple[Any, ...]
    at_commit: bool = False
    index: int = -1


@dataclass(frozen=True, slots=True)
class FlushCommits(StoreRequest):
    """Commit the open group commit now."""


@dataclass(frozen=True, slots=True)
class WaitForLog(StoreRequest):
    """Until the local log may have grown (a local commit, or a poll interval)."""

    durable = True


# --------------------------------------------------------------------------- the ledger (state/ledger.py)


@dataclass(frozen=True, slots=True)
class OpenLink(StoreRequest):
    """The ledger link of (tenant, remote, scope), made when new; answers its key."""

    tenant: str
    remote: str
    scope: SyncScope


@dataclass(frozen=True, slots=True)
class ReadCheckpoint(StoreRequest):
    """One direction's checkpoint of a link: ``(DirectionCheckpoint, rev)``."""

    key: Any
    direction: Any


@dataclass(frozen=True, slots=True)
class RewindCheckpoint(StoreRequest):
    """Move one direction back to the safe point ``to`` (None: the start), logged with ``reason``."""

    key: Any
    direction: Any
    to: ProgressToken | None
    reason: str


@dataclass(frozen=True, slots=True)
class ResetCheckpoint(StoreRequest):
    """Reset one direction to the start (after a gap or a new epoch), logged with ``reason``."""

    key: Any
    direction: Any
    reason: str


@dataclass(frozen=True, slots=True)
class Transition(StoreRequest):
    """Move a link to ``state``; ``only_from``: only when it is in one of these states now."""

    key: Any
    state: Any
    reason: str
    direction: Any = None
    error_code: str | None = None
    only_from: tuple[Any, ...] | None = None


@dataclass(frozen=True, slots=True)
class RecordSuccess(StoreRequest):
    """The link caught up: its failure count and backoff start again."""

    key: Any


@dataclass(frozen=True, slots=True)
class LogDomain(StoreRequest):
    """The (streamId, epoch) of ``tenant``'s log here, or None when there is no log."""

    tenant: str


Effect: TypeAlias = "Call | Notify | StoreRequest | Signal | _Yield"


# --------------------------------------------------------------------------- outputs


@dataclass(slots=True)
class SendRequest:
    """Send a request; answer with ``receive_response``/``receive_error`` under ``ref``
    (``no_reply``: nothing comes back)."""

    ref: int
    profile: str
    properties: dict[str, str]
    body: bytes
    urgent: bool = False
    compress: bool = False
    no_reply: bool = False
    max_reply: int | None = None


@dataclass(slots=True)
class SendReply:
    """Reply to the request received under ``rid``. ``kinds``: the result kind of each message a
    `rev` or `revs` applied, in order (metrics)."""

    rid: int
    properties: dict[str, str]
    body: bytes
    urgent: bool = False
    compress: bool = False
    kinds: tuple[str, ...] = ()


@dataclass(slots=True)
class SendError:
    """Refuse the request received under ``rid`` (an ERR of the ``P2PSync`` domain)."""

    rid: int
    error: PeerError


@dataclass(slots=True)
class StoreCall:
    """Carry out ``request``; answer with ``store_done``/``store_failed`` under ``ref``."""

    ref: int
    request: StoreRequest


@dataclass(slots=True)
class CloseConnection:
    """Close the connection: WebSocket ``code`` and ``reason`` (§2: 1008, ``P2PSync <code> <Name>``)."""

    code: int
    reason: str


@dataclass(slots=True)
class OperationFinished:
    """An operation started with one of the protocol's commands ended (see its handle)."""

    operation: Operation


Output: TypeAlias = "SendRequest | SendReply | SendError | StoreCall | CloseConnection | OperationFinished"


# --------------------------------------------------------------------------- shared records


@dataclass
class Operation:
    """The handle of a command (hello, a pull, a save, …): ``done`` once it ended, with its
    ``result`` or ``error``. ``tag`` is the driver's (it maps handles to its waiters)."""

    name: str
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    tag: Any = None

    def outcome(self) -> Any:
        """The result, or raise the error."""
        if not self.done:
            raise RuntimeError(f"operation {self.name} has not finished")
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class ReadDecision:
    """Whether the other peer may read a collection's tenant (§5). ``grant`` is the store's
    record of the grants behind it (opaque here); None with ``allowed``: the tenant itself."""

    allowed: bool
    reason: str
    grant: Any = None

    @property
    def everything(self) -> bool:
        return self.allowed and self.grant is None


@dataclass
class Collection:
    """A collection declared on this connection (both sides keep the list)."""

    tenant: str
    scope: SyncScope
    checkpoint_id: str
    decision: ReadDecision | None = None


class Slots:
    """A counting semaphore for operations: ``taken = yield from slots.acquire(weight)``, then
    :meth:`release` of what it returned. A weight above the capacity takes all of it (it then
    runs alone rather than never)."""

    __slots__ = ("capacity", "free", "_freed")

    def __init__(self, count: int, ready: deque[Any]) -> None:
        self.capacity = count
        self.free = count
        self._freed = Signal(ready)

    def acquire(self, weight: int = 1) -> Generator[Signal, Any, int]:
        weight = min(weight, self.capacity)
        while self.free < weight:
            yield self._freed
        self.free -= weight
        return weight

    def release(self, weight: int = 1) -> None:
        self.free += weight
        self._freed.fire()
