"""Varints, properties and the per-direction frame codec (CRC, deflate)."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2psync.blip.codec import FrameDecoder, FrameEncoder
from p2psync.blip.errors import ProtocolError
from p2psync.blip.wire import (
    ACK_MSG,
    COMPRESSED,
    ERR,
    MAX_PROPERTIES_SIZE,
    MORE_COMING,
    MSG,
    NO_REPLY,
    RPY,
    URGENT,
    decode_properties,
    decode_uvarint,
    describe_flags,
    encode_properties,
    encode_uvarint,
    frame_header,
    parse_frame_header,
)

property_text = st.text(st.characters(blacklist_characters="\0", codec="utf-8"), max_size=20)


@settings(deadline=None)
@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_uvarint_round_trips(value: int) -> None:
    encoded = encode_uvarint(value)
    assert decode_uvarint(encoded + b"\xff") == (value, len(encoded))
    assert len(encoded) <= 10


def test_uvarint_known_encodings() -> None:
    assert encode_uvarint(0) == b"\x00"
    assert encode_uvarint(127) == b"\x7f"
    assert encode_uvarint(128) == b"\x80\x01"
    assert encode_uvarint(300) == b"\xac\x02"
    assert encode_uvarint(2**64 - 1) == b"\xff" * 9 + b"\x01"


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "truncated"),
        (b"\x80", "truncated"),
        (b"\xff\xff", "truncated"),
        (b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
        (b"\xff" * 9 + b"\x02", "64 bits"),
    ],
)
def test_bad_uvarints_are_protocol_errors(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_uvarint(data)


def test_uvarint_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        encode_uvarint(-1)
    with pytest.raises(ValueError):
        encode_uvarint(2**64)


@settings(deadline=None)
@given(st.integers(0, 2**40), st.integers(0, 0x7F))
def test_frame_header_round_trips(number: int, flags: int) -> None:
    header = frame_header(number, flags)
    assert parse_frame_header(header + b"body") == (number, flags, len(header))


def test_frame_header_errors() -> None:
    with pytest.raises(ProtocolError, match="empty"):
        parse_frame_header(b"")
    with pytest.raises(ProtocolError, match="no flags"):
        parse_frame_header(b"\x01")
    with pytest.raises(ProtocolError, match="truncated"):
        parse_frame_header(b"\x01\x80")


@settings(deadline=None)
@given(st.dictionaries(property_text, property_text, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    block = encode_properties(props)
    assert decode_properties(block) == props
    assert list(decode_properties(block)) == list(props)  # order kept
    if props:
        assert block.endswith(b"\0")
        assert block.count(b"\0") == 2 * len(props)


def test_properties_encoding_is_nul_terminated_utf8() -> None:
    assert encode_properties({}) == b""
    assert encode_properties({"Profile": "echo", "é": ""}) == b"Profile\0echo\0\xc3\xa9\0\0"


@pytest.mark.parametrize(
    "block, reason",
    [
        (b"Profile\0echo", "does not end with NUL"),
        (b"Profile\0", "odd number"),
        (b"a\0b\0a\0c\0", "repeats a key"),
        (b"\xff\xfe\0x\0", "not UTF-8"),
        (b"a" * (MAX_PROPERTIES_SIZE + 1), "too large"),
    ],
)
def test_malformed_properties(block: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        decode_properties(block)


def test_properties_that_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="NUL"):
        encode_properties({"a\0b": "c"})
    with pytest.raises(ValueError, match="strings"):
        encode_properties({"a": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="limit"):
        encode_properties({"big": "x" * MAX_PROPERTIES_SIZE})


def test_describe_flags() -> None:
    assert describe_flags(MSG | URGENT | MORE_COMING) == "MSG|Urgent|MoreComing"
    assert describe_flags(ACK_MSG | URGENT | NO_REPLY) == "ACKMSG|Urgent|NoReply"
    assert describe_flags(7) == "type7"


frame_spec = st.tuples(
    st.sampled_from([MSG, RPY, ERR]),
    st.integers(1, 5000),
    st.booleans(),
    st.binary(max_size=3000) | st.sampled_from([b"", b"a" * 5000, b"0123456789" * 700]),
)


def test_decoded_body_of_a_plain_frame_is_a_read_only_view_of_the_frame() -> None:
    # websockets hands frames over as bytearrays: the body is not copied out of them (issue #17)
    body = bytes(range(256)) * 40
    frame = bytearray(FrameEncoder().encode(1, RPY | MORE_COMING, body))
    _, _, decoded, _ = FrameDecoder().decode(frame)
    assert isinstance(decoded, memoryview) and decoded.readonly and decoded.obj is frame
    assert decoded == body
    with pytest.raises(TypeError):
        decoded[0] = 0  # type: ignore[index]
    # a compressed frame's body is what inflating made: bytes of its own
    packed = bytearray(FrameEncoder().encode(1, RPY | COMPRESSED, body))
    assert FrameDecoder().decode(packed)[2] == body


@settings(deadline=None)
@given(st.lists(frame_spec, min_size=1, max_size=12))
def test_codec_round_trips_a_stream_of_frames(frames: list[tuple[int, int, bool, bytes]]) -> None:
    encoder, decoder = FrameEncoder(), FrameDecoder()
    crc = 0
    for mtype, number, compressed, body in frames:
        flags = mtype | (COMPRESSED if compressed else 0)
        frame = encoder.encode(number, flags, body)
        crc = zlib.crc32(body, crc)
        # The CRC runs over all uncompressed bodies so far, big-endian, at the end.
        assert frame[-4:] == crc.to_bytes(4, "big")
        assert decoder.decode(frame) == (
            number,
            flags,
            body,
            len(frame) - len(frame_header(number, flags)),
        )


def test_compressed_frame_has_no_deflate_trailer() -> None:
    frame = FrameEncoder().encode(1, MSG | COMPRESSED, b"hello hello hello")
    payload = frame[2:-4]
    assert not payload.endswith(b"\x00\x00\xff\xff")
    # A plain raw-deflate stream decodes it once the trailer is put back.
    inflater = zlib.decompressobj(-15)
    assert inflater.decompress(payload + b"\x00\x00\xff\xff") == b"hello hello hello"


def test_checksum_mismatch_is_fatal() -> None:
    encoder, decoder = FrameEncoder(), FrameDecoder()
    first = encoder.encode(1, MSG, b"one")
    second = encoder.encode(2, MSG, b"two")
    # Skipping a frame breaks the running CRC even though each frame is intact.
    with pytest.raises(ProtocolError, match="checksum"):
        decoder.decode(second)
    decoder = FrameDecoder()
    decoder.decode(first)
    corrupted = second[:-5] + bytes([second[-5] ^ 1]) + second[-4:]
    with pytest.raises(ProtocolError, match="checksum"):
        decoder.decode(corrupted)


def test_bad_deflate_data_is_fatal() -> None:
    frame = frame_header(1, MSG | COMPRESSED) + b"\xff\xff\xff\xff" + b"\0\0\0\0"
    with pytest.raises(ProtocolError, match="deflate"):
        FrameDecoder().decode(frame)


def test_frame_too_short_for_checksum_is_fatal() -> None:
    with pytest.raises(ProtocolError, match="checksum"):
        FrameDecoder().decode(b"\x01\x00\x00")


def test_ack_and_unknown_frames_bypass_crc_and_deflate() -> None:
    encoder, decoder = FrameEncoder(), FrameDecoder()
    ack = FrameEncoder.encode_ack(3, ACK_MSG | URGENT | NO_REPLY, 50_000)
    assert ack == b"\x03\x34" + encode_uvarint(50_000)
    assert decoder.decode(ack) == (3, 0x34, encode_uvarint(50_000), 3)
    assert decoder.decode(b"\x01\x03junk") == (1, 3, b"junk", 4)
    # The CRC state is untouched: the next data frame still checks out.
    assert decoder.decode(encoder.encode(1, MSG, b"x"))[2] == b"x"
