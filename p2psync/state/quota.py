"""Quotas on what a node stores through replication (issue #15): per tenant, and per pushing
peer per window.

- **A tenant's quota** bounds what the store holds for one tenant: its admitted messages and
  their bytes (each message as admitted plus the data it came with: the store's
  ``tenant_usage``, p2psync/dwn/store.py schema 4). A replicated message that would take the
  tenant past it is refused (``507 TenantQuotaExceeded``) before anything of it is written,
  whether a peer pushed it or this node pulled it. Local writes (``p2psync write``, the node's
  own authoring) are never refused, but they count.
- **A peer's budget** bounds what one remote DID (proven in hello) may push into the store in
  a window of time, counted from its first push of the window and kept in the store
  (``peer_push_budget``), so a restart does not renew it. Past it its pushes are refused
  (``429 PeerQuotaExceeded``, with ``retryAfter``: the seconds until the window ends). Only
  pushes by a peer that may not read the tenant are charged: the tenant's own devices and
  the peers it granted sync to are bounded by the tenant's quota alone. What this node pulls
  is never charged to anyone: it asked for it.

:class:`Quotas` answers the sink's two questions: how many items of a listing fit
(:meth:`Quotas.fit`, with a per-message allowance for the message itself, whose size a listing
does not give), and whether one message fits exactly (:meth:`Quotas.check`, before its apply);
:meth:`Quotas.admitted` charges what an apply stored, in the apply's own transaction. A
refusal is logged once per episode: until a listing of that tenant (or that pusher) is taken
whole again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from p2psync.dwn.encoding import json_compact
from p2psync.dwn.store import Store
from p2psync.errors import QuotaExceeded

__all__ = [
    "DEFAULT_PEER_BYTES",
    "DEFAULT_PEER_MESSAGES",
    "DEFAULT_PEER_WINDOW",
    "MESSAGE_ALLOWANCE",
    "NO_QUOTAS",
    "UNLIMITED",
    "Limit",
    "QuotaPolicy",
    "Quotas",
    "Usage",
]

log = logging.getLogger("p2psync.quota")

#: What a listing item is counted for besides its data: a listing gives the data's size but
#: not the message's. A plain signed RecordsWrite is 925 bytes as archived (measured); 2 KiB
#: covers protocol writes with a context and a parent. The exact check before each apply
#: catches a larger one; this only keeps a listing from asking for `rev`s that cannot fit.
MESSAGE_ALLOWANCE: Final = 2048
#: A peer that may not read the tenant pushes at most this much an hour by default: far more
#: than anyone writes by hand into a protocol open to strangers (a guestbook, a shared board),
#: and bounding one identity to about 6 GiB a day. Identities are free to make, so this bounds
#: a careless or buggy peer; the tenant's quota is what bounds the disk.
DEFAULT_PEER_MESSAGES: Final = 10_000
DEFAULT_PEER_BYTES: Final = 256 * 1024 * 1024
DEFAULT_PEER_WINDOW: Final = 3600.0

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS peer_push_budget (
    peer TEXT PRIMARY KEY,           -- the pusher's DID, as proven in hello
    window_start REAL NOT NULL,      -- wall-clock seconds: the window's first charged push
    messages INTEGER NOT NULL,       -- what it stored in this window
    bytes INTEGER NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``messages`` messages and ``bytes`` bytes (None: no bound on that)."""

    messages: int | None = None
    bytes: int | None = None

    @property
    def unlimited(self) -> bool:
        return self.messages is None and self.bytes is None

    def __str__(self) -> str:
        parts = [_messages(self.messages) if self.messages is not None else "",
                 _size(self.bytes) if self.bytes is not None else ""]
        return " and ".join(p for p in parts if p) or "unlimited"


#: No bound at all.
UNLIMITED: Final = Limit()


@dataclass(frozen=True)
class QuotaPolicy:
    """The quotas of one store: ``tenant`` for every stored tenant unless ``tenants`` names
    its own, and ``peer`` per pushing DID every ``window`` seconds (docs/operator.md)."""

    tenant: Limit = UNLIMITED
    tenants: Mapping[str, Limit] = field(default_factory=dict)
    peer: Limit = Limit(DEFAULT_PEER_MESSAGES, DEFAULT_PEER_BYTES)
    window: float = DEFAULT_PEER_WINDOW

    def for_tenant(self, tenant: str) -> Limit:
        return self.tenants.get(tenant, self.tenant)


