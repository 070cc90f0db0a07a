"""Two ReplicationProtocol objects pumped against each other: no trio, no sockets (issue #12).

A plain loop carries every request, reply and refusal from one protocol object to the other
and answers their store requests on real SQLite stores, synchronously. A seeded random source
decides which in-flight message is delivered next, so the same exchange runs in many orders.
The whole active round goes through: hello, getCollections, a pull, a push, setCheckpoint,
and the checkpoints settle at the two logs' heads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.replication import protocol as protocol_module
from p2psync.replication import sink as sink_module
from p2psync.replication.checkpoint import checkpoint_id
from p2psync.replication.effects import (
    AwaitClaim,
    ClaimMessages,
    CloseConnection,
    OperationFinished,
    ReadPage,
    RecordSteps,
    ReleaseClaims,
    SendError,
    SendReply,
    SendRequest,
    StoreCall,
)
from p2psync.replication.hello import new_hello
from p2psync.replication.inflight import InFlightClaims
from p2psync.replication.protocol import ReplicationProtocol
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import PeerError, encode_body
from p2psync.state.committer import GroupCommitter
from p2psync.state.copies import CheckpointCopies, store_id
from p2psync.state.ledger import Direction, Ledger, LinkState
from p2psync.state.service import StoreService
from tests.peer.support import NOTE, assert_same
from tests.replication.support import Clock, seeded

ALICE = seeded("pump-alice")


@dataclass
class Side:
    """One peer: its store, its store service and its protocol object."""

    name: str
    store: Store
    service: StoreService
    proto: ReplicationProtocol
    #: rid -> (requester, requester's ref, max reply size) for requests this side must answer
    asked: dict[int, tuple[Side, int, int | None]] = field(default_factory=dict)
    #: the messages its sinks are receiving (issue #17), as a Peer keeps them for its connections
    claims: InFlightClaims = field(default_factory=InFlightClaims)


def make_side(tmp_path: Path, name: str, *, active: bool, max_unanswered_revs: int = 1000) -> Side:
    store = Store(tmp_path / f"{name}.db")
    ledger = Ledger.for_store(store)
    service = StoreService(store, dwn=Dwn(store), ledger=ledger, copies=CheckpointCopies(store),
                           committer=GroupCommitter(store))
    proto = ReplicationProtocol(identity=ALICE, mine=new_hello(ALICE.did, store_id(store), "pump"), active=active,
                                max_unanswered_revs=max_unanswered_revs)
    return Side(name, store, service, proto)


def write_notes(store: Store, author: Identity, count: int, clock: Clock, prefix: str) -> None:
    dwn = Dwn(store)
    for i in range(count):
        now = clock.tick()
        data = f"{prefix} {i}".encode() if i % 4 else bytes([i]) * 40_000  # every 4th travels out of line
        write = RecordsWrite.create(signer=author, data=data, schema=NOTE, data_format="text/plain",
                                    message_timestamp=now, date_created=now)
        assert dwn.process_message(author.did, write.message, data).code == 202


class Wire:
    """The two sides and what is in flight between them; ``rng`` picks the next delivery."""

    def __init__(self, a: Side, b: Side, rng: random.Random) -> None:
        self.sides = (a, b)
        self.rng = rng
        self.in_flight: list[tuple[Side, str, tuple[Any, ...]]] = []
        self.rids = 0
        self.closed: list[CloseConnection] = []

    def other(self, side: Side) -> Side:
        return self.sides[1] if side is self.sides[0] else self.sides[0]

    def collect(self, side: Side) -> None:
        """Carry out what ``side`` asked for; messages to the other side go in flight."""
        while outputs := side.proto.outputs():
            for out in outputs:
                if isinstance(out, StoreCall):
                    self.store(side, out)
                elif isinstance(out, SendRequest):
                    self.rids += 1
                    peer = self.other(side)
                    if not out.no_reply:
                        peer.asked[self.rids] = (side, out.ref, out.max_reply)
                    self.in_flight.append((peer, "request", (self.rids, out.profile, out.properties, out.body)))
                elif isinstance(out, SendReply | SendError):
                    requester, ref, max_reply = side.asked.pop(out.rid)
                    if isinstance(out, SendReply):
                        assert max_reply is None or len(out.body) <= max_reply
                        self.in_flight.append((requester, "reply", (ref, out.properties, out.body)))
                    else:
                        self.in_flight.append((requester, "error", (ref, out.error)))
                elif isinstance(out, CloseConnection):
                    self.closed.append(out)
                else:
                    assert isinstance(out, OperationFinished)

    @staticmethod
    def store(side: Side, call: StoreCall) -> None:
        request = call.request
        if isinstance(request, ClaimMessages):
            side.proto.store_done(call.ref, side.claims.claim(request.tenant, request.cids, request.claimant))
            return
        if isinstance(request, ReleaseClaims):
            side.claims.release(request.tenant, request.cids, request.claimant, held=request.held)
            return
        # one connection per side here: no other sink's claim to wait for
        assert not isinstance(request, AwaitClaim), request
        if call.ref < 0:
            if isinstance(request, RecordSteps) and request.at_commit:
                side.service.record_at_commit(request, side.proto.fail_feed)
            else:
                side.service.run_now(request)
            return
        try:
            value = side.service.run_now(request)
        except Exception as exc:
            side.proto.store_failed(call.ref, exc)
        else:
            side.proto.store_done(call.ref, value)

    def pump(self) -> int:
        """Deliver until nothing is in flight; returns the deliveries made."""
        delivered = 0
        for side in self.sides:
            self.collect(side)
        while self.in_flight:
            target, kind, args = self.in_flight.pop(self.rng.randrange(len(self.in_flight)))
            # Replies to one request keep their order on a BLIP connection; requests are independent.
            if kind == "request":
                target.proto.receive_request(*args)
            elif kind == "reply":
                target.proto.receive_response(*args)
            else:
                ref, error = args
                target.proto.receive_error(ref, PeerError(error.code, error.name, error.detail, dict(error.body)))
            delivered += 1
            for side in self.sides:
                self.collect(side)
        return delivered


def run(wire: Wire, operation: Any) -> Any:
    wire.pump()
    assert operation.done, f"{operation.name} did not finish"
    return operation.outcome()


@dataclass
class AttachmentSpy:
    """The getAttachment requests a side sent (their properties, in order) and the most that
    were waiting for their replies at once."""

    fetched: list[dict[str, str]] = field(default_factory=list)
    waiting: set[int] = field(default_factory=set)
    peak: int = 0


def spy_attachments(monkeypatch: pytest.MonkeyPatch, side: Side) -> AttachmentSpy:
    spy = AttachmentSpy()
    asked, answered = side.proto.outputs, side.proto.receive_response

    def outputs() -> list[Any]:
        outs = asked()
        for out in outs:
            if isinstance(out, SendRequest) and out.profile == "getAttachment":
                spy.fetched.append(out.properties)
                spy.waiting.add(out.ref)
        spy.peak = max(spy.peak, len(spy.waiting))
        return outs

    def receive_response(ref: int, *args: Any) -> None:
        spy.waiting.discard(ref)
        answered(ref, *args)

    monkeypatch.setattr(side.proto, "outputs", outputs)
    monkeypatch.setattr(side.proto, "receive_response", receive_response)
    return spy


def greeted_pair(tmp_path: Path, notes: int, seed: int) -> tuple[Wire, Side, Side]:
    """A passive laptop holding ``notes`` of alice's notes and an active, empty phone, their
    hellos exchanged: ``(wire, laptop, phone)``."""
    laptop = make_side(tmp_path, "laptop", active=False)
    phone = make_side(tmp_path, "phone", active=True)
    write_notes(laptop.store, ALICE, notes, Clock(), "laptop")
    wire = Wire(laptop, phone, random.Random(seed))
    laptop.proto.start_hello()
    run(wire, phone.proto.start_hello())
    return wire, laptop, phone


def test_no_event_loop_is_running() -> None:
    with pytest.raises(RuntimeError):
        trio.lowlevel.current_trio_token()


@pytest.mark.parametrize("seed", range(6))
def test_a_full_pull_and_push_with_no_event_loop(tmp_path: Path, seed: int) -> None:
    laptop = make_side(tmp_path, "laptop", active=False)
    phone = make_side(tmp_path, "phone", active=True, max_unanswered_revs=7)
    clock = Clock()
    write_notes(laptop.store, ALICE, 23, clock, "laptop")
    write_notes(phone.store, ALICE, 9, clock, "phone")
    wire = Wire(laptop, phone, random.Random(seed))

    # hello: each side proves its DID to the other (the passive starts its own at once).
    laptop.proto.start_hello()
    hello = phone.proto.start_hello()
    run(wire, hello)
    assert laptop.proto.hello_ok and phone.proto.hello_ok
    assert phone.proto.theirs is not None and phone.proto.theirs.store_id == store_id(laptop.store)

    # getCollections: no copy of the checkpoint pair on the laptop yet.
    scope = SyncScope.global_scope()
    cp_id = checkpoint_id(store_id(phone.store), store_id(laptop.store), scope.scope_id, ALICE.did)
    index, copy = run(wire, phone.proto.open_collection(ALICE.did, scope, cp_id))
    assert copy == {}

    ledger = phone.service.ledger
    key = ledger.open_link(ALICE.did, f"{ALICE.did}?storeId={store_id(laptop.store)}", scope).key
    pull, sink = phone.proto.pull(index, None, key=key, direction=Direction.PULL, batch=5)
    latest = run(wire, pull)
    laptop_head = laptop.store.events.read(ALICE.did, after=-1, limit=1000)[-1]
    assert latest == laptop_head[0]
    assert sink.stats.revs_applied == 23 and sink.stats.attachments_fetched == 6

    push, source = phone.proto.push(index, None, key=key, direction=Direction.PUSH, batch=4,
                                    suppress_origin=store_id(laptop.store))
    run(wire, push)
    assert source.stats.revs_applied == 9
    assert source.stats.echoes_suppressed == 23  # the pulled notes are not proposed back

    # Both checkpoints settled at the two logs' heads, and the pair saved on the laptop.
    pull_cp, _ = ledger.get_checkpoint(key, Direction.PULL)
    push_cp, _ = ledger.get_checkpoint(key, Direction.PUSH)
    assert pull_cp.contiguous_applied_token is not None
    assert pull_cp.contiguous_applied_token.position == laptop_head[0]
    assert not pull_cp.pending_tokens and not pull_cp.unapplied_tokens
    phone_head = phone.store.events.read(ALICE.did, after=-1, limit=1000)[-1]
    assert push_cp.contiguous_applied_token is not None
    assert push_cp.contiguous_applied_token.position == phone_head[0]
    pair = {"pull": pull_cp.to_wire(), "push": push_cp.to_wire()}
    rev = run(wire, phone.proto.save_checkpoint(index, pair, None))
    assert laptop.service.copies.get(ALICE.did, cp_id) == (pair, rev)
    with pytest.raises(PeerError) as stale:
        run(wire, phone.proto.save_checkpoint(index, pair, None))  # MVCC: the rev is required now
    assert (stale.value.code, stale.value.name, stale.value.body.get("rev")) == (409, "CheckpointRevConflict", rev)
    assert ledger.link(key).state == LinkState.INITIAL  # the driver, not the protocol, moves link states

    assert_same(laptop.store, phone.store, ALICE)
    assert wire.closed == []


def test_requests_before_hello_are_refused_and_a_bad_proof_closes(tmp_path: Path) -> None:
    laptop = make_side(tmp_path, "laptop", active=False)
    phone = make_side(tmp_path, "phone", active=True)
    wire = Wire(laptop, phone, random.Random(1))
    scope = SyncScope.global_scope()
    early = phone.proto.open_collection(ALICE.did, scope, "cp")
    with pytest.raises(PeerError) as refused:
        run(wire, early)
    assert (refused.value.code, refused.value.name) == (401, "HelloRequired")

    # A hello whose proof is signed by another key: the phone refuses it and closes.
    laptop.proto.identity = seeded("mallory")
    laptop.proto.start_hello()
    hello = phone.proto.start_hello()
    wire.pump()
    assert hello.done and hello.error is not None
    assert [c.reason for c in wire.closed] == ["P2PSync 401 HelloProofInvalid"]


@pytest.mark.parametrize("seed", range(4))
def test_a_whole_round_both_ways_then_a_second_round_resumes(tmp_path: Path, seed: int) -> None:
    """The active round itself (SyncRound: start points, both directions, the final save,
    the link going live) runs in the protocol object too; a second round starts where the
    first ended and moves nothing."""
    laptop = make_side(tmp_path, "laptop", active=False)
    phone = make_side(tmp_path, "phone", active=True)
    clock = Clock()
    write_notes(laptop.store, ALICE, 11, clock, "laptop")
    write_notes(phone.store, ALICE, 5, clock, "phone")
    wire = Wire(laptop, phone, random.Random(seed))
    laptop.proto.start_hello()
    run(wire, phone.proto.start_hello())

    scope = SyncScope.global_scope()
    totals: dict[str, Any] = {}
    operation, round_ = phone.proto.sync(tenant=ALICE.did, scope=scope, local_store_id=store_id(phone.store),
                                         pull=True, push=True, batch=3, totals=totals)
    run(wire, operation)
    assert totals["pull"].revs_applied == 11 and totals["push"].revs_applied == 5
    ledger = phone.service.ledger
    assert ledger.link(round_.key).state == LinkState.LIVE
    cp_id = checkpoint_id(store_id(phone.store), store_id(laptop.store), scope.scope_id, ALICE.did)
    stored = laptop.service.copies.get(ALICE.did, cp_id)
    assert stored is not None and stored[1] == round_.copy_rev
    pair = {d: ledger.get_checkpoint(round_.key, Direction(d))[0].to_wire() for d in ("pull", "push")}
    assert stored[0] == pair
    assert_same(laptop.store, phone.store, ALICE)

    # A second connection (new protocol objects, the same stores) starts at the saved frontiers.
    for side in (laptop, phone):
        side.proto = ReplicationProtocol(identity=ALICE, mine=new_hello(ALICE.did, store_id(side.store), "pump"),
                                         active=side is phone)
    wire = Wire(laptop, phone, random.Random(seed))
    laptop.proto.start_hello()
    run(wire, phone.proto.start_hello())
    second: dict[str, Any] = {}
    again, _ = phone.proto.sync(tenant=ALICE.did, scope=scope, local_store_id=store_id(phone.store), pull=True,
                                push=True, totals=second)
    run(wire, again)
    # Nothing moves: at most what the first round pushed is listed back once and answered 304.
    assert second["pull"].revs_received == 0 and second["push"].revs_sent == 0
    assert second["pull"].items_offered == second["pull"].items_skipped <= 5
    assert [t.reason for t in ledger.transitions(round_.key) if t.kind == "checkpoint_rewind"] == []


def test_a_stopped_sink_refuses_listings_so_nothing_moves_after_the_final_save(tmp_path: Path) -> None:
    """After ``stop_feeds`` (a graceful stop), a `changes` still in flight is refused: were it
    taken, its tokens would move the ledger past the pair the final save left on the passive."""
    wire, laptop, phone = greeted_pair(tmp_path, 4, 3)
    operation, round_ = phone.proto.sync(tenant=ALICE.did, scope=SyncScope.global_scope(),
                                         local_store_id=store_id(phone.store), pull=True, push=False)
    run(wire, operation)
    before = phone.service.ledger.get_checkpoint(round_.key, Direction.PULL)
    frontier = before[0].contiguous_applied_token
    assert frontier is not None
    head = laptop.store.events.read(ALICE.did, after=-1, limit=10)[-1]
    late = {"items": [], "through": {"streamId": frontier.stream_id, "epoch": frontier.epoch,
                                     "position": str(head[0] + 5), "messageCid": head[1]}}
    phone.proto.stop_feeds(PeerError(503, "Stopping", "this peer is stopping"))
    phone.proto.receive_request(10_000, "changes", {"collection": str(round_.index)}, encode_body(late))
    refusals = [o for o in phone.proto.outputs() if isinstance(o, SendError) and o.rid == 10_000]
    assert [(r.error.code, r.error.name) for r in refusals] == [(503, "Stopping")]
    assert phone.service.ledger.get_checkpoint(round_.key, Direction.PULL) == before


def pull_large_notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int,
                     seed: int) -> tuple[Any, AttachmentSpy, dict[str, int]]:
    """An empty phone pulls ``count`` notes of 60 kB (each out of line, by getAttachment) from a
    laptop in one listing: (its sink, its attachment requests, each dataCid's turn)."""
    laptop = make_side(tmp_path, "laptop", active=False)
    phone = make_side(tmp_path, "phone", active=True)
    dwn, clock = Dwn(laptop.store), Clock()
    turn_of: dict[str, int] = {}
    for i in range(count):
        now = clock.tick()
        data = bytes([i]) * 60_000
        write = RecordsWrite.create(signer=ALICE, data=data, schema=NOTE, data_format="text/plain",
                                    message_timestamp=now, date_created=now)
        assert dwn.process_message(ALICE.did, write.message, data).code == 202
        turn_of[write.message["descriptor"]["dataCid"]] = i
    spy = spy_attachments(monkeypatch, phone)
    wire = Wire(laptop, phone, random.Random(seed))
    laptop.proto.start_hello()
    run(wire, phone.proto.start_hello())
    scope = SyncScope.global_scope()
    cp_id = checkpoint_id(store_id(phone.store), store_id(laptop.store), scope.scope_id, ALICE.did)
    index, _ = run(wire, phone.proto.open_collection(ALICE.did, scope, cp_id))
    key = phone.service.ledger.open_link(ALICE.did, f"{ALICE.did}?storeId={store_id(laptop.store)}", scope).key
    pull, sink = phone.proto.pull(index, None, key=key, direction=Direction.PULL, batch=count)
    run(wire, pull)
    return sink, spy, turn_of


def test_a_sink_keeps_attachment_bytes_in_flight_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A source holds each getAttachment reply whole until it is written, so the sink bounds the
    bytes it asks for at once (MAX_ATTACHMENT_BYTES_IN_FLIGHT), not only their number: 60 kB
    records under a 200 kB budget go three at a time, where the count alone allows eight."""
    monkeypatch.setattr(protocol_module, "MAX_ATTACHMENT_BYTES_IN_FLIGHT", 200_000)
    sink, spy, _ = pull_large_notes(tmp_path, monkeypatch, 12, seed=7)
    assert sink.stats.attachments_fetched == 12
    assert spy.peak == 200_000 // 60_000  # three at a time: the bytes bound, not the count


@pytest.mark.parametrize("seed", range(6))
def test_a_sink_fetches_attachments_ahead_in_turn_order_whatever_order_the_revs_arrive_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """`rev`s handled in another order than they were sent (the wire here delivers at random,
    as trio may start the handlers of requests that arrived together in reverse) still have
    their data fetched in turn order, some ahead of their turn: a later record that took the
    prefetch room first would leave the next in line to fetch at its turn, one at a time."""
    monkeypatch.setattr(sink_module, "PREFETCH_BYTES", 130_000)  # two 60 kB records ahead
    sink, spy, turn_of = pull_large_notes(tmp_path, monkeypatch, 10, seed)
    assert [turn_of[props["dataCid"]] for props in spy.fetched] == list(range(10))
    assert spy.peak >= 2  # ahead of their turns
    assert sink.stats.attachments_fetched == 10 and sink.stats.revs_applied == 10
    assert sink._prefetch_room == 130_000 and not sink._ahead_waiting  # all given back


def test_a_feed_that_fails_inside_closes_the_connection_instead_of_leaving_the_puller_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug or a store failure under a source's feed (not a refusal) would leave its puller
    waiting for `changes` forever; the source closes instead, and the puller resumes later."""
    wire, laptop, phone = greeted_pair(tmp_path, 3, 3)
    scope = SyncScope.global_scope()
    index, _ = run(wire, phone.proto.open_collection(ALICE.did, scope, "cp-feed-fails"))

    def broken(_request: Any) -> Any:
        raise RuntimeError("disk on fire")

    monkeypatch.setitem(laptop.service._sync, ReadPage, broken)
    key = phone.service.ledger.open_link(ALICE.did, f"{ALICE.did}?storeId={store_id(laptop.store)}", scope).key
    pull, _ = phone.proto.pull(index, None, key=key, direction=Direction.PULL)
    wire.pump()
    assert [c.reason for c in wire.closed] == ["P2PSync 500 FeedFailed"]
    assert not pull.done  # the driver ends it when the socket closes (ConnectionLost)
    phone.proto.connection_lost(wire.closed[0].reason)
    wire.pump()
    assert pull.done and isinstance(pull.error, PeerError) and pull.error.name == "ConnectionLost"
