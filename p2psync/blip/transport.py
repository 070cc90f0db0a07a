"""BLIP over WebSockets on trio: a thin adapter around two sans-I/O state machines.

websockets' sans-I/O protocol (``ClientProtocol`` / ``ServerProtocol``) does the WebSocket
framing and :class:`~p2psync.blip.connection.BlipConnection` does BLIP. Each connection runs
three tasks in its own nursery:

- the reader: receives bytes, feeds both state machines, dispatches complete requests to
  handler tasks and replies to waiting callers, a slice of frames at a time so that replies
  to the first requests of a read go out while later ones are handled. It never waits on a
  write;
- the writer, the only task that writes to the stream: woken by an event, it drains every
  frame the state machines have (up to a batch) into one ``send_all``;
- the keepalive: WebSocket pings at an interval and an idle timeout above it.

Handlers run in tasks of the same nursery; at most :data:`MAX_CONCURRENT_HANDLERS` at a time
(beyond that the reader stops reading, which pushes back on the peer through TCP).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, NoReturn

import trio
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake, InvalidState
from websockets.frames import CloseCode, Opcode
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.protocol import Protocol, State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from p2psync.blip.connection import (
    BlipConnection,
    ConnectionState,
    Event,
    FrameIgnored,
    MessageData,
    MessageFailed,
    MessageStart,
    describe_event,
)
from p2psync.blip.errors import BLIP_ERROR_DOMAIN, BlipError, ConnectionClosed, ProtocolError
from p2psync.blip.lifecycle import (
    CLOSED,
    CONNECTING,
    MAX_CLOSE_REASON_BYTES,
    Lifecycle,
    check_close,
    describe_close,
    peer_close_reason,
    truncate_utf8,
)
from p2psync.blip.payloads import Body, IncomingBody, Reply, Response, StreamingResponse
from p2psync.blip.wire import (
    COMPRESSED,
    ERR,
    ERROR_CODE_PROPERTY,
    ERROR_DOMAIN_PROPERTY,
    MAX_UNACKED_BYTES,
    MSG,
    NO_REPLY,
    PROFILE_PROPERTY,
    RPY,
    URGENT,
)

log = logging.getLogger("p2psync.blip")

#: Our application id; the WebSocket subprotocol is ``BLIP_3+`` followed by it.
DEFAULT_APP_ID = "P2PSync_1"
#: BLIP_3's subprotocol prefix (Couchbase Mobile: ``BLIP_3+CBMobile_3``).
SUBPROTOCOL_PREFIX = "BLIP_3+"

#: Seconds between WebSocket pings. Short enough for NAT and LAN idle timers (typically
#: 60 s and more), long enough to cost nothing.
PING_INTERVAL = 20.0
#: Seconds without any byte from the peer (a pong counts) after which the connection is
#: dropped: three missed pings.
IDLE_TIMEOUT = 60.0
#: Seconds to wait for the peer's side of the closing handshake before cutting the stream.
CLOSE_TIMEOUT = 5.0
#: Seconds allowed for TCP connect plus the WebSocket opening handshake.
HANDSHAKE_TIMEOUT = 10.0
#: Bytes asked of the socket per read. 64 KiB keeps a read (and the ACKs it triggers) well
#: under one flow-control window, so ACKs go out while the sender still has room.
RECEIVE_SIZE = 64 * 1024
#: WebSocket frames the reader handles before it lets other tasks run (handlers, the
#: writer). Measured with tests/bench/bench_blip.py: with a whole read (64 requests of
#: 500 bytes) handled at once, the two peers alternated and each sat idle half the time.
FRAMES_PER_SLICE = 16
#: Bytes of frames the writer gathers per write: a batch per wake-up, but short enough that
#: ACKs and small messages never wait behind a long write.
WRITE_BATCH = 256 * 1024
#: Largest WebSocket message accepted: 64 times the largest frame a reference peer sends.
MAX_WEBSOCKET_MESSAGE = 1024 * 1024
#: Default largest incoming message assembled in memory; beyond it a request gets BLIP 413
#: and a reply fails locally. Stream larger bodies (:func:`streaming`).
MAX_MESSAGE_SIZE = 64 * 1024 * 1024
#: Handler tasks allowed at once per connection before the reader pauses.
MAX_CONCURRENT_HANDLERS = 1024
#: Outgoing messages (requests) queued per connection before ``request()`` waits.
MAX_QUEUED_MESSAGES = 4096
#: Outgoing messages queued beyond which the peer is taken for broken: it keeps sending us
#: requests but does not read our replies. The reader never waits for the writer (that can
#: deadlock two peers that both wait), so this cap is what bounds the memory such a peer costs.
MAX_QUEUED_MESSAGES_HARD = 4 * MAX_QUEUED_MESSAGES
#: A streamed outgoing body is pulled from its source only while less than this is queued.
STREAM_LOW_WATER = 64 * 1024
#: A streamed incoming body buffers at most this much unread before we call the peer
#: broken: an honest sender stops at the window (128,000 bytes) plus one frame.
STREAM_BUFFER_LIMIT = 4 * MAX_UNACKED_BYTES

# BLIP error codes follow HTTP's (BLIP_3 spec; BLIP-Cpp uses 404 and 501 the same way).
NOT_FOUND = 404
TOO_LARGE = 413
HANDLER_FAILED = 501
BAD_REPLY = 502


def subprotocol_for(app_id: str) -> str:
    """The WebSocket subprotocol for an application id, e.g. ``BLIP_3+P2PSync_1``."""
    return SUBPROTOCOL_PREFIX + app_id


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


class _Waiter:
    """A caller waiting for the reply to one of its requests."""

    __slots__ = ("profile", "done", "response", "error", "streaming", "stream_start")

    def __init__(self, profile: str, streaming: bool) -> None:
        self.profile = profile
        self.done = trio.Event()
        self.response: Response | None = None
        self.error: BaseException | None = None
        self.streaming = streaming
        self.stream_start: StreamingResponse | None = None


class _Assembly:
    """An incoming message whose body is being gathered in memory."""

    __slots__ = ("start", "parts", "size")

    def __init__(self, start: MessageStart) -> None:
        self.start = start
        self.parts = [start.body]
        self.size = len(start.body)


class Connection:
    """A BLIP_3 connection over a WebSocket. Either side may send requests.

    Get one from :func:`connect` (client) or :func:`serve` / ``on_connect`` (server), over
    any trio stream from :func:`connect_stream` / :func:`accept_stream`, or two joined in
    memory from :func:`~p2psync.blip.memory.memory_pair`.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        websocket: Protocol,
        *,
        app_id: str,
        handlers: Mapping[str, HandlerSpec] | None = None,
        is_client: bool,
        ping_interval: float | None = PING_INTERVAL,
        idle_timeout: float | None = IDLE_TIMEOUT,
        max_message_size: int = MAX_MESSAGE_SIZE,
        name: str = "",
    ) -> None:
        if ping_interval is not None and idle_timeout is not None and idle_timeout <= ping_interval:
            raise ValueError("idle_timeout must be longer than ping_interval")
        self.app_id = app_id
        self.is_client = is_client
        self.name = name or ("client" if is_client else "server")
        self._stream = stream
        self._ws = websocket
        self._core = BlipConnection()
        self._handlers: dict[str, HandlerSpec] = dict(handlers or {})
        self._ping_interval = ping_interval
        self._idle_timeout = idle_timeout
        self._max_message_size = max_message_size
        self._waiters: dict[int, _Waiter] = {}
        self._sent_waiters: dict[int, trio.Event] = {}  # no-reply requests not fully written
        self._assembling: dict[tuple[int, int], _Assembly] = {}
        self._streams: dict[tuple[int, int], IncomingBody] = {}
        self._wake = trio.Event()
        self._progress = trio.lowlevel.ParkingLot()  # woken after each write
        self._handler_room = trio.Event()
        self._active_handlers = 0
        self._nursery: trio.Nursery | None = None
        self._run_scope = trio.CancelScope()
        self._lifecycle = Lifecycle(websocket)
        self._partial: list[bytes] | None = None  # a fragmented WebSocket message
        self._run_task: trio.lowlevel.Task | None = None  # the task inside run()
        self._writing = False  # the writer is inside send_all
        self._last_receive = 0.0

    # ------------------------------------------------------------------ public API

    @property
    def subprotocol(self) -> str:
        """The negotiated WebSocket subprotocol, e.g. ``BLIP_3+P2PSync_1``."""
        return subprotocol_for(self.app_id)

    @property
    def closed(self) -> bool:
        """True once the connection has ended (see :attr:`close_reason`)."""
        return self._lifecycle.closed

    @property
    def close_reason(self) -> str | None:
        """Why the connection ended, or ``None`` while it is open.

        One line for a log or a user, e.g. ``"peer closed the WebSocket (1008 P2PSync 401
        HelloProofInvalid)"`` or ``"closed by this side"``. For the bare WebSocket close code
        and reason text use :attr:`close_code` and :attr:`close_text`.
        """
        return self._lifecycle.reason

    @property
    def close_code(self) -> int | None:
        """The WebSocket close code the connection ended with; ``None`` while it is open.

        It is the code of the close frame that began the closing handshake, whichever side
        sent it: the peer's (e.g. ``1008`` for a policy refusal) or ours (:meth:`aclose`'s
        ``code``, ``1002`` after a BLIP protocol error). ``1006`` (abnormal closure, RFC 6455
        §7.1.5) when no close frame was exchanged: the stream broke, the idle timeout cut a
        silent peer, or the connection's task was cancelled.
        """
        return self._lifecycle.close_code

    @property
    def close_text(self) -> str | None:
        """The reason text of the close frame behind :attr:`close_code` (e.g.
        ``"P2PSync 401 HelloProofInvalid"``); ``""`` when there was none, ``None`` while open."""
        return self._lifecycle.close_text

    def set_handler(self, profile: str, handler: HandlerSpec | None) -> None:
        """Register (or with ``None`` remove) the handler for a profile."""
        if handler is None:
            self._handlers.pop(profile, None)
        else:
            self._handlers[profile] = handler

    async def request(
        self,
        profile: str,
        properties: Mapping[str, str] | None = None,
        body: Body = b"",
        *,
        compress: bool = False,
        urgent: bool = False,
    ) -> Response:
        """Send a request and wait for its reply.

        Raises :class:`BlipError` when the peer answers with an error and
        :class:`ConnectionClosed` when the connection ends first. A streamed ``body`` (an
        async iterable of bytes) is pulled only as flow control allows. If the call is
        cancelled the request still goes out in full (BLIP cannot withdraw a message) unless
        its body is streamed, in which case the connection is closed rather than let the
        peer take a cut body for a whole one.
        """
        waiter = _Waiter(profile, streaming=False)
        number = await self._send_request(profile, properties, body, compress, urgent, waiter)
        try:
            return await self._await_reply(waiter)
        finally:
            # Normally gone already; after a cancellation this drops the late reply.
            self._waiters.pop(number, None)

    @asynccontextmanager
    async def request_stream(
        self,
        profile: str,
        properties: Mapping[str, str] | None = None,
        body: Body = b"",
        *,
        compress: bool = False,
        urgent: bool = False,
    ) -> AsyncIterator[StreamingResponse]:
        """Send a request and read its reply's body as it arrives.

        Use as ``async with conn.request_stream(profile, props) as reply:`` and iterate
        ``reply.body_stream``; the peer is acknowledged only for what was read, so a slow
        reader slows the sender instead of filling memory. Leaving the block early discards
        the rest of the body. An ERR reply raises :class:`BlipError` on entry.
        """
        waiter = _Waiter(profile, streaming=True)
        number = await self._send_request(profile, properties, body, compress, urgent, waiter)
        try:
            await waiter.done.wait()
            if waiter.stream_start is None:
                await self._await_reply(waiter)  # an ERR reply or a closed connection: raises
                raise AssertionError("a streamed reply ended without starting")
            yield waiter.stream_start
        finally:
            self._waiters.pop(number, None)
            key = (RPY, number)
            if key in self._streams:
                # The reader gave up early: swallow the rest of the reply.
                del self._streams[key]
                self._core.discard_incoming(RPY, number)
                self._wake_writer()

    async def send_no_reply(
        self,
        profile: str,
        properties: Mapping[str, str] | None = None,
        body: Body = b"",
        *,
        compress: bool = False,
        urgent: bool = False,
    ) -> None:
        """Send a request that gets no reply; returns once its last frame is written."""
        number = await self._send_request(profile, properties, body, compress, urgent, None)
        sent = self._sent_waiters.get(number)
        if sent is not None:
            await sent.wait()
        if self._lifecycle.closed and number in self._sent_waiters:
            raise self._lifecycle.error()

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run a task for as long as the connection lives (it is cancelled at close).

        Raises :class:`ConnectionClosed` when the connection is not running (not started
        yet, ended, or being torn down).
        """
        nursery = self._nursery
        if nursery is None or self._run_scope.cancel_called:
            raise ConnectionClosed(self._lifecycle.reason or "connection not running")
        try:
            nursery.start_soon(fn, *args)
        except RuntimeError:
            # The nursery stopped taking tasks: the connection is ending (e.g. cancelled).
            raise self._lifecycle.error() from None

    async def aclose(self, *, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """Close: the WebSocket closing handshake with ``code`` and ``reason``, then the stream.

        The default is a normal closure (1000) without a reason; a refusal uses e.g.
        ``await conn.aclose(code=1008, reason="P2PSync 401 HelloProofInvalid")``. The peer sees
        both in its :attr:`close_code` / :attr:`close_text`, and requests still waiting on
        either side fail with :class:`ConnectionClosed` carrying them. Idempotent: once a
        close has begun, later calls do not change its code.

        Waits up to :data:`CLOSE_TIMEOUT` for the peer to finish the handshake, then cuts the
        stream; a caller that is cancelled meanwhile cuts it at once, and one cancelled
        already cuts it without a handshake (the close is then ``1006``, ``cancelled``).
        Called from a task of this connection (a handler), it returns at once and the close
        completes afterwards.
        Raises ``ValueError`` for a code that may not be sent (RFC 6455 §7.4: 1000–1003,
        1007–1014, 3000–4999) or a reason longer than :data:`MAX_CLOSE_REASON_BYTES` bytes.
        """
        check_close(code, reason)
        if trio.current_effective_deadline() == -math.inf:
            await self._cut_when_cancelled()
            return
        # Only a connection still open gets a close frame: one that ended without a closing
        # handshake (stream broken, idle timeout) keeps reporting 1006.
        if not self._lifecycle.closed and self._ws.state is State.OPEN:
            self._ws.send_close(code, reason)
            self._wake_writer()
        if code == CloseCode.NORMAL_CLOSURE and not reason:
            self._begin_close("closed by this side")
        else:
            self._begin_close(f"closed by this side ({describe_close(code, reason)})")
        if self._run_task is None:
            await self._close_unstarted()
            return
        self._start_close_deadline()
        if self._in_own_task():
            return  # waiting here would wait for ourselves: the close completes later
        try:
            await self._lifecycle.wait_closed()  # the close deadline bounds this wait
        finally:
            if self._lifecycle.state is not CLOSED:
                # Cancelled while waiting for the peer: cut the connection now.
                self._run_scope.cancel()
                with trio.CancelScope(shield=True):
                    await self._lifecycle.wait_closed()

    async def _cut_when_cancelled(self) -> None:
        """aclose() from a cancelled caller: no closing handshake (its frame could not be
        waited for, nor reliably written), just cut, so the end reads the same on both sides
        whichever task notices the cancellation first: 1006, ``cancelled``."""
        self._begin_close("cancelled")
        if self._run_task is None:
            await self._close_unstarted()
        else:
            self._run_scope.cancel()
            if not self._in_own_task():
                with trio.CancelScope(shield=True):
                    await self._lifecycle.wait_closed()
        await trio.lowlevel.checkpoint()  # raises Cancelled

    async def _close_unstarted(self) -> None:
        """End a connection that never ran: no task would ever finish its close."""
        self._lifecycle.finish()
        with trio.CancelScope(shield=True):
            await self._stream.aclose()

    async def wait_closed(self) -> None:
        """Wait until the connection has ended."""
        await self._lifecycle.wait_closed()

    # ------------------------------------------------------------------ running

    async def run(
        self,
        leftover: list[Any] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the connection until it ends. :func:`connect` and :func:`serve` call this.

        Reports ``task_status.started()`` once the connection can run tasks
        (:meth:`start_soon`), so a caller using ``nursery.start`` can hand it out at once.
        """
        if self._run_task is not None:
            raise RuntimeError("a connection runs once")
        self._run_task = trio.lowlevel.current_task()
        if self._lifecycle.state is not CONNECTING:
            task_status.started()
            return  # closed before it ever ran
        self._lifecycle.start()
        self._last_receive = trio.current_time()
        try:
            with self._run_scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    task_status.started()
                    nursery.start_soon(self._writer)
                    if self._ping_interval is not None:
                        nursery.start_soon(self._keepalive)
                    if leftover:
                        self._handle_ws_events(leftover)
                        self._wake_writer()
                    await self._reader()
                    # Let the writer flush the closing handshake before everything stops.
                    self._wake_writer()
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        while self._ws.writes or self._writing:
                            await self._progress.park()
                    nursery.cancel_scope.cancel()
        except BaseException as exc:
            self._begin_close("cancelled" if _only_cancelled(exc) else f"a connection task failed: {exc!r}")
            raise
        finally:
            self._nursery = None
            self._shutdown("connection closed")
            with trio.CancelScope(shield=True):
                await self._stream.aclose()
            self._lifecycle.finish()

    # ------------------------------------------------------------------ sending

    async def _send_request(
        self,
        profile: str,
        properties: Mapping[str, str] | None,
        body: Body,
        compress: bool,
        urgent: bool,
        waiter: _Waiter | None,
    ) -> int:
        # A cancelled caller gets Cancelled, not ConnectionClosed, even when the cancellation
        # is closing this very connection.
        await trio.lowlevel.checkpoint_if_cancelled()
        props: dict[str, str] = {PROFILE_PROPERTY: profile}
        if properties:
            for key, value in properties.items():
                if key == PROFILE_PROPERTY and value != profile:
                    raise ValueError("the Profile property differs from the profile argument")
                props[key] = value
        lifecycle = self._lifecycle
        while self._core.queued_messages >= MAX_QUEUED_MESSAGES and not lifecycle.closed:
            await self._progress.park()
        if lifecycle.closed:
            raise lifecycle.error()
        data, source = _split_body(body)
        number = self._core.send_request(
            props,
            data,
            urgent=urgent,
            compressed=compress,
            no_reply=waiter is None,
            more_body=source is not None,
        )
        if waiter is None:
            self._sent_waiters[number] = trio.Event()
        else:
            self._waiters[number] = waiter
        self._wake_writer()
        if source is not None:
            await self._feed_body(MSG, number, source)
        return number

    async def _await_reply(self, waiter: _Waiter) -> Response:
        await waiter.done.wait()
        if waiter.error is not None:
            if isinstance(waiter.error, ConnectionClosed):
                # The close may come from our own cancellation: report that instead.
                await trio.lowlevel.checkpoint_if_cancelled()
            raise waiter.error
        assert waiter.response is not None
        return waiter.response

    async def _send_reply(self, number: int, reply: Reply) -> None:
        data, source = _split_body(reply.body)
        try:
            self._core.send_reply(
                number,
                reply.properties,
                data,
                urgent=reply.urgent,
                compressed=reply.compress,
                more_body=source is not None,
            )
        except ConnectionClosed:
            return
        self._wake_writer()
        if source is not None:
            await self._feed_body(RPY, number, source)

    def _send_error(self, number: int, domain: str, code: int, message: str) -> None:
        try:
            self._core.send_error(number, domain, code, message)
        except ConnectionClosed:
            return
        self._wake_writer()

    async def _feed_body(self, mtype: int, number: int, source: AsyncIterable[bytes]) -> None:
        """Pull a streamed body from its source while little of it is queued."""
        core = self._core
        finished = False
        try:
            async for chunk in source:
                if chunk:
                    core.append_body(mtype, number, chunk, end=False)
                    self._wake_writer()
                while True:
                    backlog = core.outgoing_backlog(mtype, number)
                    if backlog is None or self._lifecycle.closed:
                        raise self._lifecycle.error()
                    if backlog < STREAM_LOW_WATER:
                        break
                    await self._progress.park()
            core.append_body(mtype, number, b"", end=True)
            self._wake_writer()
            finished = True
        finally:
            if not finished and not self._lifecycle.closed:
                # BLIP cannot withdraw a message; a cut body must not pass for a whole one.
                self._fail_connection("a streamed body could not be completed", 1011)

    def _credit(self, mtype: int, number: int, size: int) -> None:
        """A streamed body's reader took ``size`` bytes: acknowledge them when due."""
        self._core.credit(mtype, number, size)
        if self._core.wants_to_send:
            self._wake_writer()

    def _wake_writer(self) -> None:
        self._wake.set()

    async def _writer(self) -> None:
        core = self._core
        ws = self._ws
        stream = self._stream
        progress = self._progress
        sent_waiters = self._sent_waiters
        try:
            while True:
                finished: list[tuple[int, int]] = []
                if core.wants_to_send and ws.state is State.OPEN:
                    send_binary = ws.send_binary
                    for frame in core.frames_to_send(WRITE_BATCH):
                        send_binary(frame)
                    finished = core.take_finished()
                chunks = ws.data_to_send()
                if chunks:
                    eof = chunks[-1] == b""
                    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                    self._writing = True
                    if data:
                        await stream.send_all(data)
                    if eof:
                        await _send_eof(stream)
                    self._writing = False
                if sent_waiters and finished:
                    for mtype, number in finished:
                        sent = sent_waiters.pop(number, None) if mtype == MSG else None
                        if sent is not None:
                            sent.set()
                if progress:
                    progress.unpark_all()
                if chunks:
                    continue
                if not core.wants_to_send or ws.state is not State.OPEN:
                    self._wake = trio.Event()
                    await self._wake.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._abort(f"write failed: {exc}")

    # ---------------------------------------------------------------- receiving

    async def _reader(self) -> None:
        ws = self._ws
        stream = self._stream
        while True:
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._begin_close(f"read failed: {exc}")
                return
            self._last_receive = trio.current_time()
            if not data:
                ws.receive_eof()
                self._begin_close(peer_close_reason(ws) or "peer closed the stream")
                self._wake_writer()
                return
            ws.receive_data(data)
            events = ws.events_received()
            # Hand over in slices, yielding between them, so the replies to the first slice
            # go out while later ones are handled: otherwise one read's worth of requests
            # comes back as one write and the two peers take turns instead of overlapping.
            for start in range(0, len(events), FRAMES_PER_SLICE):
                if start:
                    await trio.lowlevel.checkpoint()
                self._handle_ws_events(events[start : start + FRAMES_PER_SLICE])
                if ws.writes or self._core.wants_to_send:
                    self._wake_writer()
            if self._core.queued_messages > MAX_QUEUED_MESSAGES_HARD:
                self._fail_connection("peer sends requests but does not read replies", 1008)
            while self._active_handlers >= MAX_CONCURRENT_HANDLERS:
                self._handler_room = trio.Event()
                await self._handler_room.wait()

    def _handle_ws_events(self, events: list[Any]) -> None:
        core = self._core
        for frame in events:
            if not hasattr(frame, "opcode"):
                continue  # an HTTP event left over from the handshake
            opcode = frame.opcode
            if opcode is Opcode.BINARY:
                if frame.fin:
                    data = frame.data
                else:
                    self._partial = [frame.data]
                    continue
            elif opcode is Opcode.CONT:
                if self._partial is None:
                    continue  # websockets rejects a stray continuation itself
                self._partial.append(frame.data)
                if not frame.fin:
                    continue
                data = b"".join(self._partial)
                self._partial = None
            elif opcode is Opcode.TEXT:
                self._protocol_failure("text WebSocket message (BLIP frames are binary)")
                return
            elif opcode is Opcode.CLOSE:
                self._shutdown(peer_close_reason(self._ws) or "peer closed the connection")
                self._start_close_deadline()
                continue
            else:
                continue  # ping (websockets queued the pong) or pong
            if core.state is not ConnectionState.OPEN:
                continue
            try:
                blip_events = core.receive_message(data)
            except ProtocolError as exc:
                self._protocol_failure(str(exc))
                return
            if blip_events:
                self._dispatch(blip_events)

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, MessageStart):
                if event.type == MSG:
                    self._on_request_start(event)
                else:
                    self._on_reply_start(event)
            elif isinstance(event, MessageData):
                key = (MSG if event.type == MSG else RPY, event.number)
                assembly = self._assembling.get(key)
                if assembly is not None:
                    self._on_assembly_data(key, assembly, event)
                    continue
                stream = self._streams.get(key)
                if stream is not None:
                    stream._feed(event.data, event.size, event.complete)
                    if event.complete:
                        del self._streams[key]
                    elif stream.buffered > STREAM_BUFFER_LIMIT:
                        self._protocol_failure("peer ignores BLIP flow control")
                        return
            elif isinstance(event, MessageFailed):
                log.warning("%s: %s", self.name, describe_event(event))
                if event.type != MSG:
                    self._fail_waiter(
                        event.number, BlipError(BLIP_ERROR_DOMAIN, BAD_REPLY, event.reason)
                    )
            elif isinstance(event, FrameIgnored):
                log.warning("%s: %s", self.name, describe_event(event))

    def _on_request_start(self, event: MessageStart) -> None:
        number = event.number
        profile = event.properties.get(PROFILE_PROPERTY)
        spec = self._handlers.get(profile) if profile is not None else None
        wants_reply = not event.flags & NO_REPLY
        if spec is None:
            if not event.complete:
                self._core.discard_incoming(MSG, number)
            if wants_reply:
                self._send_error(
                    number, BLIP_ERROR_DOMAIN, NOT_FOUND, f"no handler for {profile!r}"
                )
            else:
                log.info("%s: no handler for no-reply request %r", self.name, profile)
            return
        if isinstance(spec, StreamingHandler):
            body = IncomingBody(self, MSG, number)
            body._feed(event.body, 0, event.complete)
            if not event.complete:
                self._core.use_manual_credit(MSG, number)
                self._streams[(MSG, number)] = body
            request = Request(self, number, event.properties, b"", event.flags, body)
            self._start_handler(spec.handler, request)
        elif event.complete:
            request = Request(self, number, event.properties, event.body, event.flags)
            self._start_handler(spec, request)
        else:
            self._assembling[(MSG, number)] = _Assembly(event)

    def _on_reply_start(self, event: MessageStart) -> None:
        number = event.number
        waiter = self._waiters.get(number)
        if waiter is None:
            if not event.complete:
                self._core.discard_incoming(event.type, number)
            return
        if waiter.streaming and event.type == RPY:
            body = IncomingBody(self, RPY, number)
            body._feed(event.body, 0, event.complete)
            if not event.complete:
                self._core.use_manual_credit(RPY, number)
                self._streams[(RPY, number)] = body
            waiter.stream_start = StreamingResponse(
                waiter.profile, event.properties, body, number, event.flags
            )
            waiter.done.set()
        elif event.complete:
            self._finish_reply(waiter, event, event.body)
        else:
            self._assembling[(RPY, number)] = _Assembly(event)

    def _on_assembly_data(
        self, key: tuple[int, int], assembly: _Assembly, event: MessageData
    ) -> None:
        assembly.parts.append(event.data)
        assembly.size += len(event.data)
        start = assembly.start
        if assembly.size > self._max_message_size:
            del self._assembling[key]
            if not event.complete:
                self._core.discard_incoming(start.type, start.number)
            reason = f"message larger than {self._max_message_size} bytes"
            if start.type == MSG:
                if not start.flags & NO_REPLY:
                    self._send_error(start.number, BLIP_ERROR_DOMAIN, TOO_LARGE, reason)
            else:
                self._fail_waiter(start.number, BlipError(BLIP_ERROR_DOMAIN, TOO_LARGE, reason))
            return
        if not event.complete:
            return
        del self._assembling[key]
        body = b"".join(assembly.parts)
        if start.type == MSG:
            spec = self._handlers.get(start.properties.get(PROFILE_PROPERTY, ""))
            if spec is None or isinstance(spec, StreamingHandler):
                # The handler changed while the request arrived; treat it as unknown.
                if not start.flags & NO_REPLY:
                    self._send_error(start.number, BLIP_ERROR_DOMAIN, NOT_FOUND, "no handler")
                return
            self._start_handler(
                spec, Request(self, start.number, start.properties, body, start.flags)
            )
        else:
            waiter = self._waiters.get(start.number)
            if waiter is not None:
                self._finish_reply(waiter, start, body)

    def _finish_reply(self, waiter: _Waiter, start: MessageStart, body: bytes) -> None:
        self._waiters.pop(start.number, None)
        if start.type == ERR:
            props = start.properties
            try:
                code = int(props.get(ERROR_CODE_PROPERTY, "0"))
            except ValueError:
                code = 0
            domain = props.get(ERROR_DOMAIN_PROPERTY, BLIP_ERROR_DOMAIN)
            waiter.error = BlipError(domain, code, body.decode("utf-8", "replace"))
        else:
            waiter.response = Response(
                waiter.profile, start.properties, body, start.number, start.flags
            )
        waiter.done.set()

    def _fail_waiter(self, number: int, error: BaseException) -> None:
        waiter = self._waiters.pop(number, None)
        if waiter is not None:
            waiter.error = error
            waiter.done.set()
        stream = self._streams.pop((RPY, number), None)
        if stream is not None:
            stream._fail(error)

    # ---------------------------------------------------------------- handlers

    def _start_handler(
        self, handler: Callable[[Request], Awaitable[Reply | None]], request: Request
    ) -> None:
        if self._nursery is None:
            return
        self._active_handlers += 1
        self._nursery.start_soon(self._run_handler, handler, request)

    async def _run_handler(
        self, handler: Callable[[Request], Awaitable[Reply | None]], request: Request
    ) -> None:
        try:
            try:
                reply = await handler(request)
            except BlipError as exc:
                if not request.replied:
                    request.respond_error(exc.domain, exc.code, exc.message)
                return
            except Exception:
                # The traceback stays in our log; the peer learns only that the handler failed.
                log.exception("%s: handler for %r failed", self.name, request.profile)
                if not request.replied:
                    request.respond_error(BLIP_ERROR_DOMAIN, HANDLER_FAILED, "handler failed")
                return
            if not request.replied:
                try:
                    await request.respond(reply)
                except ValueError as exc:  # e.g. properties that cannot be encoded
                    log.error("%s: bad reply to %r: %s", self.name, request.profile, exc)
                    self._send_error(request.number, BLIP_ERROR_DOMAIN, HANDLER_FAILED, "bad reply")
        finally:
            self._active_handlers -= 1
            if self._active_handlers < MAX_CONCURRENT_HANDLERS:
                self._handler_room.set()
            stream = request.body_stream
            if stream is not None and self._streams.get((MSG, request.number)) is stream:
                # The handler returned without reading everything: swallow the rest.
                del self._streams[(MSG, request.number)]
                self._core.discard_incoming(MSG, request.number)
                self._wake_writer()

    # ---------------------------------------------------------------- keepalive & closing

    async def _keepalive(self) -> None:
        assert self._ping_interval is not None
        idle_timeout = self._idle_timeout if self._idle_timeout is not None else math.inf
        while True:
            await trio.sleep(self._ping_interval)
            idle = trio.current_time() - self._last_receive
            if idle >= idle_timeout:
                self._abort(f"idle timeout: nothing from the peer for {idle:.0f} s")
                return
            if self._ws.state is State.OPEN:
                self._ws.send_ping(b"blip")
                self._wake_writer()

    def _in_own_task(self) -> bool:
        """True when the current task is run() or one of its descendants (e.g. a handler)."""
        task: trio.lowlevel.Task | None = trio.lowlevel.current_task()
        while task is not None:
            if task is self._run_task:
                return True
            parent = task.parent_nursery
            task = parent.parent_task if parent is not None else None
        return False

    def _begin_close(self, reason: str) -> None:
        """The end is decided (the first reason stays): no BLIP message is sent or taken after."""
        self._lifecycle.begin_close(reason)
        self._core.close()

    def _protocol_failure(self, reason: str) -> None:
        log.warning("%s: BLIP protocol error, closing: %s", self.name, reason)
        self._fail_connection(f"protocol error: {reason}", CloseCode.PROTOCOL_ERROR)

    def _fail_connection(self, reason: str, code: int) -> None:
        """Close with a WebSocket error code (the closing handshake still runs)."""
        self._begin_close(reason)
        if self._ws.state is State.OPEN:
            self._ws.fail(code, truncate_utf8(reason, MAX_CLOSE_REASON_BYTES))
        self._shutdown(reason)
        self._wake_writer()
        self._start_close_deadline()

    def _start_close_deadline(self) -> None:
        """Once closing has begun, give the peer :data:`CLOSE_TIMEOUT` to finish it.

        A deadline on the run scope rather than a timer task: starting a task here fails when
        the run's nursery is already winding down (a cancellation racing with the close).
        When it passes, the run scope is cancelled, which is what :meth:`_abort` does; the
        close reason is already set.
        """
        deadline = trio.current_time() + CLOSE_TIMEOUT
        if deadline < self._run_scope.deadline:
            self._run_scope.deadline = deadline

    def _abort(self, reason: str) -> None:
        """Drop the connection without a closing handshake (peer gone or stream broken)."""
        self._begin_close(reason)
        self._run_scope.cancel()

    def _shutdown(self, reason: str) -> None:
        """Fail everything still waiting on this connection."""
        self._begin_close(reason)
        error = self._lifecycle.error()
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.error = error
            waiter.done.set()
        for sent in self._sent_waiters.values():
            sent.set()
        for stream in self._streams.values():
            stream._fail(error)
        self._streams.clear()
        self._assembling.clear()
        self._progress.unpark_all()
        self._handler_room.set()


