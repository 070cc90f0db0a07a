"""The cases where 0.5.2's answer depends on arrival order, and the one state each must reach.

0.5.2 judges a message against the current state of what it depends on, so for these cases
the order in which a replica receives the messages decides the reference's answer. The
convergence contract (docs/replication-apply.md) makes the state a function of the set:
what the reference holds after processing it in canonical order (messageTimestamp, then
CID). Each test applies the messages in the authored (canonical) order and in the order that
used to diverge, and checks both stores end identical, with the canonical outcome.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn import permissions
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_delete, create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.replication_types import Superseded
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import add_seconds
from p2psync.replication.closure import ClosureAdmitter
from p2psync.state.local import LocalApplier, LocalStoreFetcher
from tests.replication.support import (
    CHAT,
    CHAT_DEFINITION,
    ChatWorld,
    Step,
    chat_world,
    process_all,
    seeded,
    snapshot,
    undo_schema_7,
)


@pytest.fixture
def stores(tmp_path: Path) -> tuple[Dwn, Dwn]:
    return Dwn(Store(tmp_path / "in-order.db")), Dwn(Store(tmp_path / "reordered.db"))


def _apply(dwn: Dwn, w: ChatWorld, *steps: Step) -> list[Any]:
    return [dwn.apply_replicated_message(w.tenant, s.message, s.data) for s in steps]


def _same(a: Dwn, b: Dwn, tenant: str) -> None:
    assert snapshot(a.store, tenant) == snapshot(b.store, tenant)


def _read(dwn: Dwn, w: ChatWorld, step: Step) -> int:
    rid = step.message["recordId"]
    return dwn.process_message(w.tenant, create_records_read(signer=w.alice, filter={"recordId": rid})).code


def test_child_of_a_record_deleted_later(stores: tuple[Dwn, Dwn]) -> None:
    w = chat_world()
    s = w.steps
    delete = w.add(
        "thread-delete",
        create_records_delete(
            record_id=s["thread"].message["recordId"], signer=w.alice, message_timestamp=w.clock.tick()
        ),
    )
    in_order, reordered = stores
    common = (s["protocol"], s["thread"], s["participant"])
    assert [r.kind for r in _apply(in_order, w, *common, s["chat"], delete)] == ["Applied"] * 5
    # the delete first: the chat sorts before it, so it is judged with the thread live
    _apply(reordered, w, *common, delete)
    assert reordered.apply_replicated_message(w.tenant, s["chat"].message, s["chat"].data).kind == "Applied"
    _same(in_order, reordered, w.tenant)


async def test_child_of_a_deleted_record_comes_from_the_sources_log(tmp_path: Path) -> None:
    """After the delete the source keeps the parent's initial write without its data. The
    replica archives it that way and, since a later message of the record is here, treats it
    as the record's state until then (data withheld): the child written in between is judged
    with its parent live, as its author's device judged it."""
    w = chat_world()
    s = w.steps
    delete = w.add(
        "thread-delete",
        create_records_delete(
            record_id=s["thread"].message["recordId"], signer=w.alice, message_timestamp=w.clock.tick()
        ),
    )
    source = Dwn(Store(tmp_path / "source.db"))
    process_all(source, w.tenant, w.ordered())
    replica = Dwn(Store(tmp_path / "replica.db"))
    fetcher = LocalStoreFetcher(source.store)
    after_delete = await ClosureAdmitter(w.tenant, delete.entry).admit(LocalApplier(replica), fetcher)
    assert after_delete.status == "admitted"
    chat = await ClosureAdmitter(w.tenant, s["chat"].entry).admit(LocalApplier(replica), fetcher)
    assert chat.status == "admitted"
    assert replica.store.messages.has(w.tenant, s["chat"].cid)
    _apply(replica, w, *w.ordered())  # the rest of the set, in the source's order
    _same(source, replica, w.tenant)


