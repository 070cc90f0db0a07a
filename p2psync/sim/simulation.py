"""One seeded run: peers, links, writers and faults, then quiescence and the invariants.

Each step the seeded RNG picks one event: deliver a message in flight, commit a peer's open
group commit, start a round on a link that may have something to move, a user's write, the
driver's periodic checkpoint save, or a fault (drop a link, partition a peer, crash a peer,
make a peer a slow consumer). After ``steps`` steps the writers and faults stop, everything
heals, and rounds run on every link until a whole pass moves nothing; then
:mod:`p2psync.sim.check` judges the result.

Protocol objects are driven as ``PeerSession`` drives them over BLIP, with the world in place
of trio: store requests are answered at once by the peer's ``StoreService``, durable ones
(``Durable``, ``WriteCopy``, ``ApplyGrant``) when the peer's group commit commits — a step of
its own, so a crash can lose an open batch whose writers have not been answered yet.
"""

from __future__ import annotations

import hashlib
import json
import random
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from p2psync.dwn.permissions import PERMISSIONS_PROTOCOL_URI
from p2psync.replication.checkpoint import Direction, DirectionCheckpoint, LinkState, checkpoint_id
from p2psync.replication.effects import (
    Apply,
    ApplyBatch,
    AwaitClaim,
    ClaimMessages,
    CloseConnection,
    ConnectionLost,
    Durable,
    OperationFinished,
    Output,
    RecordSteps,
    ReleaseClaims,
    SendError,
    SendReply,
    SendRequest,
    StoreCall,
    WaitForLog,
)
from p2psync.replication.hello import OFFERED_CAPABILITIES, REVS, Hello
from p2psync.replication.protocol import ReplicationProtocol
from p2psync.replication.scope import SyncScope
from p2psync.replication.sink import Sink
from p2psync.replication.wire import PeerError
from p2psync.sim.check import (
    CLASSES,
    Finding,
    answers,
    archived,
    canonical_state,
    intent_view,
    listed_without_roles,
    protocol_view,
    regressed,
    replica_state,
    scope_reads,
)
from p2psync.sim.network import Connection, Endpoint, Envelope, Link
from p2psync.sim.world import PendingDurable, SimClock, SimPeer, edges_of, seeded_uuid
from p2psync.sim.writers import CHAT, Authored, Cast, Writer
from p2psync.state.committer import StoreUnavailable

__all__ = ["FAULTS", "FAULT_MIXES", "SCOPE_MIXES", "SeedResult", "SimConfig", "Simulation", "run_seed"]

#: The faults a run injects (each counted in ``SeedResult.counts``).
FAULTS: Final = ("drop", "partition", "crash", "slow")
#: Relative weights of the events of the faulty phase.
WEIGHTS: Final = {
    "deliver": 60.0, "commit": 8.0, "connect": 8.0, "write": 6.0, "save": 2.0,
    "drop": 0.6, "partition": 0.3, "crash": 0.4, "slow": 0.3,
}
#: ``--faults heavy``: crashes, drops and partitions ten times as often, user writes and
#: periodic saves more often and commits rarer, so more crashes find an open batch.
HEAVY: Final = {**WEIGHTS, "crash": 3.0, "drop": 3.0, "partition": 1.0, "commit": 2.0, "write": 10.0, "save": 6.0}
#: The fault mixes ``--faults`` names.
FAULT_MIXES: Final = ("normal", "heavy")
#: What ``--scopes`` names: every link global, or some peers reached only through links of one
#: protocol or subset scope of the chat protocol (the seed picks which peers and which scope).
SCOPE_MIXES: Final = ("global", "mixed")
#: A delivery to a slow consumer goes ahead only this often (it is picked, then held back).
SLOW_DELIVERY: Final = 0.25
#: Quiescence: passes of rounds over every link before the seed counts as stuck.
MAX_PASSES: Final = 8
#: Quiescence: events within one pass before the seed counts as stuck.
MAX_PASS_EVENTS: Final = 200_000
#: Messages in flight on one connection above this break the memory bound: two directions of
#: unanswered `rev`s (the sink's cap), their listings, dependency and attachment requests.
IN_FLIGHT_SLACK: Final = 256


@dataclass(frozen=True)
class SimConfig:
    """What a run simulates (the seed decides everything else)."""

    peers: int = 4
    steps: int = 250
    topology: str = "random"
    ops: str = "full"
    faults: str = "normal"
    scopes: str = "global"

    def replay(self, seed: int) -> str:
        faults = f" --faults {self.faults}" if self.faults != "normal" else ""
        scopes = f" --scopes {self.scopes}" if self.scopes != "global" else ""
        return (f"p2psync sim --peers {self.peers} --seed {seed} --steps {self.steps}"
                f" --topology {self.topology} --ops {self.ops}{faults}{scopes} --trace")


@dataclass
class SeedResult:
    """The outcome of one seed: ``converged`` or the first class in ``CLASSES`` of its findings."""

    seed: int
    config: SimConfig
    outcome: str
    findings: list[Finding]
    counts: Counter[str]
    trace: list[str]
    digest: str
    canonical_divergence: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome == "converged"


@dataclass
class _Monitor:
    """The durable checkpoints of one peer as last seen, and the ledger rows seen so far."""

    checkpoints: dict[tuple[str, str, str], DirectionCheckpoint] = field(default_factory=dict)
    last_transition: int = 0
    changes: int = -1


