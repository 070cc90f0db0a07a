"""The long-running node: serve, advertise, and keep continuous sync with the right peers.

``Node(config, store, identity)`` runs, until :meth:`Node.stop` (a graceful stop) or
cancellation (an abrupt one):

- the passive side (``Peer.serve``) on the configured address;
- discovery (when on): advertises this node and watches for others;
- one continuous sync (*link*) per wanted (remote node, tenant, scope), as decided by
  :func:`~p2psync.node.links.plan_links`; each link reconnects with its own backoff (the
  peer's, per ledger link) and, when the peer refuses or cannot be reached at all, the node's
  (per node link, :data:`LINK_RETRY_CAP` at most);
- beside each link, once a round of it has caught up, a periodic anti-entropy check
  (``Peer.reconcile`` with repair, in the link's direction, on a connection of its own) that
  finds and moves what the log sync missed (p2psync/node/anti_entropy.py);
- the metrics endpoint (when a port is configured);
- a status file (when a path is given) that ``p2psync peers`` reads.

Each link's state (:func:`~p2psync.node.links.link_state`: ``live`` only while connected and
caught up) is shown the same way by the status file, ``status``, ``peers`` and the metrics.
A peer that comes back is dialed again within a second whatever its backoff had reached: an
inbound connection from it, or its mDNS advert, ends the wait of the links to it
(:class:`~p2psync.peer.retry.RetryGate`, with jitter). The node remembers where the nodes that
dial it listen (their hello says, §3 ``listen``; the callers file) and at start dials each once,
so that a device that was away prompts the peers that dial it.

A graceful stop leaves discovery (peers notice at once), asks every connected link to end its
round (it saves the checkpoint pair on both sides, as a one-shot sync does at its end), cancels
the others, stops serving, commits what the group committer holds and returns. The store stays
open: its owner closes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import trio

from p2psync import blip, errors
from p2psync.blip.tls import TlsCertificate, fingerprint, new_certificate
from p2psync.dwn.did import Identity
from p2psync.dwn.store import Store
from p2psync.node.anti_entropy import (
    CHECK_TIMEOUT,
    AntiEntropySchedule,
    AntiEntropyStatus,
    CheckResult,
    check_result,
)
from p2psync.node.config import NodeConfig, TenantConfig
from p2psync.node.discovery_api import (
    AUTO_CAPABILITY,
    AdvertInfo,
    DiscoveryFactory,
    DiscoveryLike,
    PeerSeenLike,
    zeroconf_discovery,
)
from p2psync.node.links import (
    SILENT_AFTER,
    LinkSpec,
    NodeLinkKey,
    NodeLinkState,
    link_state,
    plan_links,
    scope_name,
)
from p2psync.node.metrics import LinkView, NodeMetrics, scope_label, serve_metrics
from p2psync.peer.endpoint import peer_url, plain_ws_refused
from p2psync.peer.peer import Peer
from p2psync.peer.retry import RetryGate, ledger_schedule
from p2psync.peer.session import PRE_HELLO_MAX_MESSAGE
from p2psync.replication.hello import Hello
from p2psync.replication.wire import APP_ID
from p2psync.state.committer import StoreUnavailable
from p2psync.state.ledger import LinkKey, LinkNotFound, LinkState, retry_delay

__all__ = [
    "ANNOUNCE_TIMEOUT", "CALLERS_FILE", "GONE_GRACE", "LINK_RETRY_CAP", "SHUTDOWN_GRACE", "Node", "NodeError",
    "NodeLink", "peer_json",
]

log = logging.getLogger("p2psync.node")

#: How long a discovered peer that left keeps its links. mDNS says "gone" on a goodbye packet
#: or when its records expire; a node restarting (a few seconds) or a laptop roaming between
#: access points says goodbye and comes back well within a minute, and its links then keep
#: their connection state and backoff instead of starting over. Past it, a peer that really
#: left stops costing reconnect attempts. Ours.
GONE_GRACE: Final = 60.0
#: How long a graceful stop waits for connected links to save their checkpoints and close:
#: a save is one `setCheckpoint` round trip after a commit, milliseconds on a LAN; 5 s leaves
#: room for a slow disk or a busy peer and still stops before a service manager's SIGKILL
#: (systemd waits 90 s by default).
SHUTDOWN_GRACE: Final = 5.0
#: Between two looks at what links are wanted, with nothing happening (a static link's store id
#: learned from its hello, a passive connection from a peer arriving). Ours: cheap, and soon.
RECONCILE_INTERVAL: Final = 1.0
#: The node's own backoff after a link's sync gave up (a refusal, a failed hello, a peer not
#: a p2psync node): the ledger's schedule (1 s doubling), capped at 5 minutes like it.
LINK_RETRY_CAP: Final = retry_delay(1_000).total_seconds()
#: The status file is rewritten at most this often (it changes with every link state change).
STATUS_INTERVAL: Final = 1.0
#: The file, beside the status file, where a node keeps where the nodes that dial it listen.
CALLERS_FILE: Final = "callers.json"
#: How long the "I'm back" connection to one caller may take (dial, TLS, hello) at start: a
#: LAN peer answers in milliseconds; one that is away costs a connect timeout. Ours.
ANNOUNCE_TIMEOUT: Final = 10.0


class NodeError(errors.LocalFailure):
    """The node cannot start (``code``: ``ListenFailed``, ``MetricsListenFailed``); one line."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(detail)


