"""The canonical state: what a replica holds is a function of the *set* of messages it admitted.

DWN 0.5.2 judges a message against the current state of what it depends on, so the state a
store reaches depends on the order messages arrive in. The convergence contract
(``docs/replication-apply.md``) fixes one order: the **canonical order**, ``messageTimestamp``
then message CID. The canonical state of a set of messages is what the reference holds after
processing the set in that order, and a replica must hold it whatever order the set arrived in.

:class:`History` keeps that promise. Every admitted message goes into the tenant's
**archive** (its body, its data, and whether processing in canonical order accepted it), and
the materialized tables (``messages``, ``data``) are always the result of processing the
archive in canonical order:

- a message that sorts after everything archived is simply processed (the common case: a
  device writing, a peer catching up in time order);
- a message that sorts before archived ones **warps time**: the state is taken back to the
  message's place by applying, newest first, the inverse of each later message's changes
  (recorded as a SQLite session changeset when it was processed), the message is processed
  there, and the later ones are processed again after it. The cost is the number of messages
  after the insertion point, not the size of the store.

The event log is not rewound: during a warp its entries stay put, and afterwards a message
that is still stored keeps its position, a message no longer stored loses its entry, and a
message newly stored gets a new one (in canonical order). Peers that pulled past a position
see every change as new entries, as after any local write.

**A record whose data went before it arrived.** A source that has since updated or deleted a
record keeps its initial write without data (the reference drops the data of a superseded
write), and sends it that way. Processed without data, the reference stores such an initial
write as not the record's latest state, which would make the record look absent until its next
message — and children, role holders and grant users written in between would be judged
against a record that, in the author's history, existed. So an initial write archived without
data whose record has a later archived message is processed as the record's latest state
without data (*data withheld*): every later message of the record replaces or demotes it
exactly as it would have with its data, so the state after that later message is the
canonical one.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import apsw
import cbor2

from p2psync.dwn.blobs import parse_reference
from p2psync.dwn.encoding import b64url_decode, json_compact, message_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import get_author
from p2psync.dwn.jws import decode_payload
from p2psync.dwn.permissions import PERMISSIONS_PROTOCOL_URI
from p2psync.dwn.protocols import ProtocolsConfigure, fetch_all_role_paths
from p2psync.dwn.records_write import is_initial_write
from p2psync.dwn.reply import Reply
from p2psync.dwn.store import Store

__all__ = [
    "STATEFUL",
    "History",
    "archived_data",
    "archived_data_size",
    "archived_messages",
    "archived_record",
    "archived_without_data",
    "AppendingRun",
    "Placement",
    "Process",
    "RunAborted",
    "Footprint",
    "Verdict",
    "is_stateful",
    "signature_payload",
    "sort_key",
]

log = logging.getLogger(__name__)

Message = dict[str, Any]

# The messages that change a tenant's state; reads, queries and subscriptions do not.
STATEFUL: Final = frozenset({("Records", "Write"), ("Records", "Delete"), ("Protocols", "Configure")})



@dataclass(frozen=True, slots=True)
class Footprint:
    """What processing a message may read (``reads`` includes ``writes``) and change."""

    reads: frozenset[str]
    writes: frozenset[str]

    def text(self) -> str:
        return f"{' '.join(sorted(self.writes))}|{' '.join(sorted(self.reads - self.writes))}"

    @classmethod
    def parse(cls, text: str) -> Footprint:
        writes, _, reads = text.partition("|")
        w = frozenset(writes.split())
        return cls(w | frozenset(reads.split()), w)


# The footprint of a message whose processing may read or change anything.
EVERYTHING: Final = Footprint(frozenset({"*"}), frozenset({"*"}))

# The tables a message's processing changes (the event log is reconciled, not rewound).
_STATE_TABLES: Final = ("messages", "data")


# ``process(tenant, message, data, withheld) -> Reply``: the reference's processing of one
# message (``withheld``: an initial write processed as its record's latest state without data).
Process = Callable[[str, Message, "bytes | None", bool], Reply]


class Verdict(enum.Enum):
    """What becomes of a replicated message once processed at its canonical place."""

    ADMIT = "admit"  # accepted: archived
    KEEP = "keep"  # refused by the state at its place (a rule of the contract): archived, may count later
    DROP = "drop"  # not admitted at all (a dependency is missing, or the message is bad)


Judge = Callable[[Reply], Verdict]


@dataclass(frozen=True, slots=True)
class Placement:
    """The outcome of placing one message in its tenant's canonical order."""

    reply: Reply  # the reference's answer at the message's canonical place
    verdict: Verdict
    stored: bool  # held by the state once every later message was processed again
    warped: int  # how many later messages were processed again (0: it sorted last)


def is_stateful(message: Any) -> bool:
    d = message.get("descriptor") if isinstance(message, dict) else None
    if not isinstance(d, dict):
        return False
    interface, method = d.get("interface"), d.get("method")  # anything, before the integrity check
    return isinstance(interface, str) and isinstance(method, str) and (interface, method) in STATEFUL


def sort_key(message: Message, cid: str) -> str:
    """The message's place in canonical order: ``messageTimestamp``, a space, its CID.

    Timestamps are fixed-width ISO 8601 (the schema insists), so the text sorts as the time.
    """
    return f"{message['descriptor']['messageTimestamp']} {cid}"


def _record_id(message: Message) -> str | None:
    d = message["descriptor"]
    if d.get("interface") != "Records":
        return None
    rid = message.get("recordId") if d.get("method") == "Write" else d.get("recordId")
    return rid if isinstance(rid, str) else None


def archived_data(store: Store, tenant: str, cid: str) -> tuple[bool, bytes | None]:
    """(whether ``cid`` is archived, the data it was admitted with).

    The archive keeps the data of a write whose record was since updated or deleted: a
    message that sorts before that change may still need it (a revocation reads its grant's
    data), so a replica serves it to peers that ask (``LocalStoreFetcher``).
    """
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return False, None
    # Two lookups, each by its index (an OR of the two columns would scan the archive), in
    # one statement: this runs for every replicated message.
    row = store.conn.execute(_ARCHIVED_DATA_SQL, (tid, cid, tid, cid)).fetchone()
    return (False, None) if row is None else (True, _kept_data(store, tid, *row))


def archived_data_size(store: Store, tenant: str, cid: str) -> int | None:
    """The size of the data ``cid`` was admitted with, without reading it (a file's is in its
    reference, a data row's in its ``size``); None if there is none."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return None
    row = store.conn.execute(_ARCHIVED_DATA_SQL, (tid, cid, tid, cid)).fetchone()
    if row is None:
        return None
    data, record_id, data_in = row
    if data is None and data_in is not None:
        size = store.conn.execute(
            "SELECT size FROM data WHERE tenant=? AND record_id=? AND data_cid=?", (tid, record_id, data_in)
        ).fetchone()
        return None if size is None else int(size[0])
    if data is None:
        return None
    return parse_reference(data)[1] if type(data) is str else len(data)


_ARCHIVED_DATA_SQL: Final = (
    "SELECT data, record_id, data_in FROM archive WHERE tenant=? AND cid=?"
    " UNION ALL SELECT data, record_id, data_in FROM archive WHERE tenant=? AND stored_cid=? AND stored_cid IS NOT cid"
    " LIMIT 1"
)

#: Whether a message is archived, by its CID or its stored CID (as :data:`_ARCHIVED_DATA_SQL`).
_ARCHIVED_SQL: Final = (
    "SELECT 1 FROM archive WHERE tenant=? AND cid=?"
    " UNION ALL SELECT 1 FROM archive WHERE tenant=? AND stored_cid=? LIMIT 1"
)


def _kept_data(store: Store, tid: int, data: Any, record_id: Any, data_in: Any) -> bytes | None:
    """An archive row's data: its ``data``, or, when ``data_in`` names the dataCid of a
    ``data`` row that holds it (schema 7: not copied), that row's bytes. Either may be a blob
    reference (schema 9): the file's bytes, checked."""
    if data is not None or data_in is None:
        return store.read_data(data)
    row = store.conn.execute(
        "SELECT bytes FROM data WHERE tenant=? AND record_id=? AND data_cid=?", (tid, record_id, data_in)
    ).fetchone()
    if row is None:  # pragma: no cover - the data row's delete trigger moves its bytes here
        raise DwnError("StoreInternal", f"the data {data_in} of record {record_id} is gone", 500)
    return store.read_data(row[0])
# The archive row a stored CID belongs to. archive_stored holds only the stored CIDs that
# differ from the CID as admitted (schema 6): the others are found as a CID.
_BY_STORED_CID_SQL: Final = (
    "SELECT sort_key, cid FROM archive WHERE tenant=? AND cid=? AND stored_cid=cid"
    " UNION ALL SELECT sort_key, cid FROM archive WHERE tenant=? AND stored_cid=? AND stored_cid IS NOT cid LIMIT 1"
)


