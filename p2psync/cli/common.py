"""What every ``p2psync`` command shares: the one-line error, exit codes, and opening the data
directory (its identity and store) from the parsed arguments."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from p2psync.cli.home import Home, HomeError, default_home
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.store import Store

__all__ = [
    "CLI_BUSY_TIMEOUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "NODE_STATUS_FILE",
    "CliError",
    "UsageError",
    "check_reply",
    "home_of",
    "load_identity",
    "open_node",
    "open_store",
    "print_json",
    "read_data",
    "authored",
]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
#: The running node's status (p2psync/node), in its data directory; `peers` reads it.
NODE_STATUS_FILE: Final = "node-status.json"
#: Seconds a command waits for the store's write lock while another process (the device's
#: `p2psync serve`, applying a peer's batch) writes: a node's turns are short (a group commit
#: of at most 256 messages or 32 MiB of record data, ~0.1 s of small messages) but may come
#: back to back for as long as a large catch-up lasts.
CLI_BUSY_TIMEOUT: Final = 60.0


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


class UsageError(CliError):
    """Arguments that cannot go together (a rule argparse cannot express): one line, exit code 2,
    as argparse's own refusals."""


def home_of(args: argparse.Namespace) -> Home:
    """The data directory: ``--home``, else ``$P2PSYNC_HOME`` or the user data directory."""
    return Home(Path(args.home) if args.home else default_home())


def load_identity(args: argparse.Namespace) -> Identity:
    """This node's identity, from the data directory."""
    try:
        return home_of(args).load_identity()
    except HomeError as exc:
        raise CliError(str(exc)) from None


def open_node(args: argparse.Namespace) -> tuple[Identity, Dwn]:
    """(identity, Dwn) of the data directory; the store may be overridden with --store."""
    home = home_of(args)
    try:
        identity = home.load_identity()
    except HomeError as exc:
        raise CliError(str(exc)) from None
    store_path = Path(args.store) if getattr(args, "store", None) else home.store_path
    try:
        return identity, Dwn(Store(store_path, busy_timeout=CLI_BUSY_TIMEOUT))
    except DwnError as exc:
        raise CliError(f"cannot open {store_path}: {exc}") from None


def _store_path(args: argparse.Namespace) -> Path:
    return Path(args.store) if getattr(args, "store", None) else Path(home_of(args).store_path)


def open_store(args: argparse.Namespace, *, must_exist: bool) -> Store:
    """The node's Store (or --store's); ``must_exist``: refuse rather than create a new file."""
    path = _store_path(args)
    if must_exist and not path.exists():
        hint = "" if getattr(args, "store", None) else "; run `p2psync init` first"
        raise CliError(f"no store at {path}{hint}")
    try:
        return Store(path, busy_timeout=CLI_BUSY_TIMEOUT)
    except DwnError as exc:
        raise CliError(f"cannot open {path}: {exc}") from None


def check_reply(reply: Any, what: str) -> None:
    """Refuse a DWN reply that is not ok, with its code and detail."""
    if reply.code == 503 and str(reply.detail).startswith("StoreBusy"):
        raise CliError(f"{what} not done: the store is busy ({reply.detail.removeprefix('StoreBusy: ')})")
    if not reply.ok:
        raise CliError(f"{what} refused ({reply.code}): {reply.detail}")


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def read_data(args: argparse.Namespace) -> bytes:
    """The data of ``--data`` (text), ``--file`` or else stdin."""
    if args.data is not None:
        return str(args.data).encode("utf-8")
    if args.file is not None:
        try:
            return Path(args.file).read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    return sys.stdin.buffer.read()


_T = TypeVar("_T")


def authored(make: Callable[[], _T]) -> _T:
    """A message authored from the command line; one the DWN rules refuse is a one-line error
    with the reference's code (e.g. an invalid --schema URL), not a traceback."""
    try:
        return make()
    except DwnError as exc:
        raise CliError(f"cannot author the message: {exc}") from None
