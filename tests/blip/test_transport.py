"""BLIP connections on trio over in-memory streams: deterministic protocol behaviour."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio
import trio.testing
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from p2psync import blip
from p2psync.blip import (
    BlipError,
    ConnectionClosed,
    Reply,
    Request,
    accept_stream,
    closing,
    connect_stream,
    pumps,
    rpc,
    streaming,
)
from p2psync.blip.connection import BlipConnection, MessageStart
from p2psync.blip.pumps import IDLE_TIMEOUT, PING_INTERVAL
from p2psync.blip.rpc import STREAM_LOW_WATER
from p2psync.blip.wire import BIG_FRAME_SIZE, MAX_UNACKED_BYTES, MSG, RPY

from .conftest import connected_pair


class CountingStream(trio.abc.HalfCloseableStream):
    """A stream that counts the bytes written through it."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner
        self.bytes_sent = 0
        self.writes: list[bytes] = []  # each send_all's data, in order

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.bytes_sent += len(data)
        self.writes.append(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def echo(request: Request) -> Reply:
    return Reply({"X-Len": str(len(request.body))}, request.body)


async def test_request_and_reply() -> None:
    async with connected_pair(server_handlers={"echo": echo}) as (client, server):
        reply = await client.request("echo", {"X-Test": "1"}, b"hello")
        assert reply.body == b"hello"
        assert reply.properties == {"X-Len": "5"}
        assert reply.profile == "echo"
        assert client.subprotocol == server.subprotocol == "BLIP_3+P2PSync_1"


async def test_either_side_sends_requests() -> None:
    async def whoami(request: Request) -> Reply:
        return Reply({"Side": "client"})

    async with connected_pair(client_handlers={"whoami": whoami}) as (client, server):
        reply = await server.request("whoami")
        assert reply.properties == {"Side": "client"}


async def test_error_reply_raises_typed_blip_error() -> None:
    async def refuse(request: Request) -> Reply:
        raise BlipError("Dwn", 409, "conflict: already there")

    async with connected_pair(server_handlers={"refuse": refuse}) as (client, _):
        with pytest.raises(BlipError) as info:
            await client.request("refuse")
        assert (info.value.domain, info.value.code) == ("Dwn", 409)
        assert info.value.message == "conflict: already there"


async def test_unknown_profile_is_blip_404() -> None:
    async with connected_pair() as (client, _):
        with pytest.raises(BlipError) as info:
            await client.request("nothing-here")
        assert (info.value.domain, info.value.code) == ("BLIP", 404)


async def test_handler_failure_is_blip_501_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(request: Request) -> Reply:
        raise RuntimeError("secret internal detail")

    async with connected_pair(server_handlers={"broken": broken}) as (client, _):
        with (
            caplog.at_level(logging.ERROR, logger="p2psync.blip"),
            pytest.raises(BlipError) as info,
        ):
            await client.request("broken")
        assert (info.value.domain, info.value.code) == ("BLIP", 501)
        assert "secret" not in info.value.message and "Traceback" not in info.value.message
        # ... while our own log keeps the traceback.
        assert any("secret internal detail" in r.getMessage() or r.exc_info for r in caplog.records)
        # The connection is still usable.
        with pytest.raises(BlipError):
            await client.request("broken")


async def test_no_reply_requests_reach_the_handler() -> None:
    seen: list[bytes] = []
    arrived = trio.Event()

    async def note(request: Request) -> Reply:
        assert request.no_reply
        seen.append(request.body)
        arrived.set()
        return Reply(body=b"ignored")

    async with connected_pair(server_handlers={"note": note}) as (client, _):
        await client.send_no_reply("note", {"k": "v"}, b"payload")
        await arrived.wait()
        assert seen == [b"payload"]


async def test_compressed_and_urgent_requests() -> None:
    got: list[tuple[bool, bool]] = []

    async def look(request: Request) -> Reply:
        got.append((request.compressed, request.urgent))
        return Reply(body=request.body * 2, compress=True)

    async with connected_pair(server_handlers={"look": look}) as (client, _):
        body = b"compress me " * 5000
        reply = await client.request("look", body=body, compress=True, urgent=True)
        assert reply.body == body * 2
        assert got == [(True, True)]


async def test_large_message_round_trips_in_many_frames() -> None:
    body = os.urandom(3 * 1024 * 1024)
    async with connected_pair(server_handlers={"echo": echo}) as (client, _):
        reply = await client.request("echo", body=body)
        assert reply.body == body


async def test_large_and_small_messages_interleave() -> None:
    """A 10 MiB request and 1,000 small ones at once: the small ones finish first."""
    big = os.urandom(10 * 1024 * 1024)
    small_done: list[int] = []
    big_progress_when_small_done: list[tuple[int, int, bool] | None] = []

    async with connected_pair(server_handlers={"echo": echo}) as (client, _):
        big_reply: list[bytes] = []

        async def send_big() -> None:
            big_reply.append((await client.request("echo", body=big)).body)

        async def send_small(i: int) -> None:
            reply = await client.request("echo", body=str(i).encode())
            assert reply.body == str(i).encode()
            small_done.append(i)
            if len(small_done) == 1000:
                # The large request (message 1) is still being sent at this point.
                big_progress_when_small_done.append(client._core.outgoing_progress(MSG, 1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_big)
            while client._core.outgoing_progress(MSG, 1) is None:  # until it has begun
                await trio.sleep(0)
            for i in range(1000):
                nursery.start_soon(send_small, i)
        assert big_reply == [big]
    assert sorted(small_done) == list(range(1000))
    (progress,) = big_progress_when_small_done
    assert progress is not None, "the large request had finished before the small ones"
    sent, _, _ = progress
    assert 0 < sent < len(big)


async def test_stalled_peer_pauses_the_sender_at_the_window() -> None:
    """A peer that stops reading: the sender stops at 128,000 unacknowledged bytes and
    pulls no more of a streamed body than the window plus a little."""
    raw_client, server_stream = trio.testing.memory_stream_pair()
    client_stream = CountingStream(raw_client)
    produced = 0

    async def source() -> AsyncIterator[bytes]:
        nonlocal produced
        for _ in range(1000):  # up to 64 MiB, far more than may be pulled
            produced += 65536
            yield b"s" * 65536

    async def stalled_server() -> None:
        # Completes the WebSocket handshake, then never reads again.
        ws = ServerProtocol(subprotocols=["BLIP_3+P2PSync_1"])  # type: ignore[list-item]
        while True:
            ws.receive_data(await server_stream.receive_some())
            events = ws.events_received()
            if events:
                ws.send_response(ws.accept(events[0]))  # type: ignore[arg-type]
                await server_stream.send_all(b"".join(ws.data_to_send()))
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stalled_server)
        async with connect_stream(client_stream, ping_interval=None) as client:
            nursery.start_soon(client.send_no_reply, "upload", None, source())
            await trio.testing.wait_all_tasks_blocked()
            progress = client._core.outgoing_progress(MSG, 1)
            assert progress is not None
            sent, acked, paused = progress
            assert paused and acked == 0
            assert MAX_UNACKED_BYTES < sent <= MAX_UNACKED_BYTES + BIG_FRAME_SIZE
            # Memory stays bounded: the source was pulled about one window's worth.
            assert produced <= MAX_UNACKED_BYTES + BIG_FRAME_SIZE + STREAM_LOW_WATER + 65536
            assert client_stream.bytes_sent < MAX_UNACKED_BYTES + 2 * BIG_FRAME_SIZE
            nursery.cancel_scope.cancel()


async def test_replies_to_a_burst_leave_before_the_whole_burst_is_handled() -> None:
    """Requests that arrive in one read are handed to handlers in slices, so the first
    replies are written while later requests are still being handled. (Answering a whole
    read in one write makes two busy peers take turns instead of working at once.)"""
    raw_client, raw_server = trio.testing.memory_stream_pair()
    server_stream = CountingStream(raw_server)
    burst = 4 * pumps.FRAMES_PER_SLICE

    async def server() -> None:
        async with accept_stream(server_stream, handlers={"echo": echo}, ping_interval=None) as conn:
            await conn.wait_closed()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        ws = ClientProtocol(parse_uri("ws://x/"), subprotocols=["BLIP_3+P2PSync_1"])  # type: ignore[list-item]
        ws.send_request(ws.connect())
        await raw_client.send_all(b"".join(ws.data_to_send()))
        ws.receive_data(await raw_client.receive_some())  # the 101 response only
        ws.events_received()
        core = BlipConnection()
        for index in range(burst):
            core.send_request({"Profile": "echo"}, b"%03d" % index + b"x" * 497)
        for frame in core.frames_to_send(1 << 30):
            ws.send_binary(frame)
        await raw_client.send_all(b"".join(ws.data_to_send()))  # the whole burst at once
        await trio.testing.wait_all_tasks_blocked()
        # Decode what the server wrote, one write at a time (the first is the handshake).
        replies_per_write: list[int] = []
        for chunk in server_stream.writes[1:]:
            ws.receive_data(chunk)
            replies = 0
            for received in ws.events_received():
                assert isinstance(received, Frame)
                for event in core.receive_message(received.data):
                    if isinstance(event, MessageStart) and event.type == RPY and event.complete:
                        replies += 1
            replies_per_write.append(replies)
        await raw_client.aclose()  # the server sees the stream end and stops
    assert sum(replies_per_write) == burst
    # At most two slices' replies can be ready when the writer first runs.
    assert replies_per_write[0] <= 2 * pumps.FRAMES_PER_SLICE < burst


async def test_streaming_request_handler_and_streaming_reply() -> None:
    received: list[int] = []

    async def upload(request: Request) -> Reply:
        assert request.body_stream is not None
        total = 0
        async for chunk in request.body_stream:
            total += len(chunk)
        received.append(total)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(40):
                yield b"d" * 50_000

        return Reply({"Total": str(total)}, chunks())

    async def body() -> AsyncIterator[bytes]:
        for _ in range(30):
            yield os.urandom(100_000)

    async with connected_pair(server_handlers={"upload": streaming(upload)}) as (client, _):
        async with client.request_stream("upload", body=body()) as reply:
            assert reply.properties == {"Total": "3000000"}
            sizes = [len(chunk) async for chunk in reply.body_stream]
        assert sum(sizes) == 2_000_000 and len(sizes) > 10
        assert received == [3_000_000]


async def test_streaming_reader_that_stops_pauses_the_sender() -> None:
    gate = trio.Event()
    started = trio.Event()
    consumed = 0

    async def slow(request: Request) -> None:
        nonlocal consumed
        assert request.body_stream is not None
        started.set()
        await gate.wait()
        async for chunk in request.body_stream:
            consumed += len(chunk)

    async with connected_pair(server_handlers={"slow": streaming(slow)}) as (client, server):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.request, "slow", None, b"x" * 2_000_000)
            await started.wait()
            await trio.testing.wait_all_tasks_blocked()
            sent, acked, paused = client._core.outgoing_progress(MSG, 1) or (0, 0, False)
            assert paused
            assert sent - acked > MAX_UNACKED_BYTES
            assert sent < 2 * MAX_UNACKED_BYTES + BIG_FRAME_SIZE
            gate.set()
        assert consumed == 2_000_000