def archived_without_data(store: Store, tenant: str, cids: Iterable[str]) -> set[str]:
    """Those of ``cids`` admitted here without their data (a source that had dropped it sent
    them so): held, but a peer that offers the data should still send it (``attach_data``)."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return set()
    conn = store.conn
    return {cid for cid in cids
            if conn.execute(_WITHOUT_DATA_SQL, (tid, cid)).fetchone() is not None}


_WITHOUT_DATA_SQL: Final = (
    "SELECT 1 FROM archive WHERE tenant=? AND cid=? AND data IS NULL AND data_in IS NULL"
    " AND json_extract(body, '$.descriptor.dataSize') >= 0"
)


def archived_record(store: Store, tenant: str, record_id: str) -> bool:
    """Whether the initial write of ``record_id`` was admitted here (held or not)."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return False
    row = store.conn.execute(
        "SELECT 1 FROM archive WHERE tenant=? AND record_id=? AND initial=1", (tid, record_id)
    ).fetchone()
    return row is not None


def archived_messages(
    store: Store, tenant: str, *, record_id: str | None = None, protocol: str | None = None
) -> list[tuple[Message, bytes | None]]:
    """Archived messages, in canonical order, with their data: a record's (``record_id``), or
    the definitions of a protocol (``protocol``). What the state dropped is still here: the
    definition a newer one replaced, the messages of a pruned record."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return []
    if record_id is not None:
        rows = store.conn.execute(
            "SELECT body, data, data_in FROM archive WHERE tenant=? AND record_id=? ORDER BY sort_key", (tid, record_id)
        ).fetchall()
        return [(json.loads(str(body)), _kept_data(store, tid, data, record_id, data_in))
                for body, data, data_in in rows]
    rows = store.conn.execute(
        "SELECT body FROM archive WHERE tenant=? AND record_id IS NULL ORDER BY sort_key", (tid,)
    ).fetchall()
    out: list[tuple[Message, bytes | None]] = []
    for (body,) in rows:
        message = json.loads(str(body))
        definition = message["descriptor"].get("definition")
        if isinstance(definition, dict) and definition.get("protocol") == protocol:
            out.append((message, None))
    return out


def archived_body(store: Store, message: Message) -> str:
    """The text the archive keeps of a message: its JSON (``json_compact``) less ``encodedData``.

    Taken from the messages row its processing just stored when that row is this message, or
    this message plus its data (the same keys in the same order, every value the very same
    object, then ``encodedData``): serializing a 1 KiB message costs ~10 µs.
    """
    if "encodedData" not in message:
        puts: list[tuple[Message, str]] = list(store.messages.recent_puts)
        for stored, text in puts[::-1]:
            if stored is message:
                return text
            keys = list(stored)
            if (
                keys[-1:] == ["encodedData"]
                and keys[:-1] == list(message)
                and all(stored[k] is v for k, v in message.items())
            ):
                # Outside a string a JSON text has `,"` only between members: this is where
                # the last member, encodedData, starts.
                cut = text.rfind(',"encodedData":')
                if cut != -1:
                    return text[:cut] + "}"
    return json_compact({k: v for k, v in message.items() if k != "encodedData"})


def _stored_cid(message: Message, cid: str) -> str:
    """The CID a message is stored under: a 0-byte record is stored with ``encodedData: ""``."""
    d = message["descriptor"]
    if (d.get("interface"), d.get("method")) == ("Records", "Write") and d.get("dataSize") == 0:
        return message_cid({**message, "encodedData": ""})
    return cid


def _authored_initial(message: Message) -> bool:
    """Whether a local write is its record's initial write. A message too malformed to tell
    (no signature, say: its processing refuses it) is not: it takes the session path, as
    every local write did before."""
    try:
        return is_initial_write(message)
    except Exception:  # whatever the malformation, the processing gives the reply
        return False


@dataclass(slots=True)
class _Row:
    id: int
    key: str
    cid: str
    stored_cid: str
    record_id: str | None
    initial: bool
    body: str
    data: bytes | None


_ROW_COLUMNS: Final = "id, sort_key, cid, stored_cid, record_id, initial, body, data, data_in, tenant"


class History:
    """The archive of a store's admitted messages and the canonical replay over it."""

    def __init__(self, store: Store, process: Process) -> None:
        self.store = store
        self._process = process
        # (tenant, protocol) -> (the archive's definitions when read, their role paths)
        self._role_paths: dict[tuple[int, str], tuple[tuple[Any, ...], frozenset[str]]] = {}
        self.warps = 0  # warps done since this object was made (for tests and metrics)
        self.fallbacks = 0  # scoped warps that had to process everything after all
        self.replayed = 0  # messages processed again by them
        self.run_applied = 0  # messages admitted in runs (AppendingRun), and runs rolled back
        self.run_aborts = 0
        self.updates_compact = 0  # later writes that sorted last and took the compact undo
        self._columns: tuple[str, ...] | None = None  # _record_rows_columns

    # -- lookups ---------------------------------------------------------------------------

    def holds(self, tenant: str, cid: str) -> bool:
        """Whether ``cid`` was admitted here (held by the state or archived as superseded)."""
        tid = self.store.tenant_id(tenant, create=False)
        return tid is not None and self.store.conn.execute(_ARCHIVED_SQL, (tid, cid, tid, cid)).fetchone() is not None

    def archived_data(self, tenant: str, cid: str) -> tuple[bool, bytes | None]:
        """(archived, its data) for ``cid``."""
        return archived_data(self.store, tenant, cid)

    def count(self, tenant: str) -> int:
        tid = self.store.tenant_id(tenant, create=False)
        if tid is None:
            return 0
        return int(self.store.scalar("SELECT count(*) FROM archive WHERE tenant=?", (tid,)))

    # -- admitting -------------------------------------------------------------------------

    def author(self, tenant: str, message: Message, data: bytes | None) -> Reply:
        """A locally authored message: the reference's answer against the current state.

        Accepted, it is admitted at its canonical place (usually the end; a device whose
        clock is behind a replicated message's warps).
        """
        cid = message_cid(message)
        key = sort_key(message, cid)
        # One write transaction from the first read: another process (the node applying a
        # batch) must not archive a message between the check of where this one goes and its
        # admission, or it would be processed out of canonical order.
        # An initial write: nothing of its record sorts before it, as in `place` (one statement
        # less a write, issue #17).
        initial = _authored_initial(message)
        with self.store.transaction():
            if not self._sorts_last(tenant, key, _record_id(message), initial=initial):
                # Judge against the current state without keeping anything, then place it.
                reply = self._dry_run(tenant, message, data)
                if reply.code in (202, 204):
                    self.place(tenant, message, data, cid, lambda _: Verdict.ADMIT)
                return reply
            # An initial write that sorts last takes the replicated path's cheap undo (checked,
            # with the session as its fallback), not a session of its own (issue #17).
            reply, undo = (self._appended(tenant, message, data, cid) if initial
                           else self._updated(tenant, message, data, cid))
            if reply.code in (202, 204):
                self._insert(tenant, message, data, cid, key, accepted=True, undo=undo, initial=initial)
        return reply

    def place(self, tenant: str, message: Message, data: bytes | None, cid: str, judge: Judge) -> Placement:
        """Admit a replicated message at its canonical place; ``judge`` reads its reply there."""
        key = sort_key(message, cid)
        record_id = _record_id(message)
        # Computed once (it hashes the descriptor): the checks below and the archive row use it.
        initial = is_initial_write(message)
        with self.store.transaction():
            if self._sorts_last(tenant, key, record_id, initial=initial):
                reply, undo = (self._appended(tenant, message, data, cid) if initial
                               else self._updated(tenant, message, data, cid))
                verdict = judge(reply)
                if verdict is Verdict.DROP:
                    return Placement(reply, verdict, False, 0)
                self._insert(tenant, message, data, cid, key, accepted=reply.code in (202, 204), undo=undo,
                             initial=initial)
                # A compact undo names the message's row, which was just seen stored.
                stored = (undo.startswith((_INSERTED_ROW, _INSERTED_ROW_AND_DATA, _UPDATED_RECORD))
                          or self.store.messages.has(tenant, _stored_cid(message, cid)))
                return Placement(reply, verdict, stored, 0)
            start = self._warp_start(tenant, key, record_id)
            self._insert(tenant, message, data, cid, key, accepted=False, undo=b"", initial=initial)
            outcome: dict[str, Any] = {}

            def at_place(reply: Reply) -> bool:
                outcome["reply"], outcome["verdict"] = reply, judge(reply)
                return outcome["verdict"] is not Verdict.DROP

            scope = self._footprint(self.store._tid(tenant), message, initial)
            warped = self._scoped_warp(tenant, start, cid, at_place, scope)
            reply, verdict = outcome["reply"], outcome["verdict"]
            if verdict is Verdict.DROP and start < key:
                # The message took part in deciding how its record's data-less initial write
                # was processed; with it gone, decide again.
                warped += self._warp(tenant, start, None, None, scope=scope)
            stored = verdict is not Verdict.DROP and self.store.messages.has(tenant, _stored_cid(message, cid))
            return Placement(reply, verdict, stored, warped)

    def attach_data(self, tenant: str, message: Message, data: bytes, cid: str, judge: Judge) -> Placement:
        """An archived message that came without its data, now with it: process it again."""
        tid = self.store._tid(tenant)
        key = sort_key(message, cid)
        with self.store.transaction():
            self.store.conn.execute(
                "UPDATE archive SET data=? WHERE tenant=? AND cid=?", (self.store.keep_data(data), tid, cid)
            )
            outcome: dict[str, Any] = {}

            def at_place(reply: Reply) -> bool:
                outcome["reply"], outcome["verdict"] = reply, judge(reply)
                return True  # already admitted: a refusal now is the contract's, not a drop

            warped = self._scoped_warp(tenant, key, cid, at_place, self._footprint(tid, message))
            reply, verdict = outcome["reply"], outcome["verdict"]
            if verdict is Verdict.DROP:
                verdict = Verdict.KEEP
            stored = self.store.messages.has(tenant, _stored_cid(message, cid))
            return Placement(reply, verdict, stored, warped)

    def rebuild(self, tenant: str) -> int:
        """Process the whole archive again from nothing (a check: the state must not change)."""
        with self.store.transaction():
            return self._warp(tenant, "", None, None)

    def verify(self, tenant: str) -> dict[str, list[str]]:
        """Process the whole archive again from nothing, compare with the state, roll back.

        Returns the stored CIDs the replay would add (``missing``), remove (``extra``) or
        store differently (``changed``), and data rows it would add or drop (``data``): all
        empty when the state is the canonical state of the archive.
        """
        before = _state_rows(self.store, tenant)
        after: dict[str, dict[str, Any]] = {}
        tid, conn = self.store._tid(tenant), self.store.conn
        try:
            with self.store.transaction():
                # From nothing, not by undoing: a state edited behind the engine's back would
                # not take its undo records.
                conn.execute("DELETE FROM messages WHERE tenant=?", (tid,))
                conn.execute("DELETE FROM data WHERE tenant=?", (tid,))
                self.store.events.frozen = True
                try:
                    for (row_id,) in conn.execute(
                        "SELECT id FROM archive WHERE tenant=? ORDER BY sort_key", (tid,)
                    ).fetchall():
                        row = self._row(_int(row_id))
                        withheld = self._withheld(tid, row)
                        self._process(tenant, json.loads(row.body), row.data, withheld)
                finally:
                    self.store.events.frozen = False
                after.update(_state_rows(self.store, tenant))
                raise _RollBack
        except _RollBack:
            pass
        missing = sorted(set(after["messages"]) - set(before["messages"]))
        extra = sorted(set(before["messages"]) - set(after["messages"]))
        changed = sorted(c for c in set(before["messages"]) & set(after["messages"])
                         if before["messages"][c] != after["messages"][c])
        data = sorted(set(before["data"]) ^ set(after["data"]))
        return {"missing": missing, "extra": extra, "changed": changed, "data": data}

    def adopt(self, tenant: str) -> int:
        """Archive the messages a store made before the archive existed (schema v1), then
        rebuild its state from them in canonical order. Returns how many were archived."""
        store, conn = self.store, self.store.conn
        tid = store._tid(tenant)
        with store.transaction():
            rows = conn.execute("SELECT cid, body FROM messages WHERE tenant=?", (tid,)).fetchall()
            touched = {str(stored_cid) for stored_cid, _ in rows}
            for _, body in rows:
                message = json.loads(str(body))
                inline = message.pop("encodedData", None)
                cid = message_cid(message)
                data = _adopted_data(store, tenant, message, inline)
                self._insert(tenant, message, data, cid, sort_key(message, cid), accepted=True, undo=b"")
            conn.execute("DELETE FROM messages WHERE tenant=?", (tid,))
            conn.execute("DELETE FROM data WHERE tenant=?", (tid,))
            self._warp(tenant, "", None, None, touched)
        return len(rows)

    # -- the machinery ---------------------------------------------------------------------

    def _sorts_last(self, tenant: str, key: str, record_id: str | None, *, initial: bool = False) -> bool:
        """Whether ``key`` sorts after everything archived and needs no data-less re-processing.

        ``initial``: the message is its record's initial write, so nothing of its record is
        archived before it (a record has one initial write, and this one is not archived).
        """
        tid = self.store.tenant_id(tenant, create=False)
        if tid is None:
            return True
        conn = self.store.conn
        if conn.execute("SELECT 1 FROM archive WHERE tenant=? AND sort_key>? LIMIT 1", (tid, key)).fetchone():
            return False
        return initial or self._withheld_initial(tid, record_id, key) is None

    def _withheld_initial(self, tid: int, record_id: str | None, key: str) -> str | None:
        """The key of the record's data-less initial write if a message at ``key`` would be its
        first later message (so the initial write must now be processed with data withheld)."""
        if record_id is None:
            return None
        # Such an initial write is the record's last archived row: one seek down the record's
        # index from its end. Looking for the data-less initial write among the record's rows
        # read every one of them, 500 us an update of a record 2,000 updates long (measured).
        row = self.store.conn.execute(
            "SELECT sort_key, initial = 1 AND data IS NULL AND data_in IS NULL FROM archive"
            " WHERE tenant=? AND record_id=? ORDER BY sort_key DESC LIMIT 1",
            (tid, record_id),
        ).fetchone()
        return None if row is None or not row[1] or row[0] >= key else str(row[0])

    def _warp_start(self, tenant: str, key: str, record_id: str | None) -> str:
        withheld = self._withheld_initial(self.store._tid(tenant), record_id, key)
        return key if withheld is None else min(key, withheld)

    def _dry_run(self, tenant: str, message: Message, data: bytes | None) -> Reply:
        """The reference's answer against the current state, with every change rolled back."""
        answer: list[Reply] = []
        try:
            with self.store.transaction():
                answer.append(self._process(tenant, message, data, False))
                raise _RollBack
        except _RollBack:
            pass
        return answer[0]

    def _recorded(self, tenant: str, message: Message, data: bytes | None, *, withheld: bool) -> tuple[Reply, bytes]:
        """Process with a session attached; returns the reply and the changes' inverse."""
        session = apsw.Session(self.store.conn, "main")
        try:
            for table in _STATE_TABLES:
                session.attach(table)
            reply = self._process(tenant, message, data, withheld)
            changes = session.changeset()
        finally:
            session.close()
        return reply, apsw.Changeset.invert(changes) if changes else b""

    def _appended(
        self, tenant: str, message: Message, data: bytes | None, cid: str, withheld: bool = False
    ) -> tuple[Reply, bytes]:
        """An initial write that sorts last, processed; (the reply, what undoes it).

        What a pull in log order does for each record. Its processing stores its own row and
        nothing else of ``messages`` or ``data`` (its record has no other message here, as
        none can sort before it), so its undo is "delete that row, if it is still as stored":
        :data:`_INSERTED_ROW` and a digest of the row, instead of a SQLite session, whose
        pre-update hook, changeset and inverse cost a sixth of the apply (issue #17). That is
        checked, not assumed: unless the connection's change count and the set journal show
        exactly that one row stored (with its log entry), the processing is rolled back and
        done again under a session. A write whose data is kept out of line also adds its
        ``data`` row, new (no row of that key was there before) and seen: its undo
        (:data:`_INSERTED_ROW_AND_DATA`) deletes that row too. A warp processing its rows again
        uses it too (``withheld`` as it processes the row; the event log frozen, so no entry).
        """
        conn, tid = self.store.conn, self.store._tid(tenant)
        one_row = _STORED_ONE_ROW if not self.store.events.frozen else _STORED_ONE_ROW_FROZEN
        stored_cid = _stored_cid(message, cid)
        seq = self.store.scalar("SELECT coalesce(max(seq), 0) FROM set_journal")
        data_key = _data_key(message, data)
        last_data: int = 0
        if data_key is not None:
            # Data kept out of line adds its `data` row. Its undo deletes that row by id (ids
            # are never reused): the row must be new, not one a REPLACE took the place of.
            before = conn.execute(_DATA_BEFORE_SQL, (tid, *data_key)).fetchone()
            if before is None or before[1]:
                return self._recorded(tenant, message, data, withheld=withheld)
            last_data = _int(before[0])

        def undo_of(changes: int) -> bytes | None:
            journal = conn.execute(_JOURNALED_ROWS_SQL, (seq,)).fetchall()
            if len(journal) != 1:
                return None
            journaled_tid, journaled_cid, delta, body, indexes = journal[0]
            if (journaled_tid, journaled_cid, delta) != (tid, stored_cid, 1) or body is None:
                return None
            digest = _row_digest(body, indexes)
            if changes == one_row and data_key is None:
                return _INSERTED_ROW + digest
            if changes == one_row + 1 and data_key is not None:
                added = conn.execute(_DATA_AFTER_SQL, (last_data,)).fetchall()
                if len(added) == 1 and tuple(added[0][1:]) == (tid, *data_key):
                    return _INSERTED_ROW_AND_DATA + digest + _int(added[0][0]).to_bytes(8, "big")
            return None

        return self._checked(tenant, message, data, withheld, undo_of)

    def _checked(
        self, tenant: str, message: Message, data: bytes | None, withheld: bool,
        undo_of: Callable[[int], bytes | None],
    ) -> tuple[Reply, bytes]:
        """Process under a savepoint; ``undo_of(changes)`` reads what the processing changed
        (``changes``: the connection's count of rows it changed) and gives its compact undo, or
        None: then the processing is rolled back and done again under a session."""
        conn = self.store.conn
        changes = conn.total_changes()
        try:
            with self.store.transaction():
                reply = self._process(tenant, message, data, withheld)
                changes = conn.total_changes() - changes
                if changes == 0:
                    return reply, b""  # refused before writing anything
                undo = undo_of(changes)
                if undo is not None:
                    return reply, undo
                raise _RollBack
        except _RollBack:
            pass
        return self._recorded(tenant, message, data, withheld=withheld)

    def _updated(self, tenant: str, message: Message, data: bytes | None, cid: str) -> tuple[Reply, bytes]:
        """A later write of a record that sorts last, processed; (the reply, what undoes it).

        What a pull in log order does for each update. Its processing touches only its
        record's rows of ``messages``: it stores its own, deletes the write it supersedes and
        demotes the initial write in place. Its undo is :data:`_UPDATED_RECORD`: delete the
        new row if it is as stored, put the initial write's texts back if they are as left,
        and put the deleted rows back whole, under their ids (never reused) — what the inverse
        of a SQLite session's changeset does, without the session's pre-update hook, table
        introspection, changeset and inverse (an eighth of an update, issue #17). Checked, not
        assumed, as :meth:`_appended` is: the set journal, the record's rows before and after,
        and the connection's change count must show exactly that, or the processing is rolled
        back and done again under a session. Data kept out of line (this write's or any of its
        record's) takes the session at once: its ``data`` rows may change too.
        """
        d = message.get("descriptor")
        record_id = message.get("recordId")
        if (
            not isinstance(d, dict)
            or (d.get("interface"), d.get("method")) != ("Records", "Write")
            or not isinstance(record_id, str)
            or not _inline(d.get("dataSize"))
        ):
            return self._recorded(tenant, message, data, withheld=False)
        conn, tid = self.store.conn, self.store._tid(tenant)
        if self.store.scalar(_RECORD_HAS_DATA_SQL, (tid, record_id)):
            return self._recorded(tenant, message, data, withheld=False)
        before = {row[0]: row for row in conn.execute(_RECORD_ROWS_SQL, (tid, record_id))}
        columns = self._record_rows_columns()
        seq = self.store.scalar("SELECT coalesce(max(seq), 0) FROM set_journal")
        stored_cid = _stored_cid(message, cid)

        def undo_of(changes: int) -> bytes | None:
            undo = self._update_undo(tid, record_id, stored_cid, columns, before, seq, changes)
            if undo is not None:
                self.updates_compact += 1
            return undo

        return self._checked(tenant, message, data, False, undo_of)

    def _record_rows_columns(self) -> tuple[str, ...]:
        """The names of :data:`_RECORD_ROWS_SQL`'s columns (the schema is settled on open)."""
        if self._columns is None:
            whole = tuple(str(row[1]) for row in self.store.conn.execute("PRAGMA table_xinfo(messages)"))
            self._columns = ("cid", "body", "indexes", *whole)
        return self._columns

    def _update_undo(
        self, tid: int, record_id: str, stored_cid: str, columns: tuple[str, ...], before: dict[str, tuple[Any, ...]],
        seq: int, changes: int,
    ) -> bytes | None:
        """The compact undo of an :meth:`_updated` write, or None when its processing changed
        anything but its record's rows as an update does."""
        conn = self.store.conn
        added: list[tuple[Any, Any]] = []
        removed: list[str] = []
        for journaled_tid, journaled_cid, delta, body, indexes in conn.execute(_JOURNALED_ROWS_SQL, (seq,)):
            if journaled_tid != tid:
                return None
            if delta == 1 and journaled_cid == stored_cid and body is not None:
                added.append((body, indexes))
            elif delta == -1 and journaled_cid in before and journaled_cid not in removed:
                removed.append(journaled_cid)
            else:
                return None
        if len(added) != 1 or stored_cid in before:
            return None
        after = {row[0]: row for row in conn.execute(_RECORD_ROWS_SQL, (tid, record_id))}
        if after.keys() != (before.keys() - set(removed)) | {stored_cid}:
            return None
        demoted: list[tuple[str, Any, Any, bytes]] = []
        for row_cid, row in before.items():
            now = after.get(row_cid)
            if now is None or now == row:
                continue
            if any(was != is_ and name not in ("body", "indexes")
                   for name, was, is_ in zip(columns, row, now, strict=True)):
                return None
            demoted.append((row_cid, row[1], row[2], _row_digest(now[1], now[2])))
        # Its row, journal entry, log position and entry; each superseded row, its journal
        # entry and its log entry; each demoted row. (No log changes while the log is frozen.)
        if self.store.events.frozen:
            expected = _STORED_ONE_ROW_FROZEN + 2 * len(removed) + len(demoted)
        else:
            expected = _STORED_ONE_ROW + 3 * len(removed) + len(demoted)
        if changes != expected:
            return None
        return _UPDATED_RECORD + cbor2.dumps(
            [stored_cid, _row_digest(*added[0]), list(columns[_WHOLE_ROW:]),
             [list(before[c][_WHOLE_ROW:]) for c in removed], [list(d) for d in demoted]]
        )

    def _undo_update(self, tid: int, undo: bytes, touched: set[str]) -> None:
        """Undo an :meth:`_updated` write (its :data:`_UPDATED_RECORD` undo, less the marker).
        A row not as the write left it, or one of its old rows already back, means a message
        the warp did not take changed them: refused like a changeset conflict."""
        stored_cid, digest, columns, removed, demoted = cbor2.loads(undo)
        conn = self.store.conn
        self._delete_inserted(tid, stored_cid, digest)
        touched.add(stored_cid)
        for row_cid, body, indexes, now in demoted:
            row = conn.execute(
                "SELECT id, body, indexes FROM messages WHERE tenant=? AND cid=?", (tid, row_cid)
            ).fetchone()
            if row is None or _row_digest(row[1], row[2]) != now:
                raise apsw.AbortError(f"undoing {stored_cid}: {row_cid} is not as it left it")
            conn.execute("UPDATE messages SET body=?, indexes=? WHERE id=?", (body, indexes, row[0]))
        insert = f"INSERT INTO messages({', '.join(columns)}) VALUES({', '.join('?' * len(columns))})"
        cid_at = columns.index("cid")
        for values in removed:
            try:
                conn.execute(insert, values)
            except apsw.ConstraintError as e:
                raise apsw.AbortError(f"undoing {stored_cid}: a superseded row is back already ({e})") from e
            touched.add(values[cid_at])

    def _insert(
        self, tenant: str, message: Message, data: bytes | None, cid: str, key: str, *, accepted: bool, undo: bytes,
        initial: bool | None = None,
    ) -> None:
        """Archive a message (a new row). ``initial``: whether it is its record's initial write,
        when the caller knows it already."""
        tid = self.store._tid(tenant)
        if initial is None:
            initial = is_initial_write(message)
        footprint = self._footprint(tid, message, initial)
        # An appended write whose data row was just added (and seen, `_appended`): the archive
        # names that row rather than copying its bytes.
        data_in = message["descriptor"]["dataCid"] if undo.startswith(_INSERTED_ROW_AND_DATA) else None
        self.store.conn.execute(
            _INSERT_ARCHIVE_SQL,
            (
                tid,
                key,
                cid,
                _stored_cid(message, cid),
                _record_id(message),
                int(initial),
                archived_body(self.store, message),
                None if data_in is not None or data is None else self.store.keep_data(data),
                int(accepted),
                footprint.text(),
                undo,
                data_in,
            ),
        )
        # A new row has no keys yet: its rowid is new, or was the last row's, whose keys went
        # with it (rows are only deleted with their keys).
        self._index(tid, self.store.conn.last_insert_rowid(), key, footprint, _record_id(message), new=True)

    def appending_run(self, tenant: str, first_key: str) -> AppendingRun | None:
        """A run of initial writes to append at the end of ``tenant``'s history, or None when
        something archived sorts after ``first_key`` (then each goes through :meth:`place`).

        What a pull in log order brings: one message after another, each its record's first.
        ``with run:`` opens one folded scope for all of them (:meth:`Store.folded
        <p2psync.dwn.store.Store.folded>`); :meth:`AppendingRun.append` processes each as
        :meth:`place` would at the end, and the scope's end archives them all with one
        statement, after one look at the set journal for all instead of one each. The caller
        must hold the write transaction (the group commit's), so nothing sorts in between.
        """
        tid = self.store.tenant_id(tenant, create=False)
        conn = self.store.conn
        if tid is None or not conn.in_transaction:
            return None
        if conn.execute("SELECT 1 FROM archive WHERE tenant=? AND sort_key>? LIMIT 1", (tid, first_key)).fetchone():
            return None
        return AppendingRun(self, tenant, tid)

    def _index(
        self, tid: int, row_id: int, key: str, footprint: Footprint, record_id: str | None, *, new: bool = False
    ) -> None:
        """(Re)write the footprint keys of archive row ``row_id`` (``new``: it has none yet).

        Not its record's own keys (``rec:<id>``, ``live:<id>``): :meth:`_affected` finds the
        rows of a record through the archive's record index, which holds them anyway.
        """
        conn = self.store.conn
        if not new:
            conn.execute("DELETE FROM archive_keys WHERE row=?", (row_id,))
        own = _own_keys(record_id)
        keys = [(tid, k, key, row_id, int(k in footprint.writes)) for k in footprint.reads if k not in own]
        if keys:
            conn.executemany("INSERT INTO archive_keys(tenant, key, sort_key, row, writes) VALUES(?,?,?,?,?)", keys)

    def _footprint(self, tid: int, message: Message, initial: bool | None = None) -> Footprint:
        """What processing ``message`` may read and what it may change, as keys.

        A later message is processed again in a warp only if it reads or changes what an
        earlier one processed again changes, or changes what such a one reads (it would see
        the later message's effect otherwise); any other keeps its effects, which touch other
        rows. The keys:

        - ``rec:<id>`` — the messages of a record: each of them reads and changes it.
        - ``live:<id>`` — whether a record exists and is live: its initial write and its
          deletes change it (a pruning delete also removes the records below, which all read
          it), and so does an update when the initial write is here without its data. A
          Records message reads it for its own record and every ancestor of its context (a
          child's validity reads whether its parent is live; ``$actions`` rules read
          ancestors' initial writes, which never change). An update of a parent changes
          neither, so the parent's later children are not processed again for it.
        - ``proto:<uri>`` — a protocol's definition: a configure changes it, its records read it.
        - ``role:<uri>:<did>`` — a protocol's role records for one recipient: a record with a
          recipient at a path some definition of the protocol makes a ``$role`` changes them
          (and reads them, for the one-role-record-per-recipient rule); a message whose author
          invokes ``protocolRole`` reads the author's.
        - ``grant:<id>`` — a permission grant and its revocations: the grant record and every
          permission record under it change it; a message authorized by it reads it.

        A message not understood reads and changes everything.
        """
        d = message.get("descriptor")
        if not isinstance(d, dict):
            return EVERYTHING
        reads: set[str] = set()
        payload = signature_payload(message)
        grants = [payload.get("permissionGrantId")]
        authorization = message.get("authorization")
        if isinstance(authorization, dict):
            for delegated in ("authorDelegatedGrant", "ownerDelegatedGrant"):
                grant = authorization.get(delegated)
                if isinstance(grant, dict):
                    grants.append(grant.get("recordId"))
            if "ownerSignature" in authorization:
                grants.append(_payload(authorization["ownerSignature"]).get("permissionGrantId"))
        for grant_id in grants:
            if isinstance(grant_id, str):
                reads.update((f"grant:{grant_id}", f"rec:{grant_id}"))
        if (d.get("interface"), d.get("method")) == ("Protocols", "Configure"):
            definition = d.get("definition")
            protocol = definition.get("protocol") if isinstance(definition, dict) else None
            if not isinstance(protocol, str):
                return EVERYTHING
            writes = {f"proto:{protocol}"}
            return Footprint(frozenset(reads | writes), frozenset(writes))
        record_id = _record_id(message)
        if record_id is None:
            return EVERYTHING
        writes = {f"rec:{record_id}"}
        reads.update((f"rec:{record_id}", f"live:{record_id}"))
        if self._may_change_liveness(tid, message, record_id, initial):
            writes.add(f"live:{record_id}")
        # A delete carries neither context nor protocol nor recipient: its record's initial
        # write does (a delete is only admitted once that is here).
        record = message if d.get("method") == "Write" else self._archived_initial(tid, record_id)
        if record is not None:
            rd = record["descriptor"]
            context = record.get("contextId")
            if isinstance(context, str):
                reads.update(f"live:{part}" for part in context.split("/") if part)
            parent = rd.get("parentId")
            if isinstance(parent, str):
                reads.add(f"live:{parent}")
            protocol = rd.get("protocol")
            if isinstance(protocol, str):
                reads.add(f"proto:{protocol}")
                recipient = rd.get("recipient")
                if recipient is not None and self._may_be_role(tid, protocol, rd.get("protocolPath")):
                    writes.add(f"role:{protocol}:{recipient}")
                if payload.get("protocolRole") is not None:
                    reads.add(f"role:{protocol}:{get_author(message)}")
                if protocol == PERMISSIONS_PROTOCOL_URI:
                    grant_id = parent if isinstance(parent, str) else record_id
                    writes.add(f"grant:{grant_id}")
        elif payload.get("protocolRole") is not None:
            return EVERYTHING
        return Footprint(frozenset(reads | writes), frozenset(writes))

    def _may_change_liveness(self, tid: int, message: Message, record_id: str, initial: bool | None) -> bool:
        """Whether the message may change whether its record exists and is live: an initial
        write, a delete — or an update of a record whose initial write is here without its data
        (the update makes the record live, and the initial write live before it)."""
        d = message["descriptor"]
        if d.get("method") != "Write" or (is_initial_write(message) if initial is None else initial):
            return True
        row = self.store.conn.execute(
            "SELECT data IS NULL AND data_in IS NULL FROM archive WHERE tenant=? AND record_id=? AND initial=1",
            (tid, record_id),
        ).fetchone()
        return row is None or bool(row[0])

    def _may_be_role(self, tid: int, protocol: str, path: Any) -> bool:
        """Whether ``path`` is a ``$role`` in any definition of ``protocol`` admitted here (or
        no definition is: then anything may be)."""
        key = (tid, protocol)
        # Another process (the CLI beside a running node) may have admitted a definition: the
        # cache holds only while the archive's definitions are the ones it was read from.
        seen = tuple(self.store.conn.execute(
            "SELECT count(*), max(id) FROM archive WHERE tenant=? AND record_id IS NULL", (tid,)
        ).fetchone() or ())
        cached = self._role_paths.get(key)
        paths = cached[1] if cached is not None and cached[0] == seen else None
        if paths is None:
            found: set[str] = set()
            definitions = 0
            for (body,) in self.store.conn.execute(
                "SELECT body FROM archive WHERE tenant=? AND record_id IS NULL", (tid,)
            ).fetchall():
                definition = json.loads(str(body))["descriptor"].get("definition")
                if isinstance(definition, dict) and definition.get("protocol") == protocol:
                    definitions += 1
                    try:
                        found.update(fetch_all_role_paths("", definition.get("structure") or {}, []))
                    except (DwnError, TypeError, AttributeError):
                        return True
            paths = frozenset(found) if definitions else frozenset({"*"})
            self._role_paths[key] = (seen, paths)
        return "*" in paths or path in paths

    def _archived_initial(self, tid: int, record_id: str) -> Message | None:
        """A record's initial write, from the archive (a delete carries little of its record)."""
        row = self.store.conn.execute(
            "SELECT body FROM archive WHERE tenant=? AND record_id=? AND initial=1", (tid, record_id)
        ).fetchone()
        if row is None:
            return None
        initial = json.loads(str(row[0]))
        return initial if isinstance(initial, dict) else None

    def _scoped_warp(
        self, tenant: str, start: str, placing: str, at_place: Callable[[Reply], bool], scope: Footprint
    ) -> int:
        """A warp over what ``scope`` can affect; over everything after ``start`` should the
        footprints have missed a dependency (undoing a change then meets a row another message
        changed: SQLite refuses, and nothing of the attempt remains)."""
        try:
            with self.store.transaction():
                return self._warp(tenant, start, placing, at_place, scope=scope)
        except apsw.AbortError:
            self.fallbacks += 1
            log.warning("footprints missed a dependency placing %s for %s; processing everything after it", placing,
                        tenant)
            return self._warp(tenant, start, placing, at_place)

    def _warp(
        self,
        tenant: str,
        start: str,
        placing: str | None,
        at_place: Callable[[Reply], bool] | None,
        touched: set[str] | None = None,
        scope: Footprint = EVERYTHING,
    ) -> int:
        """Take the state back to before ``start``, then process the archive from there on.

        Only the messages from ``start`` on whose footprints meet ``scope`` — or the
        footprint of one already taken, in canonical order — are processed again.
        ``at_place`` reads the reply of the message ``placing``; False drops it from the
        archive. Runs inside the caller's transaction. Returns how many messages were processed.
        """
        store, conn = self.store, self.store.conn
        tid = store._tid(tenant)
        touched = set() if touched is None else touched
        affected = self._affected(tid, start, scope)
        # 1. back: the inverse of each affected message's changes, newest first (the others
        #    touched other rows, and stay as they are)
        for row_id in reversed(affected):
            found = conn.execute("SELECT undo, stored_cid FROM archive WHERE id=?", (row_id,)).fetchone()
            if found is None:  # pragma: no cover - the id was just read
                raise DwnError("StoreInternal", f"archive row {row_id} vanished", 500)
            self._undo(tid, _opt_bytes(found[0]) or b"", str(found[1]), touched)
        # 2. forth: the affected messages in canonical order; the event log stays put
        rows = [self._row(row_id) for row_id in affected]
        processed = 0
        store.events.frozen = True
        try:
            for row in rows:
                message = json.loads(row.body)
                withheld = self._withheld(tid, row)
                reply, undo = self._again(tenant, message, row, withheld)
                processed += 1
                touched.add(row.stored_cid)
                _undo_cids(undo, touched)
                if row.cid == placing and at_place is not None and not at_place(reply):
                    if undo:  # a refusal changes nothing; should it have, undo it now
                        self._undo(tid, undo, row.stored_cid, touched)
                    conn.execute("DELETE FROM archive WHERE id=?", (row.id,))
                    conn.execute("DELETE FROM archive_keys WHERE row=?", (row.id,))
                    continue
                footprint = self._footprint(tid, message)
                conn.execute(
                    "UPDATE archive SET accepted=?, touch=?, undo=? WHERE id=?",
                    (int(reply.code in (202, 204)), footprint.text(), undo, row.id),
                )
                self._index(tid, row.id, row.key, footprint, row.record_id)
        finally:
            store.events.frozen = False
        self._reconcile_log(tenant, tid, touched)
        self.warps += 1
        self.replayed += processed
        return processed

    def _again(self, tenant: str, message: Message, row: _Row, withheld: bool) -> tuple[Reply, bytes]:
        """Process an archived message again in a warp; (the reply, what undoes it). An initial
        write or a later write of a record takes the compact undo it would take appended
        (checked as there, with the log frozen), anything else a session's changeset."""
        if row.initial:
            return self._appended(tenant, message, row.data, row.cid, withheld)
        if not withheld:
            return self._updated(tenant, message, row.data, row.cid)
        return self._recorded(tenant, message, row.data, withheld=withheld)

    def _undo(self, tid: int, undo: bytes, stored_cid: str, touched: set[str]) -> None:
        """Apply a message's undo (any kind), adding the stored CIDs it puts back or removes to
        ``touched``. Raises ``apsw.AbortError`` where a row is not as the message left it."""
        if undo.startswith(_INSERTED_ROW):
            self._delete_inserted(tid, stored_cid, undo[len(_INSERTED_ROW):])
            touched.add(stored_cid)
        elif undo.startswith(_INSERTED_ROW_AND_DATA):
            rest = undo[len(_INSERTED_ROW_AND_DATA):]
            self._delete_inserted(tid, stored_cid, rest[:-8], data_row=int.from_bytes(rest[-8:], "big"))
            touched.add(stored_cid)
        elif undo.startswith(_UPDATED_RECORD):
            self._undo_update(tid, undo[len(_UPDATED_RECORD):], touched)
        elif undo:
            _collect_cids(undo, touched)
            apsw.Changeset.apply(undo, self.store.conn)

    def _delete_inserted(self, tid: int, stored_cid: str, digest: bytes, data_row: int | None = None) -> None:
        """Undo an :meth:`_appended` initial write: delete its row, which must be as stored,
        and the ``data`` row ``data_row`` it added, which must still be there. A row gone or
        changed means a message the warp did not take changed it (the footprints missed a
        dependency): refused like a changeset conflict, so that the warp is done again over
        every later message."""
        conn = self.store.conn
        row = conn.execute(
            "SELECT id, body, indexes FROM messages WHERE tenant=? AND cid=?", (tid, stored_cid)
        ).fetchone()
        if row is None or _row_digest(row[1], row[2]) != digest:
            raise apsw.AbortError(f"undoing {stored_cid}: its row is not as it was stored")
        if data_row is not None:
            conn.execute("DELETE FROM data WHERE id=? AND tenant=?", (data_row, tid))
            if conn.changes() != 1:
                raise apsw.AbortError(f"undoing {stored_cid}: its data row {data_row} is gone")
        conn.execute("DELETE FROM messages WHERE id=?", (row[0],))

    def _affected(self, tid: int, start: str, scope: Footprint) -> list[int]:
        """The archive rows from ``start`` on a warp must process again, in canonical order.

        A row is taken if it reads or changes what an earlier taken row (or ``scope``)
        changes, or changes what one reads; a row that touches everything is taken with every
        row after it. Found through ``archive_keys``: each key is looked up once, from the
        earliest row that brought it in, and candidates are taken in canonical order.
        """
        conn = self.store.conn
        if "*" in scope.writes:
            return [int(r) for (r,) in conn.execute(
                "SELECT id FROM archive WHERE tenant=? AND sort_key>=? ORDER BY sort_key", (tid, start))]
        heap: list[tuple[str, int]] = []
        looked: dict[tuple[str, bool], str] = {}  # (key, any role) -> from which sort key it was looked up

        def look(key: str, after: str, writers_only: bool) -> None:
            # `writers_only`: a key read earlier meets only the rows that change it; a key
            # changed earlier meets every row that reads or changes it.
            mark = (key, writers_only)
            if mark in looked and looked[mark] <= after:
                return
            looked[mark] = after
            sql = "SELECT sort_key, row FROM archive_keys WHERE tenant=? AND key=? AND sort_key>=?"
            for sort_key, row in conn.execute(sql + (" AND writes=1" if writers_only else ""), (tid, key, after)):
                heapq.heappush(heap, (str(sort_key), int(row)))
            kind, _, record_id = key.partition(":")
            if kind in ("rec", "live") and record_id:
                # The record's own rows, whose own keys archive_keys leaves out (`_index`): each
                # reads and changes `rec:<id>` and reads `live:<id>`, which its touch says
                # whether it changes.
                for sort_key, row, touch in conn.execute(_OWN_ROWS_SQL, (tid, record_id, after)):
                    if not writers_only or kind == "rec" or key in Footprint.parse(str(touch)).writes:
                        heapq.heappush(heap, (str(sort_key), int(row)))

        for key in scope.writes:
            look(key, start, False)
        for key in scope.reads - scope.writes:
            look(key, start, True)
        look("*", start, True)  # a row that touches everything is always taken
        taken: list[int] = []
        seen: set[int] = set()
        while heap:
            sort_key, row_id = heapq.heappop(heap)
            if row_id in seen:
                continue
            seen.add(row_id)
            found = conn.execute("SELECT touch FROM archive WHERE id=?", (row_id,)).fetchone()
            if found is None:  # pragma: no cover - keys outlived their row (a store edited by hand)
                continue
            taken.append(row_id)
            footprint = Footprint.parse(str(found[0]))
            if "*" in footprint.writes:
                later = conn.execute(
                    "SELECT id FROM archive WHERE tenant=? AND sort_key>? ORDER BY sort_key", (tid, sort_key)
                )
                return taken + [int(r) for (r,) in later if int(r) not in seen]
            for key in footprint.writes:
                look(key, sort_key, False)
            for key in footprint.reads - footprint.writes:
                look(key, sort_key, True)
        return taken

    def _row(self, row_id: int) -> _Row:
        r = self.store.conn.execute(f"SELECT {_ROW_COLUMNS} FROM archive WHERE id=?", (row_id,)).fetchone()
        if r is None:  # pragma: no cover - the id was just read
            raise DwnError("StoreInternal", f"archive row {row_id} vanished", 500)
        row_id, key, cid, stored_cid, record_id, initial, body, data, data_in, tid = r
        return _Row(_int(row_id), str(key), str(cid), str(stored_cid), _opt_str(record_id), bool(initial), str(body),
                    _kept_data(self.store, _int(tid), data, record_id, data_in))

    def _withheld(self, tid: int, row: _Row) -> bool:
        """Whether the row, an initial write archived without data, is processed as its
        record's state without data (a later message of the record is archived)."""
        return row.initial and row.data is None and self._has_later(tid, row)

    def _has_later(self, tid: int, row: _Row) -> bool:
        return (
            self.store.conn.execute(
                "SELECT 1 FROM archive WHERE tenant=? AND record_id=? AND sort_key>? LIMIT 1",
                (tid, row.record_id, row.key),
            ).fetchone()
            is not None
        )

    def _reconcile_log(self, tenant: str, tid: int, stored_cids: Iterable[str]) -> None:
        """One event-log entry per stored message, and per superseded definition accepted at
        its place (:func:`superseded_definitions`); positions of those already listed kept."""
        conn, events = self.store.conn, self.store.events
        # The log names a message by its CID as sent, which two stored CIDs can share: a 0-byte
        # record stored without its data (under that CID) and with it (`encodedData: ""`). So
        # decide per log CID, not per stored CID: when its data came, the first is gone and the
        # second new, and the entry stays, in whatever order the two are looked at.
        wanted: dict[str, tuple[str, str | None]] = {}  # cid as sent: (sort key, stored cid listed)
        for stored_cid in stored_cids:
            row = conn.execute(_BY_STORED_CID_SQL, (tid, stored_cid, tid, stored_cid)).fetchone()
            key, cid = (str(row[0]), str(row[1])) if row is not None else ("", stored_cid)
            listed = self.store.messages.has(tenant, stored_cid) or (
                row is not None and conn.execute(_SUPERSEDED_DEFINITION_SQL, (tid, cid)).fetchone() is not None)
            if listed:
                wanted[cid] = (key, stored_cid)
            else:
                wanted.setdefault(cid, (key, None))
        newly: list[tuple[str, str, str]] = []  # (sort key, cid as sent, stored cid)
        for cid, (key, listed_as) in wanted.items():
            position = events.position_of(tenant, cid)
            if listed_as is not None and position is None:
                newly.append((key, cid, listed_as))
            elif listed_as is None and position is not None:
                events.delete_events_by_cid(tenant, [cid])
        for _, cid, stored_cid in sorted(newly):
            indexes = self.store.messages.get_indexes(tenant, stored_cid)
            if indexes is None:
                indexes = _definition_indexes(conn, tid, cid)
            events.append(tenant, cid, indexes)

    def list_superseded_definitions(self) -> int:
        """Give every superseded definition accepted at its place a log entry where it has none
        (a store written before the log kept them, issue #17's successor): appended in canonical
        order, so a peer that pulled past them receives them as new. Returns how many."""
        conn = self.store.conn

        def unlisted() -> list[tuple[str, int, str]]:
            return [(str(did), int(tid), str(cid)) for tid, did in conn.execute("SELECT id, did FROM tenants")
                    for (cid,) in conn.execute(_UNLISTED_DEFINITIONS_SQL, (tid,))]

        if not unlisted():  # the common case, read without taking the write lock
            return 0
        with self.store.transaction():
            rows = unlisted()  # again, under the lock
            for did, tid, cid in rows:
                self.store.events.append(did, cid, _definition_indexes(conn, tid, cid))
        return len(rows)