def test_role_record_replacing_a_deleted_one(stores: tuple[Dwn, Dwn]) -> None:
    w = chat_world()
    s = w.steps
    ctx = s["thread"].message["contextId"]
    remove = w.add(
        "participant-delete",
        create_records_delete(
            record_id=s["participant"].message["recordId"], signer=w.alice, message_timestamp=w.clock.tick()
        ),
    )
    again = w.write(
        "participant-again", w.bob, "thread/participant", b"again", recipient=w.carol.did, parent_context_id=ctx
    )
    in_order, reordered = stores
    common = (s["protocol"], s["thread"])
    assert [r.kind for r in _apply(in_order, w, *common, s["participant"], remove, w.steps["participant-again"])] == [
        "Applied"
    ] * 5
    # the new role record before the old one's delete: it sorts after the delete, so it is
    # judged once carol no longer holds the role
    _apply(reordered, w, *common, s["participant"])
    assert reordered.apply_replicated_message(w.tenant, again.message, b"again") == Superseded()
    assert reordered.apply_replicated_message(w.tenant, remove.message).kind == "Applied"
    _same(in_order, reordered, w.tenant)
    assert reordered.store.messages.has(w.tenant, w.steps["participant-again"].cid)


async def test_message_authorized_by_a_role_removed_later(tmp_path: Path) -> None:
    w = chat_world()
    s = w.steps
    remove = w.add(
        "participant-delete",
        create_records_delete(
            record_id=s["participant"].message["recordId"], signer=w.alice, message_timestamp=w.clock.tick()
        ),
    )
    source = Dwn(Store(tmp_path / "source.db"))
    process_all(source, w.tenant, w.ordered())
    replica = Dwn(Store(tmp_path / "replica.db"))
    _apply(replica, w, s["protocol"], s["thread"], s["participant"], remove)
    # the chat sorts before the role's delete: judged while carol held the role
    assert replica.apply_replicated_message(w.tenant, s["chat"].message, s["chat"].data).kind == "Applied"
    _apply(replica, w, *w.ordered())  # the rest of the set
    _same(source, replica, w.tenant)


def test_record_written_under_an_earlier_protocol_definition(stores: tuple[Dwn, Dwn]) -> None:
    w = chat_world()
    s = w.steps
    strict = {**CHAT_DEFINITION, "structure": {**CHAT_DEFINITION["structure"], "note": {}}}
    v2 = w.add(
        "protocol-v2",
        ProtocolsConfigure.create(definition=strict, signer=w.alice, message_timestamp=w.clock.tick()).message,
    )
    in_order, reordered = stores
    assert [r.kind for r in _apply(in_order, w, s["protocol"], s["note"], v2)] == ["Applied"] * 3
    # v2 first: the note sorts before v2, so v1's rules judge it
    assert _apply(reordered, w, s["protocol"], v2)[1].kind == "Applied"
    assert reordered.apply_replicated_message(w.tenant, s["note"].message, s["note"].data).kind == "Applied"
    _same(in_order, reordered, w.tenant)


def test_write_under_a_grant_deleted_later(stores: tuple[Dwn, Dwn]) -> None:
    w = chat_world()
    w.add("protocol", w.steps["protocol"].message)
    granted = w.clock.tick()
    grant, data = permissions.create_grant(
        signer=w.alice,
        granted_to=w.bob.did,
        date_granted=granted,
        date_expires=add_seconds(granted, 3600),
        scope={"interface": "Records", "method": "Write", "protocol": CHAT},
    )
    grant_step = w.add("grant", grant.message, data)
    now = w.clock.tick()
    note = RecordsWrite.create(
        signer=w.bob,
        data=b"n",
        protocol=CHAT,
        protocol_path="note",
        message_timestamp=now,
        date_created=now,
        permission_grant_id=grant.record_id,
    )
    note_step = w.add("granted-note", note.message, b"n")
    delete = w.add(
        "grant-delete",
        create_records_delete(record_id=grant.record_id, signer=w.alice, message_timestamp=w.clock.tick()),
    )
    in_order, reordered = stores
    assert [r.kind for r in _apply(in_order, w, w.steps["protocol"], grant_step, note_step, delete)] == ["Applied"] * 4
    _apply(reordered, w, w.steps["protocol"], grant_step, delete)
    # the note sorts before the grant's delete: judged while the grant existed
    assert reordered.apply_replicated_message(w.tenant, note.message, b"n").kind == "Applied"
    _same(in_order, reordered, w.tenant)


