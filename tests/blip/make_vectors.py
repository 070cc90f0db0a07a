"""Write ``protocol/blip/vectors.json``, the golden BLIP_3 frames (run from the repo root).

    .venv/bin/python -m tests.blip.make_vectors

The vectors are what our state machine sends for a few fixed conversations; the test
``tests/blip/test_vectors.py`` checks the file against the codec and against plain zlib, so a
change in our wire output shows up as a failing test, not as a silent new file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2psync.blip.codec import FrameDecoder, FrameEncoder
from p2psync.blip.connection import BlipConnection
from p2psync.blip.wire import (
    ACK_MSG,
    ACK_RPY,
    COMPRESSED,
    MORE_COMING,
    MSG,
    NO_REPLY,
    TYPE_MASK,
    TYPE_NAMES,
    URGENT,
    decode_uvarint,
    describe_flags,
    encode_message_head,
    frame_header,
)

OUTPUT = Path(__file__).resolve().parents[2] / "protocol" / "blip" / "vectors.json"
HEX_PAYLOAD_LIMIT = 512  # payloads up to this size are spelled out; larger ones by hash


def describe_body(body: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    if len(body) <= 200:
        try:
            out["utf8"] = body.decode()
        except UnicodeDecodeError:
            out["hex"] = body.hex()
    return out


def frames_of(frames: list[bytes], meanings: list[str]) -> list[dict[str, Any]]:
    """Describe a direction's frames, decoding them to record payloads and whole messages."""
    decoder = FrameDecoder()
    partial: dict[tuple[int, int], bytearray] = {}
    out = []
    for frame, meaning in zip(frames, meanings, strict=True):
        number, flags, payload, _ = decoder.decode(frame)
        mtype = flags & TYPE_MASK
        entry: dict[str, Any] = {
            "hex": frame.hex(),
            "meaning": meaning,
            "number": number,
            "type": TYPE_NAMES[mtype],
            "flags": flags,
            "flags_text": describe_flags(flags),
        }
        if mtype in (ACK_MSG, ACK_RPY):
            entry["ack_bytes"] = decode_uvarint(payload)[0]
            out.append(entry)
            continue
        entry["payload_length"] = len(payload)
        entry["payload_sha256"] = hashlib.sha256(payload).hexdigest()
        if len(payload) <= HEX_PAYLOAD_LIMIT:
            entry["payload_hex"] = payload.hex()
        entry["crc32"] = int.from_bytes(frame[-4:], "big")
        key = (min(mtype, 1), number)
        data = partial.setdefault(key, bytearray())
        data += payload
        if not flags & MORE_COMING:
            whole = bytes(partial.pop(key))
            length, pos = whole[0], 1
            assert length < 0x80, "vectors keep properties short"
            block = whole[pos : pos + length]
            props = block[:-1].decode().split("\0") if block else []
            entry["message"] = {
                "properties": dict(zip(props[::2], props[1::2], strict=True)),
                "body": describe_body(whole[pos + length :]),
            }
        out.append(entry)
    return out


def stream(
    name: str, description: str, build: Callable[[BlipConnection], list[str]]
) -> tuple[dict[str, Any], list[bytes]]:
    conn = BlipConnection()
    meanings = build(conn)
    frames = conn.frames_to_send(1 << 30)
    return {
        "name": name,
        "description": description,
        "exact": not any(f[1] & COMPRESSED for f in frames if len(f) > 1),
        "frames": frames_of(frames, meanings),
    }, frames


