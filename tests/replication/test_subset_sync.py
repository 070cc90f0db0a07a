"""Scoped subset sync (issue #18): a replica that pulls one protocol, one path or one context of
a tenant answers every in-scope read as the full source does, holds the closure and nothing
else outside the scope, and a later whole-tenant pull moves only the rest.

Driven as test_scenarios_over_the_wire.py drives a whole pull: real SQLite stores, two
ReplicationProtocol objects pumped against each other (test_protocol_pump.py's driver), no
sockets. The source lists a scope's *effective* listing (``SyncScope.lists``: intent plus the
protocol's configures, its permission records, its role records, deletes of possible
ancestors); the sink's closure loop fetches what the engine needs to apply. What the replica
may hold outside the intent scope is computed here by an oracle written independently of both
(from the stored messages, their signatures and the definition), never by asking the code
under test.

The scenarios' tenants signed with keys the files do not hold, so the source's read
authorization is told to take the authenticated peer for the tenant (as in the whole-pull test).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.dwn import permissions
from p2psync.dwn.canonical import archived_data, signature_payload
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import get_author, get_newest_message
from p2psync.dwn.messages_interface import create_messages_query
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.protocols import ProtocolsConfigure, ProtocolsQuery
from p2psync.dwn.records import create_records_delete, create_records_query, create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store, copy_store_files
from p2psync.dwn.urls import normalize_protocol_url
from p2psync.replication.effects import AnswerRefs
from p2psync.replication.hello import REVS, ROLE_RECORDS
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import decode_body
from p2psync.state.authz import ReadAuthorizer
from p2psync.state.copies import store_id
from p2psync.state.local import LocalStoreFetcher, reconcile
from tests.replication.histories import FORUM as FORUM_HISTORY
from tests.replication.histories import QUERY_AT, History, generate
from tests.replication.support import Clock, event_cid, scenario_sources, seeded, snapshot
from tests.replication.test_protocol_pump import Side, Wire, run
from tests.replication.test_scenarios_over_the_wire import _side
from tests.replication.test_shuffle import SCENARIO_DIR, _query_answers

PERMISSIONS = permissions.PERMISSIONS_PROTOCOL_URI
#: What a read-only step of a scenario is (compared at the end, on both sides).
READS = {("Records", "Read"), ("Records", "Query"), ("Protocols", "Query"), ("Messages", "Query"),
         ("Messages", "Read")}

Message = dict[str, Any]


@pytest.fixture(autouse=True)
def _peer_reads_as_tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    as_owner = ReadAuthorizer.reader
    monkeypatch.setattr(ReadAuthorizer, "reader",
                        lambda self, tenant, _reader, scope: as_owner(self, tenant, tenant, scope))


@dataclass
class Scenario:
    name: str
    path: Path
    tenants: list[str]
    reads: list[tuple[str, Message]]  # the scenario's queries and read-only steps


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> list[Scenario]:
    out = []
    for name, path, scenario, accepted in scenario_sources(SCENARIO_DIR, tmp_path_factory.mktemp):
        reads = []
        for s in scenario.steps:
            descriptor = s.message.get("descriptor") if isinstance(s.message, dict) else None
            if not isinstance(descriptor, dict):
                continue
            kind = (descriptor.get("interface"), descriptor.get("method"))
            if s.op == "query" or (s.op == "process" and kind in READS):
                reads.append((s.tenant or "", s.message))
        out.append(Scenario(name, path, sorted({s.tenant or "" for s in accepted}), reads))
    return out


# -- what the stores hold ----------------------------------------------------------------------


@dataclass
class Held:
    """One tenant's stored messages: message and indexes by CID."""

    messages: dict[str, tuple[Message, dict[str, Any]]]

    @classmethod
    def of(cls, store: Store, tenant: str) -> Held:
        snap = snapshot(store, tenant)
        return cls({cid: (json.loads(body), json.loads(ix)) for cid, (body, ix) in snap.messages.items()})

    def record_id(self, cid: str) -> str | None:
        message, indexes = self.messages[cid]
        rid = indexes.get("recordId") or message["descriptor"].get("recordId")
        return rid if isinstance(rid, str) else None

    def by_record(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for cid in self.messages:
            rid = self.record_id(cid)
            if rid is not None:
                out.setdefault(rid, set()).add(cid)
        return out


def _under(prefix: str, value: Any) -> bool:
    """``prefix`` is ``value`` or a leading run of its ``/`` segments (written apart from scope.py)."""
    return isinstance(value, str) and (value == prefix or value.startswith(prefix + "/"))


def _intent(scope: SyncScope, indexes: dict[str, Any]) -> bool:
    if indexes.get("protocol") != scope.protocol:
        return False
    paths, contexts = scope.protocol_path_prefixes, scope.context_id_prefixes
    if paths and not any(_under(p, indexes.get("protocolPath")) for p in paths):
        return False
    return not contexts or any(_under(c, indexes.get("contextId")) for c in contexts)


def _role_paths(structure: dict[str, Any], at: str = "") -> set[str]:
    out: set[str] = set()
    for name, child in structure.items():
        if name.startswith("$") or not isinstance(child, dict):
            continue
        path = f"{at}/{name}" if at else name
        if child.get("$role") is True:
            out.add(path)
        else:
            out |= _role_paths(child, path)
    return out


def additions(held: Held, scope: SyncScope) -> set[str]:
    """What the source lists beyond intent (the rule of protocol/replication-state.md, written
    again here from the stored messages)."""
    configures = [m for m, ix in held.messages.values()
                  if ix.get("interface") == "Protocols" and ix.get("protocol") == scope.protocol]
    newest = get_newest_message(configures)
    roles = _role_paths(newest["descriptor"]["definition"]["structure"]) if newest is not None else set()
    out: set[str] = set()
    for cid, (message, ix) in held.messages.items():
        if _intent(scope, ix):
            continue
        protocol, path, method = ix.get("protocol"), ix.get("protocolPath"), message["descriptor"]["method"]
        if protocol == PERMISSIONS:  # every permission record, whatever protocol it names
            out.add(cid)
        elif protocol != scope.protocol:
            continue
        elif ix.get("interface") == "Protocols" or scope.kind == "subset" and path in roles:
            out.add(cid)
        elif scope.kind == "subset" and method == "Delete":
            paths, contexts = scope.protocol_path_prefixes, scope.context_id_prefixes
            context = ix.get("contextId")
            if (not paths or any(p != path and _under(str(path), p) for p in paths)) and \
                    (not contexts or any(_under(str(context), c) for c in contexts)):
                out.add(cid)
    return out


def closure(held: Held, seeds: set[str]) -> set[str]:
    """Everything ``seeds`` depend on, transitively: the configures of their protocol, the
    messages of their context ancestors and their record's initial write, the role records
    their author used, the grants they name (delegated ones too) and those grants' revocations."""
    by_record = held.by_record()
    out: set[str] = set()
    todo = list(seeds)
    while todo:
        cid = todo.pop()
        if cid in out or cid not in held.messages:
            continue
        out.add(cid)
        message, ix = held.messages[cid]
        protocol = ix.get("protocol")
        found: set[str] = set()
        if isinstance(protocol, str) and protocol != PERMISSIONS:
            found |= {c for c, (_, i) in held.messages.items()
                      if i.get("interface") == "Protocols" and i.get("protocol") == protocol}
        rid = held.record_id(cid)
        if rid is not None:
            found |= {c for c in by_record.get(rid, ()) if held.messages[c][1].get("entryId") == rid}
        context = ix.get("contextId")
        if isinstance(context, str):
            for ancestor in context.split("/")[:-1]:
                found |= by_record.get(ancestor, set())
        payload = signature_payload(message)
        role = payload.get("protocolRole")
        if isinstance(role, str):
            author = get_author(message)
            found |= {c for c, (m, i) in held.messages.items() if i.get("protocol") == protocol
                      and i.get("protocolPath") == role and i.get("recipient") == author}
        grants = [payload.get("permissionGrantId")]
        authorization = message.get("authorization") or {}
        for member in ("authorDelegatedGrant", "ownerDelegatedGrant"):
            delegated = authorization.get(member)
            if isinstance(delegated, dict):
                grants.append(delegated.get("recordId"))
                todo.extend(c for c, (m, _) in held.messages.items() if m == delegated)
        for grant_id in grants:
            if isinstance(grant_id, str):
                found |= by_record.get(grant_id, set())
                found |= {c for c, (_, i) in held.messages.items()
                          if i.get("protocolPath") == "grant/revocation" and i.get("parentId") == grant_id}
        todo.extend(found - out)
    return out


# -- which reads a scope answers ---------------------------------------------------------------


def _protocol(value: Any) -> str | None:
    try:
        return normalize_protocol_url(value) if isinstance(value, str) else None
    except DwnError:
        return None


def within(scope: SyncScope, held: Held, message: Message) -> bool:
    """Whether a read can only see messages of the intent scope (so the subset replica must
    answer it as the source does)."""
    descriptor = message["descriptor"]
    kind = (descriptor["interface"], descriptor["method"])
    flt = descriptor.get("filter") or {}
    if kind == ("Protocols", "Query"):
        return _protocol(flt.get("protocol")) == scope.protocol
    if kind == ("Messages", "Query"):
        filters = descriptor.get("filters") or []
        return scope.kind == "protocol" and bool(filters) and all(
            _protocol(f.get("protocol")) == scope.protocol and set(f) <= {"protocol", "messageTimestamp"}
            for f in filters)
    if kind == ("Messages", "Read"):
        cid = descriptor.get("messageCid")
        return cid in held.messages and _intent(scope, held.messages[cid][1])
    if kind not in (("Records", "Query"), ("Records", "Read")):
        return False
    if kind == ("Records", "Read") and isinstance(flt.get("recordId"), str):
        record = held.by_record().get(flt["recordId"], set())
        return bool(record) and all(_intent(scope, held.messages[c][1]) for c in record)
    if _protocol(flt.get("protocol")) != scope.protocol:
        return False
    paths, contexts = scope.protocol_path_prefixes, scope.context_id_prefixes
    if paths and not any(_under(p, flt.get("protocolPath")) for p in paths):
        return False
    return not contexts or any(_under(c, flt.get("contextId")) for c in contexts)


# -- scopes of a scenario ----------------------------------------------------------------------


def scopes_of(held: Held) -> list[SyncScope]:
    """Per protocol: the protocol, each of its paths, and a context with children (alone and
    with one child path)."""
    paths: dict[str, set[str]] = {}
    parents: dict[str, dict[str, str]] = {}  # protocol -> parent contextId -> a child's path
    contexts = {held.record_id(c): ix.get("contextId") for c, (_, ix) in held.messages.items()}
    for _, ix in held.messages.values():
        protocol, path = ix.get("protocol"), ix.get("protocolPath")
        if not isinstance(protocol, str) or protocol == PERMISSIONS or not isinstance(path, str):
            continue
        paths.setdefault(protocol, set()).add(path)
        parent_context = contexts.get(ix.get("parentId"))
        if isinstance(parent_context, str):
            parents.setdefault(protocol, {}).setdefault(parent_context, path)
    out: list[SyncScope] = []
    for protocol in sorted(paths):
        out.append(SyncScope.for_protocol(protocol))
        out.extend(SyncScope.subset(protocol, [p]) for p in sorted(paths[protocol]))
        for context, child in sorted(parents.get(protocol, {}).items())[:1]:
            out.append(SyncScope.subset(protocol, (), [context]))
            out.append(SyncScope.subset(protocol, [child], [context]))
    return out


# -- the pull ----------------------------------------------------------------------------------


@dataclass
class Sent:
    """The message bodies the replica was sent: in `rev`/`revs` (by CID), and in answers to
    its dependency refs (by CID: an answer may hold an older definition besides the one asked)."""

    listed: list[str]
    dependencies: list[str]


def connect(source_path: Path, replica_path: Path, seed: int, *,
            source_offers: tuple[str, ...] = (REVS, ROLE_RECORDS)) -> tuple[Side, Side, Wire, Sent]:
    """A source and a replica pumped against each other, the bodies the replica is sent noted."""
    source = _side(source_path, "source", active=False, capabilities=source_offers)
    replica = _side(replica_path, "replica", active=True, capabilities=(REVS, ROLE_RECORDS))
    wire = Wire(source, replica, random.Random(seed))
    sent = Sent([], [])
    receive = replica.proto.receive_request
    answer_refs = source.service._sync[AnswerRefs]

    def answered(request: AnswerRefs) -> Any:
        out = answer_refs(request)
        sent.dependencies.extend(e.cid for entries, *_ in out for e in entries)
        return out

    source.service._sync[AnswerRefs] = answered

    def counted(rid: int, profile: str, properties: dict[str, str], body: bytes) -> None:
        if profile == "rev":
            sent.listed.append(properties["messageCid"])
        elif profile == "revs":
            sent.listed.extend(m["messageCid"] for m in decode_body(body)["revs"])
        receive(rid, profile, properties, body)

    replica.proto.receive_request = counted  # type: ignore[method-assign]
    source.proto.start_hello()
    run(wire, replica.proto.start_hello())
    return source, replica, wire, sent


def pull(replica: Side, wire: Wire, tenant: str, scope: SyncScope, batch: int = 3) -> None:
    operation, _ = replica.proto.sync(tenant=tenant, scope=scope, local_store_id=store_id(replica.store),
                                      pull=True, push=False, batch=batch, totals={})
    run(wire, operation)
    assert wire.closed == []


def check_subset(label: Any, source: Store, replica: Store, tenant: str, scope: SyncScope,
                 reads: list[tuple[str, Message]]) -> Held:
    """The subset replica's in-scope state and answers are the source's, and it holds the
    listing's additions and their closure, nothing else."""
    want, got = Held.of(source, tenant), Held.of(replica, tenant)
    snap_want, snap_got = snapshot(source, tenant), snapshot(replica, tenant)
    in_want = {c for c, (_, ix) in want.messages.items() if _intent(scope, ix)}
    in_got = {c for c, (_, ix) in got.messages.items() if _intent(scope, ix)}
    assert {c: snap_got.messages[c] for c in in_got} == {c: snap_want.messages[c] for c in in_want}, label
    records = {want.record_id(c) for c in in_want}
    assert {d for d in snap_got.data if d[0] in records} == {d for d in snap_want.data if d[0] in records}, label
    added = additions(want, scope)
    allowed = closure(want, in_want | added)
    outside = set(got.messages) - in_got
    assert outside <= allowed, (label, sorted(
        (got.messages[c][1].get("protocol"), got.messages[c][1].get("protocolPath")) for c in outside - allowed))
    assert added <= set(got.messages), (label, sorted(
        (want.messages[c][1].get("protocolPath"), want.messages[c][0]["descriptor"]["method"]) for c in added
        - set(got.messages)))
    mine = [(t, m) for t, m in reads if t == tenant and within(scope, want, m)]
    assert _query_answers(Dwn(replica), mine) == _query_answers(Dwn(source), mine), label
    return got


def test_every_scenario_subset_answers_as_the_source_and_a_full_pull_moves_only_the_rest(
    scenarios: list[Scenario], tmp_path: Path
) -> None:
    count = compared = moved_again = 0
    kinds: set[str] = set()
    for scenario in scenarios:
        for tenant in scenario.tenants:
            held = Store(scenario.path)
            scopes = scopes_of(Held.of(held, tenant))
            held.close()
            for scope in scopes:
                count += 1
                where = tmp_path / f"{count}"
                where.mkdir()
                copy_store_files(scenario.path, where / "source.db")
                source, replica, wire, sent = connect(where / "source.db", where / "replica.db", count)
                label = (scenario.name, scope.to_wire())
                pull(replica, wire, tenant, scope)
                got = check_subset(label, source.store, replica.store, tenant, scope, scenario.reads)
                compared += sum(1 for t, m in scenario.reads if t == tenant and within(scope, Held.of(
                    source.store, tenant), m))
                kinds.add(scope.kind + ("+context" if scope.context_id_prefixes else ""))
                # The same replica pulls the whole tenant: only what it lacked travels.
                # (By the CID the log lists a message under: the message as sent, without its data.)
                held_before = {event_cid(m) for m, _ in got.messages.values()}
                lacked = {event_cid(m) for m, _ in Held.of(source.store, tenant).messages.values()} - held_before
                # and the definitions a newer one replaced, which the source's log lists too
                lacked |= {c for c in snapshot(source.store, tenant).replaced
                           if not archived_data(replica.store, tenant, c)[0]}
                sent.listed.clear()
                sent.dependencies.clear()
                pull(replica, wire, tenant, SyncScope.global_scope())
                assert snapshot(replica.store, tenant).messages == snapshot(source.store, tenant).messages, label
                # Nothing it held travels again; what it lacked comes listed, or once asked for
                # by the closure loop (a record listed before its protocol's re-configure).
                assert len(set(sent.listed)) == len(sent.listed), label
                assert set(sent.listed) <= lacked and not held_before & set(sent.dependencies), (
                    label, set(sent.listed) - lacked, held_before & set(sent.dependencies))
                assert lacked <= set(sent.listed) | set(sent.dependencies), label
                moved_again += len(set(sent.listed) & set(sent.dependencies))
                for side in (source, replica):
                    side.store.close()
    assert count >= 60 and kinds == {"protocol", "subset", "subset+context"}
    assert compared >= 30  # reads really compared
    print(f"{count} scopes, {compared} reads compared, {moved_again} bodies both listed and fetched")


# -- the source changes after a first pull -----------------------------------------------------

FORUM = "https://p2psync.example/subset/forum"


def forum(version: int) -> dict[str, Any]:
    """Threads with messages; a global ``friend`` role reads them, a thread's ``participant``
    role writes them. Version 2 adds reactions under a message (a path inside the subset)."""
    message: dict[str, Any] = {
        "$actions": [{"role": "friend", "can": ["read", "query", "subscribe"]},
                     {"role": "thread/participant", "can": ["create"]}],
    }
    types: dict[str, Any] = {name: {"dataFormats": ["text/plain"]}
                             for name in ("thread", "participant", "message", "friend")}
    if version == 2:
        message["reaction"] = {}
        types["reaction"] = {"dataFormats": ["text/plain"]}
    return {
        "protocol": FORUM, "published": False, "types": types,
        "structure": {
            "friend": {"$role": True},
            "thread": {"$actions": [{"who": "anyone", "can": ["create"]}],
                       "participant": {"$role": True}, "message": message},
        },
    }


class Author:
    """Signs messages of the forum into a source store with real keys and a logical clock."""

    def __init__(self, dwn: Dwn, tenant: Identity) -> None:
        self.dwn, self.tenant, self.clock = dwn, tenant, Clock()

    def process(self, message: Message, data: bytes | None = None, code: int = 202) -> Message:
        reply = self.dwn.process_message(self.tenant.did, message, data)
        assert reply.code == code, (reply.code, reply.detail)
        return message

    def write(self, path: str, *, signer: Identity | None = None, parent: RecordsWrite | None = None,
              recipient: str | None = None, role: str | None = None) -> RecordsWrite:
        data = f"{path} {self.clock.now}".encode()
        ts = self.clock.tick()
        write = RecordsWrite.create(signer=signer or self.tenant, data=data, data_format="text/plain",
                                    protocol=FORUM, protocol_path=path, recipient=recipient, protocol_role=role,
                                    parent_context_id=None if parent is None else parent.message["contextId"],
                                    message_timestamp=ts, date_created=ts)
        self.process(write.message, data)
        return write


def test_a_second_subset_pull_brings_a_reconfigure_a_revocation_and_a_prune(tmp_path: Path) -> None:
    """After a first pull of ``thread/message``, the source installs version 2 of the protocol
    (a new path under the subset) and writes there, revokes bob's read grant and prunes a
    thread: none of these is in the path subset, and a second pull must still bring the replica
    to the source's answers (without the effective listing it keeps the old definition and
    refuses the reaction, still lets bob read, and still shows the pruned thread's messages)."""
    alice, bob, carol, dave = (seeded(f"subset-{n}") for n in ("alice", "bob", "carol", "dave"))
    tenant = alice.did
    source_path = tmp_path / "source.db"
    author = Author(Dwn(Store(source_path)), alice)
    author.process(ProtocolsConfigure.create(definition=forum(1), signer=alice,
                                             message_timestamp=author.clock.tick()).message)
    kept, pruned = author.write("thread"), author.write("thread")
    author.write("friend", recipient=carol.did)  # carol reads messages by her role
    author.write("thread/participant", parent=kept, recipient=dave.did)  # dave writes by his
    by_dave = author.write("thread/message", parent=kept, signer=dave, role="thread/participant")
    doomed = author.write("thread/message", parent=pruned)
    granted = author.clock.tick()
    grant, grant_data = permissions.create_grant(
        signer=alice, granted_to=bob.did, date_granted=granted, date_expires="2099-01-01T00:00:00.000000Z",
        scope={"interface": "Records", "method": "Read", "protocol": FORUM})
    author.process(grant.message, grant_data)
    author.dwn.close()

    def reads() -> list[tuple[str, Message]]:
        """The in-scope reads, signed now (after whatever the source did)."""
        ts = author.clock.tick()
        return [(tenant, m) for m in (
            create_records_read(signer=bob, filter={"recordId": by_dave.record_id},
                                permission_grant_id=grant.record_id, message_timestamp=ts),
            create_records_read(signer=carol, filter={"recordId": by_dave.record_id}, protocol_role="friend",
                                message_timestamp=ts),
            create_records_read(signer=alice, filter={"recordId": doomed.record_id}, message_timestamp=ts),
            create_records_query(signer=carol, filter={"protocol": FORUM, "protocolPath": "thread/message"},
                                 protocol_role="friend", message_timestamp=ts),
            create_records_query(signer=alice, filter={"protocol": FORUM, "protocolPath": "thread/message"},
                                 message_timestamp=ts),
            create_records_query(signer=alice, filter={"protocol": FORUM, "protocolPath": "thread/message/reaction"},
                                 message_timestamp=ts),
            ProtocolsQuery.create(filter={"protocol": FORUM}, signer=alice, message_timestamp=ts).message,
        )]

    scope = SyncScope.subset(FORUM, ["thread/message"])
    source, replica, wire, _ = connect(source_path, tmp_path / "replica.db", 18)
    pull(replica, wire, tenant, scope)
    first = reads()
    check_subset("first pull", source.store, replica.store, tenant, scope, first)
    before = _query_answers(Dwn(source.store), first)
    assert [code for code, _ in before] == [200, 200, 200, 200, 200, 200, 200]

    for side in (source, replica):
        side.store.close()

    # The source moves on: version 2 and a reaction under it, the grant revoked, a thread pruned.
    author.dwn = Dwn(Store(source_path))
    author.process(ProtocolsConfigure.create(definition=forum(2), signer=alice,
                                             message_timestamp=author.clock.tick()).message)
    author.write("thread/message/reaction", parent=by_dave)
    revocation, revocation_data = permissions.create_revocation(
        signer=alice, grant=PermissionGrant.parse(permissions.with_encoded_data(grant.message, grant_data)),
        date_revoked=author.clock.tick())
    author.process(revocation.message, revocation_data)
    ts = author.clock.tick()
    author.process(create_records_delete(record_id=pruned.record_id, signer=alice, prune=True, message_timestamp=ts))
    author.dwn.close()

    # A later session (one connection declares a collection once) resumes from its checkpoint.
    source, replica, wire, sent = connect(source_path, tmp_path / "replica.db", 19)
    pull(replica, wire, tenant, scope)
    assert len(sent.listed) == 4  # the configure, the reaction, the revocation, the prune
    second = reads()
    check_subset("second pull", source.store, replica.store, tenant, scope, second)
    after = _query_answers(Dwn(source.store), second)
    # The changes are visible at the source: bob refused, the pruned message gone, a reaction.
    assert after[0][0] == 401 and after[2][0] == 404 and len(after[5][1]) == 1
    assert len(after[4][1]) == len(before[4][1]) - 1
    for side in (source, replica):
        side.store.close()


# -- generated histories -----------------------------------------------------------------------


def history_reads(history: History, held: Held) -> list[tuple[str, Message]]:
    """The owner's reads of a history: each path's records, each record, the protocol and the
    forum's messages (the subset ones are kept by :func:`within`)."""
    alice = history.cast.alice
    paths = sorted({ix["protocolPath"] for _, ix in held.messages.values()
                    if ix.get("protocol") == FORUM_HISTORY and isinstance(ix.get("protocolPath"), str)})
    messages: list[Message] = [
        ProtocolsQuery.create(filter={"protocol": FORUM_HISTORY}, signer=alice, message_timestamp=QUERY_AT).message,
        create_messages_query(signer=alice, filters=[{"protocol": FORUM_HISTORY}], message_timestamp=QUERY_AT),
    ]
    messages += [create_records_query(signer=alice, filter={"protocol": FORUM_HISTORY, "protocolPath": p},
                                      message_timestamp=QUERY_AT) for p in paths]
    messages += [create_records_read(signer=alice, filter={"recordId": r}, message_timestamp=QUERY_AT)
                 for r in sorted(held.by_record())]
    return [(history.tenant, m) for m in messages]


@settings(max_examples=int(os.environ.get("SUBSET_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_generated_histories_any_cut_any_scope(tmp_path_factory: pytest.TempPathFactory,
                                               data: st.DataObject) -> None:
    """A generated forum history (grants, revocations, roles re-created, prunes, a narrowing
    re-configure): the source holds the history up to a cut, the replica pulls a scope, the
    source takes the rest, the replica pulls again. Both times the subset replica answers as the
    source and holds the closure only; a whole pull then moves only the rest."""
    seed = data.draw(st.integers(0, 200), label="history")
    history = generate(seed)
    try:
        where = tmp_path_factory.mktemp("history")
        union = Store(where / "union.db")
        union_dwn = Dwn(union)
        for device in history.devices:
            trio.run(reconcile, device.store, union_dwn, history.tenant)
        tenant = history.tenant
        log = [e for _, c in union.events.read(tenant) if (e := LocalStoreFetcher(union).entry_by_cid(tenant, c))]
        held = Held.of(union, tenant)
        scope = data.draw(st.sampled_from(scopes_of(held)), label="scope")
        cut = data.draw(st.integers(0, len(log)), label="cut")
        source_dwn = Dwn(Store(where / "source.db"))
        trio.run(reconcile, union, source_dwn, tenant, log[:cut])
        source_dwn.close()
        reads = history_reads(history, held)

        source, replica, wire, _ = connect(where / "source.db", where / "replica.db", seed)
        pull(replica, wire, tenant, scope)
        check_subset((seed, cut, "first"), source.store, replica.store, tenant, scope, reads)
        for side in (source, replica):
            side.store.close()

        source_dwn = Dwn(Store(where / "source.db"))
        trio.run(reconcile, union, source_dwn, tenant)
        source_dwn.close()
        source, replica, wire, sent = connect(where / "source.db", where / "replica.db", seed + 1)
        pull(replica, wire, tenant, scope)
        got = check_subset((seed, cut, "again"), source.store, replica.store, tenant, scope, reads)
        held_before = {event_cid(m) for m, _ in got.messages.values()}
        lacked = {event_cid(m) for m, _ in Held.of(source.store, tenant).messages.values()} - held_before
        sent.listed.clear()
        sent.dependencies.clear()
        pull(replica, wire, tenant, SyncScope.global_scope())
        assert snapshot(replica.store, tenant).messages == snapshot(source.store, tenant).messages
        assert set(sent.listed) <= lacked and lacked <= set(sent.listed) | set(sent.dependencies)
        for side in (source, replica):
            side.store.close()
        union.close()
    finally:
        history.close()
