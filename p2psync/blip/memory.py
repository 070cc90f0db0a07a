"""BLIP connections over in-memory streams, for deterministic tests.

Both helpers go through the real thing: the WebSocket opening handshake, BLIP framing, pings,
the idle timeout and the closing handshake, only over ``trio.testing.memory_stream_pair()``
instead of TCP. Nothing here touches a socket or the real clock, so tests run under
``trio.testing.MockClock(autojump_threshold=0)`` and hours of virtual time pass in
milliseconds:

- :func:`memory_pair` yields two running, connected connections (:class:`~p2psync.blip.Connection`);
- :class:`MemoryListener` is a trio listener whose clients call :meth:`MemoryListener.connect`,
  so :func:`~p2psync.blip.serve_listeners` (or :meth:`BlipServer.serve_stream
  <p2psync.blip.BlipServer.serve_stream>` per stream) runs a server, ``on_connect`` included,
  exactly as it runs over TCP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import trio

from p2psync.blip.errors import ConnectionClosed
from p2psync.blip.handshake import DEFAULT_APP_ID, accept_stream, connect_stream
from p2psync.blip.pumps import IDLE_TIMEOUT, PING_INTERVAL
from p2psync.blip.rpc import MAX_MESSAGE_SIZE, Connection, HandlerSpec

#: In-memory connections waiting to be accepted before :meth:`MemoryListener.connect` waits
#: too: Linux's historical ``listen()`` backlog (SOMAXCONN was 128 until kernel 5.4).
MEMORY_BACKLOG = 128


@asynccontextmanager
async def memory_pair(
    app_id: str = DEFAULT_APP_ID,
    handlers_a: Mapping[str, HandlerSpec] | None = None,
    handlers_b: Mapping[str, HandlerSpec] | None = None,
    *,
    ping_interval: float | None = PING_INTERVAL,
    idle_timeout: float | None = IDLE_TIMEOUT,
    max_message_size: int = MAX_MESSAGE_SIZE,
    streams: tuple[trio.abc.Stream, trio.abc.Stream] | None = None,
) -> AsyncIterator[tuple[Connection, Connection]]:
    """Two connected, running BLIP connections over in-memory streams::

        async with blip.memory_pair("P2PSync_1", handlers_a, handlers_b) as (a, b):
            reply = await a.request("echo", body=b"hi")   # answered by handlers_b

    ``a`` is the WebSocket client (:func:`~p2psync.blip.connect_stream`), ``b`` the server
    (:func:`~p2psync.blip.accept_stream`); either may send requests. ``handlers_a`` answer
    what ``b`` asks and ``handlers_b`` what ``a`` asks. Leaving the block closes ``a``
    normally and waits until ``b`` has ended too; an exception from the block comes out as
    itself. ``streams`` replaces the fresh ``trio.testing.memory_stream_pair()`` with two
    ends of your own (e.g. wrapped to count or drop traffic): ``a`` uses the first.
    """
    if streams is None:
        # Imported here: trio.testing imports pytest where it is installed (~75 ms a process).
        from trio.testing import memory_stream_pair

        streams = memory_stream_pair()
    stream_a, stream_b = streams
    accepted: list[Connection] = []
    b_failed: list[BaseException] = []
    b_ready = trio.Event()

    async def run_b() -> None:
        try:
            async with accept_stream(
                stream_b,
                app_id=app_id,
                handlers=handlers_b,
                ping_interval=ping_interval,
                idle_timeout=idle_timeout,
                max_message_size=max_message_size,
            ) as conn_b:
                accepted.append(conn_b)
                b_ready.set()
                await conn_b.wait_closed()
        except (ConnectionClosed, trio.TooSlowError) as exc:
            b_failed.append(exc)  # a's own handshake fails too and says why
        finally:
            b_ready.set()

    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_b)
        try:
            async with connect_stream(
                stream_a,
                app_id=app_id,
                handlers=handlers_a,
                ping_interval=ping_interval,
                idle_timeout=idle_timeout,
                max_message_size=max_message_size,
            ) as conn_a:
                await b_ready.wait()
                if not accepted:
                    reason = str(b_failed[0]) if b_failed else "the server side did not start"
                    raise ConnectionClosed(f"in-memory pair: {reason}")
                yield conn_a, accepted[0]
        except BaseException as exc:
            # Re-raised below, outside the nursery, so it is not wrapped in a group.
            error = exc
    if error is not None:
        raise error


class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """A trio listener for in-memory connections.

    A client calls :meth:`connect` for its end of a fresh ``memory_stream_pair()``; the
    server gets the other end from :meth:`accept`. Serve it like a TCP listener::

        listener = blip.MemoryListener()
        server = await nursery.start(blip.serve_listeners, [listener], "P2PSync_1", handlers)
        async with blip.connect_stream(await listener.connect()) as conn: ...
    """

    def __init__(self, backlog: int = MEMORY_BACKLOG) -> None:
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](backlog)

    async def connect(self) -> trio.abc.Stream:
        """Open a connection to this listener; returns the client's end of the stream.

        Raises ``ConnectionRefusedError`` once the listener is closed.
        """
        from trio.testing import memory_stream_pair  # see memory_pair

        client_end, server_end = memory_stream_pair()
        try:
            await self._send.send(server_end)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise ConnectionRefusedError("the in-memory listener is closed") from None
        return client_end

    async def accept(self) -> trio.abc.Stream:
        """The server's end of the next connection; ``trio.ClosedResourceError`` once closed."""
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise trio.ClosedResourceError("the in-memory listener is closed") from None

    async def aclose(self) -> None:
        """Stop accepting; connections not yet accepted are closed (their clients see EOF)."""
        self._send.close()
        while True:
            try:
                pending = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            await trio.aclose_forcefully(pending)
        self._receive.close()
        await trio.lowlevel.checkpoint()
