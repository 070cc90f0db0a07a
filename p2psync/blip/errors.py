"""Exceptions of the BLIP layer.

Three kinds, kept apart on purpose:

- :class:`ProtocolError`: the peer broke the wire format in a way BLIP treats as fatal (bad
  varint, checksum mismatch, bad deflate data, bad request numbering, a text frame). The
  sans-I/O connection enters its ERROR state and the transport closes the WebSocket.
- :class:`BlipError`: an ERR reply, i.e. the peer refused or failed one request. The
  connection stays usable.
- :class:`ConnectionClosed`: the connection ended (cleanly or not) before a request finished.

Each hangs in p2psync's one error tree (:mod:`p2psync.errors`): ``BlipError`` is an
``ErrorReply``, ``ConnectionClosed`` a ``Disconnected``, ``ProtocolError`` a ``P2PSyncError``.
"""

from __future__ import annotations

from p2psync.errors import Disconnected, ErrorReply, P2PSyncError

#: The error domain BLIP itself uses (unknown profile, handler failure, ...).
BLIP_ERROR_DOMAIN = "BLIP"


class ProtocolError(P2PSyncError):
    """The peer violated BLIP in a way that ends the connection."""


class BlipError(ErrorReply):
    """An ERR reply: ``domain`` and ``code`` say what failed, ``message`` says it in words.

    Raised by :meth:`Connection.request` when the peer answers with an error, and raised by
    a request handler to answer with one.
    """

    def __init__(self, domain: str, code: int, message: str = "") -> None:
        self.domain = domain
        self.code = code
        self.message = message
        super().__init__(f"{domain} {code}: {message}" if message else f"{domain} {code}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlipError):
            return NotImplemented
        return (self.domain, self.code, self.message) == (other.domain, other.code, other.message)

    def __hash__(self) -> int:
        return hash((self.domain, self.code, self.message))


class ConnectionClosed(Disconnected):
    """The BLIP connection is closed; ``reason`` says why (one line, for a log or a user).

    ``close_code`` and ``close_text`` are the WebSocket close code and reason text the
    connection ended with (see :attr:`Connection.close_code
    <p2psync.blip.Connection.close_code>`): e.g. ``1008`` and
    ``"P2PSync 401 HelloProofInvalid"``; ``1006`` and ``""`` when it ended without a closing
    handshake; both ``None`` when the connection never opened (a failed WebSocket handshake).
    """

    def __init__(
        self,
        reason: str = "connection closed",
        *,
        close_code: int | None = None,
        close_text: str | None = None,
    ) -> None:
        self.reason = reason
        self.close_code = close_code
        self.close_text = close_text
        super().__init__(reason)
