"""Subset scopes from the command line (issue #18, docs/scopes.md): ``sync --protocol P
--path-prefix X --context-prefix C``, the refusals of a scope that cannot be, each scope its own
link and checkpoints, and ``status`` showing a subset scope and why a link is ``repairing``.

The serving node is a real ``p2psync serve`` process (tests/test_cli_sync.py); the syncing
node runs ``p2psync.cli.main`` in this process, with real stores.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from p2psync.cli import build_parser, main
from p2psync.cli.common import EXIT_USAGE
from p2psync.cli.home import Home
from p2psync.cli.sync import scope_of, scope_of_args
from p2psync.demo import NOTES_PROTOCOL
from p2psync.dwn.store import Store
from p2psync.node.browse import peers_lines
from p2psync.node.config import load_config
from p2psync.node.links import scope_name, scope_text
from p2psync.replication.scope import SyncScope
from p2psync.state.ledger import Direction, Ledger, LinkState
from tests.test_cli_sync import digest, run, run_json, serving, two_devices

NOTES = NOTES_PROTOCOL["protocol"]
NOTE_SCHEMA = NOTES_PROTOCOL["types"]["note"]["schema"]
CID = "bafyreidckx6jebn36nittnfxu5k4ezbfyhihq3zigwehjllqbgxtzhdtsy"


def _note(capsys: pytest.CaptureFixture[str], home: Path, text: str) -> dict[str, Any]:
    out: dict[str, Any] = run_json(capsys, home, "write", "--data", text, "--data-format", "text/plain",
                                   "--protocol", NOTES, "--protocol-path", "note", "--schema", NOTE_SCHEMA)
    return out


def _attachment(capsys: pytest.CaptureFixture[str], home: Path, note: dict[str, Any], text: str) -> dict[str, Any]:
    out: dict[str, Any] = run_json(capsys, home, "write", "--data", text, "--protocol", NOTES,
                                   "--protocol-path", "note/attachment", "--parent-context-id", note["contextId"])
    return out


def _held(capsys: pytest.CaptureFixture[str], home: Path) -> set[str]:
    """The recordIds of the notes protocol this replica holds."""
    return {r["recordId"] for r in run_json(capsys, home, "query", "--protocol", NOTES, "--json")}


def _link(capsys: pytest.CaptureFixture[str], home: Path, scope: SyncScope) -> dict[str, Any]:
    [link] = [x for x in run_json(capsys, home, "status", "--json")["links"] if x["scopeId"] == scope.scope_id]
    return link


# --------------------------------------------------------------------------- the flags


def test_scope_flags_canonicalize_and_refuse_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Canonical: a covered prefix and the order do not make another scope; no prefix is the
    # protocol scope; the protocol URL is normalized.
    assert scope_of(NOTES, ["note/attachment", "note"]) == SyncScope.subset(NOTES, ["note"])
    assert scope_of(NOTES, ["b", "a"]).scope_id == scope_of(NOTES, ["a", "b", "a"]).scope_id
    assert scope_of(NOTES) == SyncScope.for_protocol(NOTES) and scope_of(None) == SyncScope.global_scope()
    assert scope_of(NOTES, (), [CID]) == SyncScope.subset(NOTES, (), [CID])
    assert scope_of("p2psync.example/x", ["a"]).protocol == "http://p2psync.example/x"

    home = tmp_path / "a"
    assert run(capsys, home, "init")[0] == 0
    url = "ws://127.0.0.1:1/_p2psync"
    for argv, says in (
        (["--path-prefix", "note"], "--path-prefix needs --protocol"),
        (["--context-prefix", CID], "--context-prefix needs --protocol"),
        (["--path-prefix", "note", "--context-prefix", CID], "--path-prefix and --context-prefix need --protocol"),
        (["--protocol", NOTES, "--path-prefix", "note", "--repair"], "--repair reconciles a whole tenant or one"),
    ):
        code, out, err = run(capsys, home, "sync", url, *argv)
        assert code == EXIT_USAGE and out == "" and err.count("\n") == 1 and says in err, (argv, err)
    for argv, says in (
        (["--path-prefix", "note//attachment"], "--path-prefix 'note//attachment': SyncScopeInvalid: "
         "protocolPathPrefixes entry 'note//attachment' has an empty segment"),
        (["--path-prefix", "note/"], "SyncScopeInvalid: protocolPathPrefixes entry 'note/' has an empty segment"),
        (["--path-prefix", ""], "--path-prefix '': SyncScopeInvalid: each of protocolPathPrefixes must be"),
        (["--context-prefix", f"{CID}/thread"], f"--context-prefix '{CID}/thread': SyncScopeInvalid: "
         "contextIdPrefixes entry"),
        (["--context-prefix", "thread"], "'thread' is not a recordId (CID)"),
    ):
        code, out, err = run(capsys, home, "sync", url, "--protocol", NOTES, *argv)
        assert code == 1 and out == "" and err.count("\n") == 1 and says in err, (argv, err)
        assert "Traceback" not in err


# --------------------------------------------------------------------------- end to end


def test_subset_sync_holds_its_closure_and_keeps_its_own_checkpoints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    proto = tmp_path / "notes.json"
    proto.write_text(json.dumps(NOTES_PROTOCOL))
    assert run(capsys, a, "protocol", "install", str(proto))[0] == 0
    first = _note(capsys, a, "first note")
    attached = _attachment(capsys, a, first, "an attachment")
    second = _note(capsys, a, "second note")
    plain = run_json(capsys, a, "write", "--data", "outside any protocol", "--data-format", "text/plain")
    attachments = SyncScope.subset(NOTES, ["note/attachment"])
    notes = SyncScope.subset(NOTES, ["note"])

    with serving(a) as served:
        # Only the attachment is in scope; the protocol is listed as the scope's metadata, and the
        # parent note comes as the attachment's closure.
        code, out, err = run(capsys, b, "sync", served.url, "--protocol", NOTES, "--path-prefix", "note/attachment",
                             "--json")
        assert code == 0, err
        summary = json.loads(out)
        assert summary["scope"] == attachments.to_wire() and summary["scopeId"] == attachments.scope_id
        assert summary["pull"]["revs_applied"] == 2 and summary["pull"]["dependencies_fetched"] == 1
        assert _held(capsys, b) == {first["recordId"], attached["recordId"]}  # not the second note
        assert digest(capsys, b)[did]["messages"] == 3  # configure, note, attachment: nothing else

        # The status names the scope readably, with its scopeId.
        link = _link(capsys, b, attachments)
        assert link["scope"] == attachments.to_wire() and link["replicationState"] == "live"
        assert "repair" not in link
        frontier = link["frontier"]["pull"]
        code, out, _ = run(capsys, b, "status")
        assert code == 0
        assert f"scope protocol {NOTES} (paths: note/attachment) [{attachments.scope_id}]" in out

        # Again: resumed from its checkpoint, nothing moves.
        code, out, err = run(capsys, b, "sync", served.url, "--protocol", NOTES, "--path-prefix", "note/attachment")
        assert code == 0, err
        assert f"  scope protocol {NOTES} (paths: note/attachment) [{attachments.scope_id}]" in out.splitlines()
        assert "pulled 0 message(s)" in out and f"position {frontier}" in out

        # Another subset of the same tenant and peer is another link: it starts from nothing,
        # and its sync does not move the first one's checkpoint.
        third = _note(capsys, a, "third note")
        summary = run_json(capsys, b, "sync", served.url, "--protocol", NOTES, "--path-prefix", "note", "--json")
        assert summary["scopeId"] == notes.scope_id
        assert summary["pull"]["revs_applied"] == 2  # the second and third notes; the first is held
        assert _held(capsys, b) == {first["recordId"], attached["recordId"], second["recordId"], third["recordId"]}
        assert _link(capsys, b, attachments)["frontier"]["pull"] == frontier
        assert _link(capsys, b, notes)["frontier"]["pull"] > frontier
        status = run_json(capsys, b, "status", "--json")
        assert len({x["scopeId"] for x in status["links"]}) == len(status["links"]) == 2

        # The first subset resumes where it stopped: the third note is not in it.
        summary = run_json(capsys, b, "sync", served.url, "--protocol", NOTES, "--path-prefix", "note/attachment",
                           "--json")
        assert summary["pull"]["revs_applied"] == 0
        assert _link(capsys, b, attachments)["frontier"]["pull"] == _link(capsys, b, notes)["frontier"]["pull"]

        # A later full sync moves only the rest: the plain write.
        summary = run_json(capsys, b, "sync", served.url, "--json")
        assert summary["scope"] == {"kind": "global"} and summary["pull"]["revs_applied"] == 1
        assert digest(capsys, b) == digest(capsys, a)
        assert any(r["recordId"] == plain["recordId"] for r in run_json(capsys, b, "query", "--json"))


# --------------------------------------------------------------------------- status


def test_status_shows_why_a_link_is_repairing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "a"
    assert run(capsys, home, "init")[0] == 0
    did = run(capsys, home, "whoami")[1].strip()
    scope = SyncScope.subset(NOTES, ["note/attachment"], [CID])
    remote = f"{did}?storeId=0f1e2d3c"
    detail = f"root {CID} lacks its parent bafyreiparent (not held by the source)"
    store = Store(Home(home).store_path)
    try:
        ledger = Ledger.for_store(store)
        key = ledger.open_link(did, remote, scope).key
        ledger.transition(key, LinkState.REPAIRING, reason=detail, direction=Direction.PULL,
                          error_code="ClosureParentChainMissing")
        healthy = ledger.open_link(did, remote, SyncScope.global_scope()).key
        ledger.transition(healthy, LinkState.LIVE, reason="caught_up")
    finally:
        store.close()

    report = run_json(capsys, home, "status", "--json")
    repairing, live = report["links"]
    assert repairing["replicationState"] == "repairing" and live["replicationState"] == "live"
    assert repairing["repair"]["errorCode"] == "ClosureParentChainMissing"
    assert repairing["repair"]["reason"] == detail and repairing["repair"]["direction"] == "pull"
    assert repairing["repair"]["since"].endswith("Z")
    assert "repair" not in live
    code, out, _ = run(capsys, home, "status")
    assert code == 0
    assert (f"  scope protocol {NOTES} (paths: note/attachment; contexts: {CID}) [{scope.scope_id}], "
            "state idle; the last round left it repairing") in out
    assert f"  repairing: ClosureParentChainMissing (pull) since {repairing['repair']['since']}: {detail}" in out
    assert out.count("repairing:") == 1


def _tenant_active(home: Path, did: str, active: bool) -> None:
    store = Store(Home(home).store_path)
    try:
        store.tenant_id(did)
        store.set_tenant_active(did, active)
    finally:
        store.close()


def test_a_sync_that_leaves_its_link_repairing_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real round left repairing: b does not serve the tenant now (its engine answers
    Deferred), so the link is repairing with the code its ledger logged and its checkpoint does
    not move; once the tenant is served again the next round heals it."""
    a, b, did = two_devices(tmp_path, capsys)
    run_json(capsys, a, "write", "--data", "a note", "--data-format", "text/plain")
    _tenant_active(b, did, False)
    with serving(a) as served:
        code, out, err = run(capsys, b, "sync", served.url)
        assert code == 0, err
        assert "  pull checkpoint: at the start" in out
        [last] = [x for x in out.splitlines() if x.startswith("link left repairing")]
        assert "link left repairing: Deferred (pull) since " in last and last.endswith("(`p2psync status` shows it)")
        [link] = run_json(capsys, b, "status", "--json")["links"]
        assert link["replicationState"] == "repairing" and link["frontier"]["pull"] is None
        assert (link["repair"]["errorCode"], link["repair"]["direction"]) == ("Deferred", "pull")
        code, out, _ = run(capsys, b, "status")
        assert f"  repairing: Deferred (pull) since {link['repair']['since']}: {link['repair']['reason']}" in out

        _tenant_active(b, did, True)
        summary = run_json(capsys, b, "sync", served.url, "--json")
        assert summary["state"] == "live" and "repair" not in summary
        [link] = run_json(capsys, b, "status", "--json")["links"]
        assert link["replicationState"] == "live" and "repair" not in link and link["frontier"]["pull"] is not None
        assert digest(capsys, b) == digest(capsys, a)


