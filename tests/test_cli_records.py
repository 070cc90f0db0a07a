"""A record's lifecycle through the CLI between two devices of one tenant (issue #16): write,
update, delete and prune replicate; concurrent updates converge on the newest, and ``show`` on
both devices marks the same write as lost.

Device a is a real ``p2psync serve`` process; device b runs the CLI in this process and syncs
with it over a real WebSocket (``sync --both``), as tests/test_cli_sync.py does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from p2psync.demo import NOTES_PROTOCOL
from tests.test_cli_sync import digest, run, run_json, serving, two_devices

NOTES = NOTES_PROTOCOL["protocol"]


def read(capsys: pytest.CaptureFixture[str], home: Path, record_id: str) -> str:
    code, out, err = run(capsys, home, "read", record_id)
    assert code == 0, err
    return out


def show(capsys: pytest.CaptureFixture[str], home: Path, record_id: str) -> dict[str, Any]:
    out: dict[str, Any] = run_json(capsys, home, "show", record_id, "--json")
    return out


def sync(capsys: pytest.CaptureFixture[str], home: Path, url: str) -> None:
    code, _, err = run(capsys, home, "sync", url, "--both")
    assert code == 0, err


def status_of(history: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    """{messageCid: (status, by)} of a ``show --json``."""
    return {m["messageCid"]: (m["status"], m.get("by")) for m in history["messages"]}


def test_update_delete_prune_and_a_conflict_replicate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    proto = tmp_path / "notes.json"
    proto.write_text(json.dumps(NOTES_PROTOCOL))
    assert run(capsys, a, "protocol", "install", str(proto))[0] == 0
    plain = run_json(capsys, a, "write", "--data", "v1", "--data-format", "text/plain", "--tag", "lang=en",
                     "--tag", "rank:=3")
    rid = plain["recordId"]
    note = run_json(capsys, a, "write", "--data", "a note", "--data-format", "text/plain", "--protocol", NOTES,
                    "--protocol-path", "note", "--schema", NOTES_PROTOCOL["types"]["note"]["schema"])
    attachment = run_json(capsys, a, "write", "--data", "bytes", "--protocol", NOTES,
                          "--protocol-path", "note/attachment", "--parent-context-id", note["contextId"])

    with serving(a) as served:
        url = served.url
        sync(capsys, b, url)
        assert read(capsys, b, rid) == "v1"
        assert {r["recordId"] for r in run_json(capsys, b, "query", "--json")} == {
            rid, note["recordId"], attachment["recordId"]}

        # An update on a replicates to b: same record, new data, tags kept.
        update = run_json(capsys, a, "update", rid, "--data", "v2")
        assert update["replaces"] == plain["messageCid"]
        sync(capsys, b, url)
        assert read(capsys, b, rid) == read(capsys, a, rid) == "v2"
        seen = show(capsys, b, rid)
        assert seen["state"] == "live" and seen["inForce"] == update["messageCid"]
        assert status_of(seen)[plain["messageCid"]] == ("superseded", update["messageCid"])
        assert all(m["origin"] == served.store_id for m in seen["messages"])  # all came from a
        assert show(capsys, a, rid)["messages"][-1]["origin"] is None  # written there

        # A metadata-only update from b (published, tags replaced) replicates to a.
        meta = run_json(capsys, b, "update", rid, "--keep-data", "--published", "--tag", "lang=fr")
        sync(capsys, b, url)
        assert show(capsys, a, rid)["inForce"] == meta["messageCid"]
        assert read(capsys, a, rid) == "v2"

        # A conflict: both update the record while apart; b's update is the newer one.
        mine = run_json(capsys, a, "update", rid, "--data", "from a")
        theirs = run_json(capsys, b, "update", rid, "--data", "from b")
        assert mine["dateModified"] < theirs["dateModified"]
        # diff names the record behind the difference, each side's update and its time.
        code, out, _ = run(capsys, b, "diff", url)
        assert code == 3 and out.startswith("you lack 1, they lack 1 ")
        rows = {line.split()[-1]: line for line in out.splitlines()[1:]}
        assert rid in rows[mine["messageCid"]] and mine["dateModified"] in rows[mine["messageCid"]]
        assert rows[mine["messageCid"]].split()[:3] == ["you", "lack", "RecordsWrite"]
        assert rid in rows[theirs["messageCid"]] and rows[theirs["messageCid"]].lstrip().startswith("they lack")
        sync(capsys, b, url)
        assert read(capsys, a, rid) == read(capsys, b, rid) == "from b"
        on_a, on_b = show(capsys, a, rid), show(capsys, b, rid)
        assert on_a["inForce"] == on_b["inForce"] == theirs["messageCid"]
        # Both devices tell the same history, and mark a's write lost to b's.
        assert status_of(on_a) == status_of(on_b)
        assert status_of(on_a)[mine["messageCid"]] == ("lost", theirs["messageCid"])
        assert status_of(on_a)[theirs["messageCid"]] == ("in-force", None)
        for home in (a, b):
            code, out, _ = run(capsys, home, "show", rid)
            assert code == 0
            [line] = [x for x in out.splitlines() if x.split()[1:2] == [mine["messageCid"]]]
            assert f"lost to {theirs['messageCid']}" in line and "another store's newer write won" in line

        # A delete replicates: the record reads 404 on both, and shows as deleted.
        deleted = run_json(capsys, a, "delete", rid)
        sync(capsys, b, url)
        for home in (a, b):
            code, _, err = run(capsys, home, "read", rid)
            assert code == 1 and "404" in err
            history = show(capsys, home, rid)
            assert history["state"] == "deleted" and history["inForce"] == deleted["messageCid"]
            assert rid not in {r["recordId"] for r in run_json(capsys, home, "query", "--json")}
            [gone] = [r for r in run_json(capsys, home, "query", "--json", "--include-deleted")
                      if r["recordId"] == rid]
            assert gone["state"] == "deleted" and gone["by"] == deleted["messageCid"]
        code, _, err = run(capsys, b, "update", rid, "--data", "too late")
        assert code == 1 and "was deleted by" in err and err.count("\n") == 1

        # A pruning delete of the note on b removes its attachment too, on both devices.
        pruned = run_json(capsys, b, "delete", note["recordId"], "--prune")
        assert pruned["prunedDescendants"] == 1
        sync(capsys, b, url)
        for home in (a, b):
            history = show(capsys, home, note["recordId"])
            assert history["state"] == "deleted" and history["prunedDescendants"] == 1
            child = show(capsys, home, attachment["recordId"])
            assert child["state"] == "pruned" and child["prunedBy"] == pruned["messageCid"]
            assert status_of(child)[attachment["messageCid"]] == ("pruned", pruned["messageCid"])
            assert run_json(capsys, home, "query", "--protocol", NOTES, "--json") == []
            listed = {r["recordId"]: r["state"] for r in
                      run_json(capsys, home, "query", "--protocol", NOTES, "--json", "--include-deleted")}
            assert listed == {note["recordId"]: "deleted", attachment["recordId"]: "pruned"}
        assert digest(capsys, a) == digest(capsys, b)
    assert did in digest(capsys, a)


def test_lifecycle_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "a"
    assert run(capsys, home, "init")[0] == 0
    rid = run_json(capsys, home, "write", "--data", "x")["recordId"]
    for argv, says in (
        (["update", "nope", "--data", "y"], "no record nope in this store"),
        (["delete", "nope"], "no record nope in this store"),
        (["show", "nope"], "`p2psync query --include-deleted` lists"),
        (["update", rid, "--data", "y", "--tag", "n:=[1,"], "is not JSON"),
        (["update", rid, "--data", "y", "--tag", "lonely"], "expected KEY=VALUE"),
        (["update", rid, "--data", "y", "--tag", "n:=null"], "a tag is a string, number, boolean or list"),
    ):
        code, out, err = run(capsys, home, *argv)
        assert code == 1 and out == "" and err.count("\n") == 1 and says in err, (argv, err)
    assert run_json(capsys, home, "delete", rid)["status"] == 202
    code, _, err = run(capsys, home, "delete", rid)
    assert code == 1 and "already deleted" in err
