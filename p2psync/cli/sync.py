"""The replication commands: ``serve``, ``peers``, ``sync``, ``status``, ``grant sync``
(``docs/cli.md``). Each ``cmd_*`` takes the parsed arguments and opens the node; the ``run_*``
bodies do the work and print.

Every failure a user can cause raises :class:`~p2psync.cli.common.CliError`, which
``p2psync.cli.main`` prints as one line (exit 1); Ctrl-C or SIGTERM stop ``serve`` and
``sync --continuous`` cleanly (exit 0).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TextIO

import trio
from tqdm import tqdm
from websockets.uri import parse_uri

from p2psync import errors
from p2psync.blip.tls import FINGERPRINT_RE, TlsCertificate
from p2psync.cli.common import (
    EXIT_OK,
    NODE_STATUS_FILE,
    CliError,
    UsageError,
    home_of,
    load_identity,
    open_store,
    print_json,
)
from p2psync.cli.home import Home, HomeError, default_home
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import is_dwn_date_time, timestamp_from_datetime
from p2psync.node import browse
from p2psync.node.config import ConfigError, NodeConfig, load_config
from p2psync.node.links import scope_name, scope_text, state_text
from p2psync.node.node import CALLERS_FILE, Node, NodeError
from p2psync.peer.endpoint import is_loopback, plain_ws_refused
from p2psync.peer.peer import Connector, Peer, dialer
from p2psync.replication.scope import SyncScope
from p2psync.replication.stats import SyncProgress, SyncSummary
from p2psync.state.authz import sync_grant_messages
from p2psync.state.copies import NotAppliedRecords, store_id
from p2psync.state.ledger import Ledger, LinkKey, LinkState

__all__ = [
    "ProgressBars",
    "add_scope_flags",
    "cmd_grant_sync",
    "cmd_peers",
    "cmd_serve",
    "cmd_status",
    "cmd_sync",
    "grant_sync",
    "log_to_stderr",
    "remote_command",
    "run_serve",
    "run_sync",
    "scope_of",
    "scope_of_args",
    "repair_cause",
    "repair_cause_text",
    "status_lines",
    "status_report",
    "summary_lines",
]

#: A grant record is stored when the engine answers 202 Accepted.
ACCEPTED = 202
#: Progress bar redraws at most this often (seconds). Ours: four a second reads as smooth, and
#: keeps terminal writes rare in a callback that runs once per settled message.
PROGRESS_MIN_INTERVAL = 0.25

Direction = Literal["pull", "push", "both"]


# --------------------------------------------------------------------------- helpers


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def add_scope_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--protocol``, ``--path-prefix`` and ``--context-prefix`` of a command that syncs a
    scope (docs/scopes.md); ``what`` completes "replicate only ...". Read with :func:`scope_of_args`."""
    parser.add_argument("--protocol", metavar="URL", help=f"{what} this protocol's records")
    parser.add_argument("--path-prefix", action="append", default=[], metavar="PATH", dest="path_prefixes",
                        help="with --protocol: only records whose protocolPath is PATH or under it, whole "
                             "segments (thread matches thread/reply, not threads); repeat for several")
    parser.add_argument("--context-prefix", action="append", default=[], metavar="CONTEXT", dest="context_prefixes",
                        help="with --protocol: only records whose contextId is CONTEXT or under it (one or more "
                             "recordIds joined by /); repeat for several")


