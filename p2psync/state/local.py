"""Closure loops between two stores in one process: a local applier, a store-backed fetcher.

:class:`LocalStoreFetcher` answers dependency refs from a store it reads as its owner, with
the seed's strategy per ref type (a ``messageCid`` first). It is what a pusher uses to answer
the receiver's refs, and what tests and tools use to reconcile two stores in-process.
:class:`LocalApplier` applies to a local engine. :func:`reconcile` admits every message of
one store's event log into another through the closure loop.

The fetcher reads with the owner's view: it does not check that a requester may see what it
answers (a transport that serves remote peers must, before answering).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from p2psync.dwn.canonical import archived_data, archived_data_size, archived_messages
from p2psync.dwn.encoding import b64url_decode, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.generic_message import get_newest_message, is_older
from p2psync.dwn.records_util import construct_prefix_filter_as_range_filter
from p2psync.dwn.records_write import is_initial_write
from p2psync.dwn.replication_types import (
    Ancestor,
    CrossProtocolRef,
    DependencyRef,
    Grant,
    InitialWrite,
    KeyDelivery,
    Parent,
    RecordData,
    ReplicationApplyResult,
    Role,
)
from p2psync.dwn.replication_types import Protocol as ProtocolRef
from p2psync.dwn.store import Store
from p2psync.replication.closure import (
    KEY_DELIVERY_PATH,
    KEY_DELIVERY_PROTOCOLS,
    ClosureAdmitter,
    ClosureOutcome,
    ReplicationEntry,
    StoredEntry,
)

__all__ = ["LocalApplier", "LocalStoreFetcher", "ReconcileReport", "reconcile"]

Message = dict[str, Any]

# Data above this size lives in the data store rather than inline (the reference's
# DwnConstant.maxDataSizeAllowedToBeEncoded).
MAX_DATA_SIZE_ENCODED = 30_000


#: What :meth:`LocalStoreFetcher.log_page` reads of a listed message: (the stored JSON, the
#: wire form, the data, the recordId). A message with its wire form (schema 8) and data up to
#: the inline limit comes as its wire form and the data it was admitted with (the archive's
#: bytes: the state keeps them only as base64url inside the JSON); any other as its JSON alone.
StoredRow = tuple[str | None, bytes | None, bytes | None, str | None]

_SENT_AS_STORED = (
    f"m.wire IS NOT NULL AND typeof(a.data) = 'blob' AND length(a.data) BETWEEN 1 AND {MAX_DATA_SIZE_ENCODED}"
)
# A page of the log with what each message needs to be listed (StoredRow). length() of a blob
# reads no overflow page: a large archived body is not read here.
_LOG_PAGE = (
    "SELECT e.position, e.cid,"
    # A superseded protocol definition (no record id) is listed from the archive alone.
    f" CASE WHEN {_SENT_AS_STORED} THEN NULL ELSE coalesce(m.body, CASE WHEN a.record_id IS NULL THEN a.body END) END,"
    f" CASE WHEN {_SENT_AS_STORED} THEN m.wire END,"
    f" CASE WHEN {_SENT_AS_STORED} THEN a.data END,"
    " m.record_id"
    " FROM events e LEFT JOIN messages m ON m.tenant=e.tenant AND m.cid=e.cid"
    " LEFT JOIN archive a ON a.tenant=e.tenant AND a.cid=e.cid"
    " WHERE e.tenant=? AND e.position>? ORDER BY e.position LIMIT ?"
)


class LocalApplier:
    """Applies replicated messages to a local engine (:meth:`Dwn.apply_replicated_message`)."""

    def __init__(self, dwn: Dwn) -> None:
        self.dwn = dwn

    async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
        # The engine is synchronous and quick (~1 ms a message); a caller that must stay
        # responsive runs its closures in a thread that owns the store.
        return self.dwn.apply_replicated_message(tenant, entry.message, entry.data)


class LocalStoreFetcher:
    """Answers dependency refs from ``store``, as its owner would see it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def fetch(self, tenant: str, refs: Sequence[DependencyRef]) -> list[list[ReplicationEntry]]:
        return [self.answer(tenant, ref) for ref in refs]

    def answer(self, tenant: str, ref: DependencyRef) -> list[ReplicationEntry]:
        """The entries that answer one ref (empty when this store has nothing for it)."""
        if ref.message_cid is not None:
            found = self.entry_by_cid(tenant, ref.message_cid)
            return [] if found is None else [found]
        if isinstance(ref, ProtocolRef):
            return self._protocol(tenant, ref.protocol)
        if isinstance(ref, InitialWrite | Parent | Ancestor):
            return self.record_entries(tenant, ref.record_id)
        if isinstance(ref, Grant):
            return self.record_entries(tenant, ref.permission_grant_id)
        if isinstance(ref, CrossProtocolRef):
            return self.record_entries(tenant, ref.record_id, protocol=ref.protocol)
        if isinstance(ref, Role):
            flt: dict[str, Any] = {
                "protocol": ref.protocol,
                "protocolPath": ref.protocol_path,
                "recipient": ref.recipient,
            }
            if ref.context_prefix is not None:
                flt["contextId"] = construct_prefix_filter_as_range_filter(ref.context_prefix)
            return self._live_records(tenant, flt)
        if isinstance(ref, KeyDelivery):
            flt = {
                "protocol": list(KEY_DELIVERY_PROTOCOLS),
                "protocolPath": KEY_DELIVERY_PATH,
                "tag.protocol": ref.protocol,
                "tag.contextId": ref.context_id,
            }
            return self._live_records(tenant, flt)
        if isinstance(ref, RecordData):
            return self._record_data(tenant, ref)
        return []

    # -- strategies ----------------------------------------------------------------------

    def entry_by_cid(self, tenant: str, cid: str) -> ReplicationEntry | None:
        """The stored message with this CID, whatever its interface, with its data when held;
        or the superseded protocol definition with this CID (the log lists those too)."""
        found = self._stored(tenant, cid)
        if found is None:
            return self._superseded_definition(tenant, cid)
        message, stored_cid = found
        indexes = self.store.messages.get_indexes(tenant, stored_cid) or {}
        return self._entry(tenant, message, latest=indexes.get("isLatestBaseState") is True)

    def log_page(self, tenant: str, after: int, limit: int) -> list[tuple[int, str, StoredRow | None]]:
        """The tenant's log entries with position > ``after`` in order, at most ``limit``, as
        (position, messageCid, what :meth:`listed_entry` needs of the message stored under that
        CID, or None). One statement for a page: a read per listed message cost more than
        decoding it (issue #17)."""
        tid = self.store.tenant_id(tenant, create=False)
        if tid is None:
            return []
        return [(int(position), cid, None if body is None and wire is None else (body, wire, data, record_id))
                for position, cid, body, wire, data, record_id in self.store.conn.execute(_LOG_PAGE,
                                                                                         (tid, after, limit))]

    def listed_entry(
        self, tenant: str, cid: str, stored: StoredRow | None = None
    ) -> tuple[ReplicationEntry, int | None] | None:
        """Like :meth:`entry_by_cid`, for a feed that lists before it sends: data kept out of
        line is not read (it travels later, by ``getAttachment``); its size comes instead.
        ``stored``: what :meth:`log_page` read of the message.

        Returns the entry (with inline data only) and the size of its data (None: no data).
        Reading a 10 MiB record per listed item would hold a whole page of them in memory.
        """
        if stored is not None:
            body, wire, data, record_id = stored
            if wire is not None and data is not None:
                # As it travels: no JSON to decode, no base64 to decode, no CBOR to encode.
                return StoredEntry(wire, data, cid, record_id), len(data)
            assert body is not None
            message, stored_cid = json.loads(body), cid
        else:
            found = self._stored(tenant, cid)
            if found is None:
                return None
            message, stored_cid = found
        encoded = message.get("encodedData")
        if isinstance(encoded, str) and encoded:
            # Inline data (every record up to 30,000 bytes): all the entry needs is in the body,
            # and the log's CID is the entry's. Reading the indexes too was a quarter of a
            # listed message's cost on the serving side (issue #17).
            data = b64url_decode(encoded)
            return ReplicationEntry({k: v for k, v in message.items() if k != "encodedData"}, data, cid), len(data)
        indexes = self.store.messages.get_indexes(tenant, stored_cid) or {}
        # The log's CID is the entry's, except for a zero-byte record whose CID keeps its
        # empty ``encodedData`` (FACTS.md): only then is it worth computing again.
        known = cid if message.get("encodedData") != "" else None
        entry = self._entry(tenant, message, latest=indexes.get("isLatestBaseState") is True, load=False, cid=known)
        if entry.data is not None:
            return entry, len(entry.data)
        descriptor = message.get("descriptor", {})
        if self._large_data_held(message, latest=indexes.get("isLatestBaseState") is True):
            size = self.store.data.size(tenant, message["recordId"], descriptor["dataCid"])
            return entry, size
        if _is_write_with_data(entry.message):
            size = archived_data_size(self.store, tenant, cid)  # superseded here, kept in the archive
            if size is not None and size <= MAX_DATA_SIZE_ENCODED:
                kept = archived_data(self.store, tenant, cid)[1]
                if kept is not None:
                    return ReplicationEntry(entry.message, kept, entry.cid), len(kept)
            return entry, size
        return entry, None

    def record_entries(self, tenant: str, record_id: str, protocol: str | None = None) -> list[ReplicationEntry]:
        """A record's initial write, then its newest write with the data (RecordsQuery by recordId).

        A delete is not part of the answer: what depends on a record needs its writes, and a
        delete travels as a message of its own.
        """
        flt: dict[str, Any] = {"interface": "Records", "method": "Write", "recordId": record_id}
        if protocol is not None:
            flt["protocol"] = protocol
        writes, _ = self.store.messages.query(tenant, [flt])
        newest = get_newest_message(writes)
        if newest is None:
            return self._archived_record(tenant, record_id, protocol)
        # Only the latest state holds the data (an older initial write is kept without it).
        live, _ = self.store.messages.query(tenant, [{**flt, "isLatestBaseState": True}])
        out: list[ReplicationEntry] = []
        initial = next((m for m in writes if is_initial_write(m)), None)
        if initial is not None and initial is not newest:
            out.append(self._entry(tenant, initial, latest=False))
        out.append(self._entry(tenant, newest, latest=bool(live)))
        return out

    def _archived_record(self, tenant: str, record_id: str, protocol: str | None) -> list[ReplicationEntry]:
        """A record the state no longer holds (pruned): its initial and newest archived writes.

        A message that sorts before the prune still needs them (docs/replication-apply.md)."""
        writes = [
            (m, d)
            for m, d in archived_messages(self.store, tenant, record_id=record_id)
            if m["descriptor"].get("method") == "Write"
            and (protocol is None or m["descriptor"].get("protocol") == protocol)
        ]
        if not writes:
            return []
        initial = next(((m, d) for m, d in writes if is_initial_write(m)), None)
        picked = [initial] if initial is not None and initial is not writes[-1] else []
        return [ReplicationEntry(m, d) for m, d in [*picked, writes[-1]]]

    def _protocol(self, tenant: str, protocol: str) -> list[ReplicationEntry]:
        """Every definition of the protocol this store admitted, oldest first: the state keeps
        only the newest, but a record written under an earlier one is judged by it."""
        configures, _ = self.store.messages.query(
            tenant, [{"interface": "Protocols", "method": "Configure", "protocol": protocol}]
        )
        newest = get_newest_message(configures)
        if newest is None:
            return []
        newest_cid = message_cid(newest)
        older = [m for m, _ in archived_messages(self.store, tenant, protocol=protocol) if message_cid(m) != newest_cid]
        return [*(ReplicationEntry(m) for m in older if is_older(m, newest)), ReplicationEntry(newest)]

    def _live_records(self, tenant: str, flt: dict[str, Any]) -> list[ReplicationEntry]:
        """Records matching ``flt`` — live ones, and ones since deleted (a message written while
        such a record lived, a role holder's, is judged with it)."""
        matches, _ = self.store.messages.query(
            tenant, [{**flt, "interface": "Records", "method": "Write"}]
        )
        out: list[ReplicationEntry] = []
        for record_id in dict.fromkeys(m["recordId"] for m in matches):
            out.extend(self.record_entries(tenant, record_id))
        return out

    def role_records(
        self, tenant: str, protocol: str, role_paths: Iterable[str], after: str | None, limit: int
    ) -> tuple[list[ReplicationEntry], str | None]:
        """A page of the answer to a ``RoleRecords`` ref (replication-profiles.md §10.2): the
        records of ``protocol`` at ``role_paths`` by ascending recordId after ``after``, each
        whole (its initial and newest write, then its delete when it was deleted: a role that
        was taken back must be gone on the replica too), at most ``limit`` entries; and the
        recordId to continue after, None when this page holds the last of them."""
        paths = sorted(role_paths)
        tid = self.store.tenant_id(tenant, create=False)
        if not paths or tid is None or limit < 1:
            return [], None
        # The page's records alone, by the stored columns (a record's initial write stays stored
        # after its delete): a record brings at least one entry, so `limit` records fill a page.
        # Reading every later role record for each page cost O(n^2 / page) for n role records.
        record_ids = [str(r) for (r,) in self.store.conn.execute(
            "SELECT DISTINCT record_id FROM messages WHERE tenant=? AND interface='Records' AND method='Write'"
            f" AND protocol=? AND protocol_path IN ({','.join('?' * len(paths))}) AND record_id>?"
            " ORDER BY record_id LIMIT ?", (tid, protocol, *paths, after or "", limit + 1))]
        out: list[ReplicationEntry] = []
        for i, record_id in enumerate(record_ids):
            entries = self.record_entries(tenant, record_id)
            deletes, _ = self.store.messages.query(
                tenant, [{"interface": "Records", "method": "Delete", "recordId": record_id}])
            entries.extend(self._entry(tenant, delete, latest=True) for delete in deletes[:1])
            if out and len(out) + len(entries) > limit:
                return out, record_ids[i - 1]
            out.extend(entries)
        return out, None  # (one record more than `limit` always ends the page above)

    def _record_data(self, tenant: str, ref: RecordData) -> list[ReplicationEntry]:
        # A RecordsRead: the newest write with its data, kept only when it is the data asked for.
        entries = self.record_entries(tenant, ref.record_id)
        newest = entries[-1] if entries else None
        if newest is None or newest.data is None:
            return []
        if newest.message["descriptor"].get("dataCid") != ref.data_cid:
            return []
        return [newest]

    # -- building entries -----------------------------------------------------------------

    @staticmethod
    def _large_data_held(stored: Message, *, latest: bool) -> bool:
        """Whether the store keeps this message's data out of line (only the latest state has it)."""
        descriptor = stored.get("descriptor", {})
        return (
            latest
            and "encodedData" not in stored
            and descriptor.get("interface") == "Records"
            and descriptor.get("method") == "Write"
            and isinstance(descriptor.get("dataSize"), int)
            and descriptor["dataSize"] > MAX_DATA_SIZE_ENCODED
        )

    def _superseded_definition(self, tenant: str, cid: str) -> ReplicationEntry | None:
        tid = self.store.tenant_id(tenant, create=False)
        row = None if tid is None else self.store.conn.execute(
            "SELECT body FROM archive WHERE tenant=? AND cid=? AND record_id IS NULL AND accepted=1", (tid, cid)
        ).fetchone()
        return None if row is None else ReplicationEntry(json.loads(str(row[0])), None, cid)

    def _stored(self, tenant: str, cid: str) -> tuple[Message, str] | None:
        """The stored message whose CID (the log's, the wire's) is ``cid``, and the CID the state
        keeps it under. They differ only for a zero-byte record, stored with ``encodedData: ""``
        inside its CID (FACTS.md); the archive says under which."""
        message = self.store.messages.get(tenant, cid)
        if message is not None:
            return message, cid
        tid = self.store.tenant_id(tenant, create=False)
        row = None if tid is None else self.store.conn.execute(
            "SELECT stored_cid FROM archive WHERE tenant=? AND cid=?", (tid, cid)).fetchone()
        if row is None or row[0] is None or row[0] == cid:
            return None
        message = self.store.messages.get(tenant, str(row[0]))
        return None if message is None else (message, str(row[0]))

    def _entry(
        self, tenant: str, stored: Message, *, latest: bool, load: bool = True, cid: str | None = None
    ) -> ReplicationEntry:
        """A stored message as it travels: ``encodedData`` taken out as the entry's data
        (and data kept out of line read in, unless ``load`` is false)."""
        message = {k: v for k, v in stored.items() if k != "encodedData"}
        data: bytes | None = None
        encoded = stored.get("encodedData")
        if isinstance(encoded, str):
            data = b64url_decode(encoded)
        elif load and self._large_data_held(stored, latest=latest):
            descriptor = stored["descriptor"]
            data = self.store.data.get(tenant, stored["recordId"], descriptor["dataCid"])
        elif load and not latest and _is_write_with_data(message):
            # A write superseded since it came: the state dropped its data, the archive kept
            # it, and a message sorting before the change may need it (docs/replication-apply.md).
            data = archived_data(self.store, tenant, message_cid(message))[1]
        return ReplicationEntry(message, data, cid or "")


