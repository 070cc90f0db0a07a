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

With ``--scopes mixed`` the checks above are made over the *full* peers (the canonical state of
what they and the scope let through), and a peer reached only through scoped links holds a
subset, judged by what docs/scopes.md promises: :func:`intent_view` (every message of the
scope's intent and no other), the messages it admitted processed alone reach its state (closure-complete),
and :func:`scope_reads` answer as on a full replica (:func:`answers`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.permissions import PERMISSIONS_PROTOCOL_URI
from p2psync.dwn.protocols import ProtocolsQuery
from p2psync.dwn.records import ALL_RECORDS_FILTER, create_records_query, create_records_read
from p2psync.dwn.store import Store
from p2psync.replication.checkpoint import DirectionCheckpoint
from p2psync.replication.scope import SyncScope
from p2psync.sim.writers import Authored, Cast

__all__ = ["CLASSES", "Finding", "ReplicaState", "answers", "archived", "canonical_state", "in_intent",
           "intent_view", "listed_without_roles", "protocol_view", "replica_state", "scope_reads"]

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


# == subsets (``--scopes mixed``) ===============================================================


def _under(prefix: str, value: Any) -> bool:
    """``value`` is ``prefix`` or lies under it, ``/``-segment-wise."""
    return isinstance(value, str) and (value == prefix or value.startswith(prefix + "/"))


def in_intent(scope: SyncScope, indexes: dict[str, Any]) -> bool:
    """Whether a message (by the index key-values kept with it; a delete's are its record's) is
    in ``scope``'s intent, restated from docs/scopes.md for the judge rather than taken from
    :meth:`SyncScope.matches`, the code under test: its protocol; for a subset, a protocolPath
    under one of the path prefixes and a contextId under one of the context prefixes (each
    when given)."""
    if scope.kind == "global":
        return True
    if indexes.get("protocol") != scope.protocol:
        return False
    paths, contexts = scope.protocol_path_prefixes, scope.context_id_prefixes
    return (not paths or any(_under(p, indexes.get("protocolPath")) for p in paths)) and (
        not contexts or any(_under(c, indexes.get("contextId")) for c in contexts))


def listed_without_roles(scope: SyncScope, indexes: dict[str, Any]) -> bool:
    """Whether a source lists a message for ``scope``, by the effective listing rule as
    protocol/replication-state.md states it (restated for the judge, not
    :meth:`SyncScope.lists`), leaving out rule 3: a role record is listed only once a
    configure makes its path a role, which the judge does not follow."""
    if scope.kind == "global" or in_intent(scope, indexes):
        return True
    protocol, interface = indexes.get("protocol"), indexes.get("interface")
    if protocol == PERMISSIONS_PROTOCOL_URI:  # rule 2: the permissions protocol whole
        return True
    if protocol != scope.protocol:
        return False
    if interface == "Protocols":  # rule 1
        return indexes.get("method") == "Configure"
    if interface != "Records" or indexes.get("method") != "Delete":
        return False
    # Rule 4: a delete of a record that can be an ancestor of a record in the scope.
    path, context = indexes.get("protocolPath"), indexes.get("contextId")
    if not isinstance(path, str):
        return False
    paths, contexts = scope.protocol_path_prefixes, scope.context_id_prefixes
    if paths and not any(p != path and _under(path, p) for p in paths):
        return False
    return not contexts or any(_under(context, c) for c in contexts if isinstance(context, str))


def intent_view(store: Store, tenant: str, scope: SyncScope) -> tuple[frozenset[str], frozenset[tuple[str, str, int]]]:
    """The event-log CIDs of the messages of ``scope``'s intent ``store`` holds (by the index
    key-values logged with them: a delete's are its record's), and the data of their records."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return frozenset(), frozenset()
    cids, records = set(), set()
    for cid, indexes in store.conn.execute("SELECT cid, indexes FROM events WHERE tenant=?", (tid,)):
        facts = json.loads(indexes)
        if in_intent(scope, facts):
            cids.add(str(cid))
            records.add(facts.get("recordId"))
    data = frozenset((str(r), str(d), int(n)) for r, d, n in store.conn.execute(
        "SELECT record_id, data_cid, size FROM data WHERE tenant=?", (tid,)) if r in records)
    return frozenset(cids), data


def protocol_view(store: Store, tenant: str, protocol: str) -> frozenset[str]:
    """The event-log CIDs of the messages of ``protocol`` ``store`` holds (a delete's protocol
    is its record's, logged with it)."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return frozenset()
    return frozenset(str(cid) for cid, indexes in store.conn.execute(
        "SELECT cid, indexes FROM events WHERE tenant=?", (tid,)) if json.loads(indexes).get("protocol") == protocol)


def archived(store: Store, tenant: str) -> set[str]:
    """The CIDs of every message ``store`` ever admitted for ``tenant`` (its archive)."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return set()
    return {str(c) for (c,) in store.conn.execute("SELECT cid FROM archive WHERE tenant=?", (tid,))}


Read = tuple[str, dict[str, Any]]  # (who, the read message)


def scope_reads(cast: Cast, scope: SyncScope, reference: Store, tenant: str) -> list[Read]:
    """Reads that stay inside ``scope`` (docs/scopes.md: they answer on a subset replica as on
    the full DWN) for the users the writers act as, built from the records ``reference`` holds:
    the protocol's definitions; a query of each path in the scope (in each context prefix) by
    alice, bob and carol; carol's queries under her roles (a thread's participant, a member);
    alice's read of each record in the scope, and carol's of each chat as a member."""
    assert scope.protocol is not None
    protocol, at = scope.protocol, QUERY_TIMESTAMP
    tid = reference.tenant_id(tenant, create=False)
    rows = [] if tid is None else reference.conn.execute(
        "SELECT DISTINCT record_id, protocol_path, context_id FROM messages"
        " WHERE tenant=? AND protocol=? AND interface='Records' AND method='Write' ORDER BY record_id",
        (tid, protocol)).fetchall()
    inside = [(str(r), str(p), str(c)) for r, p, c in rows
              if scope.matches({"protocol": protocol, "protocolPath": p, "contextId": c})]
    contexts: list[str | None] = list(scope.context_id_prefixes) or [None]

    def where(path: str, context: str | None) -> dict[str, Any]:
        flt = {"protocol": protocol, "protocolPath": path}
        return flt if context is None else {**flt, "contextId": context}

    reads: list[Read] = [("alice", ProtocolsQuery.create(signer=cast.alice, filter={"protocol": protocol},
                                                         message_timestamp=at).message)]
    for path in sorted({p for _, p, _ in inside}):
        for context in contexts:
            for name in ("alice", "bob", "carol"):
                reads.append((name, create_records_query(signer=getattr(cast, name), filter=where(path, context),
                                                         message_timestamp=at)))
    if scope.matches(where("thread/chat", None)) or scope.context_id_prefixes:
        for thread in sorted({c.split("/")[0] for _, _, c in inside}):
            reads.append(("carol", create_records_query(signer=cast.carol, filter=where("thread/chat", thread),
                                                        protocol_role="thread/participant", message_timestamp=at)))
        for context in contexts:
            reads.append(("carol", create_records_query(signer=cast.carol, filter=where("thread/chat", context),
                                                        protocol_role="member", message_timestamp=at)))
    for record, path, _ in inside:
        reads.append(("alice", create_records_read(signer=cast.alice, filter={"recordId": record},
                                                   message_timestamp=at)))
        if path == "thread/chat":
            reads.append(("carol", create_records_read(signer=cast.carol, filter={"recordId": record},
                                                       protocol_role="member", message_timestamp=at)))
    return reads


def answers(dwn: Dwn, tenant: str, reads: list[Read]) -> list[tuple[int, list[str]]]:
    """Each read's code and what it returned: the CIDs of the messages (as sent) and of a read's
    record, and a digest of its data (the comparison tests/replication/test_shuffle.py makes)."""
    out = []
    for _, message in reads:
        reply = dwn.process_message(tenant, message)
        seen = [message_cid(_as_sent(e)) for e in reply.entries or []]
        if reply.entry is not None and isinstance(reply.entry.get("recordsWrite"), dict):
            seen.append(message_cid(_as_sent(reply.entry["recordsWrite"])))
        if reply.data is not None:
            seen.append(hashlib.sha256(reply.data).hexdigest()[:16])
        out.append((reply.code, seen))
    return out


def _as_sent(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in ("encodedData", "initialWrite")}
