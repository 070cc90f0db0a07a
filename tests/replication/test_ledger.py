"""The replication ledger: the mark-applied algorithm (property-tested against a model), the
checkpoint document's invariants, and the SQLite ledger — compare-and-set under two writers,
monotonic commits, link states and their event log, persistence and crashes."""

from __future__ import annotations

import functools
import json
import logging
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import apsw
import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2psync.dwn.encoding import compute_cid, dag_cbor_encode
from p2psync.dwn.store import SCHEMA_VERSION, Store
from p2psync.replication.checkpoint import (
    MAX_PENDING_TOKENS,
    MAX_UNAPPLIED_TOKENS,
    CheckpointInvalid,
    CheckpointPendingOverflow,
    CheckpointTokenNotReceived,
    DirectionCheckpoint,
)
from p2psync.replication.scope import SyncScope
from p2psync.replication.tokens import ProgressGap, ProgressToken, ProgressTokenDomainMismatch, ProgressTokenForked
from p2psync.state.ledger import (
    ALLOWED_TRANSITIONS,
    CheckpointCommitted,
    CheckpointRegression,
    CheckpointResetRefused,
    CheckpointRevConflict,
    CheckpointRevInvalid,
    Direction,
    Ledger,
    LedgerEvent,
    LedgerSchemaTooNew,
    LinkNotFound,
    LinkState,
    LinkTransition,
    LinkTransitionInvalid,
    Step,
    checkpoint_rev,
    retry_delay,
)

TENANT = "did:key:z6MkTenant"
REMOTE = "did:key:z6MkRemote"
SCOPE = SyncScope.for_protocol("https://example.com/chat")
PULL, PUSH = Direction.PULL, Direction.PUSH

@functools.cache
def cid(n: int) -> str:
    return compute_cid({"n": n})


@functools.cache
def tok(position: int, epoch: str = "e1") -> ProgressToken:
    return ProgressToken("stream-A", epoch, position, cid(position))


def frontier(received: list[int], applied: set[int]) -> int | None:
    """The model: the highest received position with every received position up to it applied."""
    best = None
    for p in received:
        if p not in applied:
            break
        best = p
    return best


# --------------------------------------------------------------------------- the algorithm


def test_in_order_stream() -> None:
    cp = DirectionCheckpoint()
    for p in (3, 7, 8, 20):  # positions are not adjacent
        cp = cp.received(tok(p))
        cp, over = cp.applied(tok(p))
        assert not over and cp.contiguous_applied_token == tok(p) == cp.received_token
        assert cp.pending_tokens == () and cp.unapplied_tokens == ()


def test_out_of_order_applies_wait_in_pending() -> None:
    cp = DirectionCheckpoint()
    for p in (1, 2, 3, 4):
        cp = cp.received(tok(p))
    cp, _ = cp.applied(tok(1))
    cp, _ = cp.applied(tok(3))  # 2 is blocked on a dependency
    cp, _ = cp.applied(tok(4))
    assert cp.contiguous_applied_token == tok(1)
    assert cp.pending_tokens == (tok(3), tok(4)) and cp.unapplied_tokens == (tok(2),)
    assert cp.resume_token() == tok(1)
    cp, _ = cp.applied(tok(2))
    assert cp.contiguous_applied_token == tok(4) and cp.pending_tokens == () and cp.unapplied_tokens == ()


def test_frontier_stops_at_the_next_unapplied() -> None:
    cp = DirectionCheckpoint()
    for p in (10, 20, 30, 40, 50):
        cp = cp.received(tok(p))
    for p in (20, 30, 50):
        cp, _ = cp.applied(tok(p))
    cp, _ = cp.applied(tok(10))  # frontier runs over 20, 30 and stops before 40
    assert cp.contiguous_applied_token == tok(30)
    assert cp.unapplied_tokens == (tok(40),) and cp.pending_tokens == (tok(50),)


def test_duplicates_are_no_ops_and_errors_are_typed() -> None:
    cp = DirectionCheckpoint().received(tok(1))
    cp, _ = cp.applied(tok(1))
    assert cp.received(tok(1)) is cp and cp.applied(tok(1))[0] is cp
    with pytest.raises(CheckpointTokenNotReceived):
        cp.applied(tok(2))
    with pytest.raises(ProgressTokenDomainMismatch):
        cp.received(tok(2, epoch="e2"))
    with pytest.raises(ProgressTokenForked):
        cp.received(ProgressToken("stream-A", "e1", 1, cid(999)))  # position 1 is another message