def test_concurrent_write_and_delete_end_deleted_on_both(stores: tuple[Dwn, Dwn]) -> None:
    """A deletes the note; B updates it later without seeing the delete. In canonical order
    the update comes after the delete, which the reference refuses: deleted on both."""
    w = chat_world()
    s = w.steps
    a, b = stores
    _apply(a, w, s["protocol"], s["note"], s["note-delete"])
    later = RecordsWrite.create_from(s["note"].message, signer=w.bob, data=b"later", message_timestamp=w.clock.tick())
    _apply(b, w, s["protocol"], s["note"])
    assert b.apply_replicated_message(w.tenant, later.message, b"later").kind == "Applied"
    # exchange: A keeps the update out; B takes the delete at its place, and its update,
    # processed again after it, is refused
    assert a.apply_replicated_message(w.tenant, later.message, b"later") == Superseded()
    assert b.apply_replicated_message(w.tenant, s["note-delete"].message).kind == "Applied"
    assert (_read(a, w, s["note"]), _read(b, w, s["note"])) == (404, 404)
    _same(a, b, w.tenant)
    # and B's log no longer lists the update, A's never did
    assert b.store.events.position_of(w.tenant, later.cid) is None


def test_an_update_before_a_delete_ends_deleted_whatever_the_order(stores: tuple[Dwn, Dwn]) -> None:
    """The other way round: B's update is older than A's delete; the delete wins on both."""
    w = chat_world()
    s = w.steps
    a, b = stores
    earlier = RecordsWrite.create_from(
        s["note"].message, signer=w.bob, data=b"earlier", message_timestamp=w.clock.tick()
    )
    delete = create_records_delete(
        record_id=s["note"].message["recordId"], signer=w.alice, message_timestamp=w.clock.tick()
    )
    _apply(a, w, s["protocol"], s["note"])
    assert a.apply_replicated_message(w.tenant, delete).kind == "Applied"
    _apply(b, w, s["protocol"], s["note"])
    assert b.apply_replicated_message(w.tenant, earlier.message, b"earlier").kind == "Applied"
    assert a.apply_replicated_message(w.tenant, earlier.message, b"earlier") == Superseded()
    assert b.apply_replicated_message(w.tenant, delete).kind == "Applied"
    _same(a, b, w.tenant)


def test_two_devices_delete_one_record(stores: tuple[Dwn, Dwn]) -> None:
    w = chat_world()
    s = w.steps
    a, b = stores
    rid = s["note"].message["recordId"]
    first = create_records_delete(record_id=rid, signer=w.alice, message_timestamp=w.clock.tick())
    second = create_records_delete(record_id=rid, signer=w.alice, message_timestamp=w.clock.tick())
    _apply(a, w, s["protocol"], s["note"])
    _apply(b, w, s["protocol"], s["note"])
    assert a.apply_replicated_message(w.tenant, first).kind == "Applied"
    assert b.apply_replicated_message(w.tenant, second).kind == "Applied"
    # the older delete wins; the newer one is a delete of a deleted record (404), kept out
    assert a.apply_replicated_message(w.tenant, second) == Superseded()
    assert b.apply_replicated_message(w.tenant, first).kind == "Applied"
    _same(a, b, w.tenant)


def test_delete_after_a_newer_delete(stores: tuple[Dwn, Dwn]) -> None:
    w = chat_world()
    s = w.steps
    prune = create_records_delete(
        record_id=s["note"].message["recordId"], signer=w.alice, prune=True, message_timestamp=w.clock.tick()
    )
    prune_step = w.add("note-prune", prune)
    in_order, reordered = stores
    assert [r.kind for r in _apply(in_order, w, s["protocol"], s["note"], s["note-delete"], prune_step)] == [
        "Applied"
    ] * 4
    _apply(reordered, w, s["protocol"], s["note"], prune_step)
    # the older delete sorts first: it is taken, and the prune after it
    assert reordered.apply_replicated_message(w.tenant, s["note-delete"].message).kind in ("Applied", "Superseded")
    _same(in_order, reordered, w.tenant)


