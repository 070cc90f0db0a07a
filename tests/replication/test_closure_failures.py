"""Strict closure (issue #18): a hard dependency the source cannot give is a typed failure, never
a silent omission.

One case per dependency class 0.5.2 has: the source holds a scoped replica's root but the
dependency is removed from it (state, archive and log), a subset pull over the protocol (real
SQLite stores, the no-socket pump of test_protocol_pump) must leave the root unapplied with the
strict-closure RFC's code, the link ``repairing`` under that code, and the pull checkpoint before
the root; once the source has the dependency again, the next round heals: the root applies, the
link is ``live`` and the checkpoint reaches the source's head. Withheld dependencies and the depth
bound are driven through the closure admitter itself (tests/replication/test_closure.py covers
withholding over the wire).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn import permissions
from p2psync.dwn.encoding import b64url_encode
from p2psync.dwn.engine import Dwn
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.replication_types import Applied, Incomplete, Parent
from p2psync.dwn.store import Store
from p2psync.replication.closure import (
    CLOSURE_DEPTH_EXCEEDED,
    CLOSURE_FORBIDDEN,
    ApplyRequest,
    ClosureAdmitter,
    FetchRequest,
    ReplicationEntry,
    Withheld,
)
from p2psync.replication.scope import SyncScope
from p2psync.state.authz import ReadAuthorizer
from p2psync.state.copies import store_id
from p2psync.state.ledger import Direction, LinkState
from tests.replication.support import CHAT, ChatWorld, chat_world, grant_world, process_all
from tests.replication.test_protocol_pump import Side, Wire, run
from tests.replication.test_scenarios_over_the_wire import _side


@dataclass(frozen=True)
class Case:
    world: Callable[[], ChatWorld]
    removed: str  # the step taken away from the source
    root: str  # the in-scope step whose closure needs it
    paths: tuple[str, ...]  # the subset scope's protocolPathPrefixes
    code: str


def _revoked_grant_world() -> ChatWorld:
    """grant_world, and alice revokes bob's grant after his note (the note stays valid)."""
    w = grant_world()
    grant = w.steps["grant"]
    parsed = PermissionGrant({**grant.message, "encodedData": b64url_encode(grant.data or b"")})
    revocation, data = permissions.create_revocation(signer=w.alice, grant=parsed, date_revoked=w.clock.tick())
    w.add("revocation", revocation.message, data)
    return w


def _chat_without_delete() -> ChatWorld:
    w = chat_world()
    del w.steps["note-delete"]  # the note keeps its update
    return w


CASES = {
    "protocol": Case(chat_world, "protocol", "chat", ("thread/chat",), "ClosureProtocolMetadataMissing"),
    "initial-write": Case(_chat_without_delete, "note", "note-update", ("note",), "ClosureInitialWriteMissing"),
    "parent": Case(chat_world, "thread", "chat", ("thread/chat",), "ClosureParentChainMissing"),
    "context": Case(chat_world, "thread", "reaction", ("thread/chat/reaction",), "ClosureContextChainMissing"),
    "role": Case(chat_world, "participant", "chat", ("thread/chat",), "ClosureRoleRecordMissing"),
    "grant": Case(grant_world, "grant", "granted-note", ("note",), "ClosureGrantMissing"),
    # A closure operation of the scope (a revocation the source lists for it) that cannot be
    # admitted is named by what the replica lacks: the revocation.
    "revocation": Case(_revoked_grant_world, "grant", "revocation", ("note",), "ClosureGrantRevocationMissing"),
}


@pytest.fixture(autouse=True)
def _peer_reads_as_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    # The worlds' tenant signs with a key the pump's hello identity is not: the source takes the
    # authenticated peer for the tenant (authorization is tested in test_authz.py).
    as_owner = ReadAuthorizer.reader
    monkeypatch.setattr(ReadAuthorizer, "reader",
                        lambda self, tenant, _reader, scope: as_owner(self, tenant, tenant, scope))


_TABLES = ("messages", "archive", "events")