async def test_oversized_message_is_blip_413() -> None:
    async with connected_pair(server_handlers={"echo": echo}, max_message_size=100_000) as (
        client,
        _,
    ):
        with pytest.raises(BlipError) as info:
            await client.request("echo", body=b"x" * 300_000)
        assert info.value.code == 413
        assert (await client.request("echo", body=b"ok")).body == b"ok"


async def test_request_inside_handler_and_early_respond() -> None:
    calls: list[str] = []

    async def hello(request: Request) -> Reply:
        calls.append(request.profile)
        return Reply(body=b"hi back")

    async def callme(request: Request) -> None:
        await request.respond(Reply({"Then": "hello"}))
        reply = await request.connection.request("hello", body=b"hi")
        calls.append(reply.body.decode())

    async with connected_pair(
        client_handlers={"hello": hello}, server_handlers={"callme": callme}
    ) as (client, _):
        reply = await client.request("callme")
        assert reply.properties == {"Then": "hello"}
        with trio.fail_after(5):
            while len(calls) < 2:
                await trio.sleep(0.01)
        assert calls == ["hello", "hi back"]


async def test_clean_close_fails_pending_requests() -> None:
    release = trio.Event()

    async def hang(request: Request) -> Reply:
        await release.wait()
        return Reply()

    outcome: list[BaseException] = []
    async with connected_pair(server_handlers={"hang": hang}) as (client, server):

        async def call() -> None:
            try:
                await client.request("hang")
            except ConnectionClosed as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()
            await server.aclose()
        assert server.closed and client.closed
        assert client.close_reason == "peer closed the WebSocket (1000)"
        with pytest.raises(ConnectionClosed):
            await client.request("hang")
    assert len(outcome) == 1


