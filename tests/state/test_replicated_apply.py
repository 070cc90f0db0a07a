"""What the store service keeps of a replicated apply beside the engine's: the origins (§11
echo suppression, ``p2psync show``: the store each message first arrived from, kept by its
archive row), and the data CID a sink computed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from p2psync.dwn import datacid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.effects import Apply, ApplyBatch
from p2psync.replication.sink import Sink
from p2psync.state.committer import GroupCommitter
from p2psync.state.copies import CheckpointCopies, Origins
from p2psync.state.ledger import Ledger
from p2psync.state.service import StoreService
from tests.replication.support import Clock, seeded

ALICE = seeded("origins-alice")
PHONE, TABLET = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"


def _writes(n: int) -> list[ReplicationEntry]:
    clock = Clock()
    out = []
    for i in range(n):
        ts = clock.tick()
        data = f"note {i}".encode()
        write = RecordsWrite.create(signer=ALICE, data=data, message_timestamp=ts, date_created=ts)
        out.append(ReplicationEntry(write.message, data))
    return out


def _service(store: Store) -> StoreService:
    return StoreService(store, dwn=Dwn(store), ledger=Ledger.for_store(store), copies=CheckpointCopies(store),
                        committer=GroupCommitter(store))


def test_the_first_arrival_is_kept_and_a_local_write_has_none(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    service = _service(store)
    first, second, local = _writes(3)
    done, error = service.run(ApplyBatch(ALICE.did, (first, second), PHONE))
    assert error is None and [r.kind for r, _ in done] == ["Applied", "Applied"]
    again, _ = service.run(Apply(ALICE.did, first, TABLET))  # a second arrival: a Duplicate
    assert again.kind == "Duplicate"
    assert Dwn(store).process_message(ALICE.did, local.message, local.data).code == 202
    service.committer.flush()
    cids = [first.cid, second.cid, local.cid]
    assert Origins(store).of(ALICE.did, cids) == {first.cid: PHONE, second.cid: PHONE}
    assert Origins(store).from_store(ALICE.did, cids, PHONE) == {first.cid, second.cid}
    assert Origins(store).from_store(ALICE.did, cids, TABLET) == set()
    assert Origins(store).of("did:key:nobody", cids) == {}
    store.close()


def test_an_origin_follows_its_archive_row_and_its_cid(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    service = _service(store)
    (entry,) = _writes(1)
    service.run(Apply(ALICE.did, entry, PHONE))
    service.committer.flush()
    (row,) = store.conn.execute("SELECT archive_row FROM peer_arrivals").fetchall()
    # Were the archive ever to give this row id to another message, that message would not
    # inherit the origin: the row names its CID too.
    store.conn.execute("UPDATE peer_arrivals SET cid='bafyother' WHERE archive_row=?", (row[0],))
    assert Origins(store).of(ALICE.did, [entry.cid]) == {}
    store.close()


def test_an_origin_goes_with_its_archive_row(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    service = _service(store)
    kept, gone, orphaned = _writes(3)
    service.run(ApplyBatch(ALICE.did, (kept, gone, orphaned), PHONE))
    service.committer.flush()
    store.conn.execute("DELETE FROM archive WHERE cid=?", (gone.cid,))
    assert [r[0] for r in store.conn.execute("SELECT cid FROM peer_arrivals ORDER BY archive_row")] == \
        [kept.cid, orphaned.cid]
    # A store whose rows went before the trigger existed loses those origins on its next open.
    store.conn.execute("DROP TRIGGER peer_arrivals_gone")
    store.conn.execute("DELETE FROM archive WHERE cid=?", (orphaned.cid,))
    store.close()
    store = Store(path)
    Origins(store)
    assert [r[0] for r in store.conn.execute("SELECT cid FROM peer_arrivals")] == [kept.cid]
    store.conn.execute("DELETE FROM archive WHERE cid=?", (kept.cid,))  # the trigger is back
    assert store.conn.execute("SELECT count(*) FROM peer_arrivals").fetchone() == (0,)
    store.close()


def test_a_store_with_the_old_origins_table_is_moved_over_on_open(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    service = _service(store)
    entries = _writes(3)
    service.run(ApplyBatch(ALICE.did, tuple(entries), PHONE))
    service.committer.flush()
    # As a store written before peer_arrivals held it: one row a message by DID and CID.
    store.conn.execute(
        "CREATE TABLE peer_origins (tenant TEXT NOT NULL, cid TEXT NOT NULL, store_id TEXT NOT NULL,"
        " PRIMARY KEY (tenant, cid)) WITHOUT ROWID"
    )
    store.conn.executemany("INSERT INTO peer_origins VALUES(?,?,?)",
                           [(ALICE.did, entries[0].cid, TABLET), (ALICE.did, entries[1].cid, TABLET),
                            (ALICE.did, "bafynotarchived", TABLET)])
    store.conn.execute("DELETE FROM peer_arrivals WHERE cid=?", (entries[0].cid,))
    store.close()

    store = Store(path)
    origins = Origins(store)
    # Moved where the new table had no row; the new table's own row stands where it had one.
    assert origins.of(ALICE.did, [e.cid for e in entries]) == {
        entries[0].cid: TABLET, entries[1].cid: PHONE, entries[2].cid: PHONE
    }
    assert store.conn.execute("SELECT 1 FROM sqlite_master WHERE name='peer_origins'").fetchone() is None
    store.close()


def test_data_a_sink_checked_is_hashed_once_through_the_apply(tmp_path: Path, monkeypatch: Any) -> None:
    """A sink hashes inline data to check it against the descriptor; the apply takes that CID
    (issue #17) — and only for the very bytes that were hashed."""
    store = Store(tmp_path / "s.db")
    service = _service(store)
    first, second = _writes(2)
    sink = Sink(SimpleNamespace(signal=lambda: None), 0, ALICE.did, key=None)  # type: ignore[arg-type]
    hashed: list[int] = []
    real = datacid._data_cid
    monkeypatch.setattr(datacid, "_data_cid", lambda data: hashed.append(len(data)) or real(data))
    assert first.data is not None
    entry, size = sink.read_entry({"message": first.message, "data": first.data, "dataSize": len(first.data)})
    assert size is None and entry.data_cid == first.message["descriptor"]["dataCid"] and len(hashed) == 1
    result, _ = service.run(Apply(ALICE.did, entry, PHONE))
    assert result.kind == "Applied" and len(hashed) == 1
    # An entry given other data forgets the CID: that data is hashed by the apply.
    assert second.data is not None and entry.with_data(second.data).data_cid is None
    result, _ = service.run(Apply(ALICE.did, second, PHONE))
    assert result.kind == "Applied" and len(hashed) == 2
    store.close()
