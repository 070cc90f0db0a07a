"""Bugs the simulator found, pinned down without it depending on one seed's RNG path."""

from __future__ import annotations

from pathlib import Path

from p2psync.dwn.records_write import RecordsWrite
from p2psync.replication.checkpoint import Direction
from p2psync.replication.tokens import ProgressToken
from p2psync.sim.simulation import SimConfig, Simulation
from p2psync.sim.writers import NOTE


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