def test_unapplied_overflow_is_refused() -> None:
    cp = DirectionCheckpoint()
    for p in range(1, MAX_UNAPPLIED_TOKENS + 1):
        cp = cp.received(tok(p))
    with pytest.raises(CheckpointPendingOverflow):
        cp.received(tok(MAX_UNAPPLIED_TOKENS + 1))


def test_pending_overflow_drops_the_highest_and_never_skips() -> None:
    cp = DirectionCheckpoint().received(tok(1))  # 1 stays blocked
    overflowed_at = None
    for p in range(2, MAX_PENDING_TOKENS + 4):
        cp = cp.received(tok(p))
        cp, over = cp.applied(tok(p))
        if over and overflowed_at is None:
            overflowed_at = p
        assert len(cp.pending_tokens) <= MAX_PENDING_TOKENS
        assert cp.contiguous_applied_token is None  # never past the blocked 1
    assert overflowed_at == MAX_PENDING_TOKENS + 2
    cp, _ = cp.applied(tok(1))
    assert cp.contiguous_applied_token == cp.received_token  # nothing unapplied: exact again


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_mark_applied_against_the_model(data: st.DataObject) -> None:
    """Any interleaving of receives, applies and re-deliveries: the frontier is exactly the
    model's, never moves back, never passes an unapplied received token, and the document
    alone (a restart) reproduces the state."""
    stream = sorted(data.draw(st.sets(st.integers(0, 500), min_size=1, max_size=40)))
    # One draw for the whole schedule: (operation, which) pairs, interpreted against the model.
    schedule = data.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6)), min_size=1, max_size=120))
    received: list[int] = []
    applied: set[int] = set()
    cp = DirectionCheckpoint()
    last = None
    for op, which in schedule:
        unapplied = [p for p in received if p not in applied]
        if op == 0 and len(received) < len(stream) or not received:
            p = stream[len(received)]
            received.append(p)
            cp = cp.received(tok(p))
        elif op == 1 and unapplied:
            p = unapplied[which % len(unapplied)]
            applied.add(p)
            cp, over = cp.applied(tok(p))
            assert not over  # at most 40 tokens: never near the bound
        elif op == 2 or not applied:
            cp = cp.received(tok(received[which % len(received)]))  # re-delivery
        else:
            done = sorted(applied)
            cp, _ = cp.applied(tok(done[which % len(done)]))  # re-apply (a Duplicate)

        expected = frontier(received, applied)
        got = cp.contiguous_applied_token
        assert (None if got is None else got.position) == expected
        if last is not None:
            assert got is not None and got >= last
        last = got
        assert cp.received_token == tok(received[-1])
        assert all(p in applied for p in received if got is not None and p <= got.position)
        assert len(cp.pending_tokens) <= MAX_PENDING_TOKENS
        assert DirectionCheckpoint.from_wire(json.loads(json.dumps(cp.to_wire()))) == cp


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_settled_is_received_then_applied(data: st.DataObject) -> None:
    """``settled`` (the ledger's shortcut for a settled token) gives exactly what ``received``
    then ``applied`` give, or declines: for any checkpoint and any token, a forked or
    foreign one included."""
    cp = DirectionCheckpoint()
    for p in sorted(data.draw(st.sets(st.integers(1, 60), max_size=12))):
        cp = cp.received(tok(p))
        if data.draw(st.booleans()):
            cp, _ = cp.applied(tok(p))
    position = data.draw(st.integers(0, 70))
    token = data.draw(st.sampled_from([tok(position), tok(position, "e2"),
                                       ProgressToken("stream-A", "e1", position, cid(position + 1000))]))
    try:
        slow: DirectionCheckpoint | Exception = cp.received(token).applied(token)[0]
    except Exception as exc:
        slow = exc
    try:
        fast = cp.settled(token)
    except Exception as exc:  # only what the two steps raise too (a fork)
        assert type(exc) is type(slow)
        return
    if fast is not None:
        assert fast == slow
    else:  # declined: something is unapplied, or the token is not past receivedToken
        assert cp.unapplied_tokens or cp.received_token is not None and (
            not token.same_domain(cp.received_token) or token.position <= cp.received_token.position)