# An archived protocol definition accepted at its place that a newer stored definition of its
# protocol replaced. The log keeps listing it (handlers/protocols.py): the records written while
# it was in force are judged by it on every replica, so every replica must receive it. (A
# definition is the one stateful message without a record id; one missing from a store for
# any other reason, a store edited by hand, is not listed: it is simply missing.)
_REPLACED: Final = (
    "a.record_id IS NULL AND a.accepted=1"
    " AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.tenant=a.tenant AND m.cid=a.stored_cid)"
    " AND EXISTS (SELECT 1 FROM messages n WHERE n.tenant=a.tenant AND n.interface='Protocols'"
    " AND n.method='Configure' AND n.protocol=json_extract(a.body, '$.descriptor.definition.protocol'))"
)
_SUPERSEDED_DEFINITION_SQL: Final = f"SELECT 1 FROM archive a WHERE a.tenant=? AND a.cid=? AND {_REPLACED}"
_UNLISTED_DEFINITIONS_SQL: Final = (
    f"SELECT a.cid FROM archive a WHERE a.tenant=? AND {_REPLACED}"
    " AND NOT EXISTS (SELECT 1 FROM events e WHERE e.tenant=a.tenant AND e.cid=a.cid)"
    " ORDER BY a.sort_key"
)


def _definition_indexes(conn: apsw.Connection, tid: int, cid: str) -> dict[str, Any]:
    """The indexes an archived definition was stored under (what its log entry carries)."""
    row = conn.execute("SELECT body FROM archive WHERE tenant=? AND cid=?", (tid, cid)).fetchone()
    if row is None:  # pragma: no cover - the caller read the row just before
        raise DwnError("StoreInternal", f"{cid} vanished while reconciling the log", 500)
    return ProtocolsConfigure.parse(json.loads(str(row[0]))).construct_indexes()


