"""A store's peer-side state: its storeId (§1.3), the checkpoint copies it keeps for active
peers (§4.3) and the origin of replicated messages (§11 echo suppression), in the store's own
database file.

The copies live beside the messages on the store's connection, so a copy is never durable while
the messages it covers are not (one WAL file commits in order). Tables ``peer_*`` only.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from typing import Any, Final

from p2psync.dwn.encoding import dag_cbor_encode, json_compact
from p2psync.dwn.store import Store
from p2psync.errors import CheckpointRevConflict
from p2psync.replication.checkpoint import DirectionCheckpoint, checkpoint_id
from p2psync.replication.stats import MAX_NOT_APPLIED, MAX_NOT_APPLIED_TRACKED, NotApplied, NotAppliedLog

__all__ = ["CheckpointCopies", "NotAppliedRecords", "Origins", "checkpoint_id", "pair_rev", "store_id"]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS peer_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS peer_checkpoint_copies (
    peer_did TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    rev TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (peer_did, checkpoint_id)
);
-- The store a replicated message first arrived from (written in the apply's own commit), by
-- the message's archive row: rows arrive in apply order, so one dirties the table's last page.
-- Keyed by (tenant, cid), each row dirtied a page of its own in the commit: ~1 page of WAL and
-- its checkpoint, ~30 us CPU a pulled message (issue #17, measured). The CID is kept too, so
-- a row id the archive ever reused would not lend its origin to another message.
CREATE TABLE IF NOT EXISTS peer_arrivals (
    archive_row INTEGER PRIMARY KEY,
    cid TEXT NOT NULL,
    store_id TEXT NOT NULL
);
-- The latest messages that did not apply (replication/stats.py NotAppliedLog), oldest first,
-- so a node's status still names them after a restart: an Invalid one settles its token and is
-- never offered again. How many there were in all is peer_meta's ``notAppliedCount``.
CREATE TABLE IF NOT EXISTS peer_not_applied (
    position INTEGER PRIMARY KEY,
    body TEXT NOT NULL
);
"""

#: Before peer_arrivals: one row a message keyed by its tenant's DID and its CID. Its rows are
#: moved to peer_arrivals (those of messages the archive holds: all of them) the first time a
#: store is opened here.
_OLD_ORIGINS: Final = "peer_origins"


#: An origin goes with its archive row (a message refused at its place in the log, a prune).
_GONE_WITH_ROW: Final = """
CREATE TRIGGER peer_arrivals_gone AFTER DELETE ON archive BEGIN
    DELETE FROM peer_arrivals WHERE archive_row = old.id;
END
"""


def _ensure(store: Store) -> None:
    conn = store.conn
    conn.execute(_SCHEMA)
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='trigger' AND name='peer_arrivals_gone'").fetchone():
        with store.transaction():
            # Origins left by rows deleted before the trigger existed go first.
            conn.execute("DELETE FROM peer_arrivals WHERE NOT EXISTS"
                         " (SELECT 1 FROM archive a WHERE a.id = archive_row AND a.cid = peer_arrivals.cid)")
            conn.execute(_GONE_WITH_ROW)
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (_OLD_ORIGINS,)).fetchone():
        with store.transaction():
            conn.execute(
                f"INSERT OR IGNORE INTO peer_arrivals(archive_row, cid, store_id)"
                f" SELECT a.id, a.cid, o.store_id FROM {_OLD_ORIGINS} o JOIN tenants t ON t.did = o.tenant"
                f" JOIN archive a ON a.tenant = t.id AND a.cid = o.cid"
            )
            conn.execute(f"DROP TABLE {_OLD_ORIGINS}")


def store_id(store: Store) -> str:
    """The store's storeId, made (UUID v4) the first time it is asked for and never changed."""
    _ensure(store)
    with store.transaction():
        row = store.conn.execute("SELECT value FROM peer_meta WHERE key='storeId'").fetchone()
        if row is not None:
            return str(row[0])
        value = str(uuid.uuid4())
        store.conn.execute("INSERT INTO peer_meta(key, value) VALUES('storeId', ?)", (value,))
        return value


def pair_rev(generation: int, pair: dict[str, Any]) -> str:
    """``<generation>-<first 32 hex of sha256(DAG-CBOR(pair))>`` (§4.3)."""
    return f"{generation}-{hashlib.sha256(dag_cbor_encode(pair)).hexdigest()[:32]}"


