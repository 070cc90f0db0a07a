"""A record's lifecycle as a store holds it: every write and delete it admitted, which one is in
force, what replaced the others and where each came from (``p2psync show``), and the records a
query no longer lists (``p2psync query --include-deleted``).

Read from the archive (every admitted message, in canonical order: docs/replication-apply.md),
the state (what is held now) and the origins (the store a replicated message came from). The
archive is the same on every replica that admitted the same messages, and so is the origin of
each message between two devices, so two replicas tell the same history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from p2psync.dwn import urls
from p2psync.dwn.generic_message import get_author
from p2psync.dwn.store import Store
from p2psync.state.copies import Origins, store_id

__all__ = ["HistoryEntry", "RecordHistory", "RemovedRecord", "record_history", "removed_records"]

Status = Literal["in-force", "superseded", "lost", "refused", "pruned", "dropped"]
RecordState = Literal["live", "deleted", "pruned", "absent"]

#: What each status means, for people (docs/cli.md says the same).
STATUS_TEXT: Final[dict[str, str]] = {
    "in-force": "in force",
    "superseded": "superseded by",  # a later message from the same store
    "lost": "lost to",  # a later message from another store won (newest wins): a conflict
    "refused": "refused",  # the rules refused it at its place, and nothing named replaced it
    "pruned": "pruned by",  # an ancestor's pruning delete removed the record
    "dropped": "not held",
}


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One RecordsWrite or RecordsDelete of a record, as this store admitted it."""

    cid: str
    kind: str  # "RecordsWrite" | "RecordsDelete"
    timestamp: str  # messageTimestamp: a write's dateModified
    author: str | None
    initial: bool
    origin: str | None  # the storeId it arrived from; None: written here (or no origin kept)
    held: bool  # the state holds it now
    accepted: bool  # processing in canonical order accepted it
    status: Status
    by: str | None = None  # the message that replaced, refused or pruned it
    data_cid: str | None = None
    data_size: int | None = None
    prune: bool | None = None  # a delete's prune flag

    @property
    def conflict(self) -> bool:
        """Lost to a write from another store: two devices wrote, and this one's did not win."""
        return self.status == "lost"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messageCid": self.cid, "kind": self.kind, "messageTimestamp": self.timestamp,
                               "author": self.author, "initial": self.initial, "origin": self.origin,
                               "held": self.held, "status": self.status}
        if self.by is not None:
            out["by"] = self.by
        if self.kind == "RecordsWrite":
            out["dataCid"], out["dataSize"] = self.data_cid, self.data_size
        else:
            out["prune"] = bool(self.prune)
        return out


@dataclass(slots=True)
class RecordHistory:
    """What ``p2psync show RECORD`` prints."""

    tenant: str
    record_id: str
    here: str  # this store's storeId
    state: RecordState
    entries: list[HistoryEntry] = field(default_factory=list)
    in_force: str | None = None  # the write (live) or delete (deleted) the state holds
    descriptor: dict[str, Any] = field(default_factory=dict)  # the initial write's
    context_id: str | None = None
    pruned_by: str | None = None  # an ancestor's pruning delete, when the record is pruned
    pruned_descendants: int = 0  # records its own pruning delete removed

    @property
    def conflicts(self) -> list[HistoryEntry]:
        return [e for e in self.entries if e.conflict]

    def to_json(self) -> dict[str, Any]:
        d = self.descriptor
        out: dict[str, Any] = {"tenant": self.tenant, "recordId": self.record_id, "storeId": self.here,
                               "state": self.state, "inForce": self.in_force}
        for key in ("protocol", "protocolPath", "schema", "recipient", "dataFormat", "dateCreated"):
            if key in d:
                out[key] = d[key]
        if self.context_id is not None:
            out["contextId"] = self.context_id
        if self.pruned_by is not None:
            out["prunedBy"] = self.pruned_by
        out["prunedDescendants"] = self.pruned_descendants
        out["messages"] = [e.to_json() for e in self.entries]
        return out


