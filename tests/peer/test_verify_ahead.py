"""A sink verifies a `revs`'s signatures on another core while it applies (issue #17).

The same pull with the signature worker, with a stand-in that verifies every batch before its
applies start (so every signature is found verified ahead: the path is taken for certain), and
with none (every signature verified inline: the fallback) ends with the same store; a forged
member of a `revs` is refused however far ahead its genuine twin was verified.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from p2psync import blip
from p2psync.dwn import authentication, ed25519, jws
from p2psync.dwn.ahead import SignatureProcess, SignatureWorker
from p2psync.dwn.encoding import b64url_decode, b64url_encode
from p2psync.dwn.store import Store
from p2psync.peer import peer as peer_module
from p2psync.peer.peer import Peer
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.scope import SyncScope
from p2psync.replication.source import message_entry
from p2psync.replication.wire import APP_ID, decode_body, encode_body
from tests.peer.support import Clock, assert_same, new_store, seeded, served, write_notes

ALICE = seeded("verify-ahead")
BOB = seeded("verify-ahead-bob")
NOTES = 150  # three `revs` and more


class AlwaysAhead:
    """A worker that is never late: it verifies each batch before the sink's applies start."""

    def __init__(self) -> None:
        self.verified = 0

    def submit(self, messages: Sequence[Any]) -> bool:
        for message in messages:
            authentication.verify_ahead(message)
        self.verified += len(messages)
        return True


@pytest.fixture(autouse=True)
def empty_memo() -> Iterator[None]:
    ed25519.AHEAD.clear()
    yield
    ed25519.AHEAD.clear()


@pytest.mark.parametrize("worker", ["thread", "process", "always-ahead", "none"])
async def test_a_pull_ends_the_same_with_signatures_verified_ahead_or_inline(tmp_path: Path, worker: str) -> None:
    source = new_store(tmp_path, "source")
    write_notes(source, ALICE, NOTES, clock=Clock())
    # The notes were verified when written, in this process: forget those verdicts, so the
    # sink's engine verifies each signature again (ahead or inline).
    jws._verify_entry.cache_clear()
    ed25519.AHEAD.clear()
    sink = new_store(tmp_path, "sink")
    puller = Peer(sink, ALICE)
    ahead: Any = {"thread": SignatureWorker, "process": SignatureProcess, "always-ahead": AlwaysAhead,
                  "none": lambda: None}[worker]()
    puller.service.ahead = ahead
    async with served(Peer(source, ALICE)) as url:
        summary = await puller.sync(url, tenant=ALICE.did, direction="pull")
    assert summary.pull is not None and summary.pull.results == {"Applied": NOTES}
    memo = ed25519.AHEAD
    # The engine asked once a message (and once each hello proof: the two peers share the memo).
    assert memo.taken + memo.missed == NOTES + 2
    if worker in ("thread", "process"):
        assert ahead.wait_idle(30)
        assert ahead.verified == NOTES and memo.kept + memo.late == NOTES
        if worker == "process":
            ahead.close()
            assert ahead.worker_cpu > 0
    elif worker == "always-ahead":
        assert ahead.verified == NOTES and memo.taken == NOTES  # none verified twice
    else:
        assert memo.kept == 0 and memo.taken == 0
    assert_same(source, sink, ALICE)


def listing(store: Store) -> tuple[dict[str, Any], list[tuple[str, str, dict[str, Any]]]]:
    """The proposeChanges body for everything in ``store``'s log, and (position, cid, message)
    of each, its small data apart as a `rev` carries it."""
    stream_id, epoch = store.events.stream(ALICE.did)
    messages = []
    for position, cid in store.events.read(ALICE.did, after=-1):
        stored = store.messages.get(ALICE.did, cid)
        assert stored is not None
        messages.append((str(position), cid, {k: v for k, v in stored.items() if k != "encodedData"}))
    items = [[p, c, m["recordId"]] for p, c, m in messages]
    return {"streamId": stream_id, "epoch": epoch, "items": items}, messages


