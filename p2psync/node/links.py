"""Which links a node keeps: a pure function of its configuration and what it knows now.

A *link* here is one continuous sync the node runs as the active side: one remote node, one
tenant, one scope (``peer.sync(..., continuous=True)`` with the tenant's direction). The
planner decides the set; the node (p2psync/node/node.py) starts what is missing and retires
what is no longer wanted. Keeping the decision free of I/O keeps its rules testable one by one:

1. every static peer is dialed, for each tenant it lists (default: all) and each scope;
2. a discovered peer is dialed only with ``auto``, only for tenants it ``shares()``, and only
   by one of the two nodes: the one with the smaller store id, unless the other does not
   advertise :data:`~p2psync.node.discovery_api.AUTO_CAPABILITY` (it would never dial us);
3. never a discovered peer that a static link already reaches (same store id, learned from
   its hello), nor a collection that peer already runs with us from its side (it dials us:
   the data flows through our passive side), nor ourselves.

It also holds the one definition of a link's state as ``status``, ``peers``, the status file and
the metrics show it (:func:`link_state`): ``live`` only while connected and caught up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any, Final, Literal

from p2psync.blip.pumps import PING_INTERVAL
from p2psync.node.config import Direction, StaticPeer, TenantConfig
from p2psync.node.discovery_api import AUTO_CAPABILITY, PeerSeenLike
from p2psync.replication.scope import SyncScope

__all__ = [
    "LINK_STATES", "SILENT_AFTER", "LinkSpec", "NodeLinkKey", "NodeLinkState", "link_state", "plan_links", "scope_name",
    "scope_text", "state_text",
]

NodeLinkState = Literal["connecting", "backoff", "unresponsive", "catching-up", "repairing", "live", "idle"]
#: A link's states, as ``status``, ``peers``, the status file and ``sync_link_state`` name them:
#:
#: - ``connecting``: not connected; an attempt (dial, TLS, hello) is under way;
#: - ``backoff``: not connected; waiting until its next attempt after failures;
#: - ``unresponsive``: connected, but nothing came from the peer for longer than a ping
#:   interval and its answer (a peer that vanished without closing: powered off, off the
#:   network); the connection is dropped at the idle timeout (p2psync/blip/pumps.py);
#: - ``catching-up``: connected; some direction has not reached the other side's head yet
#:   (or a message it received did not apply and waits for the next round);
#: - ``repairing``: connected; the round repairs a gap (the ledger's ``repairing``);
#: - ``live``: connected, and every direction it moves has caught up;
#: - ``idle``: no node runs it now (a one-shot ``p2psync sync`` left it, or no node runs).
LINK_STATES: Final[tuple[NodeLinkState, ...]] = (
    "connecting", "backoff", "unresponsive", "catching-up", "repairing", "live", "idle")

#: (remote node, tenant, scopeId): a node link's key (the ledger's LinkKey names the remote by
#: its DID instead, p2psync.state.ledger).
NodeLinkKey = tuple[str, str, str]


@dataclass(frozen=True)
class LinkSpec:
    """One wanted link: whom to dial (``url``), for which tenant and scope, which way.

    ``remote`` names the remote node: ``sid:<storeId>`` for a discovered peer (its advert says
    its store id), ``url:<url>`` for a static one (its store id is known only after hello).
    """

    remote: str
    tenant: str
    scope: SyncScope
    direction: Direction
    url: str
    origin: Literal["static", "discovered"]
    label: str  # the peer's advertised name or the URL, for logs and `peers`
    pin: str | None = None  # the fingerprint its TLS certificate must have (advert or configuration)

    @property
    def key(self) -> NodeLinkKey:
        return (self.remote, self.tenant, self.scope.scope_id)


def _wants_dial(own_sid: str, peer: PeerSeenLike) -> bool:
    """Rule 2: exactly one of two auto nodes dials; a node that never dials is dialed."""
    capabilities = peer.capabilities or ()
    if AUTO_CAPABILITY not in capabilities:
        return True
    return own_sid < peer.sid


def plan_links(
    tenants: Iterable[TenantConfig],
    static_peers: Iterable[StaticPeer],
    discovered: Iterable[PeerSeenLike],
    *,
    own_sid: str,
    auto: bool,
    static_sids: Set[str] = frozenset(),
    dialing_us: Mapping[str, Set[tuple[str, str]]] | None = None,
) -> dict[NodeLinkKey, LinkSpec]:
    """The links the node should run now (see the module doc for the rules).

    ``tenants`` have their DIDs resolved; ``static_sids``: store ids reached by static links;
    ``dialing_us``: store id -> ``(tenant, scopeId)`` collections that node runs with us.
    """
    tenants = list(tenants)
    dialing_us = dialing_us or {}
    out: dict[NodeLinkKey, LinkSpec] = {}
    for peer in static_peers:
        for tenant in tenants:
            assert tenant.did is not None
            if peer.tenants is not None and tenant.did not in peer.tenants:
                continue
            for scope in tenant.scopes:
                spec = LinkSpec(f"url:{peer.url}", tenant.did, scope, tenant.direction, peer.url, "static", peer.url,
                                peer.pin)
                out[spec.key] = spec
    if not auto:
        return out
    for seen in discovered:
        if seen.sid == own_sid or seen.sid in static_sids or not _wants_dial(own_sid, seen):
            continue
        theirs = dialing_us.get(seen.sid, frozenset())
        for tenant in tenants:
            assert tenant.did is not None
            if not seen.shares(tenant.did):
                continue
            for scope in tenant.scopes:
                if (tenant.did, scope.scope_id) in theirs:
                    continue
                spec = LinkSpec(f"sid:{seen.sid}", tenant.did, scope, tenant.direction, seen.url(), "discovered",
                                seen.name, seen.fingerprint)
                out[spec.key] = spec
    return out


def link_state(
    *, running: bool, connected: bool, caught_up: bool, repairing: bool, waiting: bool, silent: bool = False
) -> NodeLinkState:
    """A link's state (see :data:`LINK_STATES`) from what its node knows of it now.

    ``running``: a node runs it; ``connected``: its round has a connection; ``caught_up``: the
    round on that connection has caught up in every direction it moves; ``repairing``: its ledger
    link is ``repairing``; ``waiting``: it waits out its backoff before the next attempt;
    ``silent``: connected, and nothing heard from the peer for longer than :data:`SILENT_AFTER`.
    """
    if not running:
        return "idle"
    if not connected:
        return "backoff" if waiting else "connecting"
    if silent:
        return "unresponsive"
    if repairing:
        return "repairing"
    return "live" if caught_up else "catching-up"


#: A connection that has heard nothing from its peer for this long missed a pong: BLIP pings
#: every :data:`~p2psync.blip.pumps.PING_INTERVAL` (20 s) and the pong comes back within a
#: round trip; 5 s more covers a loaded peer. Its link is not ``live`` past it (the connection
#: itself is dropped at the 60 s idle timeout).
SILENT_AFTER: Final = PING_INTERVAL + 5.0


def scope_text(scope: SyncScope | dict[str, Any]) -> str:
    """A scope for a person: ``global``, ``protocol URL``, or ``protocol URL (paths: a, b;
    contexts: C)`` in canonical order. Takes a :class:`SyncScope` or its wire object (the
    ledger's ``scope``)."""
    wire = scope.to_wire() if isinstance(scope, SyncScope) else scope
    if not wire.get("protocol"):
        return str(wire.get("kind"))
    parts = [f"{name}: " + ", ".join(str(v) for v in wire[member])
             for member, name in (("protocolPathPrefixes", "paths"), ("contextIdPrefixes", "contexts"))
             if wire.get(member)]
    return f"protocol {wire['protocol']}" + (f" ({'; '.join(parts)})" if parts else "")


def scope_name(scope: SyncScope) -> str:
    """How logs and ``serve`` name a scope in a line: ``global``, the protocol URL, or a
    subset's protocol and prefixes (:func:`scope_text`) with its scopeId."""
    if scope.kind == "global":
        return "global"
    if scope.kind == "protocol":
        return str(scope.protocol)
    return f"{scope_text(scope)} [{scope.scope_id}]"


def state_text(state: str, failures: int, next_in: float | None) -> str:
    """A link's state for a person, as ``status`` and ``peers`` print it: ``live``, ``backoff
    (4 failure(s), next attempt in 12 s)``, ``connecting (1 failure(s))``."""
    details = []
    if failures:
        details.append(f"{failures} failure(s)")
    if state == "backoff" and next_in is not None:
        details.append(f"next attempt in {max(next_in, 0):.0f} s")
    return state + (f" ({', '.join(details)})" if details else "")