async def test_block_exception_is_not_wrapped_in_a_group() -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()

    async def server() -> None:
        async with accept_stream(server_stream) as conn:
            await conn.wait_closed()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        with pytest.raises(KeyError):
            async with connect_stream(client_stream) as client:
                raise KeyError("mine")
        assert client.closed


async def test_text_message_closes_with_protocol_error() -> None:
    async with connected_pair() as (client, server):
        server._ws.send_frame(Frame(Opcode.TEXT, b"not blip"))
        server._wake_writer()
        await client.wait_closed()
        assert client.close_reason is not None and "text" in client.close_reason
        await server.wait_closed()
        assert server._ws.close_rcvd is not None and server._ws.close_rcvd.code == 1002


async def test_wrong_subprotocol_is_refused() -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()

    async def server() -> None:
        with pytest.raises(ConnectionClosed):
            async with accept_stream(server_stream, app_id="Other_1"):
                pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        with pytest.raises(ConnectionClosed, match="handshake"):
            async with connect_stream(client_stream, app_id="P2PSync_1"):
                pass


async def test_pings_keep_a_live_connection_open(autojump_clock: trio.testing.MockClock) -> None:
    async with connected_pair(server_handlers={"echo": echo}) as (client, _):
        await trio.sleep(10 * IDLE_TIMEOUT)
        assert not client.closed
        assert (await client.request("echo", body=b"still here")).body == b"still here"


