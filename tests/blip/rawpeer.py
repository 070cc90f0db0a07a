"""A raw WebSocket peer for adversarial BLIP tests: websockets' sans-I/O client over a trio TCP
stream, sending whatever bytes a test wants and reading the close it gets back."""

from __future__ import annotations

import contextlib

import trio
from websockets.client import ClientProtocol
from websockets.frames import Close
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from p2psync.blip.wire import subprotocol_for


class RawPeer:
    def __init__(self, stream: trio.SocketStream, ws: ClientProtocol) -> None:
        self.stream = stream
        self.ws = ws

    @classmethod
    async def connect(cls, port: int, app_id: str, *, local_address: str | None = None) -> RawPeer:
        """``local_address``: another loopback address (127.0.0.x) to come from, as another host would."""
        stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=local_address)
        ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/_blip"),
                            subprotocols=[Subprotocol(subprotocol_for(app_id))])
        peer = cls(stream, ws)
        ws.send_request(ws.connect())
        await peer.flush()
        with trio.fail_after(5):
            while not any(isinstance(e, Response) for e in await peer.read()):
                pass
        return peer

    async def flush(self) -> None:
        for chunk in self.ws.data_to_send():
            if chunk:
                await self.stream.send_all(chunk)

    async def read(self) -> list[object]:
        data = await self.stream.receive_some(65536)
        if not data:
            self.ws.receive_eof()
            return []
        self.ws.receive_data(data)
        return list(self.ws.events_received())

    async def send(self, message: bytes) -> None:
        self.ws.send_binary(message)
        await self.flush()

    async def closed_with(self, seconds: float) -> Close | None:
        """Read until the other side's close frame (or EOF) within ``seconds``; answer it, hang up."""
        with trio.move_on_after(seconds):
            while self.ws.close_rcvd is None and not self.ws.eof_sent:
                await self.read()
        close = self.ws.close_rcvd
        with contextlib.suppress(trio.BrokenResourceError):
            await self.flush()
        await self.stream.aclose()
        return close
