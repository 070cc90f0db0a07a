"""Oversized input ends a connection at once with close code 1009 (issue #15): one WebSocket
message over the limit (it used to be dropped and the connection left to the idle timeout), or
too many bytes of BLIP messages being gathered at once (many started, none finished)."""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any

import pytest
import trio
from websockets.frames import CloseCode, Frame, Opcode

from p2psync import blip
from p2psync.blip import rpc
from p2psync.blip.codec import FrameDecoder, FrameEncoder
from p2psync.blip.handshake import MAX_WEBSOCKET_MESSAGE
from p2psync.blip.rpc import inflated_frame_limit
from p2psync.blip.wire import (
    COMPRESSED,
    ERR,
    MORE_COMING,
    MSG,
    RPY,
    TYPE_MASK,
    decode_properties,
    decode_uvarint,
    encode_message_head,
)
from tests.blip.rawpeer import RawPeer

APP = "Oversize"


async def served(nursery: trio.Nursery, handlers: dict[str, object], **options: Any) -> tuple[int, trio.Event]:
    ended = trio.Event()

    async def on_connect(conn: blip.Connection) -> None:
        async def watch() -> None:
            await conn.wait_closed()
            ended.set()

        nursery.start_soon(watch)

    server = await nursery.start(partial(blip.serve, "127.0.0.1", 0, APP, handlers, on_connect=on_connect,
                                         **options))
    return server.port, ended


async def replies(peer: RawPeer, decoder: FrameDecoder, count: int) -> list[tuple[int, int, dict[str, str]]]:
    """The next ``count`` replies' (type, number, properties), each read from its first frame."""
    out: list[tuple[int, int, dict[str, str]]] = []
    with trio.fail_after(10):
        while len(out) < count:
            for event in await peer.read():
                if isinstance(event, Frame) and event.opcode is Opcode.BINARY:
                    number, flags, body, _ = decoder.decode(event.data)
                    if flags & TYPE_MASK in (RPY, ERR):
                        length, pos = decode_uvarint(body)
                        out.append((flags & TYPE_MASK, number, decode_properties(body[pos:pos + length])))
    return out


async def echo(request: blip.Request) -> blip.Reply:
    return blip.Reply(body=request.body)


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


#: The message limit of the servers below, small so that the tests move little.
LIMIT = 1024 * 1024


async def test_a_message_is_limited_in_inflated_bytes_across_its_frames(nursery: trio.Nursery) -> None:
    """Each compressed frame inflates to well under the frame limit, yet the message passes the
    message limit counted after inflating: 413, and the connection goes on."""
    port, _ = await served(nursery, {"echo": echo}, max_message_size=LIMIT)
    peer = await RawPeer.connect(port, APP)
    encoder = FrameEncoder()
    head = encode_message_head({"Profile": "echo"})
    await peer.send(encoder.encode(1, MSG | MORE_COMING | COMPRESSED, head + bytes(300_000)))
    for _ in range(5):  # 1.8 MB inflated from a few KB
        await peer.send(encoder.encode(1, MSG | MORE_COMING | COMPRESSED, bytes(300_000)))
    await peer.send(encoder.encode(1, MSG | COMPRESSED, b"end"))
    await peer.send(encoder.encode(2, MSG, head + b"still there"))
    assert await replies(peer, FrameDecoder(), 2) == [
        (ERR, 1, {"Error-Domain": "BLIP", "Error-Code": "413"}),
        (RPY, 2, {}),
    ]


@pytest.mark.parametrize("more", [True, False], ids=["first-of-many", "single"])
async def test_one_frame_over_the_message_limit_is_refused_ungathered(nursery: trio.Nursery, more: bool) -> None:
    """A compressed frame can stand for 16 MiB: the limit holds from the first frame (it used to
    be checked from the second one on, so a first frame was gathered whole)."""
    server = await nursery.start(partial(blip.serve_listeners, await trio.open_tcp_listeners(0, host="127.0.0.1"),
                                         APP, {"echo": echo}, max_message_size=LIMIT))
    peer = await RawPeer.connect(server.port, APP)
    encoder = FrameEncoder()
    head = encode_message_head({"Profile": "echo"})
    flags = MSG | COMPRESSED | (MORE_COMING if more else 0)
    await peer.send(encoder.encode(1, flags, head + bytes(LIMIT + 1)))
    assert await replies(peer, FrameDecoder(), 1) == [(ERR, 1, {"Error-Domain": "BLIP", "Error-Code": "413"})]
    assert server.gather_budget.used == 0


async def test_a_frame_inflating_past_what_a_message_can_hold_is_fatal(nursery: trio.Nursery) -> None:
    """Before hello a peer takes 256 KiB messages: a frame inflating to 16 MiB (which the
    reference limit per frame allows) is a deflate bomb there, and closes the connection."""
    port, ended = await served(nursery, {"echo": echo}, max_message_size=LIMIT)
    peer = await RawPeer.connect(port, APP)
    frame = FrameEncoder().encode(1, MSG | COMPRESSED, encode_message_head({"Profile": "echo"}) + bytes(2 * LIMIT))
    assert inflated_frame_limit(LIMIT) < 2 * LIMIT < inflated_frame_limit(rpc.MAX_MESSAGE_SIZE)
    await peer.send(frame)
    close = await peer.closed_with(3)
    assert close is not None and close.code == CloseCode.PROTOCOL_ERROR and "inflates beyond" in close.reason
    with trio.fail_after(3):
        await ended.wait()


async def test_the_gathering_cap_follows_the_message_limit(nursery: trio.Nursery) -> None:
    """A connection that takes smaller messages (a peer's, until hello) gathers at most
    ASSEMBLING_MESSAGES of them at once, not 128 MiB."""
    port, ended = await served(nursery, {"echo": echo}, max_message_size=LIMIT)
    peer = await RawPeer.connect(port, APP)
    encoder = FrameEncoder()
    head = encode_message_head({"Profile": "echo"})
    frames = [encoder.encode(n, MSG | MORE_COMING | COMPRESSED, head + bytes(LIMIT - 100)) for n in range(1, 10)]
    close = None
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        for frame in frames[: rpc.ASSEMBLING_MESSAGES + 1]:
            await peer.send(frame)
    close = await peer.closed_with(3)
    assert close is not None and close.code == CloseCode.MESSAGE_TOO_BIG
    assert str(rpc.ASSEMBLING_MESSAGES * LIMIT) in close.reason
    with trio.fail_after(3):
        await ended.wait()