def test_record_takes_settled_pairs_as_the_steps_one_by_one(ledger: Ledger) -> None:
    key = ledger.open_link(TENANT, REMOTE, SCOPE).key
    other = ledger.open_link(TENANT, "did:key:z6MkOther", SCOPE).key
    steps: list[Step] = [("received", tok(1)), ("received", tok(2)), ("applied", tok(2))]
    steps += [s for p in range(3, 9) for s in (("received", tok(p)), ("applied", tok(p)))]
    steps += [("applied", tok(1)), ("received", tok(9)), ("applied", tok(9)), ("received", tok(4))]
    together = ledger.record(key, PULL, steps)
    for step in steps:
        ledger.record(other, PULL, [step])
    assert together.checkpoint == ledger.get_checkpoint(other, PULL)[0]
    assert together.checkpoint.contiguous_applied_token == tok(9)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_frontier_is_safe_under_overflow(data: st.DataObject) -> None:
    """Past the pending bound the frontier may lag the model, but never passes it."""
    stream = list(range(1, 260))
    blocked = set(data.draw(st.sets(st.sampled_from(stream[:60]), min_size=1, max_size=5)))
    received: list[int] = []
    applied: set[int] = set()
    cp = DirectionCheckpoint()
    for p in stream:
        received.append(p)
        cp = cp.received(tok(p))
        if p not in blocked:
            applied.add(p)
            cp, _ = cp.applied(tok(p))
        got = cp.contiguous_applied_token
        expected = frontier(received, applied)
        assert got is None or (expected is not None and got.position <= expected)
        assert len(cp.pending_tokens) <= MAX_PENDING_TOKENS
    for p in sorted(blocked):
        applied.add(p)
        cp, _ = cp.applied(tok(p))
    assert cp.contiguous_applied_token == cp.received_token == tok(stream[-1])


# --------------------------------------------------------------------------- the document


def test_document_wire_forms() -> None:
    cp = DirectionCheckpoint()
    for p in (1, 2, 3):
        cp = cp.received(tok(p))
    cp, _ = cp.applied(tok(1))
    cp, _ = cp.applied(tok(3))
    wire = cp.to_wire()
    assert set(wire) == {"receivedToken", "contiguousAppliedToken", "pendingTokens", "unappliedTokens"}
    assert DirectionCheckpoint.from_wire(cbor2.loads(cbor2.dumps(wire))) == cp
    assert DirectionCheckpoint().to_wire() == {}


@pytest.mark.parametrize(
    "wire",
    [
        {"contiguousAppliedToken": tok(1).to_wire()},  # contiguous without received
        {"receivedToken": tok(1).to_wire(), "contiguousAppliedToken": tok(2).to_wire()},
        {"receivedToken": tok(3).to_wire()},  # nothing unapplied, yet contiguous != received
        {"receivedToken": tok(3).to_wire(), "unappliedTokens": [tok(3).to_wire(), tok(2).to_wire()]},
        {"receivedToken": tok(3).to_wire(), "unappliedTokens": [tok(4).to_wire()]},
        {"receivedToken": tok(3).to_wire(), "unappliedTokens": [tok(3).to_wire()], "pendingTokens": [tok(2).to_wire()]},
        {"receivedToken": tok(3).to_wire(), "unappliedTokens": [tok(2).to_wire()], "pendingTokens": [tok(2).to_wire()]},
        {"receivedToken": tok(3).to_wire(), "unappliedTokens": [tok(3, epoch="e2").to_wire()]},
        {"receivedToken": tok(3).to_wire(), "unappliedTokens": [tok(p).to_wire() for p in range(2, 104)]},
        {"receivedToken": None},
        {"receivedToken": tok(1).to_wire(), "contiguousAppliedToken": tok(1).to_wire(), "cursor": "x"},
        {"receivedToken": tok(1).to_wire(), "contiguousAppliedToken": tok(1).to_wire(), "pendingTokens": {}},
        [],
    ],
)
def test_document_invariants_are_enforced(wire: Any) -> None:
    with pytest.raises(CheckpointInvalid):
        DirectionCheckpoint.from_wire(wire)


