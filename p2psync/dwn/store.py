"""The engine's storage: one SQLite file (apsw, WAL) holding messages, data and event logs.

Layout choices, measured on these machines (docs/benchmarks.md, FACTS.md):
- rowid tables with a UNIQUE index on the CID: a random-CID primary key is 2–4× slower;
- WAL with ``synchronous=NORMAL``: a commit survives a process crash, and costs no fsync;
- the index key-values of each message are kept whole (JSON) beside a few indexed columns;
  a query narrows by the most selective column in SQL and then applies the reference's
  filter semantics in Python, so results match the reference exactly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, NamedTuple, Protocol

import apsw

from p2psync.dwn import memo as _memo
from p2psync.dwn.blobs import BLOB_THRESHOLD, BlobFiles, blob_reference, parse_reference
from p2psync.dwn.datacid import data_cid
from p2psync.dwn.encoding import json_compact, message_cid
from p2psync.dwn.errors import DwnError

SCHEMA_VERSION = 10

log = logging.getLogger(__name__)

# Checkpoint the WAL every ~40 MB rather than the default ~4 MB: each checkpoint syncs the
# database file, and with a dozen pages per commit the default checkpoints every ~80 commits.
WAL_AUTOCHECKPOINT_PAGES = 10_000

#: Each store's page cache (SQLite's default is 2 MiB). An admitted message inserts into five
#: indexes keyed by a random CID or record id (messages_cid, messages_record, events_cid,
#: archive_cid, archive_record: 5.9 of the 8.4 pages a message dirtied at 16,000 stored, in
#: commits of 64), so a write touches leaves all over them, and those indexes outgrow 2 MiB by
#: ~4,000 stored (~500 pages per 10,000 messages each). Past that most inserts read their leaf
#: back from the OS: 18.5 reads (74 KB) a message at 18,000 stored with 2 MiB, 4.8 with 16 MiB,
#: system CPU 83-94 -> 64-71 us a message between 10,000 and 20,000 stored (issue #17; the
#: cache grows only as pages are used, and holds the hot indexes of ~30,000 messages).
CACHE_KIB = 16_384

# Index properties kept as columns too, so a filter narrows in SQL by every one it names
# with a plain string (or a list of strings); the rest is matched in Python.
_NARROWING_COLUMNS = (
    ("recordId", "record_id"),
    ("entryId", "entry_id"),
    ("parentId", "parent_id"),
    ("contextId", "context_id"),
    ("protocol", "protocol"),
    ("protocolPath", "protocol_path"),
    ("interface", "interface"),
    ("method", "method"),
    ("recipient", "recipient"),
    ("author", "author"),
)

def _row_bytes(row: str) -> str:
    """What an archive row (``new`` or ``old`` in a trigger) counts toward its tenant's usage:
    its body, then its data as kept inline, by file reference (the size it names) or by the
    data row it names (schema 9)."""
    return (f"""length(CAST({row}.body AS BLOB)) + coalesce(
                CASE typeof({row}.data) WHEN 'text'
                THEN CAST(substr({row}.data, instr({row}.data, ':') + 1) AS INTEGER) ELSE length({row}.data) END,
                CASE WHEN {row}.data_in IS NOT NULL THEN json_extract({row}.body, '$.descriptor.dataSize') END, 0)""")


def _usage_in(row: str) -> str:
    """A trigger's statement that counts archive row ``row`` into its tenant's usage."""
    return f"""        INSERT INTO tenant_usage(tenant, messages, bytes)
            VALUES({row}.tenant, 1, {_row_bytes(row)})
            ON CONFLICT(tenant) DO UPDATE SET messages = messages + 1, bytes = bytes + excluded.bytes;"""


def _usage_out(row: str) -> str:
    """A trigger's statement that takes archive row ``row`` out of its tenant's usage."""
    return f"""        UPDATE tenant_usage SET messages = messages - 1,
            bytes = bytes - ({_row_bytes(row)})
            WHERE tenant = {row}.tenant;"""


_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE tenants(
        id INTEGER PRIMARY KEY,
        did TEXT NOT NULL UNIQUE,
        stream_id TEXT NOT NULL,     -- stable identity of this tenant's event log
        epoch TEXT NOT NULL,         -- changes only when the log's continuity is broken
        next_position INTEGER NOT NULL DEFAULT 1,
        active INTEGER NOT NULL DEFAULT 1
    );
    CREATE TABLE messages(
        id INTEGER PRIMARY KEY,
        tenant INTEGER NOT NULL REFERENCES tenants(id),
        cid TEXT NOT NULL,
        body TEXT NOT NULL,          -- the stored message (JSON), encodedData included
        indexes TEXT NOT NULL,       -- the reference's index key-values (JSON)
        interface TEXT, method TEXT, record_id TEXT, entry_id TEXT, parent_id TEXT,
        context_id TEXT, protocol TEXT, protocol_path TEXT, recipient TEXT, author TEXT
    );
    CREATE UNIQUE INDEX messages_cid ON messages(tenant, cid);
    CREATE INDEX messages_record ON messages(tenant, record_id);
    CREATE INDEX messages_entry ON messages(tenant, entry_id);
    CREATE INDEX messages_parent ON messages(tenant, parent_id);
    CREATE INDEX messages_context ON messages(tenant, context_id);
    CREATE INDEX messages_protocol ON messages(tenant, protocol, protocol_path);
    CREATE INDEX messages_method ON messages(tenant, interface, method, protocol, protocol_path);
    CREATE TABLE data(
        id INTEGER PRIMARY KEY,
        tenant INTEGER NOT NULL REFERENCES tenants(id),
        record_id TEXT NOT NULL,
        data_cid TEXT NOT NULL,
        size INTEGER NOT NULL,
        bytes BLOB NOT NULL
    );
    CREATE UNIQUE INDEX data_key ON data(tenant, record_id, data_cid);
    CREATE TABLE events(
        id INTEGER PRIMARY KEY,
        tenant INTEGER NOT NULL REFERENCES tenants(id),
        position INTEGER NOT NULL,
        cid TEXT NOT NULL,
        indexes TEXT NOT NULL
    );
    CREATE UNIQUE INDEX events_position ON events(tenant, position);
    CREATE INDEX events_cid ON events(tenant, cid);
    CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # Every admitted message, in canonical order, with what undoes its processing
    # (p2psync/dwn/canonical.py). A v1 store's messages are archived and replayed on open.
    # Row ids of messages and data are never reused (AUTOINCREMENT): undoing one message's
    # changes puts its rows back under their old ids, which no other row may have taken.
    2: """
    CREATE TABLE messages_v2(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant INTEGER NOT NULL REFERENCES tenants(id),
        cid TEXT NOT NULL,
        body TEXT NOT NULL,
        indexes TEXT NOT NULL,
        interface TEXT, method TEXT, record_id TEXT, entry_id TEXT, parent_id TEXT,
        context_id TEXT, protocol TEXT, protocol_path TEXT, recipient TEXT, author TEXT
    );
    INSERT INTO messages_v2 SELECT * FROM messages;
    DROP TABLE messages;
    ALTER TABLE messages_v2 RENAME TO messages;
    CREATE UNIQUE INDEX messages_cid ON messages(tenant, cid);
    CREATE INDEX messages_record ON messages(tenant, record_id);
    CREATE INDEX messages_entry ON messages(tenant, entry_id);
    CREATE INDEX messages_parent ON messages(tenant, parent_id);
    CREATE INDEX messages_context ON messages(tenant, context_id);
    CREATE INDEX messages_protocol ON messages(tenant, protocol, protocol_path);
    CREATE INDEX messages_method ON messages(tenant, interface, method, protocol, protocol_path);
    CREATE TABLE data_v2(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant INTEGER NOT NULL REFERENCES tenants(id),
        record_id TEXT NOT NULL,
        data_cid TEXT NOT NULL,
        size INTEGER NOT NULL,
        bytes BLOB NOT NULL
    );
    INSERT INTO data_v2 SELECT * FROM data;
    DROP TABLE data;
    ALTER TABLE data_v2 RENAME TO data;
    CREATE UNIQUE INDEX data_key ON data(tenant, record_id, data_cid);
    CREATE TABLE archive(
        id INTEGER PRIMARY KEY,
        tenant INTEGER NOT NULL REFERENCES tenants(id),
        sort_key TEXT NOT NULL,      -- messageTimestamp, a space, the CID: canonical order
        cid TEXT NOT NULL,           -- the CID of the message as admitted
        stored_cid TEXT NOT NULL,    -- the CID it is stored under (differs for a 0-byte record)
        record_id TEXT,              -- the record a Records message is about
        initial INTEGER NOT NULL,    -- 1 for a record's initial write
        body TEXT NOT NULL,          -- the message as admitted (JSON, without encodedData)
        data BLOB,                   -- its record data, when it came with it
        accepted INTEGER NOT NULL,   -- 1 when processing in canonical order accepted it
        touch TEXT NOT NULL,         -- what its processing reads or writes ('*': anything)
        undo BLOB NOT NULL           -- inverse changeset of that processing (messages, data)
    );
    CREATE UNIQUE INDEX archive_key ON archive(tenant, sort_key);
    CREATE UNIQUE INDEX archive_cid ON archive(tenant, cid);
    CREATE INDEX archive_stored ON archive(tenant, stored_cid);
    CREATE INDEX archive_record ON archive(tenant, record_id, sort_key);
    -- each archived message's footprint keys, so a warp finds the later messages it affects
    -- without reading every later footprint
    CREATE TABLE archive_keys(
        tenant INTEGER NOT NULL,
        key TEXT NOT NULL,
        sort_key TEXT NOT NULL,
        row INTEGER NOT NULL,
        writes INTEGER NOT NULL      -- 1: the message changes what the key names; 0: reads it
    );
    CREATE INDEX archive_keys_key ON archive_keys(tenant, key, sort_key);
    CREATE INDEX archive_keys_row ON archive_keys(row);
    """,
    # The set journal (p2psync/state/setindex.py): every change to the set of stored message
    # CIDs, written by triggers, so whatever changes `messages` — a handler, an undo or redo
    # changeset of a warp, another process, plain SQL — is journaled in its own transaction
    # (and rolled back with it). SetIndex folds the journal into per-scope LtHash digests
    # (`set_digests`: scope '' is the whole tenant, else a protocol URL); `meta` keys
    # `set_journal_floor` (the last folded seq) and `set_journal_pruned` (the last deleted: a
    # few thousand folded rows are kept for other connections' subscribers). A store's
    # existing messages are journaled here once, so the first fold builds their digests.
    # (A migration that rebuilds `messages` must create these triggers again: dropping a table
    # drops its triggers. An INSERT OR REPLACE into `messages` would journal the new row but
    # not the one it replaces, whose delete trigger fires only with recursive_triggers on:
    # nothing does one.)
    3: """
    -- No NOT NULL here: the values come from NOT NULL columns of messages, and a constraint
    -- that may abort makes SQLite keep a statement journal for every DELETE on messages that
    -- fires the trigger (18 µs a delete, measured; 1 µs without).
    CREATE TABLE set_journal(
        seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: the floor only moves forward
        tenant INTEGER,
        protocol TEXT,
        cid TEXT,
        delta INTEGER                -- +1 stored, -1 removed
    );
    CREATE TRIGGER set_journal_insert AFTER INSERT ON messages BEGIN
        INSERT INTO set_journal(tenant, protocol, cid, delta) VALUES(new.tenant, new.protocol, new.cid, 1);
    END;
    CREATE TRIGGER set_journal_delete AFTER DELETE ON messages BEGIN
        INSERT INTO set_journal(tenant, protocol, cid, delta) VALUES(old.tenant, old.protocol, old.cid, -1);
    END;
    -- nothing updates these columns today; should anything (a changeset, a hand edit), the
    -- journal still sees the row leave one place in the set and enter another
    CREATE TRIGGER set_journal_update AFTER UPDATE OF tenant, cid, protocol ON messages
    WHEN old.tenant IS NOT new.tenant OR old.cid IS NOT new.cid OR old.protocol IS NOT new.protocol BEGIN
        INSERT INTO set_journal(tenant, protocol, cid, delta) VALUES(old.tenant, old.protocol, old.cid, -1);
        INSERT INTO set_journal(tenant, protocol, cid, delta) VALUES(new.tenant, new.protocol, new.cid, 1);
    END;
    CREATE TABLE set_digests(
        tenant INTEGER NOT NULL,
        scope TEXT NOT NULL,         -- '' for the whole tenant, else a protocol URL
        count INTEGER NOT NULL,
        state BLOB NOT NULL,         -- LtHash16 state (p2psync/replication/lthash.py), 2,048 bytes
        PRIMARY KEY(tenant, scope)
    );
    INSERT INTO set_journal(tenant, protocol, cid, delta) SELECT tenant, protocol, cid, 1 FROM messages ORDER BY id;
    INSERT INTO meta(key, value) VALUES('set_journal_floor', '0');
    """,
    # What each tenant's admitted history takes: the archive's rows and their bytes (the
    # message as admitted plus the data it came with), kept by triggers, so every writer — a
    # replicated apply, a local write, a warp that drops a message, data attached later,
    # another process — counts, in its own transaction (p2psync/state/quota.py reads it for
    # the tenant quotas of issue #15). Written to survive a store whose archive was rebuilt
    # by hand (the downgrade tests drop and recreate it): the counts are taken afresh.
    4: """
    CREATE TABLE IF NOT EXISTS tenant_usage(
        tenant INTEGER PRIMARY KEY,  -- tenants.id
        messages INTEGER,            -- archive rows
        bytes INTEGER                -- UTF-8 bytes of their bodies plus their data
    );
    DELETE FROM tenant_usage;
    INSERT INTO tenant_usage(tenant, messages, bytes)
        SELECT tenant, count(*), sum(length(CAST(body AS BLOB)) + coalesce(length(data), 0))
        FROM archive GROUP BY tenant;
    DROP TRIGGER IF EXISTS tenant_usage_insert;
    DROP TRIGGER IF EXISTS tenant_usage_delete;
    DROP TRIGGER IF EXISTS tenant_usage_update;
    CREATE TRIGGER tenant_usage_insert AFTER INSERT ON archive BEGIN
        INSERT INTO tenant_usage(tenant, messages, bytes)
            VALUES(new.tenant, 1, length(CAST(new.body AS BLOB)) + coalesce(length(new.data), 0))
            ON CONFLICT(tenant) DO UPDATE SET messages = messages + 1, bytes = bytes + excluded.bytes;
    END;
    CREATE TRIGGER tenant_usage_delete AFTER DELETE ON archive BEGIN
        UPDATE tenant_usage SET messages = messages - 1,
            bytes = bytes - (length(CAST(old.body AS BLOB)) + coalesce(length(old.data), 0))
            WHERE tenant = old.tenant;
    END;
    -- data attached to a message archived without it (canonical.py's attach_data), or any
    -- other change of what a row holds
    CREATE TRIGGER tenant_usage_update AFTER UPDATE OF tenant, body, data ON archive BEGIN
        UPDATE tenant_usage SET messages = messages - 1,
            bytes = bytes - (length(CAST(old.body AS BLOB)) + coalesce(length(old.data), 0))
            WHERE tenant = old.tenant;
        INSERT INTO tenant_usage(tenant, messages, bytes)
            VALUES(new.tenant, 1, length(CAST(new.body AS BLOB)) + coalesce(length(new.data), 0))
            ON CONFLICT(tenant) DO UPDATE SET messages = messages + 1, bytes = bytes + excluded.bytes;
    END;
    """,
    # No table changes: an archive row's `undo` may now also be the compact undo of an initial
    # write appended in order (p2psync/dwn/canonical.py, `_INSERTED_ROW`), which a schema-4
    # p2psync would take for a changeset. The version keeps such a p2psync from opening it.
    5: """
    SELECT 1;
    """,
    # Fewer index entries per admitted message (issue #17): with 64 messages a commit, each
    # index keyed by a random CID costs about one 4 KiB page written at commit per message.
    # - A column that most messages leave NULL (parent, context, protocol) is indexed only
    #   where it is set: `x = ?` implies `x IS NOT NULL`, so every query that used the index
    #   still does.
    # - entry_id equals record_id for a record's initial write: indexed only where it does not
    #   (an entryId query also looks the value up as a recordId, store.py's `_candidate_sql_of`).
    # - stored_cid equals cid except for a 0-byte record: indexed only where it does not (a
    #   lookup by stored CID also looks it up as a CID, canonical.py).
    # - a record's own footprint keys (`rec:<id>`, `live:<id>`) are found through
    #   archive_record (canonical.py's `_affected`): archive_keys keeps the others.
    6: """
    DROP INDEX IF EXISTS messages_entry;
    DROP INDEX IF EXISTS messages_parent;
    DROP INDEX IF EXISTS messages_context;
    DROP INDEX IF EXISTS messages_protocol;
    CREATE INDEX messages_entry ON messages(tenant, entry_id)
        WHERE entry_id IS NOT NULL AND entry_id IS NOT record_id;
    CREATE INDEX messages_parent ON messages(tenant, parent_id) WHERE parent_id IS NOT NULL;
    CREATE INDEX messages_context ON messages(tenant, context_id) WHERE context_id IS NOT NULL;
    CREATE INDEX messages_protocol ON messages(tenant, protocol, protocol_path) WHERE protocol IS NOT NULL;
    DROP INDEX IF EXISTS archive_stored;
    CREATE INDEX archive_stored ON archive(tenant, stored_cid) WHERE stored_cid IS NOT cid;
    DELETE FROM archive_keys WHERE rowid IN (
        SELECT k.rowid FROM archive_keys k JOIN archive a ON a.id = k.row
        WHERE a.record_id IS NOT NULL AND k.key IN ('rec:' || a.record_id, 'live:' || a.record_id));
    """,
    # An initial write appended in order whose data is kept out of line keeps a compact undo
    # (canonical.py, `_INSERTED_ROW_AND_DATA`), which a schema-6 p2psync would take for a
    # changeset, and its archive row does not copy the data its `data` row holds: `data_in`
    # names that row's dataCid (canonical.py reads the data through it). When the data row
    # goes (the record updated or deleted, a warp undoing the write), its bytes move into the
    # archive rows that name it, which must keep them. The usage counts such a row's data by
    # its descriptor's dataSize (the data was checked against it).
    7: """
    ALTER TABLE archive ADD COLUMN data_in TEXT;
    CREATE TRIGGER archive_data_kept AFTER DELETE ON data BEGIN
        UPDATE archive SET data = old.bytes, data_in = NULL
            WHERE tenant = old.tenant AND record_id = old.record_id AND data_in = old.data_cid;
    END;
    DROP TRIGGER IF EXISTS tenant_usage_insert;
    DROP TRIGGER IF EXISTS tenant_usage_delete;
    DROP TRIGGER IF EXISTS tenant_usage_update;
    CREATE TRIGGER tenant_usage_insert AFTER INSERT ON archive BEGIN
        INSERT INTO tenant_usage(tenant, messages, bytes)
            VALUES(new.tenant, 1, length(CAST(new.body AS BLOB)) + coalesce(length(new.data),
                CASE WHEN new.data_in IS NOT NULL THEN json_extract(new.body, '$.descriptor.dataSize') END, 0))
            ON CONFLICT(tenant) DO UPDATE SET messages = messages + 1, bytes = bytes + excluded.bytes;
    END;
    CREATE TRIGGER tenant_usage_delete AFTER DELETE ON archive BEGIN
        UPDATE tenant_usage SET messages = messages - 1,
            bytes = bytes - (length(CAST(old.body AS BLOB)) + coalesce(length(old.data),
                CASE WHEN old.data_in IS NOT NULL THEN json_extract(old.body, '$.descriptor.dataSize') END, 0))
            WHERE tenant = old.tenant;
    END;
    CREATE TRIGGER tenant_usage_update AFTER UPDATE OF tenant, body, data, data_in ON archive BEGIN
        UPDATE tenant_usage SET messages = messages - 1,
            bytes = bytes - (length(CAST(old.body AS BLOB)) + coalesce(length(old.data),
                CASE WHEN old.data_in IS NOT NULL THEN json_extract(old.body, '$.descriptor.dataSize') END, 0))
            WHERE tenant = old.tenant;
        INSERT INTO tenant_usage(tenant, messages, bytes)
            VALUES(new.tenant, 1, length(CAST(new.body AS BLOB)) + coalesce(length(new.data),
                CASE WHEN new.data_in IS NOT NULL THEN json_extract(new.body, '$.descriptor.dataSize') END, 0))
            ON CONFLICT(tenant) DO UPDATE SET messages = messages + 1, bytes = bytes + excluded.bytes;
    END;
    """,
    # A message's wire form beside its JSON (issue #17): `wire` is the DAG-CBOR of the stored
    # message less its encodedData — the `message` member of a MessageEntry, byte for byte —
    # kept when the engine had those bytes anyway (it hashes them for the message CID), so a
    # source lists and sends the message without decoding its JSON and encoding it again.
    # NULL where the bytes were not at hand (rows from before, a message stored in another
    # form than it was hashed): readers fall back to the JSON.
    8: """
    ALTER TABLE messages ADD COLUMN wire BLOB;
    """,
    # Record data above the inline limit as files beside the store (p2psync/dwn/blobs.py): a
    # row keeps the TEXT blob reference "<dataCid>:<size>" where it kept the bytes (a BLOB). The
    # rows holding references are the files' reference count, found by these partial indexes
    # (only references enter them); the usage counts a reference by the size it names. Rows
    # from before keep their bytes in SQLite and are read as such.
    9: f"""
    CREATE INDEX data_blob ON data(bytes) WHERE typeof(bytes) = 'text';
    CREATE INDEX archive_blob ON archive(data) WHERE typeof(data) = 'text';
    DROP TRIGGER IF EXISTS tenant_usage_insert;
    DROP TRIGGER IF EXISTS tenant_usage_delete;
    DROP TRIGGER IF EXISTS tenant_usage_update;
    CREATE TRIGGER tenant_usage_insert AFTER INSERT ON archive BEGIN
{_usage_in("new")}
    END;
    CREATE TRIGGER tenant_usage_delete AFTER DELETE ON archive BEGIN
{_usage_out("old")}
    END;
    CREATE TRIGGER tenant_usage_update AFTER UPDATE OF tenant, body, data, data_in ON archive BEGIN
{_usage_out("old")}
{_usage_in("new")}
    END;
    """,
    # No table changes: an archive row's `undo` may now also be the compact undo of a later
    # write of a record appended in order (canonical.py, `_UPDATED_RECORD`), which a schema-9
    # p2psync would take for a changeset. The version keeps such a p2psync from opening it.
    10: """
    SELECT 1;
    """,
}


_COLUMNS = dict(_NARROWING_COLUMNS)
# The SQL indexes, as the properties of their columns after `tenant`, most selective first.
_INDEX_GROUPS = (
    ("recordId",),
    ("entryId",),
    ("parentId",),
    ("contextId",),
    ("protocol", "protocolPath"),
    ("interface", "method", "protocol", "protocolPath"),
)
# How much a property narrows (rough selectivity); a query uses the index group whose leading
# properties it names weigh most. recordId picks one record; interface picks half the store.
_NARROWING_WEIGHT = {
    "recordId": 1000, "entryId": 1000, "parentId": 100, "contextId": 100,
    "protocolPath": 20, "protocol": 5, "method": 2, "interface": 1,
}


def _best_group(flt: dict[str, Any]) -> list[str]:
    """The leading properties of the index group that narrows ``flt`` most (may be empty)."""
    usable = frozenset([p for p, v in flt.items() if p in _NARROWING_WEIGHT and _narrowable(v)])
    if not usable:
        return []
    best = _best_groups.get(usable)
    if best is None:
        best = _best_groups[usable] = _best_group_of(usable)
    return best


def _best_group_of(usable: frozenset[str]) -> list[str]:
    best: list[str] = []
    best_weight = 0
    for group in _INDEX_GROUPS:
        used: list[str] = []
        for prop in group:
            if prop not in usable:
                break
            used.append(prop)
        weight = sum(_NARROWING_WEIGHT[p] for p in used)
        if weight > best_weight:
            best, best_weight = used, weight
    return best


# The choice depends only on which properties are usable: at most 2**8 sets.
_best_groups: dict[frozenset[str], list[str]] = {}


def _narrowable(value: Any) -> bool:
    return type(value) is str or (
        isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
    )


# A write puts its own message, then (the first update of a record) its demoted initial write.
_RECENT_PUTS: Final = 4

_COLUMN_LIST = ", ".join(column for _, column in _NARROWING_COLUMNS)
_COLUMN_MARKS = ",".join("?" * len(_NARROWING_COLUMNS))
_NARROWING_PROPS = tuple(prop for prop, _ in _NARROWING_COLUMNS)
_INSERT_MESSAGE = (
    f"INSERT OR IGNORE INTO messages(tenant, cid, body, indexes, wire, {_COLUMN_LIST})"
    f" VALUES(?,?,?,?,?,{_COLUMN_MARKS})"
)


# Candidate queries by shape; bounded, since a filter's lists may have any length.
_CANDIDATE_SQL_CACHE_MAX = 1024
_candidate_sql: dict[tuple[tuple[str, int], ...], tuple[str, int]] = {}


def _candidate_sql_of(shape: tuple[tuple[str, int], ...]) -> tuple[str, int]:
    """The candidate query of a filter shape, and how many times it takes the arguments."""
    where = ["tenant=?"]
    for prop, n in shape:
        column = _COLUMNS[prop]
        where.append(f"{column}=?" if n < 0 else f"{column} IN ({','.join('?' * n)})")
    sql = f"SELECT cid, body, indexes FROM messages WHERE {' AND '.join(where)}"
    copies = 1
    if shape and shape[0][0] == "entryId":
        # messages_entry holds only the entry ids that differ from the record id (schema 6):
        # an initial write, whose entry id is its record id, is found by its record id.
        sql = (f"{sql.replace('entry_id', 'record_id')} UNION ALL {sql}"
               " AND entry_id IS NOT NULL AND entry_id IS NOT record_id")
        copies = 2
    if len(_candidate_sql) < _CANDIDATE_SQL_CACHE_MAX:
        _candidate_sql[shape] = (sql, copies)
    return sql, copies


def _wire_form(stored: dict[str, Any]) -> bytes | None:
    """The DAG-CBOR of ``stored`` less its encodedData when the engine already encoded it
    (schema 8's `wire`): the message being processed was hashed from those bytes, and
    ``stored`` is that message (plus encodedData) member for member. Else None: encoding it
    here would cost the writer what it saves the reader."""
    held = _memo.current()
    if held is None or held.encoded is None:
        return None
    message = held.message
    if stored is not message:
        # The engine stores a copy with encodedData added: the same members, the same objects.
        if type(message) is not dict or len(stored) - ("encodedData" in stored) != len(message):
            return None
        for key, value in message.items():
            if stored.get(key, stored) is not value:
                return None
    elif "encodedData" in stored:
        return None  # hashed without it (the memo keeps the message as hashed, not this one)
    return held.encoded


class Atomic(Protocol):
    """A transaction scope: never swallows the exception that rolls it back."""

    def __enter__(self) -> object: ...

    def __exit__(self, *exc: object) -> None: ...


#: How long a writer waits for another connection's write transaction before giving up
#: (``apsw.BusyError``). A node's own batches are short (p2psync/state/committer.py); a
#: command-line writer asks for longer (``busy_timeout``), since a long-running node may hold the
#: lock for many short turns in a row.
BUSY_TIMEOUT_SECONDS: Final = 5.0
#: The longest sleep between two tries for the lock. SQLite's own busy handler sleeps up to
#: 100 ms between tries, which a node that commits every few milliseconds outruns: a waiter
#: polling that slowly can miss every gap between the node's batches until it gives up.
_BUSY_POLL_MAX: Final = 0.005


# A nested scope's savepoint. One name at every depth: RELEASE and ROLLBACK TO act on the
# innermost savepoint of that name, which is the scope's own as scopes nest. Run as cached
# statements: apsw's ``with connection:`` runs its uniquely named SAVEPOINT and RELEASE
# through sqlite3_exec, parsing them again each time (three scopes a write: ~1% of the
# pipe's instructions, issue #17).
_SAVEPOINT: Final = "SAVEPOINT p2psync_scope"
_RELEASE: Final = "RELEASE p2psync_scope"
_ROLLBACK_TO: Final = "ROLLBACK TO p2psync_scope"


class _Transaction:
    """The scope :meth:`Store.transaction` returns (see there)."""

    __slots__ = ("_conn", "_nested", "_on_end", "_on_rollback")

    def __init__(self, conn: apsw.Connection, on_rollback: Callable[[], None], on_end: Callable[[], None]) -> None:
        self._conn = conn
        self._nested = False
        self._on_rollback = on_rollback  # a savepoint's rollback fires no SQLite hook
        self._on_end = on_end

    def __enter__(self) -> object:
        self._nested = self._conn.in_transaction
        if self._nested:
            self._conn.execute(_SAVEPOINT)
            return self
        self._conn.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._on_rollback()
        if self._nested:
            if exc[0] is None:
                self._conn.execute(_RELEASE)
            elif self._conn.in_transaction:  # an error SQLite rolls back whole (SQLITE_FULL) ended it
                self._conn.execute(_ROLLBACK_TO)
                self._conn.execute(_RELEASE)
            return
        if exc[0] is None:
            try:
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:  # the COMMIT itself failed: nothing was kept
                    self._conn.execute("ROLLBACK")
                self._on_rollback()
                self._on_end()
                raise
            self._on_end()
            return
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")
        self._on_end()  # nothing committed: it removes the files the transaction wrote


class _FoldedScope:
    """A :meth:`Store.transaction` opened inside :meth:`Store.folded`: no savepoint of its own.

    The folded scope's one savepoint undoes everything on an exception; a caller that catches
    an exception inside and goes on must not count on its inner scope's rollback, and the
    folded scope's owner checks what each step changed instead (p2psync/dwn/canonical.py)."""

    __slots__ = ()

    def __enter__(self) -> object:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_FOLDED_SCOPE: Final = _FoldedScope()


class _Folded:
    """The scope :meth:`Store.folded` returns (see there)."""

    __slots__ = ("_scope", "_store")

    def __init__(self, store: Store) -> None:
        self._store = store
        self._scope = store.transaction()

    def __enter__(self) -> object:
        if self._store._folding:
            raise DwnError("StoreInternal", "folded scopes do not nest", 500)
        self._scope.__enter__()
        self._store._folding = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._store._folding = False
        self._scope.__exit__(*exc)


class Store:
    """One SQLite database file: the message store, data store and event logs of its tenants.

    ``busy_timeout``: seconds a write waits for another connection's (another process's)
    write transaction to end before ``apsw.BusyError``.
    """

    def __init__(self, path: str | Path, *, busy_timeout: float = BUSY_TIMEOUT_SECONDS) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = apsw.Connection(str(self.path))
        self.busy_timeout = busy_timeout
        self.conn.set_busy_handler(_busy_handler(busy_timeout))
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        self.conn.execute("PRAGMA foreign_keys=ON")
        # The journals of statements and savepoints inside a transaction (every handler's
        # nested transaction is a savepoint, and each insert that fires a trigger keeps one) in
        # memory rather than temporary files: ~17% less SQLite CPU in an in-order apply
        # (issue #17). They hold the pages one transaction changed (a batch: a few MB at most),
        # and durability is the WAL's, not theirs.
        self.conn.execute("PRAGMA temp_store=MEMORY")
        self.conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        #: Record data above the inline limit, as files (p2psync/dwn/blobs.py); a store in
        #: memory keeps it in its rows (a directory named after ":memory:" would be shared).
        in_memory = str(path) in ("", ":memory:") or str(path).startswith("file::memory:")
        self.blobs = BlobFiles(None if in_memory else Path(str(self.path) + BLOBS_SUFFIX))
        # References whose files the open transaction wrote (garbage if it rolls back), and
        # references some row stopped holding (garbage unless another row holds them): both
        # are looked at after the next commit. Rows are dropped by any statement, a changeset
        # or a trigger, so the temporary triggers below report them; a report that a rollback
        # took back only costs a look.
        self._blobs_made: set[str] = set()
        self._blobs_dropped: set[str] = set()
        # Tenants' row ids, cached. One first seen inside a transaction is also named in
        # ``_unsettled_tenants`` until a rollback (:class:`_Transaction`'s or :meth:`rollback`)
        # forgets it: the row may have gone. (Not SQLite's rollback hook: a connection closed
        # by the garbage collector would call into a store half taken apart.)
        self._tenant_ids: dict[str, int] = {}
        self._unsettled_tenants: set[str] = set()
        self._folding = False  # inside :meth:`folded`: inner transaction scopes are folded into it
        self._no_wait_depth = 0  # :meth:`no_busy_wait` scopes open (they nest)
        self._migrate()
        self.conn.create_scalar_function("p2psync_blob_dropped", self._blob_dropped, 1)
        self.conn.execute(_BLOB_DROPPED_TRIGGERS)
        self.messages = MessageStore(self)
        self.data = DataStore(self)
        self.events = EventLog(self)
        # Files a crash left without a committed row (renamed into place, never committed).
        try:
            self.collect_blobs(everything=True)
        except (apsw.Error, OSError) as exc:  # a read-only store, say: the files can wait
            log.warning("collecting blob files of %s on open failed: %s", self.path, exc)

    def _migrate(self) -> None:
        version = self.scalar("PRAGMA user_version")
        if version > SCHEMA_VERSION:
            raise DwnError(
                "StoreSchemaTooNew",
                f"{self.path} has schema version {version}; this p2psync knows up to {SCHEMA_VERSION}",
                500,
            )
        if version == SCHEMA_VERSION:
            return
        with self.transaction():
            # Read again under the write lock: another process opening the same new file may
            # have migrated it meanwhile.
            version = self.scalar("PRAGMA user_version")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                self.conn.execute(_MIGRATIONS[target])
                self.conn.execute(f"PRAGMA user_version={target}")

    def close(self) -> None:
        self.conn.close()
        self.blobs.discard_staged()

    def scalar(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        """The first column of the first row a statement returns."""
        row = self.conn.execute(sql, args).fetchone()
        if row is None:
            raise DwnError("StoreInternal", f"no row from {sql.split()[0]}", 500)
        return row[0]

    def transaction(self) -> Atomic:
        """``with store.transaction():`` — all writes inside commit together or not at all; an
        exception rolls back and propagates.

        The outermost one is ``BEGIN IMMEDIATE``: it takes the write lock before its first
        read, waiting its turn behind another process's writer (the busy handler), so what it
        reads is still current when it writes. A deferred transaction that read first would
        have to upgrade its read snapshot to a write, and SQLite refuses that at once (BUSY,
        without waiting) when another connection committed in between — how a ``p2psync
        write`` used to fail while the node applied a batch. Nested ones are savepoints.
        """
        if self._folding:
            return _FOLDED_SCOPE
        return _Transaction(self.conn, self._rolled_back, self.transaction_ended)

    def folded(self) -> Atomic:
        """``with store.folded():`` — one :meth:`transaction` for a run of writes, whose
        inner ``transaction()`` scopes add no savepoint each (issue #17: three a replicated
        apply, ~5% of its instructions). An exception rolls back the whole run. For a caller
        that checks what each step changed (:meth:`History.appending_run
        <p2psync.dwn.canonical.History.appending_run>`), since a step that catches an
        exception of its own and goes on keeps whatever its inner scope wrote."""
        return _Folded(self)

    def rollback(self) -> None:
        """Roll back the open transaction, if any, begun outside :meth:`transaction` (the group
        committer's batch), and stop vouching for what it made."""
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        self._rolled_back()
        self.transaction_ended()

    def _rolled_back(self) -> None:
        """A transaction or a savepoint rolled back: what was made inside may be gone, so the
        caches stop vouching for it (a tenant's row id, the last event appended)."""
        self._forget_unsettled_tenants()
        self.events.forget_last()
        self._blobs_dropped |= self._blobs_made
        self._blobs_made.clear()

    def transaction_ended(self) -> None:
        """The open transaction ended (:meth:`transaction`'s, or one begun outside it: the
        group committer calls this after its COMMIT): remove the blob files it left without a
        committed reference (the files a rolled-back one wrote). Errors are logged, not raised:
        the transaction's outcome stands, and the next open collects what is left."""
        self._blobs_made.clear()
        if self._blobs_dropped and not self.conn.in_transaction:
            try:
                self.collect_blobs()
            except (apsw.Error, OSError) as exc:
                log.error("collecting blob files of %s failed: %s", self.path, exc)

    # -- large data as files (p2psync/dwn/blobs.py) -------------------------------------------

    def keep_data(self, data: bytes) -> bytes | str:
        """The value a row keeps for record data: ``data`` itself up to the inline limit, else
        the reference to a file holding it, written (durably) now if it is not there.

        Inside a write transaction only: a file's final name appears under the write lock,
        so no collector sees it before the row that references it commits.
        """
        if len(data) <= BLOB_THRESHOLD or not self.blobs.enabled:
            return data
        if not self.conn.in_transaction:
            raise DwnError("StoreInternal", "large data is kept inside a write transaction only", 500)
        cid = data_cid(data)  # the engine call's memo holds it: the handler hashed these bytes
        reference = blob_reference(cid, len(data))
        if self.blobs.write(data, cid):
            self._blobs_made.add(reference)
        return reference

    def read_data(self, value: Any) -> bytes | None:
        """The record data a row's value stands for: its bytes, or its file's, checked
        (:class:`p2psync.dwn.blobs.BlobCorrupt` when the file is missing, short or altered)."""
        if value is None:
            return None
        if type(value) is str:
            return self.blobs.read(value)
        return bytes(value)

    def _blob_dropped(self, *values: Any) -> None:
        """SQL ``p2psync_blob_dropped(value)``, called by the temporary triggers."""
        for value in values:
            if type(value) is str:
                self._blobs_dropped.add(value)

    def blob_referenced(self, cid: str) -> bool:
        """Whether a row of this connection's view references the file ``cid``."""
        low, high = cid + ":", cid + ";"
        return bool(self.scalar(_BLOB_REFERENCED_SQL, (low, high, low, high)))

    def try_begin_immediate(self) -> bool:
        """``BEGIN IMMEDIATE`` if the write lock is free now, without waiting for another
        connection's writer; whether the transaction is open (the caller ends it)."""
        with self.no_busy_wait():
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except apsw.BusyError:
                return False
        return True

    @contextlib.contextmanager
    def no_busy_wait(self) -> Iterator[None]:
        """Inside, a statement that meets another connection's lock fails at once (BUSY) instead
        of waiting up to ``busy_timeout``. Scopes nest: the waiting comes back when the outermost
        one ends."""
        if not self._no_wait_depth:
            self.conn.set_busy_handler(None)
        self._no_wait_depth += 1
        try:
            yield
        finally:
            self._no_wait_depth -= 1
            if not self._no_wait_depth:
                self.conn.set_busy_handler(_busy_handler(self.busy_timeout))

    def collect_blobs(self, *, everything: bool = False) -> int:
        """Remove the blob files no committed row references: those reported since the last
        commit, or (``everything``, on open) all of the directory. Returns how many went.

        Runs between transactions, under the write lock (``BEGIN IMMEDIATE``): no other
        connection can then hold a file it wrote but has not committed a reference to. If the
        lock is not free at once, the reported files wait for the next commit (the whole
        directory for the next open).
        """
        if self.conn.in_transaction:
            return 0
        candidates = set(self.blobs.names()) if everything else {parse_reference(r)[0] for r in self._blobs_dropped}
        if not candidates:
            self._blobs_dropped.clear()
            return 0
        # Without waiting: a collection is never worth holding up the caller (an open, a node
        # after its commit) behind another process's writer; the files wait for the next one.
        if not self.try_begin_immediate():
            return 0
        removed = 0
        try:
            for cid in candidates:
                if not self.blob_referenced(cid):
                    self.blobs.remove(cid)
                    removed += 1
        finally:
            self.conn.execute("COMMIT")  # nothing written: it ends the lock
        if not everything:
            self._blobs_dropped.clear()
        return removed

    # -- tenants -------------------------------------------------------------------------

    def tenant_id(self, did: str, create: bool = True) -> int | None:
        """Row id of a tenant; a tenant comes into being with its first stored message."""
        cached = self._tenant_ids.get(did)
        if cached is not None:
            return cached
        row = self.conn.execute("SELECT id FROM tenants WHERE did=?", (did,)).fetchone()
        if row is None:
            if not create:
                return None
            with self.transaction():
                # Another process may have made it since the SELECT above: keep theirs.
                self.conn.execute(
                    "INSERT INTO tenants(did, stream_id, epoch) VALUES(?,?,?) ON CONFLICT(did) DO NOTHING",
                    (did, str(uuid.uuid4()), str(uuid.uuid4())),
                )
                row = self.conn.execute("SELECT id FROM tenants WHERE did=?", (did,)).fetchone()
            assert row is not None
        self._tenant_ids[did] = row[0]
        if self.conn.in_transaction:
            self._unsettled_tenants.add(did)
        return int(row[0])

    def _forget_unsettled_tenants(self) -> None:
        for did in self._unsettled_tenants:
            self._tenant_ids.pop(did, None)
        self._unsettled_tenants.clear()

    def tenants(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT did FROM tenants ORDER BY id")]

    def _tid(self, did: str) -> int:
        tid = self.tenant_id(did)
        assert tid is not None
        return tid

    # -- replicated apply support (issue #3) ------------------------------------------------

    def is_tenant_active(self, did: str) -> bool:
        """False only for a tenant this store holds and has disabled (``tenants.active = 0``)."""
        row = self.conn.execute("SELECT active FROM tenants WHERE did=?", (did,)).fetchone()
        return row is None or bool(row[0])

    def usage(self, did: str) -> tuple[int, int]:
        """(messages, bytes) the tenant's admitted history takes: its archived messages, and the
        UTF-8 bytes of each as admitted plus the data it came with (schema 4's
        ``tenant_usage``, kept by triggers; uncommitted writes on this connection included)."""
        tid = self.tenant_id(did, create=False)
        if tid is None:
            return 0, 0
        row = self.conn.execute("SELECT messages, bytes FROM tenant_usage WHERE tenant=?", (tid,)).fetchone()
        return (0, 0) if row is None else (int(row[0] or 0), int(row[1] or 0))

    def set_tenant_active(self, did: str, active: bool) -> None:
        """Enable or disable a tenant; a disabled tenant's replicated messages are deferred."""
        with self.transaction():
            self.conn.execute("UPDATE tenants SET active=? WHERE id=?", (int(active), self._tid(did)))


#: The directory of a store's blob files: the store file's name with this appended.
BLOBS_SUFFIX: Final = ".blobs"

# A row dropped or changed a blob reference (p2psync/dwn/blobs.py): tell the store, which looks
# at the file after the next commit. TEMP: they call this connection's function, and another
# connection (the sqlite3 shell, a reader) must be able to write without it.
_BLOB_DROPPED_TRIGGERS: Final = """
CREATE TEMP TRIGGER IF NOT EXISTS blob_dropped_data AFTER DELETE ON main.data
    WHEN typeof(old.bytes) = 'text' BEGIN SELECT p2psync_blob_dropped(old.bytes); END;
CREATE TEMP TRIGGER IF NOT EXISTS blob_changed_data AFTER UPDATE OF bytes ON main.data
    WHEN typeof(old.bytes) = 'text' AND old.bytes IS NOT new.bytes BEGIN SELECT p2psync_blob_dropped(old.bytes); END;
CREATE TEMP TRIGGER IF NOT EXISTS blob_dropped_archive AFTER DELETE ON main.archive
    WHEN typeof(old.data) = 'text' BEGIN SELECT p2psync_blob_dropped(old.data); END;
CREATE TEMP TRIGGER IF NOT EXISTS blob_changed_archive AFTER UPDATE OF data ON main.archive
    WHEN typeof(old.data) = 'text' AND old.data IS NOT new.data BEGIN SELECT p2psync_blob_dropped(old.data); END;
"""

# Whether any row references a blob file: the references of a dataCid are the TEXT values
# from "<cid>:" up to (not including) "<cid>;", a range of the partial indexes of schema 9.
_BLOB_REFERENCED_SQL: Final = (
    "SELECT EXISTS(SELECT 1 FROM data WHERE typeof(bytes) = 'text' AND bytes >= ? AND bytes < ?)"
    " OR EXISTS(SELECT 1 FROM archive WHERE typeof(data) = 'text' AND data >= ? AND data < ?)"
)


def copy_store_files(source: str | Path, target: str | Path) -> None:
    """Copy a closed store to another name: its SQLite file (and a -wal/-shm left beside it)
    and its blob directory, whose files are hard-linked where the file system allows (they
    never change once written). The store is a file and a directory: a copy of the file alone
    is not a store."""
    import shutil

    for suffix in ("", "-wal", "-shm"):
        if Path(f"{source}{suffix}").exists():
            shutil.copyfile(f"{source}{suffix}", f"{target}{suffix}")
    blobs, copied = Path(f"{source}{BLOBS_SUFFIX}"), Path(f"{target}{BLOBS_SUFFIX}")
    if blobs.is_dir():
        shutil.rmtree(copied, ignore_errors=True)
        try:
            shutil.copytree(blobs, copied, copy_function=os.link)
        except OSError:  # another file system: copy the bytes
            shutil.rmtree(copied, ignore_errors=True)
            shutil.copytree(blobs, copied)


def _busy_handler(timeout: float) -> Callable[[int], bool]:
    """A busy handler that tries again every few milliseconds until ``timeout`` seconds have
    passed since the first try (see ``_BUSY_POLL_MAX``)."""
    started: list[float] = []

    def busy(tries: int) -> bool:
        now = time.monotonic()
        if tries == 0:
            started[:] = [now]
        if now - started[0] >= timeout:
            return False
        time.sleep(min(0.0005 * (tries + 1), _BUSY_POLL_MAX))
        return True

    return busy


def _encode_sort_value(value: Any) -> str:
    """The reference's ``IndexLevel.encodeValue``: numbers zero-padded, others as JSON."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return json_compact(value)
    max_safe = 2**53 - 1
    text = _js_number(value + max_safe if value < 0 else value)
    return ("!" if value < 0 else "") + text.rjust(len(str(max_safe)), "0")


def _js_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _js_equal(a: Any, b: Any) -> bool:
    # JS `===` on index values: booleans never equal numbers, 1 === 1.0.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, str) != isinstance(b, str):
        return False
    return bool(a == b)


def _js_less(a: Any, b: Any) -> bool:
    # The range comparisons of the reference are plain JS `<` on string or number values.
    try:
        return bool(a < b)
    except TypeError:
        return False


def _match_value(filter_value: Any, index_value: Any) -> bool:
    if isinstance(filter_value, list):
        return any(_js_equal(index_value, v) for v in filter_value)
    if isinstance(filter_value, dict):
        if "lt" in filter_value and not _js_less(index_value, filter_value["lt"]):
            return False
        if "lte" in filter_value and _js_less(filter_value["lte"], index_value):
            return False
        if "gt" in filter_value and not _js_less(filter_value["gt"], index_value):
            return False
        return not ("gte" in filter_value and _js_less(index_value, filter_value["gte"]))
    return _js_equal(index_value, filter_value)


def match_filter(indexes: dict[str, Any], flt: dict[str, Any]) -> bool:
    """The reference's ``FilterUtility.matchFilter``: every property must match."""
    for prop, fv in flt.items():
        iv = indexes.get(prop)
        if iv is None:
            return False
        if isinstance(iv, list):
            if not any(_match_value(fv, v) for v in iv):
                return False
        elif not _match_value(fv, iv):
            return False
    return True


def match_any_filter(indexes: dict[str, Any], filters: list[dict[str, Any]]) -> bool:
    return not filters or any(match_filter(indexes, f) for f in filters)


def _is_filter_concise(flt: dict[str, Any], has_cursor: bool) -> bool:
    # The reference pages in memory only for filters it considers narrow.
    if "recordId" in flt:
        return True
    if has_cursor:
        return False
    return any(k in flt for k in ("protocolPath", "contextId", "parentId", "schema"))


class StoredMessage(NamedTuple):
    """A message as stored: its JSON decoded, the CID it is stored under (its message CID, with
    a 0-byte record's ``encodedData: ""``), and the indexes it was put under."""

    message: dict[str, Any]
    cid: str
    indexes: dict[str, Any]

    @property
    def initial_write(self) -> bool | None:
        """Whether it is its record's initial write, as its indexes tell (a RecordsWrite is put
        under its entry id, which is its record id for the initial write alone); None when
        they do not tell (then ``records_write.is_initial_write`` computes it)."""
        d = self.message.get("descriptor")
        if type(d) is not dict or d.get("interface") != "Records" or d.get("method") != "Write":
            return False
        entry_id, record_id = self.indexes.get("entryId"), self.message.get("recordId")
        if type(entry_id) is not str or type(record_id) is not str:
            return None
        return entry_id == record_id


class MessageStore:
    """Messages with their indexes; queries with the reference's semantics."""

    def __init__(self, store: Store) -> None:
        self._s = store
        # The last few messages put and their JSON text: the archive stores the same message
        # (less its data) right after processing it, and takes its text from here rather than
        # serializing it again (p2psync/dwn/canonical.py, `archived_body`).
        self.recent_puts: deque[tuple[dict[str, Any], str]] = deque(maxlen=_RECENT_PUTS)

    def put(
        self,
        tenant: str,
        message: dict[str, Any],
        indexes: dict[str, Any],
        cid: str | None = None,
        indexes_json: str | None = None,
        body_json: str | None = None,
    ) -> None:
        """Store a message under its CID (a repeat put of the same CID is a no-op).

        ``indexes_json`` may carry the already-serialized indexes (the event log needs them too),
        and ``body_json`` the message's ``json_compact`` form when the caller has it.
        """
        cid = cid or message_cid(message)
        body = body_json or json_compact(message)
        self._s.conn.execute(
            _INSERT_MESSAGE,
            (
                self._s._tid(tenant),
                cid,
                body,
                indexes_json or json_compact(indexes),
                _wire_form(message),
                *[v if isinstance(v, str) else None for v in map(indexes.get, _NARROWING_PROPS)],
            ),
        )
        self.recent_puts.append((message, body))

    def get(self, tenant: str, cid: str) -> dict[str, Any] | None:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return None
        row = self._s.conn.execute("SELECT body FROM messages WHERE tenant=? AND cid=?", (tid, cid)).fetchone()
        return None if row is None else json.loads(row[0])

    def has(self, tenant: str, cid: str) -> bool:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return False
        row = self._s.conn.execute("SELECT 1 FROM messages WHERE tenant=? AND cid=?", (tid, cid)).fetchone()
        return row is not None

    def delete(self, tenant: str, cid: str) -> None:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is not None:
            self._s.conn.execute("DELETE FROM messages WHERE tenant=? AND cid=?", (tid, cid))

    def demote(self, tenant: str, cid: str, message: dict[str, Any], indexes: dict[str, Any]) -> None:
        """Store ``message`` and ``indexes`` in place of the row of ``cid``, which holds the
        same message (a record's initial write, no longer its latest state).

        The reference deletes the row and puts it again. Where the message's CID is its
        stored one (anything but a 0-byte record's ``encodedData: ""``) and the row's indexed
        columns do not change, rewriting its two texts in place is the same state, less
        the index entries a delete and an insert rewrite: ~45 us of SQL an update
        (issue #17). A row already so (every update after a record's first) is left as it is.
        Its ``wire`` stays: the DAG-CBOR of the message less ``encodedData`` is ``message``'s.
        """
        self._s.conn.execute(
            "UPDATE messages SET body=?1, indexes=?2"
            " WHERE tenant=?3 AND cid=?4 AND (body IS NOT ?1 OR indexes IS NOT ?2)",
            (json_compact(message), json_compact(indexes), self._s._tid(tenant), cid),
        )

    def count(self, tenant: str) -> int:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return 0
        return int(self._s.scalar("SELECT count(*) FROM messages WHERE tenant=?", (tid,)))

    def cids(self, tenant: str) -> list[str]:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return []
        return [r[0] for r in self._s.conn.execute("SELECT cid FROM messages WHERE tenant=?", (tid,))]

    # -- replicated apply support (issue #3) ------------------------------------------------

    def get_indexes(self, tenant: str, cid: str) -> dict[str, Any] | None:
        """The index key-values a stored message was put under (None when it is not stored)."""
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return None
        row = self._s.conn.execute("SELECT indexes FROM messages WHERE tenant=? AND cid=?", (tid, cid)).fetchone()
        if row is None:
            return None
        indexes: dict[str, Any] = json.loads(row[0])
        return indexes

    def _candidates(self, tid: int, filters: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
        conn = self._s.conn
        found: dict[str, tuple[str, dict[str, Any]]] = {}
        for flt in filters or [{}]:
            args: list[Any] = [tid]
            shape: list[tuple[str, int]] = []  # (property, -1 for a string or the list's length)
            # SQLite has no statistics to choose between indexes; a wrong guess scans the tenant.
            for prop in _best_group(flt):
                value = flt[prop]
                if isinstance(value, str):
                    shape.append((prop, -1))
                    args.append(value)
                else:
                    shape.append((prop, len(value)))
                    args.extend(value)
            key = tuple(shape)
            sql, copies = _candidate_sql.get(key) or _candidate_sql_of(key)
            for cid, body, idx in conn.execute(sql, args * copies):
                if cid not in found:
                    found[cid] = (body, json.loads(idx))
        return found

    def query(
        self,
        tenant: str,
        filters: list[dict[str, Any]],
        sort: dict[str, int] | None = None,
        pagination: dict[str, Any] | None = None,
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Messages matching any of ``filters``, sorted and paged as the reference does."""
        matched, next_cursor = self._match(tenant, filters, sort, pagination)
        return [json.loads(body) for _, body, _ in matched], next_cursor

    def query_stored(self, tenant: str, filters: list[dict[str, Any]]) -> list[StoredMessage]:
        """:meth:`query`'s messages, in its order, each with the CID it is stored under and its
        indexes: what a handler would otherwise derive again from the message (its CID,
        whether it is its record's initial write: a DAG-CBOR encoding and a hash each, issue #17)."""
        matched, _ = self._match(tenant, filters, None, None)
        return [StoredMessage(json.loads(body), key.rsplit("\x00", 1)[1], idx) for key, body, idx in matched]

    def query_cids(
        self, tenant: str, filters: list[dict[str, Any]], sort: dict[str, int] | None = None
    ) -> list[str]:
        """The CIDs :meth:`query` would return, without decoding the messages."""
        matched, _ = self._match(tenant, filters, sort, None)
        return [key.rsplit("\x00", 1)[1] for key, _, _ in matched]

    def _match(
        self,
        tenant: str,
        filters: list[dict[str, Any]],
        sort: dict[str, int] | None,
        pagination: dict[str, Any] | None,
    ) -> tuple[list[tuple[str, str, dict[str, Any]]], dict[str, Any] | None]:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return [], None
        sort = sort or {}
        sort_prop = "messageTimestamp"
        for candidate in ("dateCreated", "datePublished", "messageTimestamp"):
            if sort.get(candidate) is not None:
                sort_prop = candidate
                break
        descending = sort.get(sort_prop) == -1
        pagination = pagination or {}
        limit = pagination.get("limit")
        cursor = pagination.get("cursor")
        in_memory = all(_is_filter_concise(f, cursor is not None) for f in filters)

        matched: list[tuple[str, str, dict[str, Any]]] = []
        for cid, (body, idx) in self._candidates(tid, filters).items():
            if not match_any_filter(idx, filters):
                continue
            if sort_prop not in idx:
                if in_memory and filters:
                    return [], None  # the reference aborts such a query with no results
                continue
            matched.append((f"{_encode_sort_value(idx[sort_prop])}\x00{cid}", body, idx))
        matched.sort(key=lambda m: m[0], reverse=descending)
        if cursor is not None:
            start_key = f"{_encode_sort_value(cursor.get('value'))}\x00{cursor.get('messageCid')}"
            if descending:
                matched = [m for m in matched if m[0] < start_key]
            else:
                matched = [m for m in matched if m[0] > start_key]
        next_cursor = None
        if isinstance(limit, int) and limit > 0 and len(matched) > limit:
            matched = matched[:limit]
            last_cid = matched[-1][0].rsplit("\x00", 1)[1]
            value = matched[-1][2][sort_prop]
            if isinstance(value, bool | list):
                raise DwnError("IndexInvalidCursorValueType", "only string or number values are supported for cursors")
            next_cursor = {"messageCid": last_cid, "value": value}
        return matched, next_cursor


class DataStore:
    """Record data too large to travel inline, keyed by (tenant, recordId, dataCid).

    The bytes are a file beside the store (``Store.keep_data``; rows of schema 8 and before
    hold them in SQLite, and are read as they are). The same data under two keys is one file.
    """

    def __init__(self, store: Store) -> None:
        self._s = store

    def put(self, tenant: str, record_id: str, data_cid: str, data: bytes) -> int:
        with self._s.transaction():  # the file and its row under one write lock
            self._s.conn.execute(
                "INSERT OR REPLACE INTO data(tenant, record_id, data_cid, size, bytes) VALUES(?,?,?,?,?)",
                (self._s._tid(tenant), record_id, data_cid, len(data), self._s.keep_data(data)),
            )
        return len(data)

    def _kept(self, tenant: str, record_id: str, data_cid: str) -> Any:
        """The ``bytes`` column of this data's row as kept (the bytes, or a blob reference), or
        None when there is no such row."""
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return None
        row = self._s.conn.execute(
            "SELECT bytes FROM data WHERE tenant=? AND record_id=? AND data_cid=?", (tid, record_id, data_cid)
        ).fetchone()
        return None if row is None else row[0]

    def get(self, tenant: str, record_id: str, data_cid: str) -> bytes | None:
        kept = self._kept(tenant, record_id, data_cid)
        return None if kept is None else self._s.read_data(kept)

    def file_reference(self, tenant: str, record_id: str, data_cid: str) -> str | None:
        """The blob reference of this data when its bytes are a file (read them with
        ``store.blobs.read``, which touches no row: any thread may), else None."""
        kept = self._kept(tenant, record_id, data_cid)
        return kept if type(kept) is str else None

    def size(self, tenant: str, record_id: str, data_cid: str) -> int | None:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return None
        row = self._s.conn.execute(
            "SELECT size FROM data WHERE tenant=? AND record_id=? AND data_cid=?", (tid, record_id, data_cid)
        ).fetchone()
        return None if row is None else int(row[0])

    def delete(self, tenant: str, record_id: str, data_cid: str) -> None:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is not None:
            self._s.conn.execute(
                "DELETE FROM data WHERE tenant=? AND record_id=? AND data_cid=?", (tid, record_id, data_cid)
            )


def _filter_needles(flt: dict[str, Any]) -> list[list[str]]:
    """Substrings the stored JSON of any indexes matching ``flt`` must contain.

    One group per string-valued equality (or all-string one-of) property: an index equal to
    such a value holds it verbatim, JSON-encoded the same way, so at least one needle of each
    group occurs in its text. A cheap test that lets a log scan skip most ``json.loads``.
    """
    groups: list[list[str]] = []
    for value in flt.values():
        if isinstance(value, str):
            groups.append([json_compact(value)])
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            groups.append([json_compact(v) for v in value])
    return groups



def _may_match(text: str, needles: list[list[list[str]]]) -> bool:
    """Whether some filter's needle groups all occur in ``text`` (loops: hot in log scans)."""
    for groups in needles:
        for group in groups:
            for needle in group:
                if needle in text:
                    break
            else:
                break  # this group has no needle in the text: the filter cannot match
        else:
            return True
    return False


# The log keeps the entries of superseded protocol definitions (handlers/protocols.py); the
# reference's log does not, so a MessagesQuery skips an entry of a definition no longer stored.
# Every ProtocolsConfigure's indexes hold this text (its descriptor's method), no other's do.
_DEFINITION_NEEDLE: Final = '"method":"Configure"'
_STORED_SQL: Final = "SELECT 1 FROM messages WHERE tenant=? AND cid=?"

# The stream identity comes back with the position: a replicated apply reports both (its
# progress token) and need not read them again (one statement less each, issue #17).
_NEXT_POSITION = (
    "UPDATE tenants SET next_position = next_position + 1 WHERE id=? RETURNING next_position - 1, stream_id, epoch"
)


class EventLog:
    """Per-tenant append-only log of stored messages with increasing integer positions.

    A position is never reused. Entries of messages the engine later prunes are removed (as
    the reference does), which leaves gaps; the stream identity (``streamId``, ``epoch``) says
    which log the positions belong to. One exception: a protocol definition replaced by a
    newer one keeps its entry, for replication (handlers/protocols.py); :meth:`query` (the
    reference's ``MessagesQuery``) skips it.
    """

    def __init__(self, store: Store) -> None:
        self._s = store
        # While True (a canonical replay, p2psync/dwn/canonical.py) the handlers' appends and
        # deletions are skipped; the replay reconciles the log once it is done.
        self.frozen = False
        # Entries appended through this object so far, and the last one as (tenant id, cid,
        # position, stream_id, epoch): see :meth:`appended_since`.
        self.appends = 0
        self._last: tuple[int, str, int, str, str] | None = None

    def append(self, tenant: str, cid: str, indexes: dict[str, Any], indexes_json: str | None = None) -> int:
        """Append an entry; returns its position (0 while frozen). Atomic with the caller's transaction."""
        if self.frozen:
            return 0
        conn = self._s.conn
        if not conn.in_transaction:
            with self._s.transaction():
                return self.append(tenant, cid, indexes, indexes_json)
        tid = self._s._tid(tenant)
        row = conn.execute(_NEXT_POSITION, (tid,)).fetchone()
        if row is None:
            raise DwnError("StoreInternal", "no row from UPDATE", 500)
        position = int(row[0])
        conn.execute(
            "INSERT INTO events(tenant, position, cid, indexes) VALUES(?,?,?,?)",
            (tid, position, cid, indexes_json or json_compact(indexes)),
        )
        self.appends += 1
        self._last = (tid, cid, position, str(row[1]), str(row[2]))
        return position

    def forget_last(self) -> None:
        self._last = None

    def appended_since(self, appends: int, tenant: str, cid: str) -> tuple[int, str, str] | None:
        """(position, streamId, epoch) of ``cid``'s entry when the last entry appended since
        :attr:`appends` was ``appends`` is it, as appended; None otherwise (then ask
        :meth:`position_of`). For a caller that processed one message and has not removed its
        entry since: it saves looking up what the append just wrote.
        """
        last = self._last
        if self.appends == appends or last is None or last[1] != cid:
            return None
        tid = self._s.tenant_id(tenant, create=False)
        return (last[2], last[3], last[4]) if tid == last[0] else None

    def delete_events_by_cid(self, tenant: str, cids: list[str]) -> None:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None or not cids or self.frozen:
            return
        self._last = None
        self._s.conn.executemany("DELETE FROM events WHERE tenant=? AND cid=?", [(tid, c) for c in cids])

    def position_of(self, tenant: str, cid: str) -> int | None:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return None
        row = self._s.conn.execute("SELECT position FROM events WHERE tenant=? AND cid=?", (tid, cid)).fetchone()
        return None if row is None else int(row[0])

    def read(self, tenant: str, after: int = 0, limit: int | None = None) -> list[tuple[int, str]]:
        """Entries with position > ``after`` in order, as (position, messageCid)."""
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return []
        sql = "SELECT position, cid FROM events WHERE tenant=? AND position>? ORDER BY position"
        args: list[Any] = [tid, after]
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [(int(p), c) for p, c in self._s.conn.execute(sql, args)]

    def query(
        self,
        tenant: str,
        filters: list[dict[str, Any]],
        cursor: dict[str, Any] | None = None,
    ) -> tuple[list[str], dict[str, Any] | None]:
        """Message CIDs of the events matching any of ``filters``, in log order, after ``cursor``.

        The reference's ``EventLogLevel.queryEvents``: no filters match everything; the reply
        cursor is the last event returned (``{messageCid, value}``), or None when nothing is.
        Our ordering key is the event's position, so ``value`` is an integer where the
        reference's is its ULID watermark (a string). A given cursor is compared as the
        reference compares its keys: ``encodeValue(value) + NUL + messageCid`` against each
        event's ``encodeValue(position) + NUL + cid``, so a cursor whose CID was deleted still
        resumes at the right place, and a string-valued cursor sorts before every position.
        """
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return [], None
        sql = "SELECT position, cid, indexes FROM events WHERE tenant=?"
        args: list[Any] = [tid]
        start_key: str | None = None
        if cursor is not None:
            value = cursor.get("value")
            start_key = f"{_encode_sort_value(value)}\x00{cursor.get('messageCid')}"
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**53 - 1:
                # Narrow in SQL: an event before the cursor's position sorts before its key.
                sql += " AND position>=?"
                args.append(value)
        sql += " ORDER BY position"
        needles = [_filter_needles(f) for f in filters]
        found: list[tuple[int, str]] = []
        conn = self._s.conn
        for position, cid, idx in conn.execute(sql, args):
            if start_key is not None and f"{_encode_sort_value(position)}\x00{cid}" <= start_key:
                continue
            if filters and not _may_match(idx, needles):
                continue  # no filter can match: skip decoding the indexes
            if _DEFINITION_NEEDLE in idx and conn.execute(_STORED_SQL, (tid, cid)).fetchone() is None:
                continue  # a superseded definition: listed for replicas, not in the reference's log
            if not filters or match_any_filter(json.loads(idx), filters):
                found.append((int(position), str(cid)))
        if not found:
            return [], None
        last_position, last_cid = found[-1]
        return [cid for _, cid in found], {"messageCid": last_cid, "value": last_position}

    # -- replicated apply support (issue #3) ------------------------------------------------

    def ensure_entry(self, tenant: str, cid: str, indexes: dict[str, Any]) -> tuple[int, bool]:
        """The position of ``cid``'s entry, appending one first when the log lacks it.

        Returns (position, appended). Repairs a stored message whose log entry is missing, so
        a peer pulling this log sees it; an existing entry is never duplicated.
        """
        with self._s.transaction():
            existing = self.position_of(tenant, cid)
            position = self.append(tenant, cid, indexes) if existing is None else existing
        return position, existing is None

    def stream(self, tenant: str) -> tuple[str, str]:
        """(streamId, epoch) of the tenant's log."""
        row = self._s.conn.execute(
            "SELECT stream_id, epoch FROM tenants WHERE id=?", (self._s._tid(tenant),)
        ).fetchone()
        assert row is not None  # _tid created the tenant
        return str(row[0]), str(row[1])

    def count(self, tenant: str) -> int:
        tid = self._s.tenant_id(tenant, create=False)
        if tid is None:
            return 0
        return int(self._s.scalar("SELECT count(*) FROM events WHERE tenant=?", (tid,)))
