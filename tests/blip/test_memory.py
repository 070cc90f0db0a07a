"""In-memory BLIP connections under trio's MockClock: the real handshake, framing and timers,
with virtual time (``autojump_clock`` jumps whenever every task waits)."""

from __future__ import annotations

import logging
from functools import partial

import pytest
import trio
import trio.testing

from p2psync import blip
from p2psync.blip import Connection, ConnectionClosed, Reply, Request
from p2psync.blip.closing import CLOSE_TIMEOUT
from p2psync.blip.pumps import IDLE_TIMEOUT, PING_INTERVAL

HOURS = 3
REFUSAL = "P2PSync 403 SyncNotAuthorized"


class Valve(trio.abc.HalfCloseableStream):
    """A stream end that counts its writes and, once ``muted``, silently drops them (the peer
    behind it keeps reading but nothing it says arrives: a hung or partitioned peer)."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner
        self.muted = False
        self.writes = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1
        if self.muted:
            await trio.lowlevel.checkpoint()
            return
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if self.muted:
            await trio.lowlevel.checkpoint()
            return
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def valves() -> tuple[Valve, Valve]:
    end_a, end_b = trio.testing.memory_stream_pair()
    return Valve(end_a), Valve(end_b)


async def echo(request: Request) -> Reply:
    return Reply({"X-Len": str(len(request.body))}, request.body)


async def hang(request: Request) -> Reply:
    await trio.sleep_forever()
    raise AssertionError("unreachable")


async def test_memory_pair_runs_requests_both_ways(autojump_clock: trio.testing.MockClock) -> None:
    async def whoami(request: Request) -> Reply:
        return Reply({"Side": "a"})

    async with blip.memory_pair("P2PSync_1", {"whoami": whoami}, {"echo": echo}) as (a, b):
        assert a.is_client and not b.is_client
        assert a.subprotocol == b.subprotocol == "BLIP_3+P2PSync_1"
        reply = await a.request("echo", {"X-Note": "1"}, b"over memory")
        assert (reply.body, reply.properties) == (b"over memory", {"X-Len": "11"})
        assert (await b.request("whoami")).properties == {"Side": "a"}
    # Leaving the block closed both, normally.
    assert (a.close_code, b.close_code) == (1000, 1000)
    assert b.close_reason == "peer closed the WebSocket (1000)"


async def test_memory_pair_passes_the_block_exception_through(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with pytest.raises(KeyError, match="mine"):
        async with blip.memory_pair() as (a, b):
            raise KeyError("mine")
    assert a.closed and b.closed


async def test_keepalive_holds_an_idle_connection_open_for_hours(
    autojump_clock: trio.testing.MockClock,
) -> None:
    end_a, end_b = valves()
    async with blip.memory_pair(handlers_b={"echo": echo}, streams=(end_a, end_b)) as (a, b):
        start = trio.current_time()
        writes_before = (end_a.writes, end_b.writes)
        await trio.sleep(HOURS * 3600)
        assert trio.current_time() - start == HOURS * 3600  # virtual time really passed
        assert not a.closed and not b.closed
        # Pings went out all along (each side pings every PING_INTERVAL and answers the other's).
        pings = int(HOURS * 3600 / PING_INTERVAL)
        assert end_a.writes - writes_before[0] >= pings
        assert end_b.writes - writes_before[1] >= pings
        assert (await a.request("echo", body=b"still here")).body == b"still here"


async def test_idle_timeout_closes_when_the_peer_stops_answering_pings(
    autojump_clock: trio.testing.MockClock,
) -> None:
    end_a, end_b = valves()
    failures: list[ConnectionClosed] = []

    async def ask(conn: Connection) -> None:
        try:
            await conn.request("hang")
        except ConnectionClosed as exc:
            failures.append(exc)

    async with blip.memory_pair(handlers_b={"hang": hang}, streams=(end_a, end_b)) as (a, b):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, a)
            await trio.testing.wait_all_tasks_blocked()
            end_b.muted = True  # b still reads a's pings; its pongs never arrive
            start = trio.current_time()
            await a.wait_closed()
            waited = trio.current_time() - start
        await b.wait_closed()
    assert IDLE_TIMEOUT <= waited <= IDLE_TIMEOUT + PING_INTERVAL
    assert a.close_reason is not None and a.close_reason.startswith("idle timeout")
    assert (a.close_code, a.close_text) == (1006, "")  # no closing handshake
    (failure,) = failures
    assert failure.close_code == 1006 and "idle timeout" in failure.reason
    assert (b.close_reason, b.close_code) == ("peer closed the stream", 1006)


async def test_close_deadline_cuts_a_peer_that_never_answers_the_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    end_a, end_b = valves()
    async with blip.memory_pair(streams=(end_a, end_b)) as (a, b):
        end_b.muted = True
        start = trio.current_time()
        await a.aclose(code=1008, reason=REFUSAL)
        waited = trio.current_time() - start
        await b.wait_closed()
    assert waited == CLOSE_TIMEOUT
    assert (a.close_code, a.close_text) == (1008, REFUSAL)  # the close we began
    assert (b.close_code, b.close_text) == (1008, REFUSAL)  # it reached b; its answer got lost


async def test_serve_listeners_over_memory_with_on_connect(autojump_clock: trio.testing.MockClock) -> None:
    """The server of serve(), on_connect included, over in-memory connections."""
    greeted: list[bytes] = []

    async def greet(conn: Connection) -> None:
        reply = await conn.request("greet", body=b"hello from the server")
        greeted.append(reply.body)

    async def on_greet(request: Request) -> Reply:
        return Reply(body=b"hi back " + request.body[-6:])

    listener = blip.MemoryListener()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            partial(blip.serve_listeners, [listener], "P2PSync_1", {"echo": echo}, on_connect=greet)
        )
        assert server.listeners == [listener]
        async with (
            blip.connect_stream(await listener.connect(), handlers={"greet": on_greet}) as one,
            blip.connect_stream(await listener.connect(), handlers={"greet": on_greet}) as two,
        ):
            assert (await one.request("echo", body=b"1")).body == b"1"
            assert (await two.request("echo", body=b"2")).body == b"2"
            await trio.testing.wait_all_tasks_blocked()
            assert greeted == [b"hi back server"] * 2
            assert len(server.connections) == 2
            await trio.sleep(IDLE_TIMEOUT * 10)  # keepalive runs on both ends here too
            assert not one.closed and not two.closed
        await trio.testing.wait_all_tasks_blocked()
        assert server.connections == set()
        nursery.cancel_scope.cancel()
    # serve_listeners closed the listener on its way out.
    with pytest.raises(ConnectionRefusedError):
        await listener.connect()


async def test_serve_stream_reports_the_connection_and_failed_handshakes(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    server = blip.BlipServer(app_id="P2PSync_1", handlers={"echo": echo})
    with pytest.raises(ValueError):
        _ = server.port  # no TCP listener
    async with trio.open_nursery() as nursery:
        client_end, server_end = trio.testing.memory_stream_pair()

        async def client() -> None:
            async with blip.connect_stream(client_end) as conn:
                assert (await conn.request("echo", body=b"x")).body == b"x"

        nursery.start_soon(client)
        accepted = await nursery.start(server.serve_stream, server_end)
        assert isinstance(accepted, Connection) and not accepted.is_client
        await accepted.wait_closed()
        assert accepted.close_code == 1000

        # A client speaking another subprotocol: with nursery.start the refusal is raised...
        client_end, server_end = trio.testing.memory_stream_pair()
        nursery.start_soon(_refused_client, client_end)
        with pytest.raises(ConnectionClosed, match="refused"):
            await nursery.start(server.serve_stream, server_end)
        # ... and without it (as serve() runs it) it is only logged.
        client_end, server_end = trio.testing.memory_stream_pair()
        nursery.start_soon(_refused_client, client_end)
        with caplog.at_level(logging.INFO, logger="p2psync.blip"):
            await server.serve_stream(server_end)
        assert any("during setup" in record.getMessage() for record in caplog.records)


async def _refused_client(stream: trio.abc.Stream) -> None:
    with pytest.raises(ConnectionClosed, match="handshake"):
        async with blip.connect_stream(stream, app_id="Other_1"):
            pass


async def test_memory_listener_closes_connections_not_yet_accepted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listener = blip.MemoryListener()
    waiting = await listener.connect()
    await listener.aclose()
    assert await waiting.receive_some() == b""  # the client sees the stream end
    with pytest.raises(trio.ClosedResourceError):
        await listener.accept()
