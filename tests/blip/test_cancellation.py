"""Cancelling a BLIP connection's surroundings at any moment ends it cleanly.

Each scenario joins a client and a server over in-memory streams, with requests in flight in
both directions (answered by handlers that never return), and cancels one side, the other, or
both after a given number of scheduler checkpoints. Sweeping that number cancels during the
WebSocket handshake, while the connections start, and while they run. After each scenario:
nothing but ``Cancelled`` may have escaped (no ``RuntimeError: Nursery is closed to new
arrivals``, no exception group), every handler that started has ended, both streams are
closed, both connections report closed, and a side that was not cancelled saw its requests
fail with :class:`ConnectionClosed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import pytest
import trio
import trio.testing

from p2psync import blip
from p2psync.blip import Connection, ConnectionClosed, HandlerSpec, Reply, Request, accept_stream, connect_stream

#: Scheduler checkpoints swept before cancelling. The handshake takes about 8 of them, the
#: first handlers run by about 12, and the large requests are still crossing until about 45;
#: after that nothing moves until the cancellation.
CHECKPOINTS_SWEPT = 80
#: Requests each side sends to the other before the cancellation.
REQUESTS_PER_SIDE = 3
#: Body bytes of one of them: a few flow-control windows (128,000 bytes), so frames and ACKs
#: are still crossing while the sweep cancels.
LARGE_REQUEST = 400_000

Target = Literal["client", "server", "both"]


class TrackedStream(trio.abc.HalfCloseableStream):
    """A stream that remembers whether it was closed."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner
        self.closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        self.closed = True
        await self.inner.aclose()


@dataclass
class Side:
    """What one side of a scenario saw."""

    name: str
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    conn: Connection | None = None
    handlers_started: int = 0
    handlers_ended: int = 0
    requests_closed: list[ConnectionClosed] = field(default_factory=list)

    async def hang(self, request: Request) -> Reply:
        self.handlers_started += 1
        try:
            await trio.sleep_forever()
        finally:
            self.handlers_ended += 1
        raise AssertionError("unreachable")

    async def call(self, conn: Connection, may_close: bool, size: int = 500) -> None:
        try:
            await conn.request("hang", body=b"x" * size)
        except ConnectionClosed as exc:
            if not may_close:
                raise  # a cancelled caller must see Cancelled, not ConnectionClosed
            self.requests_closed.append(exc)

    async def use(self, conn: Connection, may_close: bool) -> None:
        self.conn = conn
        async with trio.open_nursery() as nursery:
            # One large request keeps frames and ACKs moving for a while (flow control).
            nursery.start_soon(self.call, conn, may_close, LARGE_REQUEST)
            for _ in range(REQUESTS_PER_SIDE - 1):
                nursery.start_soon(self.call, conn, may_close)
            await conn.wait_closed()


async def run_scenario(steps: int, target: Target) -> tuple[Side, Side]:
    raw_client, raw_server = trio.testing.memory_stream_pair()
    client_stream, server_stream = TrackedStream(raw_client), TrackedStream(raw_server)
    client, server = Side("client"), Side("server")
    cancelled = {"client": [client], "server": [server], "both": [client, server]}[target]
    # A side that is not cancelled may see its requests fail with ConnectionClosed.
    client_may_close = client not in cancelled
    server_may_close = server not in cancelled

    async def run_client() -> None:
        with client.scope:
            try:
                async with connect_stream(client_stream, handlers={"hang": client.hang}) as conn:
                    await client.use(conn, client_may_close)
            except ConnectionClosed:
                # The server was cancelled during the handshake.
                assert client_may_close

    async def run_server() -> None:
        with server.scope:
            try:
                async with accept_stream(server_stream, handlers={"hang": server.hang}) as conn:
                    await server.use(conn, server_may_close)
            except ConnectionClosed:
                assert server_may_close

    with trio.fail_after(60):  # virtual seconds: every scenario ends at once
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_server)
            nursery.start_soon(run_client)
            for _ in range(steps):
                await trio.lowlevel.checkpoint()
            for side in cancelled:
                side.scope.cancel()

    assert client_stream.closed and server_stream.closed
    for side in (client, server):
        assert side.handlers_started == side.handlers_ended, side.name
        if side.conn is not None:
            assert side.conn.closed, side.name
            with trio.fail_after(1):
                await side.conn.wait_closed()
    return client, server


@pytest.mark.parametrize("target", ["client", "server", "both"])
async def test_cancelling_at_any_moment_is_clean(
    target: Target, autojump_clock: trio.testing.MockClock
) -> None:
    phases: set[str] = set()
    peers_saw_close = 0
    for steps in range(CHECKPOINTS_SWEPT):
        try:
            client, server = await run_scenario(steps, target)
        except BaseException as exc:
            raise AssertionError(f"cancelling {target} after {steps} checkpoints: {exc!r}") from exc
        running = client.handlers_started + server.handlers_started
        phases.add("handshake" if client.conn is None and server.conn is None else
                   "requests" if running else "starting")
        # A cancelled connection is cut, with no closing handshake; both ends report so.
        for side in (client, server):
            if side.conn is not None:
                assert side.conn.close_code == 1006, (steps, side.name, side.conn.close_reason)
                if target in (side.name, "both"):
                    assert side.conn.close_reason == "cancelled", (steps, side.name)
        survivor = {"client": server, "server": client, "both": None}[target]
        if survivor is not None and survivor.requests_closed:
            peers_saw_close += 1
            for closed in survivor.requests_closed:
                assert (closed.close_code, closed.close_text) == (1006, ""), (steps, closed.reason)
    # The sweep went through every phase, and survivors saw the close most of the time.
    assert phases == {"handshake", "starting", "requests"}
    if target != "both":
        assert peers_saw_close > CHECKPOINTS_SWEPT // 2


