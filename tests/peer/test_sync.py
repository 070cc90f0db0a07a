"""Push, pull and both over loopback WebSockets between two real stores (issue #5's acceptance).

Each test uses real SQLite files, real Ed25519 signatures and real sockets on 127.0.0.1.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import trio

from p2psync.dwn import datacid
from p2psync.dwn.encoding import message_cid
from p2psync.peer import peer as peer_module
from p2psync.peer.peer import Peer
from p2psync.replication.hello import new_hello
from p2psync.replication.scope import SyncScope
from p2psync.replication.sink import Sink
from p2psync.replication.wire import PeerError
from p2psync.state.copies import checkpoint_id
from p2psync.state.ledger import Direction
from tests.peer.support import Clock, assert_same, new_store, seeded, served, write_notes

ALICE = seeded("alice-peer")

#: Who offers the batched `revs` profile in hello (§8.4): both (batched), or one side not
#: (every message in its own `rev`, the fallback).
BATCHING = ["both-offer-revs", "passive-without-revs", "active-without-revs"]


def offer_revs(monkeypatch: pytest.MonkeyPatch, batching: str, passive: Peer, active: Peer) -> list[int]:
    """Make the named peer's hellos offer no capabilities; returns a list that grows by the
    number of messages of each `revs` request a sink answers."""
    without = {"passive-without-revs": passive.store_id, "active-without-revs": active.store_id}.get(batching)

    def hello(did: str, store_id: str, *args: object) -> object:
        return new_hello(did, store_id, *args, capabilities=() if store_id == without else ("revs",))  # type: ignore[arg-type]

    monkeypatch.setattr(peer_module, "new_hello", hello)
    batches: list[int] = []
    on_revs = Sink.on_revs

    def counted(self: Sink, body: bytes):  # type: ignore[no-untyped-def]
        results = yield from on_revs(self, body)
        batches.append(len(results))
        return results

    monkeypatch.setattr(Sink, "on_revs", counted)
    return batches


@pytest.mark.parametrize("batching", BATCHING)
@pytest.mark.parametrize("passive_holds", [True, False], ids=["pull", "push"])
async def test_one_shot_each_way(
    tmp_path: Path, passive_holds: bool, batching: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records reach the other store whichever side opened the connection, in `revs`
    batches when both offer them and one `rev` a message when either does not (§8.4)."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    holder = a if passive_holds else b
    write_notes(holder, ALICE, 30, clock=Clock(), sizes={5: 40_000})
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    batches = offer_revs(monkeypatch, batching, passive, active)
    async with served(passive) as url:
        summary = await active.sync(url, tenant=ALICE.did, direction="pull" if passive_holds else "push")
    assert_same(a, b, ALICE)
    stats = summary.pull if passive_holds else summary.push
    assert stats is not None
    assert stats.revs_settled == 30 and stats.results == {"Applied": 30}
    if batching == "both-offer-revs":
        # The large record goes alone (its data by getAttachment); the rest in batches.
        assert sum(batches) == 29 and max(batches) > 1
    else:
        assert batches == []
    if passive_holds:
        assert stats.attachments_fetched == 1  # the 40,000-byte record came by getAttachment
    # The frontier of the direction that ran is saved on both sides.
    direction = Direction.PULL if passive_holds else Direction.PUSH
    link = active.ledger.links()[0]
    local, _ = active.ledger.get_checkpoint(link.key, direction)
    assert local.contiguous_applied_token is not None
    assert summary.checkpoint[str(direction)] == local.to_wire()
    assert str(link.state) == "live"


async def test_both_directions_at_once(tmp_path: Path) -> None:
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    clock = Clock()
    write_notes(a, ALICE, 20, clock=clock, prefix="from a")
    write_notes(b, ALICE, 15, clock=clock, prefix="from b")
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    async with served(passive) as url:
        # Two disjoint sets: every message moves anyway, so the logs stream (no reconciliation).
        summary = await active.sync(url, tenant=ALICE.did, direction="both")
        assert summary.pull is not None and summary.push is not None
        assert summary.pull.revs_applied == 20 and summary.push.revs_applied == 15
        assert summary.pull.reconciled == summary.push.reconciled == 0
        assert_same(a, b, ALICE)
        # A second round finds nothing to move either way.
        again = await active.sync(url, tenant=ALICE.did, direction="both")
    assert again.pull is not None and again.push is not None
    assert again.pull.revs_received == 0 and again.push.revs_sent == 0
    # Echo suppression (§11): what b pulled from a is never proposed back to a.
    assert summary.push.items_offered + again.push.items_offered == 15
    assert summary.push.echoes_suppressed + again.push.echoes_suppressed == 20


async def test_a_first_sync_of_overlapping_replicas_reconciles(tmp_path: Path) -> None:
    """Two replicas that share most of their messages (a restored backup, a device filled by
    another path) meet for the first time: only the difference moves, by CID, both ways."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    clock = Clock()
    write_notes(a, ALICE, 30, clock=clock, prefix="shared")
    async with served(Peer(a, ALICE)) as url:
        await Peer(b, ALICE).fetch_messages(url, tenant=ALICE.did, cids=a.messages.cids(ALICE.did))
    write_notes(a, ALICE, 3, clock=clock, prefix="later on a")
    write_notes(b, ALICE, 2, clock=clock, prefix="later on b")
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    async with served(passive) as url:
        summary = await active.sync(url, tenant=ALICE.did, direction="both")
        assert summary.pull is not None and summary.push is not None
        assert (summary.pull.reconciled, summary.push.reconciled) == (3, 2)
        assert (summary.pull.revs_applied, summary.push.revs_applied) == (3, 2)
        assert summary.pull.revs_received == summary.push.revs_sent == 0
        assert_same(a, b, ALICE, events=False)
        again = await active.sync(url, tenant=ALICE.did, direction="both")
    assert again.pull is not None and again.push is not None
    assert again.pull.revs_received == 0 and again.push.revs_sent == 0
    assert summary.state == again.state == "live"