# The undo of an :meth:`History._appended` initial write: this marker, then the SHA-256 of the
# row's body and indexes. A SQLite changeset starts with "T" or "P", never with a NUL.
_INSERTED_ROW: Final = b"\x00p2psync:inserted-row\x00"
# The undo of an :meth:`History._appended` initial write whose data is kept out of line: this
# marker, the row's digest, then the 8-byte id of the ``data`` row it added.
_INSERTED_ROW_AND_DATA: Final = b"\x00p2psync:inserted-row-and-data\x00"
# The undo of an :meth:`History._updated` write: this marker, then the CBOR of [its stored CID,
# its row's digest, the ``messages`` columns, the rows it deleted (whole, in those columns), and
# for each row it changed in place (the initial write it demoted): [CID, old body, old indexes,
# the digest of the row as it left it]].
_UPDATED_RECORD: Final = b"\x00p2psync:updated-record\x00"
# A record's ``messages`` rows: CID, body, indexes, then the whole row (from `_WHOLE_ROW` on).
_RECORD_ROWS_SQL: Final = "SELECT cid, body, indexes, * FROM messages WHERE tenant=? AND record_id=?"
_WHOLE_ROW: Final = 3
# Whether a record has data kept out of line.
_RECORD_HAS_DATA_SQL: Final = "SELECT EXISTS(SELECT 1 FROM data WHERE tenant=? AND record_id=?)"
# What storing one message changes, as the connection counts it: its ``messages`` row, the
# set-journal row its trigger writes, the tenant's next log position, the log entry.
_STORED_ONE_ROW: Final = 4
# The same while the event log is frozen (a warp processing messages again): no position, no entry.
_STORED_ONE_ROW_FROZEN: Final = 2
# Data larger than this is kept out of line, in the data store (dwn-sdk-js 0.5.2's
# DwnConstant.maxDataSizeAllowedToBeEncoded; handlers/records.py).
_MAX_DATA_SIZE_ENCODED: Final = 30_000


