"""One replication connection as a sans-I/O state machine (replication-profiles.md).

:class:`ReplicationProtocol` is what h11's ``Connection`` is to HTTP: it takes what arrives
(requests, replies, refusals, the answers to its store requests) and gives back what to do
(:mod:`p2psync.replication.effects` outputs: requests and replies to send, store requests to
carry out, a close). It holds the connection's whole replication state — hello, the
collections, the sinks and sources of each direction, the offered set — and never touches a
socket, a clock, a thread or a database. ``p2psync.peer`` drives it over BLIP on trio; a test
can pump two of them against each other in a plain loop.

Each exchange runs as an *operation*: a generator that yields effects and is resumed with
their answers. Operations for requests that arrive are started by :meth:`receive_request`;
the active side starts its own with the commands (:meth:`start_hello`,
:meth:`open_collection`, :meth:`pull`, :meth:`push`, :meth:`save_checkpoint`, …), each of
which returns an :class:`~p2psync.replication.effects.Operation` handle.

The driver's loop: feed an input, then carry out :meth:`outputs` until there are none. A
:class:`~p2psync.replication.effects.StoreCall` may be answered before the next output is
taken (the store is local); replies to requests arrive whenever they do.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final

from p2psync.dwn.did import Identity
from p2psync.dwn.errors import DwnError
from p2psync.dwn.progress import ProgressToken
from p2psync.dwn.replication_types import DependencyRef, InitialWrite, ReplicationWireError, ref_from_json
from p2psync.dwn.replication_types import Protocol as ProtocolRef
from p2psync.errors import HandshakeFailed, LocalMisuse, QuotaExceeded
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.effects import (
    YIELD,
    AnswerReconcile,
    AnswerRefs,
    ApplyGrant,
    Authorize,
    Call,
    CloseConnection,
    Collection,
    ConnectionLost,
    LocalCids,
    LocalDefinitions,
    LocalSetView,
    Notify,
    OpenFeed,
    Operation,
    OperationFinished,
    Output,
    QuotaFit,
    ReadCopy,
    ReadDecision,
    ReadOffered,
    Response,
    SendError,
    SendReply,
    SendRequest,
    Signal,
    Slots,
    StoreCall,
    StoreRequest,
    WriteCopy,
)
from p2psync.replication.hello import (
    REVS,
    ROLE_RECORDS,
    WIDE_WINDOW,
    Hello,
    HelloProofInvalid,
    make_proof,
    verify_proof,
)
from p2psync.replication.observer import NO_OBSERVER, SyncObserver
from p2psync.replication.recon import (
    MAX_RECONCILE_BODY,
    MAX_RESOLVE,
    MAX_TAKE,
    Reconciliation,
    body_collection,
    resolve_request,
    resolved_of,
)
from p2psync.replication.round import SyncRound
from p2psync.replication.scope import RoleRecordsRef, SyncScope
from p2psync.replication.sink import HELD_KINDS, Sink, durable
from p2psync.replication.source import Source, message_entry
from p2psync.replication.stats import NotAppliedLog, SyncStats
from p2psync.replication.wire import (
    DEFAULT_BATCH,
    DEFAULT_MAX_DATA,
    HELLO_MAX_BODY,
    INLINE_DATA_MAX,
    MAX_ATTACHMENT_BYTES_IN_FLIGHT,
    MAX_BATCH,
    MAX_CHECKPOINT_BODY,
    MAX_COLLECTIONS,
    MAX_ENTRIES_PER_REF,
    MAX_INLINE_PER_DEPENDENCIES,
    MAX_OFFERED,
    MAX_REFS,
    MAX_UNANSWERED_REVS,
    PeerError,
    bool_property,
    decode_body,
    decode_map,
    encode_body,
    int_property,
    refuse,
)

__all__ = [
    "ACTIVE_PROFILES",
    "ALL_PROFILES",
    "PASSIVE_PROFILES",
    "HelloFailed",
    "ReplicationProtocol",
    "attachment_proof",
]

log = logging.getLogger("p2psync.peer")

#: Profiles each role answers (§2's table). The source of a direction answers its
#: getDependencies/getAttachment/proveAttachment, and either role can be a source.
_SOURCE_PROFILES: Final = frozenset({"getDependencies", "getAttachment", "proveAttachment"})
PASSIVE_PROFILES: Final = frozenset(
    {"getCollections", "getCheckpoint", "setCheckpoint", "subChanges", "proposeChanges", "rev", "revs", "norev",
     "reconcile"}
) | _SOURCE_PROFILES
ACTIVE_PROFILES: Final = frozenset({"changes", "rev", "revs", "norev"}) | _SOURCE_PROFILES
#: Every profile a peer answers (the BLIP handler table is built from this).
ALL_PROFILES: Final = ("hello", *sorted(PASSIVE_PROFILES | ACTIVE_PROFILES))
#: `getDependencies` one sink keeps in flight on a connection (§12).
MAX_DEPENDENCIES_IN_FLIGHT: Final = 16
#: `proveAttachment` nonce bounds (§9.2, Couchbase's).
PROVE_NONCE_MIN, PROVE_NONCE_MAX = 16, 255
#: Grants an active may bring per collection (§4.1, §12).
MAX_GRANTS: Final = 8
#: A round reconciles instead of replaying only while the estimated difference is at most this
#: share of the source's set and within what a kept sketch decodes without a scan (~16,000):
#: past that, most of the log would move anyway, and streaming it beats fetching by CID.
RECONCILE_MAX_SHARE: Final = 0.5
RECONCILE_MAX_DIFFERENCE: Final = 12_000


def worth_reconciling(estimate: float | None, remote_count: int) -> bool:
    """Whether a round should go on reconciling after the estimate (None: not known yet)."""
    return estimate is None or estimate <= min(RECONCILE_MAX_DIFFERENCE, RECONCILE_MAX_SHARE * max(remote_count, 1))

Effects = Generator[Any, Any, Any]


@dataclass(slots=True)
class _Task:
    """One running operation: its generator, and whom its end is for (the request ``rid`` it
    answers, or the handle of a command; neither for a background task such as a feed)."""

    gen: Effects
    name: str
    rid: int | None = None
    handle: Operation | None = None


class HelloFailed(HandshakeFailed):
    """Our side of hello failed (a bad proof, a timeout, a refused hello); the connection closes."""


class HelloTimeout(Exception):
    """The driver's hello deadline passed (thrown into the hello operation)."""


