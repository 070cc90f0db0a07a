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


def test_a_zero_byte_record_held_without_its_data_is_wanted_when_offered_with_it(tmp_path: Path) -> None:
    """A 0-byte initial write admitted without its (empty) data, as a source that had dropped it
    sends it, is not held when a listing offers it with data (``dataSize: 0``): it must come
    again, or the replica keeps it without its data while the source holds it with."""
    store = Store(tmp_path / "s.db")
    dwn = Dwn(store)
    ts = Clock().tick()
    write = RecordsWrite.create(signer=ALICE, data=b"", message_timestamp=ts, date_created=ts)
    assert dwn.apply_replicated_message(ALICE.did, write.message, None).kind == "Superseded"
    service = StoreService(store, dwn=dwn, ledger=Ledger.for_store(store), copies=CheckpointCopies(store),
                           committer=GroupCommitter(store))
    cid = write.cid
    assert service.run(HeldMessages(ALICE.did, (cid,))) == {cid}  # offered without data: held
    assert service.run(HeldMessages(ALICE.did, (cid,), with_data=(cid,))) == set()
    assert dwn.apply_replicated_message(ALICE.did, write.message, b"").kind == "Applied"
    assert service.run(HeldMessages(ALICE.did, (cid,), with_data=(cid,))) == {cid}
    store.close()