def scope_of(
    protocol: str | None, path_prefixes: Sequence[str] = (), context_prefixes: Sequence[str] = ()
) -> SyncScope:
    """The canonical sync scope of ``--protocol`` and the prefixes (global without them).

    A prefix without ``--protocol`` is a :class:`UsageError` (exit 2); a protocol URL or a prefix
    the scope rules refuse is a one-line :class:`CliError` naming the flag, its value and
    ``SyncScopeInvalid``'s reason.
    """
    if protocol is None:
        given = ["--path-prefix"] * bool(path_prefixes) + ["--context-prefix"] * bool(context_prefixes)
        if given:
            raise UsageError(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --protocol: "
                             "a prefix selects part of one protocol")
        return SyncScope.global_scope()
    try:
        scope = SyncScope.for_protocol(protocol)
    except DwnError as exc:
        raise CliError(f"--protocol {protocol}: {exc}") from None
    # Each prefix alone first, so that the refusal names the one at fault.
    alone: list[tuple[str, str, list[str], list[str]]] = [("--path-prefix", v, [v], []) for v in path_prefixes]
    alone += [("--context-prefix", v, [], [v]) for v in context_prefixes]
    for flag, value, paths, contexts in alone:
        try:
            SyncScope.subset(protocol, paths, contexts)
        except DwnError as exc:
            raise CliError(f"{flag} {value!r}: {exc}") from None
    try:
        return SyncScope.subset(protocol, path_prefixes, context_prefixes) if path_prefixes or context_prefixes \
            else scope
    except DwnError as exc:  # the prefixes together (more than MAX_PREFIXES)
        raise CliError(f"the scope: {exc}") from None


def scope_of_args(args: argparse.Namespace) -> SyncScope:
    """:func:`scope_of` the flags :func:`add_scope_flags` added."""
    return scope_of(args.protocol, args.path_prefixes, args.context_prefixes)


def check_url(url: str, *, insecure: bool = False, pin: str | None = None) -> Connector:
    """What to dial for ``url`` (``--insecure``, ``--pin``), refusing before anything opens: a
    URL that is not ``wss://`` or ``ws://``, plain ``ws://`` to another host without
    ``insecure``, a pin that is not a fingerprint or without TLS."""
    try:
        uri = parse_uri(url)
    except Exception as exc:  # websockets raises InvalidURI, ValueError for a bad port
        raise CliError(f"{url} is not a wss:// or ws:// URL ({exc})") from None
    refused = plain_ws_refused(url)
    if refused is not None:
        if not insecure:
            raise CliError(refused)
        logging.getLogger("p2psync").warning("syncing in clear with %s (--insecure)", url)
    if pin is not None:
        if not FINGERPRINT_RE.fullmatch(pin):
            raise CliError(f"--pin {pin!r} is not a certificate fingerprint (43 characters, as `p2psync tls show` "
                           "prints on the peer)")
        if not uri.secure:
            raise CliError(f"--pin needs a wss:// URL, not {url}")
    return dialer(url, pin=pin)


def add_transport_flags(parser: argparse.ArgumentParser) -> None:
    """``--pin`` and ``--insecure`` of every command that dials a peer."""
    parser.add_argument("--pin", metavar="FINGERPRINT",
                        help="the fingerprint the peer's TLS certificate must have (`p2psync tls show` there)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow plain ws:// to another host (anyone on the network can read it)")


def _stop_signals() -> Any:
    """A receiver of SIGINT and SIGTERM. Open it before anything starts, so that an early
    signal still stops cleanly instead of killing the process mid-commit."""
    return trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)


async def _cancel_on_signal(signals: Any, cancel_scope: trio.CancelScope, stopped: list[int]) -> None:
    """Cancel ``cancel_scope`` at the first signal; record which one in ``stopped``."""
    async for signum in signals:
        stopped.append(signum)
        cancel_scope.cancel()
        return


class _BarSafeHandler(logging.Handler):
    """Writes through ``tqdm.write``, which lifts any progress bar, prints the line whole and
    redraws the bar (a plain write would land in the middle of the bar's line)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def log_to_stderr(verbose: bool, stream: TextIO | None = None, *, level: str | None = None) -> Callable[[], None]:
    """Show p2psync's own log records (link state changes, retries) on stderr: warnings
    always, info with ``--verbose``, or ``level`` (debug, info, warning, error) when given.
    Returns the undo. On the ``p2psync`` logger, not the root one, so a host program's (or
    pytest's) logging stays as it was."""
    logger = logging.getLogger("p2psync")
    handler = _BarSafeHandler(stream if stream is not None else sys.stderr)
    # A time on every line (issue #16): a node's log is read long after, beside other machines'.
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d p2psync: %(message)s", "%Y-%m-%d %H:%M:%S"))
    previous = logger.level
    logger.addHandler(handler)
    if level is not None:
        logger.setLevel(getattr(logging, level.upper()))
    else:
        logger.setLevel(logging.INFO if verbose else logging.WARNING)

    def undo() -> None:
        logger.removeHandler(handler)
        logger.setLevel(previous)

    return undo


