"""``p2psync export``: a replica's message index and event log as Parquet, in bounded memory.

The export reads the store in one read transaction (a consistent snapshot even while a node
writes to it), walks the messages in rowid order with a streaming cursor, and writes one
Parquet row group per :data:`EXPORT_BATCH_ROWS` rows. Memory stays at one batch, whatever
the store's size. Spark is not needed here: pyarrow writes the files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from p2psync.dwn.errors import DwnError
from p2psync.dwn.jws import decode_payload
from p2psync.dwn.store import Store
from p2psync.pipeline.errors import PipelineError
from p2psync.pipeline.formats import (
    EXPORT_FORMAT,
    MANIFEST_FILE,
    MESSAGE_SCHEMA,
    MESSAGES_DIR,
    PROTOCOL_SCHEMA,
    PROTOCOLS_DIR,
)
from p2psync.state.copies import store_id

__all__ = ["EXPORT_BATCH_ROWS", "ExportResult", "export_store", "message_row"]

# Rows per Parquet row group and per in-memory batch. 20,000 rows of ~1.5 KB message bodies
# keep the Python side near 100 MB at worst, and row groups this size still let Spark split
# a large export across tasks (it splits at row-group boundaries).
EXPORT_BATCH_ROWS: Final = 20_000

_DATA_FILE: Final = "part-00000.parquet"


@dataclass(frozen=True)
class ExportResult:
    """What one export wrote."""

    out: Path
    replica_id: str
    messages: int
    protocols: int
    tenants: int
    without_position: int
    orphan_events: int


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _payload(message: dict[str, Any]) -> dict[str, Any]:
    """The signed payload of the message's own signature ({} for an unsigned message)."""
    authorization = message.get("authorization")
    if not isinstance(authorization, dict) or not isinstance(authorization.get("signature"), dict):
        return {}
    try:
        return decode_payload(authorization["signature"])
    except (DwnError, KeyError, TypeError):
        return {}


def message_row(
    replica_id: str,
    tenant: str,
    stream: tuple[str, str],
    position: int | None,
    cid: str,
    message: dict[str, Any],
    indexes: dict[str, Any],
) -> dict[str, Any]:
    """One export row (MESSAGE_COLUMNS) from a stored message and its index key-values."""
    descriptor = message.get("descriptor") if isinstance(message.get("descriptor"), dict) else {}
    assert isinstance(descriptor, dict)
    payload = _payload(message)
    authorization = message.get("authorization")
    delegated = authorization.get("authorDelegatedGrant") if isinstance(authorization, dict) else None
    interface, method = _str(indexes.get("interface")), _str(indexes.get("method"))
    record_id = _str(indexes.get("recordId"))
    grant_id = _str(payload.get("permissionGrantId")) or _str(descriptor.get("permissionGrantId"))
    return {
        "replica_id": replica_id,
        "tenant": tenant,
        "stream_id": stream[0],
        "epoch": stream[1],
        "position": position,
        "message_cid": cid,
        "interface": interface,
        "method": method,
        "record_id": record_id,
        # entryId is indexed for writes only; equal to the recordId for the initial write.
        "is_initial_write": interface == "Records" and method == "Write" and record_id is not None
        and indexes.get("entryId") == record_id,
        "protocol": _str(indexes.get("protocol")),
        "protocol_path": _str(indexes.get("protocolPath")),
        "context_id": _str(indexes.get("contextId")),
        "parent_id": _str(indexes.get("parentId")),
        "author": _str(indexes.get("author")),
        "recipient": _str(indexes.get("recipient")),
        "schema": _str(indexes.get("schema")),
        "data_format": _str(indexes.get("dataFormat")),
        "data_cid": _str(indexes.get("dataCid")),
        "data_size": _int(indexes.get("dataSize")),
        "message_timestamp": _str(indexes.get("messageTimestamp")),
        "date_created": _str(indexes.get("dateCreated")),
        "date_published": _str(indexes.get("datePublished")) or _str(descriptor.get("datePublished")),
        "is_latest_base_state": _bool(indexes.get("isLatestBaseState")),
        "published": _bool(indexes.get("published")),
        "prune": _bool(indexes.get("prune")),
        "protocol_role": _str(payload.get("protocolRole")),
        "permission_grant_id": grant_id,
        "delegated_grant_id": _str(delegated.get("recordId")) if isinstance(delegated, dict) else None,
    }


