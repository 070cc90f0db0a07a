"""``p2psync diff`` and ``p2psync sync --repair`` as a person uses them (issue #14 point 3).

As in tests/test_cli_sync.py, the serving node is a real ``p2psync serve`` process on
127.0.0.1 and the other node runs ``p2psync.cli.main`` in this process, with real stores: two
devices of one tenant share a history (a log sync), then each gets writes of its own.
"""

from __future__ import annotations

import json
import queue
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from p2psync.cli.home import Home
from p2psync.demo import NOTES_PROTOCOL
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from tests.peer.support import Clock, seeded, served
from tests.peer.support import write_notes as store_notes
from tests.test_cli_sync import digest, free_port, run, run_json, serving, two_devices, write_notes

PROTOCOL = NOTES_PROTOCOL["protocol"]


def plain_writes(capsys: pytest.CaptureFixture[str], home: Path, tag: str, n: int) -> dict[str, str]:
    """n plain notes on ``home``: {messageCid: recordId}."""
    out = {}
    for i in range(n):
        written = run_json(capsys, home, "write", "--data", f"{tag} {i}", "--data-format", "text/plain")
        out[written["messageCid"]] = written["recordId"]
    return out


def diverged(tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, a: Path, b: Path,
             only_a: int, only_b: int) -> tuple[dict[str, str], dict[str, str]]:
    """b pulls a's history from ``url``; then ``only_a`` notes on a and ``only_b`` on b."""
    plain_writes(capsys, a, "common", 3)
    code, _, err = run(capsys, b, "sync", url)
    assert code == 0, err
    assert digest(capsys, a) == digest(capsys, b)
    return plain_writes(capsys, a, "a only", only_a), plain_writes(capsys, b, "b only", only_b)


def message_lines(out: str) -> dict[str, tuple[str, ...]]:
    """diff's lines about messages: {CID: (side, kind, recordId, protocol)}; each names the
    message's timestamp (a write's dateModified) before its CID."""
    rows = {}
    for line in out.splitlines()[1:]:
        side, rest = line[:13].strip(), line[13:].split()
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", rest[-2]), line
        rows[rest[-1]] = (side, *rest[:-2])
    return rows


# --------------------------------------------------------------------------- diff, then repair