def _is_write_with_data(message: Message) -> bool:
    d = message.get("descriptor", {})
    return d.get("interface") == "Records" and d.get("method") == "Write" and bool(d.get("dataSize"))


# --------------------------------------------------------------------------- reconcile


@dataclass
class ReconcileReport:
    """What :func:`reconcile` did: one outcome per root, in the order they were admitted."""

    outcomes: list[ClosureOutcome] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def passes(self) -> list[int]:
        return [o.passes for o in self.outcomes]


async def reconcile(
    source: Store,
    target: Dwn,
    tenant: str,
    roots: Iterable[ReplicationEntry] | None = None,
) -> ReconcileReport:
    """Admit ``roots`` (default: every message of ``source``'s event log for ``tenant``, in log
    order) into ``target`` through the closure loop, fetching dependencies from ``source``."""
    fetcher = LocalStoreFetcher(source)
    applier = LocalApplier(target)
    if roots is None:
        roots = _log_entries(fetcher, tenant)
    report = ReconcileReport()
    for root in roots:
        report.outcomes.append(await ClosureAdmitter(tenant, root).admit(applier, fetcher))
    return report


def _log_entries(fetcher: LocalStoreFetcher, tenant: str) -> Iterable[ReplicationEntry]:
    for _, cid in fetcher.store.events.read(tenant):
        entry = fetcher.entry_by_cid(tenant, cid)
        if entry is not None:
            yield entry