async def test_idle_timeout_drops_a_silent_peer(autojump_clock: trio.testing.MockClock) -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()

    async def mute_server() -> None:
        # Handshake, then read everything and answer nothing (not even pongs).
        ws = ServerProtocol(subprotocols=["BLIP_3+P2PSync_1"])  # type: ignore[list-item]
        ws.receive_data(await server_stream.receive_some())
        ws.send_response(ws.accept(ws.events_received()[0]))  # type: ignore[arg-type]
        await server_stream.send_all(b"".join(ws.data_to_send()))
        while await server_stream.receive_some():
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(mute_server)
        start = trio.current_time()
        async with connect_stream(client_stream) as client:
            await client.wait_closed()
            assert client.close_reason is not None and "idle timeout" in client.close_reason
            elapsed = trio.current_time() - start
            assert IDLE_TIMEOUT <= elapsed <= IDLE_TIMEOUT + PING_INTERVAL + 1
        nursery.cancel_scope.cancel()


async def test_handler_can_be_added_after_connecting() -> None:
    async with connected_pair() as (client, server):
        server.set_handler("late", echo)
        assert (await client.request("late", body=b"x")).body == b"x"
        server.set_handler("late", None)
        with pytest.raises(BlipError):
            await client.request("late")


def test_public_api_names() -> None:
    assert blip.DEFAULT_APP_ID == "P2PSync_1"
    assert blip.subprotocol_for("CBMobile_3") == "BLIP_3+CBMobile_3"
    assert State.OPEN  # websockets' state enum is what the transport checks


async def test_peer_that_never_reads_replies_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests keep coming but the peer reads nothing: our replies pile up to a cap, then
    the connection closes (the reader itself never waits for the writer)."""
    monkeypatch.setattr(rpc, "MAX_QUEUED_MESSAGES_HARD", 50)
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)  # it will not answer our close either
    client_stream, server_stream = trio.testing.lockstep_stream_pair()
    closed: list[str | None] = []

    async def server() -> None:
        async with accept_stream(server_stream, handlers={"echo": echo}) as conn:
            await conn.wait_closed()
            closed.append(conn.close_reason)

    async def rude_client() -> None:
        ws = ClientProtocol(parse_uri("ws://x/"), subprotocols=["BLIP_3+P2PSync_1"])  # type: ignore[list-item]
        ws.send_request(ws.connect())
        await client_stream.send_all(b"".join(ws.data_to_send()))
        ws.receive_data(await client_stream.receive_some())  # the 101 response only
        core = BlipConnection()
        for _ in range(10):  # batch after batch, while never reading a reply
            for _ in range(20):
                core.send_request({"Profile": "echo"}, b"x" * 100)
            for frame in core.frames_to_send(1 << 30):
                ws.send_binary(frame)
            await client_stream.send_all(b"".join(ws.data_to_send()))
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        nursery.start_soon(rude_client)
        with trio.fail_after(30):
            while not closed:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert closed == ["peer sends requests but does not read replies"]


async def test_server_on_connect_can_call_the_client_at_once() -> None:
    """serve's on_connect runs on a connection that is already running (it may start tasks
    and send requests before the client says anything)."""
    greeted = trio.Event()
    got: list[bytes] = []

    async def greet(conn: blip.Connection) -> None:
        reply = await conn.request("greet", {}, b"hello from the server")
        got.append(reply.body)

    async def on_greet(request: blip.Request) -> blip.Reply:
        greeted.set()
        return blip.Reply(body=b"hi back")

    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(blip.serve, "127.0.0.1", 0, "P2PSync_1", {}, on_connect=greet))
        async with blip.connect(f"ws://127.0.0.1:{server.port}/", app_id="P2PSync_1",
                                handlers={"greet": on_greet}):
            with trio.fail_after(10):
                await greeted.wait()
                while not got:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert got == [b"hi back"]
