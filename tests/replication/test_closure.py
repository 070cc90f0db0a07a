"""The closure loop: admission, failure, deferral, caching, the pass bound, push and pull.

Real engines on SQLite files where the engine decides; a scripted applier only where a test
needs a receiver our 0.5.2 engine cannot be (one that emits KeyDelivery or CrossProtocolRef
refs, as a newer reference does) or an endless one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.replication_types import (
    Applied,
    CrossProtocolRef,
    Deferred,
    DependencyRef,
    Grant,
    Incomplete,
    InitialWrite,
    Invalid,
    KeyDelivery,
    Parent,
    Protocol,
    RecordData,
    ReplicationApplyResult,
)
from p2psync.dwn.store import Store
from p2psync.replication.closure import (
    KEY_DELIVERY_PROTOCOLS,
    MAX_ADMISSION_PASSES,
    ApplyRequest,
    ClosureAdmitter,
    ClosureOutcome,
    ClosureProtocolError,
    FetchRequest,
    ReplicationEntry,
    Withheld,
    answers_ref,
)
from p2psync.state.local import LocalApplier, LocalStoreFetcher, reconcile
from tests.replication.support import (
    CHAT,
    assert_log_matches_messages,
    chat_world,
    grant_world,
    process_all,
    snapshot,
)


@pytest.fixture
def source(tmp_path: Path) -> Dwn:
    return Dwn(Store(tmp_path / "source.db"))


@pytest.fixture
def replica(tmp_path: Path) -> Dwn:
    return Dwn(Store(tmp_path / "replica.db"))


class CountingFetcher(LocalStoreFetcher):
    """A store fetcher that records every batch of refs it was asked for."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.asked: list[tuple[DependencyRef, ...]] = []

    async def fetch(self, tenant: str, refs: Sequence[DependencyRef]) -> list[list[ReplicationEntry]]:
        self.asked.append(tuple(refs))
        return await super().fetch(tenant, refs)


class ScriptedApplier:
    """Answers with scripted results, in order, then delegates (or keeps answering the last)."""

    def __init__(self, results: Sequence[ReplicationApplyResult], then: LocalApplier | None = None) -> None:
        self.results = list(results)
        self.then = then
        self.seen: list[ReplicationEntry] = []

    async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
        self.seen.append(entry)
        if self.results:
            return self.results.pop(0)
        assert self.then is not None
        return await self.then.apply(tenant, entry)


# --------------------------------------------------------------------------- outcomes


async def test_pull_admits_a_root_with_its_whole_closure(source: Dwn, replica: Dwn) -> None:
    w = chat_world()
    process_all(source, w.tenant, w.ordered())
    fetcher = CountingFetcher(source.store)
    outcome = await ClosureAdmitter(w.tenant, w.steps["reaction"].entry).admit(LocalApplier(replica), fetcher)
    assert outcome.status == "admitted" and outcome.failure is None
    # protocol, then the ancestry in one batch, then the role record
    assert [[r.type for r in batch] for batch in fetcher.asked] == [["Protocol"], ["Ancestor", "Parent"], ["Role"]]
    assert outcome.passes == 4
    assert set(outcome.admitted) == {w.steps[n].cid for n in ("protocol", "thread", "participant", "chat", "reaction")}
    # a root that needs nothing takes one pass and no fetch
    again = await ClosureAdmitter(w.tenant, w.steps["reaction"].entry).admit(LocalApplier(replica), fetcher)
    assert (again.status, again.passes, again.fetch_requests, again.applied) == ("admitted", 1, 0, ())


async def test_push_answers_the_receivers_refs_from_the_pushers_store(source: Dwn, replica: Dwn) -> None:
    """The same class pushes: the applier is the receiver, the fetcher is the pusher's store."""
    w = grant_world()
    process_all(source, w.tenant, w.ordered())
    receiver = LocalApplier(replica)  # stands for the remote peer a push talks to
    pusher_store = CountingFetcher(source.store)
    outcome = await ClosureAdmitter(w.tenant, w.steps["granted-note"].entry).admit(receiver, pusher_store)
    assert outcome.status == "admitted"
    assert [[r.type for r in batch] for batch in pusher_store.asked] == [["Protocol"], ["Grant"]]
    assert snapshot(replica.store, w.tenant) == snapshot(source.store, w.tenant)


