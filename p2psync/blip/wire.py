"""BLIP_3 wire constants and the pure encode/decode functions (no state, no I/O).

A frame is one binary WebSocket message::

    uvarint(message number) | uvarint(flags) | frame body | CRC32 (4 bytes, big-endian)

ACK frames carry ``uvarint(bytes received)`` as their body and no CRC. The message a run of
frames carries is ``uvarint(properties length) | properties | body``, where the properties are
NUL-terminated UTF-8 strings, key then value. ``protocol/blip/README.md`` describes the whole
format in prose; every number below cites where it comes from.
"""

from __future__ import annotations

from collections.abc import Mapping

from p2psync.blip.errors import ProtocolError

# --- Frame flags (BLIP_3 spec; identical in BLIP-Cpp, go-blip and Wireshark's dissector) ---

TYPE_MASK = 0x07
COMPRESSED = 0x08
URGENT = 0x10
NO_REPLY = 0x20
MORE_COMING = 0x40
#: Every flag bit we understand; any other bit is ignored on input (spec: forward compatible).
KNOWN_FLAGS = TYPE_MASK | COMPRESSED | URGENT | NO_REPLY | MORE_COMING

# --- Message types (the low three flag bits) ---

MSG = 0  # a request
RPY = 1  # a reply
ERR = 2  # an error reply
ACK_MSG = 4  # acknowledges bytes of an incoming request
ACK_RPY = 5  # acknowledges bytes of an incoming reply (RPY or ERR)

TYPE_NAMES = {MSG: "MSG", RPY: "RPY", ERR: "ERR", ACK_MSG: "ACKMSG", ACK_RPY: "ACKRPY"}

# --- Limits ---

#: Size of the CRC32 that ends every non-ACK frame (BLIP_3 spec).
CHECKSUM_SIZE = 4
#: Normal frame size, header and checksum included (BLIP-Cpp and go-blip kDefaultFrameSize).
FRAME_SIZE = 4096
#: Frame size for an urgent message or when nothing else is waiting (BLIP-Cpp kBigFrameSize).
BIG_FRAME_SIZE = 16384
#: Room kept free in a compressed frame for deflate's framing of incompressible data; zlib
#: level 6 adds at most 10 bytes to a 16 KiB sync-flushed block (measured here).
DEFLATE_SLACK = 16
#: Receivers ACK a multi-frame message each time its byte count crosses a multiple of this
#: (go-blip kAckInterval, BLIP-Cpp kIncomingAckThreshold).
ACK_INTERVAL = 50_000
#: A sender pauses a message while more than this many of its bytes are unacknowledged
#: (go-blip and BLIP-Cpp kMaxUnackedBytes): the window a connection starts with.
MAX_UNACKED_BYTES = 128_000
#: The window two p2psync peers use once both said they take it (the `wideWindow` capability
#: of hello, replication-profiles.md §15). Ours: a 10 MiB attachment paused every 128,000
#: bytes for an ACK from a receiver busy applying the previous one; with 1,000,000 a pull of
#: 100 × 10 MiB went 102 → 154 MB/s and both sides spent ~20% less CPU (4,000,000 and
#: 16,000,000 measured no better; docs/benchmarks.md).
WIDE_UNACKED_BYTES = 1_000_000
#: A reply whose body is at least this large (a whole body, not streamed) is *bulk*: it goes
#: out after the bulk replies queued before it, not beside them. Interleaved, two 10 MiB
#: replies each took twice as long to finish, in 4 KiB frames instead of 16 KiB (a frame's
#: Python costs the same whatever its size), and a sink that fetched three attachments ahead
#: got all three at the end, together. Ours; a local sending order, nothing on the wire.
BULK_REPLY_BYTES = 256 * 1024
#: Largest encoded properties block we accept or send (the issue: at most 100 KiB).
MAX_PROPERTIES_SIZE = 100 * 1024
#: Largest output one compressed frame may inflate to. Reference senders put at most 16 KiB of
#: *compressed* bytes in a frame, which can stand for far more input; 16 MiB bounds a
#: decompression bomb while leaving every honest frame room.
MAX_INFLATED_FRAME = 16 * 1024 * 1024
#: A uvarint holds at most 64 bits, i.e. ten bytes (Go's binary.MaxVarintLen64).
MAX_VARINT_LEN = 10
#: What sync-flushed deflate output ends with; senders strip it and receivers put it back.
DEFLATE_TRAILER = b"\x00\x00\xff\xff"
#: zlib level for compressed frames (BLIP-Cpp kDefaultCompressionLevel, go-blip default).
COMPRESSION_LEVEL = 6

# --- Errors carried by ERR replies ---

ERROR_DOMAIN_PROPERTY = "Error-Domain"
ERROR_CODE_PROPERTY = "Error-Code"
PROFILE_PROPERTY = "Profile"

# --- The WebSocket subprotocol ---

#: BLIP_3's subprotocol prefix (Couchbase Mobile: ``BLIP_3+CBMobile_3``).
SUBPROTOCOL_PREFIX = "BLIP_3+"

_UINT64_LIMIT = 1 << 64


def subprotocol_for(app_id: str) -> str:
    """The WebSocket subprotocol for an application id, e.g. ``BLIP_3+P2PSync_1``."""
    return SUBPROTOCOL_PREFIX + app_id


