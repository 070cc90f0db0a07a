"""A node configured with a subset scope (issue #18, docs/scopes.md): its link pulls the
in-scope records with their closure and nothing else, is its own ledger link, shows its scope
readably in the status file and ``status``, and runs no anti-entropy (reconciliation compares
a whole tenant's or one protocol's set, p2psync/state/sketches.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from p2psync.cli.sync import status_lines, status_report
from p2psync.demo import NOTES_PROTOCOL
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records_write import RecordsWrite
from p2psync.node.browse import anti_entropy_line
from p2psync.node.config import TenantConfig
from p2psync.replication.scope import SyncScope
from tests.node.support import free_port, make_node, until
from tests.peer.support import Clock, seeded, write_notes

ALICE = seeded("alice-node-scopes")
NOTES = NOTES_PROTOCOL["protocol"]
#: Anti-entropy as often as a test can see it: were it run on the subset link, it would fail.
FAST: dict[str, Any] = {"anti_entropy_interval": 0.2, "anti_entropy_jitter": 0.25, "anti_entropy_max_interval": 0.8}


def _write(dwn: Dwn, clock: Clock, path: str, text: str, parent: str | None = None) -> dict[str, Any]:
    now = clock.tick()
    data = text.encode()
    kind = path.rsplit("/", 1)[-1]
    write = RecordsWrite.create(signer=ALICE, data=data, protocol=NOTES, protocol_path=path,
                                schema=NOTES_PROTOCOL["types"][kind].get("schema"),
                                data_format=NOTES_PROTOCOL["types"][kind]["dataFormats"][0],
                                parent_context_id=parent, message_timestamp=now, date_created=now)
    reply = dwn.process_message(ALICE.did, write.message, data)
    assert reply.code == 202, reply.detail
    return write.message


async def test_a_subset_link_pulls_its_closure_only_and_says_so(tmp_path: Path) -> None:
    pa = free_port()
    a = make_node(tmp_path, "a", ALICE, port=pa)
    scope = SyncScope.subset(NOTES, ["note/attachment"])
    b = make_node(tmp_path, "b", ALICE, peers=[f"ws://127.0.0.1:{pa}/_p2psync"],
                  tenants=(TenantConfig(None, "pull", (scope,)),), **FAST)
    clock = Clock()
    dwn = Dwn(a.store)
    configure = ProtocolsConfigure.create(definition=NOTES_PROTOCOL, signer=ALICE, message_timestamp=clock.tick())
    assert dwn.process_message(ALICE.did, configure.message).code == 202
    note = _write(dwn, clock, "note", "a note")
    attachment = _write(dwn, clock, "note/attachment", "its attachment", parent=note["contextId"])
    _write(dwn, clock, "note", "another note, out of scope")
    write_notes(a.store, ALICE, 3, clock=clock, prefix="outside the protocol")

    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        await until(lambda: b.store.messages.count(ALICE.did) == 3)
        await until(lambda: [str(x.state) for x in b.peer.ledger.links()] == ["live"])
        await trio.sleep(1.0)  # several anti-entropy periods: none may run on this link
        held = {m["recordId"] for m in (b.store.messages.get(ALICE.did, c) for c in b.store.messages.cids(ALICE.did))
                if m is not None and "recordId" in m}
        assert held == {note["recordId"], attachment["recordId"]}  # + the configure: the closure
        [link] = b.peer.ledger.links()
        assert link.key.scope_id == scope.scope_id and link.scope == scope

        status = b.status()
        [shown] = status["links"]
        assert shown["scopeId"] == scope.scope_id and shown["scope"] == scope.scope_id  # the metrics label
        assert shown["scopeName"] == f"protocol {NOTES} (paths: note/attachment) [{scope.scope_id}]"
        assert shown["antiEntropy"]["enabled"] is False and shown["antiEntropy"]["checks"] == 0
        assert anti_entropy_line(shown["antiEntropy"]) == "anti-entropy off (not for a subset scope)"
        lines = status_lines(status_report(b.store, status))
        assert f"  scope protocol {NOTES} (paths: note/attachment) [{scope.scope_id}], state live" in lines
        assert "  anti-entropy off (not for a subset scope)" in lines
        b.stop()
        a.stop()
