"""A BLIP connection's life, read from one state (as h11 reads a connection from its states).

A :class:`~p2psync.blip.Connection` is in exactly one :class:`LifecycleState`, and every
question about its end (``closed``, ``close_reason``, ``close_code``, ``close_text``,
``wait_closed()``, the :class:`~p2psync.blip.errors.ConnectionClosed` its callers get) is
answered by its :class:`Lifecycle`, from that state and the WebSocket's close frames::

    CONNECTING --run()--> OPEN --an end is decided--> CLOSING --tasks ended, stream closed--> CLOSED
        |                                                ^
        +------------- aclose() before run() ------------+

Nothing here does I/O; :mod:`p2psync.blip.closing` carries the close out. Also here: the rules
of a close frame (which codes may be sent, how long a reason may be).
"""

from __future__ import annotations

import enum

import trio
from websockets.frames import Close, CloseCode
from websockets.protocol import Protocol

from p2psync.blip.errors import ConnectionClosed

#: Longest close reason, in UTF-8 bytes: a control frame carries at most 125 bytes of payload
#: and the close code takes two of them (RFC 6455 §5.5 and §5.5.1).
MAX_CLOSE_REASON_BYTES = 123
#: Close codes below 3000 that an endpoint may put in a close frame: those RFC 6455 §7.4.1
#: defines for sending and the ones IANA registered since (1012-1014). 1004-1006 and 1015
#: are reserved; 3000-4999 are for libraries and applications.
SENDABLE_CLOSE_CODES = frozenset({1000, 1001, 1002, 1003, *range(1007, 1015)})


class LifecycleState(enum.Enum):
    """Where a connection is in its life.

    - ``CONNECTING``: the WebSocket handshake is done but the connection does not run yet
      (:meth:`~p2psync.blip.Connection.run` has not started);
    - ``OPEN``: running; requests and replies flow;
    - ``CLOSING``: its end is decided and the reason fixed (a close frame, a broken stream, a
      timeout, a cancellation, a protocol error); its tasks are winding down;
    - ``CLOSED``: its tasks have ended and the stream is closed.
    """

    CONNECTING = "connecting"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


CONNECTING = LifecycleState.CONNECTING
OPEN = LifecycleState.OPEN
CLOSING = LifecycleState.CLOSING
CLOSED = LifecycleState.CLOSED


class Lifecycle:
    """The one state of a connection's life, and what is derived from it.

    The first reason given to :meth:`begin_close` is the connection's ``close_reason`` for
    good; ``close_code`` and ``close_text`` come from the close frame that began the closing
    handshake (``1006`` and ``""`` when none was exchanged).
    """

    __slots__ = ("state", "reason", "_websocket", "_ended")

    def __init__(self, websocket: Protocol) -> None:
        self.state = CONNECTING
        #: Why the connection ended: ``None`` until it leaves OPEN, then fixed.
        self.reason: str | None = None
        self._websocket = websocket
        self._ended = trio.Event()  # set on entering CLOSED

    # ------------------------------------------------------------ transitions

    def start(self) -> None:
        """CONNECTING -> OPEN: the connection runs."""
        if self.state is CONNECTING:
            self.state = OPEN

    def begin_close(self, reason: str) -> bool:
        """Enter CLOSING for ``reason``, unless the end was decided already.

        Returns True when this call decided it.
        """
        if self.state is CLOSING or self.state is CLOSED:
            return False
        self.state = CLOSING
        self.reason = reason
        return True

    def finish(self) -> None:
        """Enter CLOSED: the connection's tasks have ended and its stream is closed."""
        self.begin_close("connection closed")
        self.state = CLOSED
        self._ended.set()

    # ------------------------------------------------------------ what follows from it

    @property
    def closed(self) -> bool:
        """True once the end is decided (CLOSING or CLOSED)."""
        state = self.state
        return state is CLOSING or state is CLOSED

    async def wait_closed(self) -> None:
        """Wait until the connection is CLOSED."""
        await self._ended.wait()

    @property
    def close_code(self) -> int | None:
        """The code of the close frame that began the closing handshake, ``1006`` without one;
        ``None`` while the connection is open."""
        if not self.closed:
            return None
        frame = self._opening_close_frame()
        return int(CloseCode.ABNORMAL_CLOSURE if frame is None else frame.code)

    @property
    def close_text(self) -> str | None:
        """The reason text of that close frame; ``""`` without one, ``None`` while open."""
        if not self.closed:
            return None
        frame = self._opening_close_frame()
        return "" if frame is None else frame.reason

    def error(self) -> ConnectionClosed:
        """The exception operations get once the connection has ended."""
        return ConnectionClosed(
            self.reason or "connection closed",
            close_code=self.close_code,
            close_text=self.close_text,
        )

    def _opening_close_frame(self) -> Close | None:
        """The close frame that began the closing handshake (ours or the peer's), if any."""
        ws = self._websocket
        if ws.close_rcvd is not None and (ws.close_sent is None or ws.close_rcvd_then_sent):
            return ws.close_rcvd
        return ws.close_sent


# ---------------------------------------------------------------- close frames


def peer_close_reason(websocket: Protocol) -> str | None:
    """``close_reason`` for a close frame from the peer, if one arrived."""
    close = websocket.close_rcvd
    if close is None:
        return None
    return f"peer closed the WebSocket ({describe_close(close.code, close.reason)})"


def check_close(code: int, reason: str) -> None:
    """Refuse a close code or reason that cannot go into a close frame (``ValueError``)."""
    if not (code in SENDABLE_CLOSE_CODES or 3000 <= code < 5000):
        raise ValueError(f"close code {code} may not be sent (RFC 6455 §7.4)")
    if len(reason.encode("utf-8")) > MAX_CLOSE_REASON_BYTES:
        raise ValueError(f"close reason longer than {MAX_CLOSE_REASON_BYTES} bytes: {reason[:40]!r}...")


def describe_close(code: int, reason: str) -> str:
    """A close code and its reason text, for a log line: ``1008 P2PSync 401 ...``."""
    return f"{code} {reason}" if reason else str(code)


def truncate_utf8(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, never inside a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")