@dataclass(frozen=True, slots=True)
class _Archived:
    cid: str
    stored_cid: str
    initial: bool
    accepted: bool
    message: dict[str, Any]

    @property
    def method(self) -> str:
        return str(self.message["descriptor"].get("method"))


def _archived(store: Store, tid: int, record_id: str) -> list[_Archived]:
    rows = store.conn.execute(
        "SELECT cid, stored_cid, initial, accepted, body FROM archive WHERE tenant=? AND record_id=? ORDER BY sort_key",
        (tid, record_id),
    ).fetchall()
    return [_Archived(str(c), str(s), bool(i), bool(a), json.loads(str(b))) for c, s, i, a, b in rows]


def _held(store: Store, tid: int, record_id: str) -> set[str]:
    rows = store.conn.execute("SELECT cid FROM messages WHERE tenant=? AND record_id=?", (tid, record_id))
    return {str(r[0]) for r in rows}


def _pruning_ancestor(store: Store, tid: int, context_id: str | None, record_id: str) -> str | None:
    """The accepted pruning delete of an ancestor record that removed ``record_id``, if any."""
    if not context_id:
        return None
    ancestors = [s for s in context_id.split("/") if s and s != record_id]
    for ancestor in reversed(ancestors):  # the nearest first
        for a in _archived(store, tid, ancestor):
            d = a.message["descriptor"]
            if a.method == "Delete" and d.get("prune") is True and a.accepted:
                return a.cid
    return None


def _pruned_descendants(store: Store, tid: int, context_id: str) -> int:
    """Records under ``context_id`` that were admitted here and of which nothing is held."""
    row = store.conn.execute(
        "SELECT count(DISTINCT a.record_id) FROM archive a WHERE a.tenant=? AND a.initial=1 "
        "AND json_extract(a.body, '$.contextId') LIKE ? "
        "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.tenant=a.tenant AND m.record_id=a.record_id)",
        (tid, context_id.replace("%", "").replace("_", "") + "/%"),
    ).fetchone()
    return int(row[0]) if row else 0


def record_history(store: Store, tenant: str, record_id: str) -> RecordHistory | None:
    """The history of ``record_id`` in ``tenant``, or None when this store never admitted a
    message of it."""
    here = store_id(store)
    tid = store.tenant_id(tenant, create=False)
    archived = [] if tid is None else _archived(store, tid, record_id)
    if tid is None or not archived:
        return None
    held = _held(store, tid, record_id)
    origins = Origins(store).of(tenant, [a.cid for a in archived])
    initial = next((a for a in archived if a.initial), None)
    context_id = initial.message.get("contextId") if initial is not None else None
    history = RecordHistory(tenant, record_id, here, "absent", context_id=context_id,
                            descriptor=dict(initial.message["descriptor"]) if initial is not None else {})

    is_held = [a.stored_cid in held or a.cid in held for a in archived]
    deletes = [i for i, a in enumerate(archived) if a.method == "Delete" and is_held[i]]
    writes = [i for i, a in enumerate(archived) if a.method == "Write" and is_held[i]]
    in_force: int | None = None
    if deletes:
        in_force, history.state = deletes[-1], "deleted"
    elif writes:
        in_force, history.state = writes[-1], "live"
    else:
        history.pruned_by = _pruning_ancestor(store, tid, context_id if isinstance(context_id, str) else None,
                                              record_id)
        if history.pruned_by is not None:
            history.state = "pruned"
    if in_force is not None:
        history.in_force = archived[in_force].cid

    def origin(i: int) -> str:
        return origins.get(archived[i].cid, here)

    for i, a in enumerate(archived):
        by: int | None = None
        if i == in_force:
            status: Status = "in-force"
        elif a.accepted:
            # Replaced by the next accepted message of the record (a newer write, a delete).
            by = next((j for j in range(i + 1, len(archived)) if archived[j].accepted), None)
            status = "superseded" if by is not None else ("pruned" if history.pruned_by else "dropped")
        else:
            # Refused at its place: by what was in force there (a delete, an older delete).
            by = next((j for j in range(i - 1, -1, -1) if archived[j].accepted), None)
            status = "superseded" if by is not None else "refused"
        if status == "superseded" and by is not None and origin(by) != origin(i):
            status = "lost"
        d = a.message["descriptor"]
        by_cid = archived[by].cid if by is not None else (history.pruned_by if status == "pruned" else None)
        history.entries.append(HistoryEntry(
            cid=a.cid, kind=f"Records{a.method}", timestamp=str(d.get("messageTimestamp")),
            author=get_author(a.message), initial=a.initial, origin=origins.get(a.cid), held=is_held[i],
            accepted=a.accepted, status=status, by=by_cid,
            data_cid=d.get("dataCid"), data_size=d.get("dataSize"),
            prune=d.get("prune") if a.method == "Delete" else None,
        ))
    if isinstance(context_id, str) and any(a.method == "Delete" and a.message["descriptor"].get("prune") is True
                                           for a in archived):
        history.pruned_descendants = _pruned_descendants(store, tid, context_id)
    return history