# --------------------------------------------------------------------------- the ledger


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    led = Ledger(tmp_path / "ledger.db", clock=FakeClock())
    yield led
    led.close()


def applied_through(*positions: int) -> DirectionCheckpoint:
    cp = DirectionCheckpoint()
    for p in positions:
        cp, _ = cp.received(tok(p)).applied(tok(p))
    return cp


def test_links_are_keyed_by_tenant_remote_and_scope(ledger: Ledger) -> None:
    a = ledger.open_link(TENANT, REMOTE, SCOPE)
    assert a.state == LinkState.INITIAL and a.failure_count == 0 and a.scope == SCOPE
    assert ledger.open_link(TENANT, REMOTE, SCOPE) == a  # idempotent
    b = ledger.open_link(TENANT, REMOTE, SyncScope.global_scope())
    assert a.key != b.key and len(ledger.links(tenant=TENANT)) == 2
    assert ledger.links(remote="did:key:z6MkOther") == []
    with pytest.raises(LinkNotFound):
        ledger.link(type(a.key)(TENANT, "did:key:z6MkOther", SCOPE.scope_id))
    with pytest.raises(Exception, match="LedgerInvalidDid"):
        ledger.open_link("alice", REMOTE, SCOPE)


def test_set_checkpoint_compare_and_set(ledger: Ledger) -> None:
    key = ledger.open_link(TENANT, REMOTE, SCOPE).key
    assert ledger.get_checkpoint(key, PULL) == (DirectionCheckpoint(), None)
    rev1 = ledger.set_checkpoint(key, PULL, applied_through(1), None)
    assert rev1.startswith("1-") and len(rev1) == 34
    with pytest.raises(CheckpointRevConflict) as info:
        ledger.set_checkpoint(key, PULL, applied_through(1, 2), None)  # "new" but it exists
    assert info.value.status == 409 and info.value.current == rev1
    rev2 = ledger.set_checkpoint(key, PULL, applied_through(1, 2).to_wire(), rev1)  # wire body works too
    assert rev2.startswith("2-")
    with pytest.raises(CheckpointRevConflict):
        ledger.set_checkpoint(key, PULL, applied_through(1, 2, 3), rev1)  # stale
    with pytest.raises(CheckpointRevInvalid):
        ledger.set_checkpoint(key, PULL, applied_through(1, 2, 3), "two")
    assert ledger.get_checkpoint(key, PULL) == (applied_through(1, 2), rev2)
    assert ledger.get_checkpoint(key, PUSH) == (DirectionCheckpoint(), None)  # directions are separate


def test_same_body_same_generation_same_rev(tmp_path: Path) -> None:
    revs = []
    for name in ("a.db", "b.db"):
        led = Ledger(tmp_path / name)
        key = led.open_link(TENANT, REMOTE, SCOPE).key
        revs.append(led.set_checkpoint(key, PULL, applied_through(5), None))
        led.close()
    assert revs[0] == revs[1]  # the rev is a function of (generation, document)


def test_checkpoints_never_move_backwards(ledger: Ledger) -> None:
    key = ledger.open_link(TENANT, REMOTE, SCOPE).key
    rev = ledger.set_checkpoint(key, PULL, applied_through(1, 5), None)
    for body in (applied_through(1), DirectionCheckpoint(), applied_through(1, 2, 3, 4)):
        with pytest.raises(CheckpointRegression) as info:
            ledger.set_checkpoint(key, PULL, body, rev)
        assert info.value.status == 409
    new_epoch = DirectionCheckpoint().received(tok(9, epoch="e2")).applied(tok(9, epoch="e2"))[0]
    with pytest.raises(CheckpointRegression, match="reset_checkpoint"):
        ledger.set_checkpoint(key, PULL, new_epoch, rev)
    assert ledger.get_checkpoint(key, PULL) == (applied_through(1, 5), rev)
    # Equal is not backwards: re-committing the same progress is allowed.
    assert ledger.set_checkpoint(key, PULL, applied_through(1, 5), rev).startswith("2-")