def _forged(message: dict[str, Any], how: str) -> dict[str, Any]:
    """``message`` with its signature flipped in one bit (the same signing input and key), or
    its signature presented under Bob's header (another key)."""
    jws_ = message["authorization"]["signature"]
    entry = jws_["signatures"][0]
    if how == "flipped":
        signature = b64url_decode(entry["signature"])
        entry = {**entry, "signature": b64url_encode(signature[:-1] + bytes([signature[-1] ^ 1]))}
    else:
        entry = {**entry, "protected": jws.sign_payload({"x": 1}, BOB)["signatures"][0]["protected"]}
    return {**message, "authorization": {**message["authorization"],
                                         "signature": {**jws_, "signatures": [entry]}}}


@pytest.mark.parametrize("how", ["flipped", "another key"])
async def test_a_forged_revs_member_is_refused_though_its_genuine_twin_was_verified_ahead(
    tmp_path: Path, how: str
) -> None:
    source = new_store(tmp_path, "source")
    write_notes(source, ALICE, 3, clock=Clock())
    jws._verify_entry.cache_clear()
    body, messages = listing(source)
    (p1, c1, m1), (p2, c2, m2), (p3, c3, m3) = messages
    forged = _forged(m2, how)
    forged_cid = ReplicationEntry(forged).cid
    body["items"][1] = [p2, forged_cid, m2["recordId"]]
    authentication.verify_ahead(m2)  # the genuine message's acceptance waits in the memo
    sink = new_store(tmp_path, "sink")
    receiver = Peer(sink, ALICE)
    receiver.service.ahead = AlwaysAhead()
    pusher = Peer(source, ALICE)
    async with served(receiver) as url, blip.connect(url, app_id=APP_ID,
                                                    handlers=pusher.handlers(active=True)) as conn:
        session = pusher.session_for(conn, active=True)
        await session.hello()
        index, _ = await session.run(session.proto.open_collection(ALICE.did, SyncScope.global_scope(), "cp-forged"))
        reply = await conn.request("proposeChanges", {"collection": str(index)}, encode_body(body))
        assert decode_body(reply.body, empty_map=False) in ([], [0, 0, 0])
        members = []
        for position, cid, message in ((p1, c1, m1), (p2, forged_cid, forged), (p3, c3, m3)):
            data = source.data.get(ALICE.did, str(message["recordId"]), str(message["descriptor"]["dataCid"]))
            members.append({**message_entry(ReplicationEntry(message, data)), "position": position,
                            "messageCid": cid})
        with trio.fail_after(10):
            answer = await conn.request("revs", {"collection": str(index)}, encode_body({"revs": members}))
    results = decode_body(answer.body)["results"]
    assert [r["kind"] for r in results] == ["Applied", "Invalid", "Applied"]
    assert results[1]["reason"].startswith("GeneralJwsVerifierInvalidSignature")
    held = set(Store(tmp_path / "sink.db").messages.cids(ALICE.did))
    assert held == {c1, c3}
    assert ed25519.AHEAD.taken == 2  # m1 and m3; m2's acceptance was not the forgery's to take


def test_the_worker_is_off_unless_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured on a quiet two-core machine it cost CPU and gained nothing at 100,000 messages
    (docs/benchmarks.md): a peer verifies inline unless told otherwise."""
    monkeypatch.delenv("P2PSYNC_VERIFY_AHEAD", raising=False)
    monkeypatch.setattr(peer_module, "second_core", lambda: True)
    assert Peer(new_store(tmp_path, "a"), ALICE).ahead is None
    assert isinstance(Peer(new_store(tmp_path, "b"), ALICE, verify_ahead=True).ahead, SignatureWorker)
    monkeypatch.setenv("P2PSYNC_VERIFY_AHEAD", "1")
    assert isinstance(Peer(new_store(tmp_path, "c"), ALICE).ahead, SignatureWorker)
    monkeypatch.setenv("P2PSYNC_VERIFY_AHEAD", "process")
    assert isinstance(Peer(new_store(tmp_path, "e"), ALICE).ahead, SignatureProcess)
    assert isinstance(Peer(new_store(tmp_path, "f"), ALICE, verify_ahead="process").ahead, SignatureProcess)
    monkeypatch.setattr(peer_module, "second_core", lambda: False)
    assert Peer(new_store(tmp_path, "d"), ALICE, verify_ahead=True).ahead is None