def build() -> dict[str, Any]:
    streams = []

    def requests(conn: BlipConnection) -> list[str]:
        conn.send_request({"Profile": "echo"}, b"hello")
        conn.send_request({"Profile": "note", "k": "v"}, b"", urgent=True, no_reply=True)
        conn.send_request({}, b"no properties")
        return [
            "MSG #1, Profile=echo, body 'hello'; the CRC covers this frame's body only",
            "MSG #2, urgent and no-reply, two properties, empty body",
            "MSG #3, no properties (a zero length is still written), body 'no properties'",
        ]

    requests_vec, request_frames = stream(
        "requests",
        "Three single-frame requests from one side, from the connection start.",
        requests,
    )
    streams.append(requests_vec)

    # The other direction answers: the peer has received the three requests above.
    peer = BlipConnection()
    for frame in request_frames:
        peer.receive_message(frame)
    peer.send_reply(1, {"X-Len": "5"}, b"hello")
    peer.send_error(3, "BLIP", 404, "no handler for ''")
    streams.append(
        {
            "name": "replies",
            "description": "The reverse direction of 'requests': an RPY to #1 and an ERR to #3 "
            "(#2 wanted no reply). Its CRC starts again from zero.",
            "exact": True,
            "receiver_sent_requests": 3,
            "receiver_awaits_replies": [1, 3],
            "frames": frames_of(
                peer.frames_to_send(1 << 30),
                [
                    "RPY #1 with X-Len=5 and the body back",
                    "ERR #3: Error-Domain=BLIP, Error-Code=404, the message as the body",
                ],
            ),
        }
    )

    def compressed(conn: BlipConnection) -> list[str]:
        props = {"Profile": "echo", "X-Compress": "1"}
        conn.send_request(props, b"compress me please " * 10, compressed=True)
        conn.send_request(props, b"compress me please " * 10, compressed=True)
        return [
            "MSG #1 compressed: raw deflate, sync flush, trailing 00 00 FF FF removed",
            "MSG #2, same content: it compresses to a few bytes because the deflate stream "
            "(and its window) runs on from frame 1; a decoder that restarts per frame fails here",
        ]

    streams.append(
        stream(
            "compressed",
            "Two compressed requests sharing one deflate stream. The CRC is over the "
            "uncompressed bodies. Other deflate encoders may emit different bytes: decode "
            "these, do not compare your encoder's output with them.",
            compressed,
        )[0]
    )

    def multi_frame(conn: BlipConnection) -> list[str]:
        conn.send_request({"Profile": "put"}, bytes(i % 251 for i in range(10_000)))
        conn.send_request({"Profile": "ping"}, b"!")
        return [
            "MSG #1, first frame, MoreComing: 4,096 bytes in all because another message waits",
            "MSG #2, a small request, interleaved before #1 finishes",
            "MSG #1, last frame: up to 16,384 bytes now that nothing else waits",
        ]

    streams.append(
        stream(
            "multi-frame",
            "A 10,000-byte request split into frames, with a small one passing it.",
            multi_frame,
        )[0]
    )

    def compressed_multi_frame(conn: BlipConnection) -> list[str]:
        conn.send_request({"Profile": "put"}, b"0123456789abcdef" * 2500, compressed=True)
        return [
            "MSG #1 compressed, MoreComing",
            "MSG #1 compressed, MoreComing",
            "MSG #1 compressed, last frame",
        ]

    streams.append(
        stream(
            "compressed-multi-frame",
            "A 40,000-byte compressed request in three frames of one deflate stream.",
            compressed_multi_frame,
        )[0]
    )

    acks = [
        FrameEncoder.encode_ack(1, ACK_MSG | URGENT | NO_REPLY, 51_234),
        FrameEncoder.encode_ack(3, ACK_RPY | URGENT | NO_REPLY, 100_010),
    ]
    streams.append(
        {
            "name": "acks",
            "description": "ACK frames: urgent and no-reply, body uvarint(bytes received so far), "
            "no CRC; they do not touch the CRC or deflate state.",
            "exact": True,
            "frames": frames_of(
                acks,
                [
                    "ACKMSG for our request #1: the peer has 51,234 of its frame bytes",
                    "ACKRPY for our reply #3: the peer has 100,010 of its frame bytes",
                ],
            ),
        }
    )

    def encoded(*frames: tuple[int, int, bytes]) -> list[str]:
        encoder = FrameEncoder()
        return [encoder.encode(number, flags, payload).hex() for number, flags, payload in frames]

    good = FrameEncoder().encode(1, MSG, encode_message_head({"P": "x"}) + b"ok")
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0x01
    errors = [
        {
            "name": "text-message",
            "text": "hello",
            "outcome": "fatal",
            "why": "BLIP frames are binary WebSocket messages",
        },
        {"name": "empty-frame", "frame": "", "outcome": "fatal", "why": "no header"},
        {"name": "header-without-flags", "frame": "01", "outcome": "fatal", "why": "no flags"},
        {
            "name": "varint-too-long",
            "frame": "ff" * 11,
            "outcome": "fatal",
            "why": "a uvarint has at most 10 bytes",
        },
        {
            "name": "crc-mismatch",
            "frame": bytes(bad_crc).hex(),
            "outcome": "fatal",
            "why": "the last CRC byte is flipped",
        },
        {
            "name": "request-number-skipped",
            "frame": encoded((2, MSG, b"\x00"))[0],
            "outcome": "fatal",
            "why": "the first request must be #1",
        },
        {
            "name": "reply-to-unsent-request",
            "frame": encoded((1, 1, b"\x00"))[0],
            "outcome": "fatal",
            "why": "no request #1 was sent",
        },
        {
            "name": "bad-deflate-data",
            "frame": (frame_header(1, MSG | COMPRESSED) + b"\xfe\xfe\xfe\x00\x00\x00\x00").hex(),
            "outcome": "fatal",
            "why": "not a deflate block",
        },
        {
            "name": "unknown-type",
            "frame": (frame_header(1, 3) + b"whatever").hex(),
            "outcome": "skip",
            "why": "type 3 is not defined; the frame is ignored",
        },
        {
            "name": "frame-for-finished-message",
            "before": encoded((1, MSG, b"\x00one"), (1, MSG, b"\x00again"))[:1],
            "frame": encoded((1, MSG, b"\x00one"), (1, MSG, b"\x00again"))[1],
            "outcome": "skip",
            "why": "request #1 already ended",
        },
        {
            "name": "properties-not-nul-terminated",
            "frame": encoded((1, MSG, b"\x03a\x00b"))[0],
            "outcome": "skip",
            "why": "malformed properties; a request that wants a reply gets ERR BLIP 400",
        },
        {
            "name": "properties-repeat-a-key",
            "frame": encoded((1, MSG, b"\x08a\x001\x00a\x002\x00"))[0],
            "outcome": "skip",
            "why": "malformed properties",
        },
        {
            "name": "properties-odd-strings",
            "frame": encoded((1, MSG, b"\x02a\x00"))[0],
            "outcome": "skip",
            "why": "malformed properties",
        },
        {
            "name": "unknown-flag-bits",
            "frame": encoded((1, MSG | 0x80, b"\x00body"))[0],
            "outcome": "ok",
            "why": "bits outside 0x7F are ignored; this is MSG #1 'body'",
        },
    ]
    return {
        "format": "p2psync BLIP_3 golden frames, version 1",
        "see": "protocol/blip/README.md",
        "streams": streams,
        "errors": errors,
    }


def main() -> None:
    OUTPUT.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
