"""A peer that sends requests and does not read the replies cannot make us queue replies without
end (issue #15): past MAX_QUEUED_REPLY_BYTES it must be taking them, past
MAX_QUEUED_REPLY_BYTES_HARD it is closed at once (1008); the reader never waits for the writer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from websockets.client import ClientProtocol
from websockets.frames import CloseCode
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from p2psync.blip import Connection, Reply, Request, accept_stream, closing, rpc
from p2psync.blip.connection import BlipConnection

REPLY = 50_000  # bytes of each reply


async def big(request: Request) -> Reply:
    return Reply(body=b"r" * REPLY)


class RudeClient:
    """A raw BLIP client over a lockstep stream: the server's writes block until it reads."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = ClientProtocol(parse_uri("ws://x/"), subprotocols=[Subprotocol("BLIP_3+P2PSync_1")])
        self.core = BlipConnection()

    async def handshake(self) -> None:
        self.ws.send_request(self.ws.connect())
        await self.stream.send_all(b"".join(self.ws.data_to_send()))
        self.ws.receive_data(await self.stream.receive_some())  # the 101 response only

    async def ask(self, count: int) -> None:
        for _ in range(count):
            self.core.send_request({"Profile": "big"})
        for frame in self.core.frames_to_send(1 << 30):
            self.ws.send_binary(frame)
        await self.stream.send_all(b"".join(self.ws.data_to_send()))

    async def read_some(self) -> None:
        self.ws.receive_data(await self.stream.receive_some(1 << 20))
        self.ws.events_received()


@asynccontextmanager
async def rude_pair() -> AsyncIterator[tuple[RudeClient, list[str], Connection]]:
    """A server with the ``big`` handler and a rude client; yields the client, the list the
    server's close reason lands in and the server's connection."""
    client_stream, server_stream = trio.testing.lockstep_stream_pair()
    closed: list[str] = []
    servers: list[Connection] = []

    async def server() -> None:
        async with accept_stream(server_stream, handlers={"big": big}, ping_interval=None, idle_timeout=None) as conn:
            servers.append(conn)
            await conn.wait_closed()
            closed.append(conn.close_reason or "")
            assert conn.close_code == CloseCode.POLICY_VIOLATION

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        client = RudeClient(client_stream)
        await client.handshake()
        while not servers:
            await trio.sleep(0.01)
        yield client, closed, servers[0]
        nursery.cancel_scope.cancel()


@pytest.fixture(autouse=True)
def small_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "MAX_QUEUED_REPLY_BYTES", 4 * REPLY)
    monkeypatch.setattr(rpc, "MAX_QUEUED_REPLY_BYTES_HARD", 20 * REPLY)
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)  # it will not answer our close either


async def test_past_the_hard_cap_the_peer_is_closed_at_once(autojump_clock: trio.testing.MockClock) -> None:
    async with rude_pair() as (client, closed, _):
        with trio.move_on_after(1):
            await client.ask(30)  # 1.5 MB of replies asked for, none read
        with trio.fail_after(1):
            while not closed:
                await trio.sleep(0.01)
    assert closed[0].startswith("peer does not read our replies")


async def test_past_the_soft_cap_the_peer_must_be_reading(autojump_clock: trio.testing.MockClock) -> None:
    async with rude_pair() as (client, closed, server):
        await client.ask(10)  # 500 KB: past the soft cap, under the hard one
        await trio.sleep(rpc.UNREAD_REPLY_TIMEOUT / 2)
        assert rpc.MAX_QUEUED_REPLY_BYTES < server._core.queued_reply_bytes < rpc.MAX_QUEUED_REPLY_BYTES_HARD
        await client.ask(1)
        assert not closed  # not for long yet
        await trio.sleep(rpc.UNREAD_REPLY_TIMEOUT)
        with trio.move_on_after(1):
            await client.ask(1)  # the next request finds it has read nothing all along
        with trio.fail_after(1):
            while not closed:
                await trio.sleep(0.01)
    assert closed[0].startswith("peer does not read our replies")


async def test_a_peer_that_reads_slowly_is_not_closed(autojump_clock: trio.testing.MockClock) -> None:
    async with rude_pair() as (client, closed, server):
        await client.ask(10)  # 500 KB, of which one write (256 KiB) leaves the queue at once
        owed = []
        for _ in range(12):  # a minute, owing more than the soft cap and more, but reading
            await client.ask(6)
            await client.read_some()  # one write of the server's (256 KiB)
            await trio.sleep(rpc.UNREAD_REPLY_TIMEOUT / 2)
            owed.append(server._core.queued_reply_bytes)
        assert not closed
        assert rpc.MAX_QUEUED_REPLY_BYTES < min(owed) < max(owed) < rpc.MAX_QUEUED_REPLY_BYTES_HARD
