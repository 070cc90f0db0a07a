"""The RPC layer: requests, replies, streamed bodies and the handlers that answer requests.

:class:`Connection` is what a BLIP user holds. It sends requests and matches their replies
(:meth:`~Connection.request`, :meth:`~Connection.request_stream`,
:meth:`~Connection.send_no_reply`), and turns the BLIP events the frame pumps hand it into
:class:`Request` objects for handler tasks, replies for waiting callers, or pieces of a
streamed :class:`~p2psync.blip.payloads.IncomingBody`. Running and closing it are the jobs of
the layers below (:mod:`p2psync.blip.pumps`, :mod:`p2psync.blip.closing`).

Handlers run in tasks of the connection's nursery; at most :data:`MAX_CONCURRENT_HANDLERS` at
a time (beyond that the reader stops reading, which pushes back on the peer through TCP).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio
from websockets.frames import CloseCode
from websockets.protocol import Protocol

from p2psync.blip.connection import (
    Event,
    FrameIgnored,
    MessageData,
    MessageFailed,
    MessageStart,
    describe_event,
)
from p2psync.blip.errors import BLIP_ERROR_DOMAIN, BlipError, ConnectionClosed
from p2psync.blip.lifecycle import truncate_utf8
from p2psync.blip.payloads import Body, IncomingBody, Reply, Response, StreamingResponse
from p2psync.blip.pumps import IDLE_TIMEOUT, PING_INTERVAL, Transport
from p2psync.blip.wire import (
    COMPRESSED,
    ERR,
    ERROR_CODE_PROPERTY,
    ERROR_DOMAIN_PROPERTY,
    MAX_INFLATED_FRAME,
    MAX_PROPERTIES_SIZE,
    MAX_UNACKED_BYTES,
    MAX_VARINT_LEN,
    MSG,
    NO_REPLY,
    PROFILE_PROPERTY,
    RPY,
    URGENT,
    WIDE_UNACKED_BYTES,
    subprotocol_for,
)

log = logging.getLogger("p2psync.blip")

#: Default largest incoming message assembled in memory; beyond it a request gets BLIP 413
#: and a reply fails locally. Stream larger bodies (:func:`streaming`).
MAX_MESSAGE_SIZE = 64 * 1024 * 1024
#: Largest messages' worth of bytes a connection gathers at once, all messages together: a
#: peer may start many messages and finish none (BLIP ACKs are advisory to a sender that does
#: not care). Two: an honest peer sends one large message at a time, and before hello a hello
#: and a getCollections racing it. Past it the connection is closed with 1009 (issue #15).
ASSEMBLING_MESSAGES = 2
#: The same in bytes at the default message limit; a connection that takes smaller messages
#: (until hello: PRE_HELLO_MAX_MESSAGE) gathers ASSEMBLING_MESSAGES of its own limit.
MAX_ASSEMBLING_BYTES = ASSEMBLING_MESSAGES * MAX_MESSAGE_SIZE
#: The same across all the connections one server accepts: a few abusive connections, each
#: under its own cap, must not add up to the out-of-memory killer. Four connections at their
#: cap; past it the connection that adds more is closed with 1013 (try again later).
MAX_SERVER_ASSEMBLING_BYTES = 4 * MAX_ASSEMBLING_BYTES


class GatherBudget:
    """Bytes of incoming messages being gathered by a group of connections (a server's)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_SERVER_ASSEMBLING_BYTES if limit is None else limit
        self.used = 0
#: Handler tasks allowed at once per connection before the reader pauses.
MAX_CONCURRENT_HANDLERS = 1024
#: Outgoing messages (requests) queued per connection before ``request()`` waits.
MAX_QUEUED_MESSAGES = 4096
#: Outgoing messages queued beyond which the peer is taken for broken: it keeps sending us
#: requests but does not read our replies. The reader never waits for the writer (that can
#: deadlock two peers that both wait), so this cap and the two below are what bound the memory
#: such a peer costs.
MAX_QUEUED_MESSAGES_HARD = 4 * MAX_QUEUED_MESSAGES
#: Bytes of our replies queued for a peer (not yet written) past which it must show that it
#: reads them: once it has taken none of them for UNREAD_REPLY_TIMEOUT, the connection is
#: closed with 1008 (issue #15: 17,000 unread requests held 1.6 GiB of replies). An honest peer
#: reads as we write, so its replies wait only for the link; what it asks at once (rev results
#: of ~100 bytes, statuses, getDependencies replies with at most 8 MiB of inline data) rarely
#: reaches this. Ours.
MAX_QUEUED_REPLY_BYTES = 16 * 1024 * 1024
#: Seconds a peer past MAX_QUEUED_REPLY_BYTES may take none of our reply bytes. A peer that
#: reads at all takes a frame (at most 16 KiB) in far less; the order of the hello deadline.
UNREAD_REPLY_TIMEOUT = 10.0
#: Queued reply bytes past which the connection is closed with 1008 at once, read or not (a
#: peer reading one frame now and then must not make us queue without end): what an honest sink
#: can ask at once — an attachment of the largest size (100 MiB, sent whole) beside 16
#: getDependencies replies of up to 8 MiB (replication-profiles §12). A connection starts at
#: ASSEMBLING_MESSAGES of its message limit (512 KiB until hello) and is given this once its
#: peer proved who it is (:attr:`Connection.max_reply_backlog`).
MAX_QUEUED_REPLY_BYTES_HARD = 4 * MAX_MESSAGE_SIZE
#: A streamed outgoing body is pulled from its source only while less than this is queued.
STREAM_LOW_WATER = 64 * 1024
#: A streamed incoming body buffers at most this much unread before we call the peer
#: broken: an honest sender stops at the window (128,000 bytes, or 1,000,000 once we said in
#: hello that we take it: WIDE_UNACKED_BYTES) plus one frame.
STREAM_BUFFER_LIMIT = 4 * WIDE_UNACKED_BYTES

#: An ERR's message text at most (UTF-8 bytes): error replies never echo unbounded input —
#: a request naming a 100 KB profile must not buy a 100 KB reply (issue #15). Ours; refusals
#: of the P2PSync profiles are a code, a name and a sentence, well under it.
MAX_ERROR_MESSAGE_BYTES = 4096
#: How much of an unknown profile name an error quotes.
MAX_QUOTED_PROFILE = 64

# BLIP error codes follow HTTP's (BLIP_3 spec; BLIP-Cpp uses 404 and 501 the same way).
NOT_FOUND = 404
TOO_LARGE = 413
HANDLER_FAILED = 501
BAD_REPLY = 502


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
        self.parts: list[bytes | memoryview] = [start.body]  # frames' views, joined once
        self.size = len(start.body)



class Connection(Transport):
    """A BLIP_3 connection over a WebSocket. Either side may send requests.

    Get one from :func:`connect` (client) or :func:`serve` / ``on_connect`` (server), over
    any trio stream from :func:`connect_stream` / :func:`accept_stream`, or two joined in
    memory from :func:`~p2psync.blip.memory.memory_pair`. Closing (:meth:`aclose`,
    :attr:`closed`, :attr:`close_reason`, :attr:`close_code`, :attr:`close_text`,
    :meth:`wait_closed`) comes from :class:`~p2psync.blip.closing.ClosableTransport`, running
    (:meth:`run`, :meth:`start_soon`) from :class:`~p2psync.blip.pumps.Transport`.
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
        gather_budget: GatherBudget | None = None,
    ) -> None:
        super().__init__(
            stream,
            websocket,
            name=name or ("client" if is_client else "server"),
            ping_interval=ping_interval,
            idle_timeout=idle_timeout,
        )
        self.app_id = app_id
        self.is_client = is_client
        self._handlers: dict[str, HandlerSpec] = dict(handlers or {})
        self._max_message_size = max_message_size
        #: Queued reply bytes past which the peer is closed at once (MAX_QUEUED_REPLY_BYTES_HARD);
        #: the soft cap, past which it must keep taking them, is at most this.
        self.max_reply_backlog = min(MAX_QUEUED_REPLY_BYTES_HARD, ASSEMBLING_MESSAGES * max_message_size)
        self._core.max_inflated_frame = inflated_frame_limit(max_message_size)
        self._waiters: dict[int, _Waiter] = {}
        self._sent_waiters: dict[int, trio.Event] = {}  # no-reply requests not fully written
        self._assembling: dict[tuple[int, int], _Assembly] = {}
        self._assembling_bytes = 0  # the sum of their sizes (MAX_ASSEMBLING_BYTES)
        self._gather_budget = gather_budget  # shared with the server's other connections
        self._streams: dict[tuple[int, int], IncomingBody] = {}
        self._handler_room = trio.Event()
        self._active_handlers = 0
        #: The DER certificate the TLS server of this connection presented (ours when we
        #: serve), or None on a plain connection: what a channel binding is computed from.
        self.server_certificate: bytes | None = None
        #: The other end's IP address when we accepted it over TCP (None otherwise).
        self.remote_address: str | None = None

    # ------------------------------------------------------------------ public API

    @property
    def max_message_size(self) -> int:
        """The largest incoming message this connection takes (larger ones are refused with
        ``413`` and never gathered past the limit). Settable at any time: a peer keeps it at a
        hello's size until the other side has proved who it is."""
        return self._max_message_size

    @max_message_size.setter
    def max_message_size(self, size: int) -> None:
        if size < 1:
            raise ValueError("max_message_size must be positive")
        self._max_message_size = size
        self._core.max_inflated_frame = inflated_frame_limit(size)

    @property
    def send_window(self) -> int:
        """Unacknowledged bytes of one outgoing message past which it waits for an ACK:
        ``MAX_UNACKED_BYTES`` (what every BLIP receiver expects) until the application learns
        that the other side takes more (P2PSync's `wideWindow`, ``WIDE_UNACKED_BYTES``)."""
        return self._core.send_window

    @send_window.setter
    def send_window(self, size: int) -> None:
        if size < MAX_UNACKED_BYTES:
            raise ValueError(f"send_window must be at least {MAX_UNACKED_BYTES}")
        self._core.send_window = size

    @property
    def subprotocol(self) -> str:
        """The negotiated WebSocket subprotocol, e.g. ``BLIP_3+P2PSync_1``."""
        return subprotocol_for(self.app_id)

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
        self._check_unread_replies()
        if source is not None:
            await self._feed_body(RPY, number, source)

    def _send_error(self, number: int, domain: str, code: int, message: str) -> None:
        try:
            self._core.send_error(number, domain, code, truncate_utf8(message, MAX_ERROR_MESSAGE_BYTES))
        except ConnectionClosed:
            return
        self._wake_writer()
        self._check_unread_replies()

    def _check_unread_replies(self) -> None:
        """Close (1008) a peer that leaves our replies unread: more than
        :data:`MAX_QUEUED_REPLY_BYTES` of them queued with none taken for
        :data:`UNREAD_REPLY_TIMEOUT`, or more than :attr:`max_reply_backlog`."""
        owed = self._core.queued_reply_bytes
        now = trio.current_time()
        hard = self.max_reply_backlog
        if owed <= min(MAX_QUEUED_REPLY_BYTES, hard):
            self._replies_moved = now  # the clock runs only while the peer owes more
        elif owed > hard or now - self._replies_moved > UNREAD_REPLY_TIMEOUT:
            self._fail_connection(f"peer does not read our replies ({owed} bytes queued)",
                                  CloseCode.POLICY_VIOLATION)

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

    def _on_written(self, finished: list[tuple[int, int]]) -> None:
        """Wake the senders of no-reply requests now written in full."""
        sent_waiters = self._sent_waiters
        if sent_waiters:
            for mtype, number in finished:
                sent = sent_waiters.pop(number, None) if mtype == MSG else None
                if sent is not None:
                    sent.set()

    # ---------------------------------------------------------------- receiving

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
                self._send_error(number, BLIP_ERROR_DOMAIN, NOT_FOUND, f"no handler for {_quoted(profile)}")
            else:
                log.info("%s: no handler for no-reply request %s", self.name, _quoted(profile))
            return
        if isinstance(spec, StreamingHandler):
            body = IncomingBody(self, MSG, number)
            body._feed(event.body, 0, event.complete)
            if not event.complete:
                self._core.use_manual_credit(MSG, number)
                self._streams[(MSG, number)] = body
            request = Request(self, number, event.properties, b"", event.flags, body)
            self._start_handler(spec.handler, request)
        elif not event.complete:
            self._start_assembly((MSG, number), event)
        elif len(event.body) > self._max_message_size:
            self._refuse_too_large(event)  # one compressed frame inflated past the limit
        else:
            request = Request(self, number, event.properties, event.body, event.flags)
            self._start_handler(spec, request)

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
        elif not event.complete:
            self._start_assembly((RPY, number), event)
        elif len(event.body) > self._max_message_size:
            self._refuse_too_large(event)
        else:
            self._finish_reply(waiter, event, event.body)

    def _gathered(self, size: int) -> None:
        self._assembling_bytes += size
        if self._gather_budget is not None:
            self._gather_budget.used += size

    def _start_assembly(self, key: tuple[int, int], event: MessageStart) -> None:
        if len(event.body) > self._max_message_size:
            # One compressed frame can stand for 16 MiB: the limit holds from the first one.
            self._core.discard_incoming(event.type, event.number)
            self._refuse_too_large(event)
            return
        assembly = self._assembling[key] = _Assembly(event)
        self._gathered(assembly.size)
        self._check_assembling()

    @property
    def _max_assembling(self) -> int:
        return min(MAX_ASSEMBLING_BYTES, ASSEMBLING_MESSAGES * self._max_message_size)

    def _check_assembling(self) -> bool:
        """Close the connection when too much is being gathered (1009 this connection, 1013
        the server as a whole); False then."""
        limit = self._max_assembling
        if self._assembling_bytes > limit:
            self._fail_connection(f"more than {limit} bytes of messages being gathered at once",
                                  CloseCode.MESSAGE_TOO_BIG)
            return False
        budget = self._gather_budget
        if budget is not None and budget.used > budget.limit:
            self._fail_connection(f"the server is gathering more than {budget.limit} bytes at once",
                                  CloseCode.TRY_AGAIN_LATER)
            return False
        return True

    def _drop_assembly(self, key: tuple[int, int]) -> None:
        self._gathered(-self._assembling.pop(key).size)

    def _on_assembly_data(
        self, key: tuple[int, int], assembly: _Assembly, event: MessageData
    ) -> None:
        assembly.parts.append(event.data)
        assembly.size += len(event.data)
        self._gathered(len(event.data))
        start = assembly.start
        if not self._check_assembling():
            return
        if assembly.size > self._max_message_size:
            self._drop_assembly(key)
            if not event.complete:
                self._core.discard_incoming(start.type, start.number)
            self._refuse_too_large(start)
            return
        if not event.complete:
            return
        self._drop_assembly(key)
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

    def _refuse_too_large(self, start: MessageStart) -> None:
        """A message over :attr:`max_message_size` (counted after inflating): a request is
        answered 413, a reply fails its caller with 413."""
        reason = f"message larger than {self._max_message_size} bytes"
        if start.type == MSG:
            if not start.flags & NO_REPLY:
                self._send_error(start.number, BLIP_ERROR_DOMAIN, TOO_LARGE, reason)
        else:
            self._fail_waiter(start.number, BlipError(BLIP_ERROR_DOMAIN, TOO_LARGE, reason))

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

    async def _throttle_reading(self) -> None:
        """Push back on the peer: fail it when it does not read our replies, and stop reading
        while :data:`MAX_CONCURRENT_HANDLERS` handlers run."""
        if self._core.queued_messages > MAX_QUEUED_MESSAGES_HARD:
            self._fail_connection("peer sends requests but does not read replies", 1008)
        else:
            self._check_unread_replies()
        while self._active_handlers >= MAX_CONCURRENT_HANDLERS:
            self._handler_room = trio.Event()
            await self._handler_room.wait()

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

    # ---------------------------------------------------------------- the end

    def _fail_pending(self, error: ConnectionClosed) -> None:
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
        self._gathered(-self._assembling_bytes)  # gives the server's budget back too
        self._handler_room.set()


def inflated_frame_limit(max_message_size: int) -> int:
    """The most one compressed frame may inflate to on a connection that takes messages up to
    ``max_message_size``: no frame of such a message holds more than the message and its
    properties, so before hello a deflate bomb ends the connection (1002) after inflating
    ~360 KiB instead of 16 MiB. Never more than :data:`~p2psync.blip.wire.MAX_INFLATED_FRAME`."""
    return min(MAX_INFLATED_FRAME, max_message_size + MAX_PROPERTIES_SIZE + MAX_VARINT_LEN)


def _split_body(body: Body) -> tuple[bytes | bytearray | memoryview, AsyncIterable[bytes] | None]:
    """A body is either bytes (sent at once) or an async iterable of bytes (streamed)."""
    if isinstance(body, bytes | bytearray | memoryview):
        return body, None
    return b"", body


def _quoted(profile: str | None) -> str:
    """A profile name for an error or a log line, cut to :data:`MAX_QUOTED_PROFILE` characters."""
    if profile is None:
        return "None"
    return repr(profile[:MAX_QUOTED_PROFILE]) + ("…" if len(profile) > MAX_QUOTED_PROFILE else "")
