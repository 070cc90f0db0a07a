"""A WebSocket message over the limit ends the connection at once with close code 1009.

Issue #15: such a message used to be dropped and the connection left to the idle timeout. A raw
WebSocket client (websockets' sans-I/O protocol over a trio TCP stream) stands in for a hostile
peer: it sends one binary message one byte over the limit and must read a close frame with 1009
within a second or two, and the server must end the connection.
"""

from __future__ import annotations

from functools import partial

import trio
from websockets.client import ClientProtocol
from websockets.frames import CloseCode
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from p2psync import blip
from p2psync.blip.handshake import MAX_WEBSOCKET_MESSAGE
from p2psync.blip.wire import subprotocol_for

APP = "Oversize"


async def _read_until(stream: trio.SocketStream, ws: ClientProtocol, done: object) -> list[object]:
    events: list[object] = []
    while not any(isinstance(e, done) for e in events):  # type: ignore[arg-type]
        data = await stream.receive_some(65536)
        if not data:
            ws.receive_eof()
            break
        ws.receive_data(data)
        events.extend(ws.events_received())
        for chunk in ws.data_to_send():
            if chunk:
                await stream.send_all(chunk)
    return events


async def test_a_message_over_the_limit_is_closed_with_1009(nursery: trio.Nursery) -> None:
    ended = trio.Event()

    async def on_connect(conn: blip.Connection) -> None:
        async def watch() -> None:
            await conn.wait_closed()
            ended.set()

        nursery.start_soon(watch)

    server = await nursery.start(partial(blip.serve, "127.0.0.1", 0, APP, {}, on_connect=on_connect))
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{server.port}/_blip"),
                        subprotocols=[Subprotocol(subprotocol_for(APP))])
    ws.send_request(ws.connect())
    for chunk in ws.data_to_send():
        await stream.send_all(chunk)
    with trio.fail_after(5):
        await _read_until(stream, ws, Response)
    ws.send_binary(b"\x00" * (MAX_WEBSOCKET_MESSAGE + 1))
    for chunk in ws.data_to_send():
        if chunk:
            await stream.send_all(chunk)
    with trio.fail_after(3):  # far below the idle timeout the old behaviour waited for
        while ws.close_rcvd is None:
            data = await stream.receive_some(65536)
            if not data:
                break
            ws.receive_data(data)
            ws.events_received()
    assert ws.close_rcvd is not None and ws.close_rcvd.code == CloseCode.MESSAGE_TOO_BIG
    for chunk in ws.data_to_send():  # our half of the closing handshake
        if chunk:
            await stream.send_all(chunk)
    await stream.aclose()  # as a client does once the server has closed its side
    with trio.fail_after(3):  # a peer that never answers is cut after CLOSE_TIMEOUT (5 s)
        await ended.wait()
