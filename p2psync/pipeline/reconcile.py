"""``p2psync pipeline reconcile``: which replicas lack which messages, and where to pull each from.

The job works as a tree-walking reconciliation does, on exported logs:

1. The *fleet* of a tenant is every replica whose export holds at least one of its messages.
2. Per (tenant, protocol, root contextId) group and replica: a digest (message count and the
   XOR of a 64-bit hash of every message CID), and the same for 16 buckets of each group (by
   a hash of the CID). A group (a bucket) whose replicas' digests all agree and which every
   replica of the fleet holds is in sync and is not looked at again.
3. Within the divergent buckets only: per message CID, the replicas holding it; every replica
   of the fleet not among them lacks it.
4. A lacking replica that already holds something that makes the message moot (a newer
   message of the same record or protocol, a delete of the record, a pruning delete of an
   ancestor) would refuse it or prune it on arrival: that message is *superseded* there and
   kept out of the repair plan (listed apart).
5. Every needed message gets one source among its holders, by rendezvous hashing over
   (target replica, message CID, holder): deterministic, and spread evenly over the holders.

Output (docs/pipeline.md, "Plan format"): ``digests/``, ``divergent/``, ``missing/``
(partitioned by ``target_replica``: the repair plan), ``superseded/`` and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow.dataset as pads
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from p2psync.pipeline.errors import PipelineError
from p2psync.pipeline.formats import (
    MESSAGE_COLUMNS,
    PLAN_FORMAT,
    ExportInfo,
    OutputLayout,
    read_exports,
    spark_ddl,
)
from p2psync.pipeline.session import Stages, materialize

__all__ = [
    "BROADCAST_GROUP_LIMIT",
    "BROADCAST_KEYS_LIMIT",
    "PLAN_LAYOUT",
    "PlanFrames",
    "RepairItem",
    "digest_frames",
    "digests_out",
    "divergent_out",
    "load_messages",
    "missing_frame",
    "read_plan_summary",
    "read_repair_items",
    "reconcile",
]

#: Divergent buckets up to this many are shipped to every task (a broadcast semi-join) instead
#: of shuffling the message rows against them; 200,000 keys of ~150 bytes is ~30 MB.
BROADCAST_GROUP_LIMIT: Final = 200_000
#: Likewise for lacking messages (keys of ~120 bytes).
BROADCAST_KEYS_LIMIT: Final = 200_000
#: Each group's messages are split into this many buckets by a hash of their CID, with a digest
#: each: a second level of the walk. Only the rows of divergent buckets are kept for the
#: per-message step, ~1/16 of a divergent group when few of its messages differ (on the
#: 10 x 1,000,000 benchmark that step went from ~60 s to ~40 s on a busy 2-core machine);
#: the digest table grows 16-fold and stays small.
DIGEST_BUCKETS: Final = 16

# The columns of the export the job reads (the rest of the export is not needed here).
_COLUMNS: Final = (
    "replica_id", "tenant", "position", "message_cid", "interface", "method", "record_id", "is_initial_write",
    "protocol", "protocol_path", "context_id", "message_timestamp", "data_size", "prune",
)
_GROUP: Final = ["tenant", "g_protocol", "g_context"]

PLAN_DIRS: Final = ("digests", "divergent", "missing", "superseded")
PLAN_LAYOUT: Final = OutputLayout("PlanExists", "a plan", "summary.json", PLAN_DIRS)


def load_messages(spark: SparkSession, exports: Sequence[ExportInfo]) -> DataFrame:
    """The message rows of several exports (one read; the schema is known, not inferred)."""
    return spark.read.schema(spark_ddl(MESSAGE_COLUMNS)).parquet(*(str(i.messages_path) for i in exports))


def _blank_to_null(column: str) -> Column:
    return F.when(F.col(column) == "", F.lit(None)).otherwise(F.col(column))


def _hex64(column: Column) -> Column:
    return F.lower(F.lpad(F.hex(column), 16, "0"))


@dataclass
class PlanFrames:
    """The job's intermediate results as DataFrames (lazy until written or collected).

    ``digests`` and ``divergent`` keep the internal group keys ``g_protocol``/``g_context``
    (empty string for none); :func:`digests_out` and :func:`divergent_out` give the published
    shapes.
    """

    rows: DataFrame  # the export rows the job reads, with the group and bucket keys
    fleet: DataFrame  # tenant, fleet (sorted replica ids)
    digests: DataFrame  # tenant, g_protocol, g_context, replica_id, message_count, digest
    divergent: DataFrame  # tenant, g_protocol, g_context, replicas, distinct_digests, fleet, lacking_replicas
    divergent_buckets: DataFrame  # tenant, g_protocol, g_context, g_bucket of the buckets that differ


def digest_frames(rows: DataFrame, *, materialized: bool = False) -> PlanFrames:
    """Fleets, per-group digests and the divergent groups of ``rows`` (export rows).

    ``materialized``: compute the fleets, digests and divergent groups now (small frames) and
    cut their lineage, so the steps after them plan quickly.
    """
    rows = rows.select(*_COLUMNS).withColumns({
        "g_protocol": F.coalesce(F.col("protocol"), F.lit("")),
        "g_context": F.coalesce(F.substring_index(F.col("context_id"), "/", 1), F.lit("")),
        "g_bucket": F.pmod(F.hash("message_cid"), F.lit(DIGEST_BUCKETS)),
    })
    buckets = rows.groupBy(*_GROUP, "g_bucket", "replica_id").agg(
        F.count(F.lit(1)).alias("message_count"),
        F.bit_xor(F.xxhash64("message_cid")).alias("digest"),
    )
    if materialized:
        buckets = materialize(buckets)
    digests = buckets.groupBy(*_GROUP, "replica_id").agg(
        F.sum("message_count").alias("message_count"),
        F.bit_xor("digest").alias("digest"),
    )
    if materialized:
        digests = materialize(digests)
    # From the digests, not the rows: one scan of the exports fewer.
    fleet = digests.groupBy("tenant").agg(F.array_sort(F.collect_set("replica_id")).alias("fleet"))
    if materialized:
        fleet = materialize(fleet)
    groups = (
        digests.groupBy(*_GROUP)
        .agg(
            F.array_sort(F.collect_list(F.struct("replica_id", "message_count", "digest"))).alias("replicas"),
            F.count_distinct("digest").alias("distinct_digests"),
        )
        .join(F.broadcast(fleet), "tenant")
    )
    held_by = F.transform(F.col("replicas"), lambda r: r["replica_id"])
    divergent = groups.where(
        (F.col("distinct_digests") > 1) | (F.size("replicas") < F.size("fleet"))
    ).withColumn("lacking_replicas", F.array_except(F.col("fleet"), held_by))
    divergent_buckets = (
        buckets.groupBy(*_GROUP, "g_bucket")
        .agg(F.count(F.lit(1)).alias("holding"), F.count_distinct("digest").alias("distinct_digests"))
        .join(F.broadcast(fleet), "tenant")
        .where((F.col("distinct_digests") > 1) | (F.col("holding") < F.size("fleet")))
        .select(*_GROUP, "g_bucket")
    )
    if materialized:
        divergent, divergent_buckets = materialize(divergent), materialize(divergent_buckets)
    return PlanFrames(rows, fleet, digests, divergent, divergent_buckets)


def _small(frame: DataFrame, rows: int) -> DataFrame:
    """``frame`` with a broadcast hint when it has at most :data:`BROADCAST_KEYS_LIMIT` rows."""
    return F.broadcast(frame) if rows <= BROADCAST_KEYS_LIMIT else frame


def missing_frame(
    frames: PlanFrames, *, broadcast_groups: bool | None = None, materialized: bool = False
) -> DataFrame:
    """Every (target replica, message) the target lacks, with its source and superseded reason.

    ``broadcast_groups``: ship the divergent group keys to every task (None: let Spark's
    adaptive execution choose). ``materialized``: compute the intermediate steps as they come
    (see :func:`digest_frames`); the lacking messages are then counted, and when they are few
    the later joins ship them to every task instead of shuffling the divergent rows.
    """
    keys = frames.divergent_buckets
    if broadcast_groups:
        keys = F.broadcast(keys)
    in_divergent = frames.rows.join(keys, [*_GROUP, "g_bucket"], "left_semi")
    if materialized:
        in_divergent = materialize(in_divergent)

    # Holders first, on the narrow columns; the rest of a message's row only for lacking ones.
    holders = in_divergent.groupBy("tenant", "message_cid").agg(
        F.collect_list(F.struct("replica_id", "position")).alias("holders"),
    )
    holder_ids = F.array_sort(F.transform(F.col("holders"), lambda h: h["replica_id"]))
    lacking_ids = (
        holders.join(F.broadcast(frames.fleet), "tenant")
        .select("tenant", "message_cid", "holders", holder_ids.alias("holder_ids"), "fleet")
        .select("*", F.array_except(F.col("fleet"), F.col("holder_ids")).alias("lacking"))
        .where(F.size("lacking") > 0)
        .drop("fleet")
    )
    count = BROADCAST_KEYS_LIMIT + 1
    if materialized:
        lacking_ids = materialize(lacking_ids)
        count = lacking_ids.count()
    described = (
        in_divergent.join(_small(lacking_ids.select("tenant", "message_cid"), count), ["tenant", "message_cid"],
                          "left_semi")
        .dropDuplicates(["tenant", "message_cid"])
        .drop("replica_id", "position")
    )
    lacking = lacking_ids.join(described, ["tenant", "message_cid"]).select(
        "*", F.explode("lacking").alias("target_replica")
    )
    # Rendezvous choice of a source: the holder with the highest hash of (target, CID, holder).
    source = F.array_max(F.transform(
        F.col("holders"),
        lambda h: F.struct(
            F.xxhash64(F.col("target_replica"), F.col("message_cid"), h["replica_id"]).alias("score"),
            h["replica_id"].alias("replica_id"),
            h["position"].alias("position"),
        ),
    ))
    lacking = lacking.select("*", source.alias("source"), _lineage().alias("lineage"))
    if materialized:
        lacking = materialize(lacking)
    return _classify(lacking, in_divergent, count)


def digests_out(digests: DataFrame) -> DataFrame:
    """The published shape of the per-replica group digests (``digests/``)."""
    return digests.select(
        "tenant", _blank_to_null("g_protocol").alias("protocol"), _blank_to_null("g_context").alias("context_root"),
        "replica_id", "message_count", _hex64(F.col("digest")).alias("digest"),
    )


def divergent_out(divergent: DataFrame) -> DataFrame:
    """The published shape of the divergent groups (``divergent/``)."""
    return divergent.select(
        "tenant", _blank_to_null("g_protocol").alias("protocol"), _blank_to_null("g_context").alias("context_root"),
        F.size("fleet").alias("fleet_size"),
        F.transform(F.col("replicas"), lambda r: F.struct(
            r["replica_id"].alias("replica_id"), r["message_count"].alias("message_count"),
            _hex64(r["digest"]).alias("digest"),
        )).alias("replicas"),
        "lacking_replicas",
    )


def _lineage() -> Column:
    """What a newer message replaces: the record (Records) or the protocol (ProtocolsConfigure)."""
    return (
        F.when(F.col("interface") == "Records", F.concat(F.lit("record:"), F.col("record_id")))
        .when(F.col("interface") == "Protocols", F.concat(F.lit("protocol:"), F.col("protocol")))
    )


def _classify(lacking: DataFrame, rows: DataFrame, count: int) -> DataFrame:
    """Mark the lacking messages the target would refuse or prune (``superseded_reason``).

    ``rows``: the rows of the divergent buckets; ``count``: about how many lacking messages.
    What makes a message moot on the target is there: a holder of the message cannot also
    hold the newer message, delete or pruning delete (the engine would have dropped it), so
    that one is lacking somewhere and its bucket diverges too. Were it not (stores the engine
    did not write), the message would stay in the plan, and the target would refuse it:
    harmless.
    """
    lineages = _small(lacking.select(F.col("target_replica").alias("replica_id"), "tenant", "lineage").distinct(),
                      count)
    newest = (
        rows.select("*", _lineage().alias("lineage")).where(F.col("lineage").isNotNull())
        .join(lineages, ["replica_id", "tenant", "lineage"], "left_semi")
        .groupBy(F.col("replica_id").alias("target_replica"), "tenant", "lineage")
        .agg(
            F.max(F.struct("message_timestamp", "message_cid")).alias("target_newest"),
            F.max(F.when(F.col("method") == "Delete", True)).alias("target_deleted"),
        )
    )
    pruned = (
        rows.where((F.col("interface") == "Records") & (F.col("method") == "Delete") & F.col("prune"))
        .select(F.col("replica_id").alias("target_replica"), "tenant", F.col("record_id").alias("ancestor"))
        .distinct()
    )
    key = ["target_replica", "tenant", "message_cid"]
    ancestors = F.slice(F.split(F.col("context_id"), "/"), 1, F.greatest(F.size(F.split(F.col("context_id"), "/")) - 1,
                                                                        F.lit(0)))
    under_pruned = (
        lacking.where(F.col("context_id").contains("/"))
        .select(*key, F.explode(ancestors).alias("ancestor"))
        .join(pruned, ["target_replica", "tenant", "ancestor"], "left_semi")
        .select(*key).distinct().withColumn("ancestor_pruned", F.lit(True))
    )
    joined = lacking.join(newest, ["target_replica", "tenant", "lineage"], "left").join(under_pruned, key, "left")
    not_initial = ~F.coalesce(F.col("is_initial_write"), F.lit(False))
    reason = (
        F.when(F.col("ancestor_pruned"), F.lit("ancestor-pruned"))
        .when(not_initial & F.col("target_deleted"), F.lit("record-deleted"))
        .when(
            # A definition a newer one replaced is needed all the same: records of its time are
            # judged by it (protocol/replication-apply.md, *Superseded definitions travel*).
            not_initial & (F.col("interface") == "Records")
            & (F.col("target_newest") > F.struct(F.col("message_timestamp"), F.col("message_cid"))),
            F.lit("newer-state"),
        )
    )
    return joined.select(
        "target_replica", "tenant", "message_cid",
        F.col("source.replica_id").alias("source_replica"),
        F.col("source.position").alias("source_position"),
        F.col("holder_ids").alias("holders"),
        "interface", "method", "record_id", "is_initial_write", "protocol", "protocol_path", "context_id",
        _blank_to_null("g_context").alias("context_root"), "message_timestamp", "data_size",
        reason.alias("superseded_reason"),
    )


# --------------------------------------------------------------------------- the job


def reconcile(
    spark: SparkSession,
    exports: Sequence[str | Path],
    out: str | Path,
    *,
    overwrite: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Run the job over ``exports`` and write the plan into ``out``; returns the summary."""
    infos = read_exports(list(exports))
    out_dir = PLAN_LAYOUT.prepare(out, overwrite)
    stages = Stages(spark, "reconcile", 5, progress)
    started = time.time()

    stages("reading exports and computing digests per (tenant, protocol, context)")
    frames = digest_frames(load_messages(spark, infos), materialized=True)
    digests_out(frames.digests).write.parquet(str(out_dir / "digests"))

    stages("finding divergent groups")
    divergent_out(frames.divergent).coalesce(1).write.parquet(str(out_dir / "divergent"))
    divergent_count = frames.divergent.count()

    stages("listing lacking messages and choosing sources")
    missing = materialize(missing_frame(
        frames, broadcast_groups=frames.divergent_buckets.count() <= BROADCAST_GROUP_LIMIT, materialized=True
    ))
    needed = missing.where(F.col("superseded_reason").isNull()).drop("superseded_reason")
    (
        needed.repartition("target_replica")
        .sortWithinPartitions("target_replica", "tenant", "source_replica", "source_position", "message_cid")
        .write.partitionBy("target_replica").parquet(str(out_dir / "missing"))
    )

    stages("writing superseded messages")
    missing.where(F.col("superseded_reason").isNotNull()).coalesce(1).write.parquet(str(out_dir / "superseded"))

    stages("summarising")
    summary = _summary(infos, frames, divergent_count, missing, started)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _summary(
    infos: Sequence[ExportInfo],
    frames: PlanFrames,
    divergent_count: int,
    missing: DataFrame,
    started: float,
) -> dict[str, Any]:
    fleets = {r["tenant"]: list(r["fleet"]) for r in frames.fleet.collect()}
    group_stats = frames.digests.agg(
        F.countDistinct(*_GROUP).alias("groups"),
        F.sum("message_count").alias("rows"),
    ).first()
    assert group_stats is not None
    per_pair = (
        missing.where(F.col("superseded_reason").isNull())
        .groupBy("target_replica", "source_replica")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum(F.coalesce(F.col("data_size"), F.lit(0))).alias("bytes"))
        .collect()
    )
    superseded = {
        r["superseded_reason"]: r["count"]
        for r in missing.where(F.col("superseded_reason").isNotNull()).groupBy("superseded_reason").count().collect()
    }
    targets: dict[str, dict[str, Any]] = {}
    for r in sorted(per_pair, key=lambda r: (r["target_replica"], r["source_replica"])):
        entry = targets.setdefault(r["target_replica"], {"messages": 0, "bytes": 0, "sources": {}})
        entry["messages"] += r["messages"]
        entry["bytes"] += r["bytes"]
        entry["sources"][r["source_replica"]] = r["messages"]
    return {
        "format": PLAN_FORMAT,
        "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 3),
        "exports": [
            {"path": str(i.path), "replicaId": i.replica_id, "messages": i.manifest.get("messages")} for i in infos
        ],
        "rows": int(group_stats["rows"] or 0),
        "tenants": len(fleets),
        "fleets": [{"tenant": t, "replicas": r} for t, r in sorted(fleets.items())],
        "groups": int(group_stats["groups"] or 0),
        "divergentGroups": divergent_count,
        "missingMessages": sum(t["messages"] for t in targets.values()),
        "supersededMessages": sum(superseded.values()),
        "supersededByReason": dict(sorted(superseded.items())),
        "targets": targets,
        "files": {name: name + "/" for name in PLAN_DIRS},
    }


