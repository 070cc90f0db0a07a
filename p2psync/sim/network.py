"""Links and connections between simulated peers.

A :class:`Link` is an edge of the topology: it can be up or down (dropped, or one end
partitioned or crashed). While it is up, its active end opens :class:`Connection`\\ s, one
per round, each with two fresh protocol objects and the messages in flight between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from p2psync.replication.effects import Operation
from p2psync.replication.protocol import ReplicationProtocol
from p2psync.replication.round import SyncRound
from p2psync.replication.scope import SyncScope
from p2psync.sim.world import SimPeer

__all__ = ["Connection", "Endpoint", "Envelope", "Link"]


@dataclass
class Endpoint:
    """One end of a connection: a peer and its protocol object for this connection."""

    peer: SimPeer
    proto: ReplicationProtocol
    #: rid -> (requester's ref, max reply size) for requests this end must answer
    asked: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    generation: int = 0  # the peer's process generation this protocol object belongs to


@dataclass
class Envelope:
    """A message in flight to ``to`` (0: the active end, 1: the passive end)."""

    to: int
    kind: str  # request | reply | error
    args: tuple[Any, ...]
    label: str


@dataclass(eq=False)
class Link:
    """An edge of the topology; ``active`` opens the connections."""

    index: int
    active: int
    passive: int
    down_until: int = -1
    conn: Connection | None = None
    #: log versions of both ends when the last successful round started
    synced: tuple[int, int] | None = None
    failed: bool = False
    rounds: int = 0
    rounds_ok: int = 0
    scope: SyncScope = field(default_factory=SyncScope.global_scope)

    @property
    def name(self) -> str:
        return f"L{self.index}"


@dataclass(eq=False)
class Connection:
    """One connection of a link: hello, then one ``SyncRound``, then closed."""

    number: int
    link: Link
    ends: tuple[Endpoint, Endpoint]
    in_flight: list[Envelope] = field(default_factory=list)
    alive: bool = True
    rids: int = 0
    hello: Operation | None = None
    op: Operation | None = None
    round: SyncRound | None = None
    save: Operation | None = None
    saves: int = 0
    versions: tuple[int, int] = (0, 0)
    closing: str | None = None
    outcome: str | None = None  # ok | failed: <error> | lost: <reason>
    max_in_flight: int = 0

    @property
    def active(self) -> Endpoint:
        return self.ends[0]

    @property
    def passive(self) -> Endpoint:
        return self.ends[1]

    @property
    def busy(self) -> bool:
        """Some command of the active end has not finished yet."""
        return any(op is not None and not op.done for op in (self.hello, self.op, self.save))
