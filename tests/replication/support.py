"""Shared pieces of the replicated-apply tests: a chat world authored with our own classes,
store snapshots, and closure runs between stores."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2psync.conformance import load_scenario
from p2psync.dwn import permissions
from p2psync.dwn.blobs import parse_reference
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_delete
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.replication_types import ReplicationApplyResult
from p2psync.dwn.store import BLOBS_SUFFIX, Store
from p2psync.dwn.timeutil import add_seconds
from p2psync.replication.closure import ClosureAdmitter, ClosureOutcome, ReplicationEntry
from p2psync.state.local import LocalApplier, LocalStoreFetcher

CHAT = "https://p2psync.example/protocols/replicated-chat"

# thread (anyone creates) / participant (a context role the thread's author hands out)
# / chat (participants write) / reaction (the chat's author reacts); admin is a root role.
CHAT_DEFINITION: dict[str, Any] = {
    "protocol": CHAT,
    "published": True,
    "types": {"admin": {}, "thread": {}, "participant": {}, "chat": {}, "reaction": {}, "note": {}},
    "structure": {
        "admin": {"$role": True},
        "note": {"$actions": [{"who": "anyone", "can": ["create", "update"]}]},
        "thread": {
            "$actions": [{"who": "anyone", "can": ["create", "update"]}],
            "participant": {
                "$role": True,
                "$actions": [{"who": "author", "of": "thread", "can": ["create"]}],
            },
            "chat": {
                "$actions": [{"role": "thread/participant", "can": ["create", "read", "query", "subscribe"]}],
                "reaction": {"$actions": [{"who": "author", "of": "thread/chat", "can": ["create"]}]},
            },
        },
    },
}


def seeded(name: str, method: str = "key") -> Identity:
    """A deterministic identity: the same DIDs on every run."""
    seed = name.encode().ljust(32, b"\0")[:32]
    return Identity.from_private_bytes(seed, method)


class Clock:
    """Timestamps one second apart, so message order never depends on the wall clock."""

    def __init__(self, start: str = "2030-05-01T00:00:00.000000Z") -> None:
        self.now = start

    def tick(self) -> str:
        self.now = add_seconds(self.now, 1)
        return self.now


@dataclass
class Step:
    """One message as its author sent it, with its data."""

    name: str
    message: dict[str, Any]
    data: bytes | None = None

    @functools.cached_property
    def entry(self) -> ReplicationEntry:
        return ReplicationEntry(self.message, self.data)

    @property
    def cid(self) -> str:
        return self.entry.cid


@dataclass
class ChatWorld:
    """alice's DWN with the chat protocol; bob opens a thread, carol takes part, ..."""

    alice: Identity
    bob: Identity
    carol: Identity
    clock: Clock = field(default_factory=Clock)
    steps: dict[str, Step] = field(default_factory=dict)

    @property
    def tenant(self) -> str:
        return self.alice.did

    def add(self, name: str, message: dict[str, Any], data: bytes | None = None) -> Step:
        step = Step(name, message, data)
        self.steps[name] = step
        return step

    def write(self, name: str, signer: Identity, path: str, data: bytes = b"hello", **kw: Any) -> RecordsWrite:
        now = self.clock.tick()
        write = RecordsWrite.create(
            signer=signer,
            data=data,
            protocol=CHAT,
            protocol_path=path,
            message_timestamp=now,
            date_created=now,
            **kw,
        )
        self.add(name, write.message, data)
        return write

    def ordered(self) -> list[Step]:
        return list(self.steps.values())


def chat_world() -> ChatWorld:
    """The chat story, in order (every message is accepted when processed in this order)."""
    w = ChatWorld(seeded("alice"), seeded("bob", "jwk"), seeded("carol"))
    configure = ProtocolsConfigure.create(definition=CHAT_DEFINITION, signer=w.alice, message_timestamp=w.clock.tick())
    w.add("protocol", configure.message)
    thread = w.write("thread", w.bob, "thread", b"a thread")
    ctx = thread.message["contextId"]
    w.write("participant", w.bob, "thread/participant", b"role", recipient=w.carol.did, parent_context_id=ctx)
    chat = w.write("chat", w.carol, "thread/chat", b"hi all", parent_context_id=ctx, protocol_role="thread/participant")
    w.write("reaction", w.carol, "thread/chat/reaction", b"+1", parent_context_id=chat.message["contextId"])
    note = w.write("note", w.bob, "note", b"first")
    now = w.clock.tick()
    update = RecordsWrite.create_from(note.message, signer=w.bob, data=b"second", message_timestamp=now)
    w.add("note-update", update.message, b"second")
    w.add(
        "note-delete", create_records_delete(record_id=note.record_id, signer=w.alice, message_timestamp=w.clock.tick())
    )
    return w