# --------------------------------------------------------------------------- serve


def run_serve(
    store: Store,
    identity: Identity,
    config: NodeConfig | None = None,
    *,
    out: TextIO | None = None,
    status_path: Path | None = None,
    tls: TlsCertificate | None = None,
) -> int:
    """Run the node (p2psync/node) until Ctrl-C or SIGTERM; prints its URL, DID and storeId
    (and, when configured, the metrics URL, discovery and links).

    The first signal stops it gracefully (links save their checkpoints); a second one stops it
    at once. With no configuration it is the passive side on 127.0.0.1:4984, nothing more.
    """
    stream = out if out is not None else sys.stdout
    config = config or NodeConfig()
    try:
        callers = None if status_path is None else status_path.with_name(CALLERS_FILE)
        node = Node(config, store, identity, status_path=status_path, tls=tls, callers_path=callers)
    except ConfigError as exc:
        raise CliError(str(exc)) from None

    def say(line: str) -> None:
        # Flushed: a supervising process (or a test) reads the URL from a pipe.
        print(line, file=stream, flush=True)

    async def main() -> list[int]:
        stopped: list[int] = []
        with _stop_signals() as signals:
            async with trio.open_nursery() as nursery:
                try:
                    await nursery.start(_run_node, node, nursery.cancel_scope)
                except NodeError as exc:
                    raise CliError(str(exc)) from None
                nursery.start_soon(_stop_node_on_signals, signals, node, nursery.cancel_scope, stopped)
                say(f"serving {node.url}")
                if node.tls is not None:
                    say(f"tls: {node.tls.fingerprint}")
                elif not is_loopback(config.host):
                    logging.getLogger("p2psync").warning(
                        "serving plain ws:// on %s (--insecure): anyone on the network can read the sync", config.host)
                say(f"did: {identity.did}")
                say(f"storeId: {node.store_id}")
                if node.metrics_url is not None:
                    say(f"metrics: {node.metrics_url}")
                if config.discovery_enabled:
                    where = ", ".join(config.discovery_interfaces() or ["all interfaces"])
                    say(f"discovery: on ({where})" + (", tenants hashed" if config.private else "")
                        + (", auto-sync with peers that share a tenant" if config.auto else ""))
                if config.tenants or config.peers or config.auto:
                    for tenant in node.tenants:
                        scopes = ", ".join(scope_name(s) for s in tenant.scopes)
                        say(f"tenant: {tenant.did} ({scopes}; {tenant.direction})")
                for peer in config.peers:
                    say(f"peer: {peer.url}")
        return stopped

    try:
        stopped = trio.run(main)
    except BaseExceptionGroup as group:
        raise errors.leaf(group) from None
    name = signal.Signals(stopped[0]).name if stopped else "end"
    if node.stopped_links:
        print(f"checkpoints saved for {node.stopped_links} link(s)", file=stream, flush=True)
    print(f"stopped ({name})", file=stream, flush=True)
    return 0


async def _stop_node_on_signals(signals: Any, node: Any, cancel_scope: trio.CancelScope, stopped: list[int]) -> None:
    """First signal: a graceful stop; a second one: stop at once."""
    async for signum in signals:
        stopped.append(signum)
        if len(stopped) == 1:
            node.stop()
        else:
            cancel_scope.cancel()
            return


