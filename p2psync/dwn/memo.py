"""What the engine derived from the message it is processing, kept for the length of one call.

One message passes through several layers in one engine call: the interop pipe names its CID,
the history sorts and archives it, the handler parses it, checks its data and stores it. Each
used to derive the same things again: the message CID up to three times, the entry id twice,
the signature payload twice, the data CID twice (issue #17). Within :func:`processing` those
are computed once, for that one message object.

Facts are kept by the *identity* of the message object, so they are only trusted while the
call runs: the engine never changes a message it is given (it copies it to add
``encodedData``), and its caller cannot while the call runs on this thread. Outside a call,
or for any other object (a message read back from the archive, a copy), every function
computes as before. Scopes are per thread: two engines on two threads do not see each other's
message.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["MessageMemo", "of", "processing"]


class MessageMemo:
    """Facts about one message object; each is None until someone derived it."""

    __slots__ = ("message", "cid", "encoded", "json", "descriptor_encoding", "payload", "data", "data_cid",
                 "data_text", "in_order")

    def __init__(self, message: Any, cid: str | None) -> None:
        self.message = message
        self.cid = cid  # the message CID (encoding.message_cid)
        # the message's DAG-CBOR when its CID was computed over exactly that (no encodedData):
        # what a MessageEntry carries on the wire, which the store keeps (store.py's `wire`)
        self.encoded: bytes | None = None
        self.json: str | None = None  # encoding.json_compact(message)
        # encoding.DescriptorEncoding of message["descriptor"], with its entry ids
        self.descriptor_encoding: Any = None
        # (the authorization's signature JWS, its decoded payload)
        self.payload: tuple[Any, dict[str, Any]] | None = None
        # the record data that came with the message, and its dataCid
        self.data: bytes | None = None
        self.data_cid: str | None = None
        # (the record data, its base64url text) when the caller decoded that data from that text
        # with the strict decoder, which accepts only the one canonical text of any bytes:
        # encoding the data again gives the same text (the pipe's `data` member)
        self.data_text: tuple[bytes, str] | None = None
        # every map of the message is in DAG-CBOR key order (encoding.in_dag_cbor_order)
        self.in_order = False


_local = threading.local()


def of(message: Any) -> MessageMemo | None:
    """The memo of ``message`` when it is the message being processed on this thread."""
    memo: MessageMemo | None = getattr(_local, "memo", None)
    return memo if memo is not None and memo.message is message else None


def current() -> MessageMemo | None:
    """The memo of the message being processed on this thread, if any."""
    memo: MessageMemo | None = getattr(_local, "memo", None)
    return memo


class processing:  # noqa: N801 - used as a statement: ``with memo.processing(message):``
    """``with processing(message, cid):`` — facts about ``message`` are kept until the end.

    ``cid``: the message CID when the caller computed it from this very object. Entering
    again for the message already being processed keeps its facts.
    """

    __slots__ = ("_memo", "_previous")

    def __init__(self, message: Any, cid: str | None = None) -> None:
        previous: MessageMemo | None = getattr(_local, "memo", None)
        self._previous = previous
        if previous is not None and previous.message is message:
            self._memo = previous
            if previous.cid is None:
                previous.cid = cid
        else:
            self._memo = MessageMemo(message, cid)

    def __enter__(self) -> MessageMemo:
        _local.memo = self._memo
        return self._memo

    def __exit__(self, *exc: object) -> None:
        _local.memo = self._previous
