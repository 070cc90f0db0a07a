"""The maintained reconciliation sketches of a store (p2psync/state/sketches.py).

Whatever way messages come and go, a maintained set's sketch and id map must equal ones built
from the store from scratch: a change counted twice (a protocol-less message is in the tenant
set only) silently breaks every decode until the sketch is rebuilt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.dwn.encoding import compute_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.permissions import PERMISSIONS_PROTOCOL_URI
from p2psync.dwn.records import create_records_delete
from p2psync.dwn.store import Store
from p2psync.errors import LocalMisuse
from p2psync.replication.lthash import lthash_digest
from p2psync.replication.recon import DIGEST_BYTES
from p2psync.replication.riblt import Coder, Sketch
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import PeerError
from p2psync.state import sketches as sketches_module
from p2psync.state.setindex import SetIndex
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


# --------------------------------------------------------------------------- queued changes


TENANTS = ["did:example:alice", "did:example:bob"]
PROTOCOLS = [None, "https://example.com/a", "https://example.com/b", PERMISSIONS_PROTOCOL_URI]
CIDS = [compute_cid({"n": i}) for i in range(10)]


def put(store: Store, tenant: str, cid: str, protocol: str | None) -> None:
    indexes: dict[str, Any] = {"interface": "Records", "method": "Write"}
    if protocol is not None:
        indexes["protocol"] = protocol
    store.messages.put(tenant, {"cid": cid}, indexes, cid=cid)


def assert_scope_maintained(sketches: SetSketches, store: Store, tenant: str, protocol: str | None) -> None:
    scope = GLOBAL if protocol is None else SyncScope.for_protocol(protocol)
    # anti-entropy.md §1: a protocol's set carries the permissions protocol's messages too.
    carried = {protocol, PERMISSIONS_PROTOCOL_URI} if protocol is not None else {None}
    cids = [c for p in carried for c in sketches.index.cids(tenant, p)]
    view = sketches.view(tenant, scope)
    expected = fresh(cids)
    assert view.count == len(cids)
    assert view.digest == lthash_digest(cids)
    assert view.symbols(0, SKETCH_SIZE) == expected.symbols
    assert view.lanes() == expected.estimator.lanes()
    ids = [Coder().key(c).id for c in cids]
    assert sketches.cids_of(tenant, scope, Coder(), ids) == sorted(cids)


step = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(TENANTS), st.sampled_from(CIDS), st.sampled_from(PROTOCOLS)),
    st.tuples(st.just("delete"), st.sampled_from(TENANTS), st.sampled_from(CIDS)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("read"), st.sampled_from(TENANTS[:1]), st.sampled_from(PROTOCOLS[:2] + PROTOCOLS[3:])),
    st.tuples(st.just("fold-other")),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, max_size=50), st.sampled_from([1, 2, 3, 5]))
def test_queued_changes_leave_every_read_exact(script: list[tuple[Any, ...]], limit: int) -> None:
    """Changes are queued, walked in at the limit or at a read, and a set read too rarely is
    dropped and rebuilt: whatever the order, every read equals a sketch built from scratch."""
    store = Store(":memory:")
    for tenant in TENANTS:
        store.tenant_id(tenant)
    committer_open = False
    with patch.object(sketches_module, "PENDING_LIMIT", limit):
        sketches, other = SetSketches(store), SetIndex(store)
        for kind, *args in script:
            if kind in ("put", "delete") and not committer_open:
                store.conn.execute("BEGIN")  # a batch of writes, as the group committer makes
                committer_open = True
            if kind == "put":
                put(store, args[0], args[1], args[2])
            elif kind == "delete":
                store.messages.delete(args[0], args[1])
            elif committer_open:
                store.conn.execute("COMMIT")
                committer_open = False
                sketches.index.catch_up()
            if kind == "read":
                assert_scope_maintained(sketches, store, args[0], args[1])
            elif kind == "fold-other":
                other.catch_up()
        if committer_open:
            store.conn.execute("COMMIT")
        for tenant in TENANTS:
            for protocol in PROTOCOLS:
                assert_scope_maintained(sketches, store, tenant, protocol)
    store.close()


def test_a_set_changed_more_than_it_holds_before_a_read_is_rebuilt_not_walked(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    sketches = SetSketches(store)
    with patch.object(sketches_module, "PENDING_LIMIT", 4):
        for cid in CIDS[:8]:
            put(store, ALICE.did, cid, None)
        assert_scope_maintained(sketches, store, ALICE.did, None)
        assert sketches.builds == 1
        for cid in CIDS[8:]:  # 2 changes, fewer than the set's 8: kept and walked in at the read
            put(store, ALICE.did, cid, None)
        sketches.index.catch_up()
        assert_scope_maintained(sketches, store, ALICE.did, None)
        assert sketches.builds == 1
        # Unread changes are walked in 4 at a time (the limit) while they are fewer than the
        # set holds; once they outnumber it, it is dropped and built again when read.
        for cid in CIDS[:5]:
            store.messages.delete(ALICE.did, cid)
            sketches.index.catch_up()
        kept = sketches._kept[(ALICE.did, None)]
        assert kept.unread == 4 and len(kept.pending) == 1 and kept.sketch.count == 6
        assert_scope_maintained(sketches, store, ALICE.did, None)
        assert sketches.builds == 1
        for cid in CIDS[5:]:  # 4 walked in (4 unread against 5 held), then 1 queued
            store.messages.delete(ALICE.did, cid)
            sketches.index.catch_up()
        for cid in CIDS[:3]:  # 8 unread against 1 held
            put(store, ALICE.did, cid, None)
            sketches.index.catch_up()
        assert (ALICE.did, None) not in sketches._kept
        assert_scope_maintained(sketches, store, ALICE.did, None)
        assert sketches.builds == 2
    store.close()
