"""Wire helpers of the replication profiles (``protocol/replication-profiles.md``).

Profile names, limits, CBOR bodies (§1.2), properties (§1.1) and the ``P2PSync`` refusals
(§13). Sans-I/O: nothing here touches a connection; the peer maps a :class:`PeerError` to and
from a BLIP ``ERR`` (p2psync/peer/errors.py).
"""

from __future__ import annotations

import re
from typing import Any, Final, NoReturn

import cbor2

from p2psync.dwn.encoding import dag_cbor_encode
from p2psync.errors import P2PSYNC_DOMAIN, Refusal

__all__ = [
    "APP_ID",
    "ERROR_DOMAIN",
    "INLINE_DATA_MAX",
    "SUBPROTOCOL",
    "PeerError",
    "decode_body",
    "encode_body",
    "int_property",
    "refuse",
]

#: Our BLIP application id; the WebSocket subprotocol is ``BLIP_3+P2PSync_1`` (§2).
APP_ID: Final = "P2PSync_1"
SUBPROTOCOL: Final = "BLIP_3+" + APP_ID
#: The error domain of this page's refusals (§13).
ERROR_DOMAIN: Final = P2PSYNC_DOMAIN
#: The profile version carried in ``hello`` (§15).
PROFILE_VERSION: Final = 1
#: Data up to this size travels inline (§8.1: the reference DWN's maxDataSizeAllowedToBeEncoded).
INLINE_DATA_MAX: Final = 30_000
#: Items per ``changes`` (§6.1: default 200, max 1,000).
DEFAULT_BATCH: Final = 200
MAX_BATCH: Final = 1000
#: Refs per ``getDependencies`` (§12).
MAX_REFS: Final = 128
#: Entries per dependency answer (§12, the closure module's MAX_ANSWERS_PER_REF).
MAX_ENTRIES_PER_REF: Final = 64
#: Inline data per ``getDependencies`` reply (§10, §12).
MAX_INLINE_PER_DEPENDENCIES: Final = 8 * 1024 * 1024
#: `getAttachment`s one sink keeps in flight on a connection (§12): at most 8, and at most
#: 32 MiB of data together (one larger attachment goes alone). The source holds each reply
#: whole until it is written, so this is also what an honest sink makes its source queue, well
#: under the source's reply-backlog cap (blip MAX_QUEUED_REPLY_BYTES_HARD, 128 MiB) even with
#: an attachment of the largest size (DEFAULT_MAX_DATA, 100 MiB). Ours.
MAX_ATTACHMENTS_IN_FLIGHT: Final = 8
MAX_ATTACHMENT_BYTES_IN_FLIGHT: Final = 32 * 1024 * 1024
#: Collections per connection (§4.1, §12).
MAX_COLLECTIONS: Final = 256
#: Messages a source keeps in its offered set per connection (§9, §12).
MAX_OFFERED: Final = 4096
#: Unanswered ``rev``s a source keeps per connection (§12, issue #5's 1,000 cap).
MAX_UNANSWERED_REVS: Final = 1000
#: ``hello``: nonce size, body size and deadline (§3, §12).
HELLO_NONCE_BYTES: Final = 32
HELLO_MAX_BODY: Final = 16 * 1024
HELLO_TIMEOUT: Final = 10.0
#: ``setCheckpoint`` body (§4.3, §12).
MAX_CHECKPOINT_BODY: Final = 512 * 1024
#: ``rev`` body (§8.2, §12).
MAX_REV_BODY: Final = 1024 * 1024
#: ``revs`` (§8.4, §12): messages per request, and bytes of its body (a single message larger
#: than this goes alone, as a `rev`). 64 is the group committer's batch: one `revs` request's
#: applies share one commit; ours, measured with tests/bench/bench_peer.py.
MAX_REVS_ITEMS: Final = 64
MAX_REVS_BODY: Final = 1024 * 1024
#: Record data a sink accepts by default (§6.2, §12).
DEFAULT_MAX_DATA: Final = 100 * 1024 * 1024

_DECIMAL_RE = re.compile(r"0|[1-9][0-9]*")


#: A refusal of the ``P2PSync`` domain we received (or raise locally): code, name, detail, body.
#: The refusal class of the one error tree (:class:`p2psync.errors.Refusal`), under its
#: protocol name.
PeerError = Refusal


def refuse(code: int, name: str, detail: str = "", **extra: Any) -> NoReturn:
    """Refuse a request: raise a :class:`PeerError` whose ERR body is ``{"code", "detail", …}``
    (§13; ``extra`` adds members such as a conflict's current ``rev``)."""
    raise PeerError(code, name, detail, {"code": name, "detail": detail, **extra})


def encode_body(value: Any) -> bytes:
    """A body as deterministic DAG-CBOR (§1.2)."""
    return dag_cbor_encode(value)


def decode_body(body: bytes, *, empty_map: bool = True) -> Any:
    """Decode a CBOR body; 0 bytes read as ``{}`` (§1.2). Malformed: ``400 BodyInvalid``."""
    if not body:
        if empty_map:
            return {}
        refuse(400, "BodyInvalid", "empty body")
    try:
        value = cbor2.loads(body)
    except Exception as exc:  # cbor2 raises several types for malformed input
        refuse(400, "BodyInvalid", f"not one CBOR item: {type(exc).__name__}")
    return value


def decode_map(body: bytes) -> dict[str, Any]:
    """Decode a body that must be a map."""
    value = decode_body(body)
    if not isinstance(value, dict):
        refuse(400, "BodyInvalid", "body must be a map")
    return value


def int_property(properties: dict[str, str], name: str, *, default: int | None = None) -> int:
    """A canonical decimal property (§1.1); absent → ``default`` or 400, malformed → 400."""
    text = properties.get(name)
    if text is None:
        if default is None:
            refuse(400, "PropertyInvalid", f"property {name} is required")
        return default
    if _DECIMAL_RE.fullmatch(text) is None:
        refuse(400, "PropertyInvalid", f"property {name} must be canonical decimal")
    return int(text)


def bool_property(properties: dict[str, str], name: str) -> bool:
    """``true``/``false`` (absent is false); anything else is 400 (§1.1)."""
    text = properties.get(name)
    if text is None or text == "false":
        return False
    if text == "true":
        return True
    refuse(400, "PropertyInvalid", f"property {name} must be true or false")
