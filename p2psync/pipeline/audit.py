"""``p2psync pipeline audit``: is every stored record's closure present in its replica?

For every Records message of every exported replica, the hard dependencies of the strict
closure rules (RFC "Strict Closure Rules for Scoped Sync") that a store can be checked for:

=============  ==========================================================  ===============================
class          what must be present in the same replica and tenant          code
=============  ==========================================================  ===============================
protocol       a ProtocolsConfigure of the message's protocol               ClosureProtocolMetadataMissing
initial-write  the record's initial write (non-initial writes, deletes)     ClosureInitialWriteMissing
parent         the initial write of the parent record (writes)              ClosureParentChainMissing
context        the initial write of every further ancestor in contextId     ClosureContextChainMissing
role           a role record at protocolRole whose recipient is the         ClosureRoleRecordMissing
               author (within the message's context for context roles)
grant          the permission grant record of permissionGrantId             ClosureGrantMissing
=============  ==========================================================  ===============================

The permissions protocol is built into every DWN, so its records need no ProtocolsConfigure.
An initial write counts as present whatever became of the record later (a deleted parent's
initial write is kept by the engine, and is what the dependency needs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from p2psync.dwn.permissions import PERMISSIONS_PROTOCOL_URI
from p2psync.pipeline.formats import OutputLayout, read_exports
from p2psync.pipeline.reconcile import load_messages
from p2psync.pipeline.session import Stages, materialize

__all__ = ["AUDIT_FORMAT", "AUDIT_LAYOUT", "DEPENDENCY_CLASSES", "audit", "audit_frames"]

AUDIT_FORMAT: Final = "p2psync-audit/1"
AUDIT_LAYOUT: Final = OutputLayout("AuditExists", "an audit", "summary.json", ("violations",))

#: Dependency class -> failure code (the RFC's suggested codes; ``role`` is ours: the RFC
#: lists role records under authorization closure without a code of their own).
DEPENDENCY_CLASSES: Final[dict[str, str]] = {
    "protocol": "ClosureProtocolMetadataMissing",
    "initial-write": "ClosureInitialWriteMissing",
    "parent": "ClosureParentChainMissing",
    "context": "ClosureContextChainMissing",
    "role": "ClosureRoleRecordMissing",
    "grant": "ClosureGrantMissing",
}

_KEY: Final = ["replica_id", "tenant"]
# The export columns the audit reads.
_AUDIT_COLUMNS: Final = (
    "replica_id", "tenant", "message_cid", "interface", "method", "record_id", "is_initial_write", "protocol",
    "protocol_path", "context_id", "parent_id", "author", "recipient", "protocol_role", "permission_grant_id",
)


def _segments(column: str) -> Column:
    return F.split(F.col(column), "/")


def _edges(rows: DataFrame) -> DataFrame:
    """Every dependency edge: replica_id, tenant, message_cid, dependency_class, needed, match keys."""
    records = rows.where(F.col("interface") == "Records")
    writes = records.where(F.col("method") == "Write")
    base = [*_KEY, "message_cid", "record_id", "method", "protocol", "protocol_path"]

    def edge(frame: DataFrame, cls: str, needed: Column, *, role_path: Column | None = None,
             role_prefix: Column | None = None, role_recipient: Column | None = None) -> DataFrame:
        return frame.select(
            *base,
            F.lit(cls).alias("dependency_class"),
            needed.alias("needed"),
            (role_path if role_path is not None else F.lit(None).cast("string")).alias("role_path"),
            (role_prefix if role_prefix is not None else F.lit(None).cast("string")).alias("role_prefix"),
            (role_recipient if role_recipient is not None else F.lit(None).cast("string")).alias("role_recipient"),
        )

    protocol = edge(
        records.where(F.col("protocol").isNotNull() & (F.col("protocol") != PERMISSIONS_PROTOCOL_URI)),
        "protocol", F.col("protocol"),
    )
    initial = edge(
        records.where(~F.coalesce(F.col("is_initial_write"), F.lit(False)) & F.col("record_id").isNotNull()),
        "initial-write", F.col("record_id"),
    )
    parent = edge(writes.where(F.col("parent_id").isNotNull()), "parent", F.col("parent_id"))
    # contextId = root/.../parent/self: the ancestors above the parent are all but the last two.
    depth = F.size(_segments("context_id"))
    context = edge(
        writes.where(F.col("context_id").isNotNull() & (depth > 2)).withColumn(
            "ancestor", F.explode(F.slice(_segments("context_id"), 1, depth - 2))
        ),
        "context", F.col("ancestor"),
    )
    role_depth = F.size(_segments("protocol_role"))
    role_prefix = F.when(
        role_depth > 1, F.array_join(F.slice(_segments("context_id"), 1, role_depth - 1), "/")
    ).otherwise(F.lit(""))
    role = edge(
        records.where(F.col("protocol_role").isNotNull()),
        "role", F.col("protocol_role"),
        role_path=F.col("protocol_role"), role_prefix=role_prefix, role_recipient=F.col("author"),
    )
    grant = edge(records.where(F.col("permission_grant_id").isNotNull()), "grant", F.col("permission_grant_id"))
    return protocol.unionByName(initial).unionByName(parent).unionByName(context).unionByName(role).unionByName(grant)


def audit_frames(rows: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(edges with a ``present`` flag, violations) for export rows of one or more replicas."""
    edges = _edges(rows)
    configured = (
        rows.where((F.col("interface") == "Protocols") & (F.col("method") == "Configure"))
        .select(*_KEY, F.col("protocol").alias("needed")).distinct()
        .withColumn("dependency_class", F.lit("protocol"))
    )
    initial_writes = rows.where(F.col("is_initial_write")).select(*_KEY, F.col("record_id").alias("needed")).distinct()
    by_record = initial_writes.crossJoin(
        F.broadcast(rows.sparkSession.createDataFrame(
            [("initial-write",), ("parent",), ("context",), ("grant",)], "dependency_class string"
        ))
    )
    present_simple = configured.unionByName(by_record).withColumn("present", F.lit(True))
    simple = edges.where(F.col("dependency_class") != "role").join(
        present_simple, [*_KEY, "dependency_class", "needed"], "left"
    )
    # A role record: any RecordsWrite at the role path for the author, under the same context.
    role_records = (
        rows.where((F.col("interface") == "Records") & (F.col("method") == "Write") & F.col("recipient").isNotNull())
        .select(
            *_KEY,
            F.col("protocol").alias("role_protocol"),
            F.col("protocol_path").alias("role_path"),
            F.col("recipient").alias("role_recipient"),
            F.coalesce(
                F.array_join(F.slice(_segments("context_id"), 1, F.size(_segments("context_id")) - 1), "/"),
                F.lit(""),
            ).alias("role_prefix"),
        )
        .distinct()
        .withColumn("present", F.lit(True))
    )
    roles = edges.where(F.col("dependency_class") == "role").withColumn("role_protocol", F.col("protocol")).join(
        role_records, [*_KEY, "role_protocol", "role_path", "role_recipient", "role_prefix"], "left"
    ).drop("role_protocol")
    checked = simple.unionByName(roles, allowMissingColumns=True).withColumn(
        "present", F.coalesce(F.col("present"), F.lit(False))
    )
    return checked, _violations(checked)


