"""Anti-entropy for a person: ``p2psync diff`` and ``p2psync sync --repair`` (docs/cli.md).

Both run :meth:`Peer.reconcile <p2psync.peer.peer.Peer.reconcile>` against one peer
(protocol/anti-entropy.md): ``diff`` only names what each replica lacks; ``sync --repair``
fetches exactly those messages by CID and has the peer take what it lacks, then checks again.
Neither keeps a checkpoint or touches the links of a log sync.

Exit codes follow ``repair`` and ``pipeline audit``: 0 when the replicas are (or became) equal,
:data:`~p2psync.cli.repair.EXIT_INCOMPLETE` (3) when they differ (``diff``) or still differ
after the repair (``sync --repair``), 1 when the command could not run (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

import trio
from tqdm import tqdm

from p2psync import errors
from p2psync.cli.common import EXIT_OK, CliError, UsageError, load_identity, open_store
from p2psync.cli.repair import EXIT_INCOMPLETE, PROGRESS_MIN_INTERVAL
from p2psync.cli.sync import (
    Direction,
    check_url,
    cmd_sync,
    human_bytes,
    log_to_stderr,
    remote_command,
    scope_of,
    scope_of_args,
)
from p2psync.dwn.did import Identity
from p2psync.dwn.store import Store
from p2psync.peer.peer import Connector, Peer, ReconcileSummary, RepairProgress
from p2psync.replication.scope import SyncScope
from p2psync.replication.sink import HELD_KINDS

__all__ = [
    "cmd_diff",
    "cmd_sync_or_repair",
    "diff_lines",
    "repair_lines",
    "run_diff",
    "run_sync_repair",
]




def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _cost(summary: ReconcileSummary) -> str:
    """'2 round trips, 812 bytes': what the reconciliation itself cost."""
    return f"{_plural(summary.round_trips, 'round trip')}, {_plural(summary.bytes, 'byte')}"


def _difference_line(summary: ReconcileSummary) -> str:
    """The first line of ``diff``: equal, or how many each side lacks of how many."""
    if summary.equal:
        return f"equal: {_plural(summary.local_count, 'message')} each ({_cost(summary)})"
    return (f"you lack {len(summary.remote_only):,}, they lack {len(summary.local_only):,} "
            f"of {summary.local_count:,} here / {summary.remote_count:,} there ({_cost(summary)})")


def _message_lines(summary: ReconcileSummary) -> list[str]:
    """One line a message concerned: side, kind, recordId, protocol, messageTimestamp (a
    write's dateModified), CID (``-`` when absent), in columns, what this replica lacks first.
    ``p2psync show RECORD`` then tells a record's history here."""
    rows = [("you lack", d) for d in summary.remote_only] + [("they lack", d) for d in summary.local_only]
    if not rows:
        return []
    columns = ("kind", "recordId", "protocol", "messageTimestamp")
    widths = {c: max(len(str(d.get(c, "-"))) for _, d in rows) for c in columns}
    return [f"  {side:<9}  " + "  ".join(f"{str(d.get(c, '-')):<{widths[c]}}" for c in columns) + f"  {d['cid']}"
            for side, d in rows]


def diff_lines(summary: ReconcileSummary) -> list[str]:
    """``diff`` for a person: the difference, then the messages concerned."""
    return [_difference_line(summary), *_message_lines(summary)]


def repair_lines(summary: ReconcileSummary, direction: Direction, held: int) -> list[str]:
    """``sync --repair`` for a person: what differed, what moved each way, the cost, the end
    (``held``: the messages this replica holds afterwards)."""
    lines = [f"tenant {summary.tenant} with {summary.remote}"]
    if not summary.differences:
        lines.append(f"nothing to repair: {_plural(summary.local_count, 'message')} each")
    else:
        lines.append(f"you lacked {len(summary.remote_only):,}, they lacked {len(summary.local_only):,} "
                     f"of {summary.local_count:,} here / {summary.remote_count:,} there")
    fetched = summary.fetched
    if fetched is not None:
        counts = ", ".join(f"{n:,} {status.replace('_', ' ')}" for status, n in fetched.counts().items())
        line = (f"fetched {_plural(len(fetched.outcomes), 'message')}: {counts}; {fetched.stored:,} stored, "
                f"{human_bytes(fetched.stats.bytes_received)} received")
        stats = fetched.stats
        extra = [f"{n:,} {one if n == 1 else many} fetched"
                 for n, one, many in ((stats.dependencies_fetched, "dependency", "dependencies"),
                                      (stats.attachments_fetched, "attachment", "attachments")) if n]
        lines.append(line + ("; " + ", ".join(extra) if extra else ""))
        for o in fetched.outcomes:
            if not o.repaired:
                lines.append(f"  {o.status} {o.code or ''} {o.cid}" + (f": {o.detail}" if o.detail else ""))
    elif summary.remote_only and direction == "push":
        lines.append(f"fetched nothing: --push does not fetch the {_plural(len(summary.remote_only), 'message')} "
                     "you lack")
    if summary.pushed:
        took = {k: n for k, n in summary.pushed.items() if k in HELD_KINDS}
        others = {k: n for k, n in summary.pushed.items() if k not in HELD_KINDS}
        line = (f"handed over {_plural(sum(summary.pushed.values()), 'message')}: the peer took "
                f"{sum(took.values()):,}")
        if took:
            line += " (" + ", ".join(f"{n:,} {kind}" for kind, n in took.items()) + ")"
        if others:
            line += "; " + ", ".join(f"{n:,} {kind}" for kind, n in others.items())
        lines.append(line)
    elif summary.local_only and direction == "pull":
        lines.append(f"handed over nothing: --pull does not hand over the "
                     f"{_plural(len(summary.local_only), 'message')} they lack (use --both)")
    lines.append(f"reconciliation: {_cost(summary)}, {_plural(summary.attempts, 'check')}; "
                 f"{summary.seconds:.2f} s in all")
    if summary.equal:
        lines.append(f"equal now: {_plural(held, 'message')} each")
    elif _one_way_done(summary, direction):
        other = (f"they still lack {_plural(len(summary.local_only), 'message')}" if direction == "pull"
                 else f"you still lack {_plural(len(summary.remote_only), 'message')}")
        lines.append(f"done one way, not equal: {other} (--both moves them)")
    else:
        lines.append(f"still different: {summary.unresolved or 'the replicas differ'}")
    return lines


def _one_way_done(summary: ReconcileSummary, direction: Direction) -> bool:
    """A ``--pull`` or ``--push`` repair moved all it could: what still differs is only what its
    direction does not move (the summary then has no ``unresolved``)."""
    return direction != "both" and not summary.equal and summary.unresolved is None


def _reconcile(
    peer: Peer,
    url: str,
    target: Connector,
    *,
    tenant: str,
    scope: SyncScope,
    repair: bool,
    direction: Direction,
    on_progress: Callable[[RepairProgress], None] | None = None,
) -> ReconcileSummary:
    """One :meth:`Peer.reconcile`; a failure we can explain is a one-line :class:`CliError`."""

    async def main() -> ReconcileSummary:
        return await peer.reconcile(target, tenant=tenant, scope=scope, repair=repair, direction=direction,
                                    on_progress=on_progress)

    try:
        return trio.run(main)
    except Exception as exc:
        line = errors.describe(exc, url)
        if line is None:
            raise
        raise CliError(line) from None


def run_diff(
    store: Store,
    identity: Identity,
    url: str,
    *,
    tenant: str,
    protocol: str | None,
    as_json: bool,
    out: TextIO | None = None,
    insecure: bool = False,
    pin: str | None = None,
) -> int:
    """Print what this replica and the peer at ``url`` each lack, changing nothing; 0 when
    equal, :data:`EXIT_INCOMPLETE` when they differ."""
    stdout = out if out is not None else sys.stdout
    target = check_url(url, insecure=insecure, pin=pin)
    summary = _reconcile(Peer(store, identity), url, target, tenant=tenant, scope=scope_of(protocol), repair=False,
                         direction="both")
    if as_json:
        print(json.dumps(summary.to_json()), file=stdout)
    else:
        print("\n".join(diff_lines(summary)), file=stdout)
    return EXIT_OK if summary.equal else EXIT_INCOMPLETE


class _RepairBar:
    """A tqdm bar of the messages fetched (created at the first report; a later fetch of a
    salted retry raises its total)."""

    def __init__(self, enabled: bool, stream: TextIO) -> None:
        self.enabled = enabled
        self.stream = stream
        self.bar: Any = None
        self.offset = 0  # messages of earlier fetches
        self.last_total = 0

    def __call__(self, progress: RepairProgress) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = tqdm(total=progress.total, desc="repair", unit=" msg", file=self.stream,
                            dynamic_ncols=True, mininterval=PROGRESS_MIN_INTERVAL)
        elif progress.done == 1 and self.bar.n >= self.offset + self.last_total:  # a new fetch began
            self.offset += self.last_total
            self.bar.total = self.offset + progress.total
        self.last_total = progress.total
        self.bar.set_postfix_str(human_bytes(progress.bytes), refresh=False)
        self.bar.update(self.offset + progress.done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_sync_repair(
    store: Store,
    identity: Identity,
    url: str,
    *,
    tenant: str,
    protocol: str | None,
    direction: Direction,
    progress: bool,
    as_json: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    insecure: bool = False,
    pin: str | None = None,
) -> int:
    """Reconcile with the peer at ``url`` and move exactly the missing messages (``direction``
    says which way); print the outcome; 0 when the replicas are equal afterwards, or when a
    one-way repair left only what its direction does not move; :data:`EXIT_INCOMPLETE` when a
    difference it should have mended stayed (``unresolved``)."""
    stdout = out if out is not None else sys.stdout
    stderr = err if err is not None else sys.stderr
    target = check_url(url, insecure=insecure, pin=pin)
    scope = scope_of(protocol)
    peer = Peer(store, identity)
    bar = _RepairBar(progress, stderr)
    try:
        summary = _reconcile(peer, url, target, tenant=tenant, scope=scope, repair=True, direction=direction,
                             on_progress=bar)
    finally:
        bar.close()
        peer.save_not_applied()  # if its last write found another process's lock
    if as_json:
        print(json.dumps(summary.to_json()), file=stdout)
    else:
        # What this replica holds now (the maintained count, no scan): both hold it when equal.
        held = peer.service.sketches.view(tenant, scope).count
        print("\n".join(repair_lines(summary, direction, held)), file=stdout)
    if summary.equal or _one_way_done(summary, direction):
        return EXIT_OK
    print(f"p2psync: the replicas still differ: {summary.unresolved or 'unknown reason'}", file=stderr)
    return EXIT_INCOMPLETE


# --------------------------------------------------------------------------- commands


def cmd_diff(args: argparse.Namespace) -> int:
    identity = load_identity(args)
    if args.tenant is not None and not args.tenant.startswith("did:"):
        raise CliError(f"--tenant {args.tenant} is not a DID")
    store = open_store(args, must_exist=True)
    quiet = log_to_stderr(args.verbose)
    try:
        return run_diff(store, identity, args.url, tenant=args.tenant or identity.did, protocol=args.protocol,
                        as_json=args.json, insecure=args.insecure, pin=args.pin)
    finally:
        quiet()
        store.close()


def cmd_sync_or_repair(args: argparse.Namespace) -> int:
    """``sync``: a log sync (:func:`p2psync.cli.sync.cmd_sync`), or with ``--repair`` one
    anti-entropy pass."""
    if not args.repair:
        return cmd_sync(args)
    if args.continuous:
        raise CliError("--repair runs once and ends; it cannot be combined with --continuous")
    if scope_of_args(args).kind == "subset":
        # The sets compared (p2psync/state/sketches.py) are a whole tenant's or one protocol's.
        raise UsageError("--repair reconciles a whole tenant or one protocol: --path-prefix and "
                         "--context-prefix go with a log sync (without --repair)")
    identity, progress = remote_command(args)
    store = open_store(args, must_exist=False)
    quiet = log_to_stderr(args.verbose)
    try:
        return run_sync_repair(store, identity, args.url, tenant=args.tenant or identity.did,
                               protocol=args.protocol, direction=args.direction, progress=progress,
                               as_json=args.json, insecure=args.insecure, pin=args.pin)
    finally:
        quiet()
        store.close()
