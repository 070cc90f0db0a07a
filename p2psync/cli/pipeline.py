"""The pipeline's commands: ``p2psync export`` and ``p2psync pipeline reconcile|fanout|audit``.

``register(sub)`` adds them to the ``p2psync`` parser (``p2psync.cli.build_parser`` calls it).
Each command's ``fn(args)`` returns an exit code; every failure a user can cause is raised as
the CLI's one-line ``CliError``.

The job modules need the [pipeline] extra (pyarrow, pyspark, matplotlib), so each command
imports its job when it runs: a sync-only install still parses ``p2psync --help`` and gets one
line of advice from these commands (tests/test_extras.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tqdm import tqdm

from p2psync.cli.common import CliError, home_of
from p2psync.cli.extras import missing_pipeline_module
from p2psync.dwn.errors import DwnError
from p2psync.dwn.store import Store
from p2psync.pipeline.errors import PipelineError
from p2psync.pipeline.session import SparkSettings, start_spark  # loads Spark only when a job starts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from p2psync.pipeline.formats import OutputLayout

__all__ = ["EXIT_VIOLATIONS", "register"]

EXIT_OK: Final = 0
#: ``pipeline audit`` found closure violations (1 stays "the command failed").
EXIT_VIOLATIONS: Final = 3


def _fail(exc: Exception) -> Exception:
    """The CLI's one-line error for ``exc``."""
    if isinstance(exc, PipelineError):
        return CliError(f"{exc.code}: {exc.detail}")
    return CliError(str(exc))


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (PipelineError, DwnError) as exc:
            raise _fail(exc) from None
        except ModuleNotFoundError as exc:
            advice = missing_pipeline_module(exc)
            if advice is None:
                raise
            raise _fail(PipelineError("PipelineNotInstalled", advice)) from None

    run.__doc__ = fn.__doc__
    return run


# --------------------------------------------------------------------------- export


def cmd_export(args: argparse.Namespace) -> int:
    """Write a store's message index and event log as Parquet."""
    from p2psync.pipeline.export import export_store  # the [pipeline] extra (pyarrow)

    store_path = Path(args.store) if args.store else home_of(args).store_path
    if not store_path.is_file():
        raise PipelineError("StoreNotFound", f"no store at {store_path} (give --store PATH, or --home DIR)")
    store = Store(store_path)
    try:
        total = int(store.scalar("SELECT count(*) FROM messages"))
    finally:
        store.close()
    with tqdm(total=total, unit="msg", desc="export", disable=None if args.progress else True,
              file=sys.stderr) as bar:

        def progress(done: int) -> None:
            bar.update(done - bar.n)

        result = export_store(store_path, args.out, replica_id=args.replica_id, overwrite=args.overwrite,
                              progress=progress)
    print(f"exported {result.messages} messages ({result.protocols} protocol definitions) of "
          f"{result.tenants} tenant(s) from replica {result.replica_id} to {result.out}")
    if result.without_position or result.orphan_events:
        print(f"note: {result.without_position} message(s) have no event-log entry, "
              f"{result.orphan_events} log entr(ies) have no message")
    return EXIT_OK


# --------------------------------------------------------------------------- Spark jobs


def _settings(args: argparse.Namespace) -> SparkSettings:
    extra: dict[str, str] = {}
    for item in args.conf or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PipelineError("SparkConfInvalid", f"--conf {item!r} is not KEY=VALUE")
        extra[key] = value
    return SparkSettings(
        master=args.master,
        driver_memory=args.driver_memory,
        executor_memory=args.executor_memory,
        shuffle_partitions=args.shuffle_partitions,
        progress=args.progress,
        extra_conf=extra,
    )


@contextmanager
def _spark(args: argparse.Namespace) -> Iterator[SparkSession]:
    """A session for one command; stopped afterwards unless it was already running here."""
    from pyspark.sql import SparkSession  # the [pipeline] extra, as are the job modules below

    existing = SparkSession.getActiveSession()
    spark = start_spark(_settings(args))
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()


def _precheck(args: argparse.Namespace, layout: OutputLayout) -> None:
    """The inputs and --out a job needs, checked before Spark takes its ten seconds to start."""
    from p2psync.pipeline.formats import read_exports  # the [pipeline] extra (pyarrow)

    read_exports(args.exports)
    layout.prepare(args.out, args.overwrite, check_only=True)


def cmd_reconcile(args: argparse.Namespace) -> int:
    """Digests, divergent groups and the repair plan of several exports."""
    from p2psync.pipeline.reconcile import PLAN_LAYOUT, reconcile  # the [pipeline] extra

    _precheck(args, PLAN_LAYOUT)
    with _spark(args) as spark:
        summary = reconcile(spark, args.exports, args.out, overwrite=args.overwrite, progress=args.progress)
    print(f"{summary['rows']} messages in {summary['groups']} groups over {len(summary['exports'])} replicas: "
          f"{summary['divergentGroups']} divergent group(s), {summary['missingMessages']} missing message(s) "
          f"to pull, {summary['supersededMessages']} superseded")
    for replica, target in summary["targets"].items():
        sources = ", ".join(f"{s} {n}" for s, n in target["sources"].items())
        print(f"  {replica}: {target['messages']} message(s), {target['bytes']} data bytes (from {sources})")
    print(f"plan: {args.out}")
    return EXIT_OK


