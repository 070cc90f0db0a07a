"""The per-direction frame codec: running CRC32 and the shared deflate stream.

BLIP_3 keeps two pieces of state for each direction of a connection:

- a CRC32 (zlib's polynomial) over every *uncompressed* frame body sent so far, written after
  each frame, so a receiver detects a lost, duplicated or corrupted frame;
- one raw-deflate stream; each compressed frame is deflated and sync-flushed, and the
  ``00 00 FF FF`` that the flush leaves at the end is stripped (the receiver adds it back).

ACK frames take part in neither. Frames must be encoded and decoded in wire order.
"""

from __future__ import annotations

import zlib

from p2psync.blip.errors import ProtocolError
from p2psync.blip.wire import (
    ACK_MSG,
    ACK_RPY,
    CHECKSUM_SIZE,
    COMPRESSED,
    COMPRESSION_LEVEL,
    DEFLATE_TRAILER,
    ERR,
    MAX_INFLATED_FRAME,
    MSG,
    RPY,
    TYPE_MASK,
    encode_uvarint,
    frame_header,
    parse_frame_header,
)

_DATA_TYPES = frozenset((MSG, RPY, ERR))
_ACK_TYPES = frozenset((ACK_MSG, ACK_RPY))
_RAW_DEFLATE_WBITS = -15  # negative window bits: raw deflate, no zlib header (BLIP_3 spec)
_TRAILER_LEN = len(DEFLATE_TRAILER)

BytesLike = bytes | bytearray | memoryview


class FrameEncoder:
    """Turns frame bodies into frames for one direction of a connection."""

    __slots__ = ("_crc", "_deflater", "_level")

    def __init__(self, compression_level: int = COMPRESSION_LEVEL) -> None:
        self._crc = 0
        self._level = compression_level
        self._deflater: zlib._Compress | None = None  # created on the first compressed frame

    def encode(self, number: int, flags: int, body: BytesLike) -> bytes:
        """Encode a MSG/RPY/ERR frame: header, (compressed) body, running CRC."""
        self._crc = crc = zlib.crc32(body, self._crc)
        if flags & COMPRESSED:
            deflater = self._deflater
            if deflater is None:
                deflater = self._deflater = zlib.compressobj(
                    self._level, zlib.DEFLATED, _RAW_DEFLATE_WBITS
                )
            packed = deflater.compress(body) + deflater.flush(zlib.Z_SYNC_FLUSH)
            # A sync flush always ends with the empty stored block 00 00 FF FF.
            body = memoryview(packed)[:-_TRAILER_LEN]
        return b"".join((frame_header(number, flags), body, crc.to_bytes(4, "big")))

    @staticmethod
    def encode_ack(number: int, flags: int, bytes_received: int) -> bytes:
        """Encode an ACK frame (no CRC, not part of the checksummed stream)."""
        return frame_header(number, flags) + encode_uvarint(bytes_received)


class FrameDecoder:
    """Turns frames back into (number, flags, body) for one direction of a connection."""

    __slots__ = ("_crc", "_inflater", "max_inflated")

    def __init__(self, max_inflated: int = MAX_INFLATED_FRAME) -> None:
        self._crc = 0
        self._inflater: zlib._Decompress | None = None
        #: The most a compressed frame may inflate to; beyond it decoding fails (a deflate bomb).
        self.max_inflated = max_inflated

    def decode(self, frame: BytesLike) -> tuple[int, int, bytes | memoryview, int]:
        """Decode one frame; return ``(number, flags, body, wire size)``.

        ``body`` is the uncompressed frame body for MSG/RPY/ERR frames, the raw body for ACK
        frames and for frames of an unknown type (which skip the CRC and deflate state, as
        the reference implementations do). ``wire size`` is what flow control counts: the
        frame's length after its header. Raises :class:`ProtocolError` on a bad header, bad
        deflate data or a checksum mismatch.

        The body of an uncompressed data frame is a view into ``frame``, not a copy (a 10 MiB
        body arrives as ~1,000 frames; slicing websockets' bytearray and making bytes of the
        slice copied each one twice): the caller must not change ``frame`` while it keeps it.
        """
        number, flags, pos = parse_frame_header(frame)
        size = len(frame) - pos
        mtype = flags & TYPE_MASK
        view = memoryview(frame).toreadonly()  # websockets hands out bytearrays
        if mtype not in _DATA_TYPES:
            return number, flags, bytes(view[pos:]), size
        if size < CHECKSUM_SIZE:
            raise ProtocolError("frame too short to hold its checksum")
        end = len(frame) - CHECKSUM_SIZE
        expected = int.from_bytes(view[end:], "big")
        body: bytes | memoryview = self._inflate(view[pos:end]) if flags & COMPRESSED else view[pos:end]
        self._crc = crc = zlib.crc32(body, self._crc)
        if crc != expected:
            raise ProtocolError(f"checksum mismatch (got {crc:08x}, frame says {expected:08x})")
        return number, flags, body, size

    def _inflate(self, data: BytesLike) -> bytes:
        inflater = self._inflater
        if inflater is None:
            inflater = self._inflater = zlib.decompressobj(_RAW_DEFLATE_WBITS)
        try:
            out = inflater.decompress(bytes(data) + DEFLATE_TRAILER, self.max_inflated)
        except zlib.error as exc:
            raise ProtocolError(f"bad deflate data: {exc}") from None
        if inflater.unconsumed_tail:
            raise ProtocolError(f"compressed frame inflates beyond {self.max_inflated} bytes")
        if inflater.eof:
            raise ProtocolError("compressed frame ends the deflate stream")
        return out
