"""Bugs the simulator found, pinned down without it depending on one seed's RNG path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn.encoding import message_cid
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records_write import RecordsWrite
from p2psync.replication.checkpoint import Direction
from p2psync.replication.tokens import ProgressToken
from p2psync.sim.network import Link
from p2psync.sim.simulation import SimConfig, Simulation, run_seed
from p2psync.sim.world import SimPeer
from p2psync.sim.writers import CHAT, NOTE, Authored, chat_definition


def test_a_token_left_unapplied_whose_entry_left_the_log_does_not_hold_the_frontier(tmp_path: Path) -> None:
    """`--seed 11` (4 peers, 250 steps) before the fix: a `rev` was in flight when its link
    dropped, so its token stayed unapplied; a later update superseded that message, its log
    entry went, nothing ever listed it again, and the push frontier stayed behind it for good
    (every later round re-listed everything after it). A round now starts its directions
    from the frontier with the unsettled tokens dropped (a logged rewind)."""
    sim = Simulation(3, SimConfig(peers=2, steps=0, topology="line"), tmp_path)
    link = sim.links[0]
    active = sim.peers[link.active]
    alice = sim.cast.alice
    first = RecordsWrite.create(signer=alice, data=b"v0", schema=NOTE, data_format="text/plain",
                                message_timestamp=sim.clock.timestamp(0), date_created=sim.clock.timestamp(0))
    edit = RecordsWrite.create_from(first.message, signer=alice, data=b"v1", message_timestamp=sim.clock.timestamp(1))
    other = RecordsWrite.create(signer=alice, data=b"other", schema=NOTE, data_format="text/plain",
                                message_timestamp=sim.clock.timestamp(2), date_created=sim.clock.timestamp(2))
    for write, data in ((first, b"v0"), (edit, b"v1"), (other, b"other")):
        assert active.dwn.process_message(sim.tenant, write.message, data).code == 202
    assert sim.quiesce()
    key = active.ledger.links(sim.tenant)[0].key
    # As after a dropped connection: an edit (4) was listed, its `rev` never answered; a later
    # write (5) was applied.
    edit2 = RecordsWrite.create_from(edit.message, signer=alice, data=b"v2", message_timestamp=sim.clock.timestamp(3))
    late = RecordsWrite.create(signer=alice, data=b"late", schema=NOTE, data_format="text/plain",
                               message_timestamp=sim.clock.timestamp(4), date_created=sim.clock.timestamp(4))
    for write, data in ((edit2, b"v2"), (late, b"late")):
        assert active.dwn.process_message(sim.tenant, write.message, data).code == 202
    stream, epoch = active.stream
    tokens = {p: ProgressToken(stream, epoch, p, c) for p, c in active.store.events.read(sim.tenant, after=-1, limit=9)}
    steps = [("received", tokens[4]), ("received", tokens[5]), ("applied", tokens[5])]
    active.ledger.record(key, Direction.PUSH, steps)  # type: ignore[arg-type]
    # Then the edit is superseded: its log entry goes, nothing will list it again.
    edit3 = RecordsWrite.create_from(edit2.message, signer=alice, data=b"v3", message_timestamp=sim.clock.timestamp(9))
    assert active.dwn.process_message(sim.tenant, edit3.message, b"v3").code == 202
    assert 4 not in [p for p, _ in active.store.events.read(sim.tenant, after=-1, limit=9)]

    assert sim.quiesce()
    checkpoint, _ = active.ledger.get_checkpoint(key, Direction.PUSH)
    head = active.store.events.read(sim.tenant, after=-1, limit=10)[-1][0]
    assert checkpoint.contiguous_applied_token is not None
    assert checkpoint.contiguous_applied_token.position == head
    assert not checkpoint.unapplied_tokens
    assert [t.reason for t in active.ledger.transitions(key) if t.kind == "checkpoint_rewind"][-1:] == [
        "unsettled_at_resume"
    ]
    sim.close()


def test_a_pull_feed_lists_only_committed_log_entries(tmp_path: Path) -> None:
    """Stress weights, `--seed 18` (4 peers): p2 had pulled messages into its open group
    commit, p1 pulled them from p2 and its pull frontier moved past them; p2 crashed, the batch
    was rolled back, and p2's next messages took the same log positions — under p1's frontier,
    never to be listed to p1 (unless the reused token happened to differ). A pull feed now
    commits the open batch before it reads a page."""
    sim = Simulation(0, SimConfig(peers=3, steps=0, topology="line"), tmp_path)
    sim.links = [Link(0, active=2, passive=0), Link(1, active=1, passive=2)]
    p0, p1, p2 = sim.peers
    alice = sim.cast.alice
    for i in range(6):
        now = sim.clock.timestamp(i)
        note = RecordsWrite.create(signer=alice, data=b"n%d" % i, schema=NOTE, data_format="text/plain",
                                   message_timestamp=now, date_created=now)
        assert p0.dwn.process_message(sim.tenant, note.message, b"n%d" % i).code == 202
    # p2 pulls from p0: applies land in p2's open batch; nothing commits p2 here.
    first = sim.connect(sim.links[0])
    sim.settle()
    while first.in_flight and p2.log_version() < 4:
        sim._deliver(first, first.in_flight.pop(0))
        sim.settle()
    assert p2.committer.in_batch and p2.log_version() >= 3
    # p1 pulls from p2 meanwhile, committing its own store as it goes.
    second = sim.connect(sim.links[1])
    sim.settle()
    for _ in range(2000):
        if second.in_flight:
            sim._deliver(second, second.in_flight.pop(0))
        elif p1.pending or p1.committer.in_batch:
            sim.commit(p1)
        else:
            break
        sim.settle()
        keys = p1.ledger.links(sim.tenant)
        if keys and p1.ledger.get_checkpoint(keys[0].key, Direction.PULL)[0].contiguous_applied_token is not None:
            break
    key = p1.ledger.links(sim.tenant)[0].key
    sim.commit(p1)
    frontier = p1.ledger.get_checkpoint(key, Direction.PULL)[0].contiguous_applied_token
    assert frontier is not None
    # p2 crashes: what its pull feed listed must have been committed.
    sim._close(first, "test", failed=True)
    sim._close(second, "test", failed=True)
    p2.crash()
    p2.open()
    listed = dict(p2.store.events.read(sim.tenant, after=-1, limit=100))
    assert listed.get(frontier.position) == frontier.message_cid
    sim.close()


@pytest.mark.parametrize(
    ("seed", "case"),
    [
        (52, "two devices delete one record"),
        (227, "a delete, then a later update of the record"),
        (299, "a child of a record deleted first"),
        (48, "a revocation under a grant deleted first"),
        (526, "a message authorized by a role since deleted; an older protocol definition"),
        (441, "a grant created, revoked and deleted before the first sync"),
    ],
)
def test_the_order_dependent_seeds_converge(tmp_path: Path, seed: int, case: str) -> None:
    """The minimal seeds that showed 0.5.2's order-dependent outcomes between two devices
    (docs/replication-apply.md, *Canonical outcomes*) end in the canonical state."""
    config = SimConfig(peers=2, steps=30, topology="line", ops="full")
    result = run_seed(seed, config, tmp_path)
    assert result.outcome == "converged", "\n".join([case, *map(str, result.findings), config.replay(seed)])


@pytest.mark.parametrize(("seed", "peers", "steps", "topology"), [(92, 2, 250, "random"), (8, 2, 120, "mesh")])
def test_what_only_archives_keep_is_served(tmp_path: Path, seed: int, peers: int, steps: int, topology: str) -> None:
    """Seed 92: a revocation sorting before its grant's delete needs the grant's data, which
    the delete dropped from the state; seed 8: a thread written under a protocol definition a
    newer one replaced. Both only archives keep, and a peer serves them from there."""
    config = SimConfig(peers=peers, steps=steps, topology=topology, ops="full")
    result = run_seed(seed, config, tmp_path)
    assert result.outcome == "converged", "\n".join([*map(str, result.findings), config.replay(seed)])


def test_a_configure_superseded_before_it_was_sent_still_decides_a_role_write(tmp_path: Path) -> None:
    """Found by `--scopes mixed` (`--peers 4 --seed 33 --topology mesh --faults heavy`; with
    global links, 2 peers, 120 steps, seed 12 of the member writers). p1 configures the chat
    protocol with `member` a role (C2), writes bob's member record, and configures again (C3):
    the reference drops C2 from p1's store and log, so no round listed it, and nothing asked
    for it (p0 admits everything under C1, where `member` is a plain path). p0 wrote its own
    member record for bob between C2 and p1's: in canonical order C2 makes p1's a duplicate
    role recipient (p1, which archived C2, warps and supersedes it), while p0 held it. The
    replicas differed. Now p1's log keeps listing C2 (protocol/replication-apply.md,
    *Superseded definitions travel*)."""
    sim = Simulation(1, SimConfig(peers=2, steps=0, topology="line"), tmp_path)
    p0, p1 = sim.peers
    alice, bob = sim.cast.alice, sim.cast.bob

    def at(second: int) -> str:
        return sim.clock.timestamp(second)

    def accept(peer: SimPeer, message: dict[str, Any], data: bytes | None, op: str) -> None:
        assert peer.dwn.process_message(sim.tenant, message, data).code == 202
        cid = message_cid(message)  # remembered as the writers do: canonical is of these
        sim.writer.authored[cid] = Authored(cid, message, data, peer.name, 0, op)

    def configure(peer: SimPeer, second: int, member: bool) -> None:
        accept(peer, ProtocolsConfigure.create(definition=chat_definition(1, member), signer=alice,
                                               message_timestamp=at(second)).message, None, "configure")

    def member(peer: SimPeer, second: int) -> None:
        write = RecordsWrite.create(signer=alice, data=b"member", protocol=CHAT, protocol_path="member",
                                    recipient=bob.did, message_timestamp=at(second), date_created=at(second))
        accept(peer, write.message, b"member", "member")

    configure(p0, 0, member=False)  # C1, on both
    assert sim.quiesce()
    configure(p1, 1, member=True)  # C2
    member(p0, 2)  # under C1 on p0
    member(p1, 3)  # under C2 on p1: bob's first role record there
    configure(p1, 4, member=True)  # C3: C2 leaves p1's log
    result = sim.finish(sim.quiesce())
    assert result.outcome == "converged", [str(f) for f in result.findings]


def test_two_pushes_into_one_peer_do_not_wait_on_each_other(tmp_path: Path) -> None:
    """Found by `--scopes mixed` (docs/simulator.md, *What it found*): p2 (subset `thread`)
    is pushed to by p1 and p3. Before the fix, p1's push sink on p2, declined an item for p3's
    sink, waited on it only after that claim had ended and p3's sink had claimed it afresh in
    a later listing, which waited on one of p1's claims: no round ended."""
    result = run_seed(35, SimConfig(peers=4, topology="mesh", faults="heavy", scopes="mixed"), tmp_path)
    assert not any(f.kind == "no_quiescence" for f in result.findings), [str(f) for f in result.findings]


@pytest.mark.parametrize(
    ("seed", "case"),
    [
        (20318, "role records written on a subset device before a configure made their path a role"),
        (40078, "grants written on a protocol-scoped device, reconciled past by a full peer"),
        (40194, "grants on a full peer, reconciled past by a protocol-scoped one"),
    ],
)
def test_the_scoped_seeds_that_lost_messages_converge(tmp_path: Path, seed: int, case: str) -> None:
    """`--scopes mixed` seeds (docs/simulator.md, *What it found*). 20318: a subset device's
    push settled, unproposed, a configure that had come from the full peer (origin echo
    suppression), so the full peer never asked for the role records written on the device
    (tests/replication/test_subset_roles.py). 40078, 40194: a reconciling round compared only
    the protocol's messages and resumed after the peer's log head, past its grants
    (tests/replication/test_protocol_scope_reconcile.py)."""
    config = SimConfig(peers=4, steps=250, topology="random", ops="full", scopes="mixed")
    result = run_seed(seed, config, tmp_path)
    assert result.outcome == "converged", "\n".join([case, *map(str, result.findings), config.replay(seed)])