def cmd_fanout(args: argparse.Namespace) -> int:
    """Delivery targets, relay assignment, manifests and strategy costs."""
    from p2psync.pipeline.fanout import FANOUT_LAYOUT, fanout, load_batch, load_endpoints  # [pipeline] extra

    _precheck(args, FANOUT_LAYOUT)
    load_endpoints(args.endpoints)
    if args.messages is not None:
        load_batch(args.messages)
    with _spark(args) as spark:
        report = fanout(spark, args.exports, args.endpoints, args.out, batch_file=args.messages,
                        overwrite=args.overwrite, progress=args.progress, plot=not args.no_plot)
    print(f"{report['messages']} message(s), {report['unresolvedTargets']} target(s) without a known endpoint")
    for name, s in report["strategies"].items():
        print(f"  {name:<9} origin load mean {s['originLoad']['mean']:.2f} max {s['originLoad']['max']}, "
              f"{s['crossNetworkMessages']} cross-network messages, max {s['maxHops']} hop(s)")
    print(f"manifests and report: {args.out}")
    return EXIT_OK


def cmd_audit(args: argparse.Namespace) -> int:
    """Closure audit of every export; exit 3 when a hard dependency is missing."""
    from p2psync.pipeline.audit import AUDIT_LAYOUT, audit  # the [pipeline] extra

    _precheck(args, AUDIT_LAYOUT)
    with _spark(args) as spark:
        summary = audit(spark, args.exports, args.out, overwrite=args.overwrite, progress=args.progress)
    for replica, entry in summary["replicas"].items():
        missing = {c: v["missing"] for c, v in entry["classes"].items() if v["missing"]}
        state = ", ".join(f"{c} {n}" for c, n in missing.items()) if missing else "closed"
        print(f"  {replica}: {entry['recordsMessages']} records messages; {state}")
    print(f"{summary['violations']} violation(s); details in {args.out}")
    return EXIT_VIOLATIONS if summary["violations"] else EXIT_OK


# --------------------------------------------------------------------------- parser


def _spark_options(sp: argparse.ArgumentParser) -> None:
    group = sp.add_argument_group("Spark")
    group.add_argument("--master", default="local[*]",
                       help="Spark master URL (default local[*]: this machine, all cores)")
    group.add_argument("--driver-memory", help="e.g. 4g (in local mode the driver runs every task)")
    group.add_argument("--executor-memory", help="e.g. 8g (cluster mode)")
    group.add_argument("--shuffle-partitions", type=int, help="spark.sql.shuffle.partitions")
    group.add_argument("--conf", action="append", metavar="KEY=VALUE", help="any other Spark setting (repeatable)")
    _progress_options(sp)


def _progress_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--quiet", dest="progress", action="store_false", help="no progress output on stderr")
    sp.add_argument("--overwrite", action="store_true", help="replace an earlier result in --out")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``export`` and the ``pipeline`` group to the ``p2psync`` sub-command parsers."""

    def add(parent: Any, name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        sp: argparse.ArgumentParser = parent.add_parser(name, help=help_, description=help_)
        sp.set_defaults(fn=_guarded(fn))
        return sp

    sp = add(sub, "export", cmd_export, "export a store's messages and event log as Parquet (for `pipeline` jobs)")
    sp.add_argument("--store", help="SQLite store file (default: the data directory's store)")
    sp.add_argument("--out", required=True, help="export directory (created)")
    sp.add_argument("--replica-id", help="name of this replica (default: the store's storeId)")
    _progress_options(sp)

    group = sub.add_parser("pipeline", help="batch jobs on Spark over exports (reconcile, fanout, audit)")
    jobs = group.add_subparsers(dest="sub", required=True, metavar="JOB")

    sp = add(jobs, "reconcile", cmd_reconcile,
             "compare replicas: divergent groups and, per replica, the messages it lacks and a source for each")
    sp.add_argument("exports", nargs="+", metavar="EXPORT", help="export directories, one per replica")
    sp.add_argument("--out", required=True, metavar="PLAN", help="plan directory (created)")
    _spark_options(sp)

    sp = add(jobs, "fanout", cmd_fanout,
             "plan multi-party delivery: targets, provider groups, relay assignment, cost per strategy")
    sp.add_argument("exports", nargs="+", metavar="EXPORT", help="export directories")
    sp.add_argument("--endpoints", required=True, metavar="FILE", help="JSON object: DID -> DWN endpoint URL")
    sp.add_argument("--messages", metavar="FILE",
                    help="message CIDs to deliver, one a line (default: every protocol RecordsWrite)")
    sp.add_argument("--out", required=True, help="output directory (created)")
    sp.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    _spark_options(sp)

    sp = add(jobs, "audit", cmd_audit,
             "closure audit: every record's hard dependencies present in its replica? (exit 3 if not)")
    sp.add_argument("exports", nargs="+", metavar="EXPORT", help="export directories")
    sp.add_argument("--out", required=True, help="output directory (created)")
    _spark_options(sp)