def encode_uvarint(value: int) -> bytes:
    """Encode a non-negative integer below 2**64 as an unsigned LEB128 varint."""
    if value < 0x80:
        if value < 0:
            raise ValueError("a uvarint cannot be negative")
        return bytes((value,))
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value >= _UINT64_LIMIT:
        raise ValueError("a uvarint holds at most 64 bits")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_uvarint(data: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """Read a uvarint at ``pos``; return ``(value, position after it)``.

    Raises :class:`ProtocolError` when the bytes end inside the varint, when it is longer than
    ten bytes, or when its value does not fit in 64 bits.
    """
    end = len(data)
    if pos < end:
        first = data[pos]
        if first < 0x80:
            return first, pos + 1
    value = 0
    shift = 0
    i = pos
    while True:
        if i >= end:
            raise ProtocolError("truncated varint")
        if i - pos >= MAX_VARINT_LEN:
            raise ProtocolError("varint longer than 10 bytes")
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            break
        shift += 7
    if value >= _UINT64_LIMIT:
        raise ProtocolError("varint does not fit in 64 bits")
    return value, i


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Encode properties as BLIP_3 does: each key and value UTF-8, NUL-terminated.

    Raises ``ValueError`` for a non-string, a string containing NUL, or a block larger than
    :data:`MAX_PROPERTIES_SIZE`.
    """
    if not properties:
        return b""
    strings: list[str] = []
    for item in properties.items():
        strings += item
    try:
        text = "\0".join(strings)
    except TypeError:
        raise ValueError(f"BLIP property names and values are strings: {properties!r}") from None
    if text.count("\0") != len(strings) - 1:
        raise ValueError("a BLIP property name or value cannot contain NUL")
    block = (text + "\0").encode()
    if len(block) > MAX_PROPERTIES_SIZE:
        raise ValueError(f"properties take {len(block)} bytes; the limit is {MAX_PROPERTIES_SIZE}")
    return block


def decode_properties(block: bytes | bytearray | memoryview) -> dict[str, str]:
    """Decode a properties block; raise ``ValueError`` when it is malformed.

    Malformed means: not NUL-terminated, an odd number of strings, invalid UTF-8, a repeated
    key, or larger than :data:`MAX_PROPERTIES_SIZE`. (The caller decides what a malformed block
    costs: in a frame it is a frame error, not a fatal one.)
    """
    if not block:
        return {}
    if len(block) > MAX_PROPERTIES_SIZE:
        raise ValueError("properties block too large")
    if block[-1] != 0:
        raise ValueError("properties block does not end with NUL")
    try:
        # NUL never occurs inside a multi-byte UTF-8 sequence, so decoding the whole block at
        # once validates every string.
        strings = str(block[:-1], "utf-8").split("\0")
    except UnicodeDecodeError as exc:
        raise ValueError(f"property is not UTF-8: {exc.reason}") from None
    count = len(strings)
    if count & 1:
        raise ValueError("properties block holds an odd number of strings")
    if count == 2:
        return {strings[0]: strings[1]}
    pairs = iter(strings)
    result = dict(zip(pairs, pairs, strict=True))
    if len(result) * 2 != count:
        raise ValueError("properties block repeats a key")
    return result


def encode_message_head(properties: Mapping[str, str]) -> bytes:
    """The start of a message: ``uvarint(properties length) | properties``."""
    block = encode_properties(properties)
    return encode_uvarint(len(block)) + block


def frame_header(number: int, flags: int) -> bytes:
    """``uvarint(number) | uvarint(flags)``, the start of every frame."""
    if 0 <= flags < 0x80:
        if 0 <= number < 0x80:
            return bytes((number, flags))
        if 0 < number < 0x4000:
            return bytes(((number & 0x7F) | 0x80, number >> 7, flags))
    return encode_uvarint(number) + encode_uvarint(flags)


def parse_frame_header(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """Return ``(message number, flags, offset of the frame body)`` of a frame.

    Raises :class:`ProtocolError` for an empty or truncated header or a bad varint.
    """
    n = len(frame)
    if n >= 3:
        a = frame[0]
        b = frame[1]
        if a < 0x80:
            if b < 0x80:
                return a, b, 2
        elif b < 0x80:
            c = frame[2]
            if c < 0x80 and b:
                return (a & 0x7F) | (b << 7), c, 3
    if n == 0:
        raise ProtocolError("empty frame")
    number, pos = decode_uvarint(frame, 0)
    if pos >= n:
        raise ProtocolError("frame header has no flags")
    flags, pos = decode_uvarint(frame, pos)
    return number, flags, pos


def describe_flags(flags: int) -> str:
    """Human-readable flags, e.g. ``MSG|Urgent|MoreComing`` (for logs and vectors)."""
    names = [TYPE_NAMES.get(flags & TYPE_MASK, f"type{flags & TYPE_MASK}")]
    for bit, name in (
        (COMPRESSED, "Compressed"),
        (URGENT, "Urgent"),
        (NO_REPLY, "NoReply"),
        (MORE_COMING, "MoreComing"),
    ):
        if flags & bit:
            names.append(name)
    return "|".join(names)
