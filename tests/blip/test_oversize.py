"""Oversized input ends a connection at once with close code 1009 (issue #15): one WebSocket
message over the limit (it used to be dropped and the connection left to the idle timeout), or
too many bytes of BLIP messages being gathered at once (many started, none finished)."""

from __future__ import annotations

from functools import partial

import pytest
import trio
from websockets.frames import CloseCode

from p2psync import blip
from p2psync.blip import rpc
from p2psync.blip.codec import FrameEncoder
from p2psync.blip.handshake import MAX_WEBSOCKET_MESSAGE
from p2psync.blip.wire import MORE_COMING, MSG, encode_message_head
from tests.blip.rawpeer import RawPeer

APP = "Oversize"


async def served(nursery: trio.Nursery, handlers: dict[str, object]) -> tuple[int, trio.Event]:
    ended = trio.Event()

    async def on_connect(conn: blip.Connection) -> None:
        async def watch() -> None:
            await conn.wait_closed()
            ended.set()

        nursery.start_soon(watch)

    server = await nursery.start(partial(blip.serve, "127.0.0.1", 0, APP, handlers, on_connect=on_connect))
    return server.port, ended


async def test_a_message_over_the_limit_is_closed_with_1009(nursery: trio.Nursery) -> None:
    port, ended = await served(nursery, {})
    peer = await RawPeer.connect(port, APP)
    await peer.send(b"\x00" * (MAX_WEBSOCKET_MESSAGE + 1))
    close = await peer.closed_with(3)  # far below the idle timeout the old behaviour waited for
    assert close is not None and close.code == CloseCode.MESSAGE_TOO_BIG
    with trio.fail_after(3):  # a peer that never answers is cut after CLOSE_TIMEOUT (5 s)
        await ended.wait()


async def test_too_much_being_gathered_at_once_is_closed_with_1009(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rpc, "MAX_ASSEMBLING_BYTES", 256 * 1024)

    async def echo(request: blip.Request) -> blip.Reply:
        return blip.Reply(body=request.body)

    port, ended = await served(nursery, {"echo": echo})
    peer = await RawPeer.connect(port, APP)
    encoder = FrameEncoder()
    head = encode_message_head({"Profile": "echo"})
    for number in range(1, 11):  # ten messages of 64 KiB each begun, none finished: 640 KiB
        await peer.send(encoder.encode(number, MSG | MORE_COMING, head + b"\x01" * 65536))
    close = await peer.closed_with(3)
    assert close is not None and close.code == CloseCode.MESSAGE_TOO_BIG
    with trio.fail_after(3):
        await ended.wait()


async def test_a_servers_connections_together_are_bounded_too(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several connections each under their own cap must not add up: the one that pushes the
    server's total past its budget is closed with 1013, and the budget comes back when the
    others close."""
    monkeypatch.setattr(rpc, "MAX_ASSEMBLING_BYTES", 256 * 1024)

    async def echo(request: blip.Request) -> blip.Reply:
        return blip.Reply(body=request.body)

    budget = rpc.GatherBudget(limit=400 * 1024)
    server = await nursery.start(partial(blip.serve_listeners, await trio.open_tcp_listeners(0, host="127.0.0.1"),
                                         APP, {"echo": echo}))
    server.gather_budget = budget
    head = encode_message_head({"Profile": "echo"})
    first, second = await RawPeer.connect(server.port, APP), await RawPeer.connect(server.port, APP)
    encoder1, encoder2 = FrameEncoder(), FrameEncoder()
    for number in range(1, 4):  # 192 KiB begun on the first connection: under both caps
        await first.send(encoder1.encode(number, MSG | MORE_COMING, head + b"\x01" * 65536))
    with trio.fail_after(3):
        while budget.used < 3 * 65536:
            await trio.sleep(0.01)
    for number in range(1, 5):  # 256 KiB more on the second: the server's total passes 400 KiB
        await second.send(encoder2.encode(number, MSG | MORE_COMING, head + b"\x01" * 65536))
    close = await second.closed_with(3)
    assert close is not None and close.code == CloseCode.TRY_AGAIN_LATER
    await first.stream.aclose()
    with trio.fail_after(5):
        while budget.used:
            await trio.sleep(0.01)