def test_a_running_node_shows_a_subset_link_readably() -> None:
    scope = SyncScope.subset(NOTES, ["note"])
    assert scope_text(scope) == f"protocol {NOTES} (paths: note)"
    assert scope_text(SyncScope.for_protocol(NOTES)) == f"protocol {NOTES}"
    assert scope_text({"kind": "global"}) == "global"
    # Log lines and `serve` keep the short names, and give a subset its prefixes and scopeId.
    assert scope_name(SyncScope.global_scope()) == "global" and scope_name(SyncScope.for_protocol(NOTES)) == NOTES
    assert scope_name(scope) == f"protocol {NOTES} (paths: note) [{scope.scope_id}]"
    status = {"pid": 1, "url": "ws://127.0.0.1:1/_p2psync", "peers": [], "links": [{
        "peer": "url:x", "tenant": "did:key:z6Mkx", "scope": scope.scope_id, "scopeName": scope_name(scope),
        "scopeId": scope.scope_id, "direction": "pull", "state": "live", "failures": 0,
        "antiEntropy": {"enabled": False, "offReason": "not for a subset scope"}}]}
    lines = peers_lines([], status, 1.0)
    assert f"  link url:x: did:key:z6Mkx (protocol {NOTES} (paths: note) [{scope.scope_id}], pull), live" in lines
    assert "    anti-entropy off (not for a subset scope)" in lines