def test_a_store_from_before_the_archive_is_archived_and_rebuilt(tmp_path: Path) -> None:
    """A schema-1 store (no archive): opening it archives its messages and rebuilds the state
    from them in canonical order, which is the state it had."""
    w = chat_world()
    path = tmp_path / "old.db"
    old = Dwn(Store(path))
    process_all(old, w.tenant, w.ordered())
    before = snapshot(old.store, w.tenant)
    undo_schema_7(old.store.conn)  # first: dropping a column checks the triggers still there
    old.store.conn.execute("DROP TABLE archive")
    old.store.conn.execute("DROP TABLE archive_keys")
    # nor the set journal and digests of schema 3 (its triggers go with the messages table)
    old.store.conn.execute("DROP TABLE set_journal")
    old.store.conn.execute("DROP TABLE set_digests")
    old.store.conn.execute("DELETE FROM meta WHERE key LIKE 'set_journal_%'")
    old.store.conn.execute("PRAGMA user_version=1")
    old.close()
    reopened = Dwn(Store(path))
    assert reopened.history.count(w.tenant) == len(before.messages)
    assert snapshot(reopened.store, w.tenant) == before
    # processing the whole archive again changes nothing
    assert reopened.history.rebuild(w.tenant) == len(before.messages)
    assert snapshot(reopened.store, w.tenant) == before


def test_verify_replays_the_archive_and_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`History.verify` (and `p2psync store verify`): the state of a store is the canonical
    state of its archive; a store edited behind the engine's back is reported, not repaired."""
    from p2psync.cli import main as p2psync

    w = chat_world()
    path = tmp_path / "store.db"
    dwn = Dwn(Store(path))
    process_all(dwn, w.tenant, w.ordered())
    before = snapshot(dwn.store, w.tenant)
    assert dwn.history.verify(w.tenant) == {"missing": [], "extra": [], "changed": [], "data": []}
    assert snapshot(dwn.store, w.tenant) == before
    dwn.close()
    assert p2psync(["store", "verify", "--store", str(path)]) == 0
    assert "the state is the canonical state of its archive" in capsys.readouterr().out

    broken = Dwn(Store(path))
    broken.store.messages.delete(w.tenant, w.steps["thread"].cid)  # behind the engine's back
    after_edit = snapshot(broken.store, w.tenant)
    report = broken.history.verify(w.tenant)
    assert report["missing"] == [w.steps["thread"].cid] and not report["extra"]
    assert snapshot(broken.store, w.tenant) == after_edit  # verify leaves the store as it was
    broken.close()
    assert p2psync(["store", "verify", "--store", str(path), "--json"]) == 1
    assert w.steps["thread"].cid in capsys.readouterr().out


def test_an_initial_write_appended_in_order_is_undone_by_its_compact_undo(tmp_path: Path) -> None:
    """A pull in log order appends initial writes: each keeps the compact undo (its row's
    digest) instead of a session changeset. Undoing it gives back exactly the state before
    it; a row changed behind the engine's back is refused like a changeset conflict."""
    import apsw

    from p2psync.dwn.canonical import _INSERTED_ROW

    w = chat_world()
    dwn = Dwn(Store(tmp_path / "store.db"))
    assert {r.kind for r in _apply(dwn, w, *w.ordered())} == {"Applied"}
    tid = dwn.store._tid(w.tenant)
    undo = {str(cid): bytes(u) for cid, u in dwn.store.conn.execute(
        "SELECT cid, undo FROM archive WHERE tenant=?", (tid,))}
    compact = {name for name, step in w.steps.items() if undo[step.cid].startswith(_INSERTED_ROW)}
    # the records' initial writes; not the configure, the update or the delete
    assert compact == {"thread", "participant", "chat", "reaction", "note"}
    before = snapshot(dwn.store, w.tenant)

    # a warp over everything undoes every message, newest first, then processes it again
    # (scoped warps over such rows: the shuffled arrivals of test_order_independence.py)
    assert dwn.history.rebuild(w.tenant) == len(w.steps)
    assert snapshot(dwn.store, w.tenant) == before
    assert dwn.history.verify(w.tenant) == {"missing": [], "extra": [], "changed": [], "data": []}

    # a compact undo meeting a row that is not as stored is refused, and nothing changes
    fresh = Dwn(Store(tmp_path / "tampered.db"))
    _apply(fresh, w, *w.ordered())
    fresh.store.conn.execute(
        "UPDATE messages SET indexes=? WHERE cid=?", ('{"tampered":true}', w.steps["reaction"].cid)
    )
    tampered = snapshot(fresh.store, w.tenant)
    with pytest.raises(apsw.AbortError):
        fresh.history.rebuild(w.tenant)
    assert snapshot(fresh.store, w.tenant) == tampered


