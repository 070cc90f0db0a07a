"""A re-configure that turns an existing path into a ``$role`` path, seen by a subset replica.

The source lists a subset's role records by the ``$role`` paths of the definition in force when
it lists them (replication-state.md, *Effective listing* rule 3). Records written at a path that
a later re-configure makes a role were listed under no rule: without more, the subset replica
never holds them, and a reader who cites such a role is let in on the full DWN and refused on
the replica. So when a configure of the scope's protocol is listed to a subset sink, held there
or not, the sink asks the source for the records at the role paths (a ``RoleRecords`` ref of
``getDependencies``, replication-profiles.md §10.2) and settles the configure's token only once
they are applied.

Real stores, two protocol objects pumped against each other (test_subset_sync.py's driver).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import apsw
import pytest

from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_delete, create_records_query, create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.replication import protocol
from p2psync.replication.checkpoint import Direction, LinkState
from p2psync.replication.effects import AnswerRefs
from p2psync.replication.hello import REVS, ROLE_RECORDS
from p2psync.replication.scope import RoleRecordsRef, SyncScope
from p2psync.replication.wire import PeerError
from p2psync.state.copies import store_id
from p2psync.state.local import LocalStoreFetcher
from p2psync.state.quota import Limit, QuotaPolicy, Quotas
from tests.replication.support import Clock, seeded
from tests.replication.test_protocol_pump import Side, Wire, run
from tests.replication.test_scenarios_over_the_wire import _side
from tests.replication.test_shuffle import _query_answers
from tests.replication.test_subset_sync import (
    Author,
    _peer_reads_as_tenant,  # noqa: F401  (autouse: the peer reads as alice)
    check_subset,
    connect,
    pull,
)

CLUB = "https://p2psync.example/subset/club"
Message = dict[str, Any]


def club(version: int) -> dict[str, Any]:
    """Threads with messages, and a ``member`` list beside them. Version 2 makes ``member`` a
    ``$role`` whose holders may read and query the messages."""
    message: dict[str, Any] = {}
    member: dict[str, Any] = {}
    if version == 2:
        member["$role"] = True
        message["$actions"] = [{"role": "member", "can": ["read", "query", "subscribe"]}]
    return {
        "protocol": CLUB, "published": False,
        "types": {name: {"dataFormats": ["text/plain"]} for name in ("thread", "message", "member")},
        "structure": {"member": member, "thread": {"message": message}},
    }


class Club:
    """A source store with version 1 of the club, members, a thread and its messages."""

    def __init__(self, path: Path) -> None:
        self.alice, self.carol, self.dave, self.erin = (seeded(f"club-{n}") for n in ("alice", "carol", "dave", "erin"))
        self.path = path
        self.author = Author(Dwn(Store(path)), self.alice)
        self.configure(1)
        # Written while `member` is no role: a subset of `thread` lists none of them.
        self.write("member", recipient=self.carol.did)
        gone = self.write("member", recipient=self.erin.did)
        self.author.process(create_records_delete(record_id=gone.record_id, signer=self.alice,
                                                  message_timestamp=self.author.clock.tick()))
        thread = self.write("thread")
        self.message = self.write("thread/message", parent=thread)
        self.author.dwn.close()

    def write(self, path: str, *, parent: RecordsWrite | None = None, recipient: str | None = None) -> RecordsWrite:
        clock = self.author.clock
        data = f"{path} {clock.now}".encode()
        ts = clock.tick()
        write = RecordsWrite.create(signer=self.alice, data=data, data_format="text/plain", protocol=CLUB,
                                    protocol_path=path, recipient=recipient, message_timestamp=ts, date_created=ts,
                                    parent_context_id=None if parent is None else parent.message["contextId"])
        self.author.process(write.message, data)
        return write

    def configure(self, version: int) -> Message:
        message = ProtocolsConfigure.create(definition=club(version), signer=self.alice,
                                            message_timestamp=self.author.clock.tick()).message
        return self.author.process(message)

    def become_roles(self) -> Message:
        """Version 2 on the source, and one more member written under it; the configure."""
        self.author.dwn = Dwn(Store(self.path))
        configure = self.configure(2)
        self.write("member", recipient=self.dave.did)
        self.author.dwn.close()
        return configure

    def reads(self) -> list[tuple[str, Message]]:
        """Readers citing the role (carol and dave hold it, erin's was deleted) and the owner."""
        ts = self.author.clock.tick()
        out: list[Message] = []
        for reader in (self.carol, self.dave, self.erin):
            out.append(create_records_read(signer=reader, filter={"recordId": self.message.record_id},
                                           protocol_role="member", message_timestamp=ts))
            out.append(create_records_query(signer=reader, filter={"protocol": CLUB, "protocolPath": "thread/message"},
                                            protocol_role="member", message_timestamp=ts))
        out.append(create_records_query(signer=self.alice, filter={"protocol": CLUB, "protocolPath": "member"},
                                        message_timestamp=ts))
        return [(self.alice.did, m) for m in out]


def _close(*sides: Side) -> None:
    for side in sides:
        side.store.close()


def _same_answers(club_: Club, source: Store, replica: Store) -> list[tuple[int, list[str]]]:
    reads = club_.reads()
    want = _query_answers(Dwn(source), reads)
    assert _query_answers(Dwn(replica), reads) == want
    return want


SCOPE = SyncScope.subset(CLUB, ["thread"])


def _one_round(replica: Side, wire: Wire, tenant: str) -> tuple[Any, Any]:
    """One round of the subset pull; the replica's ledger and its one link."""
    operation, _ = replica.proto.sync(tenant=tenant, scope=SCOPE, local_store_id=store_id(replica.store),
                                      pull=True, push=False, batch=3, totals={})
    run(wire, operation)
    ledger = replica.service.ledger
    (link,) = ledger.links(tenant)
    return ledger, link


def _push(club_: Club, replica_path: Path, seed: int) -> tuple[Side, Side]:
    """One round of the subset push from the club's store (the active side) into a passive
    replica; both sides, open."""
    source = _side(club_.path, "source", active=True, capabilities=(REVS, ROLE_RECORDS))
    replica = _side(replica_path, "replica", active=False, capabilities=(REVS, ROLE_RECORDS))
    wire = Wire(source, replica, random.Random(seed))
    replica.proto.start_hello()
    run(wire, source.proto.start_hello())
    operation, _ = source.proto.sync(tenant=club_.alice.did, scope=SCOPE, local_store_id=store_id(source.store),
                                     pull=False, push=True, batch=3, totals={})
    run(wire, operation)
    assert wire.closed == []
    return source, replica


def _first_pull(tmp_path: Path, seed: int, **connect_options: Any) -> tuple[Club, str]:
    """A club under version 1 and a replica that pulled it once (the subset scope); returns
    the club and its tenant, with both stores closed."""
    club_ = Club(tmp_path / "source.db")
    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", seed, **connect_options)
    pull(replica, wire, club_.alice.did, SCOPE)
    _close(source, replica)
    return club_, club_.alice.did


def test_a_reconfigure_that_makes_a_path_a_role_brings_the_records_there(tmp_path: Path) -> None:
    """The members written before version 2 come with its configure; erin's deleted one comes
    with its delete, so she is refused on both sides."""
    club_, tenant = _first_pull(tmp_path, 1)

    club_.become_roles()
    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", 2)
    pull(replica, wire, tenant, SCOPE)
    answers = _same_answers(club_, source.store, replica.store)
    # carol and dave read by the role, erin's membership was deleted; the owner sees two members.
    assert [code for code, _ in answers] == [200, 200, 200, 200, 401, 401, 200]
    assert len(answers[-1][1]) == 2
    check_subset("roles", source.store, replica.store, tenant, SCOPE, club_.reads())
    _close(source, replica)


def test_role_records_come_page_by_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for two entries an answer, each page holds one record (an initial write and
    its delete are one record's) and names the next; the replica still ends as the source."""
    monkeypatch.setattr(protocol, "MAX_ENTRIES_PER_REF", 2)
    club_, tenant = _first_pull(tmp_path, 8)

    club_.become_roles()
    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", 9)
    answer_refs = source.service._sync[AnswerRefs]
    pages: list[tuple[str | None, str | None, int]] = []

    def noted(request: AnswerRefs) -> Any:
        out = answer_refs(request)
        for ref, (entries, _, following) in zip(request.refs, out, strict=True):
            if isinstance(ref, RoleRecordsRef):
                pages.append((ref.after, following, len(entries)))
        return out

    source.service._sync[AnswerRefs] = noted
    pull(replica, wire, tenant, SCOPE)
    _same_answers(club_, source.store, replica.store)
    # one configure listed; four entries: carol's and dave's writes, erin's write and its delete
    assert len(pages) >= 2 and all(n <= 2 for _, _, n in pages) and sum(n for _, _, n in pages) == 4
    assert pages[0][0] is None and pages[-1][1] is None
    assert [after for after, _, _ in pages[1:]] == [following for _, following, _ in pages[:-1]]
    _close(source, replica)


def test_an_older_source_is_not_asked_and_refuses_the_ref_if_it_is(tmp_path: Path) -> None:
    """A source whose hello does not offer `roleRecords` is never asked: the round completes
    and the link goes live, with the divergence this closes left as it was. Asked anyway, it
    refuses the whole request with a typed error."""
    club_, tenant = _first_pull(tmp_path, 10, source_offers=(REVS,))

    club_.become_roles()
    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", 11, source_offers=(REVS,))
    pull(replica, wire, tenant, SCOPE)
    (link,) = replica.service.ledger.links(tenant)
    assert link.state is LinkState.LIVE
    reads = club_.reads()
    assert _query_answers(Dwn(replica.store), reads)[0][0] == 401  # carol's role is not here
    operation = replica.proto.get_dependencies(0, [RoleRecordsRef(CLUB)])  # type: ignore[list-item]
    with pytest.raises(PeerError) as refused:
        run(wire, operation)
    assert (refused.value.code, refused.value.name) == (400, "DependencyRefInvalid")
    _close(source, replica)


def test_a_configure_held_already_still_brings_the_role_records(tmp_path: Path) -> None:
    """The replica got version 2 from another peer first: the source lists it as held (a
    `changes` item the sink would answer 304), and the role records must come all the same."""
    club_, tenant = _first_pull(tmp_path, 3)

    configure = club_.become_roles()
    elsewhere = Dwn(Store(tmp_path / "replica.db"))
    assert elsewhere.process_message(tenant, configure).code == 202
    elsewhere.close()
    source, replica, wire, sent = connect(club_.path, tmp_path / "replica.db", 4)
    pull(replica, wire, tenant, SCOPE)
    _same_answers(club_, source.store, replica.store)
    _close(source, replica)


def test_a_held_configure_taken_again_is_not_charged_to_a_full_store(tmp_path: Path) -> None:
    """A replica that got version 2 and every role record by another link, its tenant exactly
    at its quota: the subset listing's held configure is taken again (its apply asks for the
    role records) but stores nothing new, so it is not refused 507 and the link goes live."""
    club_, tenant = _first_pull(tmp_path, 15)
    club_.become_roles()
    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", 16)
    pull(replica, wire, tenant, SyncScope.global_scope())  # everything, by another link
    _close(source, replica)

    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", 17)
    usage = Quotas(replica.store, QuotaPolicy()).usage(tenant)
    replica.service.quotas = Quotas(replica.store, QuotaPolicy(tenant=Limit(usage.messages, None)))
    pull(replica, wire, tenant, SCOPE)
    _same_answers(club_, source.store, replica.store)
    subset = [link for link in replica.service.ledger.links(tenant) if link.scope == SCOPE]
    assert [link.state for link in subset] == [LinkState.LIVE]
    _close(source, replica)


def test_a_round_cut_between_the_configure_and_its_role_records_loses_nothing(tmp_path: Path) -> None:
    """The source fails to answer the role records: the configure is applied, its token stays
    unsettled (the link repairing, the checkpoint before it), and the next round, finding the
    configure held, fetches them."""
    club_, tenant = _first_pull(tmp_path, 5)
    configure = club_.become_roles()

    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", 6)
    answer_refs = source.service._sync[AnswerRefs]

    def broken(request: AnswerRefs) -> Any:
        if any(type(ref).__name__ == "RoleRecordsRef" for ref in request.refs):
            raise OSError("disk gone")
        return answer_refs(request)

    source.service._sync[AnswerRefs] = broken
    ledger, link = _one_round(replica, wire, tenant)
    key = link.key
    assert link.state is LinkState.REPAIRING
    assert ledger.transitions(key)[-1].error_code == "ClosureRoleRecordMissing"
    cid = message_cid(configure)
    assert replica.store.messages.get(tenant, cid) is not None  # applied, its token not settled
    checkpoint, _ = ledger.get_checkpoint(key, Direction.PULL)
    assert cid in {t.message_cid for t in checkpoint.unapplied_tokens}
    reads = club_.reads()
    assert _query_answers(Dwn(replica.store), reads) != _query_answers(Dwn(source.store), reads)
    _close(source, replica)

    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", 7)
    pull(replica, wire, tenant, SCOPE)
    _same_answers(club_, source.store, replica.store)
    assert replica.service.ledger.link(key).state is LinkState.LIVE
    _close(source, replica)


def test_role_records_withheld_from_the_reader_leave_the_configure_unsettled(tmp_path: Path) -> None:
    """A reader whose grant does not cover every role record is answered `withheld` (§10.2): the
    replica cannot tell who holds a role, so the configure stays unapplied (the link
    `repairing`, ClosureDependencyForbidden) rather than admitting readers the source would refuse."""
    club_, tenant = _first_pull(tmp_path, 18)
    configure = club_.become_roles()
    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", 19)
    answer_refs = source.service._sync[AnswerRefs]

    def narrower(request: AnswerRefs) -> Any:
        out = answer_refs(request)
        return [(entries[1:], True, following) if isinstance(ref, RoleRecordsRef) else (entries, withheld, following)
                for ref, (entries, withheld, following) in zip(request.refs, out, strict=True)]

    source.service._sync[AnswerRefs] = narrower
    ledger, link = _one_round(replica, wire, tenant)
    assert link.state is LinkState.REPAIRING
    assert ledger.transitions(link.key)[-1].error_code == "ClosureDependencyForbidden"
    checkpoint, _ = ledger.get_checkpoint(link.key, Direction.PULL)
    assert message_cid(configure) in {t.message_cid for t in checkpoint.unapplied_tokens}
    _close(source, replica)


def test_a_subset_push_brings_the_role_records_too(tmp_path: Path) -> None:
    """Pushed, the configure is answered by the passive sink, which asks the pusher for the
    role records on the same connection (either role answers `getDependencies`)."""
    club_ = Club(tmp_path / "source.db")
    _close(*_push(club_, tmp_path / "replica.db", 12))
    club_.become_roles()
    source, replica = _push(club_, tmp_path / "replica.db", 12)
    _same_answers(club_, source.store, replica.store)
    _close(source, replica)


def test_a_configure_pushed_back_to_the_store_it_came_from_brings_the_role_records(tmp_path: Path) -> None:
    """Seed 20318 of the simulator. A subset device wrote members under version 1; version 2
    reached it from the full store it pushes to, so origin echo suppression (§11) would settle
    the configure unproposed, the full store would never ask for the role records, and carol,
    who reads by a role written on the device, would be let in there and refused here. A
    subset source proposes a configure even to the store it came from."""
    club_ = Club(tmp_path / "device.db")
    tenant, full_path = club_.alice.did, tmp_path / "full.db"
    _close(*_push(club_, full_path, 21))  # the device's push checkpoint passes the members: no rule lists them
    version_2 = ProtocolsConfigure.create(definition=club(2), signer=club_.alice,
                                          message_timestamp=club_.author.clock.tick()).message
    written_there = Dwn(Store(full_path))
    assert written_there.process_message(tenant, version_2).code == 202
    written_there.close()
    full, device, wire, _ = connect(full_path, club_.path, 22)
    pull(device, wire, tenant, SCOPE)  # the configure's origin on the device: the full store
    assert device.store.messages.get(tenant, message_cid(version_2)) is not None
    _close(full, device)

    device, full = _push(club_, full_path, 21)
    answers = _same_answers(club_, device.store, full.store)
    assert [code for code, _ in answers][:2] == [200, 200]  # carol reads by her role on both
    _close(device, full)


def test_a_source_that_pages_backwards_leaves_the_configure_unsettled(tmp_path: Path) -> None:
    """A `next` that does not pass `after` could page forever: the sink refuses it, and the
    configure waits for a round with a sane source."""
    club_, tenant = _first_pull(tmp_path, 13)
    club_.become_roles()

    source, replica, wire, _ = connect(club_.path, tmp_path / "replica.db", 14)
    answer_refs = source.service._sync[AnswerRefs]
    asked: list[str | None] = []

    def looping(request: AnswerRefs) -> Any:
        out = answer_refs(request)
        for i, ref in enumerate(request.refs):
            if isinstance(ref, RoleRecordsRef):
                asked.append(ref.after)
                entries, withheld, _ = out[i]
                out[i] = (entries[:1], withheld, ref.after or entries[0].record_id)  # never past the first
        return out

    source.service._sync[AnswerRefs] = looping
    operation, _ = replica.proto.sync(tenant=tenant, scope=SCOPE, local_store_id=store_id(replica.store),
                                      pull=True, push=False, batch=3, totals={})
    run(wire, operation)
    assert len(asked) == 2 and asked[1] is not None
    (link,) = replica.service.ledger.links(tenant)
    assert link.state is LinkState.REPAIRING
    assert replica.service.ledger.transitions(link.key)[-1].error_code == "ClosureRoleRecordMissing"
    _close(source, replica)


def _paging_steps(path: Path, members: int) -> int:
    """SQLite VM steps of reading every page of a RoleRecords answer (8 entries a page) from a
    store with ``members`` role records and as many other records."""
    alice, clock = seeded("club-alice"), Clock()
    dwn = Dwn(Store(path))
    configure = ProtocolsConfigure.create(definition=club(2), signer=alice, message_timestamp=clock.tick())
    assert dwn.process_message(alice.did, configure.message).code == 202
    for i in range(members):
        for path_, recipient in (("member", seeded(f"member-{i}").did), ("thread", None)):
            ts = clock.tick()
            write = RecordsWrite.create(signer=alice, data=b"x", data_format="text/plain", protocol=CLUB,
                                        protocol_path=path_, recipient=recipient, message_timestamp=ts,
                                        date_created=ts)
            assert dwn.process_message(alice.did, write.message, b"x").code == 202
    fetcher, steps, after, listed = LocalStoreFetcher(dwn.store), 0, None, 0

    def profile(event: dict[str, Any]) -> None:
        nonlocal steps
        steps += event["stmt_status"]["SQLITE_STMTSTATUS_VM_STEP"]

    dwn.store.conn.trace_v2(apsw.SQLITE_TRACE_PROFILE, profile)
    while True:
        page, after = fetcher.role_records(alice.did, CLUB, ["member"], after, 8)
        listed += len(page)
        if after is None:
            break
    dwn.store.conn.trace_v2(0, None)
    dwn.close()
    assert listed == members
    return steps


def test_role_records_pages_cost_what_they_hold(tmp_path: Path) -> None:
    """A page reads its own records, not every record after it: paging through n role records
    costs O(n), where it cost O(n^2 / page) (VM steps: load-proof; 3.1x for twice the records
    before, 2.0x now)."""
    small, large = _paging_steps(tmp_path / "small.db", 48), _paging_steps(tmp_path / "large.db", 96)
    assert large < 2.5 * small, (small, large)