class PlainTransportRefused(errors.LocalFailure):
    """A link would dial plain ``ws://`` beyond loopback and the node is not ``insecure``."""


@dataclass(eq=False)
class NodeLink:
    """A link the node supervises: its spec, the connection of its current round, and its
    failures. (The ledger's :class:`~p2psync.state.ledger.Link` is the replication state of
    the same link: its row, by tenant, remote DID and scope.)"""

    spec: LinkSpec
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    stop: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    conn: blip.Connection | None = None
    remote_sid: str | None = None
    failures: int = 0  # consecutive failed attempts; 0 again once a round has caught up
    last_error: str | None = None
    last_exc: BaseException | None = field(default=None, repr=False)
    connections: int = 0  # connections its rounds opened
    caught_up_on: int = 0  # the last of them whose round caught up (0: none yet)
    #: set (and replaced) whenever a round on a new connection catches up: wakes anti-entropy
    caught_up: trio.Event = field(default_factory=trio.Event)
    anti_entropy: AntiEntropyStatus = field(default_factory=AntiEntropyStatus)
    ae_failure: str | None = None  # the last anti-entropy failure's line, logged once
    #: its backoff between attempts (the peer's reconnect loop and the node's both wait on it)
    gate: RetryGate = field(default_factory=RetryGate)
    remote_did: str | None = None  # the peer's DID, from its hello or its advert

    @property
    def ledger_remote(self) -> str | None:
        """The remote as the ledger names it (``DID?storeId=…``), once both are known."""
        if self.remote_did is None or self.remote_sid is None:
            return None
        return f"{self.remote_did}?storeId={self.remote_sid}"

    def next_attempt_in(self) -> float | None:
        """Seconds until its next attempt while it waits out its backoff (None otherwise)."""
        until = self.gate.until
        return None if until is None else max(until - trio.current_time(), 0.0)

    def to_json(self, state: NodeLinkState) -> dict[str, Any]:
        spec = self.spec
        certificate = None if self.conn is None else self.conn.server_certificate
        next_in = self.next_attempt_in()
        next_at = None if next_in is None else (datetime.now(UTC) + timedelta(seconds=next_in)).isoformat()
        return {"peer": spec.label, "url": spec.url, "origin": spec.origin, "tenant": spec.tenant,
                "scope": scope_label(spec.scope), "scopeName": scope_name(spec.scope), "scopeId": spec.scope.scope_id,
                "direction": spec.direction,
                "state": state, "connected": self.conn is not None, "storeId": self.remote_sid,
                "remote": self.ledger_remote, "failures": self.failures, "nextAttemptAt": next_at,
                "pin": spec.pin, "fingerprint": None if certificate is None else fingerprint(certificate),
                "lastError": self.last_error, "antiEntropy": self.anti_entropy.to_json()}


@dataclass
class _Seen:
    peer: PeerSeenLike
    gone_at: float | None = None  # trio time of its PeerGone; None while present