def _violations(checked: DataFrame) -> DataFrame:
    codes = F.create_map(*[F.lit(x) for pair in DEPENDENCY_CLASSES.items() for x in pair])
    return checked.where(~F.col("present")).select(
        *_KEY, "message_cid", "record_id", "method", "protocol", "protocol_path", "dependency_class",
        codes[F.col("dependency_class")].alias("code"),
        F.col("needed").alias("missing"),
        F.when(F.col("dependency_class") == "role", F.col("role_prefix")).alias("role_context"),
    ).distinct()


def audit(
    spark: SparkSession,
    exports: Sequence[str | Path],
    out: str | Path,
    *,
    overwrite: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Audit every export; writes ``violations/`` (Parquet) and ``summary.json`` into ``out``."""
    infos = read_exports(list(exports))
    out_dir = AUDIT_LAYOUT.prepare(out, overwrite)
    stages = Stages(spark, "audit", 3, progress)
    started = time.time()
    stages("reading exports and extracting dependency edges")
    rows = materialize(load_messages(spark, infos).select(*_AUDIT_COLUMNS))
    checked, _ = audit_frames(rows)
    checked = materialize(checked)
    violations = _violations(checked)
    stages("checking every edge against its replica")
    (
        violations.coalesce(1).sortWithinPartitions(*_KEY, "dependency_class", "message_cid", "missing")
        .write.parquet(str(out_dir / "violations"))
    )
    stages("counting by dependency class")
    counts = checked.groupBy("replica_id", "dependency_class").agg(
        F.count(F.lit(1)).alias("checked"),
        F.sum(F.when(~F.col("present"), 1).otherwise(0)).alias("missing"),
    ).collect()
    messages = rows.where(F.col("interface") == "Records").groupBy("replica_id").count().collect()
    replicas: dict[str, dict[str, Any]] = {
        i.replica_id: {
            "export": str(i.path),
            "recordsMessages": 0,
            "classes": {c: {"checked": 0, "missing": 0} for c in DEPENDENCY_CLASSES},
        }
        for i in infos
    }
    for r in messages:
        replicas[r["replica_id"]]["recordsMessages"] = int(r["count"])
    for r in counts:
        replicas[r["replica_id"]]["classes"][r["dependency_class"]] = {
            "checked": int(r["checked"]), "missing": int(r["missing"] or 0)
        }
    totals = {
        c: {
            "checked": sum(rep["classes"][c]["checked"] for rep in replicas.values()),
            "missing": sum(rep["classes"][c]["missing"] for rep in replicas.values()),
        }
        for c in DEPENDENCY_CLASSES
    }
    summary = {
        "format": AUDIT_FORMAT,
        "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 3),
        "codes": DEPENDENCY_CLASSES,
        "violations": sum(t["missing"] for t in totals.values()),
        "byClass": totals,
        "replicas": replicas,
        "files": {"violations": "violations/"},
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