#: ``setCheckpoint`` with a rev that is not the stored one (``current`` is the stored rev): the
#: very refusal the peer answers with (§4.3), under the name the peer layer still catches.
CopyRevConflict = CheckpointRevConflict


class CheckpointCopies:
    """The copies a passive store keeps, keyed by (the active's proven DID, checkpointId)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        _ensure(store)

    def get(self, peer_did: str, cid: str) -> tuple[dict[str, Any], str] | None:
        """The stored pair and its rev, or None."""
        row = self.store.conn.execute(
            "SELECT body, rev FROM peer_checkpoint_copies WHERE peer_did=? AND checkpoint_id=?", (peer_did, cid)
        ).fetchone()
        if row is None:
            return None
        import json

        return json.loads(row[0]), str(row[1])

    def set(self, peer_did: str, cid: str, pair: dict[str, Any], rev: str | None) -> str:
        """Compare-and-set; returns the new rev after COMMIT. Validates both documents."""
        canonical = {
            "pull": DirectionCheckpoint.from_wire(pair.get("pull", {})).to_wire(),
            "push": DirectionCheckpoint.from_wire(pair.get("push", {})).to_wire(),
        }
        with self.store.transaction():
            row = self.store.conn.execute(
                "SELECT generation, rev FROM peer_checkpoint_copies WHERE peer_did=? AND checkpoint_id=?",
                (peer_did, cid),
            ).fetchone()
            current = None if row is None else str(row[1])
            if rev != current:
                raise CheckpointRevConflict(current)
            generation = 1 if row is None else int(row[0]) + 1
            new_rev = pair_rev(generation, canonical)
            self.store.conn.execute(
                "INSERT OR REPLACE INTO peer_checkpoint_copies(peer_did, checkpoint_id, generation, rev, body)"
                " VALUES(?,?,?,?,?)",
                (peer_did, cid, generation, new_rev, json_compact(canonical)),
            )
            return new_rev


class Origins:
    """Which store each replicated message came from (§11, echo suppression by origin).

    A pusher settles, without proposing, log entries that came from the very store it is
    pushing to: that store had them. Only the first arrival is kept (a message that came from
    two stores came from the first). ``p2psync show`` reads it too: where each message of a
    record's history came from, and so which write lost to another device's.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        _ensure(store)

    def record(self, tenant: str, cid: str, origin_store_id: str) -> None:
        """Inside the caller's transaction, after the apply that archived ``cid`` (its batch)."""
        # By the tenant's row id: a join on tenants.did made SQLite prepare the statement
        # again on every run (8 against 2 us, measured).
        self.store.conn.execute(
            "INSERT OR IGNORE INTO peer_arrivals(archive_row, cid, store_id)"
            " SELECT id, cid, ? FROM archive WHERE tenant=? AND cid=?",
            (origin_store_id, self.store.tenant_id(tenant), cid),
        )

    def record_many(self, tenant: str, cids: Sequence[str], origin_store_id: str) -> None:
        """:meth:`record` of each of ``cids``, in one statement."""
        tid = self.store.tenant_id(tenant)
        self.store.conn.executemany(
            "INSERT OR IGNORE INTO peer_arrivals(archive_row, cid, store_id)"
            " SELECT id, cid, ? FROM archive WHERE tenant=? AND cid=?",
            [(origin_store_id, tid, cid) for cid in cids],
        )

    def from_store(self, tenant: str, cids: list[str], origin_store_id: str) -> set[str]:
        """The subset of ``cids`` that came from ``origin_store_id``."""
        return {cid for cid, origin in self.of(tenant, cids).items() if origin == origin_store_id}

    def of(self, tenant: str, cids: list[str]) -> dict[str, str]:
        """``{cid: storeId}`` for those of ``cids`` that arrived from another store (the rest
        were written here, or admitted by a path that keeps no origin)."""
        tid = self.store.tenant_id(tenant, create=False) if cids else None
        if tid is None:
            return {}
        marks = ",".join("?" * len(cids))
        rows = self.store.conn.execute(
            "SELECT a.cid, p.store_id FROM archive a JOIN peer_arrivals p ON p.archive_row = a.id AND p.cid = a.cid"
            f" WHERE a.tenant=? AND a.cid IN ({marks})",
            (tid, *cids),
        )
        return {str(r[0]): str(r[1]) for r in rows}