def _remove(store: Store, tenant: str, cid: str) -> dict[str, list[tuple[Any, ...]]]:
    """Take a message out of a store completely (its state row, its archive row, its log entry,
    as a source that never had it); returns the rows, for :func:`_restore`."""
    tid = store.tenant_id(tenant, create=False)
    saved: dict[str, list[tuple[Any, ...]]] = {}
    with store.conn:
        for table in _TABLES:
            cursor = store.conn.execute(f"SELECT * FROM {table} WHERE tenant=? AND cid=?", (tid, cid))  # noqa: S608
            saved[table] = [tuple(row) for row in cursor]
            store.conn.execute(f"DELETE FROM {table} WHERE tenant=? AND cid=?", (tid, cid))  # noqa: S608
    assert saved["messages"] and saved["events"]
    return saved


def _restore(path: Path, saved: dict[str, list[tuple[Any, ...]]]) -> None:
    """Put the rows :func:`_remove` took back where they were (the source has the message again)."""
    store = Store(path)
    with store.conn:
        for table in _TABLES:
            for row in saved[table]:
                marks = ", ".join("?" * len(row))
                store.conn.execute(f"INSERT INTO {table} VALUES ({marks})", row)  # noqa: S608
    store.close()


def _round(source: Side, replica: Side, tenant: str, scope: SyncScope, seed: int,
           *, push: bool = False) -> tuple[Any, dict[str, Any]]:
    """One sync round of ``scope`` on a fresh connection, ``replica`` the active side: it pulls
    (or pushes, ``push``); returns (round, totals). Each side keeps its not-applied log across
    rounds, as a peer does across its connections."""
    for side in (source, replica):
        side.proto = type(side.proto)(identity=side.proto.identity, mine=side.proto.mine, active=side.proto.active,
                                      not_applied=side.proto.not_applied)
    wire = Wire(source, replica, random.Random(seed))
    source.proto.start_hello()
    run(wire, replica.proto.start_hello())
    totals: dict[str, Any] = {}
    operation, round_ = replica.proto.sync(tenant=tenant, scope=scope, local_store_id=store_id(replica.store),
                                           pull=not push, push=push, batch=2, totals=totals)
    run(wire, operation)
    return round_, totals


def _position(store: Store, tenant: str, cid: str) -> int:
    position = store.events.position_of(tenant, cid)
    assert position is not None
    return position


