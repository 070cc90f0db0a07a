"""The maintained reconciliation sketches of a store (p2psync/state/sketches.py).

Whatever way messages come and go, a maintained set's sketch and id map must equal ones built
from the store from scratch: a change counted twice (a protocol-less message is in the tenant
set only) silently breaks every decode until the sketch is rebuilt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from p2psync.dwn.engine import Dwn
from p2psync.dwn.records import create_records_delete
from p2psync.dwn.store import Store
from p2psync.errors import LocalMisuse
from p2psync.replication.lthash import lthash_digest
from p2psync.replication.recon import DIGEST_BYTES
from p2psync.replication.riblt import Coder, Sketch
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import PeerError
from p2psync.state.sketches import SKETCH_SIZE, SetSketches
from tests.peer.support import Clock, seeded, write_notes

ALICE = seeded("sketches-alice")
GLOBAL = SyncScope.global_scope()


def fresh(cids: list[str]) -> Sketch:
    sketch = Sketch(Coder(), SKETCH_SIZE)
    sketch.add_cids(cids)
    return sketch


def assert_maintained(sketches: SetSketches, store: Store) -> None:
    cids = store.messages.cids(ALICE.did)
    view = sketches.view(ALICE.did, GLOBAL)
    assert view.count == len(cids)
    assert view.digest[:DIGEST_BYTES] == lthash_digest(cids)[:DIGEST_BYTES]
    expected = fresh(cids)
    assert view.symbols(0, SKETCH_SIZE).ids == expected.symbols.ids
    assert view.symbols(0, SKETCH_SIZE).counts == expected.symbols.counts
    assert view.lanes() == expected.estimator.lanes()


def test_the_maintained_sketch_follows_writes_and_deletes(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    sketches = SetSketches(store)
    clock = Clock()
    ids = write_notes(store, ALICE, 6, clock=clock)
    assert_maintained(sketches, store)
    assert sketches.builds == 1
    write_notes(store, ALICE, 4, clock=clock, prefix="more")
    dwn = Dwn(store)
    for record_id in ids[:3]:
        delete = create_records_delete(signer=ALICE, record_id=record_id, message_timestamp=clock.tick())
        assert dwn.process_message(ALICE.did, delete).code == 202
    assert_maintained(sketches, store)
    assert sketches.builds == 1  # kept up to date, not rebuilt


def test_another_connection_that_folds_makes_the_sketch_catch_up(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    sketches = SetSketches(store)
    write_notes(store, ALICE, 3, clock=Clock())
    assert_maintained(sketches, store)
    other = Store(tmp_path / "s.db")
    write_notes(other, ALICE, 3, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="other")
    SetSketches(other).view(ALICE.did, GLOBAL)  # folds the rows the first one has not seen
    assert_maintained(sketches, store)


def test_ids_resolve_to_cids_under_the_default_and_a_salted_coder(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    sketches = SetSketches(store)
    write_notes(store, ALICE, 5, clock=Clock())
    cids = sorted(store.messages.cids(ALICE.did))
    for coder in (Coder(), Coder(3, bytes(range(16)))):
        ids = [coder.key(c).id for c in cids[:2]]
        assert sketches.cids_of(ALICE.did, GLOBAL, coder, ids) == cids[:2]
        view = sketches.view(ALICE.did, GLOBAL, coder)
        assert view.coder == coder and view.count == 5
    described = sketches.describe(ALICE.did, cids[:1])
    assert described[0]["cid"] == cids[0] and described[0]["kind"] == "RecordsWrite"


def test_reads_refuse_an_open_transaction_and_subset_scopes(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    sketches = SetSketches(store)
    store.conn.execute("BEGIN")
    with pytest.raises(LocalMisuse):
        sketches.view(ALICE.did, GLOBAL)
    store.conn.execute("ROLLBACK")
    subset = SyncScope.from_wire({"kind": "subset", "protocol": "https://example.org/p",
                                  "protocolPathPrefixes": ["a"]})
    with pytest.raises(PeerError) as info:
        sketches.view(ALICE.did, subset)
    assert info.value.name == "ReconcileScopeUnsupported"
