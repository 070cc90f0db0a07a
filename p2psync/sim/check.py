"""The invariants a run is judged by, after quiescence (and the ones watched while it runs).

- **converged**: every replica holds the same messages and answers the owner's RecordsQuery
  (every record) the same; and that state is the *canonical* state of the union — what a
  fresh store holds after ``Dwn.process_message`` of every message any device accepted, in
  (messageTimestamp, message CID) order. A difference from canonical is reported apart.
- **nothing lost**: every message a device accepted is held by every replica, or is absent
  from the canonical state too (superseded there by a documented rule).
- **checkpoints**: a direction's frontier only moves back through a logged rewind or reset,
  and no frontier covers a message its store lacks (unless canonical lacks it as well).
- **no link stuck**: every link's last round succeeded, it is ``live``, and its frontiers
  stand at the heads of the logs they follow.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records import ALL_RECORDS_FILTER, create_records_query
from p2psync.dwn.store import Store
from p2psync.replication.checkpoint import DirectionCheckpoint
from p2psync.sim.writers import Authored

__all__ = ["CLASSES", "Finding", "ReplicaState", "canonical_state", "replica_state"]

#: Outcome classes, most severe first: a seed takes the first class any of its findings has.
CLASSES: Final = ("stuck", "lost", "diverged")
#: The owner's query is made at a fixed time, after every write of a run.
QUERY_TIMESTAMP: Final = "2099-01-01T00:00:00.000000Z"


@dataclass(frozen=True)
class Finding:
    """One broken invariant: its class (``CLASSES``), a short kind and what was seen."""

    cls: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.cls}/{self.kind}: {self.detail}"


@dataclass(frozen=True)
class ReplicaState:
    """What one replica holds of the tenant, in comparable form."""

    messages: frozenset[str]  # event-log CIDs (the messages as sent)
    data: frozenset[tuple[str, str, int]]  # (recordId, dataCid, size)
    query: str  # the owner's RecordsQuery of every record, as JSON

    def differences(self, other: ReplicaState) -> str:
        parts = []
        if self.messages != other.messages:
            only_a, only_b = sorted(self.messages - other.messages), sorted(other.messages - self.messages)
            parts.append(f"messages +{len(only_a)}/-{len(only_b)} ({_short(only_a)} | {_short(only_b)})")
        if self.data != other.data:
            parts.append(f"data {len(self.data)} vs {len(other.data)}")
        if self.query != other.query:
            parts.append("query results differ")
        return "; ".join(parts) or "same"


def _short(cids: list[str]) -> str:
    return ",".join(c[-8:] for c in cids[:3]) + ("…" if len(cids) > 3 else "")


def replica_state(store: Store, owner: Identity) -> ReplicaState:
    tenant = owner.did
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        messages: frozenset[str] = frozenset()
        data: frozenset[tuple[str, str, int]] = frozenset()
    else:
        conn = store.conn
        messages = frozenset(str(c) for (c,) in conn.execute("SELECT cid FROM events WHERE tenant=?", (tid,)))
        data = frozenset(
            (str(r), str(d), int(s))
            for r, d, s in conn.execute("SELECT record_id, data_cid, size FROM data WHERE tenant=?", (tid,))
        )
    query = create_records_query(signer=owner, filter=dict(ALL_RECORDS_FILTER), message_timestamp=QUERY_TIMESTAMP)
    reply = Dwn(store).process_message(tenant, query)
    entries: Any = reply.entries if reply.code == 200 else {"code": reply.code}
    return ReplicaState(messages, data, json.dumps(entries, sort_keys=True, default=str))


def canonical_state(path: Path, owner: Identity, union: Iterable[Authored]) -> tuple[ReplicaState, dict[str, int]]:
    """Process ``union`` in canonical order into a fresh store at ``path``; returns its state
    and how many messages it refused (by reply code)."""
    store = Store(path)
    try:
        dwn = Dwn(store)
        refused: dict[str, int] = {}
        for authored in sorted(union, key=lambda a: (a.timestamp, a.cid)):
            reply = dwn.process_message(owner.did, authored.message, authored.data)
            if reply.code not in (202, 204):
                refused[str(reply.code)] = refused.get(str(reply.code), 0) + 1
        return replica_state(store, owner), refused
    finally:
        store.close()


def regressed(old: DirectionCheckpoint, new: DirectionCheckpoint) -> bool:
    """Whether ``new`` is behind ``old`` (a frontier moved back, or to another domain)."""
    for before, after in ((old.contiguous_applied_token, new.contiguous_applied_token),
                          (old.received_token, new.received_token)):
        if before is None:
            continue
        if after is None or not after.same_domain(before) or after.position < before.position:
            return True
    return False