#: Nothing bounded (a peer made without a policy: the CLI's one-shot syncs).
NO_QUOTAS: Final = QuotaPolicy(peer=UNLIMITED)


@dataclass(frozen=True, slots=True)
class Usage:
    """Messages and bytes stored (or to be stored)."""

    messages: int = 0
    bytes: int = 0

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.messages - other.messages, self.bytes - other.bytes)

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.messages + other.messages, self.bytes + other.bytes)

    @property
    def grew(self) -> bool:
        return self.messages > 0 or self.bytes > 0


@dataclass(slots=True)
class _Room:
    """What is left under one limit (None: unbounded), and the refusal once it is not enough."""

    messages: float
    bytes: float
    kind: str  # "tenant" or "peer"
    subject: str  # the tenant, or the pushing peer
    refusal: Callable[[], QuotaExceeded]

    def takes(self, need: Usage) -> bool:
        return need.messages <= self.messages and need.bytes <= self.bytes

    def take(self, need: Usage) -> None:
        self.messages -= need.messages
        self.bytes -= need.bytes


class Quotas:
    """A :class:`QuotaPolicy` enforced over ``store`` (see the module doc). ``clock``: wall-clock
    seconds (the peer windows outlive the process)."""

    def __init__(self, store: Store, policy: QuotaPolicy, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.policy = policy
        self.clock = clock
        store.conn.execute(_SCHEMA)
        #: the refusal episodes logged and not over yet: ("tenant", DID) or ("peer", DID)
        self._episodes: set[tuple[str, str]] = set()
        self._pruned = -math.inf

    # -- reading -------------------------------------------------------------------------------

    def watching(self, tenant: str, payer: str | None) -> bool:
        """Whether a message of ``tenant`` pushed by ``payer`` (None: charged to nobody) is
        bounded at all; when not, nothing is read or written for quotas."""
        return not self.policy.for_tenant(tenant).unlimited or (payer is not None and not self.policy.peer.unlimited)

    def usage(self, tenant: str) -> Usage:
        """What the store holds for ``tenant`` now (the open transaction's writes included)."""
        return Usage(*self.store.usage(tenant))

    def spent(self, peer: str) -> tuple[float, Usage]:
        """``peer``'s current window: its start and what it stored in it (a window that is over,
        or none yet: now, nothing)."""
        now = self.clock()
        row = self.store.conn.execute(
            "SELECT window_start, messages, bytes FROM peer_push_budget WHERE peer=?", (peer,)).fetchone()
        # A window that started in the future is a clock set back: start again from now.
        if row is None or not row[0] <= now < row[0] + self.policy.window:
            return now, Usage()
        return float(row[0]), Usage(int(row[1]), int(row[2]))

    def cost(self, tenant: str, message: dict[str, Any], cid: str, data: bytes | None) -> Usage:
        """What applying ``message`` (with ``data``) would add to ``tenant``'s usage: the message
        as the archive keeps it (without ``encodedData``) plus its data, nothing for one already
        admitted, and only the data for one admitted without it (the data is attached then)."""
        tid = self.store.tenant_id(tenant, create=False)
        size = len(data) if data is not None else 0
        if tid is not None:
            row = self.store.conn.execute(
                "SELECT data IS NOT NULL OR data_in IS NOT NULL FROM archive WHERE tenant=? AND cid=?", (tid, cid)
            ).fetchone()
            if row is not None:
                return Usage(0, 0 if row[0] else size)
        body = json_compact({k: v for k, v in message.items() if k != "encodedData"})
        return Usage(1, len(body.encode()) + size)

    # -- deciding --------------------------------------------------------------------------------

    def fit(self, tenant: str, payer: str | None, sizes: Sequence[int | None]) -> tuple[int, QuotaExceeded | None]:
        """How many of a listing's items (their data sizes; None: no data), taken in order,
        fit what is left, each counted as one message of its data plus
        :data:`MESSAGE_ALLOWANCE`; and the refusal for the first that does not (None: all fit)."""
        if not self.watching(tenant, payer):
            return len(sizes), None
        rooms = self._rooms(tenant, payer)
        for i, size in enumerate(sizes):
            need = Usage(1, (size or 0) + MESSAGE_ALLOWANCE)
            for room in rooms:
                if not room.takes(need):
                    return i, self._refused(room)
                room.take(need)
        for room in rooms:  # a listing taken whole: whatever held these back is over
            self._episodes.discard((room.kind, room.subject))
        return len(sizes), None

    def check(self, tenant: str, payer: str | None, cost: Usage) -> None:
        """Raise the refusal when ``cost`` does not fit what is left for ``tenant`` (and for
        ``payer``, None: nobody is charged); nothing has been written then."""
        if not cost.grew or not self.watching(tenant, payer):
            return
        for room in self._rooms(tenant, payer):
            if not room.takes(cost):
                raise self._refused(room)

    def admitted(self, tenant: str, payer: str | None, before: Usage) -> None:
        """An apply of ``tenant`` (pushed by ``payer``) is done in the open transaction, which
        held ``before``: charge ``payer`` what it stored there, in the same transaction."""
        grown = self.usage(tenant) - before
        if not grown.grew or payer is None or self.policy.peer.unlimited:
            return
        start, spent = self.spent(payer)
        total = spent + Usage(max(grown.messages, 0), max(grown.bytes, 0))
        self.store.conn.execute(
            "INSERT INTO peer_push_budget(peer, window_start, messages, bytes) VALUES(?,?,?,?)"
            " ON CONFLICT(peer) DO UPDATE SET window_start=excluded.window_start, messages=excluded.messages,"
            " bytes=excluded.bytes", (payer, start, total.messages, total.bytes))
        self._prune(start)

    # -- inside --------------------------------------------------------------------------------

    def _rooms(self, tenant: str, payer: str | None) -> list[_Room]:
        rooms: list[_Room] = []
        limit = self.policy.for_tenant(tenant)
        if not limit.unlimited:
            used = self.usage(tenant)
            rooms.append(_Room(_left(limit.messages, used.messages), _left(limit.bytes, used.bytes), "tenant", tenant,
                               lambda: self._tenant_refusal(tenant, limit, used)))
        budget = self.policy.peer
        if payer is not None and not budget.unlimited:
            start, spent = self.spent(payer)
            rooms.append(_Room(_left(budget.messages, spent.messages), _left(budget.bytes, spent.bytes), "peer", payer,
                               lambda: self._peer_refusal(payer, budget, start, spent)))
        return rooms

    def _tenant_refusal(self, tenant: str, limit: Limit, used: Usage) -> QuotaExceeded:
        return QuotaExceeded(
            *QuotaExceeded.TENANT,
            f"tenant {tenant[:80]} holds {_messages(used.messages)} and {_size(used.bytes)} on this node, "
            f"and its quota here is {limit}", local=True)

    def _peer_refusal(self, peer: str, budget: Limit, start: float, spent: Usage) -> QuotaExceeded:
        after = max(1, math.ceil(start + self.policy.window - self.clock()))
        return QuotaExceeded(
            *QuotaExceeded.PEER,
            f"{peer[:80]} pushed {_messages(spent.messages)} and {_size(spent.bytes)} in this window; "
            f"a peer that may not read the tenant may push {budget} every {self.policy.window:g} s; "
            f"try again in {after} s", retry_after=after, local=True)

    def _refused(self, room: _Room) -> QuotaExceeded:
        """The refusal of ``room``, logged when it begins an episode (the tenant, or the
        pusher, takes nothing more until one of its messages is stored again)."""
        refusal = room.refusal()
        episode = (room.kind, room.subject)
        if episode not in self._episodes:
            self._episodes.add(episode)
            if room.kind == "tenant":
                log.warning("tenant %s would pass its quota on this node: taking no more of its messages "
                            "until the quota is raised (%s)", room.subject[:80], refusal.detail)
            else:
                log.warning("peer %s spent its push budget: refusing its pushes for %s s (%s)",
                            room.subject[:80], refusal.retry_after, refusal.detail)
        return refusal

    def _prune(self, now: float) -> None:
        """Forget windows that are over, once a window (strangers come and go; each DID that ever
        pushed would otherwise keep a row)."""
        if now - self._pruned < self.policy.window:
            return
        self._pruned = now
        self.store.conn.execute("DELETE FROM peer_push_budget WHERE window_start <= ?", (now - self.policy.window,))


def _left(limit: int | None, used: int) -> float:
    return math.inf if limit is None else limit - used


def _messages(n: int) -> str:
    return f"{n:,} message" if n == 1 else f"{n:,} messages"


def _size(n: float) -> str:
    """Bytes for a person: ``512 B``, ``8.0 MiB``."""
    if abs(n) < 1024:
        return f"{int(n)} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if abs(value) < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"
