"""The BLIP_3 connection state machine, without I/O (in the manner of h11 and wsproto).

:class:`BlipConnection` takes the binary WebSocket messages that arrive and returns events
(:class:`MessageStart`, :class:`MessageData`, :class:`MessageFailed`, :class:`FrameIgnored`);
it takes messages to send and hands back, on demand, the frames to put on the wire. It never
touches a socket or a clock, so the same object runs over TCP, over in-memory streams and in a
simulator.

What it does for its caller:

- numbering: requests per direction from 1, one by one; replies reuse their request's number;
- the outbox: round-robin of messages, one frame each turn; urgent messages go ahead but leave
  one normal message between them so normal ones never starve; a new message never starts
  before an older one that has not begun; bulk replies (a body of
  :data:`~p2psync.blip.wire.BULK_REPLY_BYTES` or more) take their turns one at a time, in the
  order they were queued;
- frame sizes: :data:`~p2psync.blip.wire.FRAME_SIZE`, or
  :data:`~p2psync.blip.wire.BIG_FRAME_SIZE` for an urgent message or when nothing else waits;
- flow control: ACKs every :data:`~p2psync.blip.wire.ACK_INTERVAL` bytes of an incoming
  multi-frame message; an outgoing message pauses while more than
  :attr:`BlipConnection.send_window` of it (:data:`~p2psync.blip.wire.MAX_UNACKED_BYTES`, or
  :data:`~p2psync.blip.wire.WIDE_UNACKED_BYTES` once the peer takes that) are unacknowledged;
- the CRC and deflate state of each direction (:mod:`p2psync.blip.codec`);
- error handling: fatal errors raise :class:`~p2psync.blip.errors.ProtocolError` and leave the
  connection in :attr:`ConnectionState.ERROR`; frame errors are reported as
  :class:`FrameIgnored` and the frame is skipped.

Incoming bodies arrive in pieces (the first piece with the properties); a caller that
assembles them leaves flow control to this object, a caller that streams them calls
:meth:`BlipConnection.use_manual_credit` and then :meth:`BlipConnection.credit` as its consumer
takes the data, so ACKs (and hence the sender) follow the consumer.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from p2psync.blip.codec import FrameDecoder, FrameEncoder
from p2psync.blip.errors import BLIP_ERROR_DOMAIN, ConnectionClosed, ProtocolError
from p2psync.blip.wire import (
    ACK_INTERVAL,
    ACK_MSG,
    ACK_RPY,
    BIG_FRAME_SIZE,
    BULK_REPLY_BYTES,
    CHECKSUM_SIZE,
    COMPRESSED,
    COMPRESSION_LEVEL,
    DEFLATE_SLACK,
    ERR,
    ERROR_CODE_PROPERTY,
    ERROR_DOMAIN_PROPERTY,
    FRAME_SIZE,
    MAX_PROPERTIES_SIZE,
    MAX_UNACKED_BYTES,
    MAX_VARINT_LEN,
    MORE_COMING,
    MSG,
    NO_REPLY,
    RPY,
    TYPE_MASK,
    TYPE_NAMES,
    URGENT,
    decode_properties,
    decode_uvarint,
    describe_flags,
    encode_message_head,
    encode_uvarint,
)

BytesLike = bytes | bytearray | memoryview

#: Bodies up to this size are joined to their properties at enqueue time, so a small message
#: leaves as one slice (one copy now saves a join per frame later).
_JOIN_BELOW = FRAME_SIZE
#: BLIP error code for a request we could not parse (HTTP's 400, as BLIP codes follow HTTP).
MALFORMED_REQUEST_CODE = 400


class ConnectionState(enum.Enum):
    """Where a :class:`BlipConnection` is: usable, closed by its owner, or failed."""

    OPEN = "open"
    CLOSED = "closed"
    ERROR = "error"


# --- Events ---


@dataclass(slots=True)
class MessageStart:
    """The first part of an incoming message: its properties and the body bytes so far.

    ``type`` is MSG, RPY or ERR; ``complete`` is true when ``body`` is the whole body (a
    single-frame message). ``size`` counts the message's frame bytes so far; they are credited
    for flow control already (manual credit, if wanted, starts after this event).
    """

    type: int
    number: int
    flags: int
    properties: dict[str, str]
    body: bytes
    complete: bool
    size: int


@dataclass(slots=True)
class MessageData:
    """More body bytes of an incoming message; ``complete`` marks its last piece.

    ``size`` is the frame's flow-control byte count: under manual credit, pass it to
    :meth:`BlipConnection.credit` once the data is consumed. ``data`` of an uncompressed
    frame is a read-only view into the WebSocket message it came in (no copy; nothing changes
    that message afterwards); ``bytes(data)`` when bytes are needed.
    """

    type: int
    number: int
    data: bytes | memoryview
    complete: bool
    size: int


@dataclass(slots=True)
class MessageFailed:
    """An incoming message could not be read (malformed properties) and is dropped.

    For a request that wanted a reply, the connection has already queued an ERR reply
    (BLIP 400) so the peer does not wait forever.
    """

    type: int
    number: int
    reason: str


@dataclass(slots=True)
class FrameIgnored:
    """A frame was skipped (frame error): unknown type, finished message, bad ACK body."""

    number: int
    flags: int
    reason: str


Event = MessageStart | MessageData | MessageFailed | FrameIgnored


# --- Internal message state ---


class _Outgoing:
    """A message being sent: what is left of it and its flow-control counts."""

    __slots__ = (
        "type",
        "number",
        "flags",
        "urgent",
        "data",
        "rest",
        "pending",
        "done",
        "sent",
        "acked",
        "started",
        "paused",
        "queued",
        "tracked",
    )

    def __init__(self, mtype: int, number: int, flags: int, data: BytesLike, done: bool) -> None:
        self.type = mtype
        self.number = number
        self.flags = flags
        self.urgent = bool(flags & URGENT)
        self.data = data  # the front segment of what is left to frame ("" when nothing is)
        self.rest: deque[BytesLike] | None = None  # the segments behind it
        self.pending = len(data)  # bytes left to frame
        self.done = done  # no more body bytes will be appended
        self.sent = 0  # flow-control bytes sent (frame bytes after the header)
        self.acked = 0  # flow-control bytes the peer acknowledged
        self.started = False  # has at least one frame left?
        self.paused = False  # waiting for an ACK (the "icebox")
        self.queued = False  # in the outbox
        self.tracked = False  # in the connection's table (ACKs and appends find it there)

    def append(self, data: BytesLike) -> None:
        if not self.pending:
            self.data = data
        else:
            if self.rest is None:
                self.rest = deque()
            self.rest.append(data)
        self.pending += len(data)

    def take(self, room: int) -> BytesLike:
        """Remove up to ``room`` bytes from the front of what is left to frame."""
        data = self.data
        n = len(data)
        if n > room:
            view = data if isinstance(data, memoryview) else memoryview(data)
            self.data = view[room:]
            self.pending -= room
            return view[:room]
        rest = self.rest
        if not rest:
            self.data = b""
            self.pending -= n
            return data
        pieces = [data]
        total = n
        while rest and total < room:
            nxt = rest.popleft()
            want = room - total
            if len(nxt) > want:
                view = nxt if isinstance(nxt, memoryview) else memoryview(nxt)
                pieces.append(view[:want])
                rest.appendleft(view[want:])
                total = room
                break
            pieces.append(nxt)
            total += len(nxt)
        self.data = rest.popleft() if rest else b""
        self.pending -= total
        return b"".join(pieces)


class _Incoming:
    """A message being received: its unparsed head and its flow-control counts."""

    __slots__ = ("type", "number", "flags", "head", "received", "credited", "manual", "dropped")

    def __init__(self, mtype: int, number: int, flags: int) -> None:
        self.type = mtype
        self.number = number
        self.flags = flags
        self.head: bytearray | None = bytearray()  # None once the properties are parsed
        self.received = 0
        self.credited = 0
        self.manual = False  # the caller credits bytes as its consumer takes them
        self.dropped = False  # failed or discarded: later frames are swallowed


def _parse_head(data: BytesLike) -> tuple[dict[str, str], int] | None:
    """Parse ``uvarint(length) | properties`` at the start of ``data``.

    Returns ``(properties, offset of the body)``, or ``None`` when ``data`` ends before the
    properties do. Raises ``ValueError`` when the head is malformed.
    """
    n = len(data)
    if n and data[0] < 0x80:
        length, pos = data[0], 1
    else:
        if n < MAX_VARINT_LEN and all(b & 0x80 for b in data):
            return None  # the length itself continues in the next frame
        try:
            length, pos = decode_uvarint(data, 0)
        except ProtocolError as exc:
            raise ValueError(f"bad properties length: {exc}") from None
    if length > MAX_PROPERTIES_SIZE:
        raise ValueError(f"properties length {length} exceeds {MAX_PROPERTIES_SIZE} bytes")
    end = pos + length
    if end > n:
        return None
    return decode_properties(data[pos:end]), end


class BlipConnection:
    """One BLIP_3 connection's protocol state; feed it frames, ask it for frames.

    Typical use by an I/O adapter::

        conn = BlipConnection()
        number = conn.send_request({"Profile": "echo"}, b"hi")
        for frame in conn.frames_to_send(): websocket.send_binary(frame)
        ...
        for event in conn.receive_message(binary_message): handle(event)
    """

    def __init__(self, *, compression_level: int = COMPRESSION_LEVEL) -> None:
        self.state = ConnectionState.OPEN
        #: Why the connection failed (ERROR state), for logs.
        self.error: str | None = None
        #: Frame body bytes taken in (after inflating) and frame bytes produced, ACKs aside.
        self.bytes_received = 0
        self.bytes_sent = 0
        #: Unacknowledged bytes of one outgoing message past which it pauses (the window):
        #: MAX_UNACKED_BYTES, or more once the peer said it takes more (WIDE_UNACKED_BYTES).
        self.send_window = MAX_UNACKED_BYTES
        self._encoder = FrameEncoder(compression_level)
        self._decoder = FrameDecoder()
        # Outgoing side.
        self._last_request_out = 0  # number of the last request we queued
        self._awaiting_reply: set[int] = set()  # our requests whose reply has not begun
        # Messages that can get ACKs or body appends: multi-frame or streamed ones.
        self._out_requests: dict[int, _Outgoing] = {}
        self._out_replies: dict[int, _Outgoing] = {}
        self._unfinished = 0  # outgoing messages whose last frame has not left
        self._reply_backlog = 0  # bytes of replies (RPY, ERR) queued and not yet framed
        self._outbox: deque[_Outgoing] = deque()
        # The bulk reply in the outbox's rotation, and those queued behind it (not in the outbox).
        self._bulk: _Outgoing | None = None
        self._bulk_waiting: deque[_Outgoing] = deque()
        # ACKs due, as (ack type, number, count): one per crossing of an ACK_INTERVAL multiple,
        # carrying the count at the crossing frame (what the spec says, and what a strict
        # peer checks). A frame is smaller than the interval, so a frame makes at most one.
        self._acks: list[tuple[int, int, int]] = []
        self._finished: list[tuple[int, int]] = []  # (type, number) whose last frame left
        # Incoming side.
        self._last_request_in = 0  # number of the last request the peer started
        self._replies_owed: set[int] = set()  # peer requests that want a reply from us
        self._in_requests: dict[int, _Incoming] = {}  # multi-frame requests in progress
        self._in_replies: dict[int, _Incoming] = {}  # multi-frame replies in progress

    # ------------------------------------------------------------------ sending

    def send_request(
        self,
        properties: Mapping[str, str],
        body: BytesLike = b"",
        *,
        urgent: bool = False,
        compressed: bool = False,
        no_reply: bool = False,
        more_body: bool = False,
    ) -> int:
        """Queue a request; return its message number.

        With ``more_body`` the body continues through :meth:`append_body`. Raises
        ``ValueError`` for bad properties and :class:`ConnectionClosed` when not open.
        """
        if self.state is not ConnectionState.OPEN:
            raise ConnectionClosed(self.error or "connection closed")
        head = encode_message_head(properties)
        number = self._last_request_out = self._last_request_out + 1
        flags = MSG
        if urgent:
            flags |= URGENT
        if compressed:
            flags |= COMPRESSED
        if no_reply:
            flags |= NO_REPLY
        else:
            self._awaiting_reply.add(number)
        self._add_outgoing(MSG, number, flags, head, body, more_body, self._out_requests)
        return number

    def send_reply(
        self,
        number: int,
        properties: Mapping[str, str],
        body: BytesLike = b"",
        *,
        urgent: bool = False,
        compressed: bool = False,
        more_body: bool = False,
    ) -> None:
        """Queue the reply to the peer's request ``number``.

        Raises ``ValueError`` when that request does not want a reply (unknown, no-reply, or
        answered already) and :class:`ConnectionClosed` when not open.
        """
        self._send_response(RPY, number, properties, body, urgent, compressed, more_body)

    def send_error(
        self,
        number: int,
        domain: str,
        code: int,
        message: str = "",
        *,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        """Queue an ERR reply to request ``number`` with ``Error-Domain`` and ``Error-Code``."""
        props = dict(properties) if properties else {}
        props[ERROR_DOMAIN_PROPERTY] = domain
        props[ERROR_CODE_PROPERTY] = str(int(code))
        self._send_response(ERR, number, props, message.encode(), False, False, False)

    def append_body(self, mtype: int, number: int, data: BytesLike, *, end: bool) -> None:
        """Add body bytes to an outgoing message queued with ``more_body``.

        ``mtype`` is MSG for a request, RPY or ERR for a reply. ``end`` says these are the last.
        """
        self._check_open()
        table = self._out_requests if mtype == MSG else self._out_replies
        msg = table.get(number)
        if msg is None or msg.done:
            raise ValueError(f"{TYPE_NAMES.get(mtype, mtype)} #{number} takes no more body")
        if data:
            msg.append(data)
            if mtype != MSG:
                self._reply_backlog += len(data)
        if end:
            msg.done = True
        if not msg.queued:
            self._reschedule(msg)

    def outgoing_backlog(self, mtype: int, number: int) -> int | None:
        """Bytes of an outgoing message queued but not yet framed; ``None`` once it is gone.

        A streaming producer keeps this small, so a paused message holds little memory.
        """
        table = self._out_requests if mtype == MSG else self._out_replies
        msg = table.get(number)
        return None if msg is None else msg.pending

    def outgoing_progress(self, mtype: int, number: int) -> tuple[int, int, bool] | None:
        """``(bytes sent, bytes acknowledged, paused)`` of a message still being sent."""
        table = self._out_requests if mtype == MSG else self._out_replies
        msg = table.get(number)
        return None if msg is None else (msg.sent, msg.acked, msg.paused)

    @property
    def wants_to_send(self) -> bool:
        """True when :meth:`frames_to_send` would return something."""
        return bool(self._outbox or self._acks)

    @property
    def max_inflated_frame(self) -> int:
        """The most one incoming compressed frame may inflate to; a frame that inflates beyond
        it is a fatal error (:data:`~p2psync.blip.wire.MAX_INFLATED_FRAME` by default)."""
        return self._decoder.max_inflated

    @max_inflated_frame.setter
    def max_inflated_frame(self, size: int) -> None:
        self._decoder.max_inflated = size

    @property
    def queued_messages(self) -> int:
        """Outgoing messages not yet fully sent (queued, paused or waiting for body data)."""
        return self._unfinished

    @property
    def queued_reply_bytes(self) -> int:
        """Bytes of our replies (RPY and ERR, properties and body) queued but not yet framed:
        what a peer that sends requests and does not read the answers makes us hold."""
        return self._reply_backlog

    def frames_to_send(self, max_bytes: int = 256 * 1024) -> list[bytes]:
        """Produce frames, ACKs first, then one frame per message in outbox order.

        Stops once about ``max_bytes`` are produced (so one call is one write's worth) or when
        every message left is paused or waiting for body data.
        """
        out: list[bytes] = []
        if self.state is not ConnectionState.OPEN:
            return out
        if self._acks:
            encode_ack = self._encoder.encode_ack
            for ack_type, number, count in self._acks:
                out.append(encode_ack(number, ack_type | URGENT | NO_REPLY, count))
            self._acks.clear()
        outbox = self._outbox
        encode = self._encoder.encode
        finished = self._finished
        total = 0
        while outbox and total < max_bytes:
            msg = outbox.popleft()
            msg.queued = False
            number = msg.number
            if number < 0x80:
                header_len = 2
            elif number < 0x4000:
                header_len = 3
            else:
                header_len = len(encode_uvarint(number)) + 1
            limit = BIG_FRAME_SIZE if (msg.urgent or not outbox) else FRAME_SIZE
            room = limit - header_len - CHECKSUM_SIZE
            flags = msg.flags
            if flags & COMPRESSED:
                room -= DEFLATE_SLACK
            chunk = msg.take(room) if msg.pending else b""
            if msg.type != MSG:
                self._reply_backlog -= len(chunk)
            more = msg.pending > 0 or not msg.done
            if more:
                flags |= MORE_COMING
            elif not chunk:
                # The empty last frame of a streamed body: nothing to deflate.
                flags &= ~COMPRESSED
            frame = encode(number, flags, chunk)
            out.append(frame)
            size = len(frame)
            total += size
            msg.sent += size - header_len
            msg.started = True
            if more:
                if not msg.tracked:
                    msg.tracked = True
                    (self._out_requests if msg.type == MSG else self._out_replies)[number] = msg
                if msg.sent - msg.acked > self.send_window:
                    msg.paused = True
                elif msg.pending or msg.done:
                    self._enqueue(msg)
                # else: a streamed body ran dry; append_body() queues it again.
            else:
                if msg.tracked:
                    del (self._out_requests if msg.type == MSG else self._out_replies)[number]
                self._unfinished -= 1
                finished.append((msg.type, number))
                if msg is self._bulk:
                    self._bulk = self._bulk_waiting.popleft() if self._bulk_waiting else None
                    if self._bulk is not None:
                        self._enqueue(self._bulk)
        self.bytes_sent += total
        return out

    def take_finished(self) -> list[tuple[int, int]]:
        """``(type, number)`` of outgoing messages whose last frame was produced since the
        previous call (for callers that wait until a no-reply request has left)."""
        finished, self._finished = self._finished, []
        return finished

    # ---------------------------------------------------------------- receiving

    def receive_message(self, data: BytesLike | str) -> list[Event]:
        """Process one WebSocket message from the peer; return the events it produced.

        Raises :class:`ProtocolError` on a fatal error (and stays in the ERROR state).
        """
        if self.state is not ConnectionState.OPEN:
            if self.state is ConnectionState.ERROR:
                raise ProtocolError(f"connection already failed: {self.error}")
            return []
        if isinstance(data, str):
            self._fail("text WebSocket message (BLIP frames are binary)")
        try:
            number, flags, body, size = self._decoder.decode(data)
        except ProtocolError as exc:
            self._fail(str(exc))
        self.bytes_received += len(body)
        mtype = flags & TYPE_MASK
        if mtype == MSG:
            incoming = self._in_requests.get(number)
            if incoming is None:
                if number == self._last_request_in + 1:
                    self._last_request_in = number
                    if not flags & NO_REPLY:
                        self._replies_owed.add(number)
                    return self._first_frame(MSG, number, flags, body, size, self._in_requests)
                if number <= self._last_request_in:
                    return [FrameIgnored(number, flags, "frame for a finished request")]
                expected = self._last_request_in + 1
                self._fail(f"request #{number} out of sequence (expected #{expected})")
            return self._next_frame(incoming, flags, body, size, self._in_requests)
        if mtype in (RPY, ERR):
            incoming = self._in_replies.get(number)
            if incoming is None:
                if number in self._awaiting_reply:
                    self._awaiting_reply.discard(number)
                    return self._first_frame(mtype, number, flags, body, size, self._in_replies)
                if 0 < number <= self._last_request_out:
                    return [FrameIgnored(number, flags, "reply to a request that has no reply due")]
                self._fail(f"reply #{number} to a request never sent")
            return self._next_frame(incoming, flags, body, size, self._in_replies)
        if mtype in (ACK_MSG, ACK_RPY):
            return self._receive_ack(mtype, number, flags, body)
        return [FrameIgnored(number, flags, f"unknown frame type {mtype}")]

    def use_manual_credit(self, mtype: int, number: int) -> None:
        """From now on, count an incoming message's bytes only when :meth:`credit` says so.

        A streaming consumer calls this on :class:`MessageStart`, then :meth:`credit` with each
        event's ``size`` as it takes the data: ACKs then follow the consumer, and a consumer
        that stops reading stops the sender within one window.
        """
        incoming = (self._in_requests if mtype == MSG else self._in_replies).get(number)
        if incoming is not None:
            incoming.manual = True

    def credit(self, mtype: int, number: int, size: int) -> None:
        """Count ``size`` more bytes of an incoming message as consumed (manual credit)."""
        incoming = (self._in_requests if mtype == MSG else self._in_replies).get(number)
        if incoming is not None and self.state is ConnectionState.OPEN:
            self._add_credit(incoming, size)

    def discard_incoming(self, mtype: int, number: int) -> None:
        """Stop delivering events for an incoming message; its later frames are swallowed
        (still checksummed and acknowledged, so the sender can finish)."""
        incoming = (self._in_requests if mtype == MSG else self._in_replies).get(number)
        if incoming is not None:
            incoming.dropped = True
            incoming.manual = False

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Mark the connection closed by its owner: nothing more is sent or delivered."""
        if self.state is ConnectionState.OPEN:
            self.state = ConnectionState.CLOSED
        self._outbox.clear()
        self._bulk, self._bulk_waiting = None, deque()
        self._acks.clear()
        self._out_requests.clear()
        self._out_replies.clear()
        self._unfinished = 0
        self._reply_backlog = 0

    # ---------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self.state is not ConnectionState.OPEN:
            raise ConnectionClosed(self.error or "connection closed")

    def _fail(self, reason: str) -> NoReturn:
        """Enter the ERROR state and raise the fatal error."""
        self.state = ConnectionState.ERROR
        self.error = reason
        self._outbox.clear()
        self._bulk, self._bulk_waiting = None, deque()
        self._acks.clear()
        self._reply_backlog = 0
        raise ProtocolError(reason)

    def _add_outgoing(
        self,
        mtype: int,
        number: int,
        flags: int,
        head: bytes,
        body: BytesLike,
        more_body: bool,
        table: dict[int, _Outgoing],
    ) -> None:
        if len(body) < _JOIN_BELOW:
            msg = _Outgoing(mtype, number, flags, head + body if body else head, not more_body)
        else:
            msg = _Outgoing(mtype, number, flags, head, not more_body)
            msg.append(body)
        if mtype != MSG:
            self._reply_backlog += msg.pending
        if more_body:
            msg.tracked = True
            table[number] = msg
        self._unfinished += 1
        if mtype != MSG and not more_body and not msg.urgent and msg.pending >= BULK_REPLY_BYTES:
            if self._bulk is not None:
                self._bulk_waiting.append(msg)
                return
            self._bulk = msg
        self._enqueue(msg)

    def _send_response(
        self,
        mtype: int,
        number: int,
        properties: Mapping[str, str],
        body: BytesLike,
        urgent: bool,
        compressed: bool,
        more_body: bool,
    ) -> None:
        self._check_open()
        if number not in self._replies_owed:
            raise ValueError(f"request #{number} wants no reply (unknown, no-reply or answered)")
        head = encode_message_head(properties)
        self._replies_owed.discard(number)
        flags = mtype
        if urgent:
            flags |= URGENT
        if compressed:
            flags |= COMPRESSED
        self._add_outgoing(mtype, number, flags, head, body, more_body, self._out_replies)

    def _reschedule(self, msg: _Outgoing) -> None:
        """Queue a message again unless it waits for an ACK or (streamed) for body data."""
        if not msg.paused and (msg.pending or msg.done):
            self._enqueue(msg)

    def _enqueue(self, msg: _Outgoing) -> None:
        """Put a message in the outbox where its next frame should go.

        Normal messages join the back. An urgent message goes after the last urgent one with
        one normal message in between (at the front, behind one normal message, when no
        other urgent one waits), so normal messages get at least every other frame. A message
        that has not begun never goes ahead of another one that has not begun, which keeps
        first frames (and so request numbers) in order.
        """
        msg.queued = True
        outbox = self._outbox
        if not msg.urgent or len(outbox) < 2:
            outbox.append(msg)
            return
        position = 1
        last_fresh = -1
        for i, other in enumerate(outbox):
            if other.urgent:
                position = i + 2
            if not other.started:
                last_fresh = i
        if not msg.started and position <= last_fresh:
            position = last_fresh + 1
        outbox.insert(min(position, len(outbox)), msg)

    def _first_frame(
        self,
        mtype: int,
        number: int,
        flags: int,
        body: bytes | memoryview,
        size: int,
        table: dict[int, _Incoming],
    ) -> list[Event]:
        more = flags & MORE_COMING
        if not more:
            # Fast path: a whole message in one frame, usually with a one-byte length.
            if body and body[0] < 0x80:
                end = body[0] + 1
                if end <= len(body):
                    try:
                        properties = decode_properties(body[1:end])
                    except ValueError as exc:
                        return self._malformed(mtype, number, flags, str(exc), None)
                    return [MessageStart(mtype, number, flags, properties, bytes(body[end:]), True, size)]
            try:
                parsed = _parse_head(body)
                if parsed is None:
                    raise ValueError("message ends inside its properties")
            except ValueError as exc:
                return self._malformed(mtype, number, flags, str(exc), None)
            properties, offset = parsed
            return [MessageStart(mtype, number, flags, properties, bytes(body[offset:]), True, size)]
        incoming = _Incoming(mtype, number, flags)
        table[number] = incoming
        return self._next_frame(incoming, flags, body, size, table)

    def _next_frame(
        self,
        incoming: _Incoming,
        flags: int,
        body: bytes | memoryview,
        size: int,
        table: dict[int, _Incoming],
    ) -> list[Event]:
        more = flags & MORE_COMING
        if not more:
            del table[incoming.number]
        else:
            incoming.received += size
            if not incoming.manual:
                self._add_credit(incoming, size)
        if incoming.dropped:
            return []
        head = incoming.head
        if head is None:
            return [MessageData(incoming.type, incoming.number, body, not more, size)]
        head += body
        try:
            parsed = _parse_head(head)
            if parsed is None and not more:
                raise ValueError("message ends inside its properties")
        except ValueError as exc:
            return self._malformed(
                incoming.type, incoming.number, incoming.flags, str(exc), incoming
            )
        if parsed is None:
            return []
        properties, offset = parsed
        incoming.head = None
        return [
            MessageStart(
                incoming.type,
                incoming.number,
                incoming.flags,
                properties,
                bytes(head[offset:]),
                not more,
                incoming.received if more else incoming.received + size,
            )
        ]

    def _malformed(
        self, mtype: int, number: int, flags: int, reason: str, incoming: _Incoming | None
    ) -> list[Event]:
        if incoming is not None:
            incoming.dropped = True
            incoming.manual = False
        if mtype == MSG and number in self._replies_owed:
            self.send_error(number, BLIP_ERROR_DOMAIN, MALFORMED_REQUEST_CODE, reason)
        return [MessageFailed(mtype, number, f"malformed properties: {reason}")]

    def _add_credit(self, incoming: _Incoming, size: int) -> None:
        before = incoming.credited
        after = incoming.credited = before + size
        if after // ACK_INTERVAL != before // ACK_INTERVAL:
            ack_type = ACK_MSG if incoming.type == MSG else ACK_RPY
            self._acks.append((ack_type, incoming.number, after))

    def _receive_ack(self, mtype: int, number: int, flags: int, body: bytes | memoryview) -> list[Event]:
        table = self._out_requests if mtype == ACK_MSG else self._out_replies
        msg = table.get(number)
        try:
            count, _ = decode_uvarint(body, 0)
        except ProtocolError as exc:
            return [FrameIgnored(number, flags, f"bad ACK body: {exc}")]
        if msg is None:
            return []  # the message finished meanwhile: a late ACK is normal
        if count > msg.sent:
            return [FrameIgnored(number, flags, f"ACK of {count} bytes, only {msg.sent} sent")]
        if count > msg.acked:
            msg.acked = count
            if msg.paused and msg.sent - count <= self.send_window:
                msg.paused = False
                self._reschedule(msg)
        return []


def describe_event(event: Event) -> str:
    """One line for logs."""
    if isinstance(event, FrameIgnored):
        return f"ignored frame #{event.number} ({describe_flags(event.flags)}): {event.reason}"
    name = TYPE_NAMES.get(event.type, str(event.type))
    if isinstance(event, MessageFailed):
        return f"{name} #{event.number} failed: {event.reason}"
    if isinstance(event, MessageStart):
        return f"{name} #{event.number} start {event.properties} ({len(event.body)} bytes)"
    return f"{name} #{event.number} data ({len(event.data)} bytes)"