async def test_invalid_dependency_fails_the_closure(source: Dwn, replica: Dwn) -> None:
    w = chat_world()
    process_all(source, w.tenant, w.ordered())
    # the protocol this store would fetch is tampered with on its way
    forged = ReplicationEntry(
        {**w.steps["protocol"].message, "authorization": w.steps["thread"].message["authorization"]}
    )

    class Forging(LocalStoreFetcher):
        async def fetch(self, tenant: str, refs: Sequence[DependencyRef]) -> list[list[ReplicationEntry]]:
            return [[forged] if isinstance(r, Protocol) else self.answer(tenant, r) for r in refs]

    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(
        LocalApplier(replica), Forging(source.store)
    )
    assert (outcome.status, outcome.failure) == ("failed", "invalid")
    assert outcome.detail is not None and forged.cid in outcome.detail
    assert replica.store.messages.count(w.tenant) == 0


async def test_terminal_ref_fails_without_fetching(source: Dwn, replica: Dwn) -> None:
    w = chat_world()
    terminal = Incomplete((Grant(permission_grant_id="bafyreigone", terminal=True), Protocol(protocol=CHAT)))
    fetcher = CountingFetcher(source.store)
    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(ScriptedApplier([terminal]), fetcher)
    assert (outcome.status, outcome.failure, fetcher.asked) == ("failed", "terminal", [])
    assert outcome.detail is not None and "Grant(permissionGrantId=bafyreigone" in outcome.detail


async def test_deferred_result_defers_the_closure(replica: Dwn, source: Dwn) -> None:
    w = chat_world()
    replica.store.tenant_id(w.tenant)
    replica.store.set_tenant_active(w.tenant, False)
    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(
        LocalApplier(replica), LocalStoreFetcher(source.store)
    )
    assert outcome.status == "deferred" and outcome.detail is not None and outcome.detail.endswith("tenant-inactive")


async def test_unanswerable_dependency_defers(source: Dwn, replica: Dwn) -> None:
    w = chat_world()
    # the source does not have the protocol either
    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(
        LocalApplier(replica), LocalStoreFetcher(source.store)
    )
    assert outcome.status == "deferred"
    thread = w.steps["thread"].cid
    assert outcome.detail == f"ClosureProtocolMetadataMissing: {thread}: unresolved Protocol(protocol={CHAT})"
    assert outcome.code == "ClosureProtocolMetadataMissing" and outcome.needed_by == w.steps["thread"].cid
    assert outcome.passes == 1


async def test_each_ref_is_fetched_once_per_closure(source: Dwn, replica: Dwn) -> None:
    w = chat_world()
    process_all(source, w.tenant, w.ordered())
    replica.apply_replicated_message(w.tenant, w.steps["protocol"].message)

    class Recording(LocalApplier):
        def __init__(self, dwn: Dwn) -> None:
            super().__init__(dwn)
            self.missing: list[tuple[DependencyRef, ...]] = []

        async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
            result = await super().apply(tenant, entry)
            if isinstance(result, Incomplete):
                self.missing.append(result.missing)
            return result

    applier, fetcher = Recording(replica), CountingFetcher(source.store)
    outcome = await ClosureAdmitter(w.tenant, w.steps["reaction"].entry).admit(applier, fetcher)
    assert outcome.status == "admitted"
    chat_parent = Parent(record_id=w.steps["chat"].message["recordId"], protocol=CHAT)
    # the reaction asked for its parent twice (the chat waited for its role record) ...
    assert sum(chat_parent in refs for refs in applier.missing) == 2
    # ... and the parent was fetched once
    asked = [ref for batch in fetcher.asked for ref in batch]
    assert asked.count(chat_parent) == 1 and len(asked) == len(set(asked))