async def test_resume_after_disconnect_sends_nothing_twice(tmp_path: Path) -> None:
    """A connection cut mid-pull resumes from the saved frontier: no applied message is re-sent."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 60, clock=Clock())
    passive, active = Peer(a, ALICE), Peer(b, ALICE, max_unanswered_revs=4)
    async with served(passive) as url:
        rounds_seen: list[int] = []

        def on_progress(progress: object) -> None:
            from p2psync.replication.stats import SyncProgress

            assert isinstance(progress, SyncProgress)
            if progress.messages >= 20 and not rounds_seen:
                rounds_seen.append(progress.messages)
                session = next(iter(active._sessions.values()))
                assert session.conn is not None
                session.conn.start_soon(session.conn.aclose)

        summary = await active.sync(url, tenant=ALICE.did, on_progress=on_progress)
    assert summary.rounds == 2
    assert_same(a, b, ALICE)
    assert summary.pull is not None
    # Every message crossed once (the few in flight at the cut may come twice: at most the
    # rev window of 4), never the whole first part again.
    assert 60 <= summary.pull.revs_received <= 60 + 4
    assert summary.pull.results.get("Applied") == 60


async def test_stale_checkpoint_rev_is_reread(tmp_path: Path) -> None:
    """setCheckpoint with a stale rev gets 409 with the current rev; the active retries with it."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 10, clock=Clock())
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    async with served(passive) as url:
        first = await active.sync(url, tenant=ALICE.did)
        assert first.copy_rev is not None and first.copy_rev.startswith("1-")
        write_notes(a, ALICE, 3, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="later")
        cp_id = checkpoint_id(active.store_id, passive.store_id, SyncScope.global_scope().scope_id, ALICE.did)
        bumped: list[str] = []

        def bump(_: object) -> None:
            # Another writer moves the copy on while this round runs: our rev goes stale.
            if not bumped:
                stored = passive.copies.get(ALICE.did, cp_id)
                assert stored is not None
                bumped.append(passive.copies.set(ALICE.did, cp_id, stored[0], stored[1]))

        second = await active.sync(url, tenant=ALICE.did, on_progress=bump)
    assert bumped and bumped[0].startswith("2-")
    assert second.copy_rev is not None and second.copy_rev.startswith("3-")
    stored = passive.copies.get(ALICE.did, cp_id)
    assert stored is not None and stored[1] == second.copy_rev
    assert stored[0]["pull"] == second.checkpoint["pull"]


