"""The ``p2psync`` command.

Every failure a user can cause ends in one line on stderr saying what was wrong and what to
do, and a non-zero exit code; no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from p2psync import __version__

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: The running node's status (p2psync/node), in its data directory; `peers` reads it.
NODE_STATUS_FILE = "node-status.json"


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


# --------------------------------------------------------------------------- helpers


def _home(args: argparse.Namespace) -> Any:
    from p2psync.home import Home, default_home

    return Home(Path(args.home) if args.home else default_home())


def _open_node(args: argparse.Namespace) -> tuple[Any, Any]:
    """(identity, Dwn) of the data directory; the store may be overridden with --store."""
    from p2psync.dwn.engine import Dwn
    from p2psync.dwn.store import Store
    from p2psync.home import HomeError

    home = _home(args)
    try:
        identity = home.load_identity()
    except HomeError as exc:
        raise CliError(str(exc)) from None
    store_path = Path(args.store) if getattr(args, "store", None) else home.store_path
    return identity, Dwn(Store(store_path))


def _identity(args: argparse.Namespace) -> Any:
    from p2psync.home import HomeError

    try:
        return _home(args).load_identity()
    except HomeError as exc:
        raise CliError(str(exc)) from None


def _store_path(args: argparse.Namespace) -> Path:
    return Path(args.store) if getattr(args, "store", None) else Path(_home(args).store_path)


def _open_store(args: argparse.Namespace, *, must_exist: bool) -> Any:
    """The node's Store (or --store's); ``must_exist``: refuse rather than create a new file."""
    from p2psync.dwn.errors import DwnError
    from p2psync.dwn.store import Store

    path = _store_path(args)
    if must_exist and not path.exists():
        hint = "" if getattr(args, "store", None) else "; run `p2psync init` first"
        raise CliError(f"no store at {path}{hint}")
    try:
        return Store(path)
    except DwnError as exc:
        raise CliError(f"cannot open {path}: {exc}") from None


def _check(reply: Any, what: str) -> None:
    if not reply.ok:
        raise CliError(f"{what} refused ({reply.code}): {reply.detail}")


def _read_data(args: argparse.Namespace) -> bytes:
    if args.data is not None:
        return str(args.data).encode("utf-8")
    if args.file is not None:
        try:
            return Path(args.file).read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    return sys.stdin.buffer.read()


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


# --------------------------------------------------------------------------- commands


def cmd_init(args: argparse.Namespace) -> int:
    from p2psync.dwn.did import Identity
    from p2psync.dwn.store import Store
    from p2psync.home import HomeError

    home = _home(args)
    if args.import_key:
        try:
            identity = Identity.from_jwk(json.loads(Path(args.import_key).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"cannot import key from {args.import_key}: {exc}") from None
    else:
        identity = Identity.generate(args.did_method)
    try:
        home.init(identity)
    except HomeError as exc:
        raise CliError(str(exc)) from None
    Store(home.store_path).close()
    print(f"initialised {home.path}")
    print(f"did: {identity.did}")
    return EXIT_OK


def cmd_whoami(args: argparse.Namespace) -> int:
    identity, dwn = _open_node(args)
    dwn.close()
    print(identity.did)
    return EXIT_OK


def cmd_protocol_install(args: argparse.Namespace) -> int:
    from p2psync.dwn.protocols import ProtocolsConfigure

    try:
        definition = json.loads(Path(args.file).read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read protocol definition {args.file}: {exc}") from None
    identity, dwn = _open_node(args)
    try:
        message = ProtocolsConfigure.create(definition=definition, signer=identity).message
        reply = dwn.process_message(identity.did, message)
        _check(reply, "protocol install")
    finally:
        dwn.close()
    print(f"installed {definition.get('protocol')} ({reply.code})")
    return EXIT_OK


def cmd_write(args: argparse.Namespace) -> int:
    from p2psync.dwn.encoding import message_cid
    from p2psync.dwn.records_write import RecordsWrite

    data = _read_data(args)
    identity, dwn = _open_node(args)
    try:
        write = RecordsWrite.create(
            signer=identity,
            data=data,
            data_format=args.data_format,
            schema=args.schema,
            protocol=args.protocol,
            protocol_path=args.protocol_path,
            parent_context_id=args.parent_context_id,
            recipient=args.recipient,
            published=True if args.published else None,
        )
        reply = dwn.process_message(args.tenant or identity.did, write.message, data)
        _check(reply, "write")
    finally:
        dwn.close()
    out = {
        "recordId": write.record_id,
        "messageCid": message_cid(write.message),
        "dataCid": write.descriptor["dataCid"],
        "dataSize": len(data),
        "status": reply.code,
    }
    if "contextId" in write.message:
        out["contextId"] = write.message["contextId"]
    _print_json(out)
    return EXIT_OK


def cmd_read(args: argparse.Namespace) -> int:
    from p2psync.dwn.records import create_records_read

    identity, dwn = _open_node(args)
    try:
        message = create_records_read(signer=identity, filter={"recordId": args.record_id})
        reply = dwn.process_message(args.tenant or identity.did, message)
        _check(reply, "read")
    finally:
        dwn.close()
    assert reply.data is not None
    if args.out:
        Path(args.out).write_bytes(reply.data)
        print(f"wrote {len(reply.data)} bytes to {args.out}")
    else:
        sys.stdout.buffer.write(reply.data)
        sys.stdout.buffer.flush()
    return EXIT_OK


def cmd_query(args: argparse.Namespace) -> int:
    from p2psync.dwn.encoding import message_cid
    from p2psync.dwn.records import ALL_RECORDS_FILTER, create_records_query

    flt: dict[str, Any] = {}
    for key, value in (("protocol", args.protocol), ("protocolPath", args.protocol_path), ("schema", args.schema),
                       ("contextId", args.context_id), ("recipient", args.recipient)):
        if value is not None:
            flt[key] = value
    identity, dwn = _open_node(args)
    try:
        message = create_records_query(signer=identity, filter=flt or ALL_RECORDS_FILTER)
        reply = dwn.process_message(args.tenant or identity.did, message)
        _check(reply, "query")
    finally:
        dwn.close()
    rows = []
    for e in reply.entries or []:
        d = e["descriptor"]
        stored = {k: v for k, v in e.items() if k not in ("encodedData", "initialWrite")}
        rows.append({"recordId": e["recordId"], "messageCid": message_cid(stored), "dataSize": d["dataSize"],
                     "dataFormat": d["dataFormat"], "protocolPath": d.get("protocolPath"),
                     "dateCreated": d["dateCreated"]})
    if args.json:
        _print_json(rows)
    else:
        for r in rows:
            print(f"{r['recordId']}  {r['dataSize']:>9} B  {r['dataFormat']:<28} {r['protocolPath'] or '-'}")
        print(f"{len(rows)} record(s)")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from p2psync import cli_sync
    from p2psync.dwn.errors import DwnError
    from p2psync.dwn.store import Store
    from p2psync.home import Home, HomeError, default_home
    from p2psync.node.config import ConfigError, load_config

    flags = {
        "data_dir": args.home, "store": args.store, "host": args.host, "port": args.port, "auto": args.auto,
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
    except HomeError as exc:
        raise CliError(str(exc)) from None
    store_path = config.store or home.store_path
    try:
        store = Store(store_path)
    except DwnError as exc:
        raise CliError(f"cannot open {store_path}: {exc}") from None
    quiet = cli_sync.log_to_stderr(args.verbose, level=config.log_level)
    try:
        return cli_sync.run_serve(store, identity, config, status_path=home.path / NODE_STATUS_FILE)
    except cli_sync.CliFailure as exc:
        raise CliError(str(exc)) from None
    finally:
        quiet()
        store.close()


def cmd_peers(args: argparse.Namespace) -> int:
    from p2psync.home import Home, default_home
    from p2psync.node import browse

    home = Home(Path(args.home) if args.home else default_home())
    try:
        return browse.run_peers(wait=args.wait, as_json=args.json, interfaces=args.interface,
                                status_path=home.path / NODE_STATUS_FILE)
    except browse.PeersFailure as exc:
        raise CliError(str(exc)) from None


def _remote_command(args: argparse.Namespace) -> tuple[Any, bool]:
    """What ``sync`` and ``repair`` check first: this node's identity, a ``--tenant`` that is a
    DID, and whether to draw a progress bar."""
    identity = _identity(args)
    if args.tenant is not None and not args.tenant.startswith("did:"):
        raise CliError(f"--tenant {args.tenant} is not a DID")
    # A bar only where a person watches (or when asked): a pipe or a log file gets the summary.
    progress = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    return identity, progress


def cmd_sync(args: argparse.Namespace) -> int:
    from p2psync import cli_sync

    identity, progress = _remote_command(args)
    store = _open_store(args, must_exist=False)
    quiet = cli_sync.log_to_stderr(args.verbose)
    try:
        return cli_sync.run_sync(
            store, identity, args.url, tenant=args.tenant or identity.did, protocol=args.protocol,
            direction=args.direction, continuous=args.continuous, progress=progress, as_json=args.json,
        )
    except cli_sync.CliFailure as exc:
        raise CliError(str(exc)) from None
    finally:
        quiet()
        store.close()


def cmd_repair(args: argparse.Namespace) -> int:
    from p2psync import cli_repair, cli_sync

    identity, progress = _remote_command(args)
    store = _open_store(args, must_exist=True)
    quiet = cli_sync.log_to_stderr(args.verbose)
    try:
        return cli_repair.run_repair(
            store, identity, args.plan, args.peer, replica=args.replica, source=args.source, tenant=args.tenant,
            protocol=args.protocol, progress=progress, as_json=args.json,
        )
    except cli_sync.CliFailure as exc:
        raise CliError(str(exc)) from None
    except ModuleNotFoundError as exc:  # the plan is Parquet: pyarrow comes with the pipeline extra
        from p2psync.extras import missing_pipeline_module

        advice = missing_pipeline_module(exc)
        if advice is None:
            raise
        raise CliError(f"PipelineNotInstalled: {advice}") from None
    finally:
        quiet()
        store.close()


def cmd_status(args: argparse.Namespace) -> int:
    from p2psync import cli_sync

    store = _open_store(args, must_exist=True)
    try:
        report = cli_sync.status_report(store)
    finally:
        store.close()
    if args.json:
        _print_json(report)
    else:
        print("\n".join(cli_sync.status_lines(report)))
    return EXIT_OK


def cmd_grant_sync(args: argparse.Namespace) -> int:
    from p2psync import cli_sync

    identity = _identity(args)
    store = _open_store(args, must_exist=False)
    try:
        records = cli_sync.grant_sync(store, identity, args.did, protocol=args.protocol, expires=args.expires)
    except cli_sync.CliFailure as exc:
        raise CliError(str(exc)) from None
    finally:
        store.close()
    _print_json({"grantor": identity.did, "grantee": args.did, "records": records})
    return EXIT_OK


def cmd_store_digest(args: argparse.Namespace) -> int:
    from p2psync.state.digest import store_digest

    store = _open_store(args, must_exist=True)
    try:
        digest = store_digest(store, args.tenant)
    finally:
        store.close()
    _print_json(digest)
    return EXIT_OK


def cmd_dwn_pipe(args: argparse.Namespace) -> int:
    from p2psync.dwn.pipe import run_pipe

    return run_pipe(args.store)


def cmd_demo(args: argparse.Namespace) -> int:
    from p2psync.demo import run_demo

    return run_demo()


def cmd_blip_echo(args: argparse.Namespace) -> int:
    from p2psync.blip.echo import main as echo_main

    return int(echo_main(host=args.host, port=args.port, app_id=args.app_id) or 0)


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="p2psync", description="Peer-to-peer replication of DWN data.")
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
    sp.add_argument("--tenant", help="write to another tenant's DWN (default: your own)")
    sp.add_argument("--store")

    sp = add("read", cmd_read, "read a record's data by recordId")
    sp.add_argument("record_id")
    sp.add_argument("--out", help="write the data to this file instead of stdout")
    sp.add_argument("--tenant")
    sp.add_argument("--store")

    sp = add("query", cmd_query, "list records")
    for flag in ("--protocol", "--protocol-path", "--schema", "--context-id", "--recipient", "--tenant", "--store"):
        sp.add_argument(flag)
    sp.add_argument("--json", action="store_true", help="machine-readable output")

    from p2psync.cli_sync import DEFAULT_HOST, DEFAULT_PORT

    sp = add("serve", cmd_serve, "run this node until Ctrl-C: serve peers, and with a configuration advertise "
             "it and keep syncing (docs/operator.md)")
    sp.add_argument("--config", metavar="FILE", help="node configuration (TOML; default: $P2PSYNC_CONFIG, else none)")
    sp.add_argument("--store")
    sp.add_argument("--host", help=f"address to listen on (default {DEFAULT_HOST})")
    sp.add_argument("--port", help=f"TCP port (default {DEFAULT_PORT}; 0: any free)")
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

    sp = add("sync", cmd_sync, "replicate a tenant with the peer at URL (ws://host:port/_p2psync)")
    sp.add_argument("url")
    sp.add_argument("--store")
    way = sp.add_mutually_exclusive_group()
    way.add_argument("--pull", dest="direction", action="store_const", const="pull", help="peer -> here (default)")
    way.add_argument("--push", dest="direction", action="store_const", const="push", help="here -> peer")
    way.add_argument("--both", dest="direction", action="store_const", const="both", help="both ways at once")
    sp.set_defaults(direction="pull")
    sp.add_argument("--continuous", action="store_true", help="keep replicating until Ctrl-C")
    sp.add_argument("--tenant", help="the tenant to replicate (default: your own DID)")
    sp.add_argument("--protocol", metavar="URL", help="replicate only this protocol's records")
    sp.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar on stderr (default: only when stderr is a terminal)")
    sp.add_argument("-v", "--verbose", action="store_true", help="log link state changes and retries to stderr")

    sp = add("repair", cmd_repair, "fetch the messages a reconcile plan says this replica lacks from the peer "
             "at --peer (exit 3 when some could not be repaired)")
    sp.add_argument("--plan", required=True, help="plan directory of `p2psync pipeline reconcile`")
    sp.add_argument("--store", help="the replica's store (default: the data directory's)")
    sp.add_argument("--peer", required=True, metavar="URL", help="the peer to fetch from (ws://host:port/_p2psync)")
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

    dwn = sub.add_parser("dwn", help="engine tools").add_subparsers(dest="sub", required=True)
    sp = add("pipe", cmd_dwn_pipe, "JSON-lines interop pipe over stdin/stdout (protocol/interop-pipe.md)", dwn)
    sp.add_argument("--store", required=True, help="SQLite store file (created when new)")

    blip = sub.add_parser("blip", help="BLIP_3 tools").add_subparsers(dest="sub", required=True)
    sp = add("echo", cmd_blip_echo, "BLIP_3 echo peer for testing other implementations", blip)
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=0)
    sp.add_argument("--app-id", default="P2PSync_1")

    from p2psync.pipeline.cli import register as register_pipeline

    register_pipeline(sub)  # `export` and the `pipeline` group (docs/pipeline.md)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except CliError as exc:
        print(f"p2psync: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
