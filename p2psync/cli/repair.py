"""``p2psync repair``: carry out one replica's part of a reconcile plan (docs/cli.md,
docs/pipeline.md "Carrying out a plan").

The plan's rows for the replica (``p2psync.pipeline.reconcile.read_repair_items``, no Spark)
are fetched by CID from one peer with :meth:`Peer.fetch_messages`, one connection per tenant.
Every failure a user can cause raises :class:`~p2psync.cli.common.CliError`; a repair that ran
but left messages unrepaired returns :data:`EXIT_INCOMPLETE` after printing why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Final, TextIO

import trio
from tqdm import tqdm

from p2psync import errors
from p2psync.cli.common import CliError, open_store
from p2psync.cli.extras import missing_pipeline_module
from p2psync.cli.sync import check_url, human_bytes, log_to_stderr, remote_command, scope_of
from p2psync.dwn.did import Identity
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from p2psync.peer.repair import STATUS_ORDER, RepairProgress, RepairSummary
from p2psync.pipeline.errors import PipelineError
from p2psync.state.copies import store_id

__all__ = ["EXIT_INCOMPLETE", "cmd_repair", "run_repair"]

#: Some messages could not be repaired (not held by the peer, withheld, refused, deferred).
#: 3 like ``pipeline audit``'s "found something"; 1 stays "the command failed".
EXIT_INCOMPLETE: Final = 3
#: Progress bar redraws at most this often (seconds), as ``sync``'s.
PROGRESS_MIN_INTERVAL: Final = 0.25


def _plan_items(plan: str, replica: str, source: str | None, tenant: str | None) -> list[Any]:
    # The [pipeline] extra (pyarrow, pyspark): loaded only when a plan is read.
    from p2psync.pipeline.reconcile import read_plan_summary, read_repair_items

    try:
        summary = read_plan_summary(plan)
        known = {e.get("replicaId") for e in summary.get("exports", []) if isinstance(e, dict)}
        if known and replica not in known:
            raise CliError(f"ReplicaNotInPlan: replica {replica} is not one of the plan's exports "
                             f"({', '.join(sorted(str(k) for k in known))}); give --replica ID or the right --store")
        if source is not None and known and source not in known:
            raise CliError(f"ReplicaNotInPlan: --source {source} is not one of the plan's exports")
        items = read_repair_items(plan, replica, source=source)
    except PipelineError as exc:
        raise CliError(f"{exc.code}: {exc.detail}") from None
    return [i for i in items if tenant is None or i.tenant == tenant]


def _summary_lines(replica: str, url: str, results: list[RepairSummary], seconds: float) -> list[str]:
    lines = []
    for s in results:
        counts = ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in s.counts().items())
        lines.append(f"tenant {s.tenant}: {len(s.outcomes)} message(s): {counts}")
        extra = [f"{n} {what}" for n, what in ((s.stored, "stored"),
                                               (s.stats.dependencies_fetched, "dependencies fetched"),
                                               (s.stats.attachments_fetched, "attachments fetched")) if n]
        if extra:
            lines.append("  " + ", ".join(extra))
        for o in s.outcomes:
            if not o.repaired:
                lines.append(f"  {o.status} {o.code or ''} {o.cid}" + (f": {o.detail}" if o.detail else ""))
    received = sum(s.stats.bytes_received for s in results)
    lines.append(f"replica {replica} repaired from {url}: {human_bytes(received)} in {seconds:.1f} s")
    return lines


def _totals(results: list[RepairSummary]) -> tuple[dict[str, int], dict[str, int]]:
    counts: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for s in results:
        for k, v in s.counts().items():
            counts[k] = counts.get(k, 0) + v
        for k, v in s.reasons().items():
            reasons[k] = reasons.get(k, 0) + v
    return {k: counts[k] for k in STATUS_ORDER if k in counts}, dict(sorted(reasons.items()))


def run_repair(
    store: Store,
    identity: Identity,
    plan: str,
    url: str,
    *,
    replica: str | None,
    source: str | None,
    tenant: str | None,
    protocol: str | None,
    progress: bool,
    as_json: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    insecure: bool = False,
    pin: str | None = None,
) -> int:
    """Fetch this replica's plan rows from the peer at ``url``; print the outcome; 0 when every
    message is repaired, :data:`EXIT_INCOMPLETE` when some are not."""
    stdout = out if out is not None else sys.stdout
    stderr = err if err is not None else sys.stderr
    target = check_url(url, insecure=insecure, pin=pin)
    scope = scope_of(protocol)
    replica = replica or store_id(store)
    items = _plan_items(plan, replica, source, tenant)
    by_tenant: dict[str, list[Any]] = {}
    for item in items:
        by_tenant.setdefault(item.tenant, []).append(item)
    peer = Peer(store, identity)
    bar: Any = None
    if progress and items:
        bar = tqdm(total=len(items), desc="repair", unit=" msg", file=stderr, dynamic_ncols=True,
                   mininterval=PROGRESS_MIN_INTERVAL)

    async def main() -> list[RepairSummary]:
        results: list[RepairSummary] = []
        for did, rows in by_tenant.items():
            offset = sum(len(r.outcomes) for r in results)

            def report(p: RepairProgress, offset: int = offset) -> None:
                if bar is not None:
                    bar.update(offset + p.done - bar.n)

            results.append(await peer.fetch_messages(target, tenant=did, cids=rows, scope=scope, on_progress=report))
        return results

    started = time.monotonic()
    try:
        results = trio.run(main)
    except Exception as exc:
        line = errors.describe(exc, url)
        if line is None:
            raise
        raise CliError(line) from None
    finally:
        if bar is not None:
            bar.close()
        peer.save_not_applied()  # if its last write found another process's lock
    seconds = time.monotonic() - started
    counts, reasons = _totals(results)
    ok = not reasons
    if as_json:
        report = {"replica": replica, "plan": plan, "peer": url, "source": source, "requested": len(items),
                  "ok": ok, "counts": counts, "reasons": reasons, "seconds": round(seconds, 3),
                  "tenants": [s.to_json() for s in results]}
        print(json.dumps(report), file=stdout)
    elif not items:
        print(f"nothing to repair: the plan lists no message for replica {replica}"
              + (f" from {source}" if source else ""), file=stdout)
    else:
        print("\n".join(_summary_lines(replica, url, results, seconds)), file=stdout)
    if ok:
        return 0
    unrepaired = sum(reasons.values())
    print(f"p2psync: {unrepaired} message(s) not repaired: "
          + ", ".join(f"{n} {reason}" for reason, n in reasons.items()), file=stderr)
    return EXIT_INCOMPLETE


def cmd_repair(args: argparse.Namespace) -> int:
    identity, progress = remote_command(args)
    store = open_store(args, must_exist=True)
    quiet = log_to_stderr(args.verbose)
    try:
        return run_repair(
            store, identity, args.plan, args.peer, replica=args.replica, source=args.source, tenant=args.tenant,
            protocol=args.protocol, progress=progress, as_json=args.json, insecure=args.insecure, pin=args.pin,
        )
    except ModuleNotFoundError as exc:  # the plan is Parquet: pyarrow comes with the pipeline extra
        advice = missing_pipeline_module(exc)
        if advice is None:
            raise
        raise CliError(f"PipelineNotInstalled: {advice}") from None
    finally:
        quiet()
        store.close()