async def test_checkpoint_mismatch_rewinds_to_the_lower_point(tmp_path: Path) -> None:
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 12, clock=Clock())
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    async with served(passive) as url:
        await active.sync(url, tenant=ALICE.did)
        # The passive is restored from an old backup: its copy is empty again.
        cp_id = checkpoint_id(active.store_id, passive.store_id, SyncScope.global_scope().scope_id, ALICE.did)
        stored = passive.copies.get(ALICE.did, cp_id)
        assert stored is not None
        passive.copies.set(ALICE.did, cp_id, {"pull": {}, "push": {}}, stored[1])
        again = await active.sync(url, tenant=ALICE.did)
    key = active.ledger.links()[0].key
    rewinds = [t for t in active.ledger.transitions(key) if t.kind == "checkpoint_rewind"]
    assert len(rewinds) == 1 and rewinds[0].direction == Direction.PULL
    assert again.pull is not None
    # The sets are equal: reconciled in one round trip, resumed after the source's head.
    assert again.pull.revs_received == 0 and again.pull.items_skipped == 0 and again.pull.reconciled == 0
    assert_same(a, b, ALICE)


async def test_gap_repairs_and_goes_live(tmp_path: Path) -> None:
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 8, clock=Clock())
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    async with served(passive) as url:
        await active.sync(url, tenant=ALICE.did)
        # The source's log starts a new epoch (a restore or a rebuild): old tokens are a gap.
        with a.transaction():
            a.conn.execute("UPDATE tenants SET epoch='00000000-0000-4000-8000-00000000e90c' WHERE did=?", (ALICE.did,))
        write_notes(a, ALICE, 2, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="after")
        summary = await active.sync(url, tenant=ALICE.did)
    key = active.ledger.links()[0].key
    kinds = [(t.kind, str(t.state_to)) for t in active.ledger.transitions(key)]
    assert ("state", "repairing") in kinds and ("checkpoint_reset", "repairing") in kinds
    assert kinds[-1] == ("state", "live")
    assert summary.state == "live"
    # Reconciled, not replayed: the 2 new messages fetched by CID, the 8 held never listed.
    assert summary.pull is not None
    assert summary.pull.reconciled == 2 and summary.pull.revs_received == 0 and summary.pull.items_offered == 0
    pull, _ = active.ledger.get_checkpoint(key, Direction.PULL)
    assert pull.contiguous_applied_token is not None and pull.contiguous_applied_token.epoch.endswith("e90c")
    assert_same(a, b, ALICE)


async def test_unauthorized_peer_reads_nothing(tmp_path: Path) -> None:
    a = new_store(tmp_path, "a")
    write_notes(a, ALICE, 5, clock=Clock())
    mallory = seeded("mallory-peer")
    eve_store = new_store(tmp_path, "m")
    async with served(Peer(a, ALICE)) as url:
        with pytest.raises(PeerError) as err:
            await Peer(eve_store, mallory).sync(url, tenant=ALICE.did)
        assert (err.value.code, err.value.name) == (403, "SyncNotAuthorized")
    # Pushing is disclosure: alice's device does not push to a peer that is no reader of hers.
    async with served(Peer(eve_store, mallory)) as url:
        with pytest.raises(PeerError) as pushed:
            await Peer(a, ALICE).sync(url, tenant=ALICE.did, direction="push")
        assert (pushed.value.code, pushed.value.name) == (403, "SyncNotAuthorized")
    assert eve_store.tenant_id(ALICE.did, create=False) is None