def grant_world() -> ChatWorld:
    """alice grants bob Records/Write on the chat protocol; bob writes a thread under it."""
    w = ChatWorld(seeded("alice"), seeded("bob", "jwk"), seeded("carol"))
    w.add(
        "protocol",
        ProtocolsConfigure.create(definition=CHAT_DEFINITION, signer=w.alice, message_timestamp=w.clock.tick()).message,
    )
    granted = w.clock.tick()
    grant, data = permissions.create_grant(
        signer=w.alice,
        granted_to=w.bob.did,
        date_granted=granted,
        date_expires=add_seconds(granted, 3600),
        scope={"interface": "Records", "method": "Write", "protocol": CHAT},
    )
    w.add("grant", grant.message, data)
    now = w.clock.tick()
    note = RecordsWrite.create(
        signer=w.bob,
        data=b"by grant",
        protocol=CHAT,
        protocol_path="note",
        message_timestamp=now,
        date_created=now,
        permission_grant_id=grant.record_id,
    )
    w.add("granted-note", note.message, b"by grant")
    return w


# --------------------------------------------------------------------------- stores


def scenario_sources(directory: Path, workdir: Callable[[str], Path]) -> Iterator[tuple[str, Path, Any, list[Any]]]:
    """Each interop scenario of ``directory`` that stores something, its accepted messages
    processed in order into a new store in ``workdir(name)`` (closed, its WAL checkpointed into
    the file, so copies of it are whole): ``(name, store path, scenario, accepted steps)``."""
    for file in sorted(directory.glob("*.json")):
        scenario = load_scenario(file)
        accepted = [s for s in scenario.steps
                    if s.op == "process" and s.expect is not None and s.expect.code in (202, 204)]
        if not accepted:
            continue
        path = workdir(file.stem) / "source.db"
        source = Dwn(Store(path))
        for s in accepted:
            expected = s.expect.code if s.expect is not None else None
            assert source.process_message(s.tenant or "", s.message, s.data).code == expected
        source.close()
        yield file.stem, path, scenario, accepted


def process_all(dwn: Dwn, tenant: str, steps: Iterable[Step]) -> None:
    """Process steps in order as their authors would; every one must be accepted."""
    for step in steps:
        reply = dwn.process_message(tenant, step.message, step.data)
        assert reply.code in (202, 204), (step.name, reply.code, reply.detail)


def event_cid(body: dict[str, Any]) -> str:
    """The CID the event log lists a stored message under (the message as sent)."""
    return message_cid({k: v for k, v in body.items() if k != "encodedData"})


@dataclass(frozen=True)
class Snapshot:
    """Everything a tenant's store holds, in comparable form (event order aside)."""

    messages: dict[str, tuple[str, str]]  # cid -> (body json, indexes json)
    data: frozenset[tuple[str, str, int]]  # (recordId, dataCid, size)
    events: tuple[str, ...]  # event-log CIDs of stored messages, sorted (duplicates kept, so they show)
    # the log's other entries, sorted: each must be a protocol definition a newer one replaced
    # (listed to replicas, not to MessagesQuery: protocol/replication-apply.md)
    replaced: tuple[str, ...] = ()

    def record_key(self, cid: str) -> str:
        body = json.loads(self.messages[cid][0])
        return key_of(body)


def key_of(body: dict[str, Any]) -> str:
    """The record (or protocol) a stored message belongs to."""
    d = body["descriptor"]
    if d.get("interface") == "Protocols":
        return f"protocol:{d['definition']['protocol']}"
    return f"record:{body.get('recordId') or d['recordId']}"


def snapshot(store: Store, tenant: str) -> Snapshot:
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return Snapshot({}, frozenset(), ())
    conn = store.conn
    messages = {c: (b, i) for c, b, i in conn.execute("SELECT cid, body, indexes FROM messages WHERE tenant=?", (tid,))}
    data = frozenset(
        (r, d, s) for r, d, s in conn.execute("SELECT record_id, data_cid, size FROM data WHERE tenant=?", (tid,))
    )
    listed = conn.execute(_LOG_SQL, (tid,)).fetchall()
    events = tuple(sorted(str(c) for c, stored in listed if stored))
    replaced = tuple(sorted(str(c) for c, stored in listed if not stored))
    return Snapshot(messages, data, events, replaced)


#: Each log entry with whether it is a stored message's (a replaced definition is archived, a
#: definition, and not stored; a zero-byte record is stored under another CID than its entry's).
_LOG_SQL = ("SELECT e.cid, EXISTS(SELECT 1 FROM messages m WHERE m.tenant=e.tenant AND m.cid=e.cid)"
            " OR NOT EXISTS(SELECT 1 FROM archive a WHERE a.tenant=e.tenant AND a.cid=e.cid AND a.record_id IS NULL)"
            " FROM events e WHERE e.tenant=?")