def _inline(size: Any) -> bool:
    """Whether a write declaring ``size`` keeps its data inline (None: it declares none)."""
    return size is None or (type(size) is int and size <= _MAX_DATA_SIZE_ENCODED)


# The archive rows of a record from a sort key on (the rows its own footprint keys name).
_OWN_ROWS_SQL: Final = "SELECT sort_key, id, touch FROM archive WHERE tenant=? AND record_id=? AND sort_key>=?"


def _own_keys(record_id: str | None) -> tuple[str, ...]:
    """The footprint keys of a record's own messages that the archive's record index stands for."""
    return () if record_id is None else (f"rec:{record_id}", f"live:{record_id}")


_INSERT_ARCHIVE_SQL: Final = (
    "INSERT INTO archive(tenant, sort_key, cid, stored_cid, record_id, initial, body, data, accepted, touch,"
    " undo, data_in) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)"
)


class RunAborted(Exception):
    """A message of an :class:`AppendingRun` did not change the store as an appended initial
    write does: the run is rolled back whole, and its messages go through :meth:`History.place`."""


class AppendingRun:
    """Initial writes appended at the end of a tenant's history together (see
    :meth:`History.appending_run`).

    Each :meth:`append` is checked as :meth:`History._appended` checks one: the connection's
    change count must show exactly one stored row and its log entry, and at the end the set
    journal must show exactly one new row per message, in order, each the message's own.
    Anything else raises :class:`RunAborted` out of ``with``, which has rolled everything back.
    Every archive row is what :meth:`History._insert` would have written for the message at its
    turn: the same columns, ids, footprint keys and cheap undo.
    """

    __slots__ = ("_archived", "_history", "_scope", "_seq", "_tid", "tenant")

    def __init__(self, history: History, tenant: str, tid: int) -> None:
        self._history = history
        self.tenant = tenant
        self._tid = tid
        self._scope = history.store.folded()
        self._seq = 0
        # (message, data, cid, key, archived body, footprint) of each message appended, in order
        self._archived: list[tuple[Message, bytes | None, str, str, str, Footprint]] = []

    def __enter__(self) -> AppendingRun:
        self._scope.__enter__()
        self._seq = int(self._history.store.scalar("SELECT coalesce(max(seq), 0) FROM set_journal"))
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            try:
                self._archive()
            except BaseException as error:
                self._history.run_aborts += 1
                self._scope.__exit__(type(error), error, error.__traceback__)
                raise
            self._scope.__exit__(*exc)
            self._history.run_applied += len(self._archived)
            return
        self._history.run_aborts += 1
        self._scope.__exit__(*exc)

    def append(
        self, message: Message, data: bytes | None, cid: str, key: str
    ) -> tuple[Reply, tuple[int, str, str]] | None:
        """Process ``message`` (an initial write sorting after everything before it, with its
        data inline or none) at the end: its reply and log entry (position, streamId, epoch)
        when accepted; None when refused with nothing changed (the run ends before it)."""
        store = self._history.store
        conn, events = store.conn, store.events
        changes, appends = conn.total_changes(), events.appends
        reply = self._history._process(self.tenant, message, data, False)
        changed = conn.total_changes() - changes
        if reply.code not in (202, 204):
            if changed:
                raise RunAborted(f"{cid} was refused ({reply.code}) after changing the store")
            return None
        last = events._last
        if (changed != _STORED_ONE_ROW or events.appends != appends + 1 or last is None
                or last[0] != self._tid or last[1] != cid):
            raise RunAborted(f"{cid} did not store exactly its own row and log entry")
        # Its footprint now, while the engine call's memo still holds what the message decoded to.
        footprint = self._history._footprint(self._tid, message, True)
        self._archived.append((message, data, cid, key, archived_body(store, message), footprint))
        return reply, (last[2], last[3], last[4])

    def _archive(self) -> None:
        if not self._archived:
            return
        tid = self._tid
        store = self._history.store
        conn = store.conn
        journal = conn.execute(_JOURNALED_ROWS_SQL + " ORDER BY j.seq", (self._seq,)).fetchall()
        if len(journal) != len(self._archived):
            raise RunAborted(f"the set journal shows {len(journal)} rows for {len(self._archived)} messages")
        base = int(store.scalar("SELECT coalesce(max(id), 0) FROM archive"))
        rows: list[tuple[Any, ...]] = []
        keys: list[tuple[int, str, str, int, int]] = []
        for i, ((message, data, cid, key, body, footprint), (journaled_tid, journaled_cid, delta, stored, indexes)) in (
            enumerate(zip(self._archived, journal, strict=True))
        ):
            if (journaled_tid, journaled_cid, delta) != (tid, cid, 1) or stored is None:
                raise RunAborted(f"the set journal does not show {cid} stored")
            record_id = _record_id(message)
            row_id = base + 1 + i
            kept = None if data is None else store.keep_data(data)
            undo = _INSERTED_ROW + _row_digest(stored, indexes)
            rows.append((row_id, tid, key, cid, cid, record_id, 1, body, kept, 1, footprint.text(), undo, None))
            own = _own_keys(record_id)
            keys.extend((tid, k, key, row_id, int(k in footprint.writes)) for k in footprint.reads if k not in own)
        conn.executemany(
            "INSERT INTO archive(id, tenant, sort_key, cid, stored_cid, record_id, initial, body, data, accepted,"
            " touch, undo, data_in) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
        if keys:
            conn.executemany("INSERT INTO archive_keys(tenant, key, sort_key, row, writes) VALUES(?,?,?,?,?)", keys)


# The set-journal rows after a seq, each with the stored row it names (if still stored): what
# _appended checks, in one statement.
_JOURNALED_ROWS_SQL: Final = (
    "SELECT j.tenant, j.cid, j.delta, m.body, m.indexes FROM set_journal j"
    " LEFT JOIN messages m ON m.tenant = j.tenant AND m.cid = j.cid WHERE j.seq>?"
)


# Before an appended write that keeps its data out of line: the last data row id, and whether
# a row of its key (tenant, record, dataCid) is there already. After: the data rows it added.
_DATA_BEFORE_SQL: Final = (
    "SELECT (SELECT coalesce(max(id), 0) FROM data),"
    " EXISTS(SELECT 1 FROM data WHERE tenant=? AND record_id=? AND data_cid=?)"
)
_DATA_AFTER_SQL: Final = "SELECT id, tenant, record_id, data_cid FROM data WHERE id>?"


def _data_key(message: Message, data: bytes | None) -> tuple[str, str] | None:
    """(recordId, dataCid) of a Records write whose data, given, is too large to be kept
    inline (the reference keeps it in the data store), else None."""
    d = message["descriptor"]
    size, data_cid, record_id = d.get("dataSize"), d.get("dataCid"), message.get("recordId")
    if data is None or not isinstance(size, int) or size <= _MAX_DATA_SIZE_ENCODED:
        return None
    if not isinstance(data_cid, str) or not isinstance(record_id, str):
        return None
    return record_id, data_cid


def _row_digest(body: Any, indexes: Any) -> bytes:
    return hashlib.sha256(f"{body}\x00{indexes}".encode()).digest()


def _int(value: Any) -> int:
    return int(value)


def _state_rows(store: Store, tenant: str) -> dict[str, dict[str, Any]]:
    """A tenant's state in comparable form: stored CID -> (body, indexes); data key -> size."""
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return {"messages": {}, "data": {}}
    messages = {
        str(cid): (body, indexes)
        for cid, body, indexes in store.conn.execute("SELECT cid, body, indexes FROM messages WHERE tenant=?", (tid,))
    }
    data = {
        f"{record_id} {data_cid}": size
        for record_id, data_cid, size in store.conn.execute(
            "SELECT record_id, data_cid, size FROM data WHERE tenant=?", (tid,)
        )
    }
    return {"messages": messages, "data": data}


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _adopted_data(store: Store, tenant: str, message: Message, inline: str | None) -> bytes | None:
    d = message["descriptor"]
    if (d.get("interface"), d.get("method")) != ("Records", "Write"):
        return None
    if inline is not None:
        return b64url_decode(inline)
    return store.data.get(tenant, message["recordId"], d["dataCid"])


def _payload(signature: Any) -> dict[str, Any]:
    try:
        payload = decode_payload(signature)
    except (DwnError, KeyError, TypeError, ValueError):
        return {}
    return payload if isinstance(payload, dict) else {}


def signature_payload(message: Message) -> dict[str, Any]:
    """The decoded payload of a message's signature ({} when it has none or it does not decode)."""
    authorization = message.get("authorization")
    return _payload(authorization.get("signature")) if isinstance(authorization, dict) else {}


class _RollBack(Exception):
    """Raised inside a savepoint to undo what a dry run did."""


def _undo_cids(undo: bytes, into: set[str]) -> None:
    """The stored CIDs, besides the message's own, whose rows applying ``undo`` puts back or
    removes: a changeset's ``messages`` inserts and deletes, a later write's superseded rows."""
    if undo.startswith(_UPDATED_RECORD):
        _, _, columns, removed, _ = cbor2.loads(undo[len(_UPDATED_RECORD):])
        cid_at = columns.index("cid")
        into.update(values[cid_at] for values in removed)
    elif undo and not undo.startswith((_INSERTED_ROW, _INSERTED_ROW_AND_DATA)):
        _collect_cids(undo, into)


def _collect_cids(changeset: bytes, into: set[str]) -> None:
    """The CIDs of the ``messages`` rows a changeset inserts or deletes."""
    for change in apsw.Changeset.iter(changeset):
        if change.name != "messages":
            continue
        for values in (change.old, change.new):
            if values is not None and isinstance(values[2], str):
                into.add(values[2])
