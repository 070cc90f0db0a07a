"""The ``p2psync`` command.

Every failure a user can cause ends in one line on stderr saying what was wrong and what to
do, and a non-zero exit code; no traceback.

A package at the top of p2psync: it imports the layers below and nothing imports it (only
``python -m p2psync`` and the ``p2psync`` console script). :mod:`~p2psync.cli.common` holds the
one-line error and the data-directory helpers; the commands live by topic in
:mod:`~p2psync.cli.local` (the node's own store), :mod:`~p2psync.cli.sync` (serve, peers,
sync, status, grant sync), :mod:`~p2psync.cli.repair`, :mod:`~p2psync.cli.anti_entropy` (diff, sync
--repair), :mod:`~p2psync.cli.pipeline` (export
and the Spark jobs) and :mod:`~p2psync.cli.tools` (demo, dwn pipe, blip echo).
:mod:`~p2psync.cli.home` (the data directory) and :mod:`~p2psync.cli.extras` (advice for a
missing optional extra) are used by the commands only, so they live here too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

import apsw

from p2psync import __version__
from p2psync.cli import common
from p2psync.cli.anti_entropy import cmd_diff, cmd_sync_or_repair
from p2psync.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, NODE_STATUS_FILE, CliError, UsageError
from p2psync.cli.local import (
    cmd_init,
    cmd_protocol_install,
    cmd_query,
    cmd_read,
    cmd_store_digest,
    cmd_store_verify,
    cmd_tls_rotate,
    cmd_tls_show,
    cmd_whoami,
    cmd_write,
)
from p2psync.cli.pipeline import register as register_pipeline
from p2psync.cli.records import cmd_delete, cmd_show, cmd_update
from p2psync.cli.repair import cmd_repair
from p2psync.cli.sync import add_scope_flags, add_transport_flags, cmd_grant_sync, cmd_peers, cmd_serve, cmd_status
from p2psync.cli.tools import cmd_blip_echo, cmd_demo, cmd_dwn_pipe, cmd_sim
from p2psync.node.config import DEFAULT_HOST, DEFAULT_PORT
from p2psync.sim import cli as sim_cli

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "NODE_STATUS_FILE", "CliError", "build_parser", "main"]


# --------------------------------------------------------------------------- parser

_TAG_HELP = "a tag: K=V for a string, K:=JSON for a number, boolean or list (repeat)"


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (its usage block would be many), naming where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="p2psync", description="Peer-to-peer replication of DWN data.")
    p.add_argument("--version", action="version", version=f"p2psync {__version__}")
    p.add_argument("--home", help="data directory (default: $P2PSYNC_HOME or the user data dir)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str,
            parent: Any = sub) -> argparse.ArgumentParser:
        sp: argparse.ArgumentParser = parent.add_parser(name, help=help_, description=help_)
        sp.set_defaults(fn=fn)
        return sp

    add("demo", cmd_demo, "run the main job on its embedded default, in a temporary directory")

    sp = add("init", cmd_init, "create an identity and a store in the data directory")
    sp.add_argument("--did-method", choices=["key", "jwk"], default="key")
    sp.add_argument("--import-key", metavar="FILE", help="use this identity file (the same tenant on a second device)")

    add("whoami", cmd_whoami, "print this node's DID")

    proto = sub.add_parser("protocol", help="protocol definitions").add_subparsers(dest="sub", required=True)
    sp = add("install", cmd_protocol_install, "install (configure) a protocol definition from a JSON file", proto)
    sp.add_argument("file")
    sp.add_argument("--store")

    sp = add("write", cmd_write, "write a record (data from --data, --file or stdin)")
    src = sp.add_mutually_exclusive_group()
    src.add_argument("--data", help="the data, as text")
    src.add_argument("--file", help="read the data from a file")
    sp.add_argument("--data-format", default="application/octet-stream")
    sp.add_argument("--schema")
    sp.add_argument("--protocol")
    sp.add_argument("--protocol-path")
    sp.add_argument("--parent-context-id")
    sp.add_argument("--recipient")
    sp.add_argument("--published", action="store_true")
    sp.add_argument("--tag", action="append", metavar="K=V", help=_TAG_HELP)
    sp.add_argument("--tenant", help="write to another tenant's DWN (default: your own)")
    sp.add_argument("--store")

    sp = add("update", cmd_update, "write a new version of a record: new data (--data, --file or stdin), "
             "tags, published; its protocol, path, schema, context and recipient stay")
    sp.add_argument("record_id")
    src = sp.add_mutually_exclusive_group()
    src.add_argument("--data", help="the new data, as text")
    src.add_argument("--file", help="read the new data from a file")
    src.add_argument("--keep-data", action="store_true", help="keep the current data (change tags, "
                     "published or format only)")
    sp.add_argument("--data-format", help="a new data format (default: the current one)")
    sp.add_argument("--tag", action="append", metavar="K=V", help=_TAG_HELP + "; replaces all the record's "
                    "tags (default: keep them)")
    pub = sp.add_mutually_exclusive_group()
    pub.add_argument("--published", dest="published", action="store_const", const=True, default=None,
                     help="publish the record")
    pub.add_argument("--unpublished", dest="published", action="store_const", const=False,
                     help="unpublish the record")
    sp.add_argument("--tenant", help="the tenant whose record it is (default: your own)")
    sp.add_argument("--store")

    sp = add("delete", cmd_delete, "delete a record (--prune: and every record under it)")
    sp.add_argument("record_id")
    sp.add_argument("--prune", action="store_true", help="delete its descendants too (a protocol's nested records)")
    sp.add_argument("--tenant", help="the tenant whose record it is (default: your own)")
    sp.add_argument("--store")

    sp = add("show", cmd_show, "a record's history: its writes and deletes, which is in force, which lost, "
             "where each came from (deleted records too)")
    sp.add_argument("record_id")
    sp.add_argument("--tenant", help="the tenant whose record it is (default: your own)")
    sp.add_argument("--store")
    sp.add_argument("--json", action="store_true", help="machine-readable output")

    sp = add("read", cmd_read, "read a record's data by recordId")
    sp.add_argument("record_id")
    sp.add_argument("--out", help="write the data to this file instead of stdout")
    sp.add_argument("--tenant")
    sp.add_argument("--store")

    sp = add("query", cmd_query, "list records")
    for flag in ("--protocol", "--protocol-path", "--schema", "--context-id", "--recipient", "--tenant", "--store"):
        sp.add_argument(flag)
    sp.add_argument("--include-deleted", action="store_true",
                    help="list deleted and pruned records too (from the archive)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")

    sp = add("serve", cmd_serve, "run this node until Ctrl-C: serve peers, and with a configuration advertise "
             "it and keep syncing (docs/operator.md)")
    sp.add_argument("--config", metavar="FILE", help="node configuration (TOML; default: $P2PSYNC_CONFIG, else none)")
    sp.add_argument("--store")
    sp.add_argument("--host", help=f"address to listen on (default {DEFAULT_HOST})")
    sp.add_argument("--port", help=f"TCP port (default {DEFAULT_PORT}; 0: any free)")
    sp.add_argument("--tls", action=argparse.BooleanOptionalAction, default=None,
                    help="serve wss:// with the certificate in the data directory (default: on unless "
                         "the host is loopback)")
    sp.add_argument("--insecure", action="store_true", default=None,
                    help="allow plain ws:// beyond loopback, serving and dialing (anyone on the network can read it)")
    sp.add_argument("--auto", action=argparse.BooleanOptionalAction, default=None,
                    help="keep syncing with discovered peers that share a tenant (default: no)")
    sp.add_argument("--discovery", action=argparse.BooleanOptionalAction, default=None,
                    help="advertise and browse with mDNS (default: on unless listening on loopback)")
    sp.add_argument("--private", action=argparse.BooleanOptionalAction, default=None,
                    help="advertise tenant DIDs hashed, not in clear (default: no)")
    sp.add_argument("--interface", action="append", metavar="IP",
                    help="address to advertise and browse on (repeat; default: the listen address)")
    sp.add_argument("--name", help="the name to advertise (default: <host name>-<start of the storeId>)")
    sp.add_argument("--peer", action="append", metavar="URL",
                    help="a peer to always sync with (repeat; replaces the configured peers)")
    sp.add_argument("--metrics-port", metavar="N", help="serve Prometheus metrics on this port (0: any free)")
    sp.add_argument("--metrics-host", metavar="H", help="address of the metrics endpoint (default 127.0.0.1)")
    sp.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="stderr log level")
    sp.add_argument("-v", "--verbose", action="store_true", help="log connections' link state changes to stderr")

    sp = add("peers", cmd_peers, "browse the LAN for p2psync nodes (mDNS) and list them")
    sp.add_argument("--wait", type=float, default=3.0, metavar="SECONDS", help="how long to browse (default 3)")
    sp.add_argument("--interface", action="append", metavar="IP", help="browse on this address only (repeat)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")

    sp = add("sync", cmd_sync_or_repair, "replicate a tenant with the peer at URL (wss://host:port/_p2psync)")
    sp.add_argument("url")
    sp.add_argument("--store")
    way = sp.add_mutually_exclusive_group()
    way.add_argument("--pull", dest="direction", action="store_const", const="pull", help="peer -> here (default)")
    way.add_argument("--push", dest="direction", action="store_const", const="push", help="here -> peer")
    way.add_argument("--both", dest="direction", action="store_const", const="both", help="both ways at once")
    sp.set_defaults(direction="pull")
    sp.add_argument("--continuous", action="store_true", help="keep replicating until Ctrl-C")
    sp.add_argument("--repair", action="store_true",
                    help="reconcile and move exactly the missing messages instead of reading the log "
                         "(exit 3 when the replicas still differ)")
    sp.add_argument("--tenant", help="the tenant to replicate (default: your own DID)")
    add_scope_flags(sp, "replicate only")
    add_transport_flags(sp)
    sp.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar on stderr (default: only when stderr is a terminal)")
    sp.add_argument("-v", "--verbose", action="store_true", help="log link state changes and retries to stderr")

    sp = add("diff", cmd_diff, "what this replica and the peer at URL each lack, changing nothing "
             "(exit 3 when they differ)")
    sp.add_argument("url")
    sp.add_argument("--store")
    sp.add_argument("--tenant", help="the tenant to compare (default: your own DID)")
    sp.add_argument("--protocol", metavar="URL", help="compare only this protocol's records")
    add_transport_flags(sp)
    sp.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    sp.add_argument("-v", "--verbose", action="store_true", help="log p2psync's info messages to stderr")

    sp = add("repair", cmd_repair, "fetch the messages a reconcile plan says this replica lacks from the peer "
             "at --peer (exit 3 when some could not be repaired)")
    sp.add_argument("--plan", required=True, help="plan directory of `p2psync pipeline reconcile`")
    sp.add_argument("--store", help="the replica's store (default: the data directory's)")
    sp.add_argument("--peer", required=True, metavar="URL", help="the peer to fetch from (wss://host:port/_p2psync)")
    add_transport_flags(sp)
    sp.add_argument("--replica", metavar="ID", help="this replica's id in the plan (default: the store's storeId)")
    sp.add_argument("--source", metavar="ID", help="only the rows whose source is this replica (default: all rows)")
    sp.add_argument("--tenant", help="only this tenant's rows")
    sp.add_argument("--protocol", metavar="URL",
                    help="open the collection with this protocol's scope (for a protocol-scoped grant)")
    sp.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar on stderr (default: only when stderr is a terminal)")
    sp.add_argument("-v", "--verbose", action="store_true", help="log p2psync's info messages to stderr")

    sp = add("status", cmd_status, "replication links, their states and checkpoints")
    sp.add_argument("--store")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--clear-not-applied", action="store_true",
                    help="empty the list of messages that did not apply (a running node's too)")

    grant = sub.add_parser("grant", help="grants to other DIDs").add_subparsers(dest="sub", required=True)
    sp = add("sync", cmd_grant_sync, "grant DID the right to sync your tenant's data (a delegated sync grant)", grant)
    sp.add_argument("did")
    sp.add_argument("--protocol", metavar="URL", help="only this protocol's records")
    sp.add_argument("--expires", metavar="TIMESTAMP", help="when the grant ends (DWN timestamp, e.g. "
                    "2030-01-01T00:00:00.000000Z)")
    sp.add_argument("--store")

    store = sub.add_parser("store", help="store tools").add_subparsers(dest="sub", required=True)
    sp = add("digest", cmd_store_digest, "print {tenant: {messages, digest}}: compare replicas", store)
    sp.add_argument("--store")
    sp.add_argument("--tenant", help="only this tenant")
    sp = add("verify", cmd_store_verify, "check that the state is the canonical state of the archive", store)
    sp.add_argument("--store")
    sp.add_argument("--tenant", help="only this tenant")
    sp.add_argument("--json", action="store_true")

    tls = sub.add_parser("tls", help="this node's TLS certificate").add_subparsers(dest="sub", required=True)
    sp = add("show", cmd_tls_show, "print the fingerprint peers pin (and the certificate's path)", tls)
    sp.add_argument("--json", action="store_true")
    add("rotate", cmd_tls_rotate, "make a new TLS key and certificate (restart serve to use it)", tls)

    dwn = sub.add_parser("dwn", help="engine tools").add_subparsers(dest="sub", required=True)
    sp = add("pipe", cmd_dwn_pipe, "JSON-lines interop pipe over stdin/stdout (protocol/interop-pipe.md)", dwn)
    sp.add_argument("--store", required=True, help="SQLite store file (created when new)")

    blip = sub.add_parser("blip", help="BLIP_3 tools").add_subparsers(dest="sub", required=True)
    sp = add("echo", cmd_blip_echo, "BLIP_3 echo peer for testing other implementations", blip)
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=0)
    sp.add_argument("--app-id", default="P2PSync_1")

    sp = add("sim", cmd_sim, "seeded multi-peer simulator: replicas must converge (docs/simulator.md)")
    sim_cli.add_arguments(sp)

    register_pipeline(sub)  # `export` and the `pipeline` group (docs/pipeline.md)
    return p


#: Options whose value may begin with "-": a certificate fingerprint is base64url, and one in
#: 64 starts with it, which argparse would take for an option ("expected one argument").
_DASH_VALUED: Final = ("--pin",)


def _attach_values(argv: Sequence[str]) -> list[str]:
    """``--pin -Xy…`` as ``--pin=-Xy…``, so a value that begins with "-" stays a value."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in _DASH_VALUED:
            value = next(args, None)
            out.append(arg if value is None else f"{arg}={value}")
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_attach_values(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.fn(args))
    except UsageError as exc:  # arguments that cannot go together: exit 2, as argparse's refusals
        print(f"p2psync: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as exc:
        print(f"p2psync: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except apsw.BusyError:
        # every store the CLI opens waits CLI_BUSY_TIMEOUT for the lock before this
        print(f"p2psync: the store is busy: another process held its write lock for {common.CLI_BUSY_TIMEOUT:g} s; "
              "try again", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
