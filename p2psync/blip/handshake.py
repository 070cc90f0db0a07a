"""Opening connections: the WebSocket handshakes, connect/accept, and serving.

The client side sends the opening handshake and asks for the subprotocol
``BLIP_3+<app id>``; the server side accepts only that one. After the handshake a
:class:`~p2psync.blip.Connection` runs over the stream for as long as the caller's block
(:func:`connect`, :func:`connect_stream`, :func:`accept_stream`) or the server
(:func:`serve`, :func:`serve_listeners`, :class:`BlipServer`) lives.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, NoReturn

import trio
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake, InvalidState
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from p2psync.blip.errors import ConnectionClosed
from p2psync.blip.pumps import IDLE_TIMEOUT, PING_INTERVAL, RECEIVE_SIZE
from p2psync.blip.rpc import MAX_MESSAGE_SIZE, Connection, GatherBudget, HandlerSpec
from p2psync.blip.tls import TlsCertificate, TlsPinMismatch, client_context, fingerprint
from p2psync.blip.wire import subprotocol_for

log = logging.getLogger("p2psync.blip")

#: Our application id; the WebSocket subprotocol is ``BLIP_3+`` followed by it.
DEFAULT_APP_ID = "P2PSync_1"
#: Seconds allowed for TCP connect plus the WebSocket opening handshake.
HANDSHAKE_TIMEOUT = 10.0
#: Largest WebSocket message accepted: 64 times the largest frame a reference peer sends.
MAX_WEBSOCKET_MESSAGE = 1024 * 1024
#: TLS and WebSocket handshakes a server runs at once. Each may take HANDSHAKE_TIMEOUT, so a
#: stranger who opens TCP connections and never finishes one would otherwise hold a task, a TLS
#: object and its buffers per connection for 10 s each, without limit. Past the cap the oldest
#: handshake is dropped: an honest one finishes in milliseconds, so it is almost never the
#: oldest, and a flood evicts itself (issue #15). Ours.
MAX_HANDSHAKES = 64


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
                raise ConnectionClosed(f"WebSocket handshake failed: {ws.handshake_exc}{_tls_hint(url)}")
            if ws.subprotocol != subprotocol:
                raise ConnectionClosed(
                    f"WebSocket handshake failed: peer chose subprotocol {ws.subprotocol!r}, "
                    f"not {subprotocol!r}"
                )
            return ws, events[1:]
        if not data:
            reason = ws.handshake_exc or "peer closed the stream"
            raise ConnectionClosed(f"WebSocket handshake failed: {reason}{_tls_hint(url)}")


def _tls_hint(url: str) -> str:
    """A plain ``ws://`` dial to a TLS server reads no HTTP response: say what it may be."""
    return " (does the peer serve wss://? try a wss:// URL)" if url.startswith("ws://") else ""



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
    server_certificate: bytes | None = None,
) -> AsyncIterator[Connection]:
    """Open a BLIP connection as the client over an already open stream (any trio Stream,
    e.g. an in-memory one in tests). Closes the stream at the end. ``server_certificate``:
    the DER certificate the server presented when ``stream`` is TLS (what the connection's
    :attr:`~Connection.server_certificate` then says)."""
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
    conn.server_certificate = server_certificate
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
    gather_budget: GatherBudget | None = None,
    server_certificate: bytes | None = None,
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
        gather_budget=gather_budget,
    )
    conn.server_certificate = server_certificate
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
    pin: str | None = None,
) -> AsyncIterator[Connection]:
    """Connect to a BLIP peer at ``ws://host:port/path`` or, over TLS, ``wss://...``::

        async with blip.connect("wss://127.0.0.1:4984/_p2psync", handlers={...}) as conn:
            reply = await conn.request("echo", {"X": "1"}, b"body")

    ``handlers`` answer the requests the server sends us (either side may send requests).
    ``pin``: the fingerprint (:func:`~p2psync.blip.tls.fingerprint`) the server's certificate
    must have; another raises :class:`~p2psync.blip.tls.TlsPinMismatch` before anything is sent.
    The server's certificate is not checked otherwise (see :mod:`p2psync.blip.tls`).
    """
    uri = parse_uri(url)
    if pin is not None and not uri.secure:
        raise ValueError(f"a certificate pin needs a wss:// URL, not {url}")
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        stream: trio.abc.Stream = await trio.open_tcp_stream(uri.host, uri.port)
        certificate = None
        if uri.secure:
            stream, certificate = await _tls_client(stream, uri.host, pin)
    async with connect_stream(
        stream,
        url,
        app_id=app_id,
        handlers=handlers,
        ping_interval=ping_interval,
        idle_timeout=idle_timeout,
        max_message_size=max_message_size,
        server_certificate=certificate,
    ) as conn:
        yield conn


