"""A `revs` is applied as runs of one store request each, yet every member as its own `rev`
(replication-profiles.md §8.4, issue #17).

Two protocol objects pumped against each other with no event loop (test_protocol_pump's
wire); the active side's listing and `revs` are written by hand, so a member can miss its
record's initial write, carry damaged data, or meet a failing store in the middle of a run.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.replication.checkpoint import checkpoint_id
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.scope import SyncScope
from p2psync.replication.source import message_entry
from p2psync.replication.wire import decode_body, encode_body
from p2psync.state.copies import store_id
from tests.peer.support import NOTE
from tests.replication.support import Clock
from tests.replication.test_protocol_pump import ALICE, Side, Wire, make_side, run, spy_attachments

T = TypeVar("T")


class _Catch:
    """Stands for the requester of a request written by hand: keeps the answer."""

    def __init__(self) -> None:
        self.answers: dict[int, Any] = {}

    def receive_response(self, ref: int, properties: dict[str, str], body: bytes) -> None:
        self.answers[ref] = decode_body(body, empty_map=False)

    def receive_error(self, ref: int, error: BaseException) -> None:
        self.answers[ref] = error


def ask(wire: Wire, side: Side, profile: str, properties: dict[str, str], body: Any) -> Any:
    """Send ``side`` one request as the other peer would, pump, and return its answer."""
    wire.rids += 1
    rid = wire.rids
    catch = _Catch()
    side.asked[rid] = (SimpleNamespace(proto=catch), rid, None)  # type: ignore[assignment]
    wire.in_flight.append((side, "request", (rid, profile, properties, encode_body(body))))
    wire.pump()
    return catch.answers[rid]


def _notes(store: Store, clock: Clock) -> dict[str, tuple[dict[str, Any], bytes]]:
    """n1, n2, n3, u3 (a newer write of n3's record), n4, n5: name -> (message, data)."""
    dwn = Dwn(store)
    out: dict[str, tuple[dict[str, Any], bytes]] = {}
    for name in ("n1", "n2", "n3", "u3", "n4", "n5"):
        now = clock.tick()
        data = name.encode() * 10
        if name == "u3":
            write = RecordsWrite.create_from(out["n3"][0], signer=ALICE, data=data, message_timestamp=now)
        else:
            write = RecordsWrite.create(signer=ALICE, data=data, schema=NOTE, data_format="text/plain",
                                        message_timestamp=now, date_created=now)
        assert dwn.process_message(ALICE.did, write.message, data).code == 202
        out[name] = (write.message, data)
    return out


def _pair(tmp_path: Path, seed: int, fill: Callable[[Store], T]) -> tuple[Side, Side, Wire, int, T]:
    """A passive laptop and an active phone whose store ``fill`` wrote, greeted, with one
    collection open: (laptop, phone, wire, collection index, what ``fill`` returned)."""
    laptop = make_side(tmp_path, "laptop", active=False)
    phone = make_side(tmp_path, "phone", active=True)
    filled = fill(phone.store)
    wire = Wire(laptop, phone, random.Random(seed))
    laptop.proto.start_hello()
    run(wire, phone.proto.start_hello())
    scope = SyncScope.global_scope()
    index, _ = run(wire, phone.proto.open_collection(
        ALICE.did, scope, checkpoint_id(store_id(phone.store), store_id(laptop.store), scope.scope_id, ALICE.did)))
    return laptop, phone, wire, index, filled


@pytest.fixture
def pushed(tmp_path: Path) -> Any:
    """A passive laptop (the sink) and an active phone that proposes its notes by hand, and
    every store request the laptop carried out, in order."""
    laptop, phone, wire, index, notes = _pair(tmp_path, 7, lambda store: _notes(store, Clock()))
    requests: list[Any] = []
    applied: list[str] = []
    carry_out, apply_entry = laptop.service.run, laptop.service._apply_entry
    name = {ReplicationEntry(m).cid: n for n, (m, _) in notes.items()}

    def run_spied(request: Any) -> Any:
        requests.append(type(request).__name__)
        return carry_out(request)

    def apply_spied(tenant: str, entry: Any, origin: Any, payer: Any) -> Any:
        applied.append(name[entry.cid])
        return apply_entry(tenant, entry, origin, payer)

    laptop.service.run = run_spied  # type: ignore[method-assign]
    laptop.service._apply_entry = apply_spied  # type: ignore[method-assign]
    return SimpleNamespace(laptop=laptop, phone=phone, wire=wire, index=index, notes=notes, requests=requests,
                           applied=applied)


def propose_and_send(pushed: Any, names: list[str], damaged: str | None = None) -> list[Any]:
    """Propose ``names`` (in log order), then send them in one `revs`; its results."""
    stream_id, epoch = pushed.phone.store.events.stream(ALICE.did)
    position = {cid: str(p) for p, cid in pushed.phone.store.events.read(ALICE.did, after=-1)}
    members = []
    for name in names:
        message, data = pushed.notes[name]
        cid = ReplicationEntry(message).cid
        member = {**message_entry(ReplicationEntry(message, data)), "position": position[cid], "messageCid": cid}
        if name == damaged:
            member["data"] = data[:-1] + b"?"  # the same size, another dataCid
        members.append(member)
    listing = {"streamId": stream_id, "epoch": epoch,
               "items": [[m["position"], m["messageCid"]] for m in members]}
    props = {"collection": str(pushed.index)}
    assert ask(pushed.wire, pushed.laptop, "proposeChanges", props, listing) == []  # all wanted
    answer = ask(pushed.wire, pushed.laptop, "revs", props, {"revs": members})
    assert isinstance(answer, dict), answer
    results: list[Any] = answer["results"]
    return results


def applies(pushed: Any) -> list[str]:
    """The store requests that applied messages, in order."""
    return [r for r in pushed.requests if r in ("Apply", "ApplyBatch")]


def test_one_store_request_applies_a_run_of_members(pushed: Any) -> None:
    results = propose_and_send(pushed, ["n1", "n2", "n3", "n4"])
    assert [r["kind"] for r in results] == ["Applied"] * 4
    assert applies(pushed) == ["ApplyBatch"] and pushed.applied == ["n1", "n2", "n3", "n4"]
    assert pushed.laptop.proto.sinks[pushed.index].claimed == set()  # every claim released


def test_a_member_missing_its_initial_write_runs_its_closure_before_the_next_applies(pushed: Any) -> None:
    # n3 is never listed: u3 is Incomplete until its closure fetches n3 from the phone; n4 has
    # damaged data and is refused on its own; n5 is applied only after u3's closure ran.
    results = propose_and_send(pushed, ["n1", "n2", "u3", "n4", "n5"], damaged="n4")
    assert [r.get("kind") for r in results] == ["Applied", "Applied", "Applied", None, "Applied"]
    assert results[3]["status"] == 424 and results[3]["error"]["code"] == "AttachmentInvalid"
    assert applies(pushed) == ["ApplyBatch", "Apply", "Apply", "ApplyBatch"]
    assert pushed.applied == ["n1", "n2", "u3", "n3", "u3", "n5"]
    held = set(pushed.laptop.store.messages.cids(ALICE.did))
    cids = {n: ReplicationEntry(m).cid for n, (m, _) in pushed.notes.items()}
    assert held == {cids[n] for n in ("n1", "n2", "n3", "u3", "n5")}
    sink = pushed.laptop.proto.sinks[pushed.index]
    assert sink.stats.dependencies_fetched >= 1
    assert sink.stats.results == {"Applied": 4, "AttachmentInvalid": 1}
    assert sink.claimed == set()


def test_a_store_failure_defers_only_the_member_it_met(pushed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    service = pushed.laptop.service
    failing = ReplicationEntry(pushed.notes["n2"][0]).cid
    apply_entry = service._apply_entry

    def flaky(tenant: str, entry: Any, origin: Any, payer: Any) -> Any:
        if entry.cid == failing:
            raise RuntimeError("disk on fire")
        return apply_entry(tenant, entry, origin, payer)

    monkeypatch.setattr(service, "_apply_entry", flaky)
    results = propose_and_send(pushed, ["n1", "n2", "n3"])
    assert [r["kind"] for r in results] == ["Applied", "Deferred", "Applied"]
    # the batch stopped at n2; n3 was applied by the next run, after n2's closure gave up
    assert applies(pushed) == ["ApplyBatch", "ApplyBatch"]
    assert pushed.applied == ["n1", "n3"]
    assert failing not in set(pushed.laptop.store.messages.cids(ALICE.did))


def test_members_whose_data_travels_out_of_line_are_fetched_ahead_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `revs` may carry members with only a dataSize (another implementation's source may
    batch them): each is fetched by getAttachment, in listed order, some ahead of their turn
    while the members before them apply, and every one applies."""
    def large_notes(store: Store) -> list[tuple[dict[str, Any], bytes]]:
        dwn, clock, notes = Dwn(store), Clock(), []
        for i in range(5):
            now = clock.tick()
            data = bytes([i + 1]) * 50_000
            write = RecordsWrite.create(signer=ALICE, data=data, schema=NOTE, data_format="text/plain",
                                        message_timestamp=now, date_created=now)
            assert dwn.process_message(ALICE.did, write.message, data).code == 202
            notes.append((write.message, data))
        return notes

    laptop, phone, wire, index, notes = _pair(tmp_path, 3, large_notes)
    spy = spy_attachments(monkeypatch, laptop)
    stream_id, epoch = phone.store.events.stream(ALICE.did)
    position = {cid: str(p) for p, cid in phone.store.events.read(ALICE.did, after=-1)}
    members = []
    for message, data in notes:
        entry = ReplicationEntry(message, data)
        phone.proto.offer(ALICE.did, entry)  # as its source does before sending a message
        members.append({**message_entry(entry), "position": position[entry.cid], "messageCid": entry.cid})
    assert all("data" not in m and m["dataSize"] == 50_000 for m in members)
    listing = {"streamId": stream_id, "epoch": epoch, "items": [[m["position"], m["messageCid"]] for m in members]}
    props = {"collection": str(index)}
    assert ask(wire, laptop, "proposeChanges", props, listing) == []
    answer = ask(wire, laptop, "revs", props, {"revs": members})
    assert [r["kind"] for r in answer["results"]] == ["Applied"] * 5
    assert [props["messageCid"] for props in spy.fetched] == [m["messageCid"] for m in members]
    assert spy.peak >= 2  # ahead of their turns, not one at a time
    for message, data in notes:
        assert laptop.store.data.get(ALICE.did, message["recordId"], message["descriptor"]["dataCid"]) == data
