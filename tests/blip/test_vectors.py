"""Our codec against the golden frames in ``protocol/blip/vectors.json``.

Each stream is checked twice: with a few lines of plain zlib written here (so the file is
right on its own terms, as another implementation would read it) and with our codec and
state machine.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from p2psync.blip.codec import FrameDecoder, FrameEncoder
from p2psync.blip.connection import (
    BlipConnection,
    FrameIgnored,
    MessageFailed,
    MessageStart,
)
from p2psync.blip.errors import ProtocolError

from .conftest import assemble

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "protocol" / "blip" / "vectors.json").read_text()
)
STREAMS = {s["name"]: s for s in VECTORS["streams"]}
ERRORS = {e["name"]: e for e in VECTORS["errors"]}
TYPES = {"MSG": 0, "RPY": 1, "ERR": 2, "ACKMSG": 4, "ACKRPY": 5}


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def test_the_file_covers_what_it_should() -> None:
    assert set(STREAMS) >= {"requests", "replies", "compressed", "multi-frame", "acks"}
    kinds = {f["type"] for s in STREAMS.values() for f in s["frames"]}
    assert kinds == set(TYPES)
    assert {e["outcome"] for e in ERRORS.values()} == {"fatal", "skip", "ok"}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_stream_checks_out_with_plain_zlib(name: str) -> None:
    crc = 0
    inflater = zlib.decompressobj(-15)
    for entry in STREAMS[name]["frames"]:
        frame = bytes.fromhex(entry["hex"])
        number, pos = _uvarint(frame, 0)
        flags, pos = _uvarint(frame, pos)
        assert (number, flags, flags & 7) == (entry["number"], entry["flags"], TYPES[entry["type"]])
        if flags & 7 >= 4:
            assert _uvarint(frame, pos)[0] == entry["ack_bytes"]
            continue
        payload = frame[pos:-4]
        if flags & 0x08:
            payload = inflater.decompress(payload + b"\x00\x00\xff\xff")
        crc = zlib.crc32(payload, crc)
        assert int.from_bytes(frame[-4:], "big") == crc == entry["crc32"]
        assert len(payload) == entry["payload_length"]
        assert hashlib.sha256(payload).hexdigest() == entry["payload_sha256"]
        if "payload_hex" in entry:
            assert payload.hex() == entry["payload_hex"]


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_our_codec_decodes_and_reencodes_the_stream(name: str) -> None:
    stream = STREAMS[name]
    decoder, encoder = FrameDecoder(), FrameEncoder()
    for entry in stream["frames"]:
        frame = bytes.fromhex(entry["hex"])
        number, flags, payload, _ = decoder.decode(frame)
        assert (number, flags) == (entry["number"], entry["flags"])
        if entry["type"].startswith("ACK"):
            assert FrameEncoder.encode_ack(number, flags, entry["ack_bytes"]) == frame
            continue
        assert hashlib.sha256(payload).hexdigest() == entry["payload_sha256"]
        ours = encoder.encode(number, flags, payload)
        if stream["exact"]:
            assert ours == frame
        else:  # other deflate encoders may differ: it must decode the same, though
            assert ours[-4:] == frame[-4:]


@pytest.mark.parametrize("name", sorted(n for n in STREAMS if n != "acks"))
def test_our_connection_reads_the_messages(name: str) -> None:
    stream = STREAMS[name]
    conn = BlipConnection()
    awaited = set(stream.get("receiver_awaits_replies", []))
    for number in range(1, stream.get("receiver_sent_requests", 0) + 1):
        conn.send_request({}, no_reply=number not in awaited)
    events = []
    for entry in stream["frames"]:
        events += conn.receive_message(bytes.fromhex(entry["hex"]))
    messages = assemble(events)
    expected = {
        (min(TYPES[e["type"]], 1), e["number"]): e["message"]
        for e in stream["frames"]
        if "message" in e
    }
    assert set(messages) == set(expected)
    for key, (properties, body, _) in messages.items():
        assert properties == expected[key]["properties"]
        assert hashlib.sha256(body).hexdigest() == expected[key]["body"]["sha256"]
        if "utf8" in expected[key]["body"]:
            assert body.decode() == expected[key]["body"]["utf8"]


def test_our_connection_sends_exactly_the_uncompressed_streams() -> None:
    conn = BlipConnection()
    conn.send_request({"Profile": "echo"}, b"hello")
    conn.send_request({"Profile": "note", "k": "v"}, b"", urgent=True, no_reply=True)
    conn.send_request({}, b"no properties")
    assert [f.hex() for f in conn.frames_to_send()] == [
        f["hex"] for f in STREAMS["requests"]["frames"]
    ]
    conn = BlipConnection()
    conn.send_request({"Profile": "put"}, bytes(i % 251 for i in range(10_000)))
    conn.send_request({"Profile": "ping"}, b"!")
    assert [f.hex() for f in conn.frames_to_send()] == [
        f["hex"] for f in STREAMS["multi-frame"]["frames"]
    ]


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_error_vectors(name: str) -> None:
    vector: dict[str, Any] = ERRORS[name]
    conn = BlipConnection()
    for before in vector.get("before", []):
        conn.receive_message(bytes.fromhex(before))
    data: bytes | str = vector["text"] if "text" in vector else bytes.fromhex(vector["frame"])
    if vector["outcome"] == "fatal":
        with pytest.raises(ProtocolError):
            conn.receive_message(data)
        return
    events = conn.receive_message(data)
    if vector["outcome"] == "skip":
        assert events and all(isinstance(e, FrameIgnored | MessageFailed) for e in events)
    else:
        assert [type(e) for e in events] == [MessageStart]
