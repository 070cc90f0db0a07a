"""``Peer``: a store and an identity that serve and run replication (replication-profiles.md).

``await peer.serve(host, port, task_status=...)`` accepts connections (the passive role);
``await peer.sync(url, tenant=..., direction=..., continuous=...)`` opens one (the active
role) and pulls, pushes or both for one collection (tenant + scope). A one-shot sync returns
a :class:`SyncSummary` once every direction has caught up and the checkpoints are saved on
both sides; a continuous one keeps the connection, reconnecting with capped exponential
backoff and jitter, until it is cancelled.

One round of the active side (hello, then :class:`~p2psync.replication.round.SyncRound`:
the collection, the start points, pull and push, the saves) is the replication protocol's;
this module gives it a connection and its timers: the checkpoint save every
:data:`CHECKPOINT_INTERVAL`, the stall watchdog of a one-shot round, and a graceful stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Literal

import apsw
import trio

from p2psync import blip, errors
from p2psync.blip.tls import TlsCertificate, channel_binding
from p2psync.dwn.ahead import SignatureProcess, SignatureWorker, second_core
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import Store
from p2psync.errors import error_name, is_retryable, retry_after
from p2psync.peer.anti_entropy import ReconcileSummary, reconcile_with
from p2psync.peer.repair import RepairProgress, RepairSummary, WantedMessage, fetch_messages
from p2psync.peer.retry import RetryGate
from p2psync.peer.session import PRE_HELLO_MAX_MESSAGE, SERVED_GATHER_BYTES, PeerSession
from p2psync.replication.hello import Hello, new_hello
from p2psync.replication.inflight import InFlightClaims
from p2psync.replication.observer import NO_OBSERVER, SyncObserver
from p2psync.replication.protocol import ALL_PROFILES, ReplicationProtocol
from p2psync.replication.round import SyncRound
from p2psync.replication.scope import SyncScope
from p2psync.replication.stats import SyncProgress, SyncStats, SyncSummary
from p2psync.replication.wire import APP_ID, DEFAULT_BATCH, PeerError
from p2psync.state.authz import ReadAuthorizer
from p2psync.state.committer import GroupCommitter
from p2psync.state.copies import CheckpointCopies, NotAppliedRecords, store_id
from p2psync.state.ledger import Direction, Ledger, LinkKey
from p2psync.state.quota import QuotaPolicy, Quotas
from p2psync.state.service import StoreService

__all__ = [
    "AGENT", "CHECKPOINT_INTERVAL", "Connector", "Peer", "ReconcileSummary", "RepairProgress", "RepairSummary",
    "SyncProgress", "SyncStats", "SyncSummary", "WantedMessage", "dialer",
]

log = logging.getLogger("p2psync.peer")

AGENT = "p2psync/0.1.0"
#: §4.4 cadence: save the pair at most once a second, and at least every 5 s while a direction
#: progresses (we save every 2 s when something changed).
CHECKPOINT_INTERVAL: Final = 2.0
#: Attempts of a one-shot sync when the connection drops mid-way (the first included).
ONE_SHOT_ATTEMPTS: Final = 3
#: The longest ``retryAfter`` a one-shot sync waits out before its next attempt; past it (a
#: spent push budget renews within the hour) it reports the refusal: someone is waiting at a
#: terminal. Ours.
ONE_SHOT_MAX_WAIT: Final = 30.0
#: Connections a peer serves at once, and of them how many may not have proved their DID yet
#: (issue #15): a stranger opening connections and never saying hello holds at most 32 slots,
#: each for the hello deadline (10 s), and proven peers still get in. Ours; a LAN node rarely
#: has more than a dozen peers.
MAX_CONNECTIONS: Final = 256
MAX_UNPROVEN_CONNECTIONS: Final = 32
#: Of the unproven, those from one address: one host renewing silent connections every hello
#: deadline would otherwise hold all 32 slots and lock every newcomer out (1013); now it holds
#: half, and the rest stay for other hosts. An honest peer opens one connection per link. Ours.
MAX_UNPROVEN_PER_ADDRESS: Final = 16
#: A one-shot round that moves nothing for this long is abandoned and retried: BLIP pings keep
#: a connection open even when the other side's replication is stuck. Ours.
STALL_TIMEOUT: Final = 120.0

Direction_ = Literal["pull", "push", "both"]
Connector = Callable[[dict[str, Any]], AbstractAsyncContextManager[blip.Connection]]


class Peer:
    """A replicating peer over one store, proving ``identity``'s DID in hello.

    ``accept_push``: whether the passive side takes ``proposeChanges`` (§5: a sink may refuse
    pushes by policy). ``authorizer``: decides reads by peers other than the tenant (§5); by
    default a :class:`~p2psync.state.authz.ReadAuthorizer` over ``store``. ``max_data``:
    the largest record data this peer takes (default 100 MiB, §12); larger items are answered
    413, counted as ``DataTooLarge`` in the sync's results and logged, and never fetched.
    ``tls``: serve ``wss://`` with this certificate (None: plain ``ws://``). Either way, each
    connection's ``hello`` proofs sign its TLS channel (the server certificate's hash).
    ``quotas``: what the store takes through replication, per tenant and per pushing peer
    (:class:`~p2psync.state.quota.QuotaPolicy`; None: nothing bounded, as for the CLI's
    one-shot syncs); past one a push is refused (``507 TenantQuotaExceeded``, ``429
    PeerQuotaExceeded``) and a pull of ours stops with the same refusal.
    """

    def __init__(
        self,
        store: Store,
        identity: Identity,
        *,
        accept_push: bool = True,
        stores: Iterable[str] | None = None,
        authorizer: Any = None,
        max_unanswered_revs: int | None = None,
        max_data: int | None = None,
        quotas: QuotaPolicy | None = None,
        rng: random.Random | None = None,
        tls: TlsCertificate | None = None,
        verify_ahead: bool | str | None = None,
    ) -> None:
        self.store = store
        self.tls = tls
        self.identity = identity
        self.dwn = Dwn(store)
        self.ledger = Ledger.for_store(store)
        self.copies = CheckpointCopies(store)
        self.committer = GroupCommitter(store)
        self.store_id = store_id(store)
        self.accept_push = accept_push
        #: the tenants this peer stores (None: any); pushes for others are refused (403)
        self.stores = None if stores is None else frozenset(stores)
        self.authorizer = authorizer if authorizer is not None else ReadAuthorizer(store)
        self.quotas = None if quotas is None else Quotas(store, quotas)
        #: verifies the signatures of received batches on a second core, when asked to and there
        #: is one. Off unless ``verify_ahead`` (None: the environment's P2PSYNC_VERIFY_AHEAD=1):
        #: on a quiet two-core machine a 100,000-message pull took ~100 us more CPU a message
        #: with it and was no faster, the late part slower (the GIL's hand-overs grow with the
        #: SQLite calls that release it; docs/benchmarks.md, "Issue #17 at the end of 2026-11-25").
        # ``"process"`` (P2PSYNC_VERIFY_AHEAD=process): in a worker process instead of a thread.
        if verify_ahead is None:
            asked = os.environ.get("P2PSYNC_VERIFY_AHEAD", "")
            verify_ahead = "process" if asked == "process" else asked == "1"
        self.ahead: SignatureWorker | SignatureProcess | None = None
        if verify_ahead and second_core():
            self.ahead = SignatureProcess() if verify_ahead == "process" else SignatureWorker()
        self.service = StoreService(store, dwn=self.dwn, ledger=self.ledger, copies=self.copies,
                                    committer=self.committer, authorizer=self.authorizer, quotas=self.quotas,
                                    ahead=self.ahead)
        #: the messages some connection of this peer is receiving now: the others decline them
        #: (issue #17: each body crosses once per receiver)
        self.in_flight = InFlightClaims()
        self.max_unanswered_revs = max_unanswered_revs
        self.max_data = max_data
        self._rng = rng or random.Random()
        self._gates: set[RetryGate] = set()  # reconnect loops waiting out their backoff now
        self._retry_requests = 0
        self._sessions: weakref.WeakKeyDictionary[blip.Connection, PeerSession] = weakref.WeakKeyDictionary()
        self._served = 0  # connections served now (MAX_CONNECTIONS)
        self._unproven = 0  # of them, those whose hello has not ended (MAX_UNPROVEN_CONNECTIONS)
        self._unproven_from: Counter[str] = Counter()  # the same by remote address (MAX_UNPROVEN_PER_ADDRESS)
        #: Told of applies and missing dependencies (p2psync/node/metrics.py); set before serving.
        self.metrics: SyncObserver = NO_OBSERVER
        #: Where this peer's node listens, ``(port, tls)``, said in every hello (§3 ``listen``) so
        #: that a peer it dials can prompt it when that peer comes back; None: not serving.
        self.listen: tuple[int, bool] | None = None
        #: Called once the other side of a connection served here proved its hello, with that
        #: hello and the address it came from (p2psync/node: a peer is back; who dials us).
        self.on_inbound: Callable[[Hello, str | None], None] | None = None
        #: Messages that did not apply on any connection, here or at a peer we pushed to (the
        #: node's status lists the last ones), kept in the store with the next commit.
        self._not_applied_records = NotAppliedRecords(store)
        self.not_applied = self._not_applied_records.load()
        self._not_applied_unsaved = False  # a write of the list waits for another process's lock
        self.not_applied.listeners.append(lambda: self.committer.before_commit(self._keep_not_applied))
        self.settle_held()

    def _keep_not_applied(self, *, wait: bool = False) -> None:
        """Write the not-applied log with the open batch, or, with none open, now if the write
        lock is free: the event loop never sits in SQLite's busy handler for this record (when
        another process holds the lock, :meth:`tend_not_applied` or :meth:`save_not_applied`
        writes it later; ``wait``: wait for the lock as any write does). A failure is logged,
        never the batch's: the messages' own writes matter more than this record."""
        try:
            with contextlib.nullcontext() if wait else self.store.no_busy_wait():
                self._not_applied_records.save(self.not_applied)
        except apsw.BusyError:
            if wait:
                log.warning("the list of messages that did not apply was not saved: the store stayed locked")
            self._not_applied_unsaved = True
            return
        except (apsw.Error, errors.LocalFailure) as exc:
            log.warning("the list of messages that did not apply was not saved: %s", exc)
        self._not_applied_unsaved = False

    def save_not_applied(self) -> None:
        """Write the not-applied log now if a write of it was put off for another process's
        lock, waiting for the lock this time (a command's end, a node's stop)."""
        if self._not_applied_unsaved:
            self._keep_not_applied(wait=True)

    def settle_held(self) -> None:
        """Drop from the not-applied log the messages received here that the store holds now:
        applied since by a path that does not report to the log (a repair, another process on
        this store, a run of this store before a restart)."""
        history, log = self.dwn.history, self.not_applied
        listed = [(e.tenant, e.message_cid) for e in log.last if e.where == "here"]
        remembered = [(tenant, cid) for (cid, where), (tenant, _) in log.overflow.items() if where == "here"]
        for tenant, cid in listed + remembered:
            if history.holds(tenant, cid):
                log.settle(cid)

    def tend_not_applied(self) -> bool:
        """What a node does about once a second: :meth:`settle_held`, write the log if a write
        of it was put off, and empty the log (here and in the store) when another process asked
        (``status --clear-not-applied``). Returns whether it emptied it, the store's copy
        included: the node then writes its status and calls :meth:`answer_clear`, which tells
        the asker. None of it waits for another process's write lock; what finds it taken is
        done at a later look."""
        self.settle_held()
        if self._not_applied_unsaved:
            self._keep_not_applied()
        if not self._not_applied_records.clear_requested():
            return False
        self.not_applied.clear()
        self._keep_not_applied()  # with the open batch, if one is
        return not self._not_applied_unsaved

    def answer_clear(self) -> None:
        """Withdraw the request to clear (the asker stops waiting); if the lock is taken, the
        request stays and the next :meth:`tend_not_applied` clears (nothing) and answers again."""
        try:
            with self.store.no_busy_wait():
                self._not_applied_records.answer_clear()
        except apsw.BusyError:
            log.info("the request to clear the not-applied list is answered at the next look: the store is locked")

    # -- sessions ---------------------------------------------------------------------------

    def _new_session(self, active: bool, channel: str | None) -> PeerSession:
        extra: dict[str, Any] = {}
        if self.max_unanswered_revs is not None:
            extra["max_unanswered_revs"] = self.max_unanswered_revs
        if self.max_data is not None:
            extra["max_data"] = self.max_data
        proto = ReplicationProtocol(
            identity=self.identity, mine=new_hello(self.identity.did, self.store_id, AGENT, self.listen), active=active,
            accept_push=self.accept_push, stores=self.stores, observer=self.metrics, channel=channel,
            not_applied=self.not_applied, **extra,
        )
        return PeerSession(proto, self.service, self.in_flight)

    def session_for(self, conn: blip.Connection, active: bool) -> PeerSession:
        """The session of ``conn`` (made on first use)."""
        session = self._sessions.get(conn)
        if session is None:
            session = self._new_session(active, channel_binding(conn.server_certificate))
            session.attach(conn)
            self._sessions[conn] = session
        return session

    def handlers(self, *, active: bool) -> dict[str, Any]:
        """The BLIP handler table of one role (for ``blip.connect``/``accept_stream``)."""
        peer = self

        def make(profile: str) -> Any:
            async def handler(request: blip.Request) -> blip.Reply | None:
                session = peer.session_for(request.connection, active)
                result: blip.Reply | None = await session.handlers()[profile](request)
                return result

            return handler

        return {p: make(p) for p in ALL_PROFILES}

    async def _on_connect(self, conn: blip.Connection) -> None:
        address = conn.remote_address or ""
        if (self._served >= MAX_CONNECTIONS or self._unproven >= MAX_UNPROVEN_CONNECTIONS
                or self._unproven_from[address] >= MAX_UNPROVEN_PER_ADDRESS):
            # Over the caps (issue #15): close at once, before any hello work; 1013 "try
            # again later" tells an honest peer to back off.
            log.warning("refusing a connection from %s: %d open, %d not yet proven (%d from there)", address or "?",
                        self._served, self._unproven, self._unproven_from[address])
            await conn.aclose(code=1013, reason="P2PSync 503 TooManyConnections")
            return
        # §3: the passive sends its hello at once too (both cross in one round trip).
        session = self.session_for(conn, active=False)
        self._served += 1
        self._unproven += 1
        self._unproven_from[address] += 1
        conn.start_soon(self._serve_connection, conn, session, address)

    async def _serve_connection(self, conn: blip.Connection, session: PeerSession, address: str) -> None:
        """Keep the connection caps' counts: unproven until hello ends (either way), open until
        the connection does (this task is cancelled when it closes)."""
        unproven = True

        def proven() -> None:
            self._unproven -= 1
            self._unproven_from[address] -= 1
            if not self._unproven_from[address]:
                del self._unproven_from[address]

        try:
            await session.hello_quietly()
            proven()
            unproven = False
            theirs = session.theirs
            if session.proto.hello_ok and theirs is not None and self.on_inbound is not None:
                self.on_inbound(theirs, conn.remote_address)
            await conn.wait_closed()
        finally:
            if unproven:
                proven()
            self._served -= 1

    # -- passive ----------------------------------------------------------------------------

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[blip.BlipServer] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the passive role until cancelled (``server = await nursery.start(peer.serve, ...)``)."""
        # Hello-sized limits from the first frame: on_connect (which attaches the session) may
        # run after the reader has taken the first read.
        await blip.serve(host, port, APP_ID, self.handlers(active=False), on_connect=self._on_connect,
                         tls=self.tls, max_message_size=PRE_HELLO_MAX_MESSAGE,
                         gather_budget=blip.GatherBudget(SERVED_GATHER_BYTES), task_status=task_status)

    # -- active -----------------------------------------------------------------------------

    def retry_now(self) -> None:
        """Wake every reconnect loop that is waiting out its backoff (an operator's "sync now");
        a loop whose round is failing right now skips its next wait."""
        self._retry_requests += 1
        for gate in list(self._gates):
            gate.now()

    def _connector(self, target: str | Connector) -> Connector:
        return dialer(target) if isinstance(target, str) else target

    async def sync(
        self,
        target: str | Connector,
        *,
        tenant: str,
        scope: SyncScope | None = None,
        direction: Direction_ = "pull",
        continuous: bool = False,
        on_progress: Callable[[SyncProgress], None] | None = None,
        grants: list[dict[str, Any]] | None = None,
        batch: int = DEFAULT_BATCH,
        stop: trio.Event | None = None,
        gate: RetryGate | None = None,
    ) -> SyncSummary:
        """Replicate one collection with the peer at ``target`` (a ``ws://`` URL, or a connector
        taking a handler table and yielding a running :class:`blip.Connection`).

        One-shot (default): returns when every direction has caught up and the checkpoints are
        saved; a connection lost mid-way is retried (from the saved frontier) up to
        :data:`ONE_SHOT_ATTEMPTS` times. Continuous: runs until cancelled, reconnecting with
        backoff. Raises :class:`PeerError` for refusals (403, a failed hello: ``HelloFailed``).
        ``stop`` (a graceful stop, p2psync/node): once set, a connected round ends both
        directions, saves the checkpoint pair on both sides and returns; a failed round raises
        instead of retrying. A sync waiting out its backoff does not watch it (cancel that one).
        ``gate``: what a continuous sync waits on between attempts (its schedule, and whoever
        hears that the peer is back ends the wait early; p2psync/node); by default a gate of
        its own with the ledger's schedule.
        """
        if direction not in ("pull", "push", "both"):
            raise errors.LocalMisuse("direction must be pull, push or both")
        scope = scope or SyncScope.global_scope()
        connect = self._connector(target)
        gate = gate if gate is not None else RetryGate(rng=self._rng)
        started = time.monotonic()
        attempt = 0
        totals: dict[str, SyncStats] = {}
        while True:
            attempt += 1
            requests = self._retry_requests
            round_ = _Round(self, connect, tenant, scope, direction, continuous, on_progress, grants or [], batch,
                            totals, stop=stop)
            try:
                summary = await round_.run()
            except (PeerError, blip.ConnectionClosed, OSError) as exc:
                retryable = is_retryable(exc)
                if round_.key is not None:
                    self.ledger.record_failure(round_.key, error_name(exc))
                stopping = stop is not None and stop.is_set()
                # A refusal that says when to come back (a spent push budget: up to its window)
                # is waited out by a continuous sync; a one-shot one reports a long one instead.
                after = retry_after(exc)
                too_long = after is not None and after > ONE_SHOT_MAX_WAIT
                if not retryable or (not continuous and (attempt >= ONE_SHOT_ATTEMPTS or too_long)) or stopping:
                    raise
                failures = self.ledger.link(round_.key).failure_count if round_.key is not None else attempt
                delay = gate.delay(failures)
                if after is not None:
                    delay = max(delay, float(after))
                # a URL when one is known, never a function's repr
                label = round_.remote or (target if isinstance(target, str) else getattr(target, "url", "the peer"))
                log.info("sync with %s: %s; retrying in %.1f s", label, exc, delay)
                if self._retry_requests == requests:
                    self._gates.add(gate)
                    try:
                        await gate.wait(delay)
                    finally:
                        self._gates.discard(gate)
                continue
            summary.seconds = time.monotonic() - started
            summary.rounds = attempt
            return summary

    async def fetch_messages(
        self,
        target: str | Connector,
        *,
        tenant: str,
        cids: Iterable[Any],
        scope: SyncScope | None = None,
        on_progress: Callable[[RepairProgress], None] | None = None,
    ) -> RepairSummary:
        """Fetch these message CIDs of ``tenant`` from the peer at ``target`` and admit each
        through the closure loop, as a pull would (a reconcile plan's repair; see
        :mod:`p2psync.peer.repair`). ``cids``: CID strings, :class:`WantedMessage` objects or
        plan rows. Returns a :class:`RepairSummary` with one outcome per distinct CID."""
        return await fetch_messages(self, self._connector(target), tenant=tenant, cids=cids, scope=scope,
                                    on_progress=on_progress)

    async def reconcile(
        self,
        target: str | Connector,
        *,
        tenant: str,
        scope: SyncScope | None = None,
        repair: bool = False,
        direction: Direction_ = "both",
        on_progress: Callable[[RepairProgress], None] | None = None,
        definitions: bool = True,
    ) -> ReconcileSummary:
        """Anti-entropy with the peer at ``target``: what each replica holds of ``tenant``'s
        messages in ``scope`` that the other lacks, and with ``repair`` fetch (pull) and hand
        over (push) exactly those (:mod:`p2psync.peer.anti_entropy`), and the definitions newer
        ones replaced, which the sets leave out (``definitions`` False: only when the sets
        differed, for a periodic check whose equal sets must stay one round trip)."""
        if direction not in ("pull", "push", "both"):
            raise errors.LocalMisuse("direction must be pull, push or both")
        return await reconcile_with(
            self, self.service.sketches, self._connector(target), tenant=tenant, scope=scope, repair=repair,
            pull=direction in ("pull", "both"), push=direction in ("push", "both"), on_progress=on_progress,
            definitions=definitions,
        )