class ReplicationProtocol:
    """One connection's replication state, for either role (see the module doc).

    ``active``: we opened the connection (we declare collections, pull and push).
    ``identity`` signs our hello proof; ``mine`` is our hello.
    """

    def __init__(
        self,
        *,
        identity: Identity,
        mine: Hello,
        active: bool,
        accept_push: bool = True,
        stores: frozenset[str] | None = None,
        max_unanswered_revs: int = MAX_UNANSWERED_REVS,
        max_data: int = DEFAULT_MAX_DATA,
        observer: SyncObserver = NO_OBSERVER,
        channel: str | None = None,
        not_applied: NotAppliedLog | None = None,
    ) -> None:
        self.identity = identity
        #: the connection's channel binding both hello proofs sign (None: plain ws://)
        self.channel = channel
        self.mine = mine
        self.active = active
        self.accept_push = accept_push
        #: the tenants this peer stores messages for (None: any); pushes for others are refused
        self.stores = stores
        self.max_unanswered_revs = max_unanswered_revs
        #: record data above this is not taken (413 in the listing answer, §6.2)
        self.max_data = max_data
        self.observer = observer
        #: messages that did not apply, here or at the peer (shared by a peer's connections)
        self.not_applied = not_applied if not_applied is not None else NotAppliedLog()
        self.theirs: Hello | None = None
        self.hello_ok = False
        self.hello_done = False
        self.closed = False
        self.close_reason: str | None = None
        self.collections: list[Collection | None] = []
        self.sources: dict[int, Source] = {}
        self.sinks: dict[int, Sink] = {}
        self._declared: set[tuple[str, str]] = set()
        self._offered: OrderedDict[str, tuple[str, str, str]] = OrderedDict()  # cid -> tenant, recordId, dataCid
        self._ready: deque[tuple[_Task, Any, BaseException | None]] = deque()
        self._out: list[Output] = []
        self._waiting: dict[int, _Task] = {}  # ref -> the operation waiting on it
        self._remote: set[int] = set()  # the refs of those that wait on the other peer
        self._refs = 0
        self._hello_op: Operation | None = None
        self._hello_changed = Signal(self._ready)
        #: fired when a command ends, a feed is stopped or the connection is lost
        self._changed = Signal(self._ready)
        self._replied = False
        self._hello_expired = False
        # Weighed in bytes; no attachment weighs less than its share of the eight.
        self.attachment_slots = Slots(MAX_ATTACHMENT_BYTES_IN_FLIGHT, self._ready)
        self.dependency_slots = Slots(MAX_DEPENDENCIES_IN_FLIGHT, self._ready)
        self._handlers: dict[str, Callable[[dict[str, str], bytes], Effects]] = {
            "getCollections": self._on_get_collections,
            "getCheckpoint": self._on_get_checkpoint,
            "setCheckpoint": self._on_set_checkpoint,
            "subChanges": self._on_sub_changes,
            "proposeChanges": self._on_propose_changes,
            "getDependencies": self._on_get_dependencies,
            "getAttachment": self._on_get_attachment,
            "proveAttachment": self._on_prove_attachment,
            "changes": self._on_changes,
            "rev": self._on_rev,
            "revs": self._on_revs,
            "norev": self._on_norev,
            "reconcile": self._on_reconcile,
        }

    # == inputs =============================================================================

    def receive_request(self, rid: int, profile: str, properties: dict[str, str], body: bytes) -> None:
        """A request of the other peer arrived under ``rid`` (ours to reply to)."""
        if profile == "hello":
            gen = self._on_hello(body)
        else:
            handler = self._handlers.get(profile)
            if profile == "revs" and REVS not in self.mine.capabilities:
                handler = None  # answered as by a peer without the profile (§8.4)
            if handler is None:
                gen = _refusal(PeerError(404, "ProfileUnknown", f"no handler for {profile[:64]}"))
            else:
                gen = self._gated(profile, handler(properties, body))
        self._start(_Task(gen, profile, rid=rid))

    def receive_response(self, ref: int, properties: dict[str, str], body: bytes) -> None:
        """The reply to our request ``ref``."""
        self._resume(ref, Response(properties, body), None)

    def receive_error(self, ref: int, error: BaseException) -> None:
        """Our request ``ref`` was refused (a :class:`PeerError`) or failed."""
        self._resume(ref, None, error)

    def store_done(self, ref: int, value: Any) -> None:
        """The answer to store request ``ref``."""
        self._resume(ref, value, None)

    def store_failed(self, ref: int, error: BaseException) -> None:
        """Store request ``ref`` raised ``error``."""
        self._resume(ref, None, error)

    def connection_lost(self, reason: str = "closed") -> None:
        """The connection ended: every operation waiting on the other peer fails."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self._changed.fire()
        lost = ConnectionLost(reason)
        for ref in sorted(self._remote):
            self._ready.append((self._waiting.pop(ref), None, lost))
        self._remote.clear()
        for sink in self.sinks.values():
            sink.fail(lost)
        self._hello_changed.fire()
        self._run()

    def fail_feed(self, index: int, error: PeerError) -> None:
        """A ledger step of collection ``index``'s sink failed at commit (it stops taking items)."""
        sink = self.sinks.get(index)
        if sink is not None:
            sink.fail(error)
            self._run()

    def hello_expired(self) -> None:
        """The driver's hello deadline passed: hello fails (``HelloTimeout``) and closes."""
        if self.hello_done:
            return
        self._hello_expired = True
        for ref, task in list(self._waiting.items()):
            if task.handle is not None and task.handle is self._hello_op:
                del self._waiting[ref]
                self._remote.discard(ref)
                self._ready.append((task, None, HelloTimeout("no hello in time")))
        self._hello_changed.fire()
        self._run()

    def outputs(self) -> list[Output]:
        """What to do now (and forget it here)."""
        out, self._out = self._out, []
        return out

    # == commands (the active side, and hello for both) =====================================

    def start_hello(self) -> Operation:
        """Send our hello and check the other's proof (once; later calls return the same handle).
        The handle fails with :class:`HelloFailed` (the connection is then closed)."""
        if self._hello_op is None:
            self._hello_op = self._command(self._hello(), "hello")
        return self._hello_op

    def open_collection(
        self, tenant: str, scope: SyncScope, checkpoint_id: str, grants: list[dict[str, Any]] | None = None
    ) -> Operation:
        """Declare one collection (``getCollections``). Result: ``(index, copy)`` where copy is
        the passive's checkpoint copy (a dict, ``{}`` for none), or raises ``404
        CollectionNotFound`` when the passive refused it."""
        return self._command(self.declare(tenant, scope, checkpoint_id, grants or []), "getCollections")

    def sync(
        self, *, tenant: str, scope: SyncScope, local_store_id: str, pull: bool, push: bool, continuous: bool = False,
        batch: int = DEFAULT_BATCH, grants: list[dict[str, Any]] | None = None,
        totals: dict[str, Any] | None = None, on_progress: Callable[[Any], None] | None = None,
    ) -> tuple[Operation, SyncRound]:
        """One active round for one collection after hello (:class:`SyncRound`): open it, pull
        and/or push, save the checkpoint pair. The operation ends when every direction caught
        up (one-shot), or after :meth:`SyncRound.stop`, or with the first direction's failure."""
        round_ = SyncRound(self, tenant=tenant, scope=scope, local_store_id=local_store_id, pull=pull, push=push,
                           continuous=continuous, batch=batch, grants=grants, totals=totals, on_progress=on_progress)
        return self._command(round_.run(), "sync"), round_

    def save(self, round_: SyncRound) -> Operation:
        """Save ``round_``'s checkpoint pair on the passive now (the driver's cadence, §4.4)."""
        return self._command(round_.save(), "save")

    def pull(
        self, index: int, since: ProgressToken | None, *, key: Any, direction: Any, batch: int = DEFAULT_BATCH,
        continuous: bool = False, on_progress: Callable[[], None] | None = None,
    ) -> tuple[Operation, Sink]:
        """Pull collection ``index`` from ``since`` into a sink keeping ``key``'s tokens. The
        operation ends when caught up and drained (its result: the source's latest position or
        None); with ``continuous`` the sink goes on taking the feed after that."""
        coll = self._collection_at(index)
        sink = Sink(self, index, coll.tenant, key=key, since=since, max_data=self.max_data, direction=direction,
                    scope=coll.scope)
        sink.on_progress = on_progress
        self.sinks[index] = sink
        return self._command(self._pull(sink, since, batch, continuous), "pull"), sink

    def push(
        self, index: int, since: ProgressToken | None, *, key: Any, direction: Any, batch: int = DEFAULT_BATCH,
        continuous: bool = False, suppress_origin: str | None = None, replay_until: int = -1,
        on_progress: Callable[[], None] | None = None,
    ) -> tuple[Operation, Source]:
        """Push our log after ``since`` to collection ``index`` (``proposeChanges`` and `rev`s),
        keeping ``key``'s push tokens. The operation fails with 403 when the other peer may not
        read the tenant (§5: pushing is disclosure)."""
        coll = self._collection_at(index)
        source = Source(
            self, index, coll.tenant, coll.scope, batch=batch, continuous=continuous,
            max_unanswered_revs=self.max_unanswered_revs, decision=ReadDecision(False, "undecided"),
            push_key=key, direction=direction, on_progress=on_progress,
        )
        source.suppress_origin = suppress_origin
        source.replay_until = replay_until
        self.sources[index] = source
        return self._command(self._push(coll, source, since), "push"), source

    def save_checkpoint(self, index: int, pair: dict[str, Any], rev: str | None) -> Operation:
        """``setCheckpoint``: result the new rev; a stale rev is ``409 CheckpointRevConflict``."""
        return self._command(self.set_checkpoint(index, pair, rev), "setCheckpoint")

    def get_dependencies(self, index: int, refs: list[DependencyRef]) -> Operation:
        """``getDependencies`` for ``refs``: result the raw answers (one per ref)."""
        return self._command(self._get_dependencies(index, refs), "getDependencies")

    def reconcile(self, body: dict[str, Any]) -> Operation:
        """One ``reconcile`` request (protocol/anti-entropy.md): ``(decoded reply, request body,
        reply)`` (the last two for counting what went over the wire)."""
        return self._command(self._reconcile(body), "reconcile")

    def exchange_definitions(self, index: int, tenant: str, scope: SyncScope, *, pull: bool,
                             push: bool) -> Operation:
        """Fetch and hand over the replaced definitions set reconciliation leaves out (a
        repair's last step): ``(fetched, taken)`` as :meth:`_exchange_definitions` says."""
        return self._command(self._exchange_definitions(index, tenant, scope, pull=pull, push=push),
                             "definitions")

    def admit(self, index: int, obj: Any) -> Operation:
        """Admit one MessageEntry outside a listing (a repair), through collection ``index``'s
        sink: data fetched and checked, the closure loop, a durable commit. Result ``(entry,
        result, outcome)``; raises :class:`PeerError` when the entry or its data is refused."""
        return self._command(self._admit(index, obj), "admit")

    def close(self, code: int, name: str, detail: str = "") -> None:
        """Close the connection with 1008 and ``P2PSync <code> <Name>`` (§2)."""
        log.info("closing: P2PSync %d %s %s", code, name, detail)
        self._out.append(CloseConnection(1008, f"P2PSync {code} {name}"))

    def stop_feeds(self, error: PeerError) -> None:
        """Refuse what the sinks are still sent and end continuous sources (the peer stops)."""
        for sink in self.sinks.values():
            sink.fail(error)
        for source in self.sources.values():
            source.stopping = True
        self._changed.fire()
        self._run()

    # == building blocks of commands (generators other operations run) ======================

    def start_operation(self, gen: Effects, name: str) -> Operation:
        """Run ``gen`` as an operation of its own; its handle is returned."""
        return self._command(gen, name)

    def slots(self, count: int) -> Slots:
        """A semaphore for operations of this connection."""
        return Slots(count, self._ready)

    def join(self, operations: list[Operation]) -> Effects:
        """Until every one of ``operations`` ended or one failed (as a nursery does); then
        raise the failure that says most (a refusal before a lost connection), if any. The
        others go on until the connection ends."""
        while True:
            errors = [op.error for op in operations if op.error is not None]
            if errors or all(op.done for op in operations):
                break
            yield self._changed
        for error in sorted(errors, key=lambda e: isinstance(e, ConnectionLost)):
            raise error

    def set_checkpoint(self, index: int, pair: dict[str, Any], rev: str | None) -> Effects:
        """``setCheckpoint``; returns the new rev (a stale one is ``409 CheckpointRevConflict``)."""
        props = {"collection": str(index)}
        if rev is not None:
            props["rev"] = rev
        reply: Response = yield Call("setCheckpoint", props, encode_body(pair))
        return reply.properties.get("rev")

    # == what sinks and sources use ========================================================

    @property
    def remote_did(self) -> str:
        assert self.theirs is not None
        return self.theirs.did

    @property
    def remote_store_id(self) -> str | None:
        return None if self.theirs is None else self.theirs.store_id

    def signal(self) -> Signal:
        return Signal(self._ready)

    def spawn(self, gen: Effects, name: str) -> None:
        """Run ``gen`` beside the current operation (its errors are logged)."""
        self._ready.append((_Task(gen, name), None, None))

    @property
    def batch_revs(self) -> bool:
        """Whether both hellos offer `revs` (§8.4): a source then sends several messages a request."""
        return self.theirs is not None and REVS in self.theirs.capabilities and REVS in self.mine.capabilities

    @property
    def role_records(self) -> bool:
        """Whether both hellos offer `roleRecords` (§10.2): a subset sink then asks the source for
        the role records of each configure listed to it, and a source answers the ref."""
        return self.theirs is not None and ROLE_RECORDS in self.theirs.capabilities \
            and ROLE_RECORDS in self.mine.capabilities

    @property
    def wide_window(self) -> bool:
        """Whether both hellos offer `wideWindow` (§15): the driver may then let its transport
        send 1,000,000 unacknowledged bytes of a message, not 128,000."""
        return self.theirs is not None and WIDE_WINDOW in self.theirs.capabilities \
            and WIDE_WINDOW in self.mine.capabilities

    def store_later(self, request: StoreRequest) -> None:
        """A store request whose answer nobody waits for."""
        self._out.append(StoreCall(-1, request))

    def offer(self, tenant: str, entry: ReplicationEntry, size: int | None = None) -> None:
        """Remember a message whose data travels out of line (§9's offered set); ``size``:
        that of data the entry does not carry."""
        if entry.data is not None:
            size = len(entry.data)
        if size is None or size <= INLINE_DATA_MAX:
            return
        self._remember_offer(tenant, entry)

    def _remember_offer(self, tenant: str, entry: ReplicationEntry) -> None:
        d = entry.message["descriptor"]
        self._offered[entry.cid] = (tenant, str(entry.message.get("recordId")), str(d.get("dataCid")))
        self._offered.move_to_end(entry.cid)
        while len(self._offered) > MAX_OFFERED:
            self._offered.popitem(last=False)

    # == the scheduler ======================================================================

    def _command(self, gen: Effects, name: str) -> Operation:
        handle = Operation(name)
        self._start(_Task(gen, name, handle=handle))
        return handle

    def _start(self, task: _Task) -> None:
        self._ready.append((task, None, None))
        self._run()

    def _resume(self, ref: int, value: Any, error: BaseException | None) -> None:
        task = self._waiting.pop(ref, None)
        if task is None:
            return  # an answer for an operation that already ended (the connection closed)
        self._remote.discard(ref)
        self._ready.append((task, value, error))
        self._run()

    def _run(self) -> None:
        ready = self._ready
        while ready:
            task, value, error = ready.popleft()
            self._step(task, value, error)

    def _step(self, task: _Task, value: Any, error: BaseException | None) -> None:
        try:
            effect = task.gen.throw(error) if error is not None else task.gen.send(value)
        except StopIteration as stop:
            self._finish(task, stop.value, None)
            return
        except Exception as exc:
            self._finish(task, None, exc)
            return
        if isinstance(effect, Signal):
            effect.park(task)
        elif isinstance(effect, StoreRequest):
            ref = self._park(task)
            self._out.append(StoreCall(ref, effect))
        elif isinstance(effect, Call):
            if self.closed:
                self._ready.append((task, None, ConnectionLost(self.close_reason or "closed")))
                return
            ref = self._park(task)
            self._remote.add(ref)
            self._out.append(SendRequest(ref, effect.profile, effect.properties, effect.body, effect.urgent,
                                         effect.compress, max_reply=effect.max_reply))
        elif isinstance(effect, Notify):
            if not self.closed:
                self._out.append(SendRequest(-1, effect.profile, effect.properties, effect.body, no_reply=True))
            self._ready.append((task, None, None))
        elif effect is YIELD:
            self._ready.append((task, None, None))
        else:  # pragma: no cover - a bug in an operation
            self._ready.append((task, None, LocalMisuse(f"{task.name} yielded {effect!r}")))

    def _park(self, task: _Task) -> int:
        self._refs += 1
        self._waiting[self._refs] = task
        return self._refs

    def _finish(self, task: _Task, result: Any, error: BaseException | None) -> None:
        if task.rid is not None:
            if isinstance(error, PeerError):
                self._out.append(SendError(task.rid, error))
            elif error is not None:
                log.exception("%s failed", task.name, exc_info=error)
                self._out.append(SendError(task.rid, PeerError(500, "InternalError", type(error).__name__)))
            elif isinstance(result, SendReply):
                result.rid = task.rid
                self._out.append(result)
            elif result is not None:  # pragma: no cover - handlers return a reply or None
                raise LocalMisuse(f"{task.name} returned {result!r}")
        elif task.handle is not None:
            task.handle.done = True
            task.handle.result = result
            task.handle.error = error
            self._out.append(OperationFinished(task.handle))
            self._changed.fire()
        elif error is not None and not isinstance(error, PeerError):
            log.error("%s failed", task.name, exc_info=error)
        elif error is not None:
            log.info("%s ended: %s", task.name, error)

    # == hello (§3) =========================================================================

    def _hello(self) -> Effects:
        try:
            try:
                reply: Response = yield Call("hello", {}, encode_body(self.mine.to_wire()), urgent=True)
                while self.theirs is None:
                    yield from self._hello_wait()
                verify_proof(decode_map(reply.body).get("proof"), self.mine, self.theirs, self.channel)
                while not self._replied:
                    yield from self._hello_wait()
            except (HelloProofInvalid, PeerError, HelloTimeout) as exc:
                log.info("hello failed: %s", exc)
                name = ("HelloTimeout" if isinstance(exc, HelloTimeout)
                        else exc.name if isinstance(exc, HelloProofInvalid) else "HelloProofInvalid")
                if not self.closed:
                    self._out.append(CloseConnection(1008, f"P2PSync 401 {name}"))
                raise HelloFailed(str(exc) or type(exc).__name__) from exc
            self.hello_ok = True
            # The one line a passive node logs per connection (its links are the other side's).
            log.info("%s %s (storeId %s)", "connected to" if self.active else "connection from", self.theirs.did,
                     self.theirs.store_id)
        finally:
            self.hello_done = True
            self._hello_changed.fire()

    def _hello_wait(self) -> Effects:
        if self._hello_expired:
            raise HelloTimeout("no hello in time")
        if self.closed:
            raise ConnectionLost(self.close_reason or "closed")
        yield self._hello_changed

    def _on_hello(self, body: bytes) -> Effects:
        if self.theirs is not None:
            refuse(409, "HelloRepeated", "a second hello")
        if len(body) > HELLO_MAX_BODY:
            refuse(400, "HelloInvalid", "hello body too large")
        theirs = Hello.from_wire(decode_body(body, empty_map=False))
        if theirs.store_id == self.mine.store_id:
            refuse(400, "SelfConnection", "the other peer is this store")
        self.theirs = theirs
        self._hello_changed.fire()
        if self._hello_op is None:
            # The passive starts its own hello here at the latest; ours goes out before this reply.
            self.start_hello()
            yield YIELD
        proof = make_proof(self.identity, self.mine, theirs, self.channel)
        self._replied = True
        self._hello_changed.fire()
        return SendReply(0, {}, encode_body({"proof": proof}), urgent=True)

    def _gated(self, profile: str, handler: Effects) -> Effects:
        """§3 rule 3: before hello, 401; between the proof's arrival and its check, wait."""
        if not self.hello_ok:
            # Before the other's hello has arrived there is nothing to wait for: 401 at once.
            # After it, its proof check is at most one round trip away, so we wait for it.
            if self.theirs is None:
                handler.close()
                refuse(401, "HelloRequired", "no successful hello yet")
            while not self.hello_done:
                yield self._hello_changed
            if not self.hello_ok:
                handler.close()
                refuse(401, "HelloRequired", "hello failed")
        role = ACTIVE_PROFILES if self.active else PASSIVE_PROFILES
        if profile not in role:
            handler.close()
            refuse(409, "RoleMismatch", f"{profile} is not answered by this role")
        return (yield from handler)

    # == collections and checkpoints (§4) ===================================================

    def _collection_at(self, index: int) -> Collection:
        coll = self.collections[index] if 0 <= index < len(self.collections) else None
        if coll is None:
            refuse(404, "CollectionNotFound", f"no collection {index}")
        return coll

    def _collection(self, properties: dict[str, str]) -> tuple[int, Collection]:
        index = int_property(properties, "collection")
        return index, self._collection_at(index)

    def declare(self, tenant: str, scope: SyncScope, checkpoint_id: str, grants: list[dict[str, Any]]) -> Effects:
        """``getCollections`` for one collection: ``(index, copy)`` (see :meth:`open_collection`)."""
        self.collections.append(Collection(tenant, scope, checkpoint_id))
        index = len(self.collections) - 1
        coll: dict[str, Any] = {"tenant": tenant, "scope": scope.to_wire(), "checkpointId": checkpoint_id}
        if grants:
            coll["grants"] = grants
        reply: Response = yield Call("getCollections", {}, encode_body({"collections": [coll]}))
        copies = decode_body(reply.body)
        copy = copies[0] if isinstance(copies, list) and copies else None
        if not isinstance(copy, dict):
            self.collections[index] = None
            raise PeerError(404, "CollectionNotFound", "the peer refused the collection")
        return index, copy

    def _on_get_collections(self, properties: dict[str, str], body: bytes) -> Effects:
        colls = decode_map(body).get("collections")
        if not isinstance(colls, list) or not 1 <= len(colls) <= MAX_COLLECTIONS:
            refuse(400, "BodyInvalid", "collections must hold 1 to 256 entries")
        if len(self.collections) + len(colls) > MAX_COLLECTIONS:
            refuse(413, "TooManyCollections", "at most 256 collections per connection")
        parsed = [_parse_collection(c) for c in colls]
        out: list[Any] = []
        for tenant, scope, cid, grants in parsed:
            key = (tenant, scope.scope_id)
            if key in self._declared:
                self.collections.append(None)
                out.append(None)
                continue
            self._declared.add(key)
            yield from self._apply_grants(tenant, grants)
            self.collections.append(Collection(tenant, scope, cid))
            stored = yield ReadCopy(self.remote_did, cid)
            out.append({} if stored is None else {"rev": stored[1], **stored[0]})
        return SendReply(0, {}, encode_body(out))

    def _apply_grants(self, tenant: str, grants: list[Any]) -> Effects:
        """§4.1: grants the active brings are replicated messages of the tenant; apply valid ones
        (only for a tenant this peer stores: they are writes like any other)."""
        if grants and self.stores is not None and tenant not in self.stores:
            return
        for grant in grants:
            if not isinstance(grant, dict) or not isinstance(grant.get("message"), dict):
                continue
            data = grant.get("data")
            yield ApplyGrant(tenant, grant["message"], data if isinstance(data, bytes) else None)

    def _on_get_checkpoint(self, properties: dict[str, str], body: bytes) -> Effects:
        _, coll = self._collection(properties)
        stored = yield ReadCopy(self.remote_did, coll.checkpoint_id)
        if stored is None:
            return SendReply(0, {}, encode_body({}))
        return SendReply(0, {"rev": stored[1]}, encode_body(stored[0]))

    def _on_set_checkpoint(self, properties: dict[str, str], body: bytes) -> Effects:
        _, coll = self._collection(properties)
        if len(body) > MAX_CHECKPOINT_BODY:
            refuse(413, "BodyTooLarge", "setCheckpoint body above 512 KiB")
        pair = decode_map(body)
        if set(pair) != {"pull", "push"}:
            refuse(400, "CheckpointInvalid", "a CheckpointPair has pull and push")
        # The store answers only after a durable commit (§4.3); it raises the 409 and 400.
        rev = yield WriteCopy(self.remote_did, coll.checkpoint_id, pair, properties.get("rev"))
        return SendReply(0, {"rev": rev}, b"")

    # == authorization (§5) =================================================================

    def decision(self, coll: Collection) -> Effects:
        """May the other peer read ``coll``'s tenant (cached per collection)?"""
        if coll.decision is None:
            if self.remote_did == coll.tenant:
                coll.decision = ReadDecision(True, "the tenant itself")
            else:
                coll.decision = yield Authorize(coll.tenant, self.remote_did, coll.scope)
        return coll.decision

    def _require_reader(self, coll: Collection) -> Effects:
        decision: ReadDecision = yield from self.decision(coll)
        if not decision.allowed:
            refuse(403, "SyncNotAuthorized", decision.reason or "the peer is not an authorized reader")
        return decision

    # == the passive's pull feed (§6) =======================================================

    def _on_sub_changes(self, properties: dict[str, str], body: bytes) -> Effects:
        index, coll = self._collection(properties)
        decision = yield from self._require_reader(coll)
        if index in self.sources:
            refuse(409, "FeedActive", "this collection already has a feed")
        continuous = bool_property(properties, "continuous")
        batch = min(int_property(properties, "batch", default=DEFAULT_BATCH), MAX_BATCH)
        if batch < 1:
            refuse(400, "PropertyInvalid", "batch must be at least 1")
        request = decode_map(body)
        since: ProgressToken | None = None
        if "since" in request:
            try:
                since = ProgressToken.from_wire(request["since"])
            except DwnError as exc:
                refuse(400, "ProgressTokenInvalid", str(exc))
        gap, latest = yield OpenFeed(coll.tenant, since)
        if gap is not None:
            # §6.1: the ERR body of a 410 is the ProgressGap itself.
            raise PeerError(410, "ProgressGap", "the token cannot be served here", gap.to_wire())
        source = Source(self, index, coll.tenant, coll.scope, batch=batch, continuous=continuous,
                        max_unanswered_revs=self.max_unanswered_revs, decision=decision)
        self.sources[index] = source
        self.spawn(self._run_feed(source, since), f"feed {index}")
        return SendReply(0, {}, encode_body({} if latest is None else {"latest": latest.to_wire()}))

    def _run_feed(self, source: Source, since: ProgressToken | None) -> Effects:
        try:
            yield from source.run(since)
        except PeerError as exc:  # the puller's refusal, or the end of its read grant
            log.info("feed %d ended: %s", source.index, exc)
            if exc.code == 403:
                self.close(403, "SyncNotAuthorized", exc.detail)
        except Exception as exc:
            # A bug or a store failure of ours: the puller would wait for `changes` that never
            # come. Closing makes it reconnect and resume from its checkpoint (§2).
            log.exception("feed %d failed", source.index)
            if not self.closed:
                self.close(500, "FeedFailed", type(exc).__name__)
        finally:
            self.sources.pop(source.index, None)

    # == the passive's push sink (§7) =======================================================

    def _refuse_push_for(self, tenant: str) -> None:
        """``403 PushRefused`` unless this peer takes pushes and stores ``tenant`` (issue #15:
        a stranger who proves any DID must not fill the disk with tenants nobody asked for)."""
        if not self.accept_push:
            refuse(403, "PushRefused", "this peer does not take pushes")
        if self.stores is not None and tenant not in self.stores:
            self.observer.push_refused(tenant, self.remote_did)
            log.warning("refused a push from %s: this node does not store tenant %s", self.remote_did, tenant[:80])
            refuse(403, "PushRefused", "this node does not store that tenant")

    def _payer(self, coll: Collection) -> Effects:
        """Whose push budget a push into ``coll`` is charged to (issue #15): the pusher's,
        unless it may read the tenant — the tenant's own devices and the peers it granted sync
        are bounded by the tenant's quota alone."""
        decision: ReadDecision = yield from self.decision(coll)
        return None if decision.allowed else self.remote_did

    def _on_propose_changes(self, properties: dict[str, str], body: bytes) -> Effects:
        index, coll = self._collection(properties)
        self._refuse_push_for(coll.tenant)
        sink = self.sinks.get(index)
        if sink is None:
            sink = self.sinks[index] = Sink(self, index, coll.tenant, key=None, max_data=self.max_data,
                                                  scope=coll.scope)
        sink.payer = yield from self._payer(coll)
        statuses = yield from sink.on_listing(decode_body(body), pull=False)
        return SendReply(0, {}, encode_body(statuses), urgent=True)

    # == sinks: `changes`, `rev`, `norev` (§6.2, §8) ========================================

    def _sink(self, profile: str, properties: dict[str, str]) -> Sink:
        index = int_property(properties, "collection")
        sink = self.sinks.get(index)
        if sink is None:
            name = "ChangesUnsolicited" if profile == "changes" else "RevUnsolicited"
            refuse(409, name, f"no open sink for collection {index}")
        return sink

    def _on_changes(self, properties: dict[str, str], body: bytes) -> Effects:
        sink = self._sink("changes", properties)
        statuses = yield from sink.on_listing(decode_body(body), pull=True)
        return SendReply(0, {}, encode_body(statuses), urgent=True)

    def _on_rev(self, properties: dict[str, str], body: bytes) -> Effects:
        sink = self._sink("rev", properties)
        result = yield from sink.on_rev(properties, body)
        return SendReply(0, {}, encode_body(result), kinds=(str(result.get("kind")),))

    def _on_revs(self, properties: dict[str, str], body: bytes) -> Effects:
        sink = self._sink("revs", properties)
        results = yield from sink.on_revs(body)
        kinds = tuple(str(r.get("kind", "Error")) if isinstance(r, dict) else "Error" for r in results)
        return SendReply(0, {}, encode_body({"results": results}), kinds=kinds)

    def _on_norev(self, properties: dict[str, str], body: bytes) -> Effects:
        sink = self._sink("norev", properties)
        yield from sink.on_norev(properties)
        return None

    # == sources: dependencies and data (§9, §10) ==========================================

    def _on_get_dependencies(self, properties: dict[str, str], body: bytes) -> Effects:
        _, coll = self._collection(properties)
        decision = yield from self._require_reader(coll)
        raw = decode_map(body).get("refs")
        if not isinstance(raw, list) or not raw:
            refuse(400, "DependencyRefInvalid", "refs must be a non-empty array")
        if len(raw) > MAX_REFS:
            refuse(413, "TooManyRefs", "at most 128 refs")
        refs: list[DependencyRef | RoleRecordsRef] = []
        for r in raw:
            try:
                roles = isinstance(r, dict) and r.get("type") == RoleRecordsRef.TYPE and self.role_records
                refs.append(RoleRecordsRef.from_json(r) if roles else ref_from_json(r))
            except (ReplicationWireError, DwnError, ValueError) as exc:
                refuse(400, "DependencyRefInvalid", str(exc))
        found = yield AnswerRefs(coll.tenant, tuple(refs), decision, MAX_ENTRIES_PER_REF)
        budget = MAX_INLINE_PER_DEPENDENCIES
        answers: list[dict[str, Any]] = []
        for entries, withheld, after in found:
            out: list[dict[str, Any]] = []
            for entry in entries:
                size = len(entry.data) if entry.data is not None else 0
                if entry.data is not None and size <= INLINE_DATA_MAX and size <= budget:
                    budget -= size
                    out.append(message_entry(entry))
                else:
                    if entry.data is not None:
                        self._remember_offer(coll.tenant, entry)
                    out.append(message_entry(entry, inline=False))
            answer: dict[str, Any] = {"entries": out}
            if withheld:
                answer["withheld"] = True
            if after is not None:
                answer["next"] = after
            answers.append(answer)
        return SendReply(0, {}, encode_body({"answers": answers}), urgent=True, compress=True)

    def _offered_data(self, properties: dict[str, str]) -> Effects:
        self._collection(properties)
        cid, dcid = properties.get("messageCid", ""), properties.get("dataCid")
        offered = self._offered.get(cid)
        if offered is None or offered[2] != dcid:
            refuse(404, "MessageNotFound", "not offered on this connection")
        tenant, record_id, data_cid = offered
        data = yield ReadOffered(tenant, record_id, data_cid, cid)
        if data is None:
            refuse(404, "MessageNotFound", "the data left this store")
        return data

    def _on_get_attachment(self, properties: dict[str, str], body: bytes) -> Effects:
        data = yield from self._offered_data(properties)
        return SendReply(0, {}, data)

    def _on_prove_attachment(self, properties: dict[str, str], body: bytes) -> Effects:
        nonce = decode_map(body).get("nonce")
        if not isinstance(nonce, bytes) or not PROVE_NONCE_MIN <= len(nonce) <= PROVE_NONCE_MAX:
            refuse(400, "BodyInvalid", "nonce must be 16 to 255 bytes")
        data = yield from self._offered_data(properties)
        return SendReply(0, {}, encode_body({"proof": attachment_proof(nonce, data)}))

    # == the active's directions ============================================================

    def _pull(self, sink: Sink, since: ProgressToken | None, batch: int, continuous: bool) -> Effects:
        props = {"collection": str(sink.index), "batch": str(batch)}
        if continuous:
            props["continuous"] = "true"
        body = encode_body({} if since is None else {"since": since.to_wire()})
        reply: Response = yield Call("subChanges", props, body)
        latest = decode_body(reply.body).get("latest") if reply.body else None
        position = None
        if isinstance(latest, dict) and isinstance(latest.get("position"), str) and latest["position"].isdigit():
            position = int(latest["position"])
        sink.stats.latest = position
        yield from sink.wait_drained()
        return position

    def _push(self, coll: Collection, source: Source, since: ProgressToken | None) -> Effects:
        decision: ReadDecision = yield from self.decision(coll)
        if not decision.allowed:
            # §5: pushing is disclosure; only to an authorized reader by our own store.
            raise PeerError(403, "SyncNotAuthorized", f"the peer may not read this tenant: {decision.reason}")
        source.decision = decision
        yield from source.run(since)

    def _get_dependencies(self, index: int, refs: list[DependencyRef]) -> Effects:
        sink = self.sinks.get(index)
        body = encode_body({"refs": [r.to_json() for r in refs]})
        yield from self.dependency_slots.acquire()
        try:
            reply: Response = yield Call("getDependencies", {"collection": str(index)}, body)
        finally:
            self.dependency_slots.release()
        if sink is not None:
            sink.stats.bytes_received += len(reply.body)
        answers = decode_map(reply.body).get("answers")
        if not isinstance(answers, list) or len(answers) != len(refs):
            raise PeerError(400, "BodyInvalid", "getDependencies answers do not match the refs")
        return answers

    def _admit(self, index: int, obj: Any) -> Effects:
        sink = self.sinks[index]
        entry = yield from sink.entry_of(obj)
        result, outcome, ticket = yield from sink.admit(entry)
        sink.closure_failures.pop(entry.cid, None)  # a repair reports the outcome itself
        if ticket is not None:
            yield from durable(ticket)
        return entry, result, outcome

    # == anti-entropy (protocol/anti-entropy.md) ===========================================

    def _reconcile(self, body: dict[str, Any]) -> Effects:
        raw = encode_body(body)
        reply: Response = yield Call("reconcile", {}, raw, urgent=True)
        return decode_map(reply.body), raw, reply

    def _on_reconcile(self, properties: dict[str, str], body: bytes) -> Effects:
        if len(body) > MAX_RECONCILE_BODY:
            refuse(413, "ReconcileTooLarge", f"a reconcile request is at most {MAX_RECONCILE_BODY} bytes")
        request = decode_map(body)
        index = body_collection(request)
        coll = self._collection_at(index)
        decision = yield from self._require_reader(coll)
        if not decision.everything:
            # The ids of a set say which messages exist; only a reader of all of them may ask.
            refuse(403, "ReconcileNotAuthorized", "set reconciliation is for readers of the whole scope")
        if "f" in request:
            # A take comes only from a reader of the whole scope (above): it is charged to
            # nobody's push budget, and bounded by the tenant's quota (in _fetch_named).
            self._refuse_push_for(coll.tenant)
            counts = yield from self._take_from_peer(index, request["f"])
            return SendReply(0, {}, encode_body({"k": counts}))
        reply = yield AnswerReconcile(coll.tenant, coll.scope, request)
        return SendReply(0, {}, encode_body(reply), urgent=True)

    def _take_from_peer(self, index: int, cids: Any) -> Effects:
        """``f``: the other peer holds these and we lack them; fetch each by CID from it.
        Answers counts by result kind."""
        if (not isinstance(cids, list) or len(cids) > MAX_TAKE
                or not all(isinstance(c, str) and 0 < len(c) <= 128 for c in cids)):
            refuse(400, "ReconcileInvalid", f"f is a list of at most {MAX_TAKE} CIDs")
        counts = yield from self._fetch_named(index, cids)
        return counts

    def _fetch_named(self, index: int, cids: list[str], stats: SyncStats | None = None) -> Effects:
        """Fetch messages by CID from the other peer (getDependencies with ``messageCid`` refs,
        our closure loop, durable commits) through a repair sink (no tokens). Counts by result
        kind; ``NotFound`` for a CID the peer did not answer with."""
        sink = self._repair_sink_for(index, stats)
        counts: dict[str, int] = {}
        # The store's quotas first (issue #15): what does not fit is not fetched at all, and a
        # request of which nothing fits is refused.
        fits, refusal = yield QuotaFit(sink.tenant, sink.payer, (None,) * len(cids))
        if refusal is not None:
            sink.quota_refused(refusal, len(cids) - fits)
            if fits == 0:
                raise refusal
            counts[refusal.name] = len(cids) - fits
            cids = cids[:fits]
        for start in range(0, len(cids), MAX_REFS):
            chunk = cids[start : start + MAX_REFS]
            if isinstance(sink.failed, QuotaExceeded):  # an apply did not fit: fetch no more
                counts[sink.failed.name] = counts.get(sink.failed.name, 0) + len(chunk)
                continue
            refs: list[DependencyRef] = [InitialWrite(record_id=c, message_cid=c) for c in chunk]
            answers = yield from self._get_dependencies(index, refs)
            for cid, found in zip(chunk, answers, strict=True):
                entries = found.get("entries") if isinstance(found, dict) else None
                match = [e for e in entries or [] if isinstance(e, dict) and isinstance(e.get("message"), dict)
                         and ReplicationEntry(e["message"]).cid == cid]
                if isinstance(sink.failed, QuotaExceeded):
                    kind = sink.failed.name
                elif not match:
                    kind = "Withheld" if isinstance(found, dict) and found.get("withheld") is True else "NotFound"
                else:
                    try:
                        _, result, _ = yield from self._admit(index, match[0])
                        kind = str(result.kind)
                        sink.note_result(cid, result)
                    except PeerError as exc:
                        kind = exc.name
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def _exchange_definitions(self, index: int, tenant: str, scope: SyncScope, *, pull: bool, push: bool,
                              stats: SyncStats | None = None) -> Effects:
        """What set reconciliation cannot see (anti-entropy.md §7): the sets hold stored
        messages, and a definition a newer one replaced is not stored, yet it judges the records
        of its time (replication-apply.md, *Superseded definitions travel*). With ``pull``, fetch
        every definition the peer admitted of each protocol we hold a definition of; with
        ``push``, have it take the replaced definitions we list. Returns ``(fetched, taken)``
        counts by result kind, less ``Duplicate``; ``taken`` is None when the peer takes no
        pushes (403)."""
        protocols, replaced = yield LocalDefinitions(tenant, scope)
        fetched: dict[str, int] = {}
        if pull and protocols:
            _merge_new(fetched, (yield from self._fetch_definitions(index, list(protocols), stats)))
        taken: dict[str, int] = {}
        for start in range(0, len(replaced) if push else 0, MAX_TAKE):
            body = {"f": list(replaced[start : start + MAX_TAKE]), **({"c": index} if index else {})}
            try:
                reply, _, _ = yield from self._reconcile(body)
            except PeerError as exc:
                if exc.code != 403:
                    raise
                return fetched, None
            counts = reply.get("k")
            _merge_new(taken, {kind: n for kind, n in (counts.items() if isinstance(counts, dict) else ())
                               if isinstance(kind, str) and isinstance(n, int)})
        return fetched, taken

    def _fetch_definitions(self, index: int, protocols: list[str], stats: SyncStats | None) -> Effects:
        """Every definition the other peer admitted of each of ``protocols`` (a ``Protocol`` ref
        each: the answer holds the replaced ones too), admitted here. Counts by result kind."""
        self._repair_sink_for(index, stats)
        counts: dict[str, int] = {}
        for start in range(0, len(protocols), MAX_REFS):
            refs: list[DependencyRef] = [ProtocolRef(protocol=p) for p in protocols[start : start + MAX_REFS]]
            for found in (yield from self._get_dependencies(index, refs)):
                entries = found.get("entries") if isinstance(found, dict) else None
                for entry in entries or []:
                    if not isinstance(entry, dict) or not isinstance(entry.get("message"), dict):
                        continue
                    try:
                        _, result, _ = yield from self._admit(index, entry)
                        kind = str(result.kind)
                    except PeerError as exc:
                        kind = exc.name
                    counts[kind] = counts.get(kind, 0) + 1
        return counts

    def reconcile_repair(self, index: int, tenant: str, scope: SyncScope, *, push: bool,
                         stats: SyncStats | None = None) -> Effects:
        """Reconcile collection ``index`` and fetch exactly what we lack (and, with ``push``, have
        the peer take what it lacks): the gap repair of a round (protocol/anti-entropy.md §7).

        Returns ``(their head, our head, fetched, taken)`` (the last two: counts by result kind)
        when every message both ways was settled (applied, already held or superseded), so each
        side may resume its log after the other's head. None when a replay must do it instead:
        an empty local set, a difference too large to be worth it, a refusal, a collision,
        something left unapplied. ``stats``: where the fetches count their dependencies,
        attachments and bytes."""
        try:
            view, our_head = yield LocalSetView(tenant, scope)
        except PeerError as exc:
            log.info("reconcile with %s: %s; replaying instead", self.remote_did, exc)
            return None
        if view.count == 0:
            return None  # nothing to save: streaming the log is the faster way to fill a store
        recon = Reconciliation(view, collection=index or None, want_head=True)
        try:
            request: dict[str, Any] | None = recon.opening()
            while request is not None:
                reply, _, _ = yield from self._reconcile(request)
                request = recon.receive(reply)
                if request is not None and not worth_reconciling(recon.estimate, recon.remote_count):
                    log.info("reconcile with %s: ~%.0f of %d messages differ; replaying instead",
                             self.remote_did, recon.estimate or 0, recon.remote_count)
                    return None
        except PeerError as exc:
            log.info("reconcile with %s: %s; replaying instead", self.remote_did, exc)
            return None
        result = recon.result
        assert result is not None
        mine: list[str] = []
        if push and result.local_only:
            # Named now, before fetching changes our set: an id no longer in it (a message that
            # left the state since the view, a warp of an open batch) cannot be handed over, and
            # resuming after our head would then skip it for good, so replay instead.
            mine = yield LocalCids(tenant, scope, recon.coder, tuple(result.local_only))
            if not set(result.local_only) <= {recon.coder.key(c).id for c in mine}:
                log.info("reconcile with %s: our set changed under the exchange; replaying instead", self.remote_did)
                return None
        fetched: dict[str, int] = {}
        if result.remote_only:
            cids: list[str] = []
            for start in range(0, len(result.remote_only), MAX_RESOLVE):
                body = resolve_request(recon.coder, result.remote_only[start : start + MAX_RESOLVE], index or None)
                reply, _, _ = yield from self._reconcile(body)
                cids.extend(str(item["cid"]) for item in resolved_of(reply))
            fetched = yield from self._fetch_named(index, cids, stats)
            if len(cids) != len(result.remote_only):
                fetched["NotFound"] = fetched.get("NotFound", 0) + len(result.remote_only) - len(cids)
        more, taken_definitions = yield from self._exchange_definitions(index, tenant, scope, pull=True, push=push,
                                                                        stats=stats)
        if taken_definitions is None:
            return None
        _merge_new(fetched, more)
        taken = dict(taken_definitions)
        if mine:
            for start in range(0, len(mine), MAX_TAKE):
                body = {"f": mine[start : start + MAX_TAKE], **({"c": index} if index else {})}
                try:
                    reply, _, _ = yield from self._reconcile(body)
                except PeerError as exc:
                    if exc.code != 403:
                        raise
                    return None
                counts = reply.get("k")
                for kind, n in (counts.items() if isinstance(counts, dict) else ()):
                    if isinstance(kind, str) and isinstance(n, int):
                        taken[kind] = taken.get(kind, 0) + n
        # Only when every message both ways is held may the round resume after the heads.
        if any(kind not in HELD_KINDS for kind in (*fetched, *taken)):
            return None
        return result.head, our_head, fetched, taken

    def _repair_sink_for(self, index: int, stats: SyncStats | None) -> Sink:
        """Collection ``index``'s repair sink (a new one unless one that keeps no tokens and has
        not failed is there), counting into ``stats`` when given."""
        sink = self.sinks.get(index)
        if sink is None or sink.key is not None or sink.failed is not None:
            sink = self.repair_sink(index)
        if stats is not None:
            sink.stats = stats
        return sink

    def repair_sink(self, index: int) -> Sink:
        """A sink for collection ``index`` that keeps no tokens (a repair's admits)."""
        coll = self._collection_at(index)
        sink = self.sinks[index] = Sink(self, index, coll.tenant, key=None, max_data=self.max_data,
                                                  scope=coll.scope)
        return sink