def test_diff_names_the_missing_messages_then_sync_repair_moves_exactly_those(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    with serving(a) as served:
        a_new, b_new = diverged(tmp_path, capsys, served.url, a, b, 5, 7)
        before = digest(capsys, a), digest(capsys, b)

        code, out, err = run(capsys, b, "diff", served.url)
        assert code == 3 and err == ""
        first = out.splitlines()[0]
        assert first.startswith("you lack 5, they lack 7 of 10 here / 8 there (")
        assert "round trip" in first and " bytes)" in first
        rows = message_lines(out)
        assert rows == {**{cid: ("you lack", "RecordsWrite", rid, "-") for cid, rid in a_new.items()},
                        **{cid: ("they lack", "RecordsWrite", rid, "-") for cid, rid in b_new.items()}}
        assert out.count("\n") == 1 + 5 + 7

        code, out, err = run(capsys, b, "diff", served.url, "--json")
        assert code == 3 and err == ""
        summary = json.loads(out)
        assert summary["tenant"] == did and summary["remote"] == f"{did}?storeId={served.store_id}"
        assert summary["scope"] == {"kind": "global"} and summary["equal"] is False
        assert (summary["youLack"], summary["theyLack"]) == (5, 7)
        assert (summary["localCount"], summary["remoteCount"]) == (10, 8)
        assert [d["cid"] for d in summary["remoteOnly"]] == sorted(a_new)
        assert [d["cid"] for d in summary["localOnly"]] == sorted(b_new)
        assert {d["cid"]: d["recordId"] for d in summary["remoteOnly"] + summary["localOnly"]} == {**a_new, **b_new}
        assert all(d["kind"] == "RecordsWrite" and "protocol" not in d and "messageTimestamp" in d
                   for d in summary["remoteOnly"] + summary["localOnly"])
        assert 1 <= summary["roundTrips"] <= 2 and 0 < summary["bytes"] < 4096
        assert "fetched" not in summary and "pushed" not in summary
        assert (digest(capsys, a), digest(capsys, b)) == before  # diff changed nothing

        code, out, err = run(capsys, b, "sync", served.url, "--repair", "--both", "--json")
        assert code == 0, err
        repaired = json.loads(out)
        assert repaired["equal"] is True and "unresolved" not in repaired
        assert repaired["fetched"]["counts"] == {"applied": 5} and repaired["fetched"]["stored"] == 5
        assert repaired["pushed"] == {"Applied": 7}
        assert (repaired["youLack"], repaired["theyLack"]) == (5, 7)
        assert repaired["roundTrips"] >= 2 and repaired["bytes"] > 0

        assert digest(capsys, a) == digest(capsys, b)
        assert digest(capsys, a)[did]["messages"] == 3 + 5 + 7
        code, out, err = run(capsys, b, "diff", served.url)
        assert code == 0 and err == ""
        assert out.startswith("equal: 15 messages each (1 round trip, ") and out.count("\n") == 1
        assert json.loads(run(capsys, b, "diff", served.url, "--json")[1])["equal"] is True

        # Both nodes' sketches took the moved messages as changes: a new difference decodes at
        # the first attempt, with the right counts.
        late = plain_writes(capsys, a, "late", 1)
        code, out, _ = run(capsys, b, "diff", served.url, "--json")
        after = json.loads(out)
        assert code == 3 and after["attempts"] == 1
        assert (after["localCount"], after["remoteCount"], after["youLack"], after["theyLack"]) == (15, 16, 1, 0)
        assert [d["cid"] for d in after["remoteOnly"]] == list(late)
        assert run(capsys, b, "sync", served.url, "--repair")[0] == 0

        # Once equal, a repair moves nothing and says so.
        code, out, err = run(capsys, b, "sync", served.url, "--repair", "--both")
        assert code == 0, err
        assert "nothing to repair: 16 messages each" in out and "equal now: 16 messages each" in out
        assert "fetched" not in out and "took" not in out


def test_sync_repair_human_summary_progress_and_one_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    with serving(a) as served:
        a_new, _ = diverged(tmp_path, capsys, served.url, a, b, 4, 0)

        # Default direction, as sync's: pull. Only b lacks something, so that makes them equal.
        code, out, err = run(capsys, b, "sync", served.url, "--repair", "--progress")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0] == f"tenant {did} with {did}?storeId={served.store_id}"
        assert lines[1] == "you lacked 4, they lacked 0 of 3 here / 7 there"
        assert lines[2].startswith("fetched 4 messages: 4 applied; 4 stored, ")
        assert lines[3].startswith("reconciliation: ") and "round trips" in lines[3]
        assert lines[4] == "equal now: 7 messages each"
        assert " msg" in err and "Traceback" not in err  # the forced bar went to stderr
        assert digest(capsys, a) == digest(capsys, b)

        # Now b holds two a lacks: a pull-only repair has nothing to do in its direction; it
        # is done (exit 0) and says the replicas are not equal, and what would move the rest.
        b_new = plain_writes(capsys, b, "b late", 2)
        code, out, err = run(capsys, b, "sync", served.url, "--repair")
        assert code == 0 and err == ""
        assert "handed over nothing: --pull does not hand over the 2 messages they lack (use --both)" in out
        assert out.splitlines()[-1] == "done one way, not equal: they still lack 2 messages (--both moves them)"
        assert json.loads(run(capsys, b, "sync", served.url, "--repair", "--json")[1])["equal"] is False
        assert not set(b_new) & set(_cids(capsys, a, did))

        code, out, err = run(capsys, b, "sync", served.url, "--repair", "--push")
        assert code == 0, err
        assert "handed over 2 messages: the peer took 2 (2 Applied)" in out and "equal now: 9 messages each" in out
        assert digest(capsys, a) == digest(capsys, b)
    assert set(a_new) <= set(_cids(capsys, b, did))


def _cids(capsys: pytest.CaptureFixture[str], home: Path, did: str) -> list[str]:
    """The message CIDs of the records ``home`` holds of its own tenant ``did`` (``query``)."""
    records: list[dict[str, Any]] = run_json(capsys, home, "query", "--json", "--tenant", did)
    return [str(r.get("messageCid")) for r in records]


@contextmanager
def serving_in_a_thread(peer: Peer) -> Iterator[str]:
    """``peer`` served on 127.0.0.1 by a trio loop of its own (for a peer ``serve`` cannot
    configure); yields its URL."""
    urls: queue.Queue[str] = queue.Queue()
    stop = threading.Event()

    async def serve() -> None:
        async with served(peer) as url:
            urls.put(url)
            while not stop.is_set():
                await trio.sleep(0.02)

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    try:
        yield urls.get(timeout=30)
    finally:
        stop.set()
        thread.join(timeout=30)


