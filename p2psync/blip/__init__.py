"""BLIP_3: multiplexed request/reply messaging over WebSockets, as Couchbase Mobile speaks it.

Two layers:

- sans-I/O: :mod:`p2psync.blip.wire` (constants, varints, properties),
  :mod:`p2psync.blip.codec` (CRC and deflate per direction),
  :class:`~p2psync.blip.connection.BlipConnection` (numbering, outbox, flow control, events)
  and :mod:`p2psync.blip.lifecycle` (a connection's one lifecycle state);
- trio, over the ``websockets`` sans-I/O protocol, each module importing only those before
  it: :mod:`~p2psync.blip.closing` (how a connection ends), :mod:`~p2psync.blip.pumps` (the
  reader, writer and keepalive tasks), :mod:`~p2psync.blip.rpc` (:class:`Connection`,
  :class:`Request`, handlers; :mod:`~p2psync.blip.payloads` holds replies and bodies) and
  :mod:`~p2psync.blip.handshake` (:func:`connect`, :func:`serve`, :class:`BlipServer`);
  :func:`memory_pair` and :class:`MemoryListener` run the same over in-memory streams for
  deterministic tests (:mod:`p2psync.blip.memory`).

Quick use::

    async with blip.connect("ws://127.0.0.1:4984/", handlers={"hello": on_hello}) as conn:
        reply = await conn.request("echo", {"X-Test": "1"}, b"body")

This package knows nothing about DWN; the peer layer builds its profiles on top of it.
See ``docs/blip.md``.
"""

from p2psync.blip.connection import BlipConnection, ConnectionState
from p2psync.blip.errors import BLIP_ERROR_DOMAIN, BlipError, ConnectionClosed, ProtocolError
from p2psync.blip.handshake import (
    DEFAULT_APP_ID,
    BlipServer,
    accept_stream,
    connect,
    connect_stream,
    serve,
    serve_listeners,
)
from p2psync.blip.memory import MemoryListener, memory_pair
from p2psync.blip.payloads import Body, IncomingBody, Reply, Response, StreamingResponse
from p2psync.blip.rpc import Connection, GatherBudget, Handler, HandlerSpec, Request, StreamingHandler, streaming
from p2psync.blip.wire import subprotocol_for

__all__ = [
    "BLIP_ERROR_DOMAIN",
    "DEFAULT_APP_ID",
    "BlipConnection",
    "BlipError",
    "BlipServer",
    "Body",
    "Connection",
    "ConnectionClosed",
    "ConnectionState",
    "GatherBudget",
    "Handler",
    "HandlerSpec",
    "IncomingBody",
    "MemoryListener",
    "ProtocolError",
    "Reply",
    "Request",
    "Response",
    "StreamingHandler",
    "StreamingResponse",
    "accept_stream",
    "connect",
    "connect_stream",
    "memory_pair",
    "serve",
    "serve_listeners",
    "streaming",
    "subprotocol_for",
]
