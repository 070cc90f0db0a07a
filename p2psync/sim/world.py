"""The simulated world: a clock, peers with real SQLite stores, and the topology between them.

Every source of nondeterminism the stores would otherwise draw on is fixed by the seed: each
store's ``storeId`` and its tenant log's ``(streamId, epoch)`` are seeded UUIDs written before
first use, the ledger reads the simulated clock, hello nonces come from the seed. Nothing here
reads the wall clock, opens a socket or starts a thread.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import add_seconds, datetime_from_timestamp
from p2psync.replication.inflight import InFlightClaims
from p2psync.state.committer import GroupCommitter
from p2psync.state.copies import CheckpointCopies
from p2psync.state.ledger import Ledger
from p2psync.state.service import StoreService

__all__ = ["TOPOLOGIES", "SimClock", "SimPeer", "edges_of", "seeded_identity", "seeded_uuid"]

#: The shapes ``--topology`` names; ``random`` is a random connected graph.
TOPOLOGIES: Final = ("line", "star", "ring", "mesh", "random")
#: Where simulated time starts (messageTimestamps of the writers, the ledger's clock).
EPOCH_START: Final = "2030-05-01T00:00:00.000000Z"


def seeded_identity(name: str, method: str = "key") -> Identity:
    """A deterministic identity: the same DID on every run (as the tests' ``seeded``)."""
    return Identity.from_private_bytes(name.encode().ljust(32, b"\0")[:32], method)


def seeded_uuid(rng: random.Random) -> str:
    """A lower-case hyphenated UUID v4 drawn from ``rng``."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


class SimClock:
    """Simulated time: one second per step. Writers add their device's skew to it."""

    def __init__(self, start: str = EPOCH_START) -> None:
        self.start = start
        self.step = 0

    def timestamp(self, skew: int = 0) -> str:
        return add_seconds(self.start, self.step + skew)

    def now(self) -> datetime:
        """The ledger's clock."""
        return datetime_from_timestamp(self.timestamp())


@dataclass
class PendingDurable:
    """A durable store request waiting for its peer's group commit (see ``SimPeer``)."""

    conn: Any  # the Connection whose protocol object asked
    side: int
    ref: int
    batch: Any  # the committer's batch holding the write
    value: Any = None


@dataclass
class SimPeer:
    """One device of the tenant: a store file and, while it runs, its store service.

    A crash rolls back the open group commit and closes the connection; a restart reopens
    the file, so only what SQLite committed survives.
    """

    name: str
    index: int
    path: Path
    tenant: str
    store_id: str
    stream: tuple[str, str]
    clock: SimClock
    skew: int = 0
    up: bool = True
    down_until: int = -1
    partitioned_until: int = -1
    slow_until: int = -1
    pending: list[PendingDurable] = field(default_factory=list)
    store: Store = field(init=False)
    service: StoreService = field(init=False)
    generation: int = 0
    #: whether its hellos offer the batched `revs` profile (replication-profiles.md §8.4)
    offers_revs: bool = True

    def __post_init__(self) -> None:
        self.open()

    def open(self) -> None:
        store = Store(self.path)
        copies = CheckpointCopies(store)  # makes peer_meta; the storeId is ours, not a fresh UUID
        store.conn.execute("INSERT OR IGNORE INTO peer_meta(key, value) VALUES('storeId', ?)", (self.store_id,))
        if store.tenant_id(self.tenant, create=False) is None:
            store.conn.execute(
                "INSERT INTO tenants(did, stream_id, epoch) VALUES(?, ?, ?)", (self.tenant, *self.stream)
            )
        ledger = Ledger.for_store(store, clock=self.clock.now)
        self.store = store
        self.service = StoreService(store, dwn=Dwn(store), ledger=ledger, copies=copies,
                                    committer=GroupCommitter(store))
        self.in_flight = InFlightClaims()  # a process's claims die with it (issue #17)
        self.generation += 1
        self.up = True

    def crash(self) -> None:
        """Throw the process away: the open batch is rolled back, nothing else is kept."""
        conn = self.store.conn
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        self.store.close()
        self.pending.clear()
        self.up = False

    @property
    def dwn(self) -> Dwn:
        return self.service.dwn

    @property
    def ledger(self) -> Ledger:
        return self.service.ledger

    @property
    def committer(self) -> GroupCommitter:
        return self.service.committer

    def log_version(self) -> int:
        """How many entries this tenant's log ever appended (moves with every apply)."""
        row = self.store.conn.execute("SELECT next_position FROM tenants WHERE did=?", (self.tenant,)).fetchone()
        return 0 if row is None else int(row[0])

    def held(self) -> set[str]:
        """The CIDs of the messages this replica holds (as its event log lists them)."""
        tid = self.store.tenant_id(self.tenant, create=False)
        if tid is None:
            return set()
        return {str(c) for (c,) in self.store.conn.execute("SELECT cid FROM events WHERE tenant=?", (tid,))}

    def reachable(self, step: int) -> bool:
        return self.up and self.partitioned_until <= step


def edges_of(topology: str, n: int, rng: random.Random) -> list[tuple[int, int]]:
    """The edges of ``topology`` over peers 0..n-1 (each once, lower index first)."""
    if n < 2:
        return []
    pairs: set[tuple[int, int]] = set()
    if topology == "line":
        pairs = {(i, i + 1) for i in range(n - 1)}
    elif topology == "star":
        pairs = {(0, i) for i in range(1, n)}
    elif topology == "ring":
        pairs = {(i, i + 1) for i in range(n - 1)} | ({(0, n - 1)} if n > 2 else set())
    elif topology == "mesh":
        pairs = {(i, j) for i in range(n) for j in range(i + 1, n)}
    elif topology == "random":
        order = list(range(n))
        rng.shuffle(order)
        for k in range(1, n):  # a random spanning tree, then a few chords
            a, b = order[k], order[rng.randrange(k)]
            pairs.add((min(a, b), max(a, b)))
        for i in range(n):
            for j in range(i + 1, n):
                if rng.random() < 0.25:
                    pairs.add((i, j))
    else:
        raise ValueError(f"unknown topology {topology!r}")
    return sorted(pairs)