async def test_cancelling_serve_with_live_connections_is_clean() -> None:
    """serve's per-connection tasks end cleanly when serve is cancelled mid-request (over
    loopback TCP, so on the real clock)."""
    started: list[int] = []
    ended: list[int] = []

    async def hang(request: Request) -> Reply:
        started.append(1)
        try:
            await trio.sleep_forever()
        finally:
            ended.append(1)
        raise AssertionError("unreachable")

    closed_errors: list[ConnectionClosed] = []

    async def call(conn: Connection) -> None:
        try:
            await conn.request("hang")
        except ConnectionClosed as exc:
            closed_errors.append(exc)

    with trio.fail_after(60):
        async with trio.open_nursery() as outer:
            serve_scope = trio.CancelScope()
            server = await outer.start(_serve_in_scope, serve_scope, {"hang": hang})
            url = f"ws://127.0.0.1:{server.port}/"

            async def client() -> None:
                async with blip.connect(url) as conn, trio.open_nursery() as calls:
                    for _ in range(REQUESTS_PER_SIDE):
                        calls.start_soon(call, conn)
                    await conn.wait_closed()

            async with trio.open_nursery() as clients:
                for _ in range(3):
                    clients.start_soon(client)
                while len(started) < 3 * REQUESTS_PER_SIDE:
                    await trio.sleep(0.01)
                serve_scope.cancel()
    assert len(started) == len(ended) == 3 * REQUESTS_PER_SIDE
    assert len(closed_errors) == 3 * REQUESTS_PER_SIDE


async def _serve_in_scope(
    scope: trio.CancelScope,
    handlers: Mapping[str, HandlerSpec],
    *,
    task_status: trio.TaskStatus[blip.BlipServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        await blip.serve("127.0.0.1", 0, handlers=handlers, task_status=task_status)


async def test_cancelling_a_memory_server_at_any_moment_is_clean(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """serve's accept loop and per-connection tasks (over in-memory connections), cancelled
    after every number of checkpoints: clients connecting, handshaking, with requests in
    flight both ways (on_connect calls the client back)."""
    outcomes: set[str] = set()
    for steps in range(CHECKPOINTS_SWEPT):
        server_side, client_side = Side("server"), Side("client")
        listener = blip.MemoryListener()
        serve_scope = trio.CancelScope()

        async def on_connect(conn: Connection, server_side: Side = server_side) -> None:
            await server_side.call(conn, may_close=False)  # cancelled with the server

        async def run_server(listener: blip.MemoryListener = listener, scope: trio.CancelScope = serve_scope,
                             server_side: Side = server_side) -> None:
            with scope:
                try:
                    await blip.serve_listeners([listener], handlers={"hang": server_side.hang}, on_connect=on_connect)
                finally:
                    # serve_listeners closes it, unless cancelled before it began.
                    await trio.aclose_forcefully(listener)

        async def run_client(listener: blip.MemoryListener = listener, client_side: Side = client_side) -> None:
            try:
                stream = await listener.connect()
            except ConnectionRefusedError:
                outcomes.add("refused")
                return
            try:
                async with connect_stream(stream, handlers={"hang": client_side.hang}) as conn:
                    await client_side.use(conn, may_close=True)
                outcomes.add("closed while running")
            except ConnectionClosed:
                outcomes.add("closed during handshake")

        try:
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(run_server)
                    for _ in range(2):
                        nursery.start_soon(run_client)
                    for _ in range(steps):
                        await trio.lowlevel.checkpoint()
                    serve_scope.cancel()
        except BaseException as exc:
            raise AssertionError(f"cancelling the server after {steps} checkpoints: {exc!r}") from exc
        for side in (server_side, client_side):
            assert side.handlers_started == side.handlers_ended, (steps, side.name)
    assert outcomes >= {"closed during handshake", "closed while running"}


async def test_a_cancelled_caller_sees_cancelled_not_connection_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """When a request's caller is cancelled, Cancelled wins over ConnectionClosed (which
    would otherwise escape the cancelled nursery as a stray error)."""
    hang = Side("server").hang
    async with blip.memory_pair(handlers_b={"hang": hang}) as (a, _):
        # The reply fails and the caller is cancelled before it resumes.
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.request, "hang")
                await trio.testing.wait_all_tasks_blocked()
                a._shutdown("gone")  # fails the waiting request (wakes its caller)...
                scope.cancel()  # ... whose scope is cancelled before it runs again
        assert scope.cancelled_caught
    # A request begun in a cancelled scope on a closed connection.
    with trio.CancelScope() as scope:
        scope.cancel()
        await a.request("hang")
    assert scope.cancelled_caught
    with pytest.raises(ConnectionClosed):
        await a.request("hang")