def _split_body(body: Body) -> tuple[bytes | bytearray | memoryview, AsyncIterable[bytes] | None]:
    """A body is either bytes (sent at once) or an async iterable of bytes (streamed)."""
    if isinstance(body, bytes | bytearray | memoryview):
        return body, None
    return b"", body


async def _guarded(fn: Callable[[Connection], Awaitable[None]], conn: Connection) -> None:
    """Run a per-connection callback; its failure is logged and closes only that connection."""
    try:
        await fn(conn)
    except Exception:
        log.exception("%s: on_connect callback failed", conn.name)
        await conn.aclose()


def _only_cancelled(exc: BaseException) -> bool:
    """True for ``Cancelled``, or a group holding nothing else (how a nursery reports it)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


async def _send_eof(stream: trio.abc.Stream) -> None:
    if isinstance(stream, trio.abc.HalfCloseableStream):
        await stream.send_eof()


# ---------------------------------------------------------------------- handshakes


async def _client_handshake(
    stream: trio.abc.Stream, url: str, subprotocol: str
) -> tuple[ClientProtocol, list[Any]]:
    uri = parse_uri(url)
    ws = ClientProtocol(
        uri, subprotocols=[Subprotocol(subprotocol)], max_size=MAX_WEBSOCKET_MESSAGE
    )
    ws.send_request(ws.connect())
    await stream.send_all(b"".join(ws.data_to_send()))
    while True:
        data = await stream.receive_some(RECEIVE_SIZE)
        if data:
            ws.receive_data(data)
        else:
            ws.receive_eof()
        events = ws.events_received()
        if events:
            response = events[0]
            if not isinstance(response, HttpResponse):
                raise ConnectionClosed("WebSocket handshake failed: unexpected first event")
            if ws.handshake_exc is not None:
                raise ConnectionClosed(f"WebSocket handshake failed: {ws.handshake_exc}")
            if ws.subprotocol != subprotocol:
                raise ConnectionClosed(
                    f"WebSocket handshake failed: peer chose subprotocol {ws.subprotocol!r}, "
                    f"not {subprotocol!r}"
                )
            return ws, events[1:]
        if not data:
            reason = ws.handshake_exc or "peer closed the stream"
            raise ConnectionClosed(f"WebSocket handshake failed: {reason}")


async def _server_handshake(
    stream: trio.abc.Stream, subprotocol: str
) -> tuple[ServerProtocol, list[Any]] | None:
    ws = ServerProtocol(subprotocols=[Subprotocol(subprotocol)], max_size=MAX_WEBSOCKET_MESSAGE)
    while True:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return None
        ws.receive_data(data)
        events = ws.events_received()
        if events:
            request = events[0]
            if not isinstance(request, HttpRequest):
                return None
            response = ws.accept(request)
            ws.send_response(response)
            out = [chunk for chunk in ws.data_to_send() if chunk]
            await stream.send_all(b"".join(out))
            if response.status_code != 101:
                log.info("refused WebSocket handshake: %s", ws.handshake_exc)
                return None
            return ws, events[1:]
        out = ws.data_to_send()
        if out:  # e.g. a 4xx for a request line that could not be parsed
            await stream.send_all(b"".join(chunk for chunk in out if chunk))
            return None


def _raise_handshake_failure(exc: BaseException) -> NoReturn:
    """Re-raise a failed opening handshake; a broken stream becomes :class:`ConnectionClosed`
    (the peer went away or was cancelled mid-handshake), everything else stays as it is."""
    if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
        raise ConnectionClosed(f"WebSocket handshake failed: {exc or type(exc).__name__}") from exc
    raise exc


# ---------------------------------------------------------------------- entry points


@asynccontextmanager
async def _running(conn: Connection, leftover: list[Any]) -> AsyncIterator[Connection]:
    """Run ``conn`` while the caller's block runs; close it when the block ends.

    The block's own exception is re-raised as is (not wrapped in an exception group).
    """
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        # Wait until the connection runs, so the caller may start tasks on it right away
        # (serve's on_connect does).
        await nursery.start(conn.run, leftover)
        try:
            yield conn
        except BaseException as exc:
            body_error = exc
        finally:
            await conn.aclose()
    if body_error is not None:
        raise body_error


@asynccontextmanager
async def connect_stream(
    stream: trio.abc.Stream,
    url: str = "ws://localhost/",
    *,
    app_id: str = DEFAULT_APP_ID,
    handlers: Mapping[str, HandlerSpec] | None = None,
    ping_interval: float | None = PING_INTERVAL,
    idle_timeout: float | None = IDLE_TIMEOUT,
    max_message_size: int = MAX_MESSAGE_SIZE,
) -> AsyncIterator[Connection]:
    """Open a BLIP connection as the client over an already open stream (any trio Stream,
    e.g. an in-memory one in tests). Closes the stream at the end."""
    subprotocol = subprotocol_for(app_id)
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            ws, leftover = await _client_handshake(stream, url, subprotocol)
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        _raise_handshake_failure(exc)
    conn = Connection(
        stream,
        ws,
        app_id=app_id,
        handlers=handlers,
        is_client=True,
        ping_interval=ping_interval,
        idle_timeout=idle_timeout,
        max_message_size=max_message_size,
    )
    async with _running(conn, leftover) as running:
        yield running


@asynccontextmanager
async def accept_stream(
    stream: trio.abc.Stream,
    *,
    app_id: str = DEFAULT_APP_ID,
    handlers: Mapping[str, HandlerSpec] | None = None,
    ping_interval: float | None = PING_INTERVAL,
    idle_timeout: float | None = IDLE_TIMEOUT,
    max_message_size: int = MAX_MESSAGE_SIZE,
) -> AsyncIterator[Connection]:
    """Accept a BLIP connection as the server over an already open stream. Closes the stream
    at the end, and also when the handshake fails or is cancelled.

    Raises :class:`ConnectionClosed` when the client's handshake is refused or the stream
    breaks during it.
    """
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            accepted = await _server_handshake(stream, subprotocol_for(app_id))
        if accepted is None:
            raise ConnectionClosed("WebSocket handshake refused")
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        _raise_handshake_failure(exc)
    ws, leftover = accepted
    conn = Connection(
        stream,
        ws,
        app_id=app_id,
        handlers=handlers,
        is_client=False,
        ping_interval=ping_interval,
        idle_timeout=idle_timeout,
        max_message_size=max_message_size,
    )
    async with _running(conn, leftover) as running:
        yield running


@asynccontextmanager
async def connect(
    url: str,
    *,
    app_id: str = DEFAULT_APP_ID,
    handlers: Mapping[str, HandlerSpec] | None = None,
    ping_interval: float | None = PING_INTERVAL,
    idle_timeout: float | None = IDLE_TIMEOUT,
    max_message_size: int = MAX_MESSAGE_SIZE,
) -> AsyncIterator[Connection]:
    """Connect to a BLIP peer at ``ws://host:port/path``::

        async with blip.connect("ws://127.0.0.1:4984/_p2psync", handlers={...}) as conn:
            reply = await conn.request("echo", {"X": "1"}, b"body")

    ``handlers`` answer the requests the server sends us (either side may send requests).
    """
    uri = parse_uri(url)
    if uri.secure:
        raise ValueError("wss:// is not supported yet; use ws://")
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        stream = await trio.open_tcp_stream(uri.host, uri.port)
    async with connect_stream(
        stream,
        url,
        app_id=app_id,
        handlers=handlers,
        ping_interval=ping_interval,
        idle_timeout=idle_timeout,
        max_message_size=max_message_size,
    ) as conn:
        yield conn


@dataclass
class BlipServer:
    """A BLIP server: what :func:`serve` reports once it listens, and what serves each stream.

    ``listeners`` are what it accepts on and ``connections`` its live connections. The
    keyword fields configure every connection it accepts. :meth:`serve_stream` serves one
    already open stream, so a server runs over any trio stream, e.g. in-memory ones in tests::

        server = blip.BlipServer(app_id="P2PSync_1", handlers=handlers, on_connect=greet)
        client_end, server_end = trio.testing.memory_stream_pair()
        nursery.start_soon(server.serve_stream, server_end)
        async with blip.connect_stream(client_end) as conn: ...
    """

    listeners: list[trio.abc.Listener[Any]] = field(default_factory=list)
    connections: set[Connection] = field(default_factory=set)
    _: KW_ONLY
    app_id: str = DEFAULT_APP_ID
    handlers: Mapping[str, HandlerSpec] | None = None
    #: Runs in each accepted connection's task group, once it runs (it may send requests).
    on_connect: Callable[[Connection], Awaitable[None]] | None = None
    ping_interval: float | None = PING_INTERVAL
    idle_timeout: float | None = IDLE_TIMEOUT
    max_message_size: int = MAX_MESSAGE_SIZE

    @property
    def port(self) -> int:
        """The TCP port of the first listener (useful after binding port 0)."""
        listener = self.listeners[0] if self.listeners else None
        if not isinstance(listener, trio.SocketListener):
            raise ValueError("this server has no TCP listener")
        port: int = listener.socket.getsockname()[1]
        return port

    async def serve_stream(
        self,
        stream: trio.abc.Stream,
        *,
        task_status: trio.TaskStatus[Connection] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept one client over an open stream and serve it until the connection ends.

        This is what :func:`serve` runs for each TCP connection. The stream is closed at the
        end. A connection that fails, also during its handshake, is logged and ends here
        without raising, so one bad client never takes a server down. With
        ``nursery.start`` the accepted :class:`Connection` is returned once it runs, and a
        failed handshake raises (:class:`ConnectionClosed`, ``trio.TooSlowError``) instead.
        """
        started = False
        try:
            async with accept_stream(
                stream,
                app_id=self.app_id,
                handlers=self.handlers,
                ping_interval=self.ping_interval,
                idle_timeout=self.idle_timeout,
                max_message_size=self.max_message_size,
            ) as conn:
                self.connections.add(conn)
                try:
                    if self.on_connect is not None:
                        conn.start_soon(_guarded, self.on_connect, conn)
                    task_status.started(conn)
                    started = True
                    await conn.wait_closed()
                finally:
                    self.connections.discard(conn)
        except (ConnectionClosed, trio.TooSlowError, InvalidHandshake, InvalidState) as exc:
            if not started and task_status is not trio.TASK_STATUS_IGNORED:
                raise  # the caller of nursery.start learns why there is no connection
            log.info("connection ended during setup: %s", exc)
        except Exception:
            # One bad connection must not take the listener down.
            log.exception("BLIP connection failed")