class _Dialer:
    """What :func:`dialer` returns: a connector that knows its URL (for log lines)."""

    def __init__(self, url: str, pin: str | None) -> None:
        self.url = url
        self.pin = pin

    def __call__(self, handlers: dict[str, Any]) -> AbstractAsyncContextManager[blip.Connection]:
        return blip.connect(self.url, app_id=APP_ID, handlers=handlers, pin=self.pin,
                            max_message_size=PRE_HELLO_MAX_MESSAGE)

    def __repr__(self) -> str:
        return self.url


def dialer(url: str, *, pin: str | None = None) -> Connector:
    """A connector to the peer at ``url`` (``wss://`` or ``ws://``), for :meth:`Peer.sync` and
    the other active calls; ``pin``: the fingerprint the server's TLS certificate must have."""
    return _Dialer(url, pin)


class _Round:
    """One connection of an active sync: the protocol's :class:`SyncRound` over a real
    connection, with the timers it needs (the periodic save, the stall watchdog, the stop)."""

    def __init__(
        self,
        peer: Peer,
        connect: Connector,
        tenant: str,
        scope: SyncScope,
        direction: Direction_,
        continuous: bool,
        on_progress: Callable[[SyncProgress], None] | None,
        grants: list[dict[str, Any]],
        batch: int,
        totals: dict[str, SyncStats],
        *,
        stop: trio.Event | None = None,
    ) -> None:
        self.peer = peer
        self.stop = stop
        self.connect = connect
        self.tenant = tenant
        self.scope = scope
        self.pull = direction in ("pull", "both")
        self.push = direction in ("push", "both")
        self.continuous = continuous
        self.on_progress = on_progress
        self.grants = grants
        self.batch = batch
        self.totals = totals
        self.session: PeerSession | None = None
        self.round: SyncRound | None = None
        self._activity = trio.current_time()

    @property
    def key(self) -> LinkKey | None:
        return None if self.round is None else self.round.key

    @property
    def remote(self) -> str | None:
        return None if self.round is None else self.round.remote

    async def run(self) -> SyncSummary:
        """One connection: hello, then the round with its timers beside it, then close."""
        async with self.connect(self.peer.handlers(active=True)) as conn:
            session = self.session = self.peer.session_for(conn, active=True)
            await session.hello()
            operation, self.round = session.proto.sync(
                tenant=self.tenant, scope=self.scope, local_store_id=self.peer.store_id, pull=self.pull,
                push=self.push, continuous=self.continuous, batch=self.batch, grants=self.grants, totals=self.totals,
                on_progress=self._progress,
            )
            try:
                async with trio.open_nursery() as nursery:
                    done = trio.Event()
                    nursery.start_soon(self._saver, session, done)
                    if not self.continuous:
                        nursery.start_soon(self._watchdog, done)
                    if self.stop is not None:
                        nursery.start_soon(self._stop_watch, session, self.stop, done)
                    try:
                        await session.run(operation)
                    finally:
                        done.set()
            except BaseExceptionGroup as group:
                raise _first_cause(group) from None
            await conn.aclose()
        return self._summary()

    def _summary(self) -> SyncSummary:
        assert self.round is not None and self.key is not None and self.remote is not None
        ledger = self.peer.ledger
        pull_cp, _ = ledger.get_checkpoint(self.key, Direction.PULL)
        push_cp, _ = ledger.get_checkpoint(self.key, Direction.PUSH)
        return SyncSummary(
            self.tenant, self.remote, self.totals.get("pull"), self.totals.get("push"),
            {"pull": pull_cp.to_wire(), "push": push_cp.to_wire()}, self.round.copy_rev,
            state=str(ledger.link(self.key).state),
        )

    # -- timers ---------------------------------------------------------------------------------

    async def _saver(self, session: PeerSession, done: trio.Event) -> None:
        """§4.4 cadence: save the pair every CHECKPOINT_INTERVAL while the round runs."""
        while not done.is_set():
            with trio.move_on_after(CHECKPOINT_INTERVAL):
                await done.wait()
            if not done.is_set() and self.round is not None and not self.round.finishing:
                await session.run(session.proto.save(self.round))

    async def _stop_watch(self, session: PeerSession, stop: trio.Event, done: trio.Event) -> None:
        """On ``stop``: the round ends its directions, saves the pair and returns, as at the end
        of a one-shot round. Ends by itself when the round does."""
        async with trio.open_nursery() as watch:

            async def round_over() -> None:
                await done.wait()
                watch.cancel_scope.cancel()

            watch.start_soon(round_over)
            await stop.wait()
            if self.round is not None:
                self.round.stop()
                session.pump()
            watch.cancel_scope.cancel()

    async def _watchdog(self, done: trio.Event) -> None:
        while not done.is_set():
            with trio.move_on_after(STALL_TIMEOUT / 4):
                await done.wait()
            if not done.is_set() and trio.current_time() - self._activity > STALL_TIMEOUT:
                raise PeerError(503, "Stalled", f"nothing moved for {STALL_TIMEOUT:.0f} s")

    def _progress(self, direction: Literal["pull", "push"]) -> None:
        self._activity = trio.current_time()
        if self.on_progress is None or self.round is None:
            return
        stats = self.totals.get(direction)
        if stats is None:
            return
        sink, source = self.round.sink, self.round.source
        position = None
        if direction == "pull" and sink is not None and sink.window.last is not None:
            position = sink.window.last.position
        elif direction == "push" and source is not None:
            position = source.position
        moved = stats.bytes_received if direction == "pull" else stats.bytes_sent
        self.on_progress(SyncProgress(direction, stats.revs_settled + stats.items_skipped, moved, stats.items_offered,
                                      stats.latest, position))


def _first_cause(group: BaseExceptionGroup[Any]) -> BaseException:
    """The exception to report from a failed round: a refusal before a lost connection."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for kind in (PeerError, blip.ConnectionClosed):
        for leaf in leaves:
            if isinstance(leaf, kind) and not (isinstance(leaf, PeerError) and leaf.name == "ConnectionLost"):
                return leaf
    return leaves[0]