@pytest.mark.parametrize("name", list(CASES))
def test_a_missing_hard_dependency_is_a_typed_failure_until_the_source_has_it(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    w = case.world()
    tenant = w.tenant
    source_dwn = Dwn(Store(tmp_path / "source.db"))
    process_all(source_dwn, tenant, w.ordered())
    removed = w.steps[case.removed]
    saved = _remove(source_dwn.store, tenant, removed.cid)
    source_dwn.close()
    source = _side(tmp_path / "source.db", "source", active=False, capabilities=("revs",))
    replica = _side(tmp_path / "replica.db", "replica", active=True, capabilities=("revs",))
    scope = SyncScope.subset(CHAT, case.paths)
    root = w.steps[case.root]

    round_, totals = _round(source, replica, tenant, scope, seed=1)
    ledger = replica.service.ledger
    assert not replica.store.messages.has(tenant, root.cid)
    failed = {entry.message_cid: entry for entry in totals["pull"].not_applied.last}
    assert failed[root.cid].code == case.code, failed[root.cid]
    # The reason names the code, the entry that needed the dependency, and the dependency.
    assert failed[root.cid].reason.startswith(f"{case.code}: bafy"), failed[root.cid].reason
    assert removed.cid not in replica.store.messages.cids(tenant)
    # The replica's own log (what `status` shows) names it too, until it applies (below).
    assert root.cid in {entry.message_cid for entry in replica.proto.not_applied.last}
    link = ledger.link(round_.key)
    assert link.state == LinkState.REPAIRING
    codes = [t.error_code for t in ledger.transitions(round_.key) if t.state_to == LinkState.REPAIRING]
    assert codes and codes[0] is not None and codes[0].startswith("Closure"), codes
    checkpoint, _ = ledger.get_checkpoint(round_.key, Direction.PULL)
    frontier = checkpoint.contiguous_applied_token
    assert frontier is None or frontier.position < _position(source.store, tenant, root.cid)

    # The source gets the dependency back (another replica gave it, a restore): the next round heals.
    source.store.close()
    _restore(tmp_path / "source.db", saved)
    source = _side(tmp_path / "source.db", "source", active=False, capabilities=("revs",))
    round_, totals = _round(source, replica, tenant, scope, seed=2)
    assert replica.store.messages.has(tenant, root.cid)
    assert ledger.link(round_.key).state == LinkState.LIVE
    # Applied now: neither this round's summary nor the replica's log says it did not apply.
    assert root.cid not in {entry.message_cid for entry in totals["pull"].not_applied.last}
    assert root.cid not in {entry.message_cid for entry in replica.proto.not_applied.last}
    assert replica.proto.not_applied.count == len(replica.proto.not_applied.last)
    checkpoint, _ = ledger.get_checkpoint(round_.key, Direction.PULL)
    head = source.store.events.read(tenant, after=-1, limit=10_000)[-1][0]
    assert checkpoint.contiguous_applied_token is not None and checkpoint.contiguous_applied_token.position == head
    assert not checkpoint.unapplied_tokens
    for side in (source, replica):
        side.store.close()


def test_a_push_the_peer_could_not_apply_leaves_the_pushers_log_once_it_does(tmp_path: Path) -> None:
    """Push: the pusher lacks a role record its chat needs, so the peer answers Incomplete and
    the pusher lists the chat as not applied *at the peer*; once the pusher has the role record
    again, the next push is taken and the entry leaves its log."""
    case = CASES["role"]
    w = case.world()
    tenant = w.tenant
    holder_dwn = Dwn(Store(tmp_path / "holder.db"))
    process_all(holder_dwn, tenant, w.ordered())
    saved = _remove(holder_dwn.store, tenant, w.steps[case.removed].cid)
    holder_dwn.close()
    receiver = _side(tmp_path / "receiver.db", "receiver", active=False, capabilities=("revs",))
    holder = _side(tmp_path / "holder.db", "holder", active=True, capabilities=("revs",))
    scope = SyncScope.subset(CHAT, case.paths)
    root = w.steps[case.root]

    _, totals = _round(receiver, holder, tenant, scope, seed=3, push=True)
    assert not receiver.store.messages.has(tenant, root.cid)
    at_peer = {e.message_cid: e for e in holder.proto.not_applied.last if e.where == "peer"}
    assert at_peer[root.cid].result == "Incomplete", at_peer
    assert at_peer[root.cid].peer == store_id(receiver.store)
    assert root.cid in {e.message_cid for e in totals["push"].not_applied.last}

    holder.store.close()
    _restore(tmp_path / "holder.db", saved)
    log = holder.proto.not_applied
    holder = _side(tmp_path / "holder.db", "holder", active=True, capabilities=("revs",))
    holder.proto.not_applied = log  # the same peer, on a new connection
    _, totals = _round(receiver, holder, tenant, scope, seed=4, push=True)
    assert receiver.store.messages.has(tenant, root.cid)
    assert root.cid not in {e.message_cid for e in holder.proto.not_applied.last}
    assert root.cid not in {e.message_cid for e in totals["push"].not_applied.last}
    for side in (receiver, holder):
        side.store.close()


# --------------------------------------------------------------------------- the admitter alone


def _drive(admitter: ClosureAdmitter, apply: Callable[[ReplicationEntry], Any],
           fetch: Callable[[FetchRequest], Any]) -> Any:
    request = admitter.request
    while isinstance(request, ApplyRequest | FetchRequest):
        if isinstance(request, ApplyRequest):
            request = admitter.receive_apply(apply(request.entry))
        else:
            request = admitter.receive_fetch(fetch(request))
    return request


def _record(name: str) -> ReplicationEntry:
    return ReplicationEntry({"recordId": name, "descriptor": {"interface": "Records", "method": "Write",
                                                            "protocol": CHAT, "dataCid": name}})


def test_a_withheld_dependency_is_closure_dependency_forbidden() -> None:
    root = _record("root")
    outcome = _drive(
        ClosureAdmitter("did:example:t", root),
        lambda entry: Incomplete((Parent(record_id="parent", protocol=CHAT),)),
        lambda request: [Withheld(()) for _ in request.refs],
    )
    assert (outcome.status, outcome.code, outcome.needed_by) == ("failed", CLOSURE_FORBIDDEN, root.cid)
    assert outcome.dependency == Parent(record_id="parent", protocol=CHAT)


@pytest.mark.parametrize(("chain", "code"), [(32, None), (33, CLOSURE_DEPTH_EXCEEDED)])
def test_a_closure_deeper_than_32_hops_fails_deterministically(chain: int, code: str | None) -> None:
    """Record i needs record i+1 up to ``chain`` hops from the root; the last needs nothing."""
    names = [f"r{i}" for i in range(chain + 1)]
    entries = {name: _record(name) for name in names}
    held: set[str] = set()

    def apply(entry: ReplicationEntry) -> Any:
        i = names.index(entry.message["recordId"])
        if i == chain or names[i + 1] in held:
            held.add(names[i])
            return Applied()
        return Incomplete((Parent(record_id=names[i + 1], protocol=CHAT),))

    def fetch(request: FetchRequest) -> Any:
        return [[entries[ref.record_id]] for ref in request.refs]  # type: ignore[attr-defined]

    outcome = _drive(ClosureAdmitter("did:example:t", entries["r0"]), apply, fetch)
    if code is None:
        assert outcome.status == "admitted" and len(held) == chain + 1
    else:
        assert (outcome.status, outcome.code) == ("failed", code)
        assert "r0" not in held


def test_roots_of_one_batch_share_a_dependency_lookup(tmp_path: Path) -> None:
    """Four chat messages of one thread, the thread gone from the source: one listing, one
    `getDependencies` asks for the thread (not one per message), and every chat stays unapplied."""
    w = chat_world()
    ctx = w.steps["thread"].message["contextId"]
    for i in range(3):
        w.write(f"chat{i}", w.carol, "thread/chat", f"more {i}".encode(), parent_context_id=ctx,
                protocol_role="thread/participant")
    tenant = w.tenant
    source_dwn = Dwn(Store(tmp_path / "source.db"))
    process_all(source_dwn, tenant, w.ordered())
    _remove(source_dwn.store, tenant, w.steps["thread"].cid)
    source_dwn.close()
    source = _side(tmp_path / "source.db", "source", active=False, capabilities=("revs",))
    replica = _side(tmp_path / "replica.db", "replica", active=True, capabilities=("revs",))
    wire = Wire(source, replica, random.Random(3))
    asked: list[str] = []
    receive = source.proto.receive_request

    def counted(rid: int, profile: str, *args: Any) -> None:
        if profile == "getDependencies":
            asked.append(bytes(args[1]).decode("latin-1"))
        receive(rid, profile, *args)

    source.proto.receive_request = counted  # type: ignore[method-assign,assignment]
    source.proto.start_hello()
    run(wire, replica.proto.start_hello())
    totals: dict[str, Any] = {}
    operation, _ = replica.proto.sync(tenant=tenant, scope=SyncScope.subset(CHAT, ["thread/chat"]),
                                      local_store_id=store_id(replica.store), pull=True, push=False, batch=50,
                                      totals=totals)
    run(wire, operation)
    chats = [w.steps[name].cid for name in ("chat", "chat0", "chat1", "chat2")]
    assert not any(replica.store.messages.has(tenant, cid) for cid in chats)
    assert {e.message_cid: e.code for e in totals["pull"].not_applied.last if e.message_cid in chats} == dict.fromkeys(
        chats, "ClosureParentChainMissing")
    thread = w.steps["thread"].message["recordId"]
    assert sum(thread in body for body in asked) == 1, asked  # (the reaction asks for its chat too)