async def test_message_cid_is_fetched_directly_and_nothing_else_is_taken(source: Dwn, replica: Dwn) -> None:
    w = chat_world()
    process_all(source, w.tenant, w.ordered())
    protocol_cid = w.steps["protocol"].cid
    by_cid = Incomplete((Protocol(protocol=CHAT, message_cid=protocol_cid),))
    fetcher = CountingFetcher(source.store)
    applier = ScriptedApplier([by_cid], then=LocalApplier(replica))
    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(applier, fetcher)
    assert outcome.status == "admitted"
    assert [e.cid for e in applier.seen] == [w.steps["thread"].cid, protocol_cid, w.steps["thread"].cid]
    # an answer with another CID does not answer a messageCid ref
    other = ReplicationEntry(w.steps["thread"].message)
    assert not answers_ref(Protocol(protocol=CHAT, message_cid=protocol_cid), other)


def test_answers_must_match_the_ref() -> None:
    w = chat_world()
    s = w.steps
    note = s["note"].entry
    assert answers_ref(InitialWrite(record_id=note.message["recordId"]), note)
    assert not answers_ref(InitialWrite(record_id=s["thread"].message["recordId"]), note)
    assert answers_ref(Protocol(protocol=CHAT), s["protocol"].entry)
    assert not answers_ref(Protocol(protocol="https://other.example"), s["protocol"].entry)
    data_ref = RecordData(record_id=note.message["recordId"], data_cid=note.message["descriptor"]["dataCid"])
    assert answers_ref(data_ref, note)
    assert not answers_ref(data_ref, ReplicationEntry(note.message, b"other bytes"))
    assert not answers_ref(data_ref, ReplicationEntry(note.message))  # no data at all
    assert not answers_ref(Parent(record_id="x", protocol=CHAT), ReplicationEntry({"not": "a message"}))


class Endless:
    """Every message it is given needs one more, never seen before (a linear endless chain)."""

    def __init__(self, fan_out: int = 1) -> None:
        self.counter = itertools.count()
        self.fan_out = fan_out
        self.refs: dict[str, tuple[DependencyRef, ...]] = {}

    async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
        if entry.cid not in self.refs:
            self.refs[entry.cid] = tuple(InitialWrite(record_id=f"r{next(self.counter)}") for _ in range(self.fan_out))
        return Incomplete(self.refs[entry.cid])

    async def fetch(self, tenant: str, refs: Sequence[DependencyRef]) -> list[list[ReplicationEntry]]:
        record = {"descriptor": {"interface": "Records", "method": "Write"}}
        return [[ReplicationEntry({**record, "recordId": r.record_id})] for r in refs]  # type: ignore[union-attr]


async def test_pass_budget_defers_never_fails() -> None:
    w = chat_world()
    endless = Endless()
    # (An endless chain is deeper than the depth bound first: lifted here to reach the passes.)
    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry, max_depth=10**6).admit(endless, endless)
    assert (outcome.status, outcome.passes) == ("deferred", MAX_ADMISSION_PASSES)
    assert outcome.detail == f"pass budget of {MAX_ADMISSION_PASSES} exhausted"
    small = await ClosureAdmitter(w.tenant, w.steps["thread"].entry, max_passes=3).admit(Endless(), Endless())
    assert (small.status, small.passes) == ("deferred", 3)
    deep = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(Endless(), Endless())
    assert (deep.status, deep.code) == ("failed", "ClosureDepthExceeded")


async def test_closure_size_is_bounded() -> None:
    """A fan-out that doubles every pass hits the message bound long before the pass bound."""
    w = chat_world()
    endless = Endless(fan_out=2)
    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(endless, endless)
    assert outcome.status == "deferred" and outcome.detail == "closure exceeds 4096 messages"
    assert outcome.passes < MAX_ADMISSION_PASSES


async def test_failing_applier_or_fetcher_defers(source: Dwn, replica: Dwn) -> None:
    w = chat_world()

    class Broken:
        async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
            raise ConnectionResetError("peer went away")

        async def fetch(self, tenant: str, refs: Sequence[DependencyRef]) -> list[list[ReplicationEntry]]:
            raise TimeoutError("no answer")

    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(Broken(), Broken())
    assert outcome.status == "deferred" and outcome.detail == "apply failed: ConnectionResetError: peer went away"
    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(LocalApplier(replica), Broken())
    assert outcome.status == "deferred" and outcome.detail == "fetch failed: TimeoutError: no answer"