class Node:
    """A p2psync node over ``store`` proving ``identity`` (see the module doc); it runs once.

    ``discovery``: builds the discovery service (default: mDNS, p2psync.discovery); only
    called when the configuration turns discovery on. ``status_path``: where to keep the
    status file. ``gone_grace``: :data:`GONE_GRACE` (tests shorten it). ``callers_path``: where to
    keep where the nodes that dial this one listen (None: in memory only, nobody prompted at
    start). ``retry_schedule``: a link's backoff in seconds after n failures (default: the
    ledger's, 1 s doubling up to 5 minutes; tests make it grow fast).
    """

    def __init__(
        self,
        config: NodeConfig,
        store: Store,
        identity: Identity,
        *,
        discovery: DiscoveryFactory | None = None,
        status_path: Path | None = None,
        gone_grace: float = GONE_GRACE,
        shutdown_grace: float = SHUTDOWN_GRACE,
        rng: random.Random | None = None,
        tls: TlsCertificate | None = None,
        callers_path: Path | None = None,
        retry_schedule: Callable[[int], float] = ledger_schedule,
    ) -> None:
        config.check()  # a NodeConfig built by hand, not by load_config, is checked here
        self.config = config
        #: the certificate it serves wss:// with (None: plain ws://); without one given, a node
        #: that serves TLS makes a fresh one (its fingerprint then changes at every start)
        self.tls = (tls or new_certificate()) if config.tls_enabled else None
        self.store = store
        self.identity = identity
        self.tenants: tuple[TenantConfig, ...] = config.tenants_for(identity.did)
        # A node stores its configured tenants and nothing else (issue #15): a stranger who
        # proves some DID cannot push another tenant's messages into its store; and of those,
        # no more than their quotas, nor more than a pusher's budget (p2psync/state/quota.py).
        self.peer = Peer(store, identity, stores={t.did for t in self.tenants if t.did is not None}, tls=self.tls,
                         quotas=config.quota_policy(self.tenants))
        self.metrics = NodeMetrics(self.peer.ledger, node_facts=self._facts, link_view=self._link_view)
        self.peer.metrics = self.metrics
        self.peer.on_inbound = self._on_inbound
        self.store_id = self.peer.store_id
        self.status_path = status_path
        self.gone_grace = gone_grace
        self.shutdown_grace = shutdown_grace
        self._discovery_factory = discovery
        self._rng = rng or random.Random()
        self.callers_path = callers_path
        self.retry_schedule = retry_schedule
        #: store id -> where that node listens, for the nodes that dialed this one (CALLERS_FILE)
        self.callers: dict[str, dict[str, Any]] = _read_callers(callers_path)
        self.announced = 0  # callers told at start that this node is back
        self.server: blip.BlipServer | None = None
        self.url: str | None = None
        self.metrics_port: int | None = None
        self.discovery: DiscoveryLike | None = None
        self.links: dict[NodeLinkKey, NodeLink] = {}
        self.seen: dict[str, _Seen] = {}
        self.static_sids: dict[str, str] = {}  # url -> store id learned from hello
        self.stopped_links = 0  # links that ended their round with checkpoints saved, at stop
        self._stop = trio.Event()
        self._wake = trio.Event()
        self._retiring: set[NodeLink] = set()
        self._link_nursery: trio.Nursery | None = None
        self._server_scope = trio.CancelScope()
        self._served = trio.Event()
        self._discovery_scope = trio.CancelScope()
        self._status_dirty = True
        self._started_at = datetime.now(UTC)
        self.peer.not_applied.listeners.append(self._on_not_applied)

    # -- public -------------------------------------------------------------------------------

    @property
    def did(self) -> str:
        return self.identity.did

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_port is None:
            return None
        host = self.config.metrics_host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.metrics_port}/metrics"

    def stop(self) -> None:
        """Ask for a graceful stop (:meth:`run` returns once done)."""
        self._stop.set()

    def discovered(self) -> list[PeerSeenLike]:
        """Discovered peers, present or within their grace period."""
        return [s.peer for s in self.seen.values()]

    def status(self) -> dict[str, Any]:
        """What the status file holds: this node, the peers it sees and its links."""
        now = trio.current_time()
        return {
            "pid": os.getpid(),
            "did": self.did,
            "storeId": self.store_id,
            "url": self.url,
            "fingerprint": None if self.tls is None else self.tls.fingerprint,
            "metrics": self.metrics_url,
            "startedAt": self._started_at.isoformat(),
            "updatedAt": datetime.now(UTC).isoformat(),
            "peers": [dict(peer_json(s.peer), goneFor=None if s.gone_at is None else round(now - s.gone_at, 1))
                      for s in self.seen.values()],
            "links": [link.to_json(self.link_state(link)) for link in self.links.values()],
            # messages that did not apply, on any connection (issue #16): the last ones, and how many
            "notApplied": self.peer.not_applied.to_json(),
        }

    def link_state(self, link: NodeLink) -> NodeLinkState:
        """``link``'s state now (:func:`~p2psync.node.links.link_state`)."""
        self._learn_from_round(link)
        conn = link.conn
        connected = conn is not None
        return link_state(
            running=True, connected=connected, caught_up=connected and link.caught_up_on == link.connections,
            repairing=connected and self._ledger_state(link) == LinkState.REPAIRING,
            waiting=link.gate.until is not None,
            silent=conn is not None and trio.current_time() - conn.last_receive > SILENT_AFTER,
        )

    def _ledger_state(self, link: NodeLink) -> LinkState | None:
        remote = link.ledger_remote
        if remote is None:
            return None
        try:
            return self.peer.ledger.link(LinkKey(link.spec.tenant, remote, link.spec.scope.scope_id)).state
        except LinkNotFound:
            return None

    def _link_view(self) -> LinkView:
        """Each running link's state and failures, by the ledger's (tenant, remote, scopeId) when
        known, else by the node's remote name (for the metrics: the same as ``status``)."""
        return {(link.spec.tenant, link.ledger_remote or link.spec.remote, link.spec.scope.scope_id):
                (self.link_state(link), link.failures, scope_label(link.spec.scope))
                for link in self.links.values()}

    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the node until :meth:`stop` (graceful) or cancellation; reports itself once it
        listens. Raises :class:`NodeError` when it cannot listen."""
        try:
            async with trio.open_nursery() as nursery:
                await self._start(nursery)
                task_status.started(self)
                await self._stop.wait()
                await self._shutdown()
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            alone: BaseException = group
            while isinstance(alone, BaseExceptionGroup) and len(alone.exceptions) == 1:
                alone = alone.exceptions[0]
            if isinstance(alone, NodeError):
                raise alone from None
            raise
        finally:
            self.metrics.close()
            if self.status_path is not None:
                with contextlib.suppress(OSError):
                    self.status_path.unlink()

    # -- start ----------------------------------------------------------------------------------

    async def _start(self, nursery: trio.Nursery) -> None:
        config = self.config
        try:
            self.server = await nursery.start(self._serve)
        except OSError as exc:
            raise NodeError("ListenFailed", f"cannot listen on {config.host}:{config.port}: "
                                            f"{exc.strerror or exc}") from None
        assert self.server is not None
        self.url = peer_url(config.host, self.server.port, tls=self.tls is not None)
        self.peer.listen = (self.server.port, self.tls is not None)
        if config.metrics_port is not None:
            try:
                self.metrics_port = await nursery.start(serve_metrics, self.metrics, config.metrics_host,
                                                        config.metrics_port)
            except OSError as exc:
                raise NodeError("MetricsListenFailed", f"cannot serve metrics on {config.metrics_host}:"
                                                       f"{config.metrics_port}: {exc.strerror or exc}") from None
        self._link_nursery = await nursery.start(_hold_nursery)
        if config.discovery_enabled:
            await nursery.start(self._run_discovery)
        nursery.start_soon(self._reconciler)
        if self.status_path is not None:
            nursery.start_soon(self._status_writer)
        for sid, caller in list(self.callers.items()):
            nursery.start_soon(self._announce, sid, caller)

    async def _serve(self, *, task_status: trio.TaskStatus[blip.BlipServer] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._server_scope:
                await self.peer.serve(self.config.host, self.config.port, task_status=task_status)
        finally:
            self._served.set()

    def advert(self) -> AdvertInfo:
        """What discovery announces about this node."""
        assert self.server is not None
        return AdvertInfo(
            did=self.did, sid=self.store_id, port=self.server.port,
            tenants=tuple(t.did for t in self.tenants if t.did is not None), private=self.config.private,
            name=self.config.name, capabilities=(AUTO_CAPABILITY,) if self.config.auto else (),
            fingerprint=None if self.tls is None else self.tls.fingerprint,
        )

    async def _run_discovery(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        factory = self._discovery_factory
        if factory is None:
            factory = zeroconf_discovery
        try:
            discovery = self.discovery = factory(self.advert(), self.config.discovery_interfaces())
        except Exception as exc:  # DiscoveryError: an advert that cannot be published
            raise NodeError("DiscoveryFailed", f"cannot advertise this node: {exc}") from None
        started = False
        try:
            with self._discovery_scope:
                async with trio.open_nursery() as nursery:
                    events = discovery.subscribe()
                    try:
                        await nursery.start(discovery.run)
                    except Exception as exc:  # DiscoveryError BindFailed, OSError
                        raise NodeError("DiscoveryFailed", f"cannot start discovery: {exc} "
                                                           "(or run with --no-discovery)") from None
                    started = True
                    task_status.started()
                    while True:
                        for seen in _listed(discovery.peers()):
                            self._on_seen(seen)
                        async with events:
                            async for event in events:
                                if isinstance(event, PeerSeenLike):
                                    self._on_seen(event)
                                else:
                                    self._on_gone(event.sid)
                        # The channel ends when we fell too far behind: re-read the table, go on.
                        await trio.sleep(0)
                        events = discovery.subscribe()
        except Exception as exc:
            if not started:
                raise
            # Serving and static peers go on without it; say so once, loudly.
            log.error("discovery stopped: %s; static peers and incoming connections go on", exc)
            self.seen.clear()
            self._poke()

    def _on_seen(self, peer: PeerSeenLike) -> None:
        if peer.sid == self.store_id:
            return  # our own advert
        known = self.seen.get(peer.sid)
        if known is None:
            log.info("found %s (%s) at %s", peer.name, peer.did, peer.url())
        self.seen[peer.sid] = _Seen(peer)
        if known is None or known.gone_at is not None or known.peer.url() != peer.url():
            self._peer_back(peer.sid, f"{peer.name} advertises itself")  # came (back), or restarted elsewhere
        self._poke()

    def _on_gone(self, sid: str) -> None:
        known = self.seen.get(sid)
        if known is not None and known.gone_at is None:
            log.info("%s left; its links end in %.0f s unless it comes back", known.peer.name, self.gone_grace)
            known.gone_at = trio.current_time()
            self._poke()

    def _poke(self) -> None:
        self._status_dirty = True
        self._wake.set()

    # -- a peer comes back ------------------------------------------------------------------------

    def _peer_back(self, sid: str, why: str) -> None:
        """The node ``sid`` is back (``why``): the links to it waiting out a backoff try again
        within :data:`~p2psync.peer.retry.BACK_JITTER`. A static link that has not reached its
        peer yet in this run may be that node too (its store id is learned at hello): it tries."""
        for link in self.links.values():
            maybe = link.remote_sid == sid or (link.remote_sid is None and link.spec.origin == "static")
            if maybe and link.gate.peer_back():
                log.info("%s: retrying the link to %s now (it was waiting out its backoff)", why, link.spec.label)
                self._status_dirty = True

    def _on_inbound(self, hello: Hello, address: str | None) -> None:
        """A node proved its hello on a connection to us: it is up (its links from here try
        again at once), and if it says where it listens, remember it (to prompt it at our start)."""
        self._peer_back(hello.store_id, f"{hello.did} connected")
        if hello.listen is None or address is None:
            return
        port, tls = hello.listen
        caller = {"did": hello.did, "url": peer_url(address, port, tls=tls)}
        if self.callers.get(hello.store_id) != caller:
            self.callers[hello.store_id] = caller
            if self.callers_path is not None:
                _write_json(self.callers_path, self.callers)

    async def _announce(self, sid: str, caller: dict[str, Any]) -> None:
        """Tell a node that dialed us before that we are back: one connection that proves
        hello and closes; its node then ends the backoff of its links to us (:meth:`_on_inbound`
        on its side). Once, at start; a caller that is away is not retried."""
        url = caller.get("url")
        if not isinstance(url, str) or (plain_ws_refused(url) is not None and not self.config.insecure):
            return
        try:
            with trio.fail_after(ANNOUNCE_TIMEOUT):
                async with blip.connect(url, app_id=APP_ID, handlers=self.peer.handlers(active=True),
                                        max_message_size=PRE_HELLO_MAX_MESSAGE) as conn:
                    session = self.peer.session_for(conn, active=True)
                    await session.hello()
                    theirs = session.theirs
                    if theirs is None or theirs.store_id != sid:
                        log.info("%s is no longer the node that dialed us (%s); forgetting it", url, sid)
                        self.callers.pop(sid, None)
                        if self.callers_path is not None:
                            _write_json(self.callers_path, self.callers)
                        return
                    await conn.aclose()
        except Exception as exc:  # away, refused, another node there now: say so, go on
            log.info("could not tell %s that this node is back: %s", url, _failure_line(exc, url) or exc)
            return
        self.announced += 1
        log.info("told %s that this node is back", url)

    # -- links ------------------------------------------------------------------------------------

    async def _reconciler(self) -> None:
        while True:
            self._reconcile()
            self._wake = trio.Event()
            with trio.move_on_after(self._next_look()):
                await self._wake.wait()

    def _next_look(self) -> float:
        now = trio.current_time()
        delay = RECONCILE_INTERVAL
        for seen in self.seen.values():
            if seen.gone_at is not None:
                delay = min(delay, max(0.0, seen.gone_at + self.gone_grace - now))
        return delay

    def _dialing_us(self) -> dict[str, set[tuple[str, str]]]:
        """Collections other nodes run with us from their side (their hello names them)."""
        out: dict[str, set[tuple[str, str]]] = {}
        for conn in list(self.server.connections if self.server is not None else ()):
            session = self.peer.session_for(conn, active=False)
            if session.theirs is None:
                continue
            for coll in session.collections:
                if coll is not None:
                    out.setdefault(session.theirs.store_id, set()).add((coll.tenant, coll.scope.scope_id))
        return out

    def _reconcile(self) -> None:
        """Start the links wanted and not running; retire those running and no longer wanted."""
        if self._stop.is_set():
            return  # stopping: the links are being ended, none may start
        self._forget_gone_peers()
        for link in self.links.values():
            self._learn_from_round(link)
        wanted = plan_links(
            self.tenants, self.config.peers, [s.peer for s in self.seen.values()], own_sid=self.store_id,
            auto=self.config.auto, static_sids=frozenset(self.static_sids.values()), dialing_us=self._dialing_us(),
        )
        self._retire_unwanted(wanted)
        for key, spec in wanted.items():
            if key not in self.links:
                self._start_link(spec)

    def _forget_gone_peers(self) -> None:
        """Drop the discovered peers whose grace after leaving is over (their links go next)."""
        now = trio.current_time()
        for sid, seen in list(self.seen.items()):
            if seen.gone_at is not None and now >= seen.gone_at + self.gone_grace:
                del self.seen[sid]
                self._status_dirty = True

    def _learn_from_round(self, link: NodeLink) -> None:
        """What ``link``'s connected round tells: a static peer's store id (from its hello), and
        that the link is healthy again once a feed caught up (its failures start over)."""
        if link.conn is None:
            return
        session = self.peer.session_for(link.conn, active=True)
        if link.spec.origin == "static" and link.remote_sid is None and session.theirs is not None:
            link.remote_sid = self.static_sids[link.spec.url] = session.theirs.store_id
        if session.theirs is not None and session.proto.hello_ok:
            link.remote_did = session.theirs.did
        feeds = [s.caught_up for s in session.sinks.values()] + [s.caught_up for s in session.sources.values()]
        if link.failures and any(feeds):
            link.failures = 0  # healthy again: a round caught up
            self._status_dirty = True
        # Caught up in every direction it moves: a sink when it pulls, a source when it pushes.
        wanted = (link.spec.direction != "push") + (link.spec.direction != "pull")
        if link.caught_up_on != link.connections and len(feeds) >= wanted and all(feeds):
            link.caught_up_on = link.connections
            link.caught_up.set()
            link.caught_up = trio.Event()

    def _retire_unwanted(self, wanted: dict[NodeLinkKey, LinkSpec]) -> None:
        """Retire the running links ``wanted`` no longer holds, or holds with another URL or way."""
        for key, link in list(self.links.items()):
            spec = wanted.get(key)
            old = link.spec
            if spec is None or (spec.url, spec.pin, spec.direction) != (old.url, old.pin, old.direction):
                log.info("link to %s for %s (%s) no longer wanted", link.spec.label, link.spec.tenant,
                         scope_name(link.spec.scope))
                del self.links[key]
                self._retire(link, self.shutdown_grace)

    def _start_link(self, spec: LinkSpec) -> None:
        assert self._link_nursery is not None
        link = self.links[spec.key] = NodeLink(spec, gate=RetryGate(schedule=self.retry_schedule, rng=self._rng))
        if spec.origin == "discovered":
            link.remote_sid = spec.remote.removeprefix("sid:")
            seen = self.seen.get(link.remote_sid)
            link.remote_did = None if seen is None else seen.peer.did
        log.info("link to %s for %s (%s, %s)", spec.label, spec.tenant, scope_name(spec.scope), spec.direction)
        self._link_nursery.start_soon(self._supervise, link)
        self._status_dirty = True

    def _retire(self, link: NodeLink, grace: float) -> None:
        """End ``link``: a connected one saves its checkpoints first (up to ``grace`` s)."""
        assert self._link_nursery is not None
        self._status_dirty = True
        if link.conn is None:
            link.scope.cancel()
            return
        link.stop.set()
        self._retiring.add(link)
        self._link_nursery.start_soon(_cancel_after, link, grace)

    # -- supervising one link: rounds, failures, backoff ------------------------------------------

    async def _supervise(self, link: NodeLink) -> None:
        """Run ``link`` until it is stopped or retired: a round (:meth:`_run_round`); when the
        round gives up, record why and wait out the node's backoff, then a new round. Its
        anti-entropy (:meth:`_anti_entropy`) runs beside the rounds and ends with them."""
        try:
            with link.scope:
                async with trio.open_nursery() as nursery:
                    # Reconciliation compares a whole tenant's or one protocol's set
                    # (p2psync/state/sketches.py); a subset link has none to compare.
                    subset = link.spec.scope.kind == "subset"
                    link.anti_entropy.enabled = self.config.anti_entropy and not subset
                    link.anti_entropy.off_reason = "not for a subset scope" if subset else None
                    if link.anti_entropy.enabled:
                        nursery.start_soon(self._anti_entropy, link)
                    await self._rounds(link)
                    nursery.cancel_scope.cancel()
        finally:
            self._link_ended(link)

    async def _rounds(self, link: NodeLink) -> None:
        while not link.stop.is_set():
            failure = await self._run_round(link)
            if failure is None:
                self._round_ended(link)
                return
            if link.stop.is_set():
                return  # ended because we stop it: no failure
            self._record_failure(link, failure)
            await self._back_off(link, failure)

    async def _run_round(self, link: NodeLink) -> Exception | None:
        """One continuous sync of ``link``; the peer reconnects by itself (with its own backoff)
        while what fails is retryable. Returns what it gave up on, or None when it ended at
        ``link.stop`` with the checkpoint pair saved."""
        spec = link.spec
        try:
            await self.peer.sync(
                lambda handlers: self._connect(link, handlers), tenant=spec.tenant, scope=spec.scope,
                direction=spec.direction, continuous=True, stop=link.stop, gate=link.gate,
            )
        except Exception as exc:  # a link recovers by itself; the node goes on
            return exc
        return None

    def _dial(self, link: NodeLink, handlers: dict[str, Any]) -> AbstractAsyncContextManager[blip.Connection]:
        """A new connection to ``link``'s peer (its rounds' and its anti-entropy checks'), pinned
        to the certificate its advert or configuration names. Plain ``ws://`` beyond loopback
        only with ``insecure``."""
        refused = plain_ws_refused(link.spec.url)
        if refused is not None and not self.config.insecure:
            raise PlainTransportRefused(refused)
        return blip.connect(link.spec.url, app_id=APP_ID, handlers=handlers, pin=link.spec.pin,
                            max_message_size=PRE_HELLO_MAX_MESSAGE)

    @asynccontextmanager
    async def _connect(self, link: NodeLink, handlers: dict[str, Any]) -> AsyncIterator[blip.Connection]:
        """:meth:`_dial` that tells the node which connection a link's round runs on, and
        sees every attempt's failure (the peer's reconnect loop retries most by itself)."""
        try:
            async with self._dial(link, handlers) as conn:
                link.conn = conn
                link.connections += 1
                self._poke()
                try:
                    yield conn
                finally:
                    link.conn = None
                    self._status_dirty = True
        except Exception as exc:
            if not link.stop.is_set():  # a connection ending while we stop is no failure
                self._record_failure(link, exc)
            raise

    def _record_failure(self, link: NodeLink, exc: BaseException) -> None:
        """Count one failed attempt of ``link`` and keep its one-line reason (logged when new)."""
        if exc is link.last_exc:
            return  # seen on its way out of the connection already
        link.last_exc = exc
        link.failures += 1
        line = _failure_line(exc, link.spec.url)
        if line is None:
            log.error("link to %s failed unexpectedly", link.spec.label, exc_info=exc)
            line = f"{type(exc).__name__}: {exc}"
        elif line != link.last_error:
            log.warning("%s (%s, %s)", line, link.spec.tenant, scope_name(link.spec.scope))
        link.last_error = line
        self._status_dirty = True

    def _backoff_delay(self, link: NodeLink) -> float:
        """The node's wait before ``link``'s next round: the ledger's schedule by the link's
        failures (its gate's), capped at :data:`LINK_RETRY_CAP`, with equal jitter (as the peer's own)."""
        return min(link.gate.delay(link.failures), LINK_RETRY_CAP)

    async def _back_off(self, link: NodeLink, failure: Exception) -> None:
        """Wait before a new round of ``link``. The peer's sync retries what
        :func:`p2psync.errors.disposition` calls retryable by itself, so what ends a round is
        terminal for it (a refusal, a failed hello): a grant, a policy or the peer must change
        first, and the node looks again on its own schedule."""
        delay = self._backoff_delay(link)
        log.info("link to %s: %s failure; retrying in %.0f s", link.spec.label, errors.disposition(failure).value,
                 delay)
        self._status_dirty = True
        await link.gate.wait(delay)
        self._status_dirty = True

    # -- a link's anti-entropy ---------------------------------------------------------------------

    async def _anti_entropy(self, link: NodeLink) -> None:
        """Check ``link`` against its peer every period (:class:`AntiEntropySchedule`), one
        check at a time, from the first round of it that catches up until the link ends. A
        round catching up on a new connection brings the interval back to the base."""
        config, status = self.config, link.anti_entropy
        schedule = AntiEntropySchedule(config.anti_entropy_interval, config.anti_entropy_jitter,
                                       config.anti_entropy_max_interval, self._rng)
        try:
            await self._anti_entropy_loop(link, schedule)
        finally:  # ended with the link: nothing scheduled any more
            status.next_at, status.running = None, False
            self._status_dirty = True

    async def _anti_entropy_loop(self, link: NodeLink, schedule: AntiEntropySchedule) -> None:
        status = link.anti_entropy
        while link.caught_up_on == 0:
            await link.caught_up.wait()
        seen = link.caught_up_on
        while not link.stop.is_set():
            deadline = trio.current_time() + schedule.delay()
            while True:
                status.interval = schedule.interval
                status.next_at = datetime.now(UTC) + timedelta(seconds=deadline - trio.current_time())
                self._status_dirty = True
                woken = link.caught_up
                with trio.move_on_at(deadline):
                    await woken.wait()
                if link.caught_up_on == seen:
                    break  # the deadline
                seen = link.caught_up_on  # reconnected: the base interval from now, if sooner
                schedule.reset()
                deadline = min(deadline, trio.current_time() + schedule.delay())
            if link.stop.is_set():
                break
            status.next_at, status.running = None, True
            self._status_dirty = True
            result = await self._check(link)
            status.running = False
            schedule.after(result.outcome)

    async def _check(self, link: NodeLink) -> CheckResult:
        """One anti-entropy check of ``link``: reconcile with repair in its direction, then
        count, log and show its outcome. Never raises (but for cancellation): a failure is
        logged once and the next period tries again."""
        spec = link.spec
        label = f"anti-entropy with {spec.label} for {spec.tenant} ({scope_name(spec.scope)})"
        try:
            with trio.fail_after(CHECK_TIMEOUT):
                summary = await self.peer.reconcile(
                    lambda handlers: self._dial(link, handlers), tenant=spec.tenant, scope=spec.scope,
                    repair=True, direction=spec.direction,
                    # The log carries replaced definitions; look for them when the sets differed
                    # (the log missed something), so an equal check stays one round trip.
                    definitions=False,
                )
        except Exception as exc:  # the peer down, a refusal, a timeout: the next period retries
            line = _failure_line(exc, spec.url)
            if isinstance(exc, trio.TooSlowError):
                line = f"{spec.url} did not finish the check in {CHECK_TIMEOUT:.0f} s"
            if line is None:
                line = f"{type(exc).__name__}: {exc}"
                if line != link.ae_failure:
                    log.error("%s failed unexpectedly", label, exc_info=exc)
            elif line != link.ae_failure:
                log.warning("%s failed: %s; retrying at the next period", label, line)
            link.ae_failure = line
            result = CheckResult("failed", detail=line)
        else:
            if link.ae_failure is not None:
                log.info("%s works again", label)
                link.ae_failure = None
            result = check_result(summary, spec.direction)
            moved = f"this node lacked {result.local_lacks}, the peer {result.remote_lacks}"
            if result.outcome == "repaired":
                log.info("%s: repaired (%s)", label, moved)
            elif result.outcome == "unresolved":
                previous = link.anti_entropy.last
                level = logging.INFO if previous is not None and previous.outcome == "unresolved" else logging.WARNING
                log.log(level, "%s: unresolved (%s): %s", label, moved, result.detail)
            else:
                log.debug("%s: equal (%d round trip(s), %d bytes)", label, result.round_trips, result.bytes)
        status = link.anti_entropy
        status.checks += 1
        status.last_at = datetime.now(UTC)
        status.last = result
        self.metrics.anti_entropy_checked(result)
        self._status_dirty = True
        return result

    def _round_ended(self, link: NodeLink) -> None:
        """``link``'s round ended at its stop with the pair saved on both sides."""
        if self._stop.is_set():
            self.stopped_links += 1

    def _link_ended(self, link: NodeLink) -> None:
        link.done.set()
        self._retiring.discard(link)

    # -- stop -------------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Leave discovery, end the links (saving checkpoints), stop serving, commit.

        Links end before the listener closes: when two nodes that dial each other stop at
        once, each one's final ``setCheckpoint`` still finds the other's passive side open.
        """
        log.info("stopping: %d link(s)", len(self.links))
        self._discovery_scope.cancel()
        links = [*self.links.values(), *self._retiring]
        self.links.clear()
        with trio.move_on_after(self.shutdown_grace):
            for link in links:
                if link.conn is None:
                    link.scope.cancel()
                else:
                    link.stop.set()
            for link in links:
                await link.done.wait()
        for link in links:
            link.scope.cancel()
        self._server_scope.cancel()
        with trio.move_on_after(self.shutdown_grace):
            await self._served.wait()  # its connections' last applies commit on the way out
        try:
            self.peer.committer.flush()
        except StoreUnavailable as exc:  # nothing more to lose: what was committed stays
            log.error("the last commit failed: %s", exc)
        self.peer.save_not_applied()  # if its last write found another process's lock

    # -- status and metrics -----------------------------------------------------------------------

    def _on_not_applied(self) -> None:
        self._status_dirty = True

    async def _status_writer(self) -> None:
        assert self.status_path is not None
        written: list[NodeLinkState] = []
        while True:
            # Some states change with no event the node sees at once (a round catching up, a
            # backoff starting): compare them too.
            states = [self.link_state(link) for link in self.links.values()]
            cleared = self.peer.tend_not_applied()
            if self._status_dirty or cleared or states != written:
                self._status_dirty = False
                written = states
                _write_json(self.status_path, self.status())
            if cleared:  # after the file says so: the asker reads it next
                self.peer.answer_clear()
            await trio.sleep(STATUS_INTERVAL)

    def _facts(self) -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
        links: dict[tuple[tuple[str, str], ...], float] = {}
        for origin in ("static", "discovered"):
            for connected in ("true", "false"):
                links[(("connected", connected), ("origin", origin))] = 0
        for link in self.links.values():
            key = (("connected", "true" if link.conn is not None else "false"), ("origin", link.spec.origin))
            links[key] += 1
        passive = len(self.server.connections) if self.server is not None else 0
        return {
            "sync_node_links": ("Links this node runs, by origin and whether connected now.", links),
            "sync_discovered_peers": ("Peers discovery sees (those gone within their grace included).",
                                      {(): len(self.seen)}),
            "sync_passive_connections": ("Connections other nodes opened to this one.", {(): passive}),
        }


def _failure_line(exc: BaseException, url: str) -> str | None:
    """:func:`p2psync.errors.describe` of the leaf of ``exc``."""
    return errors.describe(errors.leaf(exc), url)


def _listed(peers: Any) -> list[PeerSeenLike]:
    """``Discovery.peers()`` as a list (a table by name is accepted too)."""
    return list(peers.values() if isinstance(peers, dict) else peers)


def peer_json(peer: PeerSeenLike) -> dict[str, Any]:
    """A discovered peer as ``p2psync peers --json`` and the status file show it."""
    last_seen = peer.last_seen
    if isinstance(last_seen, datetime):
        last_seen = last_seen.isoformat()
    return {
        "name": peer.name, "url": peer.url(), "addresses": list(peer.addresses), "port": peer.port,
        "did": peer.did, "storeId": peer.sid, "tenants": None if peer.tenants_hashed else sorted(peer.tenants),
        "private": bool(peer.tenants_hashed), "capabilities": sorted(peer.capabilities or ()), "lastSeen": last_seen,
        "fingerprint": peer.fingerprint,
    }


def _read_callers(path: Path | None) -> dict[str, dict[str, Any]]:
    """The callers file (``{storeId: {"did", "url"}}``); empty when absent or unreadable."""
    if path is None:
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {sid: c for sid, c in value.items() if isinstance(c, dict) and isinstance(c.get("url"), str)}


def _write_json(path: Path, value: Any) -> None:
    """Replace ``path`` atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(value, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc.strerror or exc)


async def _hold_nursery(*, task_status: trio.TaskStatus[trio.Nursery] = trio.TASK_STATUS_IGNORED) -> None:
    """A nursery for tasks started later (links), open until cancelled."""
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep_forever()


async def _cancel_after(link: NodeLink, grace: float) -> None:
    with trio.move_on_after(grace):
        await link.done.wait()
    link.scope.cancel()