def test_an_initial_write_authored_last_keeps_the_compact_undo(tmp_path: Path) -> None:
    """A local write that sorts last takes the same checked compact undo as a replicated one
    (issue #17): the authored history undoes and replays to the very state, which is the
    state a replica that pulled the same messages in order holds."""
    from p2psync.dwn.canonical import _INSERTED_ROW

    w = chat_world()
    authored, pulled = Dwn(Store(tmp_path / "authored.db")), Dwn(Store(tmp_path / "pulled.db"))
    assert {authored.process_message(w.tenant, s.message, s.data).code for s in w.ordered()} <= {202, 204}
    _apply(pulled, w, *w.ordered())
    tid = authored.store._tid(w.tenant)
    undo = {str(cid): bytes(u) for cid, u in authored.store.conn.execute(
        "SELECT cid, undo FROM archive WHERE tenant=?", (tid,))}
    compact = {name for name, step in w.steps.items() if undo[step.cid].startswith(_INSERTED_ROW)}
    assert compact == {"thread", "participant", "chat", "reaction", "note"}
    _same(authored, pulled, w.tenant)
    assert authored.history.rebuild(w.tenant) == len(w.steps)
    _same(authored, pulled, w.tenant)
    assert authored.history.verify(w.tenant) == {"missing": [], "extra": [], "changed": [], "data": []}


