"""An independent check of our frames: Wireshark's BLIP dissector decodes a captured loopback
conversation (both directions, compressed and multi-frame messages, ACKs, an ERR), and a
small parser written here re-checks every CRC and deflate block with plain zlib.

Capturing on ``lo`` needs root; CI runs as root and ``make test`` installs Debian's tshark.
"""

from __future__ import annotations

import base64
import os
import re
import zlib
from pathlib import Path

import pytest
import trio

from p2psync import blip
from p2psync.blip.echo import ECHO_HANDLERS
from tests.blip.capture import loopback_capture, require_tshark, run_tshark

#: Wireshark's dissector only claims these subprotocols, so the capture negotiates one of them.
CAPTURE_APP_ID = "CBMobile_3"


def text_body(size: int) -> bytes:
    """Random bytes as base64: incompressible, and free of NUL (which the dissector shows as a
    string and would flag as "stray characters")."""
    return base64.b64encode(os.urandom(size * 3 // 4))[:size]


async def _converse(port: int) -> None:
    hello_seen = trio.Event()

    async def hello(request: blip.Request) -> blip.Reply:
        hello_seen.set()
        return blip.Reply({"X-Hello": "back"}, b"hi echo")

    url = f"ws://127.0.0.1:{port}/db/_blipsync"
    async with blip.connect(url, app_id=CAPTURE_APP_ID, handlers={"hello": hello}) as conn:
        assert conn.subprotocol == "BLIP_3+CBMobile_3"
        reply = await conn.request("echo", {"X-Test": "plain"}, b"a plain body")
        assert reply.body == b"a plain body"
        squeezable = b"compress me please " * 40
        reply = await conn.request("echo", {"X-Compress": "1"}, squeezable, compress=True)
        assert reply.body == squeezable and reply.flags & 0x08
        big = text_body(200_000)  # multi-frame both ways, ACKs both ways
        assert (await conn.request("echo", {}, big)).body == big
        big_squeezable = b"0123456789abcdef" * 20_000  # compressed and multi-frame
        reply = await conn.request("echo", {"X-Compress": "1"}, big_squeezable, compress=True)
        assert reply.body == big_squeezable
        with pytest.raises(blip.BlipError):
            await conn.request("fail")
        await conn.request("callme")  # the server then sends us a request of its own
        await hello_seen.wait()
        await conn.send_no_reply("echo", {"X-Note": "no reply"}, b"fire and forget", urgent=True)


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _websocket_messages(stream: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of every WebSocket frame after the HTTP upgrade (RFC 6455)."""
    pos = stream.index(b"\r\n\r\n") + 4
    out = []
    while pos < len(stream):
        opcode = stream[pos] & 0x0F
        masked = stream[pos + 1] & 0x80
        length = stream[pos + 1] & 0x7F
        pos += 2
        if length == 126:
            length = int.from_bytes(stream[pos : pos + 2], "big")
            pos += 2
        elif length == 127:
            length = int.from_bytes(stream[pos : pos + 8], "big")
            pos += 8
        key = b""
        if masked:
            key, pos = stream[pos : pos + 4], pos + 4
        payload = stream[pos : pos + length]
        pos += length
        if masked and payload:
            mask = (key * (length // 4 + 1))[:length]
            payload = (int.from_bytes(payload, "big") ^ int.from_bytes(mask, "big")).to_bytes(
                length, "big"
            )
        out.append((opcode, payload))
    return out


def _check_direction(messages: list[tuple[int, bytes]]) -> dict[str, int]:
    """Verify the running CRC and the deflate stream of one direction with plain zlib."""
    crc = 0
    inflater = zlib.decompressobj(-15)
    counts = {"frames": 0, "acks": 0, "compressed": 0}
    for opcode, payload in messages:
        if opcode != 2:
            continue
        counts["frames"] += 1
        _, pos = _uvarint(payload, 0)
        flags, pos = _uvarint(payload, pos)
        if flags & 0x07 in (4, 5):
            counts["acks"] += 1
            continue
        body = payload[pos:-4]
        if flags & 0x08:
            counts["compressed"] += 1
            body = inflater.decompress(body + b"\x00\x00\xff\xff")
        crc = zlib.crc32(body, crc)
        assert crc == int.from_bytes(payload[-4:], "big"), "CRC mismatch in the capture"
    return counts


def _protocol_trees(verbose: str, title: str) -> list[str]:
    """The subtrees of one protocol in ``tshark -V`` output (a top-level line and the indented
    lines under it)."""
    trees: list[str] = []
    current: list[str] | None = None
    for line in verbose.splitlines():
        if line and not line[0].isspace():
            if current is not None:
                trees.append("\n".join(current))
            current = [line] if line.startswith(title) else None
        elif current is not None:
            current.append(line)
    if current is not None:
        trees.append("\n".join(current))
    return trees


async def test_wireshark_decodes_every_frame(tmp_path: Path) -> None:
    require_tshark()
    capture = tmp_path / "blip.pcapng"
    async with trio.open_nursery() as nursery:
        server = await nursery.start(blip.serve, "127.0.0.1", 0, CAPTURE_APP_ID, ECHO_HANDLERS)
        port = server.port
        async with loopback_capture(capture, port):
            await _converse(port)
        nursery.cancel_scope.cancel()

    decode = ["-r", str(capture), "-d", f"tcp.port=={port},http"]
    verbose = await run_tshark([*decode, "-Y", "blip", "-V"])
    blip_trees = _protocol_trees(verbose, "BLIP Couchbase Mobile")
    dissected = len(blip_trees)
    assert "Malformed" not in verbose and "Dissector bug" not in verbose
    for tree in blip_trees:
        for problem in ("Expert Info", "Error decompressing"):
            assert problem not in tree, f"tshark reports {problem!r} in:\n{tree}"
    # What the dissector read out of our frames.
    assert "Properties: Profile:echo:X-Test:plain" in verbose
    assert "Message Body: a plain body" in verbose
    assert "Message Body [truncated]: compress me please compress me please" in verbose
    assert "Properties: Error-Domain:EchoTest:Error-Code:418" in verbose
    assert "Properties: Profile:hello:X-From:echo" in verbose
    for flags in ("Compressed (0x08)", "MoreComing (0x40)", "Compressed|MoreComing (0x48)"):
        assert f"Frame Flags: {flags}" in verbose
    assert "Frame Flags: Urgent|NoReply (0x30)" in verbose  # ACK frames
    assert "ACK num bytes:" in verbose
    summary = await run_tshark([*decode, "-Y", "blip"])
    for kind in ("MSG#", "RPY#", "ERR#", "ACKMSG#", "ACKRPY#"):
        assert kind in summary

    # Every binary WebSocket message is a BLIP frame the dissector decoded, and the CRCs and
    # deflate blocks hold up under plain zlib.
    streams = await run_tshark(
        ["-r", str(capture), "-Y", f"tcp.port=={port}", "-T", "fields", "-e", "tcp.stream"]
    )
    stream_id = streams.split()[0]
    follow = await run_tshark(["-r", str(capture), "-q", "-z", f"follow,tcp,raw,{stream_id}"])
    lines = [line for line in follow.splitlines() if re.fullmatch(r"\t?[0-9a-f]+", line)]
    client_bytes = bytes.fromhex("".join(line for line in lines if not line.startswith("\t")))
    server_bytes = bytes.fromhex("".join(line[1:] for line in lines if line.startswith("\t")))
    sent = _check_direction(_websocket_messages(client_bytes))
    received = _check_direction(_websocket_messages(server_bytes))
    assert dissected == sent["frames"] + received["frames"]
    assert sent["acks"] and received["acks"]
    assert sent["compressed"] and received["compressed"]
