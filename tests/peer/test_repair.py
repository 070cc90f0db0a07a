"""``Peer.fetch_messages``: a repair by CID over getDependencies, between real stores on loopback.

Each replica is made by the engine from steps of one chat story (tests/replication/support.py)
plus a record whose data is larger than the 30,000-byte inline limit; the source is a real
``Peer`` serving on 127.0.0.1 port 0.
"""

from __future__ import annotations

import copy
from pathlib import Path

from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from p2psync.peer.repair import CHECKPOINT_ID_PREFIX, RepairProgress
from p2psync.replication.scope import SyncScope
from p2psync.state.authz import sync_grant_messages
from p2psync.state.digest import store_digest
from tests.peer.support import served
from tests.replication.support import CHAT, ChatWorld, Step, chat_world, process_all, seeded

BIG = 45_000  # above the 30,000-byte inline limit: the data travels by getAttachment


def story() -> tuple[ChatWorld, list[Step]]:
    """The chat story, with a big record after the thread, in processing order."""
    w = chat_world()
    steps = w.ordered()
    w.write("big", w.bob, "note", bytes(range(256)) * (BIG // 256) + b"x" * (BIG % 256))
    return w, steps + [w.steps["big"]]


def build(path: Path, steps: list[Step], tenant: str) -> Store:
    store = Store(path)
    process_all(Dwn(store), tenant, steps)
    return store


def named(w: ChatWorld, *names: str) -> list[Step]:
    return [w.steps[n] for n in names]


async def test_repair_fetches_closures_and_attachments(tmp_path: Path) -> None:
    """Children asked for before their parents bring the parents along; the big record's data
    comes by getAttachment; afterwards the replica equals the source, and a second run stores
    nothing and asks the peer for nothing."""
    w, steps = story()
    source = build(tmp_path / "source.db", steps, w.tenant)
    replica = build(tmp_path / "replica.db", named(w, "protocol", "thread"), w.tenant)
    lacking = [c for c in source.messages.cids(w.tenant) if not replica.messages.has(w.tenant, c)]
    by_cid = {s.cid: s.name for s in steps}
    # Reverse story order: each reply comes before the message it replies to.
    wanted = sorted(lacking, key=lambda c: [s.cid for s in steps].index(c), reverse=True)
    assert by_cid[wanted[0]] == "big" and by_cid[wanted[1]] == "note-delete"
    reports: list[RepairProgress] = []
    async with served(Peer(source, w.alice)) as url:
        summary = await Peer(replica, w.alice).fetch_messages(url, tenant=w.tenant, cids=wanted,
                                                              on_progress=reports.append)
        assert store_digest(replica, w.tenant) == store_digest(source, w.tenant)
        assert summary.ok and summary.counts() == {"applied": len(wanted)}
        outcomes = {by_cid[o.cid]: o for o in summary.outcomes}
        # The reaction came first and needed its parent chat, which needed carol's role record.
        assert {by_cid[c] for c in outcomes["reaction"].dependencies} == {"chat", "participant"}
        # The delete came before the record's initial write, fetched for it.
        assert {by_cid[c] for c in outcomes["note-delete"].dependencies} == {"note"}
        assert outcomes["chat"].dependencies == ()  # already brought by the reaction
        assert summary.stored == len(wanted)
        assert summary.stats.dependencies_fetched >= 3
        assert summary.stats.attachments_fetched == 1
        big = w.steps["big"].message
        assert replica.data.get(w.tenant, big["recordId"], big["descriptor"]["dataCid"]) == w.steps["big"].data
        assert [r.done for r in reports] == list(range(1, len(wanted) + 1))
        # Twice: everything is present, and no request goes out.
        again = await Peer(replica, w.alice).fetch_messages(url, tenant=w.tenant, cids=wanted)
    assert again.counts() == {"present": len(wanted)} and again.stored == 0
    assert again.stats.bytes_received == 0 and again.stats.dependencies_fetched == 0
    # A repair leaves no ledger link and no checkpoint copy behind (it is not a sync).
    assert Peer(replica, w.alice).ledger.links() == []
    copies = [str(c) for (c,) in source.conn.execute("SELECT checkpoint_id FROM peer_checkpoint_copies")]
    assert not [c for c in copies if c.startswith(CHECKPOINT_ID_PREFIX)]


async def test_every_outcome_and_nothing_unverified_is_stored(tmp_path: Path) -> None:
    """superseded, not found, a forged message, tampered data, present: each reported, and the
    replica's store is left exactly as it was."""
    w, steps = story()
    # The source never saw the delete: it still holds the note's update.
    source = build(tmp_path / "source.db", [s for s in steps if s.name != "note-delete"], w.tenant)
    replica = build(tmp_path / "replica.db", named(w, "protocol", "thread", "note", "note-delete"), w.tenant)
    # Tamper with the big record's data at the source (same size, other bytes).
    big = w.steps["big"].message
    record_id, data_cid = big["recordId"], big["descriptor"]["dataCid"]
    with source.transaction():
        source.data.put(w.tenant, record_id, data_cid, b"\0" * BIG)
    # A forged message behind the source engine's back: the thread with a changed descriptor,
    # under its original signature.
    thread = w.steps["thread"].message
    forged = copy.deepcopy(thread)
    forged["descriptor"]["dataFormat"] = "text/forged"
    forged_cid = Step("forged", forged).cid
    with source.transaction():
        source.messages.put(w.tenant, forged, source.messages.get_indexes(w.tenant, w.steps["thread"].cid) or {})
    # A message nobody holds.
    now = w.clock.tick()
    unknown = RecordsWrite.create(signer=w.bob, data=b"never sent", protocol=CHAT, protocol_path="note",
                                  message_timestamp=now, date_created=now)
    unknown_cid = Step("unknown", unknown.message).cid
    before = store_digest(replica)
    wanted = [w.steps["note-update"].cid, unknown_cid, forged_cid, w.steps["big"].cid, w.steps["thread"].cid]
    async with served(Peer(source, w.alice)) as url:
        summary = await Peer(replica, w.alice).fetch_messages(url, tenant=w.tenant, cids=wanted)
    assert [o.cid for o in summary.outcomes] == wanted  # reported in the order asked
    got = {o.cid: (o.status, o.code) for o in summary.outcomes}
    assert got[w.steps["note-update"].cid] == ("superseded", None)
    assert got[unknown_cid] == ("not_found", "MessageNotFound")
    status, code = got[forged_cid]
    assert status == "refused" and code not in (None, "Invalid")  # the engine's own code
    assert got[w.steps["big"].cid] == ("refused", "AttachmentInvalid")
    assert got[w.steps["thread"].cid] == ("present", None)
    assert not summary.ok
    assert summary.reasons() == {"not_found MessageNotFound": 1, f"refused {code}": 1, "refused AttachmentInvalid": 1}
    assert store_digest(replica) == before
    assert replica.data.get(w.tenant, record_id, data_cid) is None


async def test_a_peer_without_read_rights_gets_nothing(tmp_path: Path) -> None:
    """No grant: getDependencies answers 403 and every CID is withheld. A protocol-scoped grant:
    the protocol's messages come, another message is marked withheld by the source."""
    w, steps = story()
    source = build(tmp_path / "source.db", steps, w.tenant)
    plain_now = w.clock.tick()
    plain = RecordsWrite.create(signer=w.alice, data=b"private", data_format="text/plain",
                                schema="https://p2psync.example/private", message_timestamp=plain_now,
                                date_created=plain_now)
    process_all(Dwn(source), w.tenant, [Step("plain", plain.message, b"private")])
    plain_cid = Step("plain", plain.message).cid
    dave = seeded("dave-node")
    for message, data in sync_grant_messages(w.alice, dave.did, protocol=CHAT):
        assert Dwn(source).process_message(w.tenant, message, data).code == 202
    replica = build(tmp_path / "replica.db", named(w, "protocol", "thread"), w.tenant)
    before = store_digest(replica)
    wanted = [w.steps["participant"].cid, w.steps["note"].cid, plain_cid]
    async with served(Peer(source, w.alice)) as url:
        stranger = await Peer(replica, seeded("mallory-node")).fetch_messages(url, tenant=w.tenant, cids=wanted)
        assert [(o.status, o.code) for o in stranger.outcomes] == [("withheld", "SyncNotAuthorized")] * 3
        assert store_digest(replica) == before
        granted = await Peer(replica, dave).fetch_messages(url, tenant=w.tenant, cids=wanted,
                                                           scope=SyncScope.for_protocol(CHAT))
    got = {o.cid: (o.status, o.code) for o in granted.outcomes}
    assert got == {w.steps["participant"].cid: ("applied", None), w.steps["note"].cid: ("applied", None),
                   plain_cid: ("withheld", "ReadNotAllowed")}
    assert not replica.messages.has(w.tenant, plain_cid)
