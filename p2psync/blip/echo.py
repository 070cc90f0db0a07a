"""``p2psync blip echo``: a BLIP test peer that other implementations can run against.

Profiles (any request path is accepted):

- ``echo``: replies with the request body and property ``X-Len`` = body length; the reply is
  compressed when the request carries ``X-Compress: 1``;
- ``fail``: replies with an ERR, domain :data:`FAIL_DOMAIN`, code :data:`FAIL_CODE` and a text
  body (a request may choose others with ``X-Error-Domain`` / ``X-Error-Code``);
- ``callme``: replies, then sends the caller a request of its own with Profile ``hello``;
- anything else: BLIP 404.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import trio

from p2psync.blip.errors import BlipError
from p2psync.blip.handshake import DEFAULT_APP_ID, BlipServer, serve
from p2psync.blip.payloads import Reply
from p2psync.blip.rpc import HandlerSpec, Request
from p2psync.blip.wire import subprotocol_for

log = logging.getLogger("p2psync.blip.echo")

#: Error domain and code of the ``fail`` profile's ERR reply (arbitrary, but fixed so other
#: implementations can assert on them).
FAIL_DOMAIN = "EchoTest"
FAIL_CODE = 418
FAIL_MESSAGE = "failure requested by the caller"
#: Port the echo peer listens on unless told otherwise.
DEFAULT_PORT = 4985
#: Body of the ``hello`` request that ``callme`` sends back.
HELLO_BODY = b"hello from the echo peer"


async def handle_echo(request: Request) -> Reply:
    """Profile ``echo``: the body back, its length in ``X-Len``."""
    return Reply(
        {"X-Len": str(len(request.body))},
        request.body,
        compress=request.properties.get("X-Compress") == "1",
    )


async def handle_fail(request: Request) -> Reply:
    """Profile ``fail``: always an ERR reply."""
    domain = request.properties.get("X-Error-Domain", FAIL_DOMAIN)
    try:
        code = int(request.properties.get("X-Error-Code", FAIL_CODE))
    except ValueError:
        code = FAIL_CODE
    raise BlipError(domain, code, FAIL_MESSAGE)


async def handle_callme(request: Request) -> None:
    """Profile ``callme``: reply first, then ask the caller ``hello`` over the same connection."""
    await request.respond(Reply({"X-Callback": "hello"}))
    try:
        reply = await request.connection.request("hello", {"X-From": "echo"}, HELLO_BODY)
        log.info("hello answered with %d bytes", len(reply.body))
    except BlipError as exc:
        log.info("hello refused: %s", exc)


ECHO_HANDLERS: dict[str, HandlerSpec] = {
    "echo": handle_echo,
    "fail": handle_fail,
    "callme": handle_callme,
}


async def run_echo_server(
    host: str,
    port: int,
    app_id: str = DEFAULT_APP_ID,
    *,
    task_status: trio.TaskStatus[BlipServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the echo profiles on ``host:port`` until cancelled."""
    await serve(host, port, app_id, ECHO_HANDLERS, task_status=task_status)


def add_cli(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``blip echo`` to a parent parser's subcommands; ``args.func(args)`` runs it."""
    blip = subparsers.add_parser("blip", help="BLIP_3 tools")
    blip_commands = blip.add_subparsers(dest="blip_command", required=True)
    echo = blip_commands.add_parser(
        "echo", help="run a BLIP echo peer (profiles echo, fail, callme) for interop tests"
    )
    echo.add_argument("--host", default="127.0.0.1", help="address to listen on")
    echo.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (0: any free port)")
    echo.add_argument(
        "--app-id",
        default=DEFAULT_APP_ID,
        help=f"subprotocol is BLIP_3+<app id> (default {DEFAULT_APP_ID})",
    )
    echo.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    """Run the echo peer from parsed arguments; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server: BlipServer = await nursery.start(
                run_echo_server, args.host, args.port, args.app_id
            )
            print(
                f"BLIP echo peer listening on ws://{args.host}:{server.port}/ "
                f"(subprotocol {subprotocol_for(args.app_id)})",
                flush=True,
            )

    try:
        trio.run(main)
    except BaseException as exc:
        if _find(exc, KeyboardInterrupt) is not None:
            return 0
        error = _find(exc, OSError)
        if error is None:
            raise
        print(
            f"p2psync blip echo: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr
        )
        return 1
    return 0


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of ``kind`` in ``exc`` or, for a group, anywhere inside it."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


def main(
    argv: Sequence[str] | None = None,
    *,
    host: str | None = None,
    port: int | None = None,
    app_id: str | None = None,
) -> int:
    """Run the echo peer; returns the exit code.

    Either from command-line words (``python -m p2psync.blip.echo [--host H] [--port P]
    [--app-id ID]``) or, as ``p2psync blip echo`` calls it, from keyword arguments.
    """
    if host is not None or port is not None or app_id is not None:
        return run_cli(
            argparse.Namespace(
                host=host or "127.0.0.1",
                port=DEFAULT_PORT if port is None else port,
                app_id=app_id or DEFAULT_APP_ID,
            )
        )
    parser = argparse.ArgumentParser(prog="p2psync")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["blip", "echo", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
