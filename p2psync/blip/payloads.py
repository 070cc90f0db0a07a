"""What travels with a BLIP request besides the request itself: bodies, replies, responses.

The lowest layer of the RPC API: :class:`Reply` (what a handler answers), :class:`Response`
and :class:`StreamingResponse` (what our requests get back) and :class:`IncomingBody` (a body
read as it arrives). The request, its handlers and the connection live in
:mod:`p2psync.blip.rpc`, above this module; an :class:`IncomingBody` reports the bytes it
hands out through the small :class:`CreditSink` protocol, so nothing here imports them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import trio


class CreditSink(Protocol):
    """Where an :class:`IncomingBody` reports what its reader took (the connection), so the
    peer is acknowledged only for data that was consumed."""

    def _credit(self, mtype: int, number: int, size: int) -> None: ...


#: A message body: bytes, or an async iterable of byte chunks streamed under flow control.
Body = bytes | bytearray | memoryview | AsyncIterable[bytes]


@dataclass(slots=True)
class Reply:
    """What a handler answers with. ``body`` may be streamed (an async iterable of bytes)."""

    properties: Mapping[str, str] = field(default_factory=dict)
    body: Body = b""
    compress: bool = False
    urgent: bool = False


class IncomingBody:
    """The body of an incoming message, read piece by piece as it arrives.

    Iterate it (``async for chunk in body``) or call :meth:`read_all`. The sender is
    acknowledged only for what has been taken out, so a reader that stops reading stops the
    sender after one flow-control window. A chunk may be a read-only ``memoryview`` of the
    frame it came in (no copy), or ``bytes``; :meth:`read_all` gives ``bytes``.
    """

    def __init__(self, connection: CreditSink, mtype: int, number: int) -> None:
        self._connection = connection
        self._type = mtype
        self._number = number
        self._chunks: deque[tuple[bytes | memoryview, int]] = deque()
        self._complete = False
        self._error: BaseException | None = None
        self._arrived = trio.Event()
        #: Bytes received and not yet taken by the reader.
        self.buffered = 0

    def _feed(self, data: bytes | memoryview, size: int, complete: bool) -> None:
        if data or size:
            self._chunks.append((data, size))
            self.buffered += len(data)
        if complete:
            self._complete = True
        self._arrived.set()

    def _fail(self, error: BaseException) -> None:
        if not self._complete:
            self._error = error
            self._arrived.set()

    def __aiter__(self) -> AsyncIterator[bytes | memoryview]:
        return self

    async def __anext__(self) -> bytes | memoryview:
        while True:
            if self._chunks:
                data, size = self._chunks.popleft()
                self.buffered -= len(data)
                if size:
                    self._connection._credit(self._type, self._number, size)
                if data:
                    return data
                continue
            if self._complete:
                raise StopAsyncIteration
            if self._error is not None:
                raise self._error
            self._arrived = trio.Event()
            await self._arrived.wait()

    async def read_all(self, limit: int | None = None) -> bytes:
        """Read the rest of the body; raise ``ValueError`` beyond ``limit`` bytes."""
        parts: list[bytes | memoryview] = []
        total = 0
        async for chunk in self:
            total += len(chunk)
            if limit is not None and total > limit:
                raise ValueError(f"body larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)


@dataclass(slots=True)
class Response:
    """A reply to one of our requests; ``profile`` is the profile of that request."""

    profile: str
    properties: dict[str, str]
    body: bytes
    number: int
    flags: int = 0


@dataclass(slots=True)
class StreamingResponse:
    """A reply whose body is read as it arrives (see :meth:`Connection.request_stream`)."""

    profile: str
    properties: dict[str, str]
    body_stream: IncomingBody
    number: int
    flags: int = 0
