"""Messages that will never apply are visible (issue #16): the ``sync`` summary (and ``--json``),
``-v`` and ``status`` name each one with its CID, code and reason.

Device A's store holds, besides honest notes, a forged message slipped into its log behind
the engine's back (a real write whose descriptor changed after signing), so every peer it
reaches refuses it as ``Invalid``. The peer is a real ``p2psync serve``.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, Literal

import pytest

from p2psync.cli.home import Home
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from p2psync.replication.stats import MAX_NOT_APPLIED, MAX_NOT_APPLIED_TRACKED, NotApplied, NotAppliedLog
from p2psync.state.copies import NotAppliedRecords
from tests.replication.support import seeded
from tests.test_cli_sync import STARTUP_DEADLINE, run, run_json, serving, two_devices


def _forge(home: Path, did: str) -> str:
    """Put a forged copy of one of the store's writes in its log; returns its CID."""
    store = Store(Home(home).store_path)
    try:
        honest = store.messages.get(did, store.messages.cids(did)[0])
        assert honest is not None
        forged = copy.deepcopy(honest)
        forged.pop("encodedData", None)
        forged["descriptor"]["dataFormat"] = "application/x-forged"
        forged["recordId"] = "bafyreiaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        indexes = {"interface": "Records", "method": "Write", "recordId": forged["recordId"]}
        with store.transaction():
            store.messages.put(did, forged, indexes)
            store.events.append(did, message_cid(forged), indexes)
        return message_cid(forged)
    finally:
        store.close()


def _shown(entry: dict[str, Any], cid: str) -> None:
    assert entry["messageCid"] == cid
    assert entry["result"] == "Invalid"
    assert entry["code"] and entry["reason"]


