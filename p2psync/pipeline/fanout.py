"""``p2psync pipeline fanout``: who must receive each message, and what each delivery strategy costs.

Implements part 2 of ``dwn-delivery-and-causal-scoped-replication-rfcs.txt`` ("Multi-Party
Record Delivery") over exported replica logs:

* **Delivery targets** ("Determining Delivery Targets"): the message's recipient; for every
  ``$actions`` rule at its protocolPath whose role can ``read``, the recipients of the live
  role records at that role path within the message's context; for every ``who: author`` /
  ``who: recipient`` rule with ``of: <path>`` that can ``read``, the author or recipient of
  the ancestor record at that path. The tenant itself (the origin DWN) is not a target.
* **Grouping by provider**: target DIDs -> DWN endpoints (a map file); one delivery per
  provider, carrying the tenant DIDs there (the delivery manifest).
* **Relay assignment** (Strategy 2): ``score_i = HMAC-SHA256(key = endpoint_i, message =
  contextId ‖ messageCid)`` for every participating provider; the top ``k = ceil(log2 P)``
  (at least 2, at most 5, never more than P) by score are the relay coordinators; the
  others are dealt to the coordinators; each coordinator also delivers to the first target
  of the next coordinator's list (the overlap rule). docs/pipeline.md records every choice
  the RFC leaves open.
* **Costs** of direct, relay and subscribe delivery per message: origin load, total
  cross-network messages, maximum hops; a report per strategy and a PNG of origin load
  against the number of providers.

All set-sized work runs in Spark; the HMAC runs in Spark SQL too (SHA-256 over the key
pads, which the driver derives once per endpoint), so no Python worker is needed.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from p2psync.pipeline.errors import PipelineError
from p2psync.pipeline.formats import PROTOCOL_COLUMNS, ExportInfo, OutputLayout, read_exports, spark_ddl
from p2psync.pipeline.plot import plot_origin_load
from p2psync.pipeline.reconcile import load_messages
from p2psync.pipeline.session import Stages, materialize
from p2psync.pipeline.strategies import DIRECT_MAX_PROVIDERS, RELAY_K_MAX, RELAY_K_MIN, STRATEGIES, relay_k

__all__ = [
    "DIRECT_MAX_PROVIDERS",
    "FANOUT_FORMAT",
    "FANOUT_LAYOUT",
    "RELAY_K_MAX",
    "RELAY_K_MIN",
    "STRATEGIES",
    "FanoutFrames",
    "PathRules",
    "fanout",
    "fanout_frames",
    "hmac_key_pads",
    "load_endpoints",
    "path_rules",
    "relay_k",
]

FANOUT_FORMAT: Final = "p2psync-fanout/1"
FANOUT_LAYOUT: Final = OutputLayout(
    "FanoutExists", "a fan-out", "report.json", ("targets", "assignment", "manifests", "costs", "origin_load.png")
)

# HMAC-SHA256 (RFC 2104): the block size of SHA-256 and the two pad bytes.
_HMAC_BLOCK: Final = 64
_IPAD: Final = 0x36
_OPAD: Final = 0x5C


def _relay_k_column(providers: Column) -> Column:
    """:func:`relay_k` in Spark SQL, in integers (a floating log2 is off by one at powers of two)."""
    k = F.lit(RELAY_K_MAX)
    for c in range(RELAY_K_MAX - 1, RELAY_K_MIN - 1, -1):
        k = F.when(providers <= 2**c, F.lit(c)).otherwise(k)
    return F.when(providers <= 1, F.lit(0)).otherwise(F.least(k, providers))


def hmac_key_pads(endpoint: str) -> tuple[bytes, bytes]:
    """The inner and outer padded keys of HMAC-SHA256 keyed by the endpoint (UTF-8)."""
    key = endpoint.encode("utf-8")
    if len(key) > _HMAC_BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_HMAC_BLOCK, b"\0")
    return bytes(b ^ _IPAD for b in key), bytes(b ^ _OPAD for b in key)


# --------------------------------------------------------------------------- inputs


def load_endpoints(path: str | Path) -> dict[str, str]:
    """The DID -> DWN endpoint map: a JSON object; a list value means the DID's endpoints in
    order of preference, and the first is used."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PipelineError("EndpointMapNotFound", f"no endpoint map at {path}") from None
    except (OSError, ValueError) as exc:
        raise PipelineError("EndpointMapInvalid", f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise PipelineError("EndpointMapInvalid", f"{path} must hold a JSON object of DID -> endpoint")
    endpoints: dict[str, str] = {}
    for did, value in raw.items():
        first = value[0] if isinstance(value, list) and value else value
        if not did.startswith("did:") or not isinstance(first, str) or not first:
            raise PipelineError("EndpointMapInvalid", f"{path}: {did!r} -> {value!r} is not a DID and an endpoint")
        endpoints[did] = first
    return endpoints


def load_batch(path: str | Path) -> list[str]:
    """Message CIDs, one a line (blank lines and ``#`` comments ignored)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise PipelineError("BatchNotFound", f"cannot read the message batch {path}: {exc}") from None
    return [s for line in lines if (s := line.split("#", 1)[0].strip())]


@dataclass(frozen=True)
class PathRules:
    """What a protocol path's rules say about who reads its records."""

    tenant: str
    protocol: str
    protocol_path: str
    read_roles: tuple[str, ...]
    read_actors: tuple[tuple[str, str], ...]  # (who, of)
    open_read: bool
    declared: str | None


def _walk(structure: dict[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, node in structure.items():
        if name.startswith("$") or not isinstance(node, dict):
            continue
        path = f"{prefix}/{name}" if prefix else name
        yield path, node
        yield from _walk(node, path)


def path_rules(tenant: str, definition: dict[str, Any]) -> list[PathRules]:
    """The read rules of every path of a protocol definition."""
    protocol = definition.get("protocol")
    structure = definition.get("structure")
    if not isinstance(protocol, str) or not isinstance(structure, dict):
        return []
    out: list[PathRules] = []
    for path, node in _walk(structure, ""):
        actions = [a for a in node.get("$actions", []) if isinstance(a, dict)]
        reads = [a for a in actions if "read" in (a.get("can") or [])]
        declared = node.get("$delivery")
        out.append(PathRules(
            tenant=tenant,
            protocol=protocol,
            protocol_path=path,
            read_roles=tuple(sorted({a["role"] for a in reads if isinstance(a.get("role"), str)})),
            read_actors=tuple(sorted({
                (a["who"], a["of"]) for a in reads
                if a.get("who") in ("author", "recipient") and isinstance(a.get("of"), str)
            })),
            open_read=any(a.get("who") == "anyone" for a in reads),
            declared=declared if declared in STRATEGIES else None,
        ))
    return out


def _newest_definitions(spark: SparkSession, exports: Sequence[ExportInfo]) -> list[tuple[str, dict[str, Any]]]:
    """(tenant, definition) of the newest ProtocolsConfigure of each protocol in any export."""
    paths = [str(i.protocols_path) for i in exports if i.protocols_path.is_dir()]
    if not paths:
        return []
    frame = spark.read.schema(spark_ddl(PROTOCOL_COLUMNS)).parquet(*paths)
    newest = frame.groupBy("tenant", "protocol").agg(
        F.max(F.struct("message_timestamp", "message_cid", "definition")).alias("newest")
    )
    return [(r["tenant"], json.loads(r["newest"]["definition"])) for r in newest.collect()]


# --------------------------------------------------------------------------- the job


@dataclass
class FanoutFrames:
    """The job's results as DataFrames."""

    messages: DataFrame  # the batch: tenant, message_cid, protocol_path, context_id, rules, ...
    targets: DataFrame  # tenant, message_cid, did, via, endpoint (null: unresolved)
    assignment: DataFrame  # per message and provider: rank, score, role, coordinator, overlap_from
    manifests: DataFrame  # per strategy, message and delivery hop
    costs: DataFrame  # per message and strategy


def fanout_frames(
    spark: SparkSession,
    rows: DataFrame,
    rules: Sequence[PathRules],
    endpoints: dict[str, str],
    batch: Sequence[str] | None = None,
) -> FanoutFrames:
    """Targets, relay assignment, manifests and costs for the messages of ``rows`` (export rows).

    ``batch`` limits the messages delivered to these CIDs (default: every protocol RecordsWrite).
    """
    rows = rows.dropDuplicates(["tenant", "message_cid"])  # several replicas hold the same messages
    rules_df = spark.createDataFrame(
        [(r.tenant, r.protocol, r.protocol_path, list(r.read_roles),
          [{"who": w, "of": o} for w, o in r.read_actors], r.open_read, r.declared) for r in rules],
        "tenant string, protocol string, protocol_path string, read_roles array<string>,"
        " read_actors array<struct<who:string,of:string>>, open_read boolean, declared string",
    )
    endpoint_df = spark.createDataFrame(list(endpoints.items()), "did string, endpoint string")
    pads_df = spark.createDataFrame(
        [(e, *hmac_key_pads(e)) for e in sorted(set(endpoints.values()))],
        "endpoint string, ipad binary, opad binary",
    )

    messages = rows.where(
        (F.col("interface") == "Records") & (F.col("method") == "Write")
        & F.col("protocol").isNotNull() & F.col("context_id").isNotNull()
    )
    if batch is not None:
        wanted = spark.createDataFrame([(c,) for c in batch], "message_cid string")
        messages = messages.join(F.broadcast(wanted), "message_cid", "left_semi")
    messages = messages.join(F.broadcast(rules_df), ["tenant", "protocol", "protocol_path"], "left").select(
        "tenant", "message_cid", "protocol", "protocol_path", "context_id", "recipient", "published",
        F.coalesce(F.col("read_roles"), F.array().cast("array<string>")).alias("read_roles"),
        F.coalesce(F.col("read_actors"), F.array().cast("array<struct<who:string,of:string>>")).alias("read_actors"),
        F.coalesce(F.col("open_read"), F.lit(False)).alias("open_read"),
        "declared",
    )

    # Each step is materialised and its lineage cut (see `materialize`).
    messages = materialize(messages)
    targets = materialize(_targets(rows, messages).join(F.broadcast(endpoint_df), "did", "left"))
    origin = messages.join(
        F.broadcast(endpoint_df.withColumnRenamed("did", "tenant").withColumnRenamed("endpoint", "origin")),
        "tenant", "left",
    )
    resolved = targets.where(F.col("endpoint").isNotNull())
    groups = resolved.groupBy("tenant", "message_cid", "endpoint").agg(
        F.array_sort(F.collect_set("did")).alias("tenants")
    )
    located = origin.where(F.col("origin").isNotNull()).select("tenant", "message_cid", "context_id", "origin")
    # Participating providers: every target's provider, and the origin's own.
    providers = (
        located.join(groups, ["tenant", "message_cid"], "left")
        .select("tenant", "message_cid", "context_id", "origin", "endpoint", "tenants")
        .unionByName(located.select(
            "tenant", "message_cid", "context_id", "origin", F.col("origin").alias("endpoint"),
            F.array().cast("array<string>").alias("tenants"),
        ))
        .where(F.col("endpoint").isNotNull())
        .groupBy("tenant", "message_cid", "context_id", "origin", "endpoint")
        .agg(F.array_sort(F.flatten(F.collect_list("tenants"))).alias("tenants"))
    )
    assignment = materialize(_relay_assignment(providers, pads_df))
    manifests = materialize(_manifests(assignment))
    costs = materialize(_costs(manifests, assignment, messages))
    return FanoutFrames(messages=messages, targets=targets, assignment=assignment, manifests=manifests, costs=costs)


def _targets(rows: DataFrame, messages: DataFrame) -> DataFrame:
    """(tenant, message_cid, did, via) for every delivery target of every message."""
    explicit = messages.where(F.col("recipient").isNotNull()).select(
        "tenant", "message_cid", F.col("recipient").alias("did"), F.lit("recipient").alias("via")
    )
    # Role-based: live role records at the role path whose parent context is the message's
    # context cut to the role's depth (a root role has no context constraint).
    role_records = rows.where(
        (F.col("interface") == "Records") & (F.col("method") == "Write") & F.col("is_latest_base_state")
        & F.col("recipient").isNotNull() & F.col("context_id").isNotNull()
    ).select(
        "tenant", "protocol", F.col("protocol_path").alias("role_path"), F.col("recipient").alias("did"),
        F.coalesce(F.array_join(F.slice(F.split("context_id", "/"), 1, F.size(F.split("context_id", "/")) - 1), "/"),
                   F.lit("")).alias("role_prefix"),
    )
    by_role = (
        messages.select("tenant", "message_cid", "protocol", "context_id", F.explode("read_roles").alias("role_path"))
        .withColumn("role_depth", F.size(F.split("role_path", "/")))
        .withColumn("role_prefix", F.when(
            F.col("role_depth") > 1,
            F.array_join(F.slice(F.split("context_id", "/"), 1, F.col("role_depth") - 1), "/"),
        ).otherwise(F.lit("")))
        .join(role_records, ["tenant", "protocol", "role_path", "role_prefix"])
        .select("tenant", "message_cid", "did", F.concat(F.lit("role:"), F.col("role_path")).alias("via"))
    )
    # Actor-based: the author or recipient of the ancestor at the rule's `of` path.
    initial = rows.where(F.col("is_initial_write")).select(
        "tenant", F.col("record_id").alias("ancestor"), F.col("author").alias("a_author"),
        F.col("recipient").alias("a_recipient"),
    )
    by_actor = (
        messages.select("tenant", "message_cid", "context_id", F.explode("read_actors").alias("rule"))
        .withColumn("of_depth", F.size(F.split(F.col("rule.of"), "/")))
        .where(F.size(F.split("context_id", "/")) >= F.col("of_depth"))
        .withColumn("ancestor", F.element_at(F.split("context_id", "/"), F.col("of_depth")))
        .join(initial, ["tenant", "ancestor"])
        .select(
            "tenant", "message_cid",
            F.when(F.col("rule.who") == "author", F.col("a_author")).otherwise(F.col("a_recipient")).alias("did"),
            F.concat(F.col("rule.who"), F.lit(":"), F.col("rule.of")).alias("via"),
        )
        .where(F.col("did").isNotNull())
    )
    return (
        explicit.unionByName(by_role).unionByName(by_actor)
        .where(F.col("did") != F.col("tenant"))  # the origin DWN already holds it
        .groupBy("tenant", "message_cid", "did").agg(F.array_sort(F.collect_set("via")).alias("via"))
    )


def _relay_assignment(providers: DataFrame, pads: DataFrame) -> DataFrame:
    """Rank the providers of each message by the RFC's HMAC score; coordinators, targets, overlap."""
    key = F.encode(F.concat(F.col("context_id"), F.col("message_cid")), "UTF-8")
    inner = F.unhex(F.sha2(F.concat(F.col("ipad"), key), 256))
    score = F.sha2(F.concat(F.col("opad"), inner), 256)  # lower-case hex: orders as the 256-bit number
    per_message = Window.partitionBy("tenant", "message_cid")
    ranked = providers.join(F.broadcast(pads), "endpoint", "left").select(
        "tenant", "message_cid", "context_id", "origin", "endpoint", "tenants", score.alias("score"),
    )
    ranked = ranked.select(
        "*",
        (F.row_number().over(per_message.orderBy(F.col("score").desc(), F.col("endpoint"))) - 1).alias("rank"),
        F.count(F.lit(1)).over(per_message).cast("int").alias("provider_count"),
    )
    ranked = ranked.withColumn("k", _relay_k_column(F.col("provider_count")).cast("int"))
    order = ranked.groupBy("tenant", "message_cid").agg(
        F.transform(F.array_sort(F.collect_list(F.struct("rank", "endpoint"))), lambda m: m["endpoint"]).alias("order")
    )
    rank, k = F.col("rank"), F.col("k")
    # The providers still to be served after the coordinators: the rest in score order, less
    # the origin, which already holds the message (so the total is P - 1, as the RFC counts).
    with_rest = ranked.join(order, ["tenant", "message_cid"]).withColumn(
        "rest", F.filter(F.col("order"), lambda e, i: (i >= k) & (e != F.col("origin")))
    )
    position = F.array_position(F.col("rest"), F.col("endpoint")).cast("int") - 1  # -1: not in rest
    # Dealt in turn: rest[j] goes to coordinator j mod k.
    coordinator_index = F.when(rank < k, rank).when(position >= 0, F.pmod(position, k))
    # The overlap rule: coordinator i also delivers to the first target of coordinator
    # (i + 1) mod k, which is rest[(i + 1) mod k]; so rest[j] (j < k) gets a second copy from
    # coordinator (j - 1) mod k.
    overlap_index = F.when((position >= 0) & (position < k), F.pmod(position - 1, k))
    next_first = F.pmod(rank + 1, k)
    return with_rest.select(
        "tenant", "message_cid", "context_id", "origin", "endpoint", "tenants", "score", "rank",
        "provider_count", "k",
        F.when(rank < k, F.lit("coordinator")).when(F.col("endpoint") == F.col("origin"), F.lit("origin"))
        .otherwise(F.lit("target")).alias("role"),
        F.element_at(F.col("order"), coordinator_index + 1).alias("coordinator"),
        F.when(
            overlap_index.isNotNull() & (overlap_index != coordinator_index),
            F.element_at(F.col("order"), overlap_index + 1),
        ).alias("overlap_from"),
        F.when(rank < k, F.filter(F.col("rest"), lambda e, j: F.pmod(j, k) == rank)).alias("forward_to"),
        F.when(
            (rank < k) & (next_first != rank) & (next_first < F.size("rest")),
            F.element_at(F.col("rest"), next_first + 1),
        ).alias("overlap_to"),
    )


def _manifests(assignment: DataFrame) -> DataFrame:
    """One row per delivery (strategy, message, sender -> receiver), with the receiver's DIDs."""
    base = ["tenant", "message_cid", "context_id", "origin"]
    at_origin = F.col("endpoint") == F.col("origin")
    empty = F.array().cast("array<string>")
    null_str = F.lit(None).cast("string")

    def rows(strategy: str, where: Column, sender: Column, kind: Column, hop: Column,
             forward_to: Column | None = None, overlap_to: Column | None = None) -> DataFrame:
        return assignment.where(where).select(
            F.lit(strategy).alias("strategy"), *base,
            sender.alias("sender"), F.col("endpoint").alias("receiver"), hop.alias("hop"), kind.alias("kind"),
            "tenants",
            (forward_to if forward_to is not None else empty).alias("forward_to"),
            (overlap_to if overlap_to is not None else null_str).alias("overlap_to"),
        )

    local = F.lit("local")
    out = []
    for strategy, remote in (("direct", "direct"), ("subscribe", "subscription")):
        out.append(rows(strategy, at_origin & (F.size("tenants") > 0), F.col("origin"), local, F.lit(0)))
        out.append(rows(strategy, ~at_origin, F.col("origin"), F.lit(remote), F.lit(1)))
    coordinator_hop = F.when(F.col("coordinator") == F.col("origin"), F.lit(1)).otherwise(F.lit(2))
    overlap_hop = F.when(F.col("overlap_from") == F.col("origin"), F.lit(1)).otherwise(F.lit(2))
    out += [
        rows("relay", at_origin & (F.size("tenants") > 0), F.col("origin"), local, F.lit(0)),
        # origin -> each other coordinator, with the relay manifest (its targets and overlap)
        rows("relay", (F.col("role") == "coordinator") & ~at_origin, F.col("origin"), F.lit("coordinator"),
             F.lit(1), F.col("forward_to"), F.col("overlap_to")),
        # coordinator -> its targets
        rows("relay", F.col("role") == "target", F.col("coordinator"), F.lit("relay"), coordinator_hop),
        # the overlap copies
        rows("relay", F.col("overlap_from").isNotNull(), F.col("overlap_from"), F.lit("overlap"), overlap_hop),
    ]
    manifests = out[0]
    for frame in out[1:]:
        manifests = manifests.unionByName(frame)
    return manifests


def _costs(manifests: DataFrame, assignment: DataFrame, messages: DataFrame) -> DataFrame:
    """Per message and strategy: origin load, cross-network messages, max hops; P and k."""
    remote = F.col("sender") != F.col("receiver")
    per = manifests.groupBy("strategy", "tenant", "message_cid").agg(
        F.sum(F.when(remote & (F.col("sender") == F.col("origin")), 1).otherwise(0)).alias("origin_load"),
        F.sum(F.when(remote, 1).otherwise(0)).alias("cross_network"),
        F.max(F.when(remote, F.col("hop")).otherwise(0)).alias("max_hops"),
        F.sum(F.size("tenants")).alias("deliveries"),
    )
    shape = assignment.groupBy("tenant", "message_cid").agg(
        F.first("provider_count").alias("providers"), F.first("k").alias("k"),
    )
    info = messages.select("tenant", "message_cid", "protocol_path", "declared", "open_read", "published")
    recommended = (
        F.when(F.col("declared").isNotNull(), F.col("declared"))
        .when(F.col("open_read") | F.coalesce(F.col("published"), F.lit(False)), F.lit("subscribe"))
        .when(F.col("providers") <= DIRECT_MAX_PROVIDERS, F.lit("direct"))
        .otherwise(F.lit("relay"))
    )
    strategies = F.broadcast(messages.sparkSession.createDataFrame([(s,) for s in STRATEGIES], "strategy string"))
    return (
        shape.join(info, ["tenant", "message_cid"])
        .crossJoin(strategies)
        .join(per, ["strategy", "tenant", "message_cid"], "left")
        .select(
            "strategy", "tenant", "message_cid", "protocol_path", "providers", "k",
            *(F.coalesce(F.col(c), F.lit(0)).alias(c) for c in ("origin_load", "cross_network", "max_hops",
                                                                 "deliveries")),
            F.col("declared").alias("declared_strategy"), recommended.alias("recommended_strategy"),
        )
    )


def fanout(
    spark: SparkSession,
    exports: Sequence[str | Path],
    endpoints_file: str | Path,
    out: str | Path,
    *,
    batch_file: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = False,
    plot: bool = True,
) -> dict[str, Any]:
    """Run the fan-out job; writes manifests, assignment, costs, targets, report.json and the plot."""
    infos = read_exports(list(exports))
    endpoints = load_endpoints(endpoints_file)
    batch = load_batch(batch_file) if batch_file is not None else None
    out_dir = FANOUT_LAYOUT.prepare(out, overwrite)
    stages = Stages(spark, "fanout", 4, progress)
    started = time.time()

    stages("reading exports and protocol rules; resolving targets and relay assignment")
    rules = [r for tenant, d in _newest_definitions(spark, infos) for r in path_rules(tenant, d)]
    rows = load_messages(spark, infos)
    frames = fanout_frames(spark, rows, rules, endpoints, batch)

    stages("writing targets and the relay assignment")
    frames.targets.sortWithinPartitions("tenant", "message_cid", "did").write.parquet(str(out_dir / "targets"))
    frames.assignment.sortWithinPartitions("tenant", "message_cid", "rank").write.parquet(str(out_dir / "assignment"))

    stages("writing delivery manifests and costs")
    frames.manifests.sortWithinPartitions("strategy", "tenant", "message_cid", "hop", "receiver").write.parquet(
        str(out_dir / "manifests")
    )
    frames.costs.sortWithinPartitions("strategy", "tenant", "message_cid").write.parquet(str(out_dir / "costs"))

    stages("reporting")
    report = _report(infos, endpoints, batch, frames.messages, frames.targets, frames.costs, started)
    if plot:
        plot_origin_load(report["byProviders"], out_dir / "origin_load.png")
        report["files"]["plot"] = "origin_load.png"
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _report(
    infos: Sequence[ExportInfo],
    endpoints: dict[str, str],
    batch: Sequence[str] | None,
    messages: DataFrame,
    targets: DataFrame,
    costs: DataFrame,
    started: float,
) -> dict[str, Any]:
    strategies = {
        r["strategy"]: {
            "messages": int(r["messages"]),
            "originLoad": {"total": int(r["ol_total"] or 0), "mean": round(float(r["ol_mean"] or 0), 3),
                           "max": int(r["ol_max"] or 0)},
            "crossNetworkMessages": int(r["cn_total"] or 0),
            "maxHops": int(r["hops"] or 0),
            "tenantDeliveries": int(r["deliveries"] or 0),
        }
        for r in costs.groupBy("strategy").agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("origin_load").alias("ol_total"), F.avg("origin_load").alias("ol_mean"),
            F.max("origin_load").alias("ol_max"), F.sum("cross_network").alias("cn_total"),
            F.max("max_hops").alias("hops"), F.sum("deliveries").alias("deliveries"),
        ).collect()
    }
    by_providers: dict[int, dict[str, Any]] = {}
    for r in costs.groupBy("providers", "strategy").agg(
        F.count(F.lit(1)).alias("messages"), F.avg("origin_load").alias("ol"),
        F.avg("cross_network").alias("cn"), F.max("max_hops").alias("hops"),
    ).collect():
        entry = by_providers.setdefault(int(r["providers"]), {"providers": int(r["providers"]), "messages": 0})
        entry["messages"] = int(r["messages"])
        entry[r["strategy"]] = {
            "originLoad": round(float(r["ol"]), 3),
            "crossNetworkMessages": round(float(r["cn"]), 3),
            "maxHops": int(r["hops"]),
        }
    recommended = {
        r["recommended_strategy"]: int(r["count"])
        for r in costs.where(F.col("strategy") == STRATEGIES[0]).groupBy("recommended_strategy").count().collect()
    }
    unresolved = targets.where(F.col("endpoint").isNull())
    batch_size = messages.count()
    planned = sum(recommended.values())
    report: dict[str, Any] = {
        "format": FANOUT_FORMAT,
        "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 3),
        "exports": [{"path": str(i.path), "replicaId": i.replica_id} for i in infos],
        "endpoints": len(endpoints),
        "providers": len(set(endpoints.values())),
        "messages": planned,
        "messagesWithoutOrigin": batch_size - planned,
        "unresolvedTargets": unresolved.count(),
        "unresolvedDids": sorted(r["did"] for r in unresolved.select("did").distinct().limit(100).collect()),
        "recommended": dict(sorted(recommended.items())),
        "strategies": strategies,
        "byProviders": [by_providers[p] for p in sorted(by_providers)],
        "files": {n: n + "/" for n in ("targets", "assignment", "manifests", "costs")},
    }
    if batch is not None:
        found = {r["message_cid"] for r in messages.select("message_cid").collect()}
        report["batch"] = {"requested": len(batch), "notFound": sorted(set(batch) - found)[:100]}
    return report