def test_main_exits_2_on_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--home", str(tmp_path), "sync", "ws://127.0.0.1:1/", "--context-prefix", CID])
    assert code == EXIT_USAGE and "needs --protocol" in capsys.readouterr().err


# --------------------------------------------------------------------------- docs/scopes.md

DOC = Path(__file__).resolve().parents[1] / "docs" / "scopes.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_documented_commands_and_configuration_are_what_the_code_takes(tmp_path: Path) -> None:
    commands = [shlex.split(line) for block in _blocks("sh") for line in block.replace("\\\n", " ").splitlines()
                if line.startswith("p2psync ")]
    assert len(commands) == 3
    for argv in commands:
        args = build_parser().parse_args(argv[1:])
        assert scope_of_args(args).kind == "subset", argv
    [toml] = _blocks("toml")
    path = tmp_path / "node.toml"
    path.write_text(toml)
    [tenant] = load_config(path, env={}).tenants
    assert [s.kind for s in tenant.scopes] == ["protocol", "subset", "subset"]
    # The scopeIds the page shows are the ones computed.
    chat = "https://example.org/protocols/chat"
    text = DOC.read_text()
    for scope in (SyncScope.global_scope(), SyncScope.for_protocol(chat), SyncScope.subset(chat, ["thread"]),
                  SyncScope.subset(chat, ["thread/message"]), tenant.scopes[1]):
        assert scope.scope_id in text, scope
    for shown in set(re.findall(r"bafyrei[a-z2-7]{52}", text)) - {CID}:
        assert shown in {s.scope_id for s in (SyncScope.global_scope(), SyncScope.for_protocol(chat),
                                              SyncScope.subset(chat, ["thread"]),
                                              SyncScope.subset(chat, ["thread/message"]))}, shown


def test_the_summary_counts_what_a_reconciliation_moved() -> None:
    """A first sync of replicas that share most messages reconciles instead of replaying: what
    it fetched is counted as pulled (it used to say "pulled 0 message(s), 1 new")."""
    from p2psync.cli.sync import summary_lines
    from p2psync.replication.stats import SyncStats, SyncSummary

    stats = SyncStats(revs_received=2, bytes_received=3000)
    stats.revs_applied = 2
    stats.count_reconciled({"Applied": 1})
    lines = summary_lines(SyncSummary("did:example:t", "did:example:r", stats, None, {}, None), 1.0)
    assert lines[1].startswith("pulled 3 message(s), 3 new, 0 already held;"), lines
    assert "1 by set reconciliation" in lines[1]