class Simulation:
    """One seeded run in ``workdir`` (see the module doc). ``on_event`` sees every trace line."""

    def __init__(self, seed: int, config: SimConfig, workdir: Path,
                 on_event: Callable[[str], None] | None = None) -> None:
        if not 2 <= config.peers <= 6:
            raise ValueError("peers must be 2 to 6")
        if config.faults not in FAULT_MIXES:
            raise ValueError(f"faults must be one of {FAULT_MIXES}")
        if config.scopes not in SCOPE_MIXES:
            raise ValueError(f"scopes must be one of {SCOPE_MIXES}")
        self.seed = seed
        self.config = config
        self.workdir = workdir
        self.on_event = on_event
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.cast = Cast.seeded()
        self.tenant = self.cast.alice.did
        rng = self.rng
        self.peers = [
            SimPeer(f"p{i}", i, workdir / f"p{i}.db", self.tenant, seeded_uuid(rng),
                    (seeded_uuid(rng), seeded_uuid(rng)), self.clock, skew=rng.randint(-2, 2))
            for i in range(config.peers)
        ]
        # Every third peer (by seed and index, not by the random source, so the seeds' runs
        # stay as they were) offers no `revs`: both the batched path and the one-`rev`
        # fallback run in most seeds (replication-profiles.md §8.4).
        for peer in self.peers:
            peer.offers_revs = (seed + peer.index) % 3 != 0
        self.links: list[Link] = []
        for i, (a, b) in enumerate(edges_of(config.topology, config.peers, rng)):
            active, passive = (a, b) if rng.random() < 0.5 else (b, a)
            self.links.append(Link(i, active, passive))
        self.batch = rng.choice((1, 2, 3, 5, 8, 200))
        self.max_revs = rng.choice((1, 2, 4, 16, 1000))
        self.writer = Writer(rng, self.cast, config.ops, members=config.scopes == "mixed")
        self.trace: list[str] = []
        self.counts: Counter[str] = Counter()
        self.findings: list[Finding] = []
        self.touched: dict[Connection, None] = {}
        #: in-flight claims that ended, for `AwaitClaim`s: (connection, side, ref, held)
        self.claims_ended: list[tuple[Connection, int, int, bool]] = []
        self.connections = 0
        self.monitors = [_Monitor() for _ in self.peers]
        self.max_in_flight = 0
        self.applies: dict[tuple[int, str], str] = {}  # (peer, cid) -> its latest apply result
        self.suspects: list[tuple[int, str, str]] = []  # (peer, cid, why): frontier past a missing message
        self.log(f"seed {seed}: {config.peers} peers, links "
                 + " ".join(f"{lk.name}:p{lk.active}->p{lk.passive}" for lk in self.links)
                 + f", batch {self.batch}, max revs {self.max_revs}, ops {config.ops}")
        #: peers whose every link carries ``subset_scope`` (``--scopes mixed``); the others are full
        self.scoped: set[int] = set()
        self.subset_scope = SyncScope.global_scope()
        if config.scopes == "mixed":
            self._plan_scopes()

    def _plan_scopes(self) -> None:
        """Pick the scoped peers (the full ones stay connected through global links), write the
        chat protocol, a thread (a context to scope by) and carol's role in it on a full peer, and
        pick the scope."""
        rng, n = self.rng, len(self.peers)
        order = list(range(n))
        rng.shuffle(order)
        limit = rng.randint(1, max(1, n // 2))
        for i in order:
            rest = {j for j in range(n) if j != i and j not in self.scoped}
            if len(self.scoped) < limit and self._connected(rest):
                self.scoped.add(i)
        full = self.peers[min(set(range(n)) - self.scoped)]
        for op in ("configure", "thread", "participant"):
            self.log(f"write on {full.name}: {self.writer.perform(full, op, 0)}")
        thread = next(a for a in reversed(self.writer.authored.values()) if a.op == "thread")
        context = str(thread.message["contextId"])
        self.subset_scope = rng.choice((
            SyncScope.for_protocol(CHAT), SyncScope.subset(CHAT, ["thread"]), SyncScope.subset(CHAT, ["thread/chat"]),
            SyncScope.subset(CHAT, (), [context]), SyncScope.subset(CHAT, ["thread/chat"], [context]),
        ))
        for link in self.links:
            if {link.active, link.passive} & self.scoped:
                link.scope = self.subset_scope
        self.log(f"scoped peers {sorted(f'p{i}' for i in self.scoped)}: {self.subset_scope.to_wire()}")

    def _connected(self, members: set[int]) -> bool:
        """Whether ``members`` (non-empty) are connected by links between them."""
        if not members:
            return False
        reached, todo = set(), [min(members)]
        while todo:
            i = todo.pop()
            if i in reached:
                continue
            reached.add(i)
            todo.extend(lk.passive if lk.active == i else lk.active for lk in self.links
                        if i in (lk.active, lk.passive) and {lk.active, lk.passive} <= members)
        return reached == members

    # == the run ===============================================================================

    def run(self) -> SeedResult:
        """The whole run: the faulty phase, quiescence, the verdict."""
        self.play()
        return self.finish(self.quiesce())

    def play(self) -> None:
        """The faulty phase: ``steps`` events with writers and faults."""
        for _ in range(self.config.steps):
            self.step()

    def finish(self, quiet: bool, *, check_links: bool = True) -> SeedResult:
        """Judge the invariants (after :meth:`quiesce`; ``quiet``: whether it quiesced), close
        the stores and return the result. ``check_links``: judge the links' frontiers too."""
        if not quiet:
            self.finding("stuck", "no_quiescence", f"no quiescence after {MAX_PASSES} passes of rounds")
        canonical_diverged = self.judge(check_links=quiet and check_links)
        self.close()
        outcome = "converged"
        for cls in CLASSES:
            if any(f.cls == cls for f in self.findings):
                outcome = cls
                break
        digest = hashlib.sha256("\n".join(self.trace).encode()).hexdigest()
        return SeedResult(self.seed, self.config, outcome, self.findings, self.counts, self.trace, digest,
                          canonical_diverged)

    def close(self) -> None:
        for peer in self.peers:
            if peer.up:
                peer.crash()

    def log(self, text: str) -> None:
        line = f"{self.clock.step:5d} {text}"
        self.trace.append(line)
        if self.on_event is not None:
            self.on_event(line)

    def finding(self, cls: str, kind: str, detail: str) -> None:
        found = Finding(cls, kind, detail)
        self.findings.append(found)
        self.log(f"FINDING {found}")

    # == one step ===============================================================================

    def step(self) -> None:
        self.clock.step += 1
        self._scheduled()
        options = self._options()
        names = list(options)
        name = self.rng.choices(names, [options[n] for n in names])[0]
        getattr(self, f"_do_{name}")()
        self.settle()
        self._after_step()

    def _options(self) -> dict[str, float]:
        w = HEAVY if self.config.faults == "heavy" else WEIGHTS
        options: dict[str, float] = {}
        if any(p.up for p in self.peers):
            options["write"] = w["write"]
        if any(c.in_flight for c in self._alive()):
            options["deliver"] = w["deliver"]
        if any(p.up and (p.committer.in_batch or p.pending) for p in self.peers):
            options["commit"] = w["commit"]
        if self._connectable():
            options["connect"] = w["connect"]
        if self._saveable():
            options["save"] = w["save"]
        if any(lk.conn is not None or self._link_up(lk) for lk in self.links):
            options["drop"] = w["drop"]
        if any(p.reachable(self.clock.step) for p in self.peers):
            options["partition"] = w["partition"]
            options["crash"] = w["crash"]
            options["slow"] = w["slow"]
        return options or {"idle": 1.0}

    def _scheduled(self) -> None:
        """Peers whose downtime is over restart."""
        for peer in self.peers:
            if not peer.up and peer.down_until <= self.clock.step:
                self._restart(peer)

    def _after_step(self) -> None:
        for conn in self._alive():
            self.max_in_flight = max(self.max_in_flight, len(conn.in_flight))
            if len(conn.in_flight) > 2 * self.max_revs + IN_FLIGHT_SLACK:
                self.finding("stuck", "memory", f"{len(conn.in_flight)} messages in flight on {conn.link.name}")
                self._close(conn, "memory bound", failed=True)
            elif self._wedged(conn):
                self.finding("stuck", "wedged", f"{conn.link.name} #{conn.number}: nothing in flight, nothing to"
                             f" commit, and {self._busy_ops(conn)} not finished")
                self._close(conn, "stalled", failed=True)
        for peer in self.peers:
            self._watch_checkpoints(peer)

    # == events =================================================================================

    def _alive(self) -> list[Connection]:
        return [lk.conn for lk in self.links if lk.conn is not None and lk.conn.alive]

    def _link_up(self, link: Link) -> bool:
        step = self.clock.step
        a, p = self.peers[link.active], self.peers[link.passive]
        return link.down_until <= step and a.reachable(step) and p.reachable(step)

    def _dirty(self, link: Link) -> bool:
        if link.failed or link.synced is None:
            return True
        return link.synced != (self.peers[link.active].log_version(), self.peers[link.passive].log_version())

    def _connectable(self) -> list[Link]:
        return [lk for lk in self.links if lk.conn is None and self._link_up(lk) and self._dirty(lk)]

    def _saveable(self) -> list[Connection]:
        return [c for c in self._alive() if c.round is not None and c.op is not None and not c.op.done
                and not c.round.finishing and c.save is None]

    def _do_idle(self) -> None:
        """Every peer is down: time passes."""

    def _do_deliver(self) -> None:
        conns = [c for c in self._alive() if c.in_flight]
        conn = self.rng.choice(conns)
        index = self.rng.randrange(len(conn.in_flight))
        envelope = conn.in_flight[index]
        target = conn.ends[envelope.to].peer
        if target.slow_until > self.clock.step and self.rng.random() >= SLOW_DELIVERY:
            self.counts["slow_held_back"] += 1
            return
        del conn.in_flight[index]
        self._deliver(conn, envelope)

    def _deliver(self, conn: Connection, envelope: Envelope) -> None:
        end = conn.ends[envelope.to]
        self.counts["delivered"] += 1
        self.log(f"deliver {conn.link.name}#{conn.number} -> {end.peer.name} {envelope.kind} {envelope.label}")
        if envelope.kind == "request":
            end.proto.receive_request(*envelope.args)
        elif envelope.kind == "reply":
            end.proto.receive_response(*envelope.args)
        else:
            ref, error = envelope.args
            end.proto.receive_error(ref, PeerError(error.code, error.name, error.detail, dict(error.body)))
        self.touch(conn)

    def _do_commit(self) -> None:
        peer = self.rng.choice([p for p in self.peers if p.up and (p.committer.in_batch or p.pending)])
        self.commit(peer)

    def commit(self, peer: SimPeer) -> None:
        self.counts["commits"] += 1
        try:
            peer.committer.flush()
        except StoreUnavailable as exc:
            self.log(f"commit on {peer.name} failed: {exc}")
        self._resolve(peer)

    def _do_connect(self) -> None:
        self.connect(self.rng.choice(self._connectable()))

    def connect(self, link: Link) -> Connection:
        a, p = self.peers[link.active], self.peers[link.passive]
        self.connections += 1
        protos = [
            ReplicationProtocol(identity=self.cast.alice, active=side == 0, max_unanswered_revs=self.max_revs,
                                mine=Hello(self.tenant, peer.store_id, self.rng.randbytes(32), "p2psync-sim",
                                           capabilities=self._capabilities(link, peer)))
            for side, peer in enumerate((a, p))
        ]
        conn = Connection(self.connections, link, (Endpoint(a, protos[0], generation=a.generation),
                                                   Endpoint(p, protos[1], generation=p.generation)))
        conn.versions = (a.log_version(), p.log_version())
        link.conn = conn
        link.rounds += 1
        self.counts["rounds"] += 1
        self.log(f"connect {link.name}#{conn.number} {a.name}->{p.name}")
        protos[1].start_hello()
        conn.hello = protos[0].start_hello()
        self.touch(conn)
        return conn

    def _capabilities(self, link: Link, peer: SimPeer) -> tuple[str, ...]:
        """A scoped link offers what p2psync offers (`roleRecords`: the subset sink asks for the
        role records a re-configure creates); `revs` as the peer offers it (§8.4)."""
        if link.scope.kind == "global":
            return (REVS,) if peer.offers_revs else ()
        return tuple(c for c in OFFERED_CAPABILITIES if c != REVS or peer.offers_revs)

    def _do_write(self) -> None:
        peer = self.rng.choice([p for p in self.peers if p.up])
        self.commit(peer)  # the user's write takes the store's write lock after the open batch
        self.counts["writes"] += 1
        self.log(f"write on {peer.name}: {self.writer.act(peer, self.clock.step)}")

    def _do_save(self) -> None:
        conn = self.rng.choice(self._saveable())
        assert conn.round is not None
        conn.save = conn.active.proto.save(conn.round)
        conn.saves += 1
        self.counts["saves"] += 1
        self.log(f"save {conn.link.name}#{conn.number}")
        self.touch(conn)

    def _do_drop(self) -> None:
        link = self.rng.choice([lk for lk in self.links if lk.conn is not None or self._link_up(lk)])
        link.down_until = self.clock.step + self.rng.randint(2, 30)
        self.counts["drop"] += 1
        self.log(f"drop {link.name} until {link.down_until}")
        if link.conn is not None:
            self._close(link.conn, "dropped", failed=True)

    def _do_partition(self) -> None:
        peer = self.rng.choice([p for p in self.peers if p.reachable(self.clock.step)])
        peer.partitioned_until = self.clock.step + self.rng.randint(10, 60)
        self.counts["partition"] += 1
        self.log(f"partition {peer.name} until {peer.partitioned_until}")
        for conn in self._alive():
            if peer in (conn.active.peer, conn.passive.peer):
                self._close(conn, "partitioned", failed=True)

    def _do_crash(self) -> None:
        peer = self.rng.choice([p for p in self.peers if p.reachable(self.clock.step)])
        in_batch = peer.committer.in_batch
        if in_batch:
            self.counts["crash_lost_batch"] += 1
        peer.crash()
        peer.down_until = self.clock.step + self.rng.randint(2, 25)
        self.counts["crash"] += 1
        self.log(f"crash {peer.name} (open batch lost: {in_batch}) until {peer.down_until}")
        for conn in self._alive():
            if peer in (conn.active.peer, conn.passive.peer):
                self._close(conn, "peer crashed", failed=True)

    def _do_slow(self) -> None:
        peer = self.rng.choice([p for p in self.peers if p.reachable(self.clock.step)])
        peer.slow_until = self.clock.step + self.rng.randint(20, 80)
        self.counts["slow"] += 1
        self.log(f"slow {peer.name} until {peer.slow_until}")

    def _restart(self, peer: SimPeer) -> None:
        peer.open()
        self.monitors[peer.index].changes = -1
        self.counts["restart"] += 1
        self.log(f"restart {peer.name}")
        self._check_frontiers(after_crash=True)

    # == carrying out what the protocol objects ask ==============================================

    def touch(self, conn: Connection) -> None:
        self.touched[conn] = None

    def settle(self) -> None:
        """Carry out every output of every protocol object that had an input, until none has."""
        while self.touched or self.claims_ended:
            if self.claims_ended:
                ended, self.claims_ended = self.claims_ended, []
                for conn, side, ref, held in ended:
                    if conn.alive and self._current(conn.ends[side]):
                        conn.ends[side].proto.store_done(ref, held)
                        self.touch(conn)
                continue
            conn = next(iter(self.touched))
            del self.touched[conn]
            self._collect(conn)
            self._advance(conn)

    def _current(self, end: Endpoint) -> bool:
        """Whether ``end``'s process still runs (not crashed since the protocol object was made)."""
        return end.peer.up and end.peer.generation == end.generation

    def _collect(self, conn: Connection) -> None:
        for side, end in enumerate(conn.ends):
            if not self._current(end):
                end.proto.outputs()  # a crashed process does nothing more
                continue
            while outputs := end.proto.outputs():
                for out in outputs:
                    self._output(conn, side, end, out)
        if conn.closing is not None and conn.alive:
            self._close(conn, conn.closing, failed=True)

    def _output(self, conn: Connection, side: int, end: Endpoint, out: Output) -> None:
        if isinstance(out, StoreCall):
            self._store(conn, side, end, out)
        elif isinstance(out, OperationFinished) or not conn.alive:
            return  # what a closed connection sends goes nowhere
        elif isinstance(out, SendRequest):
            conn.rids += 1
            other = 1 - side
            if out.profile in ("rev", "revs"):
                self.counts[out.profile] += 1  # both paths are exercised (§8.4)
            if not out.no_reply:
                conn.ends[other].asked[conn.rids] = (out.ref, out.max_reply)
            conn.in_flight.append(Envelope(other, "request", (conn.rids, out.profile, out.properties, out.body),
                                           out.profile))
        elif isinstance(out, SendReply | SendError):
            slot = end.asked.pop(out.rid, None)
            if slot is None:
                return
            ref, max_reply = slot
            if isinstance(out, SendReply):
                if max_reply is not None and len(out.body) > max_reply:
                    error = PeerError(424, "AttachmentInvalid", "reply above its limit")
                    conn.in_flight.append(Envelope(1 - side, "error", (ref, error), "error 424"))
                    conn.closing = "P2PSync 424 AttachmentInvalid"
                    return
                conn.in_flight.append(Envelope(1 - side, "reply", (ref, out.properties, out.body), "reply"))
            else:
                conn.in_flight.append(Envelope(1 - side, "error", (ref, out.error),
                                               f"error {out.error.code} {out.error.name}"))
        elif isinstance(out, CloseConnection):
            conn.closing = out.reason

    def _store(self, conn: Connection, side: int, end: Endpoint, call: StoreCall) -> None:
        request, peer = call.request, end.peer
        service = peer.service
        if isinstance(request, ClaimMessages):
            end.proto.store_done(call.ref, peer.in_flight.claim(request.tenant, request.cids, request.claimant))
            return
        if isinstance(request, ReleaseClaims):
            peer.in_flight.release(request.tenant, request.cids, request.claimant, held=request.held)
            return
        if isinstance(request, AwaitClaim):
            if conn.alive:
                peer.in_flight.wait(request.tenant, request.cid,
                                    lambda held: self.claims_ended.append((conn, side, call.ref, held)), request.serial)
            return
        if request.durable:
            if not conn.alive:
                return  # its task went with the connection
            if isinstance(request, WaitForLog):
                end.proto.store_done(call.ref, None)
            elif isinstance(request, Durable):
                peer.pending.append(_pending(conn, side, call.ref, request.ticket))
            else:
                try:
                    value, batch = service.committer.run(service.writer(request))
                except Exception as exc:
                    end.proto.store_failed(call.ref, exc)
                else:
                    peer.pending.append(_pending(conn, side, call.ref, batch, value))
            self._resolve(peer)
            return
        if call.ref < 0:
            if isinstance(request, RecordSteps) and request.at_commit:
                service.record_at_commit(request, end.proto.fail_feed)
            else:
                try:
                    service.run(request)
                except PeerError as exc:
                    self.log(f"store request {type(request).__name__} on {peer.name}: {exc}")
        else:
            try:
                value = service.run(request)
            except Exception as exc:
                end.proto.store_failed(call.ref, exc)
            else:
                if isinstance(request, Apply):
                    self._note_apply(peer, request.entry, value[0])
                elif isinstance(request, ApplyBatch):
                    for entry, (result, _) in zip(request.entries, value[0], strict=False):
                        self._note_apply(peer, entry, result)
                end.proto.store_done(call.ref, value)
        self._resolve(peer)

    def _note_apply(self, peer: SimPeer, entry: Any, result: Any) -> None:
        """Keep each message's latest apply result per peer (the findings quote it)."""
        text = result.kind
        wire = result.to_json()
        detail = wire.get("reason") or wire.get("code") or wire.get("missing")
        if detail:
            text += f" {json.dumps(detail, sort_keys=True, default=str)[:120]}"
        self.applies[(peer.index, entry.cid)] = text
        self.counts[f"apply_{result.kind}"] += 1

    def _resolve(self, peer: SimPeer) -> None:
        """Answer the durable requests whose batch has committed (or failed)."""
        if not peer.pending:
            return
        waiting = []
        for pending in peer.pending:
            batch = pending.batch
            if not batch.done.is_set():
                waiting.append(pending)
                continue
            conn: Connection = pending.conn
            end = conn.ends[pending.side]
            if not conn.alive or not self._current(end):
                continue
            if batch.error is not None:
                end.proto.store_failed(pending.ref, PeerError(503, "StoreUnavailable", str(batch.error)))
            else:
                end.proto.store_done(pending.ref, pending.value)
            self.touch(conn)
        peer.pending = waiting

    def _advance(self, conn: Connection) -> None:
        """The active driver: hello, then the round; close when it ends."""
        if not conn.alive:
            return
        active = conn.active
        if conn.hello is not None and conn.hello.done and conn.op is None:
            if conn.hello.error is not None:
                self._close(conn, f"hello failed: {conn.hello.error}", failed=True)
                return
            conn.op, conn.round = active.proto.sync(
                tenant=self.tenant, scope=conn.link.scope, local_store_id=active.peer.store_id, pull=True, push=True,
                batch=self.batch,
            )
            self.touch(conn)
        if conn.save is not None and conn.save.done:
            error = conn.save.error
            conn.save = None
            if error is not None and not isinstance(error, ConnectionLost):
                self._close(conn, f"save failed: {_describe(error)}", failed=True)
                return
        if conn.op is not None and conn.op.done and conn.save is None:
            if conn.op.error is not None:
                self._close(conn, f"round failed: {_describe(conn.op.error)}", failed=True)
            else:
                self._close(conn, "round done", failed=False)

    def _close(self, conn: Connection, reason: str, *, failed: bool) -> None:
        """End ``conn``: in-flight messages vanish; the running ends learn the connection is lost."""
        if not conn.alive:
            return
        conn.alive = False
        conn.outcome = reason
        conn.in_flight.clear()
        self.touched.pop(conn, None)
        link = conn.link
        if link.conn is conn:
            link.conn = None
        active = conn.active
        if failed:
            link.failed = True
            self.counts["rounds_failed"] += 1
            if conn.round is not None and conn.round.key is not None and self._current(active):
                code = conn.op.error if conn.op is not None and conn.op.error is not None else None
                name = f"{code.code} {code.name}" if isinstance(code, PeerError) else reason
                active.peer.ledger.record_failure(conn.round.key, name[:200])
        else:
            link.failed = False
            link.synced = conn.versions
            link.rounds_ok += 1
            self._check_copy(conn)
        self.log(f"close {link.name}#{conn.number}: {reason}")
        for end in conn.ends:
            if self._current(end):
                end.proto.connection_lost(reason)
        self._collect(conn)

    def _check_copy(self, conn: Connection) -> None:
        """After a round that succeeded, the passive's copy of the pair is the active's ledger
        (§4.4: else the next round starts with a rewind it did not need)."""
        active, passive = conn.active.peer, conn.passive.peer
        key = conn.round.key if conn.round is not None else None
        if key is None or not (self._current(conn.active) and self._current(conn.passive)):
            return
        pair = {str(d): active.ledger.get_checkpoint(key, d)[0].to_wire() for d in (Direction.PULL, Direction.PUSH)}
        cp_id = checkpoint_id(active.store_id, passive.store_id, key.scope_id, self.tenant)
        copy = passive.service.copies.get(self.tenant, cp_id)
        if copy is None or copy[0] != pair:
            theirs = {d: _pos(DirectionCheckpoint.from_wire(copy[0].get(d, {}))) for d in ("pull", "push")} if copy \
                else None
            self.finding("diverged", "copy", f"{conn.link.name}#{conn.number}: after the round the copy on"
                         f" {passive.name} is {theirs}, the ledger of {active.name}"
                         f" {({d: _pos(DirectionCheckpoint.from_wire(w)) for d, w in pair.items()})}")

    def _busy_ops(self, conn: Connection) -> str:
        return ",".join(op.name for op in (conn.hello, conn.op, conn.save) if op is not None and not op.done)

    def _wedged(self, conn: Connection) -> bool:
        if conn.in_flight or not conn.busy:
            return False
        if any(p.conn is conn for end in conn.ends for p in end.peer.pending):
            return False
        # A sink waiting for another link's apply of a message it declined, or of one a
        # `proposeChanges` listed (issue #17), waits on that link, which the detector judges on
        # its own.
        return not any(end.peer.in_flight.holder(sink.tenant, cid) is not None
                       for end in conn.ends if self._current(end)
                       for sink in end.proto.sinks.values() for cid in _awaited(sink))

    # == invariants watched while running ======================================================

    def _watch_checkpoints(self, peer: SimPeer) -> None:
        """A frontier of the ledger moves back only through a logged rewind or reset (read when
        nothing is uncommitted, so what is compared is what a crash would keep)."""
        if not peer.up or peer.store.conn.in_transaction:
            return
        monitor = self.monitors[peer.index]
        changes = peer.store.conn.total_changes()
        if changes == monitor.changes:
            return
        monitor.changes = changes
        ledger = peer.ledger
        transitions = ledger.transitions(after=monitor.last_transition)
        if transitions:
            monitor.last_transition = transitions[-1].id
        logged = {(t.key.remote, str(t.direction)) for t in transitions
                  if t.kind in ("checkpoint_rewind", "checkpoint_reset")}
        for link in ledger.links(self.tenant):
            for direction in (Direction.PULL, Direction.PUSH):
                checkpoint, _ = ledger.get_checkpoint(link.key, direction)
                key = (link.key.remote, link.key.scope_id, str(direction))
                before = monitor.checkpoints.get(key)
                monitor.checkpoints[key] = checkpoint
                if before is not None and regressed(before, checkpoint) and (key[0], key[2]) not in logged:
                    self.finding("lost", "checkpoint_regressed",
                                 f"{peer.name} {direction} to {self._peer_of(link.key.remote)} moved back"
                                 f" without a logged rewind: {_pos(before)} -> {_pos(checkpoint)}")

    def _peer_of(self, remote: str) -> str:
        store_id = remote.rsplit("storeId=", 1)[-1]
        for peer in self.peers:
            if peer.store_id == store_id:
                return peer.name
        return remote

    def _check_frontiers(self, *, after_crash: bool) -> None:
        """No durable frontier covers a message of the log it follows that the follower lacks
        (and holds nothing of that record instead). A pull frontier is the puller's ledger,
        committed with its applies. For a push, the pusher's ledger may run ahead of what the
        passive made durable — §4.4's start-point comparison with the passive's copy catches
        that — so the copy is what must never run ahead. Suspects are judged at the end."""
        for link in self.links:
            active, passive = self.peers[link.active], self.peers[link.passive]
            if not (active.up and passive.up):
                continue
            remote = f"{self.tenant}?storeId={passive.store_id}"
            for found in active.ledger.links(self.tenant):
                if found.key.remote != remote or found.key.scope_id != link.scope.scope_id:
                    continue
                pull, _ = active.ledger.get_checkpoint(found.key, Direction.PULL)
                cp_id = checkpoint_id(active.store_id, passive.store_id, found.key.scope_id, self.tenant)
                copy = passive.service.copies.get(self.tenant, cp_id)
                push = DirectionCheckpoint.from_wire(copy[0].get("push", {})) if copy else DirectionCheckpoint()
                for direction, checkpoint, follower, source in ((Direction.PULL, pull, active, passive),
                                                                (Direction.PUSH, push, passive, active)):
                    for cid in self._covered_missing(checkpoint, follower, source, link.scope):
                        self.suspects.append((follower.index, cid, f"{direction} frontier of {active.name}"
                                              f"->{passive.name} covers it"
                                              f"{' after a crash' if after_crash else ''}"))

    def _covered_missing(self, checkpoint: DirectionCheckpoint, follower: SimPeer, source: SimPeer,
                         scope: SyncScope) -> list[str]:
        """The messages of ``scope``'s intent under the frontier that ``follower`` lacks."""
        frontier = checkpoint.contiguous_applied_token
        if frontier is None or frontier.domain != source.stream:
            return []
        tid = source.store.tenant_id(self.tenant, create=False)
        if tid is None:
            return []
        rows = source.store.conn.execute(
            "SELECT e.cid, m.record_id, e.indexes FROM events e"
            " LEFT JOIN messages m ON m.tenant = e.tenant AND m.cid = e.cid"
            " WHERE e.tenant=? AND e.position<=? ORDER BY e.position", (tid, frontier.position)
        ).fetchall()
        held = follower.held()
        missing = []
        for cid, record_id, indexes in rows:
            if cid in held or scope.kind != "global" and not scope.matches(json.loads(str(indexes))):
                continue
            if record_id is not None and follower.store.conn.execute(
                "SELECT 1 FROM messages m JOIN tenants t ON t.id = m.tenant WHERE t.did=? AND m.record_id=? LIMIT 1",
                (self.tenant, record_id),
            ).fetchone():
                continue  # the follower holds a later state of the record
            missing.append(str(cid))
        return missing

    # == quiescence ===============================================================================

    def quiesce(self) -> bool:
        """Stop writers and faults, heal everything, and run rounds on every link until a whole
        pass moves nothing. False when that does not happen within ``MAX_PASSES``."""
        self.log("quiesce: writers and faults stop, everything heals")
        for peer in self.peers:
            if not peer.up:
                peer.down_until = self.clock.step
                self._restart(peer)
            peer.partitioned_until = -1
            peer.slow_until = -1
        for link in self.links:
            link.down_until = -1
        if not self._drain():
            return False
        for number in range(1, MAX_PASSES + 1):
            before = self._fingerprint()
            self.log(f"pass {number}")
            for link in self.links:
                self.connect(link)
            self.settle()
            if not self._drain():
                return False
            if all(lk.rounds_ok and not lk.failed for lk in self.links) and self._fingerprint() == before:
                return True
        return False

    def _drain(self) -> bool:
        """Deliver and commit until nothing is in flight or waiting for a commit."""
        for _ in range(MAX_PASS_EVENTS):
            self.clock.step += 1
            conns = [c for c in self._alive() if c.in_flight]
            if conns:
                conn = self.rng.choice(conns)
                self._deliver(conn, conn.in_flight.pop(self.rng.randrange(len(conn.in_flight))))
            else:
                peers = [p for p in self.peers if p.committer.in_batch or p.pending]
                if not peers:
                    self.settle()
                    self._after_step()
                    if not any(c.in_flight for c in self._alive()):
                        return True
                    continue
                self.commit(self.rng.choice(peers))
            self.settle()
            self._after_step()
        self.finding("stuck", "no_drain", f"still busy after {MAX_PASS_EVENTS} events")
        return False

    def _fingerprint(self) -> tuple[int, ...]:
        return tuple(p.log_version() for p in self.peers)

    # == the verdict ================================================================================

    def judge(self, *, check_links: bool) -> bool:
        """Check the invariants after quiescence; returns whether replicas differ from canonical."""
        owner = self.cast.alice
        full = [p for p in self.peers if p.index not in self.scoped]
        states = [replica_state(p.store, owner) for p in full]
        union = self._full_union(full)
        canonical, refused = canonical_state(self.workdir / "canonical.db", owner, union)
        self.log(f"judge: {len(union)} messages accepted by devices, canonical holds {len(canonical.messages)}"
                 f" (refused in canonical order: {refused or 'none'});"
                 f" replicas hold {[len(s.messages) for s in states]}")
        self.counts["authored"] = len(union)
        for peer, state in zip(full[1:], states[1:], strict=True):
            if state != states[0]:
                self.finding("diverged", "replicas", f"{full[0].name} vs {peer.name}: "
                             f"{states[0].differences(state)}")
        diverged = False
        for peer, state in zip(full, states, strict=True):
            if state != canonical:
                diverged = True
                self.finding("diverged", "canonical", f"{peer.name} vs canonical: {state.differences(canonical)}")
                break
        for authored in sorted(union, key=lambda a: (a.step, a.cid)):
            if authored.cid not in canonical.messages:
                continue
            lacking = [p for p, s in zip(full, states, strict=True) if authored.cid not in s.messages]
            if lacking:
                self.finding("lost", "message", f"{authored.op} {authored.cid[-10:]} accepted on {authored.peer} at"
                             f" step {authored.step} is canonical but missing on "
                             + ", ".join(f"{p.name} ({self._applied(p.index, authored.cid)})" for p in lacking))
        self._check_frontiers(after_crash=False)
        seen: set[tuple[int, str]] = set()
        for index, cid, why in self.suspects:
            if self._applied(index, cid).split()[0] in ("Invalid", "Superseded"):
                continue  # settled by the engine's refusal, as §11 says: the message finding tells
            if cid in canonical.messages and (index, cid) not in seen:
                seen.add((index, cid))
                self.finding("lost", "frontier", f"{self.peers[index].name} lacks {cid[-10:]}: {why}"
                             f" ({self._applied(index, cid)})")
        for peer in self.peers:
            if peer.index in self.scoped:
                self._judge_subset(peer, full[0])
        if check_links:
            self._check_links()
        return diverged

    def _full_union(self, full: list[SimPeer]) -> list[Authored]:
        """What the full peers must hold the canonical state of: what their users wrote and, of
        what was written on scoped peers, what the scope lists (but for role records outside its
        intent: rule 3 lists those only once a configure makes their path a role) or what a
        full peer admitted (closure dependencies)."""
        union = list(self.writer.authored.values())
        if not self.scoped:
            return union
        names = {p.name for p in full}
        admitted = set().union(*(archived(p.store, self.tenant) for p in full))
        scope = self.subset_scope
        return [a for a in union
                if a.peer in names or a.cid in admitted or listed_without_roles(scope, a.indexes)]

    def _judge_subset(self, peer: SimPeer, reference: SimPeer) -> None:
        """A peer reached only through scoped links holds a subset (docs/scopes.md). Against a
        full peer: (a) it holds every message of the scope's intent, and no other, with the
        data; (b) closure-complete: the messages it holds, processed alone in canonical order,
        reach its state (a message admitted without what it depends on would be refused);
        (c) the reads inside the scope answer as on the full peer, for alice, bob and carol;
        (d) it holds the permissions protocol's messages the full peer holds (docs/scopes.md:
        every scope carries the tenant's requests, grants and revocations)."""
        scope, owner = self.subset_scope, self.cast.alice
        want, want_data = intent_view(reference.store, self.tenant, scope)
        got, got_data = intent_view(peer.store, self.tenant, scope)
        authored = self.writer.authored
        for cid in sorted(want - got):
            op = authored[cid].op if cid in authored else "?"
            self.finding("lost", "subset_message", f"{op} {cid[-10:]} in the scope is on {reference.name} but"
                         f" missing on {peer.name} ({self._applied(peer.index, cid)})")
        permissions = protocol_view(reference.store, self.tenant, PERMISSIONS_PROTOCOL_URI)
        for cid in sorted(permissions - protocol_view(peer.store, self.tenant, PERMISSIONS_PROTOCOL_URI)):
            op = authored[cid].op if cid in authored else "?"
            self.finding("lost", "subset_permission", f"{op} {cid[-10:]} is on {reference.name} but missing on"
                         f" {peer.name} ({self._applied(peer.index, cid)})")
        for cid in sorted(got - want):
            op = authored[cid].op if cid in authored else "?"
            self.finding("diverged", "subset_extra", f"{op} {cid[-10:]} in the scope is on {peer.name} but not on"
                         f" {reference.name} ({self._applied(reference.index, cid)})")
        if want_data != got_data:
            self.finding("diverged", "subset_data", f"{peer.name} vs {reference.name}: data of the scope's records"
                         f" {len(got_data)} vs {len(want_data)}")
        state = replica_state(peer.store, owner)
        admitted = archived(peer.store, self.tenant)
        alone, _ = canonical_state(self.workdir / f"alone-{peer.name}.db", owner,
                                   [authored[c] for c in admitted if c in authored])
        unknown = len(admitted - set(authored))
        if alone != state or unknown:
            self.finding("diverged", "subset_closure", f"{peer.name}: the messages it admitted, processed alone:"
                         f" {alone.differences(state)}; {unknown} no user wrote")
        reads = scope_reads(self.cast, scope, reference.store, self.tenant)
        mine, theirs = answers(peer.dwn, self.tenant, reads), answers(reference.dwn, self.tenant, reads)
        differ = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
        if differ:
            who, message = reads[differ[0]]
            d = message["descriptor"]
            self.finding("diverged", "subset_reads", f"{len(differ)} of {len(reads)} reads inside the scope answer"
                         f" otherwise on {peer.name} than on {reference.name}; first: {who}'s {d['method']}"
                         f" {json.dumps(d.get('filter'), sort_keys=True)[:160]}: {_answer(mine[differ[0]])} vs"
                         f" {_answer(theirs[differ[0]])}")
        results = sum(1 for code, seen in theirs if code == 200 and seen)
        self.counts.update(subset_intent=len(got), subset_reads=len(reads), subset_reads_with_results=results)
        self.log(f"judge {peer.name}: {len(got)} messages of the scope's intent, {len(state.messages)} held,"
                 f" {len(reads)} reads compared ({results} with results)")

    def _applied(self, peer: int, cid: str) -> str:
        return self.applies.get((peer, cid), "never applied")

    def _check_links(self) -> None:
        for link in self.links:
            active, passive = self.peers[link.active], self.peers[link.passive]
            remote = f"{self.tenant}?storeId={passive.store_id}"
            found = [lk for lk in active.ledger.links(self.tenant)
                     if lk.key.remote == remote and lk.key.scope_id == link.scope.scope_id]
            if not found:
                self.finding("stuck", "link", f"{link.name}: no ledger link on {active.name}")
                continue
            key = found[0].key
            if found[0].state != LinkState.LIVE:
                self.finding("stuck", "link", f"{link.name}: {found[0].state} ({found[0].last_error})")
            for direction, source in ((Direction.PULL, passive), (Direction.PUSH, active)):
                checkpoint, _ = active.ledger.get_checkpoint(key, direction)
                head = _head(source, self.tenant)
                frontier = checkpoint.contiguous_applied_token
                at = None if frontier is None else (frontier.domain, frontier.position)
                if head is not None and at != (source.stream, head):
                    follower = passive if direction == Direction.PUSH else active
                    blocked = ", ".join(f"{t.message_cid[-10:]}: {self._applied(follower.index, t.message_cid)}"
                                        for t in checkpoint.unapplied_tokens[:2])
                    self.finding("stuck", "frontier", f"{link.name} {direction}: frontier {_pos(checkpoint)},"
                                 f" head of {source.name}'s log {head}"
                                 f" (unapplied {len(checkpoint.unapplied_tokens)}: {blocked})")


def _awaited(sink: Sink) -> Iterator[str]:
    """The CIDs ``sink`` waits on another link's claim of."""
    if sink.awaiting is not None:
        yield sink.awaiting
    for item in sink.window.open_items():
        if item.elsewhere:
            yield item.token.message_cid


def _answer(answer: tuple[int, list[str]]) -> str:
    code, seen = answer
    return f"{code} [{', '.join(s[-8:] for s in seen[:4])}{', …' if len(seen) > 4 else ''}]"


def _pending(conn: Connection, side: int, ref: int, batch: Any, value: Any = None) -> PendingDurable:
    return PendingDurable(conn, side, ref, batch, value)


def _describe(error: BaseException) -> str:
    if isinstance(error, PeerError):
        return f"{error.code} {error.name} {error.detail[:80]}"
    return f"{type(error).__name__}: {str(error)[:80]}"


def _pos(checkpoint: DirectionCheckpoint) -> str:
    c, r = checkpoint.contiguous_applied_token, checkpoint.received_token
    return f"{None if c is None else c.position}/{None if r is None else r.position}"


def _head(peer: SimPeer, tenant: str) -> int | None:
    row = peer.store.conn.execute(
        "SELECT max(e.position) FROM events e JOIN tenants t ON t.id = e.tenant WHERE t.did=?", (tenant,)
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def run_seed(seed: int, config: SimConfig, workdir: Path, on_event: Callable[[str], None] | None = None) -> SeedResult:
    """Run one seed in ``workdir`` (an empty directory the caller owns). An exception escaping
    the protocol, the store or the simulator is a finding too (the seed is ``stuck``)."""
    sim = Simulation(seed, config, workdir, on_event)
    try:
        return sim.run()
    except Exception as exc:
        sim.finding("stuck", "exception", "".join(traceback.format_exception(exc)).strip()[-2000:])
        sim.close()
        digest = hashlib.sha256("\n".join(sim.trace).encode()).hexdigest()
        return SeedResult(seed, config, "stuck", sim.findings, sim.counts, sim.trace, digest)