def test_sync_summary_json_verbose_and_status_name_what_did_not_apply(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    for i in range(3):
        run_json(capsys, a, "write", "--data", f"note {i}")
    forged = _forge(a, did)

    # A pushes to B's node: B refuses the forged message; A's summary says which and why.
    with serving(b) as node:
        code, out, err = run(capsys, a, "sync", node.url, "--push")
        assert code == 0, err
        assert "1 message(s) did not apply:" in out
        line = next(x for x in out.splitlines() if forged in x)
        assert "Invalid at the peer" in line, out
        reason = line.split("): ", 1)[1]

        # B's status (the node's status file) lists it too, with the code and the reason.
        deadline = time.monotonic() + STARTUP_DEADLINE
        while True:
            report = run_json(capsys, b, "status", "--json")
            if (report.get("notApplied") or {}).get("count", 0) >= 1:
                break
            assert time.monotonic() < deadline, report
            time.sleep(0.2)
        assert report["notApplied"]["count"] == 1
        entry = report["notApplied"]["last"][0]
        _shown(entry, forged)
        assert entry["where"] == "here" and entry["reason"] == reason
        code, out, _ = run(capsys, b, "status")
        assert code == 0
        assert "1 message(s) did not apply:" in out
        assert f"{forged}: Invalid ({entry['code']}): {reason}" in out

    # With no node running, `status` shows the list the store keeps.
    report = run_json(capsys, b, "status", "--json")
    assert report["node"] is None and report["notApplied"]["last"] == [entry]

    # Restarted, B's node still names it: an Invalid message settled its token and will never
    # be offered again, so the store keeps the list. Read, it is cleared through the node.
    with serving(b):
        report = run_json(capsys, b, "status", "--json")
        assert report["notApplied"]["count"] == 1
        assert report["notApplied"]["last"][0] == entry
        assert run_json(capsys, b, "status", "--clear-not-applied", "--json") == {"cleared": 1}
        report = run_json(capsys, b, "status", "--json")  # the node wrote its status file since
        assert report["node"] is not None and report["notApplied"] == {"count": 0, "last": []}
        code, out, _ = run(capsys, b, "status")
        assert code == 0 and "did not apply" not in out
    report = run_json(capsys, b, "status", "--json")
    assert report["node"] is None and report["notApplied"] == {"count": 0, "last": []}

    # B pulls from A (--json), and a third device with -v: each summary names it, and -v
    # logs a line for it. (Invalid settles: a link is shown it once.)
    c = tmp_path / "c"
    assert run(capsys, c, "init", "--import-key", str(a / "identity.json"))[0] == 0
    with serving(a) as source:
        summary = run_json(capsys, b, "sync", source.url, "--json")
        assert summary["pull"]["not_applied"]["count"] == 1
        _shown(summary["pull"]["not_applied"]["last"][0], forged)
        assert summary["pull"]["not_applied"]["last"][0]["reason"] == reason
        code, out, err = run(capsys, c, "sync", source.url, "-v")
        assert code == 0, err
        assert "1 message(s) did not apply:" in out
        assert f"{forged}: Invalid ({entry['code']}): {reason}" in out
        logged = [x for x in err.splitlines() if forged in x]
        assert logged and all("did not apply" in x and reason in x for x in logged), err


def test_not_applied_log_keeps_the_last_ones_and_counts_all() -> None:
    log = NotAppliedLog()
    for i in range(MAX_NOT_APPLIED + 5):
        entry = NotApplied.of(f"cid{i}", "did:x", {"kind": "Invalid", "reason": f"SomeCode: reason {i}"})
        assert entry is not None and entry.code == "SomeCode"
        log.add(entry)
    assert log.count == MAX_NOT_APPLIED + 5
    assert [e.message_cid for e in log.last] == [f"cid{i}" for i in range(5, MAX_NOT_APPLIED + 5)]
    assert log.lines()[0] == f"{MAX_NOT_APPLIED + 5} message(s) did not apply (the last {MAX_NOT_APPLIED}:)"
    missing = NotApplied.of("cidm", "did:x", {"kind": "Incomplete", "missing": [
        {"type": "InitialWrite", "recordId": "r1", "messageCid": "r1"}]})
    assert missing is not None and missing.code == "DependencyMissing" and "InitialWrite (recordId r1" in missing.reason
    assert NotApplied.of("c", "did:x", {"kind": "Applied"}) is None
    log.add(missing)
    log.add(missing)  # offered again: listed once, counted once
    assert log.count == MAX_NOT_APPLIED + 6 and [e.message_cid for e in log.last].count("cidm") == 1
    assert json.loads(json.dumps(log.to_json()))["count"] == MAX_NOT_APPLIED + 6


def test_the_store_keeps_the_not_applied_log(tmp_path: Path) -> None:
    """A peer reopened over its store starts from the list it left (written with the commit
    that follows each entry), and a row it cannot read is skipped, not fatal."""
    store = Store(tmp_path / "s.db")
    records = NotAppliedRecords(store)
    assert records.load() == NotAppliedLog()
    log = records.load()
    for i in range(MAX_NOT_APPLIED + 2):
        entry = NotApplied.of(f"cid{i}", "did:x", {"kind": "Invalid", "reason": f"SomeCode: reason {i}"},
                              where="peer" if i % 2 else "here", peer="store-b" if i % 2 else None)
        assert entry is not None
        log.add(entry)
    records.save(log)
    again = NotAppliedRecords(store).load()
    assert again == log and again.count == MAX_NOT_APPLIED + 2
    store.conn.execute("UPDATE peer_not_applied SET body='{not json' WHERE position=0")
    store.conn.execute("UPDATE peer_not_applied SET body='{\"messageCid\": 7}' WHERE position=1")
    damaged = NotAppliedRecords(store).load()
    assert damaged.last == log.last[2:] and damaged.count == log.count
    assert list(again.overflow) == [("cid0", "here"), ("cid1", "peer")] and again.overflow[("cid1", "peer")] == (
        "did:x", "store-b")
    store.conn.execute("UPDATE peer_meta SET value=? WHERE key='notAppliedOverflow'",
                       ('[["x", "here", "did:x", null], 5, ["y", "nowhere", "did:x", null], ["z", "peer", 7, null]]',))
    assert NotAppliedRecords(store).load().overflow == {("x", "here"): ("did:x", None)}
    store.close()


def test_a_listed_message_that_applies_later_leaves_the_log() -> None:
    """`settle`: a message received here leaves the list (and the count) whichever peer gave it;
    one refused at a peer leaves only when that peer takes it; the listeners hear of it."""
    log = NotAppliedLog()
    heard: list[int] = []
    log.listeners.append(lambda: heard.append(log.count))

    def entry(cid: str, where: Literal["here", "peer"], peer: str) -> NotApplied:
        made = NotApplied.of(cid, "did:x", {"kind": "Incomplete", "missing": []}, where=where, peer=peer)
        assert made is not None
        return made

    log.add(entry("here1", "here", "store-a"))
    log.add(entry("there1", "peer", "store-b"))
    log.add(entry("there2", "peer", "store-b"))
    heard.clear()
    log.settle("unlisted")
    log.settle("there1")  # received here? no: it did not apply at store-b
    log.settle("there1", "peer", "store-c")  # another peer took it: store-b still lacks it
    assert (log.count, heard) == (3, [])
    log.settle("here1")  # applied here, given by another peer than store-a
    log.settle("there1", "peer", "store-b")
    assert [e.message_cid for e in log.last] == ["there2"] and log.count == 1
    assert heard == [2, 1]
    assert log.lines() == ["1 message(s) did not apply:", f"  {log.last[0].line()}"]
    # Past the list's length a message is remembered by CID, so it still leaves the count.
    for i in range(MAX_NOT_APPLIED + 3):
        log.add(entry(f"more{i}", "here", "store-a"))
    assert log.count == MAX_NOT_APPLIED + 4
    assert list(log.overflow) == [("there2", "peer"), ("more0", "here"), ("more1", "here"), ("more2", "here")]
    log.settle(f"more{MAX_NOT_APPLIED + 2}")  # listed
    log.settle("more0")  # remembered
    log.settle("there2", "peer", "store-c")  # another peer took it: still counted
    assert log.count == MAX_NOT_APPLIED + 2 and len(log.last) == MAX_NOT_APPLIED - 1
    log.settle("there2", "peer", "store-b")
    log.add(entry("more1", "here", "store-a"))  # offered again after it left the list: counted once
    assert log.count == MAX_NOT_APPLIED + 1 and log.last[-1].message_cid == "more1"
    assert list(log.overflow) == [("more2", "here")]
    # The remembered ones are bounded; older ones stay counted until the list is cleared.
    for i in range(MAX_NOT_APPLIED_TRACKED + MAX_NOT_APPLIED):
        log.add(entry(f"flood{i}", "here", "store-a"))
    assert len(log.overflow) == MAX_NOT_APPLIED_TRACKED and ("more2", "here") not in log.overflow
    assert log.count == MAX_NOT_APPLIED + 1 + MAX_NOT_APPLIED_TRACKED + MAX_NOT_APPLIED
    log.clear()
    assert (log.count, log.last, log.overflow) == (0, [], {})


def test_a_peer_drops_what_its_store_holds_now_from_the_log_it_left(tmp_path: Path) -> None:
    """A message listed by an earlier run that the store holds now (it applied by another path
    meanwhile: a repair, another process) is no longer listed when a peer opens the store; one
    still missing stays."""
    alice = seeded("not-applied-alice")
    store = Store(tmp_path / "s.db")
    write = RecordsWrite.create(signer=alice, data=b"held now", schema="https://example.com/note",
                                data_format="text/plain")
    assert Dwn(store).process_message(alice.did, write.message, b"held now").code == 202
    log = NotAppliedLog()
    for cid in (message_cid(write.message), "bafyreinotheld"):
        made = NotApplied.of(cid, alice.did, {"kind": "Incomplete", "missing": []}, peer="store-b")
        assert made is not None
        log.add(made)
    NotAppliedRecords(store).save(log)
    peer = Peer(store, alice)
    assert [e.message_cid for e in peer.not_applied.last] == ["bafyreinotheld"] and peer.not_applied.count == 1
    assert [e.message_cid for e in NotAppliedRecords(store).load().last] == ["bafyreinotheld"]
    # The same for one that had left the named list for newer ones.
    log = NotAppliedLog()
    for cid in [message_cid(write.message)] + [f"bafyreinotheld{i}" for i in range(MAX_NOT_APPLIED)]:
        made = NotApplied.of(cid, alice.did, {"kind": "Incomplete", "missing": []}, peer="store-b")
        assert made is not None
        log.add(made)
    assert list(log.overflow) == [(message_cid(write.message), "here")] and log.count == MAX_NOT_APPLIED + 1
    NotAppliedRecords(store).save(log)
    peer = Peer(store, alice)
    assert peer.not_applied.overflow == {} and peer.not_applied.count == MAX_NOT_APPLIED
    assert NotAppliedRecords(store).load().count == MAX_NOT_APPLIED
    store.close()