def test_driving_the_machine_by_hand() -> None:
    """Sans-I/O: read the request, answer it; no event loop involved."""
    w = chat_world()
    s = w.steps
    admitter = ClosureAdmitter(w.tenant, s["thread"].entry)
    request = admitter.request
    assert isinstance(request, ApplyRequest) and request.entry.cid == s["thread"].cid
    with pytest.raises(ClosureProtocolError):
        admitter.receive_fetch([])
    request = admitter.receive_apply(Incomplete((Protocol(protocol=CHAT),)))
    assert isinstance(request, FetchRequest) and request.refs == (Protocol(protocol=CHAT),)
    request = admitter.receive_fetch([[s["protocol"].entry]])
    assert isinstance(request, ApplyRequest) and request.entry.cid == s["protocol"].cid
    request = admitter.receive_apply(Applied())
    assert isinstance(request, ApplyRequest) and request.entry.cid == s["thread"].cid
    request = admitter.receive_apply(Applied())
    assert isinstance(request, ClosureOutcome) and request.status == "admitted" and request.passes == 2
    assert admitter.outcome is request
    with pytest.raises(ClosureProtocolError):
        admitter.receive_apply(Applied())


def test_a_withheld_dependency_ends_the_closure_as_terminal() -> None:
    """§10: a source that holds a ref's answer but will not show it is not asked again."""
    w = chat_world()
    admitter = ClosureAdmitter(w.tenant, w.steps["thread"].entry)
    admitter.receive_apply(Incomplete((Protocol(protocol=CHAT),)))
    outcome = admitter.receive_fetch([Withheld()])
    assert isinstance(outcome, ClosureOutcome)
    assert outcome.status == "failed" and outcome.failure == "terminal"
    assert outcome.detail is not None and outcome.detail.startswith("ClosureDependencyForbidden: ")


def test_an_empty_answer_stays_a_deferral() -> None:
    """Nothing there (no ``withheld``) may change later: retry, do not settle."""
    w = chat_world()
    admitter = ClosureAdmitter(w.tenant, w.steps["thread"].entry)
    admitter.receive_apply(Incomplete((Protocol(protocol=CHAT),)))
    outcome = admitter.receive_fetch([[]])
    assert isinstance(outcome, ClosureOutcome) and outcome.status == "deferred"


def test_a_misbehaving_fetcher_answer_is_a_deferral_not_a_crash() -> None:
    w = chat_world()
    admitter = ClosureAdmitter(w.tenant, w.steps["thread"].entry)
    admitter.receive_apply(Incomplete((Protocol(protocol=CHAT), Grant(permission_grant_id="g"))))
    outcome = admitter.receive_fetch([[w.steps["protocol"].entry]])  # one list for two refs
    assert isinstance(outcome, ClosureOutcome) and outcome.status == "deferred"
    assert outcome.detail == "fetcher answered 1 lists for 2 refs"


async def test_reconcile_two_stores_in_process(source: Dwn, replica: Dwn) -> None:
    w = chat_world()
    process_all(source, w.tenant, w.ordered())
    report = await reconcile(source.store, replica, w.tenant)
    assert report.count("admitted") == len(report.outcomes) == source.store.events.count(w.tenant)
    assert snapshot(replica.store, w.tenant) == snapshot(source.store, w.tenant)
    assert_log_matches_messages(snapshot(replica.store, w.tenant))


# --------------------------------------------------------------------------- refs a newer receiver emits


KEY_DELIVERY = KEY_DELIVERY_PROTOCOLS[0]
KEY_DELIVERY_DEFINITION: dict[str, Any] = {
    "protocol": KEY_DELIVERY,
    "published": False,
    "types": {"contextKey": {"dataFormats": ["application/json"]}},
    "structure": {
        "contextKey": {
            "$tags": {
                "$requiredTags": ["protocol", "contextId"],
                "protocol": {"type": "string"},
                "contextId": {"type": "string"},
            },
            "$actions": [{"who": "anyone", "can": ["create"]}],
        }
    },
}