def _merge_new(into: dict[str, int], counts: dict[str, int]) -> None:
    """Add ``counts`` to ``into``, less what was held already (``Duplicate``): a reconcile
    reports what moved."""
    for kind, n in counts.items():
        if kind != "Duplicate":
            into[kind] = into.get(kind, 0) + n


def _refusal(error: PeerError) -> Effects:
    raise error
    yield  # pragma: no cover - makes this a generator


def _parse_collection(c: Any) -> tuple[str, SyncScope, str, list[Any]]:
    if not isinstance(c, dict):
        refuse(400, "BodyInvalid", "a Collection must be a map")
    tenant, cid, grants = c.get("tenant"), c.get("checkpointId"), c.get("grants", [])
    if not isinstance(tenant, str) or not tenant.startswith("did:"):
        refuse(400, "BodyInvalid", "tenant must be a DID")
    if not isinstance(cid, str) or not 1 <= len(cid) <= 256:
        refuse(400, "BodyInvalid", "checkpointId must be 1 to 256 characters")
    if not isinstance(grants, list) or len(grants) > MAX_GRANTS:
        refuse(400, "BodyInvalid", f"grants must be an array of at most {MAX_GRANTS} messages")
    try:
        scope = SyncScope.from_wire(c.get("scope"))
    except DwnError as exc:
        refuse(400, "SyncScopeInvalid", str(exc))
    return tenant, scope, cid, grants


def attachment_proof(nonce: bytes, data: bytes) -> bytes:
    """§9.2: sha256(len(nonce) as one byte ‖ nonce ‖ data)."""
    digest = hashlib.sha256(bytes([len(nonce)]))
    digest.update(nonce)
    digest.update(data)
    return digest.digest()