async def _tls_client(
    tcp: trio.abc.Stream, host: str, pin: str | None
) -> tuple[trio.SSLStream[trio.abc.Stream], bytes]:
    """The TLS handshake of a dialer, and the server's certificate (checked against ``pin``)."""
    stream = trio.SSLStream(tcp, client_context(), server_hostname=host)
    try:
        await stream.do_handshake()
        certificate = stream.getpeercert(binary_form=True)
        if not certificate:
            raise ConnectionClosed("TLS handshake failed: the server sent no certificate")
        if pin is not None and fingerprint(certificate) != pin:
            raise TlsPinMismatch(
                f"the server's TLS certificate is {fingerprint(certificate)}, not the pinned {pin}"
            )
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await tcp.aclose()
        if isinstance(exc, trio.BrokenResourceError):
            why = exc.__cause__ if isinstance(exc.__cause__, ssl.SSLError) else exc
            plain = any(sign in str(why) for sign in ("WRONG_VERSION_NUMBER", "UNEXPECTED_EOF", "HTTP_REQUEST"))
            hint = " (is the peer serving plain ws://?)" if plain else ""
            raise ConnectionClosed(f"TLS handshake with {host} failed: {why}{hint}") from exc
        raise
    return stream, certificate



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
    #: Bytes being gathered across all its connections (MAX_SERVER_ASSEMBLING_BYTES).
    gather_budget: GatherBudget = field(default_factory=GatherBudget)
    #: Serve TLS (``wss://``) with this certificate; None: plain ``ws://``.
    tls: TlsCertificate | None = None

    def __post_init__(self) -> None:
        self._tls_context: ssl.SSLContext | None = None if self.tls is None else self.tls.server_context()
        self._tls_der: bytes | None = None if self.tls is None else self.tls.der
        #: handshakes in progress, oldest first (MAX_HANDSHAKES)
        self._handshaking: dict[trio.CancelScope, None] = {}
        self.handshakes_dropped = 0

    @property
    def handshaking(self) -> int:
        """Connections whose TLS or WebSocket handshake is in progress."""
        return len(self._handshaking)

    def _admit_handshake(self, scope: trio.CancelScope) -> None:
        if len(self._handshaking) >= MAX_HANDSHAKES:
            oldest = next(iter(self._handshaking))
            del self._handshaking[oldest]
            oldest.cancel()
            self.handshakes_dropped += 1
            if self.handshakes_dropped in (1, 10, 100) or self.handshakes_dropped % 1000 == 0:
                log.warning("%d handshakes in progress: dropped the oldest (%d so far)", MAX_HANDSHAKES,
                            self.handshakes_dropped)
        self._handshaking[scope] = None

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
        address = _remote_address(stream)
        if self._tls_context is not None:
            # The TLS handshake runs on the first read, inside accept_stream's deadline.
            stream = trio.SSLStream(stream, self._tls_context, server_side=True)
        # Cancelled only while it is among the handshakes in progress (MAX_HANDSHAKES); once
        # the connection runs, nothing cancels it.
        handshake = trio.CancelScope()
        self._admit_handshake(handshake)
        try:
            with handshake:
                async with accept_stream(
                    stream,
                    app_id=self.app_id,
                    handlers=self.handlers,
                    ping_interval=self.ping_interval,
                    idle_timeout=self.idle_timeout,
                    max_message_size=self.max_message_size,
                    gather_budget=self.gather_budget,
                    server_certificate=self._tls_der,
                ) as conn:
                    self._handshaking.pop(handshake, None)
                    conn.remote_address = address
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
        finally:
            self._handshaking.pop(handshake, None)



def _remote_address(stream: trio.abc.Stream) -> str | None:
    """The peer's IP address of a TCP stream (None for other streams)."""
    if not isinstance(stream, trio.SocketStream):
        return None
    try:
        peer = stream.socket.getpeername()
    except OSError:
        return None
    return str(peer[0]) if isinstance(peer, tuple) else None


async def _guarded(fn: Callable[[Connection], Awaitable[None]], conn: Connection) -> None:
    """Run a per-connection callback; its failure is logged and closes only that connection."""
    try:
        await fn(conn)
    except Exception:
        log.exception("%s: on_connect callback failed", conn.name)
        await conn.aclose()



async def serve_listeners(
    listeners: Sequence[trio.abc.Listener[trio.abc.Stream]],
    app_id: str = DEFAULT_APP_ID,
    handlers: Mapping[str, HandlerSpec] | None = None,
    *,
    on_connect: Callable[[Connection], Awaitable[None]] | None = None,
    ping_interval: float | None = PING_INTERVAL,
    idle_timeout: float | None = IDLE_TIMEOUT,
    max_message_size: int = MAX_MESSAGE_SIZE,
    tls: TlsCertificate | None = None,
    gather_budget: GatherBudget | None = None,
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
        tls=tls,
        gather_budget=gather_budget or GatherBudget(),
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
    tls: TlsCertificate | None = None,
    gather_budget: GatherBudget | None = None,
    task_status: trio.TaskStatus[BlipServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept BLIP connections on ``host:port`` (any request path) until cancelled; over TLS
    (``wss://``) with ``tls``'s certificate when given.

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
        tls=tls,
        gather_budget=gather_budget,
        task_status=task_status,
    )
