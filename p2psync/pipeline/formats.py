"""On-disk formats the pipeline reads and writes: exports and plans (docs/pipeline.md).

An export is a directory::

    manifest.json              EXPORT_FORMAT, replicaId, counts, tenants (streamId, epoch)
    messages/part-*.parquet    one row per stored message (MESSAGE_COLUMNS)
    protocols/part-*.parquet   one row per stored ProtocolsConfigure, with its definition

Column names are snake_case; each is documented beside its type below. Files are plain
Parquet, so Spark, pyarrow, DuckDB or pandas read them alike.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from p2psync.pipeline.errors import PipelineError

#: Written into every export manifest; a reader refuses a format it does not know.
EXPORT_FORMAT: Final = "p2psync-export/1"
#: Written into every reconcile plan's summary.json.
PLAN_FORMAT: Final = "p2psync-plan/1"

MANIFEST_FILE: Final = "manifest.json"
MESSAGES_DIR: Final = "messages"
PROTOCOLS_DIR: Final = "protocols"

#: The export's message index: (name, type, meaning).
MESSAGE_COLUMNS: Final[tuple[tuple[str, pa.DataType, str], ...]] = (
    ("replica_id", pa.string(), "the exporting store's storeId (or --replica-id)"),
    ("tenant", pa.string(), "tenant DID"),
    ("stream_id", pa.string(), "the tenant's event-log streamId"),
    ("epoch", pa.string(), "the tenant's event-log epoch"),
    ("position", pa.int64(), "event-log position; null when the log has no entry for the message"),
    ("message_cid", pa.string(), "message CID"),
    ("interface", pa.string(), "descriptor.interface"),
    ("method", pa.string(), "descriptor.method"),
    ("record_id", pa.string(), "recordId (Records messages)"),
    ("is_initial_write", pa.bool_(), "a RecordsWrite whose entryId is its recordId"),
    ("protocol", pa.string(), "protocol URL"),
    ("protocol_path", pa.string(), "protocolPath"),
    ("context_id", pa.string(), "contextId"),
    ("parent_id", pa.string(), "parentId"),
    ("author", pa.string(), "logical author DID"),
    ("recipient", pa.string(), "recipient DID"),
    ("schema", pa.string(), "schema URL"),
    ("data_format", pa.string(), "dataFormat"),
    ("data_cid", pa.string(), "dataCid"),
    ("data_size", pa.int64(), "dataSize"),
    ("message_timestamp", pa.string(), "messageTimestamp (ISO 8601, microseconds, Z)"),
    ("date_created", pa.string(), "dateCreated"),
    ("date_published", pa.string(), "datePublished"),
    ("is_latest_base_state", pa.bool_(), "isLatestBaseState index"),
    ("published", pa.bool_(), "published"),
    ("prune", pa.bool_(), "RecordsDelete.prune"),
    ("protocol_role", pa.string(), "protocolRole the author invokes (signature payload)"),
    ("permission_grant_id", pa.string(), "permissionGrantId the author invokes"),
    ("delegated_grant_id", pa.string(), "recordId of an embedded authorDelegatedGrant"),
)
MESSAGE_SCHEMA: Final = pa.schema([pa.field(name, kind) for name, kind, _ in MESSAGE_COLUMNS])

PROTOCOL_COLUMNS: Final[tuple[tuple[str, pa.DataType, str], ...]] = (
    ("replica_id", pa.string(), "as in messages"),
    ("tenant", pa.string(), "tenant DID"),
    ("protocol", pa.string(), "protocol URL"),
    ("message_cid", pa.string(), "CID of the ProtocolsConfigure"),
    ("message_timestamp", pa.string(), "its messageTimestamp"),
    ("definition", pa.string(), "the protocol definition (JSON)"),
)
PROTOCOL_SCHEMA: Final = pa.schema([pa.field(name, kind) for name, kind, _ in PROTOCOL_COLUMNS])


_SPARK_TYPES: Final = {pa.string(): "string", pa.int64(): "bigint", pa.bool_(): "boolean"}


def spark_ddl(columns: tuple[tuple[str, pa.DataType, str], ...]) -> str:
    """The Spark schema (DDL) of a set of export columns: readers pass it instead of inferring
    it, which would cost one Spark job per file."""
    return ", ".join(f"{name} {_SPARK_TYPES[kind]}" for name, kind, _ in columns)


@dataclass(frozen=True)
class ExportInfo:
    """What an export's manifest says about it."""

    path: Path
    replica_id: str
    manifest: dict[str, Any]

    @property
    def messages_path(self) -> Path:
        return self.path / MESSAGES_DIR

    @property
    def protocols_path(self) -> Path:
        return self.path / PROTOCOLS_DIR


@dataclass(frozen=True)
class OutputLayout:
    """What a job writes into its ``--out`` directory: ``marker`` last, ``entries`` before it."""

    code: str  # the error code when the directory cannot be used
    what: str  # "a plan", "an audit", ...
    marker: str
    entries: tuple[str, ...]

    def prepare(self, out: str | Path, overwrite: bool, *, check_only: bool = False) -> Path:
        """Make ``out`` ready: refuse a non-empty directory unless ``overwrite`` and it holds an
        earlier result of this job, whose entries (only) are then removed."""
        out_dir = Path(out)
        if out_dir.exists() and not out_dir.is_dir():
            raise PipelineError(self.code, f"{out_dir} is a file; --out must be a directory")
        if out_dir.exists() and any(out_dir.iterdir()):
            if not overwrite:
                raise PipelineError(self.code, f"{out_dir} is not empty; choose another --out or pass --overwrite")
            names = (self.marker, *self.entries)
            if not any((out_dir / n).exists() for n in names):
                raise PipelineError(self.code, f"{out_dir} holds files that are not {self.what}; refusing to overwrite")
            if check_only:
                return out_dir
            for name in names:
                target = out_dir / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
        if not check_only:
            out_dir.mkdir(parents=True, exist_ok=True)
        return out_dir


def read_export_info(path: str | Path) -> ExportInfo:
    """Open an export directory's manifest; :class:`PipelineError` unless it is one we can read."""
    root = Path(path)
    manifest_path = root / MANIFEST_FILE
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise PipelineError(
            "ExportNotFound", f"{root} is not an export (no {MANIFEST_FILE}); make one with `p2psync export`"
        ) from None
    except (OSError, ValueError) as exc:
        raise PipelineError("ExportInvalid", f"cannot read {manifest_path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise PipelineError("ExportFormatUnknown", f"{root} has format {found!r}; this p2psync reads {EXPORT_FORMAT}")
    replica_id = manifest.get("replicaId")
    if not isinstance(replica_id, str) or not replica_id:
        raise PipelineError("ExportInvalid", f"{manifest_path} has no replicaId")
    if not (root / MESSAGES_DIR).is_dir():
        raise PipelineError("ExportInvalid", f"{root} has no {MESSAGES_DIR}/ directory")
    return ExportInfo(root, replica_id, manifest)


def read_exports(paths: Sequence[str | Path]) -> list[ExportInfo]:
    """Several exports, refusing two with the same replica id (a copied store file, usually)."""
    if not paths:
        raise PipelineError("ExportNotFound", "no export given")
    infos = [read_export_info(p) for p in paths]
    seen: dict[str, Path] = {}
    for info in infos:
        if info.replica_id in seen:
            raise PipelineError(
                "ReplicaIdDuplicate",
                f"{seen[info.replica_id]} and {info.path} are both replica {info.replica_id}; "
                "re-export one with --replica-id NAME",
            )
        seen[info.replica_id] = info.path
    return infos