def test_reset_only_while_repairing_and_logged(ledger: Ledger) -> None:
    key = ledger.open_link(TENANT, REMOTE, SCOPE).key
    rev = ledger.set_checkpoint(key, PULL, applied_through(1, 5), None)
    with pytest.raises(CheckpointResetRefused):
        ledger.reset_checkpoint(key, PULL, rev, reason="gap")
    ledger.transition(key, LinkState.REPAIRING, reason="gap: epoch_mismatch", direction=PULL, error_code="ProgressGap")
    rev = ledger.reset_checkpoint(key, PULL, rev, reason="gap: epoch_mismatch")
    assert ledger.get_checkpoint(key, PULL) == (DirectionCheckpoint(), rev)
    new_epoch = DirectionCheckpoint().received(tok(9, epoch="e2")).applied(tok(9, epoch="e2"))[0]
    ledger.set_checkpoint(key, PULL, new_epoch, rev)
    kinds = [(t.kind, t.state_to, t.contiguous_token) for t in ledger.transitions(key)]
    assert kinds == [("state", LinkState.REPAIRING, tok(5)), ("checkpoint_reset", LinkState.REPAIRING, tok(5))]


def test_state_machine(ledger: Ledger) -> None:
    key = ledger.open_link(TENANT, REMOTE, SCOPE).key
    ledger.transition(key, LinkState.PAUSED, reason="operator")
    with pytest.raises(LinkTransitionInvalid):
        ledger.transition(key, LinkState.LIVE, reason="skip catch-up")  # must catch up first
    assert ledger.link(key).state == LinkState.PAUSED
    ledger.transition(key, LinkState.INITIAL, reason="resumed")
    ledger.transition(key, LinkState.LIVE, reason="caught up")
    ledger.transition(key, LinkState.LIVE, reason="again")  # same state: no-op, no row
    assert [(t.state_from, t.state_to) for t in ledger.transitions(key)] == [
        (LinkState.INITIAL, LinkState.PAUSED),
        (LinkState.PAUSED, LinkState.INITIAL),
        (LinkState.INITIAL, LinkState.LIVE),
    ]
    # The table is the documented one, and every state has a way out to repairing or paused.
    for state, targets in ALLOWED_TRANSITIONS.items():
        assert LinkState.PAUSED in targets or state == LinkState.PAUSED
        assert state not in targets


