"""The frame pumps: the trio tasks that move bytes between a stream and the state machines.

websockets' sans-I/O protocol (``ClientProtocol`` / ``ServerProtocol``) does the WebSocket
framing and :class:`~p2psync.blip.connection.BlipConnection` does BLIP. :meth:`Transport.run`
runs three tasks in the connection's own nursery:

- the reader: receives bytes, feeds both state machines and hands the BLIP events to the RPC
  layer (:meth:`Transport._dispatch`), a slice of frames at a time so that replies to the
  first requests of a read go out while later ones are handled. It never waits on a write;
- the writer, the only task that writes to the stream: woken by an event, it drains every
  frame the state machines have (up to a batch) into one ``send_all``;
- the keepalive: WebSocket pings at an interval and an idle timeout above it.

The RPC layer (:mod:`p2psync.blip.rpc`) subclasses :class:`Transport` and fills in three
hooks: what to do with BLIP events, which messages were fully written, and when the reader
must pause.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from websockets.frames import Opcode
from websockets.protocol import Protocol, State

from p2psync.blip import heap
from p2psync.blip.closing import CLOSE_TIMEOUT, ClosableTransport, log
from p2psync.blip.connection import ConnectionState, Event
from p2psync.blip.errors import ConnectionClosed, ProtocolError
from p2psync.blip.lifecycle import CONNECTING, describe_close, peer_close_reason

#: Seconds between WebSocket pings. Short enough for NAT and LAN idle timers (typically
#: 60 s and more), long enough to cost nothing.
PING_INTERVAL = 20.0
#: Seconds without any byte from the peer (a pong counts) after which the connection is
#: dropped: three missed pings.
IDLE_TIMEOUT = 60.0
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


class Transport(ClosableTransport):
    """A running BLIP-over-WebSocket connection without the RPC: its tasks and their signals
    (the base of :class:`~p2psync.blip.Connection`)."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        websocket: Protocol,
        *,
        name: str,
        ping_interval: float | None,
        idle_timeout: float | None,
    ) -> None:
        if ping_interval is not None and idle_timeout is not None and idle_timeout <= ping_interval:
            raise ValueError("idle_timeout must be longer than ping_interval")
        super().__init__(stream, websocket, name=name)
        self._ping_interval = ping_interval
        self._idle_timeout = idle_timeout
        self._nursery: trio.Nursery | None = None  # run()'s, while it runs
        self._partial: list[bytes] | None = None  # a fragmented WebSocket message
        self._writing = False  # the writer is inside send_all
        self._last_receive = 0.0
        self._replies_moved = 0.0  # when reply bytes last went out or none were owed (rpc)

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

    # ------------------------------------------------------------------ running

    @property
    def last_receive(self) -> float:
        """Trio time of the last bytes from the peer (a pong counts): on a healthy connection,
        never older than :data:`PING_INTERVAL` and a round trip."""
        return self._last_receive

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
        self._last_receive = self._replies_moved = trio.current_time()
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
            # What it held is free now: give the heap back once enough has gone through.
            heap.TRIMMER.connection_ended(self._core.bytes_received + self._core.bytes_sent)

    # ------------------------------------------------------------------ hooks (the RPC layer)

    def _dispatch(self, events: list[Event]) -> None:
        """Handle the BLIP events of one incoming WebSocket message."""
        raise NotImplementedError

    def _on_written(self, finished: list[tuple[int, int]]) -> None:
        """These messages (type, number) have been written in full."""

    async def _throttle_reading(self) -> None:
        """Called after each read: return when the reader may read again."""

    # ------------------------------------------------------------------ the tasks

    async def _writer(self) -> None:
        core = self._core
        ws = self._ws
        stream = self._stream
        progress = self._progress
        try:
            while True:
                finished: list[tuple[int, int]] = []
                if core.wants_to_send and ws.state is State.OPEN:
                    owed = core.queued_reply_bytes
                    send_binary = ws.send_binary
                    for frame in core.frames_to_send(WRITE_BATCH):
                        send_binary(frame)
                    finished = core.take_finished()
                    if core.queued_reply_bytes < owed:
                        self._replies_moved = trio.current_time()
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
                if finished:
                    self._on_written(finished)
                if progress:
                    progress.unpark_all()
                if chunks:
                    continue
                if not core.wants_to_send or ws.state is not State.OPEN:
                    self._wake = trio.Event()
                    await self._wake.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._abort(f"write failed: {exc}")

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
            if ws.parser_exc is not None and not self._lifecycle.closed:
                # websockets failed the connection itself (a message over the size limit: 1009,
                # a malformed frame: 1002) and queued its close frame, with no event for us:
                # send the frame now and end, rather than wait for the idle timeout.
                self._websocket_failure(ws)
            await self._throttle_reading()

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

    def _websocket_failure(self, ws: Protocol) -> None:
        sent = ws.close_sent
        code = f" ({describe_close(sent.code, '')})" if sent is not None else ""
        reason = f"websocket error{code}: {ws.parser_exc}"
        log.warning("%s: closing: %s", self.name, reason)
        self._shutdown(reason)
        self._wake_writer()
        self._start_close_deadline()

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


def _only_cancelled(exc: BaseException) -> bool:
    """True for ``Cancelled``, or a group holding nothing else (how a nursery reports it)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


async def _send_eof(stream: trio.abc.Stream) -> None:
    """End our direction of the stream, as the WebSocket closing handshake asks (RFC 6455 §7.1.1:
    the server closes TCP first). TLS cannot half-close (its close_notify ends both directions),
    so a TLS stream is closed whole: the handshake is over by then, there is nothing left to read."""
    if isinstance(stream, trio.abc.HalfCloseableStream):
        await stream.send_eof()
    else:
        await stream.aclose()