def test_a_difference_the_repair_cannot_mend_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A peer that takes no pushes: what it lacks stays, whatever --both asks.
    alice = seeded("cli-anti-entropy")
    clock = Clock()
    a = Store(tmp_path / "a.db")
    store_notes(a, alice, 3, clock=clock, prefix="a")
    b = tmp_path / "b"
    Home(b).init(alice)
    store = Store(Home(b).store_path)
    store_notes(store, alice, 2, clock=clock, prefix="b")
    store.close()
    with serving_in_a_thread(Peer(a, alice, accept_push=False)) as url:
        code, out, err = run(capsys, b, "sync", url, "--repair", "--both")
        assert code == 3
        assert "fetched 3 messages: 3 applied" in out
        assert "handed over 2 messages: the peer took 0; 2 PushRefused" in out
        assert out.splitlines()[-1].startswith("still different: ")
        assert err.startswith("p2psync: the replicas still differ: ") and err.count("\n") == 1
        code, out, _ = run(capsys, b, "sync", url, "--repair", "--both", "--json")
        summary = json.loads(out)
        assert code == 3 and summary["equal"] is False and summary["unresolved"]
        assert summary["pushed"] == {"PushRefused": 2} and summary["youLack"] == 0
    a.close()


# --------------------------------------------------------------------------- protocol scope


def test_diff_and_repair_in_a_protocol_scope(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    # a: two plain notes, the notes protocol and one protocol note whose data travels apart.
    write_notes(capsys, a, tmp_path, "a", 2)
    with serving(a) as served:
        code, out, err = run(capsys, b, "diff", served.url, "--protocol", PROTOCOL, "--json")
        assert code == 3, err
        summary = json.loads(out)
        assert summary["scope"] == {"kind": "protocol", "protocol": PROTOCOL}
        assert (summary["youLack"], summary["theyLack"]) == (2, 0)  # the protocol and its note
        assert all(d.get("protocol") == PROTOCOL for d in summary["remoteOnly"])
        assert sorted(d["kind"] for d in summary["remoteOnly"]) == ["ProtocolsConfigure", "RecordsWrite"]
        whole = json.loads(run(capsys, b, "diff", served.url, "--json")[1])
        assert whole["youLack"] == summary["youLack"] + 2  # the plain notes are outside the scope

        code, out, err = run(capsys, b, "diff", served.url, "--protocol", PROTOCOL)
        assert code == 3 and all(row[3] == PROTOCOL for row in message_lines(out).values())

        code, out, err = run(capsys, b, "sync", served.url, "--repair", "--protocol", PROTOCOL)
        assert code == 0, err
        assert "fetched 2 messages: 2 applied" in out and "1 attachment fetched" in out
        assert "equal now: 2 messages each" in out
        code, out, _ = run(capsys, b, "diff", served.url, "--protocol", PROTOCOL)
        assert code == 0 and out.startswith("equal: ")
        code, out, _ = run(capsys, b, "diff", served.url)
        assert code == 3 and out.startswith("you lack 2, they lack 0 ")


# --------------------------------------------------------------------------- bad input


def one_line(code: int, out: str, err: str) -> str:
    assert code == 1 and out == "", (code, out, err)
    assert err.startswith("p2psync: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, other = tmp_path / "a", tmp_path / "other"
    assert run(capsys, a, "init")[0] == 0
    assert run(capsys, other, "init")[0] == 0
    tenant = run(capsys, a, "whoami")[1].strip()
    plain_writes(capsys, a, "a", 2)

    assert "is not a wss:// or ws:// URL" in one_line(*run(capsys, a, "diff", "http://127.0.0.1:1/"))
    assert "is not a wss:// or ws:// URL" in one_line(*run(capsys, a, "diff", "ws://127.0.0.1:port/_p2psync"))
    assert "is not a DID" in one_line(*run(capsys, a, "diff", "ws://127.0.0.1:1/", "--tenant", "alice"))
    assert "--protocol" in one_line(*run(capsys, a, "diff", "ws://127.0.0.1:1/", "--protocol", "not a url"))
    url = f"ws://127.0.0.1:{free_port()}/_p2psync"
    assert "cannot connect" in one_line(*run(capsys, a, "diff", url))
    assert "run `p2psync init` first" in one_line(*run(capsys, tmp_path / "nobody", "diff", url))
    err = one_line(*run(capsys, a, "sync", url, "--repair", "--continuous"))
    assert "cannot be combined with --continuous" in err
    assert "is not a wss:// or ws:// URL" in one_line(*run(capsys, a, "sync", "http://x/", "--repair"))

    with serving(a) as served:
        # A tenant neither node knows: the peer's refusal (no grant from it), one line.
        assert run(capsys, tmp_path / "c", "init")[0] == 0
        unknown = run(capsys, tmp_path / "c", "whoami")[1].strip()
        assert "403 SyncNotAuthorized" in one_line(*run(capsys, other, "diff", served.url, "--tenant", unknown))
        # Another DID may not compare a's tenant either, nor repair it.
        assert "403" in one_line(*run(capsys, other, "diff", served.url, "--tenant", tenant))
        assert "403" in one_line(*run(capsys, other, "sync", served.url, "--repair", "--tenant", tenant))
    assert digest(capsys, other) == {}