def test_every_allowed_and_refused_transition(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.db")
    path_to = {  # how to reach each state from initial
        LinkState.INITIAL: [],
        LinkState.LIVE: [LinkState.LIVE],
        LinkState.DEGRADED_POLL: [LinkState.DEGRADED_POLL],
        LinkState.REPAIRING: [LinkState.REPAIRING],
        LinkState.PAUSED: [LinkState.PAUSED],
    }
    n = 0
    for source, route in path_to.items():
        for target in LinkState:
            if target == source:
                continue
            n += 1
            key = led.open_link(TENANT, f"did:key:z6MkPeer{n}", SCOPE).key
            for step in route:
                led.transition(key, step, reason="setup")
            if target in ALLOWED_TRANSITIONS[source]:
                assert led.transition(key, target, reason="t").state == target
            else:
                with pytest.raises(LinkTransitionInvalid):
                    led.transition(key, target, reason="t")
                assert led.link(key).state == source
    led.close()


def test_listeners_and_logs_see_committed_changes_only(ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[LedgerEvent] = []
    remove = ledger.add_listener(seen.append)

    def broken(event: LedgerEvent) -> None:
        raise ZeroDivisionError

    ledger.add_listener(broken)  # a broken observer does not undo anything
    key = ledger.open_link(TENANT, REMOTE, SCOPE).key
    with caplog.at_level(logging.INFO, logger="p2psync.state.ledger"):
        ledger.transition(key, LinkState.LIVE, reason="caught up")
    assert ledger.link(key).state == LinkState.LIVE
    assert [type(e) for e in seen] == [LinkTransition]
    fields = next(r for r in caplog.records if hasattr(r, "p2psync")).p2psync
    assert fields["stateFrom"] == "initial" and fields["stateTo"] == "live" and fields["scopeId"] == SCOPE.scope_id
    rev = ledger.set_checkpoint(key, PULL, applied_through(1), None)
    assert isinstance(seen[-1], CheckpointCommitted) and seen[-1].rev == rev
    with pytest.raises(LinkTransitionInvalid):
        ledger.transition(key, LinkState.INITIAL, reason="no")
    with pytest.raises(CheckpointRevConflict):
        ledger.set_checkpoint(key, PULL, applied_through(1, 2), None)
    assert len(seen) == 2  # refused changes are not events
    remove()
    ledger.transition(key, LinkState.PAUSED, reason="operator")
    assert len(seen) == 2


def test_record_commits_the_algorithm_and_overflow_repairs(ledger: Ledger) -> None:
    key = ledger.open_link(TENANT, REMOTE, SCOPE).key
    ledger.transition(key, LinkState.LIVE, reason="caught up")
    u = ledger.record_received(key, PULL, tok(1))
    assert u.checkpoint.unapplied_tokens == (tok(1),) and u.rev is not None
    same = ledger.record_received(key, PULL, tok(1))
    assert same.rev == u.rev  # a duplicate writes nothing
    steps: list[Step] = []
    for p in range(2, MAX_PENDING_TOKENS + 3):
        steps += [("received", tok(p)), ("applied", tok(p))]
    u = ledger.record(key, PULL, steps)
    assert u.overflowed and u.state == LinkState.REPAIRING
    assert ledger.get_checkpoint(key, PULL) == (u.checkpoint, u.rev)
    last = ledger.transitions(key)[-1]
    assert last.state_to == LinkState.REPAIRING and last.reason == "pending_overflow" and last.direction == PULL
    assert last.error_code == "CheckpointPendingOverflow"
    u = ledger.record_applied(key, PULL, tok(1))
    assert u.checkpoint.contiguous_applied_token == tok(MAX_PENDING_TOKENS + 2)


def test_unapplied_overflow_commits_what_came_before(ledger: Ledger) -> None:
    key = ledger.open_link(TENANT, REMOTE, SCOPE).key
    ledger.transition(key, LinkState.LIVE, reason="caught up")
    steps: list[Any] = [("received", tok(p)) for p in range(1, MAX_UNAPPLIED_TOKENS + 2)]
    with pytest.raises(CheckpointPendingOverflow) as info:
        ledger.record(key, PULL, steps)
    assert info.value.token == tok(MAX_UNAPPLIED_TOKENS + 1)
    cp, _ = ledger.get_checkpoint(key, PULL)
    assert len(cp.unapplied_tokens) == MAX_UNAPPLIED_TOKENS
    assert ledger.link(key).state == LinkState.REPAIRING


def test_a_failing_batch_rolls_back_whole(ledger: Ledger) -> None:
    key = ledger.open_link(TENANT, REMOTE, SCOPE).key
    with pytest.raises(CheckpointTokenNotReceived):
        ledger.record(key, PULL, [("received", tok(1)), ("applied", tok(1)), ("applied", tok(2))])
    assert ledger.get_checkpoint(key, PULL) == (DirectionCheckpoint(), None)


def test_failures_and_backoff(tmp_path: Path) -> None:
    clock = FakeClock()
    led = Ledger(tmp_path / "l.db", clock=clock)
    key = led.open_link(TENANT, REMOTE, SCOPE).key
    delays = []
    for _ in range(12):
        link = led.record_failure(key, "ConnectionRefused")
        assert link.last_failure_at == clock.now and link.next_retry_at is not None
        delays.append(link.next_retry_at - clock.now)
    assert delays[:4] == [timedelta(seconds=s) for s in (1, 2, 4, 8)] and delays[-1] == timedelta(minutes=5)
    assert link.failure_count == 12 and link.last_error == "ConnectionRefused"
    jittered = clock.now + timedelta(seconds=7)
    assert led.record_failure(key, "Timeout", retry_at=jittered).next_retry_at == jittered
    clock.now += timedelta(hours=1)
    link = led.record_success(key)
    assert link.failure_count == 0 and link.last_success_at == clock.now and link.next_retry_at is None
    state = led.link_state(key)
    assert state["failureCount"] == 0 and state["lastSuccessAt"] == "2030-01-01T01:00:00.000000Z"
    assert state["remoteEndpoint"] == REMOTE and state["scope"] == SCOPE.to_wire() and state["pull"] == {}
    assert retry_delay(0) == timedelta(0) and retry_delay(10_000) == timedelta(minutes=5)
    led.close()


# --------------------------------------------------------------------------- concurrency, durability


def test_two_writers_compare_and_set(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    a, b = Ledger(path), Ledger(path)
    key = a.open_link(TENANT, REMOTE, SCOPE).key
    rev = a.set_checkpoint(key, PULL, applied_through(1), None)
    _, seen_by_b = b.get_checkpoint(key, PULL)
    assert seen_by_b == rev
    a.set_checkpoint(key, PULL, applied_through(1, 2), rev)
    with pytest.raises(CheckpointRevConflict) as info:
        b.set_checkpoint(key, PULL, applied_through(1, 3), seen_by_b)  # b lost the race
    assert info.value.current is not None and info.value.current.startswith("2-")
    b.set_checkpoint(key, PULL, applied_through(1, 2, 3), info.value.current)  # re-read and retry
    assert a.get_checkpoint(key, PULL)[0] == applied_through(1, 2, 3)
    a.close()
    b.close()


def test_racing_threads_exactly_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    setup = Ledger(path)
    key = setup.open_link(TENANT, REMOTE, SCOPE).key
    rev = setup.set_checkpoint(key, PULL, applied_through(1), None)
    setup.close()
    writers = 8
    barrier = threading.Barrier(writers)
    results: list[str] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        led = Ledger(path)  # one connection per thread
        barrier.wait()
        try:
            led.set_checkpoint(key, PULL, applied_through(1, 10 + i), rev)
            outcome = "won"
        except CheckpointRevConflict:
            outcome = "conflict"
        finally:
            led.close()
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["conflict"] * (writers - 1) + ["won"]
    check = Ledger(path)
    cp, final = check.get_checkpoint(key, PULL)
    assert final is not None and final.startswith("2-") and cp.contiguous_applied_token is not None
    check.close()


def test_persistence_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    led = Ledger(path)
    key = led.open_link(TENANT, REMOTE, SCOPE).key
    led.transition(key, LinkState.LIVE, reason="caught up")
    led.record(key, PULL, [("received", tok(1)), ("received", tok(2)), ("applied", tok(2))])
    rev = led.set_checkpoint(key, PUSH, applied_through(7), None)
    before = led.link_state(key)
    led.close()
    again = Ledger(path)
    assert again.link_state(key) == before
    assert again.get_checkpoint(key, PUSH) == (applied_through(7), rev)
    u = again.record_applied(key, PULL, tok(1))  # the pending state came back from the file
    assert u.checkpoint.contiguous_applied_token == tok(2)
    assert [t.state_to for t in again.transitions(key)] == [LinkState.LIVE]
    again.close()


def test_in_the_store_file_beside_the_store(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.db")
    led = Ledger.for_store(store)
    key = led.open_link(TENANT, REMOTE, SCOPE).key
    with store.transaction():  # one commit for the applied messages and the checkpoint
        store.events.append(TENANT, cid(1), {"interface": "Records"})
        led.record(key, PULL, [("received", tok(1)), ("applied", tok(1))])
    led.close()  # shared connection: stays open
    assert store.scalar("PRAGMA user_version") == SCHEMA_VERSION  # the store's own schema version untouched
    store.close()
    store = Store(tmp_path / "store.db")
    led = Ledger.for_store(store)
    assert led.get_checkpoint(key, PULL)[0] == applied_through(1)
    assert store.events.count(TENANT) == 1
    store.close()


def test_close_without_commit_keeps_the_old_state(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    led = Ledger(path)
    key = led.open_link(TENANT, REMOTE, SCOPE).key
    rev = led.set_checkpoint(key, PULL, applied_through(1), None)
    led.conn.execute("BEGIN")  # the caller's transaction: the ledger's writes join it
    led.set_checkpoint(key, PULL, applied_through(1, 2), rev)
    led.transition(key, LinkState.LIVE, reason="caught up")
    led.conn.close()  # closing with the transaction open discards it, like a crash
    again = Ledger(path)
    assert again.get_checkpoint(key, PULL) == (applied_through(1), rev)
    assert again.link(key).state == LinkState.INITIAL and again.transitions(key) == []
    again.close()


_CRASHER = """
import os, sys
from p2psync.replication.checkpoint import DirectionCheckpoint
from p2psync.state.ledger import Direction, Ledger, LinkKey
from p2psync.replication.tokens import ProgressToken
from p2psync.dwn.encoding import compute_cid, dag_cbor_encode
path, scope_id, mode = sys.argv[1], sys.argv[2], sys.argv[3]
led = Ledger(path)
key = LinkKey("did:key:z6MkTenant", "did:key:z6MkRemote", scope_id)
t = ProgressToken("stream-A", "e1", 2, compute_cid({"n": 2}))
if mode == "uncommitted":
    led.conn.execute("BEGIN")
cp, rev = led.get_checkpoint(key, Direction.PULL)
led.record(key, Direction.PULL, [("received", t), ("applied", t)])
os._exit(0)  # no close, no commit, no cleanup: a killed process
"""


@pytest.mark.parametrize("mode", ["committed", "uncommitted"])
def test_killed_process(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "l.db"
    led = Ledger(path)
    key = led.open_link(TENANT, REMOTE, SCOPE).key
    led.set_checkpoint(key, PULL, applied_through(1), None)
    led.close()
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", _CRASHER, str(path), SCOPE.scope_id, mode], check=True, timeout=60, cwd=root)
    again = Ledger(path)
    cp, _ = again.get_checkpoint(key, PULL)
    assert cp == (applied_through(1, 2) if mode == "committed" else applied_through(1))
    again.close()


def test_schema_versioning(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).close()
    conn = apsw.Connection(str(path))
    assert conn.execute("SELECT value FROM ledger_meta WHERE key='schema_version'").fetchone() == ("1",)
    assert conn.execute("PRAGMA user_version").fetchone() == (0,)  # left to the store
    conn.execute("UPDATE ledger_meta SET value='99' WHERE key='schema_version'")
    conn.close()
    with pytest.raises(LedgerSchemaTooNew):
        Ledger(path)


# --------------------------------------------------------------------------- the spec's examples


SPEC = Path(__file__).resolve().parents[2] / "protocol" / "replication-state.md"


def spec_examples() -> dict[str, str]:
    text = SPEC.read_text()
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"<!-- example: ([\w-]+) -->\n```\w+\n(.*?)\n```", text, flags=re.DOTALL)
    }


def test_the_spec_examples_hold() -> None:
    ex = spec_examples()
    assert set(ex) >= {"token", "token-cbor", "gap", "scope-input", "scope-canonical", "scope-id", "checkpoint",
                       "checkpoint-rev", "link"}
    token = ProgressToken.from_wire(json.loads(ex["token"]))
    assert token.to_wire() == json.loads(ex["token"])
    assert dag_cbor_encode(token.to_wire()).hex() == ex["token-cbor"].strip()
    assert f"({len(dag_cbor_encode(token.to_wire()))} bytes" in SPEC.read_text()

    reply = json.loads(ex["gap"])
    gap = ProgressGap.from_wire(reply["error"])
    assert gap.to_reply() == reply

    scope = SyncScope.from_wire(json.loads(ex["scope-input"]))
    assert scope.to_wire() == json.loads(ex["scope-canonical"])
    assert scope.scope_id == ex["scope-id"].strip()
    for golden in (SyncScope.global_scope(), SCOPE, SyncScope.subset("https://example.com/chat", ["thread"])):
        assert f"`{json.dumps(golden.to_wire(), separators=(',', ':'))}` | `{golden.scope_id}`" in SPEC.read_text()

    checkpoint = DirectionCheckpoint.from_wire(json.loads(ex["checkpoint"]))
    assert checkpoint.to_wire() == json.loads(ex["checkpoint"])
    assert [t.position for t in checkpoint.unapplied_tokens] == [1041]
    assert checkpoint_rev(7, checkpoint) == ex["checkpoint-rev"].strip()


def test_the_spec_link_view_is_what_the_ledger_gives(tmp_path: Path) -> None:
    clock = FakeClock()
    led = Ledger(tmp_path / "l.db", clock=clock)
    key = led.open_link(TENANT, REMOTE, SCOPE).key
    led.transition(key, LinkState.LIVE, reason="caught up")
    led.record_success(key)
    clock.now += timedelta(minutes=10)
    for _ in range(3):
        led.record_failure(key, "ConnectionRefused")
    led.transition(key, LinkState.DEGRADED_POLL, reason="reconnects exhausted")
    assert led.link_state(key) == json.loads(spec_examples()["link"])
    led.close()
