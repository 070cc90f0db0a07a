"""How a BLIP connection ends: the close procedures, over the one lifecycle state.

:class:`ClosableTransport` is the bottom of a connection: it holds what every layer shares
(the stream, websockets' sans-I/O protocol, the BLIP core, the
:class:`~p2psync.blip.lifecycle.Lifecycle`, the run scope) and every way the connection ends:

- :meth:`~ClosableTransport.aclose`: the WebSocket closing handshake with a code and reason,
  bounded by :data:`CLOSE_TIMEOUT`; a cancelled caller cuts the stream instead;
- a failure (:meth:`~ClosableTransport._fail_connection`): a close frame with an error code,
  e.g. 1002 for a BLIP protocol error;
- an abort (:meth:`~ClosableTransport._abort`): no handshake, the run scope is cancelled
  (stream broken, idle timeout).

Whichever comes first decides the close reason; :meth:`~ClosableTransport._shutdown` then fails
what still waits. The frame pumps (:mod:`p2psync.blip.pumps`) and the RPC layer
(:mod:`p2psync.blip.rpc`) build on this class.
"""

from __future__ import annotations

import logging
import math

import trio
from websockets.frames import CloseCode
from websockets.protocol import Protocol, State

from p2psync.blip.connection import BlipConnection
from p2psync.blip.errors import ConnectionClosed
from p2psync.blip.lifecycle import (
    CLOSED,
    MAX_CLOSE_REASON_BYTES,
    Lifecycle,
    check_close,
    describe_close,
    truncate_utf8,
)

log = logging.getLogger("p2psync.blip")

#: Seconds to wait for the peer's side of the closing handshake before cutting the stream.
CLOSE_TIMEOUT = 5.0


class ClosableTransport:
    """One WebSocket carrying BLIP, seen from how it ends (the base of
    :class:`~p2psync.blip.Connection`)."""

    def __init__(self, stream: trio.abc.Stream, websocket: Protocol, *, name: str) -> None:
        self.name = name
        self._stream = stream
        self._ws = websocket
        self._core = BlipConnection()
        self._lifecycle = Lifecycle(websocket)
        self._run_scope = trio.CancelScope()  # cancelled to cut the connection
        self._run_task: trio.lowlevel.Task | None = None  # the task inside run()
        # The writer's signals live here because closing uses them too: closing wakes the
        # writer to send a close frame, and wakes everything parked on its progress.
        self._wake = trio.Event()
        self._progress = trio.lowlevel.ParkingLot()  # woken after each write

    # ------------------------------------------------------------------ public API

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

    async def wait_closed(self) -> None:
        """Wait until the connection has ended."""
        await self._lifecycle.wait_closed()

    # ------------------------------------------------------------------ ending

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
        self._fail_pending(self._lifecycle.error())
        self._progress.unpark_all()

    def _wake_writer(self) -> None:
        self._wake.set()

    def _fail_pending(self, error: ConnectionClosed) -> None:
        """Fail every operation still waiting on the connection (the RPC layer's)."""