@dataclass(frozen=True, slots=True)
class RemovedRecord:
    """A record this store admitted that a query no longer lists: deleted, or pruned."""

    record_id: str
    state: RecordState  # "deleted" | "pruned" | "absent" (every write refused)
    descriptor: dict[str, Any]  # its initial write's
    context_id: str | None
    by: str | None  # the delete in force, or the ancestor's pruning delete
    at: str | None  # when (that delete's messageTimestamp)


def _matches(descriptor: dict[str, Any], context_id: str | None, flt: dict[str, Any]) -> bool:
    for key, value in flt.items():
        if key == "contextId":
            if context_id is None or not (context_id == value or context_id.startswith(f"{value}/")):
                return False
        elif key == "protocol":
            if descriptor.get("protocol") != urls.normalize_protocol_url(value):
                return False
        elif key == "schema":
            if descriptor.get("schema") != urls.normalize_schema_url(value):
                return False
        elif descriptor.get(key) != value:
            return False
    return True


def removed_records(store: Store, tenant: str, flt: dict[str, Any] | None = None) -> list[RemovedRecord]:
    """The records of ``tenant`` admitted here of which no write is in force (deleted, pruned),
    in the order their initial writes sort, narrowed by ``flt`` (protocol, protocolPath,
    schema, contextId — a prefix, as a query's — recipient)."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return []
    rows = store.conn.execute(
        "SELECT a.record_id, a.body FROM archive a WHERE a.tenant=? AND a.initial=1 AND NOT EXISTS ("
        " SELECT 1 FROM messages m WHERE m.tenant=a.tenant AND m.record_id=a.record_id"
        " AND m.interface='Records' AND m.method='Write'"
        " AND json_extract(m.indexes, '$.isLatestBaseState') IN (1, 'true'))"
        " ORDER BY a.sort_key",
        (tid,),
    ).fetchall()
    out: list[RemovedRecord] = []
    for record_id, body in rows:
        message = json.loads(str(body))
        descriptor, context_id = message["descriptor"], message.get("contextId")
        if flt and not _matches(descriptor, context_id, flt):
            continue
        history = record_history(store, tenant, str(record_id))
        if history is None or history.state == "live":
            continue
        by = history.in_force if history.state == "deleted" else history.pruned_by
        at = next((e.timestamp for e in history.entries if e.cid == by), None)
        if history.state == "pruned" and by is not None:
            at = _timestamp_of(store, tid, by)
        out.append(RemovedRecord(str(record_id), history.state, descriptor, context_id, by, at))
    return out


def _timestamp_of(store: Store, tid: int, cid: str) -> str | None:
    row = store.conn.execute("SELECT body FROM archive WHERE tenant=? AND cid=?", (tid, cid)).fetchone()
    return None if row is None else str(json.loads(str(row[0]))["descriptor"].get("messageTimestamp"))