def log_appends(store: Store, tenant: str) -> int:
    """How many entries the tenant's event log ever appended (positions are never reused)."""
    row = store.conn.execute("SELECT next_position FROM tenants WHERE did=?", (tenant,)).fetchone()
    return 0 if row is None else int(row[0]) - 1


def assert_log_matches_messages(snap: Snapshot, store: Store | None = None, tenant: str | None = None) -> None:
    """Every stored message has exactly one event-log entry, and no entry lacks its message
    but a replaced protocol definition's (checked to be one when ``store`` is given)."""
    expected = sorted(event_cid(json.loads(body)) for body, _ in snap.messages.values())
    assert list(snap.events) == expected
    assert len(set(snap.replaced)) == len(snap.replaced)
    if store is not None and tenant is not None:
        fetcher = LocalStoreFetcher(store)
        for cid in snap.replaced:
            entry = fetcher.entry_by_cid(tenant, cid)
            assert entry is not None and entry.message["descriptor"]["method"] == "Configure", cid


# --------------------------------------------------------------------------- closures


@dataclass
class Run:
    """Outcomes of admitting roots into a replica, last outcome per root CID."""

    outcomes: dict[str, ClosureOutcome] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    rounds: int = 0

    def by_status(self, status: str) -> list[str]:
        return [self.names[c] for c, o in self.outcomes.items() if o.status == status]


async def admit_all(
    replica: Dwn,
    tenant_of: Sequence[str] | str,
    roots: Sequence[Step],
    source: Store,
    *,
    retry_deferred: bool = True,
) -> Run:
    """Admit roots in the given order; then, as a later sync would, retry the deferred ones
    until a round changes nothing."""
    applier, fetcher = LocalApplier(replica), LocalStoreFetcher(source)
    tenants = [tenant_of] * len(roots) if isinstance(tenant_of, str) else list(tenant_of)
    run = Run()
    todo = list(zip(roots, tenants, strict=True))
    while todo:
        run.rounds += 1
        changed = False
        for step, tenant in todo:
            outcome = await ClosureAdmitter(tenant, step.entry).admit(applier, fetcher)
            previous = run.outcomes.get(outcome.root_cid)
            changed = changed or previous is None or previous.status != outcome.status
            run.outcomes[outcome.root_cid] = outcome
            run.names[outcome.root_cid] = step.name
        if not retry_deferred or not changed:
            break
        todo = [(s, t) for s, t in todo if run.outcomes[s.entry.cid].status == "deferred"]
    return run


def kinds(results: Iterable[ReplicationApplyResult]) -> list[str]:
    return [r.kind for r in results]


def undo_schema_9(conn: Any) -> None:
    """Take out what schema 9 added (record data as files: each blob reference replaced by its
    file's bytes, the partial indexes of references dropped)."""
    blobs = Path(conn.filename + BLOBS_SUFFIX)

    def unfile(value: Any) -> Any:
        return (blobs / parse_reference(value)[0]).read_bytes() if isinstance(value, str) else value

    conn.create_scalar_function("p2psync_unfile", unfile, 1)
    conn.execute("UPDATE data SET bytes = p2psync_unfile(bytes) WHERE typeof(bytes) = 'text'")
    conn.execute("UPDATE archive SET data = p2psync_unfile(data) WHERE typeof(data) = 'text'")
    conn.execute("DROP INDEX IF EXISTS data_blob")
    conn.execute("DROP INDEX IF EXISTS archive_blob")


def undo_schema_8(conn: Any) -> None:
    """Take out what schemas 8 and 9 added (the messages' ``wire``; data as files), for tests
    that turn a store back into an older schema's and open it again."""
    undo_schema_9(conn)
    if any(row[1] == "wire" for row in conn.execute("PRAGMA table_info(messages)")):
        conn.execute("ALTER TABLE messages DROP COLUMN wire")


def undo_schema_7(conn: Any) -> None:
    """Take out what schemas 7 and 8 added (the archive's ``data_in``, the trigger that keeps a
    data row's bytes in the archive, the usage triggers that read ``data_in``; the messages'
    ``wire``), for tests that turn a store back into an older schema's and open it again."""
    undo_schema_8(conn)
    conn.execute("DROP TRIGGER IF EXISTS archive_data_kept")
    for trigger in ("tenant_usage_insert", "tenant_usage_delete", "tenant_usage_update"):
        conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    if any(row[1] == "data_in" for row in conn.execute("PRAGMA table_info(archive)")):
        conn.execute("ALTER TABLE archive DROP COLUMN data_in")