async def test_continuous_both_ways(tmp_path: Path) -> None:
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 3, clock=Clock())
    passive, active = Peer(a, ALICE), Peer(b, ALICE)

    async def until(predicate: object) -> None:
        assert callable(predicate)
        with trio.fail_after(20):
            while not predicate():
                await trio.sleep(0.05)

    async with served(passive) as url, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: active.sync(url, tenant=ALICE.did, direction="both", continuous=True))
        await until(lambda: len(b.messages.cids(ALICE.did)) == 3)
        write_notes(a, ALICE, 2, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="on a")
        await until(lambda: len(b.messages.cids(ALICE.did)) == 5)
        write_notes(b, ALICE, 2, clock=Clock("2032-01-01T00:00:00.000000Z"), prefix="on b")
        await until(lambda: len(a.messages.cids(ALICE.did)) == 7)
        nursery.cancel_scope.cancel()
    assert_same(a, b, ALICE)
    assert str(active.ledger.links()[0].state) == "live"



@pytest.mark.parametrize("batching", BATCHING)
async def test_forged_message_pushed_is_refused_and_harms_nothing(
    tmp_path: Path, batching: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forged message is answered Invalid on its own; in a `revs` batch the other messages
    of the batch are applied all the same."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 10, clock=Clock())
    # Slip a forged message into the pusher's own log, bypassing its engine: a real write whose
    # descriptor was changed after signing (the signature no longer covers it).
    honest = a.messages.get(ALICE.did, a.messages.cids(ALICE.did)[0])
    assert honest is not None
    forged = copy.deepcopy(honest)
    forged["descriptor"]["dataFormat"] = "application/x-forged"
    forged["recordId"] = "bafyreiaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    with a.transaction():
        indexes = {"interface": "Records", "method": "Write", "recordId": forged["recordId"]}
        a.messages.put(ALICE.did, forged, indexes)
        a.events.append(ALICE.did, message_cid(forged), indexes)
    passive, active = Peer(b, ALICE), Peer(a, ALICE)
    batches = offer_revs(monkeypatch, batching, passive, active)
    async with served(passive) as url:
        summary = await active.sync(url, tenant=ALICE.did, direction="push")
    assert summary.push is not None
    assert summary.push.results.get("Invalid") == 1 and summary.push.results.get("Applied") == 10
    assert sum(batches) == (11 if batching == "both-offer-revs" else 0)
    assert not b.messages.has(ALICE.did, message_cid(forged))
    assert len(b.messages.cids(ALICE.did)) == 10
    # Invalid settles (§11): the push frontier passed it, nothing is left to retry.
    push, _ = active.ledger.get_checkpoint(active.ledger.links()[0].key, Direction.PUSH)
    assert not push.unapplied_tokens and not push.pending_tokens


BIG = 5 * 1024 * 1024 + 17  # ≥ 5 MiB: out of line, by getAttachment


async def test_fetched_attachment_is_hashed_once_as_it_arrives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The syncing side hashes a fetched attachment while it streams; the sink's check and the
    engine's take that CID (issue #17: each used to hash the 10 MiB again)."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 2, clock=Clock(), sizes={1: BIG})
    whole_hashes: list[int] = []
    real = datacid._data_cid

    def counted(data: bytes | bytearray | memoryview) -> str:
        whole_hashes.append(len(data))
        return real(data)

    monkeypatch.setattr(datacid, "_data_cid", counted)
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    async with served(passive) as url:
        summary = await active.sync(url, tenant=ALICE.did)
    assert summary.pull is not None and summary.pull.attachments_fetched == 1
    # Once in all, in this one process: the syncing side hashes what arrived (on a worker
    # thread), and the sink's check and the engine's apply take that CID; the source serves its
    # file unhashed, sealed as checked when it was written (dwn/blobs.py).
    assert whole_hashes.count(BIG) == 1
    assert_same(a, b, ALICE)


def _damaged(good: bytes, damage: str) -> bytes:
    return good[: BIG // 2] if damage == "truncated" else bytes([good[0] ^ 0xFF]) + good[1:]


@pytest.mark.parametrize("damage", ["truncated", "mismatched"])
async def test_large_records_by_attachment_and_bad_data_refused(tmp_path: Path, damage: str) -> None:
    """Bad bytes a source sends are refused by the sink: here a row of a store from before
    schema 9, whose data is in SQLite (the source serves it unchecked, as it always did)."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    ids = write_notes(a, ALICE, 4, clock=Clock(), sizes={1: BIG, 2: BIG})
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    async with served(passive) as url:
        first = await active.sync(url, tenant=ALICE.did)
        assert first.pull is not None and first.pull.attachments_fetched == 2
        assert first.pull.bytes_received > 2 * BIG
        assert_same(a, b, ALICE)

        # Two more big records; the source's copy of one of them is damaged on disk.
        more = write_notes(a, ALICE, 2, clock=Clock("2031-01-01T00:00:00.000000Z"), sizes={0: BIG, 1: BIG})
        good = a.read_data(a.conn.execute("SELECT bytes FROM data WHERE record_id=?", (more[0],)).fetchone()[0])
        bad = _damaged(good, damage)
        with a.transaction():
            a.conn.execute("UPDATE data SET bytes=?, size=? WHERE record_id=?", (bad, len(bad), more[0]))
        second = await active.sync(url, tenant=ALICE.did)
        assert second.pull is not None
        assert second.pull.results.get("AttachmentInvalid") == 1
        assert second.pull.results.get("Applied") == 1
        assert b.conn.execute("SELECT count(*) FROM data WHERE record_id=?", (more[0],)).fetchone()[0] == 0
        key = active.ledger.links()[0].key
        pull, _ = active.ledger.get_checkpoint(key, Direction.PULL)
        assert [t.position for t in pull.unapplied_tokens] != []  # held at the frontier, not skipped

        # Repaired at the source: the next round fetches it.
        with a.transaction():
            a.conn.execute("UPDATE data SET bytes=?, size=? WHERE record_id=?", (good, len(good), more[0]))
        third = await active.sync(url, tenant=ALICE.did)
    assert third.pull is not None and third.pull.results.get("Applied") == 1
    assert_same(a, b, ALICE)
    del ids


@pytest.mark.parametrize("damage", ["truncated", "mismatched", "missing"])
async def test_a_damaged_data_file_is_refused_by_its_source(tmp_path: Path, damage: str) -> None:
    """A data file that is short, altered or gone is never served: the source refuses the
    `getAttachment` with a typed error, the record is held at the frontier, and fetched once
    the file is whole again."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    ids = write_notes(a, ALICE, 2, clock=Clock(), sizes={1: BIG})
    reference = a.conn.execute("SELECT bytes FROM data WHERE record_id=?", (ids[1],)).fetchone()[0]
    assert isinstance(reference, str)  # kept as a file
    path = a.blobs.path(reference.partition(":")[0])
    good = path.read_bytes()
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(_damaged(good, damage))
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    async with served(passive) as url:
        first = await active.sync(url, tenant=ALICE.did)
        assert first.pull is not None
        assert first.pull.results.get("Applied") == 1, first.pull.results
        assert b.conn.execute("SELECT count(*) FROM data").fetchone()[0] == 0
        key = active.ledger.links()[0].key
        pull, _ = active.ledger.get_checkpoint(key, Direction.PULL)
        assert [t.position for t in pull.unapplied_tokens] != []  # held at the frontier, not skipped

        path.write_bytes(good)
        second = await active.sync(url, tenant=ALICE.did)
    assert second.pull is not None and second.pull.results.get("Applied") == 1
    assert_same(a, b, ALICE)


SHARED = "https://p2psync.example/protocols/shared"


def _shared_protocol(store_: object, clock: Clock) -> list[str]:
    """Install a small protocol in alice's DWN and write three records under it."""
    from p2psync.dwn.engine import Dwn
    from p2psync.dwn.protocols import ProtocolsConfigure
    from p2psync.dwn.records_write import RecordsWrite
    from p2psync.dwn.store import Store

    assert isinstance(store_, Store)
    dwn = Dwn(store_)
    definition = {"protocol": SHARED, "published": True, "types": {"doc": {}}, "structure": {"doc": {}}}
    configure = ProtocolsConfigure.create(definition=definition, signer=ALICE, message_timestamp=clock.tick())
    assert dwn.process_message(ALICE.did, configure.message).code == 202
    ids = []
    for i in range(3):
        now = clock.tick()
        data = f"doc {i}".encode()
        write = RecordsWrite.create(signer=ALICE, data=data, protocol=SHARED, protocol_path="doc",
                                    data_format="text/plain", message_timestamp=now, date_created=now)
        reply = dwn.process_message(ALICE.did, write.message, data)
        assert reply.code == 202, reply.detail
        ids.append(str(write.message["recordId"]))
    return ids


async def test_grantee_reads_what_the_grant_allows(tmp_path: Path) -> None:
    from p2psync.dwn.engine import Dwn
    from p2psync.state.authz import sync_grant_messages

    a = new_store(tmp_path, "a")
    clock = Clock("2024-01-01T00:00:00.000000Z")  # in the past: grants dated now cover the reads
    write_notes(a, ALICE, 4, clock=clock)
    shared_ids = _shared_protocol(a, clock)
    bob, carol = seeded("bob-node"), seeded("carol-node")
    for grantee, protocol in ((bob, None), (carol, SHARED)):
        for message, data in sync_grant_messages(ALICE, grantee.did, protocol=protocol):
            assert Dwn(a).process_message(ALICE.did, message, data).code == 202
    bob_store, carol_store = new_store(tmp_path, "bob"), new_store(tmp_path, "carol")
    async with served(Peer(a, ALICE)) as url:
        # Bob's grant is unscoped: he replicates alice's whole DWN.
        await Peer(bob_store, bob).sync(url, tenant=ALICE.did)
        assert_same(a, bob_store, ALICE)
        # Carol's grant covers one protocol: the global scope is refused, the protocol's is served.
        with pytest.raises(PeerError) as err:
            await Peer(carol_store, carol).sync(url, tenant=ALICE.did)
        assert (err.value.code, err.value.name) == (403, "SyncNotAuthorized")
        summary = await Peer(carol_store, carol).sync(url, tenant=ALICE.did, scope=SyncScope.for_protocol(SHARED))
    # The docs, the configure and the scope's permission records she may read: her own two
    # grants. Bob's (of no protocol, so in every protocol's listing) are offered, not readable.
    assert summary.pull is not None and summary.pull.results.get("Applied") == 3 + 1 + 2
    assert summary.pull.items_offered == 3 + 1 + 2 + 2
    held = [carol_store.messages.get(ALICE.did, c) for c in carol_store.messages.cids(ALICE.did)]
    got = {m.get("recordId") for m in held if m is not None}
    assert set(shared_ids) <= got
    grants = [m for m in held if m is not None and m["descriptor"].get("protocolPath") == "grant"]
    assert len(grants) == 2 and {m["descriptor"]["recipient"] for m in grants} == {carol.did}
    assert len(carol_store.messages.cids(ALICE.did)) == 6  # no notes, no grants of bob's


async def test_a_scoped_pull_lists_deletes_by_their_records_protocol(tmp_path: Path) -> None:
    """A RecordsDelete names no protocol: the source decides its scope by the stored indexes,
    which carry its record's (a scoped pull of a log holding one used to fail)."""
    from p2psync.dwn.engine import Dwn
    from p2psync.dwn.records import create_records_delete

    a = new_store(tmp_path, "a")
    clock = Clock("2024-01-01T00:00:00.000000Z")
    notes = write_notes(a, ALICE, 2, clock=clock)
    docs = _shared_protocol(a, clock)
    for record_id in (notes[0], docs[0]):
        delete = create_records_delete(record_id=record_id, signer=ALICE, message_timestamp=clock.tick())
        assert Dwn(a).process_message(ALICE.did, delete).code == 202
    b = new_store(tmp_path, "b")
    with trio.fail_after(60):  # without the fix the source's listing failed and the pull hung
        async with served(Peer(a, ALICE)) as url:
            summary = await Peer(b, ALICE).sync(url, tenant=ALICE.did, scope=SyncScope.for_protocol(SHARED))
    assert summary.pull is not None and summary.pull.results == {"Applied": 1 + 3 + 1}  # configure, docs, delete
    held = [b.messages.get(ALICE.did, c) for c in b.messages.cids(ALICE.did)]
    deletes = [m["descriptor"]["recordId"] for m in held if m is not None and m["descriptor"]["method"] == "Delete"]
    assert deletes == [docs[0]]  # the note's delete is out of scope


async def test_grants_travel_in_get_collections_and_push_can_be_refused(tmp_path: Path) -> None:
    """A grantee brings its grant to a node of the tenant that has never seen it (§4.1)."""
    from p2psync.state.authz import sync_grant_messages

    a = new_store(tmp_path, "a")  # alice's node: records, but no grants
    write_notes(a, ALICE, 3, clock=Clock("2024-01-01T00:00:00.000000Z"))
    bob = seeded("bob-node")
    grants = [{"message": m, "data": d} for m, d in sync_grant_messages(ALICE, bob.did)]
    bob_store = new_store(tmp_path, "bob")
    async with served(Peer(a, ALICE, accept_push=False)) as url:
        with pytest.raises(PeerError) as err:
            await Peer(bob_store, bob).sync(url, tenant=ALICE.did)
        assert err.value.code == 403
        summary = await Peer(bob_store, bob).sync(url, tenant=ALICE.did, grants=grants)
        assert summary.pull is not None and summary.pull.results.get("Applied", 0) >= 3
        # This node takes no pushes, even from the tenant itself.
        other = new_store(tmp_path, "alice2")
        write_notes(other, ALICE, 1, clock=Clock("2025-01-01T00:00:00.000000Z"), prefix="pushed")
        with pytest.raises(PeerError) as refused:
            await Peer(other, ALICE).sync(url, tenant=ALICE.did, direction="push")
        assert (refused.value.code, refused.value.name) == (403, "PushRefused")
    assert len(a.messages.cids(ALICE.did)) == 3 + 2  # the notes and the two grants, not the push


@pytest.mark.parametrize("direction", ["pull", "push"])
async def test_data_above_the_sinks_limit_is_skipped_counted_and_never_fetched(
    tmp_path: Path, direction: str
) -> None:
    """§6.2: an item whose data is above the sink's limit is answered 413: settled (the feed
    moves on), never fetched, and recorded: ``DataTooLarge`` in the results of the side that
    counts the direction."""
    holder, empty = new_store(tmp_path, "holder"), new_store(tmp_path, "empty")
    ids = write_notes(holder, ALICE, 5, clock=Clock(), sizes={2: 50_000})
    limit = 40_000
    if direction == "pull":
        sink_peer, source_peer = Peer(empty, ALICE, max_data=limit), Peer(holder, ALICE)
        async with served(source_peer) as url:
            summary = await sink_peer.sync(url, tenant=ALICE.did, direction="pull")
        stats = summary.pull
        assert stats is not None and stats.results.get("DataTooLarge") == 1
        assert stats.attachments_fetched == 0
        key = sink_peer.ledger.links(ALICE.did)[0].key
        frontier = sink_peer.ledger.get_checkpoint(key, Direction.PULL)[0].contiguous_applied_token
        assert frontier is not None and frontier.position == holder.events.read(ALICE.did, after=-1)[-1][0]
    else:
        async with served(Peer(empty, ALICE, max_data=limit)) as url:
            summary = await Peer(holder, ALICE).sync(url, tenant=ALICE.did, direction="push")
        stats = summary.push
        assert stats is not None and stats.items_skipped == 1
    big_record = ids[2]
    held = {m["recordId"] for m in empty.messages.query(ALICE.did, [{"interface": "Records"}])[0]}
    assert held == set(ids) - {big_record}