async def _run_node(node: Any, cancel_scope: trio.CancelScope, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run the node; once it has stopped, end the rest (the signal watcher)."""
    await node.run(task_status=task_status)
    cancel_scope.cancel()


# --------------------------------------------------------------------------- sync


@dataclass
class ProgressBars:
    """One tqdm bar per direction on ``stream`` (messages, bytes, rate), fed by ``on_progress``.

    Disabled bars still record the last report of each direction (for the summary of a
    stopped continuous sync).
    """
    enabled: bool
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    last: dict[str, SyncProgress] = field(default_factory=dict)
    _bars: dict[str, Any] = field(default_factory=dict)
    _started: float = field(default_factory=time.monotonic)

    def __call__(self, progress: SyncProgress) -> None:
        self.last[progress.direction] = progress
        if not self.enabled:
            return
        bar = self._bars.get(progress.direction)
        if bar is None:
            bar = tqdm(desc=progress.direction, unit=" msg", file=self.stream, position=len(self._bars),
                       leave=True, dynamic_ncols=True, mininterval=PROGRESS_MIN_INTERVAL)
            self._bars[progress.direction] = bar
        elapsed = max(time.monotonic() - self._started, 1e-9)
        postfix = f"{human_bytes(progress.bytes)} ({human_bytes(progress.bytes / elapsed)}/s)"
        if progress.position is not None and progress.latest is not None:
            postfix += f", log {progress.position}/{progress.latest}"
        bar.set_postfix_str(postfix, refresh=False)
        bar.update(progress.messages - bar.n)

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()


def _position(checkpoint: Any, direction: str) -> str | None:
    """contiguousAppliedToken.position of one direction of a saved checkpoint pair."""
    if not isinstance(checkpoint, dict):
        return None
    token = (checkpoint.get(direction) or {}).get("contiguousAppliedToken")
    return None if not isinstance(token, dict) else str(token.get("position"))


def summary_lines(summary: SyncSummary, seconds: float) -> list[str]:
    """The final human summary of one ``sync``."""
    lines = [f"tenant {summary.tenant} with {summary.remote}"]
    for direction, stats in (("pull", summary.pull), ("push", summary.push)):
        if stats is None:
            continue
        # What a round reconciled instead of replaying (a first sync of replicas that share most
        # messages, a gap) moved too: counted with the rest, and named below.
        if direction == "pull":
            verb, moved, size = "pulled", stats.revs_received + stats.reconciled, stats.bytes_received
        else:
            verb, moved, size = "pushed", stats.revs_sent + stats.reconciled, stats.bytes_sent
        rate = f"{moved / seconds:,.0f} msg/s" if seconds > 0 else "-"
        line = (f"{verb} {moved} message(s), {stats.revs_applied} new, {stats.items_skipped} already held; "
                f"{human_bytes(size)} in {seconds:.1f} s ({rate})")
        extra = [f"{n} {what}" for n, what in ((stats.reconciled, "by set reconciliation"),
                                               (stats.dependencies_fetched, "dependencies fetched"),
                                               (stats.attachments_fetched, "attachments fetched")) if n]
        if extra:
            line += "; " + ", ".join(extra)
        lines.append(line)
        frontier = _position(summary.checkpoint, direction)
        lines.append(f"  {direction} checkpoint: " + ("at the start" if frontier is None else f"position {frontier}"))
        lines.extend(f"  {line}" for line in stats.not_applied.lines())
    return lines


def run_sync(
    store: Store,
    identity: Identity,
    url: str,
    *,
    tenant: str,
    scope: SyncScope,
    direction: Direction,
    continuous: bool,
    progress: bool,
    as_json: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    insecure: bool = False,
    pin: str | None = None,
) -> int:
    """Run one sync of ``scope`` (or a continuous one until Ctrl-C / SIGTERM) and print its
    summary; a scope other than global is named with its scopeId (its own link and checkpoints)."""
    stdout = out if out is not None else sys.stdout
    stderr = err if err is not None else sys.stderr
    target = check_url(url, insecure=insecure, pin=pin)
    peer = Peer(store, identity)
    bars = ProgressBars(progress, stderr)

    async def main() -> tuple[SyncSummary | None, BaseException | None, list[int]]:
        stopped: list[int] = []
        summary: SyncSummary | None = None
        failure: BaseException | None = None
        with _stop_signals() as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_signal, signals, nursery.cancel_scope, stopped)
                try:
                    summary = await peer.sync(target, tenant=tenant, scope=scope, direction=direction,
                                              continuous=continuous, on_progress=bars)
                except Exception as exc:  # explained below; a nursery would wrap it in a group
                    failure = exc
                nursery.cancel_scope.cancel()
        return summary, failure, stopped

    started = time.monotonic()
    try:
        summary, failure, stopped = trio.run(main)
    finally:
        bars.close()
        peer.save_not_applied()  # if its last write found another process's lock
    seconds = time.monotonic() - started
    if failure is not None:
        line = errors.describe(failure, url)
        if line is None:
            raise failure
        raise CliError(line)
    if summary is None:  # stopped by a signal (a continuous sync never returns otherwise)
        report = {d: {"messages": p.messages, "bytes": p.bytes} for d, p in bars.last.items()}
        if as_json:
            print(json.dumps({"stopped": True, "seconds": round(seconds, 3), **report}), file=stdout)
        else:
            done = ", ".join(f"{d} {r['messages']} message(s), {human_bytes(r['bytes'])}" for d, r in report.items())
            print(f"stopped after {seconds:.1f} s" + (f": {done}" if done else ""), file=stdout)
        return 0
    cause = repair_cause(Ledger.for_store(store), LinkKey(summary.tenant, summary.remote, scope.scope_id)) \
        if summary.state == "repairing" else None
    if as_json:
        shown: dict[str, Any] = {**summary.to_json(), "scope": scope.to_wire(), "scopeId": scope.scope_id}
        if cause is not None:
            shown["repair"] = cause
        print(json.dumps(shown), file=stdout)
    else:
        # The peer's own clock excludes our start-up; fall back to ours if it kept none.
        lines = summary_lines(summary, summary.seconds or seconds)
        if scope.kind != "global":
            lines.insert(1, f"  scope {scope_text(scope)} [{scope.scope_id}]")
        if summary.state != "live":
            lines.append(f"link left {summary.state}" + ("" if cause is None else f": {repair_cause_text(cause)}")
                         + " (`p2psync status` shows it)")
        print("\n".join(lines), file=stdout)
    return 0


# --------------------------------------------------------------------------- status


def _frontier(checkpoint: dict[str, Any]) -> int | None:
    token = checkpoint.get("contiguousAppliedToken")
    return None if token is None else int(token["position"])


def _copies(store: Store) -> list[dict[str, Any]]:
    """The checkpoint copies this store keeps as the passive side (p2psync/state/copies.py).

    Read straight from its table: ``CheckpointCopies`` has no listing call, and a serving
    node's ledger has no links (only the active side opens them), so this is what says which
    peers synced here and how far.
    """
    exists = store.conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='peer_checkpoint_copies'"
    ).fetchone()
    if exists is None:
        return []
    out = []
    rows = store.conn.execute(
        "SELECT peer_did, checkpoint_id, rev, body FROM peer_checkpoint_copies ORDER BY peer_did, checkpoint_id"
    )
    for peer_did, cid, rev, body in rows:
        pair = json.loads(body)
        out.append({"peer": peer_did, "checkpointId": cid, "rev": rev,
                    "frontier": {d: _frontier(pair.get(d, {})) for d in ("pull", "push")}})
    return out


def repair_cause(ledger: Ledger, key: LinkKey) -> dict[str, Any] | None:
    """Why the link ``key`` is ``repairing``: ``{"since", "reason", "errorCode", "direction"}``
    of the change that put it there (``errorCode`` and ``direction`` None when the ledger
    logged none), or None when it is not repairing. A closure that could not be completed puts
    its RFC code here (``ClosureParentChainMissing``, ...; docs/scopes.md)."""
    if ledger.link(key).state != LinkState.REPAIRING:
        return None
    entered = ledger.last_entered(key, LinkState.REPAIRING)
    if entered is None:
        return None
    return {"since": timestamp_from_datetime(entered.at), "reason": entered.reason,
            "errorCode": entered.error_code,
            "direction": None if entered.direction is None else str(entered.direction)}


def repair_cause_text(cause: dict[str, Any]) -> str:
    """A :func:`repair_cause` for a person: ``ClosureGrantMissing (pull) since T: reason``."""
    code = cause.get("errorCode") or "repairing"
    way = f" ({cause['direction']})" if cause.get("direction") else ""
    return f"{code}{way} since {cause.get('since')}: {cause.get('reason')}"


def status_report(store: Store, node: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"storeId", "links": [...], "copies": [...]}`` from the store's ledger and copies.

    Each link is the ledger's ``ReplicationLinkState`` object (``Ledger.link_state``) plus
    ``frontier``: ``{"pull": int | None, "push": int | None}``, the contiguousAppliedToken
    position of each direction (None: nothing applied yet), and, when ``node`` (the status
    file of a node running on this store, p2psync/node) runs that link, ``antiEntropy``: its
    last periodic check and the next, and ``fingerprint``: the peer's TLS certificate on the
    connected round. ``state`` is the link's state as the node sees it now
    (p2psync/node/links.py: ``live`` only while connected and caught up; ``idle`` when no node
    runs it), with the node's ``failureCount`` and ``nextAttemptAt``; the ledger's own state
    (where the last round left it) is ``replicationState``. Each copy is one checkpoint pair this store keeps for an
    active peer that synced with it: ``{"peer", "checkpointId", "rev", "frontier"}`` (the
    peer's pull frontier is a position in this store's log). ``node``: that running node's
    ``url`` and own ``fingerprint`` (None when no node runs on this store).
    """
    ledger = Ledger.for_store(store)
    sid = store_id(store)
    running = node.get("links", []) if node is not None and node.get("storeId") == sid else []
    links = []
    for link in ledger.links():
        state = ledger.link_state(link.key)
        cause = repair_cause(ledger, link.key)
        if cause is not None:
            state["repair"] = cause
        state["frontier"] = {"pull": _frontier(state["pull"]), "push": _frontier(state["push"])}
        state["replicationState"], state["state"] = state["state"], "idle"
        for shown in running:
            if (shown.get("tenant") == link.key.tenant and shown.get("scopeId") == link.key.scope_id
                    and shown.get("storeId") and link.key.remote.endswith(f"storeId={shown['storeId']}")
                    and isinstance(shown.get("antiEntropy"), dict)):
                state["antiEntropy"] = shown["antiEntropy"]
                if shown.get("fingerprint"):
                    state["fingerprint"] = shown["fingerprint"]
                if isinstance(shown.get("state"), str):  # the node's view of the link it runs
                    state["state"], state["failureCount"] = shown["state"], shown.get("failures", 0)
                    if shown.get("nextAttemptAt"):
                        state["nextAttemptAt"] = shown["nextAttemptAt"]
        links.append(state)
    serving = None
    if node is not None and node.get("storeId") == sid:
        serving = {"url": node.get("url"), "fingerprint": node.get("fingerprint")}
    report = {"storeId": sid, "node": serving, "links": links, "copies": _copies(store)}
    # What did not apply and has not since, on any connection (issue #16): the running node's
    # list, else the one the store keeps.
    report["notApplied"] = (node.get("notApplied") if serving is not None and node is not None
                            else NotAppliedRecords(store).load().to_json())
    return report


def status_lines(report: dict[str, Any]) -> list[str]:
    """``status`` for a person: one block per link."""
    lines = [f"storeId {report['storeId']}"]
    serving = report.get("node")
    if serving is not None:
        tls = f" (TLS certificate {serving['fingerprint']})" if serving.get("fingerprint") else " (plain, no TLS)"
        lines.append(f"serving {serving['url']}{tls}")
    if not report["links"] and not report["copies"]:
        lines.append("no links yet (run `p2psync sync URL`, or serve and let a peer connect)")
    for link in report["links"]:
        lines.append(f"{link['tenantDid']}  <->  {link['remoteEndpoint']}"
                     + (f"  (TLS {link['fingerprint']})" if link.get("fingerprint") else ""))
        lines.append(f"  scope {scope_text(link['scope'])} [{link['scopeId']}], state "
                     + state_text(link["state"], link["failureCount"], browse.seconds_until(link.get("nextAttemptAt")))
                     + ("" if link["state"] != "idle" else f"; the last round left it {link['replicationState']}"))
        lines.append(f"  last success {link.get('lastSuccessAt', '-')}, last failure {link.get('lastFailureAt', '-')}"
                     + (f" ({link['lastError']})" if "lastError" in link else ""))
        if isinstance(link.get("repair"), dict):  # why the last round left it repairing
            lines.append(f"  repairing: {repair_cause_text(link['repair'])}")
        for direction in ("pull", "push"):
            cp = link[direction]
            at = link["frontier"][direction]
            if "receivedToken" not in cp:
                lines.append(f"  {direction}: nothing applied yet")
                continue
            received = int(cp["receivedToken"]["position"])
            pending = len(cp.get("pendingTokens", []))
            # Received and not applied: a message this node could not apply (or the peer, for
            # push) holds the link out of `live` until a round settles it.
            unapplied = len(cp.get("unappliedTokens", []))
            applied = "nothing applied yet" if at is None else f"applied through position {at}"
            lines.append(f"  {direction}: {applied} (received {received}"
                         + (f", {pending} pending" if pending else "")
                         + (f", {unapplied} not applied" if unapplied else "") + ")")
        check = browse.anti_entropy_line(link.get("antiEntropy"))
        if check is not None:
            lines.append(f"  {check}")
    if report["copies"]:
        lines.append("checkpoints kept for peers that sync with this node:")
    for copy in report["copies"]:
        at = ", ".join(f"{d} {'-' if p is None else f'position {p}'}" for d, p in copy["frontier"].items())
        lines.append(f"  {copy['peer']}  {at}  (checkpoint {copy['checkpointId']}, rev {copy['rev']})")
    lines.extend(_not_applied_lines(report.get("notApplied")))
    return lines


def _not_applied_lines(shown: Any) -> list[str]:
    """The messages that did not apply on the node's store (its status file's ``notApplied``,
    kept in the store across restarts)."""
    if not isinstance(shown, dict) or not shown.get("count"):
        return []
    last = [e for e in shown.get("last") or [] if isinstance(e, dict)]
    head = f" (the last {len(last)}:)" if shown["count"] > len(last) else ":"
    lines = [f"{shown['count']} message(s) did not apply{head}"]
    for e in last:
        at = " at the peer" if e.get("where") == "peer" else ""
        lines.append(f"  {e.get('messageCid')}: {e.get('result')}{at} ({e.get('code')}): {e.get('reason')}")
    return lines


# --------------------------------------------------------------------------- grant sync


def grant_sync(
    store: Store, tenant: Identity, grantee: str, *, protocol: str | None, expires: str | None
) -> list[dict[str, Any]]:
    """Author the delegated sync grant(s) from ``tenant`` to ``grantee`` and store them.

    Each message must be accepted (202); returns one ``{"recordId", "messageCid", "status"}``
    per message, in the order stored.
    """
    if not grantee.startswith("did:"):
        raise CliError(f"{grantee} is not a DID")
    if expires is not None and not is_dwn_date_time(expires):
        raise CliError(f"--expires {expires} is not a DWN timestamp (like 2030-01-01T00:00:00.000000Z)")
    try:
        messages = sync_grant_messages(tenant, grantee, protocol=protocol, expires=expires)
    except (DwnError, ValueError) as exc:
        raise CliError(f"cannot author the grant: {exc}") from None
    dwn = Dwn(store)
    out = []
    for message, data in messages:
        reply = dwn.process_message(tenant.did, message, data)
        if reply.code != ACCEPTED:
            raise CliError(f"grant refused ({reply.code}): {reply.detail}")
        out.append({"recordId": message.get("recordId"), "messageCid": message_cid(message), "status": reply.code})
    return out


# --------------------------------------------------------------------------- commands


def cmd_serve(args: argparse.Namespace) -> int:
    flags = {
        "data_dir": args.home, "store": args.store, "host": args.host, "port": args.port, "auto": args.auto,
        "tls": args.tls, "insecure": args.insecure,
        "discovery": args.discovery, "private": args.private, "peers": args.peer, "interfaces": args.interface,
        "metrics_port": args.metrics_port, "metrics_host": args.metrics_host, "name": args.name,
        "log_level": args.log_level or ("info" if args.verbose else None),
    }
    try:
        config = load_config(args.config, flags=flags)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    home = Home(config.data_dir or default_home())
    try:
        identity = home.load_identity()
        tls = home.tls_certificate() if config.tls_enabled else None
    except HomeError as exc:
        raise CliError(str(exc)) from None
    store_path = config.store or home.store_path
    try:
        store = Store(store_path)
    except DwnError as exc:
        raise CliError(f"cannot open {store_path}: {exc}") from None
    quiet = log_to_stderr(args.verbose, level=config.log_level)
    try:
        return run_serve(store, identity, config, status_path=home.path / NODE_STATUS_FILE, tls=tls)
    finally:
        quiet()
        store.close()


def cmd_peers(args: argparse.Namespace) -> int:
    home = home_of(args)
    try:
        return browse.run_peers(wait=args.wait, as_json=args.json, interfaces=args.interface,
                                status_path=home.path / NODE_STATUS_FILE)
    except browse.PeersFailure as exc:
        raise CliError(str(exc)) from None


def remote_command(args: argparse.Namespace) -> tuple[Identity, bool]:
    """What ``sync`` and ``repair`` check first: this node's identity, a ``--tenant`` that is a
    DID, and whether to draw a progress bar."""
    identity = load_identity(args)
    if args.tenant is not None and not args.tenant.startswith("did:"):
        raise CliError(f"--tenant {args.tenant} is not a DID")
    # A bar only where a person watches (or when asked): a pipe or a log file gets the summary.
    progress = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    return identity, progress


def cmd_sync(args: argparse.Namespace) -> int:
    scope = scope_of_args(args)  # a usage error before anything opens
    identity, progress = remote_command(args)
    store = open_store(args, must_exist=False)
    quiet = log_to_stderr(args.verbose)
    try:
        return run_sync(
            store, identity, args.url, tenant=args.tenant or identity.did, scope=scope,
            direction=args.direction, continuous=args.continuous, progress=progress, as_json=args.json,
            insecure=args.insecure, pin=args.pin,
        )
    finally:
        quiet()
        store.close()


#: Seconds ``status --clear-not-applied`` waits for the running node to clear its list (it
#: looks about once a second).
CLEAR_WAIT: Final = 10.0


def clear_not_applied(store: Store, node: dict[str, Any] | None) -> int:
    """Empty the list of messages that did not apply: through the node running on ``store``
    (``node``: its status file), else in the store itself. Returns how many it counted;
    :class:`CliError` if the node did not clear it in :data:`CLEAR_WAIT` seconds."""
    records = NotAppliedRecords(store)
    if node is None or node.get("storeId") != store_id(store):
        return records.clear()
    shown = node.get("notApplied")
    count = int(shown.get("count", 0)) if isinstance(shown, dict) else records.load().count
    records.request_clear()
    deadline = time.monotonic() + CLEAR_WAIT
    while records.clear_requested():
        if time.monotonic() > deadline:
            raise CliError(f"the node running on this store (pid {node.get('pid')}) did not clear its list within"
                           f" {CLEAR_WAIT:g} s; it will when it next looks, if it runs")
        time.sleep(0.1)
    return count


def cmd_status(args: argparse.Namespace) -> int:
    store = open_store(args, must_exist=True)
    node_file = home_of(args).path / NODE_STATUS_FILE
    try:
        if args.clear_not_applied:
            cleared = clear_not_applied(store, browse.node_status(node_file))
            if args.json:
                print_json({"cleared": cleared})
            else:
                print(f"cleared the list of messages that did not apply ({cleared} counted)")
            return EXIT_OK
        report = status_report(store, browse.node_status(node_file))
    finally:
        store.close()
    if args.json:
        print_json(report)
    else:
        print("\n".join(status_lines(report)))
    return EXIT_OK


def cmd_grant_sync(args: argparse.Namespace) -> int:
    identity = load_identity(args)
    store = open_store(args, must_exist=False)
    try:
        records = grant_sync(store, identity, args.did, protocol=args.protocol, expires=args.expires)
    finally:
        store.close()
    print_json({"grantor": identity.did, "grantee": args.did, "records": records})
    return EXIT_OK