# --------------------------------------------------------------------------- reading a plan


@dataclass(frozen=True)
class RepairItem:
    """One message a replica lacks, and where to get it (a row of ``missing/``)."""

    tenant: str
    message_cid: str
    source_replica: str
    source_position: int | None
    holders: tuple[str, ...]
    interface: str | None
    method: str | None
    record_id: str | None
    protocol: str | None
    context_id: str | None
    message_timestamp: str | None
    data_size: int | None


def read_plan_summary(plan: str | Path) -> dict[str, Any]:
    """A plan's summary.json; :class:`PipelineError` unless it is a plan this code reads."""
    path = Path(plan) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError("PlanNotFound", f"{plan} is not a plan (no summary.json)") from None
    except (OSError, ValueError) as exc:
        raise PipelineError("PlanInvalid", f"cannot read {path}: {exc}") from None
    if not isinstance(summary, dict) or summary.get("format") != PLAN_FORMAT:
        raise PipelineError("PlanFormatUnknown", f"{path} is not a {PLAN_FORMAT} summary")
    return summary


def read_repair_items(plan: str | Path, replica_id: str, *, source: str | None = None) -> list[RepairItem]:
    """The messages ``replica_id`` lacks, in the plan's order (tenant, source, source position).

    No Spark: pyarrow reads the one partition. ``source`` keeps only the items to pull from
    that replica (a repair connected to one peer).
    """
    read_plan_summary(plan)
    missing_dir = Path(plan) / "missing"
    if not missing_dir.is_dir():
        return []
    dataset = pads.dataset(str(missing_dir), format="parquet", partitioning="hive")
    condition = pads.field("target_replica") == replica_id
    if source is not None:
        condition = condition & (pads.field("source_replica") == source)
    table = dataset.to_table(filter=condition)
    items = [
        RepairItem(
            tenant=r["tenant"],
            message_cid=r["message_cid"],
            source_replica=r["source_replica"],
            source_position=r["source_position"],
            holders=tuple(r["holders"] or ()),
            interface=r["interface"],
            method=r["method"],
            record_id=r["record_id"],
            protocol=r["protocol"],
            context_id=r["context_id"],
            message_timestamp=r["message_timestamp"],
            data_size=r["data_size"],
        )
        for r in table.to_pylist()
    ]
    # Files may be read in any order; the plan's order is the sort below.
    items.sort(key=lambda i: (i.tenant, i.source_replica, -1 if i.source_position is None else i.source_position,
                              i.message_cid))
    return items
