"""The order-dependent outcomes docs/replication-apply.md documents, one deterministic test each.

Under 0.5.2's rules a message is judged against the current state of what it depends on, so
for these cases the order in which a replica receives two messages decides the outcome. Each
test applies the pair in the order the author wrote them (accepted) and in the other order
(the documented result).
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
from p2psync.dwn.replication_types import Incomplete, Invalid, Role, Superseded
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import add_seconds
from p2psync.replication.closure import ClosureAdmitter
from p2psync.state.local import LocalApplier, LocalStoreFetcher
from tests.replication.support import CHAT, CHAT_DEFINITION, ChatWorld, Step, chat_world, process_all, snapshot


@pytest.fixture
def stores(tmp_path: Path) -> tuple[Dwn, Dwn]:
    return Dwn(Store(tmp_path / "in-order.db")), Dwn(Store(tmp_path / "reordered.db"))


def _apply(dwn: Dwn, w: ChatWorld, *steps: Step) -> list[Any]:
    return [dwn.apply_replicated_message(w.tenant, s.message, s.data) for s in steps]


def _code(result: Any) -> str:
    assert isinstance(result, Invalid), result
    return result.reason.split(":")[0]


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
    # the delete first: the thread is no longer live, and 0.5.2 takes no child under it
    _apply(reordered, w, *common, delete)
    assert _code(reordered.apply_replicated_message(w.tenant, s["chat"].message, s["chat"].data)) == (
        "ProtocolAuthorizationIncorrectProtocolPath"
    )


async def test_child_of_a_deleted_record_cannot_come_from_the_sources_log(tmp_path: Path) -> None:
    """After the delete the source keeps the parent's initial write without its data: a
    replica built from what the source holds never sees the parent live."""
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
    outcome = await ClosureAdmitter(w.tenant, s["chat"].entry).admit(LocalApplier(replica), fetcher)
    assert outcome.status == "deferred"
    assert outcome.detail is not None and outcome.detail.startswith(f"{s['chat'].cid}: no progress: Parent(")
    after_delete = await ClosureAdmitter(w.tenant, delete.entry).admit(LocalApplier(replica), fetcher)
    assert after_delete.status == "admitted"
    retry = await ClosureAdmitter(w.tenant, s["chat"].entry).admit(LocalApplier(replica), fetcher)
    assert (retry.status, retry.failure) == ("failed", "invalid")


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
    # the new role record first: carol still holds the role (the old record is live here)
    _apply(reordered, w, *common, s["participant"])
    result = reordered.apply_replicated_message(w.tenant, again.message, b"again")
    assert _code(result) == "ProtocolAuthorizationDuplicateRoleRecipient"


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
    ctx = s["thread"].message["recordId"]
    role = Role(protocol=CHAT, protocol_path="thread/participant", recipient=w.carol.did, context_prefix=ctx)
    assert replica.apply_replicated_message(w.tenant, s["chat"].message, s["chat"].data) == Incomplete((role,))
    # the source no longer has a live role record to answer with: deferred, never applied
    outcome = await ClosureAdmitter(w.tenant, s["chat"].entry).admit(
        LocalApplier(replica), LocalStoreFetcher(source.store)
    )
    assert outcome.status == "deferred" and "unresolved Role" in (outcome.detail or "")


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
    # v2 first: v2's rules judge the note (no rule lets anyone but the tenant create one)
    assert _apply(reordered, w, s["protocol"], v2)[1].kind == "Applied"
    assert _code(reordered.apply_replicated_message(w.tenant, s["note"].message, s["note"].data)) == (
        "ProtocolAuthorizationActionRulesNotFound"
    )


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
    assert _code(reordered.apply_replicated_message(w.tenant, note.message, b"n")) == "GrantAuthorizationGrantMissing"


def test_concurrent_write_and_delete_leave_replicas_disagreeing(stores: tuple[Dwn, Dwn]) -> None:
    """A deletes the note; B updates it later without seeing the delete. Each side keeps its own."""
    w = chat_world()
    s = w.steps
    a, b = stores
    _apply(a, w, s["protocol"], s["note"], s["note-delete"])
    later = RecordsWrite.create_from(s["note"].message, signer=w.bob, data=b"later", message_timestamp=w.clock.tick())
    _apply(b, w, s["protocol"], s["note"])
    assert b.apply_replicated_message(w.tenant, later.message, b"later").kind == "Applied"
    # exchange: each answers Superseded; A keeps the write (not latest), B refuses the older delete
    assert a.apply_replicated_message(w.tenant, later.message, b"later") == Superseded()
    assert b.apply_replicated_message(w.tenant, s["note-delete"].message) == Superseded()
    rid = s["note"].message["recordId"]
    read_a = a.process_message(w.tenant, create_records_read(signer=w.alice, filter={"recordId": rid}))
    read_b = b.process_message(w.tenant, create_records_read(signer=w.alice, filter={"recordId": rid}))
    assert (read_a.code, read_b.code, read_b.data) == (404, 200, b"later")
    assert snapshot(a.store, w.tenant) != snapshot(b.store, w.tenant)


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
    # the record is already deleted here (by the newer prune): the reference's 404 stands
    assert reordered.apply_replicated_message(w.tenant, s["note-delete"].message) == Invalid("Not Found")
    # and both stores hold the same thing
    assert snapshot(in_order.store, w.tenant) == snapshot(reordered.store, w.tenant)