class NotAppliedRecords:
    """A :class:`NotAppliedLog` kept in the store (``peer_not_applied``): the latest entries
    and the count, rewritten whole after a change (at most :data:`MAX_NOT_APPLIED` rows), and
    the messages that left the list, still counted, by CID (one ``peer_meta`` value)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        _ensure(store)

    def load(self) -> NotAppliedLog:
        conn = self.store.conn
        last = [entry for (body,) in conn.execute("SELECT body FROM peer_not_applied ORDER BY position")
                if (entry := NotApplied.from_json(_json_or_none(str(body)))) is not None][-MAX_NOT_APPLIED:]
        row = conn.execute("SELECT value FROM peer_meta WHERE key='notAppliedCount'").fetchone()
        count = int(row[0]) if row is not None and str(row[0]).isdigit() else 0
        row = conn.execute(f"SELECT value FROM peer_meta WHERE key='{_OVERFLOW}'").fetchone()
        overflow = _overflow_from_json(_json_or_none(str(row[0])) if row is not None else None)
        return NotAppliedLog(max(count, len(last) + len(overflow)), last, overflow)

    def save(self, log: NotAppliedLog) -> None:
        """Inside the caller's transaction, or in one of its own."""
        with self.store.transaction():
            conn = self.store.conn
            conn.execute("DELETE FROM peer_not_applied")
            conn.executemany("INSERT INTO peer_not_applied(position, body) VALUES(?,?)",
                             [(i, json_compact(e.to_json())) for i, e in enumerate(log.last)])
            conn.execute("INSERT OR REPLACE INTO peer_meta(key, value) VALUES('notAppliedCount', ?)", (str(log.count),))
            overflow = [[cid, where, tenant, peer] for (cid, where), (tenant, peer) in log.overflow.items()]
            conn.execute(f"INSERT OR REPLACE INTO peer_meta(key, value) VALUES('{_OVERFLOW}', ?)",
                         (json_compact(overflow),))

    def clear(self) -> int:
        """Empty the kept list, and withdraw any request to (:meth:`request_clear`); returns the
        count it held."""
        with self.store.transaction():
            count = self.load().count
            self.save(NotAppliedLog())
            self.answer_clear()
        return count

    def request_clear(self) -> None:
        """Ask the peer running on this store (another process: a node) to empty its list. It
        looks about once a second (:meth:`clear_requested`), empties its own list and the kept
        one, says so in its status file, then withdraws the request (:meth:`answer_clear`)."""
        with self.store.transaction():
            self.store.conn.execute(f"INSERT OR REPLACE INTO peer_meta(key, value) VALUES('{_CLEAR_REQUEST}', '1')")

    def clear_requested(self) -> bool:
        return self.store.conn.execute(f"SELECT 1 FROM peer_meta WHERE key='{_CLEAR_REQUEST}'").fetchone() is not None

    def answer_clear(self) -> None:
        with self.store.transaction():
            self.store.conn.execute(f"DELETE FROM peer_meta WHERE key='{_CLEAR_REQUEST}'")


#: The ``peer_meta`` key of a request to clear the not-applied list (``status --clear-not-applied``).
_CLEAR_REQUEST: Final = "notAppliedClear"
#: The ``peer_meta`` key of the messages that left the list and are still counted (JSON
#: ``[[messageCid, where, tenant, peer or null], ...]``, oldest first).
_OVERFLOW: Final = "notAppliedOverflow"


def _overflow_from_json(rows: Any) -> dict[tuple[str, str], tuple[str, str | None]]:
    """What :meth:`NotAppliedRecords.save` wrote; a damaged row (edited by hand) is skipped."""
    out: dict[tuple[str, str], tuple[str, str | None]] = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, list) and len(row) == 4 and isinstance(row[0], str) and row[1] in ("here", "peer") \
                and isinstance(row[2], str) and (row[3] is None or isinstance(row[3], str)):
            out[(row[0], row[1])] = (row[2], row[3])
    return dict(list(out.items())[-MAX_NOT_APPLIED_TRACKED:])


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
