"""Benchmark: `pipeline reconcile` over 10 replicas x 1,000,000 synthetic export rows on local[2].

    .venv/bin/python tests/bench/bench_pipeline.py [--replicas 10] [--messages 1000000]

The rows are made by Spark itself (not by the engine): 1,000,000 messages of 20 tenants in
5 protocols and 10,000 contexts of 100 messages, CIDs shaped like real ones (59 characters). Replica r lacks
each message with probability 1/10,000 (a hash of message and replica), so about 100 a
replica. The export directories are written once under --data and reused; only the
reconcile is timed. Prints wall time, rows/s and the plan's figures, checked against what
the generator dropped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from p2psync.pipeline.formats import EXPORT_FORMAT, MANIFEST_FILE, MESSAGE_COLUMNS, MESSAGES_DIR, spark_ddl
from p2psync.pipeline.reconcile import reconcile
from p2psync.pipeline.session import SparkSettings, start_spark

DROP_ONE_IN = 10_000  # a replica lacks a message when hash(message, replica) % this == 0
TENANTS = 20
PROTOCOLS = 5
MESSAGES_PER_CONTEXT = 100


def _generate(spark: SparkSession, data: Path, replicas: int, messages: int) -> dict[str, int]:
    """Write the replicas' exports; returns how many (replica, message) pairs were dropped."""
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    i = F.col("id")
    context = F.floor(i / MESSAGES_PER_CONTEXT)  # a context's messages share its tenant and protocol
    cid = F.concat(F.lit("bafyrei"), F.substring(F.sha2(F.concat(F.lit("m"), i.cast("string")), 256), 1, 52))
    ctx = F.concat(F.lit("bafyrei"), F.substring(F.sha2(F.concat(F.lit("c"), context.cast("string")), 256), 1, 52))
    columns = {
        "tenant": F.concat(F.lit("did:key:z6MkBenchTenant"), F.lpad((context % TENANTS).cast("string"), 4, "0")),
        "stream_id": F.lit("00000000-0000-4000-8000-000000000000"),
        "epoch": F.lit("00000000-0000-4000-8000-000000000001"),
        "position": i + 1,
        "message_cid": cid,
        "interface": F.lit("Records"),
        "method": F.lit("Write"),
        "record_id": cid,
        "is_initial_write": F.lit(True),
        "protocol": F.concat(F.lit("https://bench.example/protocol-"), (context % PROTOCOLS).cast("string")),
        "protocol_path": F.lit("thread/chat"),
        "context_id": F.concat(ctx, F.lit("/"), cid),
        "parent_id": ctx,
        "author": F.lit("did:key:z6MkBenchAuthor"),
        "message_timestamp": F.date_format(
            F.timestamp_seconds(F.lit(1_900_000_000) + i), "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"),
        "data_size": (i % 4096).cast("bigint"),
        "is_latest_base_state": F.lit(True),
    }
    base_path = data / "base-rows"
    spark.range(messages).select(i, *(v.alias(k) for k, v in columns.items())).write.parquet(str(base_path))
    base = spark.read.parquet(str(base_path))
    types = dict(part.split(" ") for part in spark_ddl(MESSAGE_COLUMNS).split(", "))
    dropped = 0
    for r in range(replicas):
        rid = f"replica-{r:02d}"
        lacks = F.pmod(F.xxhash64(F.col("id"), F.lit(r)), F.lit(DROP_ONE_IN)) == 0
        out = data / rid
        kept = base.where(~lacks).withColumn("replica_id", F.lit(rid))
        kept = kept.select(*(
            (F.col(n) if n in kept.columns else F.lit(None)).cast(t).alias(n) for n, t in types.items()
        ))
        kept.write.parquet(str(out / MESSAGES_DIR))
        count = base.where(lacks).count()
        dropped += count
        manifest = {"format": EXPORT_FORMAT, "replicaId": rid, "messages": messages - count, "synthetic": True}
        (out / MANIFEST_FILE).write_text(json.dumps(manifest))
        print(f"  {rid}: {messages - count} rows ({count} dropped)", file=sys.stderr)
    lacked_by_all = base.where(F.lit(True))
    for r in range(replicas):
        lacked_by_all = lacked_by_all.where(F.pmod(F.xxhash64(F.col("id"), F.lit(r)), F.lit(DROP_ONE_IN)) == 0)
    info = {"replicas": replicas, "messages": messages, "dropped": dropped, "lackedByAll": lacked_by_all.count()}
    (data / "generated.json").write_text(json.dumps(info))
    shutil.rmtree(base_path)
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--replicas", type=int, default=10)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--data", default="/tmp/p2psync-bench-pipeline", help="where the exports are kept")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="3g")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--regenerate", action="store_true")
    args = parser.parse_args()

    spark = start_spark(SparkSettings(master=args.master, driver_memory=args.driver_memory,
                                      shuffle_partitions=args.shuffle_partitions, progress=False,
                                      app_name="p2psync-bench-pipeline"))
    data = Path(args.data)
    generated = data / "generated.json"
    info = json.loads(generated.read_text()) if generated.exists() else None
    if args.regenerate or info is None or (info["replicas"], info["messages"]) != (args.replicas, args.messages):
        print(f"generating {args.replicas} x {args.messages} rows under {data}", file=sys.stderr)
        started = time.perf_counter()
        info = _generate(spark, data, args.replicas, args.messages)
        print(f"  generated in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    exports = [data / f"replica-{r:02d}" for r in range(args.replicas)]
    plan = data / "plan"
    shutil.rmtree(plan, ignore_errors=True)

    started = time.perf_counter()
    summary = reconcile(spark, exports, plan, progress=True)
    wall = time.perf_counter() - started
    rows = summary["rows"]
    print(f"reconcile {args.replicas} replicas x {args.messages:,} messages on {args.master}: "
          f"{rows:,} rows in {wall:.1f} s = {rows / wall:,.0f} rows/s")
    print(f"  groups {summary['groups']:,}, divergent {summary['divergentGroups']:,}, "
          f"missing {summary['missingMessages']:,} (generator dropped {info['dropped']:,}, "
          f"{info['lackedByAll']} of them from every replica)")
    expected = info["dropped"] - info["lackedByAll"] * args.replicas
    ok = summary["missingMessages"] == expected
    print(f"  plan {'matches' if ok else 'DOES NOT MATCH'} the generator ({expected:,} expected)")
    spark.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