class NewerReceiver:
    """A receiver whose engine also requires a dependency 0.5.2 knows nothing of.

    Until ``needed(store)`` holds it answers ``Incomplete((ref,))`` for ``root_cid``; anything
    else goes to the real engine.
    """

    def __init__(self, dwn: Dwn, root_cid: str, ref: DependencyRef, needed: Any) -> None:
        self.inner = LocalApplier(dwn)
        self.root_cid, self.ref, self.needed = root_cid, ref, needed

    async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
        if entry.cid == self.root_cid and not self.needed(self.inner.dwn.store):
            return Incomplete((self.ref,))
        return await self.inner.apply(tenant, entry)


async def test_key_delivery_ref_is_answered_from_the_key_delivery_protocol(source: Dwn, replica: Dwn) -> None:
    w = chat_world()
    process_all(source, w.tenant, w.ordered())
    ctx = w.steps["thread"].message["contextId"]
    configure = ProtocolsConfigure.create(
        definition=KEY_DELIVERY_DEFINITION, signer=w.alice, message_timestamp=w.clock.tick()
    )
    assert source.process_message(w.tenant, configure.message).code == 202
    now = w.clock.tick()
    key = RecordsWrite.create(
        signer=w.alice,
        data=b'{"k":1}',
        data_format="application/json",
        protocol=KEY_DELIVERY,
        protocol_path="contextKey",
        recipient=w.carol.did,
        tags={"protocol": CHAT, "contextId": ctx},
        message_timestamp=now,
        date_created=now,
    )
    assert source.process_message(w.tenant, key.message, b'{"k":1}').code == 202
    ref = KeyDelivery(protocol=CHAT, context_id=ctx)
    assert [e.cid for e in LocalStoreFetcher(source.store).answer(w.tenant, ref)] == [key.cid]

    def has_key(store: Store) -> bool:
        return store.messages.has(w.tenant, key.cid)

    receiver = NewerReceiver(replica, w.steps["chat"].cid, ref, has_key)
    fetcher = CountingFetcher(source.store)
    outcome = await ClosureAdmitter(w.tenant, w.steps["chat"].entry).admit(receiver, fetcher)
    assert outcome.status == "admitted"
    assert any(r == ref for batch in fetcher.asked for r in batch)
    assert key.cid in outcome.applied and w.steps["chat"].cid in outcome.applied


async def test_cross_protocol_ref_is_answered_with_that_protocols_record(source: Dwn, replica: Dwn) -> None:
    w = chat_world()
    process_all(source, w.tenant, w.ordered())
    note_id = w.steps["note"].message["recordId"]
    ref = CrossProtocolRef(protocol=CHAT, record_id=note_id)
    answer = LocalStoreFetcher(source.store).answer(w.tenant, ref)
    # the note's initial write (kept without data after the delete) is all the source holds
    assert [e.cid for e in answer] == [w.steps["note"].cid]
    assert (
        LocalStoreFetcher(source.store).answer(
            w.tenant, CrossProtocolRef(protocol="https://other.example", record_id=note_id)
        )
        == []
    )

    def has_note(store: Store) -> bool:
        return store.messages.has(w.tenant, w.steps["note"].cid)

    receiver = NewerReceiver(replica, w.steps["thread"].cid, ref, has_note)
    outcome = await ClosureAdmitter(w.tenant, w.steps["thread"].entry).admit(receiver, LocalStoreFetcher(source.store))
    assert outcome.status == "admitted"
    assert w.steps["note"].cid in outcome.admitted


def test_invalid_kind_from_a_scripted_applier_is_reported() -> None:
    w = chat_world()
    admitter = ClosureAdmitter(w.tenant, w.steps["thread"].entry)
    outcome = admitter.receive_apply(Invalid("GeneralJwsVerifierInvalidSignature: bad"))
    assert isinstance(outcome, ClosureOutcome)
    assert (outcome.status, outcome.failure) == ("failed", "invalid")
    deferred = ClosureAdmitter(w.tenant, w.steps["thread"].entry).receive_apply(Deferred("resolver-unavailable"))
    assert isinstance(deferred, ClosureOutcome) and deferred.status == "deferred"
