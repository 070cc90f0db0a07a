"""Replica stores for the pipeline tests, made by the real engine from subsets of one story.

Every message is authored once (deterministic keys and clock), and each replica processes
the subset it is meant to hold, in story order, through ``Dwn.process_message``. What a
replica then holds is whatever the engine kept (a delete prunes the record's updates).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store, copy_store_files
from p2psync.pipeline.export import export_store
from tests.replication.support import ChatWorld, Step, chat_world, grant_world, process_all

EXTRA_NOTES = 30  # root records held by three of four replicas: enough to see the sources spread
BOB_NOTES = 5


@dataclass
class Story:
    """Every message of the story by name, and the tenant each belongs to."""

    steps: dict[str, Step] = field(default_factory=dict)
    tenant_of: dict[str, str] = field(default_factory=dict)

    def add(self, tenant: str, step: Step) -> None:
        self.steps[step.name] = step
        self.tenant_of[step.name] = tenant

    def cid(self, name: str) -> str:
        return self.steps[name].cid

    def names_of(self, cids: Iterable[str]) -> set[str]:
        by_cid = {s.cid: n for n, s in self.steps.items()}
        return {by_cid[c] for c in cids}


def reconcile_story() -> tuple[Story, ChatWorld]:
    """alice's chat story plus 30 notes, and bob's 5 plain records on his own DWN."""
    w = chat_world()
    for i in range(EXTRA_NOTES):
        w.write(f"n{i:02d}", w.alice, "note", f"note {i}".encode())
    story = Story()
    for step in w.ordered():
        story.add(w.tenant, step)
    for i in range(BOB_NOTES):
        now = w.clock.tick()
        data = f"bob {i}".encode()
        write = RecordsWrite.create(signer=w.bob, data=data, data_format="text/plain",
                                    schema="https://p2psync.example/schemas/memo",
                                    message_timestamp=now, date_created=now)
        story.add(w.bob.did, Step(f"b{i}", write.message, data))
    return story, w


NOTES = [f"n{i:02d}" for i in range(EXTRA_NOTES)]
CHAT_STEPS = ["protocol", "thread", "participant", "chat", "reaction", "note", "note-update", "note-delete"]
BOB = [f"b{i}" for i in range(BOB_NOTES)]

#: What each replica processes (in story order).
REPLICA_SUBSETS: dict[str, list[str]] = {
    "r1": [*CHAT_STEPS, *NOTES, *BOB],
    "r2": [s for s in CHAT_STEPS if s not in ("chat", "reaction")] + NOTES + BOB[:4],
    "r3": [s for s in CHAT_STEPS if s not in ("note-update", "note-delete")],
    "r4": [s for s in CHAT_STEPS if s != "note-delete"] + NOTES,
}


def build_replica(path: Path, story: Story, names: Iterable[str]) -> Store:
    store = Store(path)
    dwn = Dwn(store)
    wanted = set(names)
    for name, step in story.steps.items():
        if name in wanted:
            process_all(dwn, story.tenant_of[name], [step])
    return store


def build_and_export(root: Path, story: Story, subsets: dict[str, list[str]]) -> dict[str, Path]:
    """Build each replica store under ``root`` and export it; returns replica id -> export dir."""
    exports: dict[str, Path] = {}
    for rid, names in subsets.items():
        store = build_replica(root / f"{rid}.db", story, names)
        store.close()
        exports[rid] = root / f"{rid}-export"
        export_store(root / f"{rid}.db", exports[rid], replica_id=rid)
    return exports


def held(path: Path) -> dict[str, set[str]]:
    """tenant -> CIDs a store holds."""
    store = Store(path)
    try:
        return {t: set(store.messages.cids(t)) for t in store.tenants()}
    finally:
        store.close()


# --------------------------------------------------------------------------- audit


def audit_story() -> tuple[Story, ChatWorld]:
    """The chat story and the grant story on alice's DWN (one protocol configure for both)."""
    w = chat_world()
    g = grant_world()
    story = Story()
    for step in w.ordered():
        story.add(w.tenant, step)
    for name in ("grant", "granted-note"):
        story.add(w.tenant, g.steps[name])
    return story, w


def delete_messages(store_path: Path, tenant: str, cids: Iterable[str]) -> None:
    """Remove messages (and their log entries) behind the engine's back: an injected fault."""
    store = Store(store_path)
    try:
        with store.transaction():
            for cid in cids:
                assert store.messages.has(tenant, cid), cid
                store.messages.delete(tenant, cid)
            store.events.delete_events_by_cid(tenant, list(cids))
    finally:
        store.close()


def copy_store(src: Path, dst: Path) -> None:
    """A byte copy of a closed store (the WAL is checkpointed on close), blob files included."""
    copy_store_files(src, dst)


def chat_definition_with_reads() -> dict[str, Any]:
    """A protocol for fan-out: participants read chats; the thread's recipient reads them too."""
    return {
        "protocol": FANOUT_PROTOCOL,
        "published": True,
        "types": {"thread": {}, "participant": {}, "chat": {}},
        "structure": {
            "thread": {
                "$actions": [{"who": "anyone", "can": ["create"]}],
                "participant": {
                    "$role": True,
                    "$actions": [{"who": "author", "of": "thread", "can": ["create"]}],
                },
                "chat": {
                    "$actions": [
                        {"role": "thread/participant", "can": ["create", "read", "query", "subscribe"]},
                        {"who": "recipient", "of": "thread", "can": ["read"]},
                    ],
                },
            },
        },
    }


FANOUT_PROTOCOL = "https://p2psync.example/protocols/fanout-chat"