async def serve_listeners(
    listeners: Sequence[trio.abc.Listener[trio.abc.Stream]],
    app_id: str = DEFAULT_APP_ID,
    handlers: Mapping[str, HandlerSpec] | None = None,
    *,
    on_connect: Callable[[Connection], Awaitable[None]] | None = None,
    ping_interval: float | None = PING_INTERVAL,
    idle_timeout: float | None = IDLE_TIMEOUT,
    max_message_size: int = MAX_MESSAGE_SIZE,
    task_status: trio.TaskStatus[BlipServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept BLIP connections on any trio listeners until cancelled (then closes them).

    :func:`serve` is this over TCP listeners; with a :class:`~p2psync.blip.memory.MemoryListener`
    the same server runs over in-memory streams. Reports the :class:`BlipServer` through
    ``task_status``.
    """
    server = BlipServer(
        list(listeners),
        app_id=app_id,
        handlers=handlers,
        on_connect=on_connect,
        ping_interval=ping_interval,
        idle_timeout=idle_timeout,
        max_message_size=max_message_size,
    )
    task_status.started(server)
    await trio.serve_listeners(server.serve_stream, server.listeners)


async def serve(
    host: str,
    port: int,
    app_id: str = DEFAULT_APP_ID,
    handlers: Mapping[str, HandlerSpec] | None = None,
    *,
    on_connect: Callable[[Connection], Awaitable[None]] | None = None,
    ping_interval: float | None = PING_INTERVAL,
    idle_timeout: float | None = IDLE_TIMEOUT,
    max_message_size: int = MAX_MESSAGE_SIZE,
    task_status: trio.TaskStatus[BlipServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept BLIP connections on ``host:port`` (any request path) until cancelled.

    Use with ``server = await nursery.start(serve, "127.0.0.1", 0, ...)``; ``server.port`` is
    the bound port. ``on_connect(conn)``, if given, runs in each connection's task group (e.g.
    to send the client requests of our own); the connection lives until either side closes.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    await serve_listeners(
        listeners,
        app_id,
        handlers,
        on_connect=on_connect,
        ping_interval=ping_interval,
        idle_timeout=idle_timeout,
        max_message_size=max_message_size,
        task_status=task_status,
    )
