"""What a BLIP user handles: requests, responses, replies and streamed bodies."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from p2psync.blip.errors import ConnectionClosed
from p2psync.blip.wire import COMPRESSED, NO_REPLY, PROFILE_PROPERTY, URGENT

if TYPE_CHECKING:
    from p2psync.blip.transport import Connection

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
    sender after one flow-control window.
    """

    def __init__(self, connection: Connection, mtype: int, number: int) -> None:
        self._connection = connection
        self._type = mtype
        self._number = number
        self._chunks: deque[tuple[bytes, int]] = deque()
        self._complete = False
        self._error: BaseException | None = None
        self._arrived = trio.Event()
        #: Bytes received and not yet taken by the reader.
        self.buffered = 0

    def _feed(self, data: bytes, size: int, complete: bool) -> None:
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

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
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
        parts: list[bytes] = []
        total = 0
        async for chunk in self:
            total += len(chunk)
            if limit is not None and total > limit:
                raise ValueError(f"body larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)


class Request:
    """An incoming request, as a handler sees it.

    ``body`` holds the whole body, except for a :func:`streaming` handler, which reads
    ``body_stream`` instead. ``connection`` is the connection it came over, so a handler can
    send requests back to the peer.
    """

    __slots__ = ("connection", "number", "properties", "body", "body_stream", "flags", "_replied")

    def __init__(
        self,
        connection: Connection,
        number: int,
        properties: dict[str, str],
        body: bytes,
        flags: int,
        body_stream: IncomingBody | None = None,
    ) -> None:
        self.connection = connection
        self.number = number
        self.properties = properties
        self.body = body
        self.body_stream = body_stream
        self.flags = flags
        self._replied = False

    @property
    def profile(self) -> str:
        """The ``Profile`` property ("" when absent)."""
        return self.properties.get(PROFILE_PROPERTY, "")

    @property
    def no_reply(self) -> bool:
        """True when the sender wants no reply."""
        return bool(self.flags & NO_REPLY)

    @property
    def urgent(self) -> bool:
        return bool(self.flags & URGENT)

    @property
    def compressed(self) -> bool:
        """True when the request arrived compressed."""
        return bool(self.flags & COMPRESSED)

    @property
    def replied(self) -> bool:
        """True once a reply (or error) was sent, or when none is wanted."""
        return self._replied or self.no_reply

    async def respond(self, reply: Reply | None = None) -> None:
        """Send the reply now, before the handler returns (what it returns is then ignored).

        Does nothing for a no-reply request. Raises ``RuntimeError`` on a second reply.
        """
        if self._replied:
            raise RuntimeError(f"request #{self.number} was already answered")
        self._replied = True
        if not self.no_reply:
            await self.connection._send_reply(self.number, reply or Reply())

    def respond_error(self, domain: str, code: int, message: str = "") -> None:
        """Send an ERR reply now (raising :class:`BlipError` from the handler does the same)."""
        if self._replied:
            raise RuntimeError(f"request #{self.number} was already answered")
        self._replied = True
        if not self.no_reply:
            self.connection._send_error(self.number, domain, code, message)

    def __repr__(self) -> str:
        return f"<Request #{self.number} {self.properties} ({len(self.body)} bytes)>"


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


#: A request handler: gets the request, returns the reply (``None``: an empty reply) or
#: raises :class:`~p2psync.blip.errors.BlipError` for an ERR reply.
Handler = Callable[[Request], Awaitable[Reply | None]]


@dataclass(frozen=True, slots=True)
class StreamingHandler:
    """A handler that runs as soon as a request's properties arrive and reads its body from
    ``request.body_stream`` (wrap a handler with :func:`streaming`)."""

    handler: Handler


HandlerSpec = Handler | StreamingHandler


def streaming(handler: Handler) -> StreamingHandler:
    """Mark a handler as streaming: it reads ``request.body_stream`` as data arrives."""
    return StreamingHandler(handler)


def closed_error(reason: str | None) -> ConnectionClosed:
    """The exception pending operations get when their connection ends."""
    return ConnectionClosed(reason or "connection closed")