class _BatchWriter:
    """Rows in, Parquet row groups out; holds at most one batch."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.writer = pq.ParquetWriter(str(path), schema, compression="zstd")
        self.rows: list[dict[str, Any]] = []
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= EXPORT_BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
            self.count += len(self.rows)
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


def _resolve_replica_id(store: Store, replica_id: str | None) -> str:
    if replica_id:
        return replica_id
    # The storeId the peer proves in hello: a repair reading the plan finds its part by it.
    return store_id(store)


def export_store(
    store_path: str | Path,
    out: str | Path,
    *,
    replica_id: str | None = None,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
) -> ExportResult:
    """Write the export of the store at ``store_path`` into the directory ``out``.

    ``replica_id`` defaults to the store's storeId. ``progress`` is called with the number of
    messages written so far, once per batch.
    """
    store_file = Path(store_path)
    if not store_file.is_file():
        raise PipelineError("StoreNotFound", f"no store at {store_file}")
    out_dir = Path(out)
    manifest_path = out_dir / MANIFEST_FILE
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise PipelineError("ExportExists", f"{out_dir} is not empty; choose another --out or pass --overwrite")
        if not manifest_path.exists():
            raise PipelineError("ExportExists", f"{out_dir} holds files that are not an export; refusing to overwrite")
        manifest_path.unlink()  # an interrupted rewrite leaves no manifest, so no half export is ever read
    store = Store(store_file)
    try:
        rid = _resolve_replica_id(store, replica_id)
        started = time.time()
        messages = _BatchWriter(out_dir / MESSAGES_DIR / _DATA_FILE, MESSAGE_SCHEMA)
        protocols = _BatchWriter(out_dir / PROTOCOLS_DIR / _DATA_FILE, PROTOCOL_SCHEMA)
        conn = store.conn
        conn.execute("BEGIN")  # one snapshot for every statement below
        try:
            tenants = {
                int(tid): (str(did), (str(sid), str(epoch)))
                for tid, did, sid, epoch in conn.execute("SELECT id, did, stream_id, epoch FROM tenants")
            }
            without_position = 0
            for tid, cid, body, idx, position in _message_rows(store):
                tenant, stream = tenants[tid]
                message = json.loads(body)
                indexes = json.loads(idx)
                row = message_row(rid, tenant, stream, position, cid, message, indexes)
                without_position += position is None
                messages.add(row)
                if row["interface"] == "Protocols" and row["method"] == "Configure" and store.messages.has(tenant, cid):
                    protocols.add(_protocol_row(rid, tenant, cid, message, row))  # the definitions in force
                if progress is not None and len(messages.rows) == 0:
                    progress(messages.count)
            orphans = int(store.scalar(
                "SELECT count(*) FROM events e WHERE NOT EXISTS"
                " (SELECT 1 FROM messages m WHERE m.tenant=e.tenant AND m.cid=e.cid)"
                # a replaced protocol definition stays listed for replicas (archived, not stored)
                " AND NOT EXISTS (SELECT 1 FROM archive a WHERE a.tenant=e.tenant AND a.cid=e.cid"
                " AND a.record_id IS NULL AND a.accepted=1)"
            ))
        finally:
            conn.execute("COMMIT")
        reported = messages.count
        messages.close()
        protocols.close()
        if progress is not None and messages.count != reported:
            progress(messages.count)
    finally:
        store.close()
    result = ExportResult(out_dir, rid, messages.count, protocols.count, len(tenants), without_position, orphans)
    manifest = {
        "format": EXPORT_FORMAT,
        "replicaId": rid,
        "store": str(store_file.resolve()),
        "exportedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "messages": result.messages,
        "protocols": result.protocols,
        "messagesWithoutPosition": without_position,
        "orphanEvents": orphans,
        "tenants": [
            {"did": did, "streamId": stream[0], "epoch": stream[1]} for did, stream in sorted(tenants.values())
        ],
    }
    # The manifest goes last: an export without one is incomplete and every reader refuses it.
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return result


def _message_rows(store: Store) -> Iterator[tuple[int, str, str, str, int | None]]:
    """(tenant id, cid, body, indexes, position) of every stored message, then of every protocol
    definition a newer one replaced that the log still lists (a replica must hold those too:
    protocol/replication-apply.md, *Superseded definitions travel*), streamed."""
    sql = (
        "SELECT m.tenant, m.cid, m.body, m.indexes,"
        " (SELECT e.position FROM events e WHERE e.tenant=m.tenant AND e.cid=m.cid ORDER BY e.position LIMIT 1)"
        " FROM messages m ORDER BY m.id"
    )
    replaced = (
        "SELECT e.tenant, e.cid, a.body, e.indexes, e.position FROM events e"
        " JOIN archive a ON a.tenant=e.tenant AND a.cid=e.cid AND a.record_id IS NULL AND a.accepted=1"
        " WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.tenant=e.tenant AND m.cid=e.cid) ORDER BY e.id"
    )
    for sql_ in (sql, replaced):
        for tid, cid, body, idx, position in store.conn.execute(sql_):
            yield int(tid), str(cid), str(body), str(idx), None if position is None else int(position)


def _protocol_row(
    replica_id: str, tenant: str, cid: str, message: dict[str, Any], row: dict[str, Any]
) -> dict[str, Any]:
    definition = message.get("descriptor", {}).get("definition")
    return {
        "replica_id": replica_id,
        "tenant": tenant,
        "protocol": row["protocol"],
        "message_cid": cid,
        "message_timestamp": row["message_timestamp"],
        "definition": json.dumps(definition, separators=(",", ":")),
    }