def _big(tag: str, size: int = 40_000) -> bytes:
    """Record data larger than the reference keeps inline (30,000 bytes): stored out of line."""
    head = f"{tag} ".encode()
    return (head * (size // len(head) + 1))[:size]


@pytest.mark.parametrize("restricts", [False, True], ids=["same-definition", "note-closed"])
def test_large_data_appended_then_updated_then_warped(tmp_path: Path, restricts: bool) -> None:
    """An initial write with out-of-line data appended in order keeps the compact undo that
    also deletes its data row; two updates then drop that row and the first update's. A
    protocol definition sorting before the write arrives late: the warp undoes the updates
    and the write, and the state, the data store and the archive's data are the canonical
    ones (those of the same messages applied in canonical order). ``note-closed``: the late
    definition lets no one but alice write notes, so the write and its updates are refused
    at their places and no data row may remain."""
    import apsw

    from p2psync.dwn.canonical import _INSERTED_ROW_AND_DATA, archived_data

    w = ChatWorld(seeded("alice"), seeded("bob", "jwk"), seeded("carol"))
    times = [w.clock.tick() for _ in range(5)]
    configure = w.add("protocol", ProtocolsConfigure.create(
        definition=CHAT_DEFINITION, signer=w.alice, message_timestamp=times[0]).message)
    definition = CHAT_DEFINITION
    if restricts:
        definition = {**CHAT_DEFINITION, "structure": {**CHAT_DEFINITION["structure"], "note": {}}}
    again = w.add("protocol-again", ProtocolsConfigure.create(
        definition=definition, signer=w.alice, message_timestamp=times[1]).message)
    note = RecordsWrite.create(signer=w.bob, data=_big("first"), protocol=CHAT, protocol_path="note",
                               message_timestamp=times[2], date_created=times[2])
    first = w.add("note", note.message, _big("first"))
    between = w.add("note-between", RecordsWrite.create_from(
        note.message, signer=w.bob, data=_big("between", 41_000), message_timestamp=times[3]).message,
        _big("between", 41_000))
    last = w.add("note-last", RecordsWrite.create_from(
        note.message, signer=w.bob, data=_big("last", 42_000), message_timestamp=times[4]).message,
        _big("last", 42_000))

    canonical = Dwn(Store(tmp_path / "canonical.db"))
    applied = [r.kind for r in _apply(canonical, w, *w.ordered())]
    # refused at their places under the closed definition: kept in the archive, not stored
    assert applied == ["Applied"] * 2 + (["Superseded"] * 3 if restricts else ["Applied"] * 3)
    late = Dwn(Store(tmp_path / "late.db"))
    assert [r.kind for r in _apply(late, w, configure, first)] == ["Applied"] * 2
    tid = late.store._tid(w.tenant)
    undo = bytes(late.store.scalar("SELECT undo FROM archive WHERE cid=?", (first.cid,)))
    assert undo.startswith(_INSERTED_ROW_AND_DATA)  # no session: the write's own row and data row
    assert late.store.data.get(w.tenant, note.record_id, note.message["descriptor"]["dataCid"]) == _big("first")
    # the archive names the data row instead of keeping a second copy, and reads through it
    held = late.store.conn.execute("SELECT data, data_in FROM archive WHERE cid=?", (first.cid,)).fetchone()
    assert held == (None, note.message["descriptor"]["dataCid"])
    assert archived_data(late.store, w.tenant, first.cid) == (True, first.data)

    def usage_scanned(dwn: Dwn) -> tuple[int, int]:
        rows = dwn.store.conn.execute("SELECT cid, body FROM archive WHERE tenant=?", (tid,)).fetchall()
        kept = [archived_data(dwn.store, w.tenant, str(cid))[1] or b"" for cid, _ in rows]
        return len(rows), sum(len(str(body).encode()) + len(data) for (_, body), data in zip(rows, kept, strict=True))

    assert late.store.usage(w.tenant) == usage_scanned(late)

    # undone and processed again, it stores exactly what it stored the first time
    before = snapshot(late.store, w.tenant)
    assert late.history.rebuild(w.tenant) == 2
    assert snapshot(late.store, w.tenant) == before

    assert [r.kind for r in _apply(late, w, between, last)] == ["Applied"] * 2
    assert late.history.warps == 1  # the rebuild: the updates sorted last
    assert late.apply_replicated_message(w.tenant, again.message).kind == "Applied"
    assert late.history.warps == 2 and late.history.replayed >= 2 + 4
    assert snapshot(late.store, w.tenant) == snapshot(canonical.store, w.tenant)
    for dwn in (canonical, late):
        assert dwn.history.verify(w.tenant) == {"missing": [], "extra": [], "changed": [], "data": []}
        assert dwn.store.usage(w.tenant) == usage_scanned(dwn)
    # the updates dropped the write's data row: its bytes (their file's reference) moved into
    # its archive row
    held = late.store.conn.execute("SELECT data, data_in FROM archive WHERE cid=?", (first.cid,)).fetchone()
    assert held == (f"{note.message['descriptor']['dataCid']}:{len(first.data)}", None)
    assert late.store.read_data(held[0]) == first.data
    if restricts:
        # refused at its place: the write's data row went with its undo, none came back
        assert not snapshot(late.store, w.tenant).data
        assert not late.store.messages.has(w.tenant, first.cid)
        return
    # the state holds only the newest write's data; the archive still has every write's
    assert {size for _, _, size in snapshot(late.store, w.tenant).data} == {42_000}
    for dwn in (canonical, late):
        for step in (first, between, last):
            assert archived_data(dwn.store, w.tenant, step.cid) == (True, step.data)

    # a compact undo whose data row is gone (behind the engine's back) is refused like a
    # changeset conflict, and nothing changes
    alone = Dwn(Store(tmp_path / "alone.db"))
    _apply(alone, w, configure, first)
    alone.store.conn.execute("DELETE FROM data WHERE tenant=?", (alone.store._tid(w.tenant),))
    tampered = snapshot(alone.store, w.tenant)
    with pytest.raises(apsw.AbortError):
        alone.history.rebuild(w.tenant)
    assert snapshot(alone.store, w.tenant) == tampered
    assert tid == alone.store._tid(w.tenant)
