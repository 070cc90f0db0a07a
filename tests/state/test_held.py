"""``HeldMessages``: which listed CIDs a sink's store holds, asked once per listing page."""

from __future__ import annotations

from pathlib import Path

from p2psync.dwn.encoding import compute_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.replication.effects import HeldMessages
from p2psync.state.committer import GroupCommitter
from p2psync.state.copies import CheckpointCopies
from p2psync.state.ledger import Ledger
from p2psync.state.service import StoreService
from tests.replication.support import Clock, seeded

ALICE = seeded("held-alice")


def test_held_finds_every_stored_message_by_its_log_cid_a_zero_byte_record_too(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    dwn = Dwn(store)
    clock = Clock()
    for data in (b"", b"some bytes", b""):
        ts = clock.tick()
        write = RecordsWrite.create(signer=ALICE, data=data, message_timestamp=ts, date_created=ts)
        assert dwn.process_message(ALICE.did, write.message, data).code == 202
    service = StoreService(store, dwn=dwn, ledger=Ledger.for_store(store), copies=CheckpointCopies(store),
                           committer=GroupCommitter(store))
    logged = [cid for _, cid in store.events.read(ALICE.did)]
    stored = set(store.messages.cids(ALICE.did))
    # A zero-byte record is stored under the reference's CID (empty encodedData included) and
    # listed under its log CID: the two differ, and a sink asked only the first.
    assert len(set(logged) - stored) == 2
    absent = [compute_cid({"absent": i}) for i in range(600)]  # more than one IN chunk
    assert service.run(HeldMessages(ALICE.did, (*absent, *logged))) == set(logged)
    assert service.run(HeldMessages("did:key:nobody", tuple(logged))) == set()
    store.close()
