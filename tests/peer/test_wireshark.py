"""Inspectable anyway (issue #15): two real peers sync over ``wss://`` on loopback while tshark
captures. The capture shows an eavesdropper nothing but TLS; with the peers' key log
(``SSLKEYLOGFILE``) and ``protocol/wireshark/p2psync.lua``, tshark decodes every WebSocket
message as BLIP and shows the replication profiles and the records themselves.

Capturing on ``lo`` needs root; CI runs as root and ``make test`` installs Debian's tshark.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from p2psync.blip.tls import new_certificate
from p2psync.peer.peer import Peer
from tests.blip.capture import loopback_capture, require_tshark, run_tshark
from tests.peer.support import Clock, new_store, seeded, served, write_notes

PLUGIN = Path(__file__).resolve().parents[2] / "protocol" / "wireshark" / "p2psync.lua"
ALICE = seeded("wireshark-alice")
SECRET = "the-secret-text-of-note"
#: What a first pull of a few records sends, whatever else it does (replication-profiles.md §14).
PULL_PROFILES = {"hello", "getCollections", "subChanges", "changes"}
#: ...and its messages, in `revs` batches between two p2psync peers (§8.4), else in `rev`s.
REV_PROFILES = {"rev", "revs"}
#: A ``Profile`` property as the BLIP dissector shows properties: ``Profile:rev:collection:0``.
PROFILE = re.compile(r"\bProfile:(\w+)")
#: A BLIP frame's flags: its message type (request, reply, error, ...), and "more frames of
#: this message follow".
FRAME_TYPE, MORE_COMING = 0x07, 0x40


def _hex(raw: Any) -> bytes:
    """The bytes of a ``*_raw`` field of tshark's JSON (its first member, in hex)."""
    return bytes.fromhex(raw[0] if isinstance(raw[0], str) else raw[0][0])


async def blip_bodies(args: list[str]) -> list[bytes]:
    """Each BLIP message's body as the capture carries it: its frames' bytes joined in order.

    Wireshark 4.0's BLIP dissector reads every frame as if it began a message, so in a
    continuation frame (after one flagged MoreComing, 0x40) it takes the first bytes of the
    body for a properties length and properties: those bytes go back in front of the rest."""
    packets = json.loads(await run_tshark([*args, "-T", "json", "-x", "--no-duplicate-keys"]))
    joined: dict[tuple[str, int, str], bytearray] = {}
    continued: set[tuple[str, int, str]] = set()
    for packet in packets:
        layers = packet["_source"]["layers"]
        frames = layers.get("blip", [])
        for frame in frames if isinstance(frames, list) else [frames]:
            flags = _hex(frame["blip.frameflags_raw"])[0]  # the field itself hides the type bits
            # a sender's requests and its replies number apart: one key per (sender, type, number)
            key = (layers["tcp"]["tcp.srcport"], flags & FRAME_TYPE, str(frame.get("blip.messagenum")))
            if key in continued:
                body = joined[key]
                body += b"".join(_hex(frame[f]) for f in ("blip.propslength_raw", "blip.props_raw") if f in frame)
            else:
                body = joined[key] = bytearray()
            if "blip.messagebody_raw" in frame:
                body += _hex(frame["blip.messagebody_raw"])
            (continued.add if flags & MORE_COMING else continued.discard)(key)
    return [bytes(body) for body in joined.values()]


async def test_tshark_decodes_a_wss_sync_with_the_key_log_and_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_tshark()
    keylog = tmp_path / "keys.log"
    monkeypatch.setenv("SSLKEYLOGFILE", str(keylog))  # read as each TLS context is made
    source = new_store(tmp_path, "source")
    write_notes(source, ALICE, 5, clock=Clock(), prefix=SECRET)
    server = Peer(source, ALICE, tls=new_certificate())
    client = Peer(new_store(tmp_path, "client"), ALICE)
    capture = tmp_path / "sync.pcapng"
    async with served(server) as url:
        assert url.startswith("wss://")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with loopback_capture(capture, port):
            summary = await client.sync(url, tenant=ALICE.did)
    assert summary.pull is not None and summary.pull.revs_settled == 5
    assert "CLIENT_TRAFFIC_SECRET_0" in keylog.read_text()

    # An eavesdropper's view: the file holds neither the data, the DID nor even the protocol.
    wire = capture.read_bytes()
    for clear in (SECRET, ALICE.did, "BLIP_3", "P2PSync", "_p2psync"):
        assert clear.encode() not in wire, f"{clear!r} is in the capture in clear"
    # The TLS port is stated rather than left to heuristics: an ephemeral port can be one that
    # another dissector claims.
    tls_port = ["-d", f"tcp.port=={port},tls", "-d", f"tls.port=={port},http"]
    plugin = ["-X", f"lua_script:{PLUGIN}"]
    keys = ["-o", f"tls.keylog_file:{keylog}"]
    read = ["-r", str(capture), *tls_port]
    decode = [*read, *plugin]
    keyed = [*decode, *keys]

    # Without the key log, tshark sees the TLS records of the sync and nothing inside them.
    assert await run_tshark([*decode, "-Y", "tls.app_data"])
    assert await run_tshark([*decode, "-Y", "http or websocket or blip"]) == ""
    # With the key log but without the plugin, the WebSocket messages are opaque binary.
    unplugged = [*read, *keys]
    assert await run_tshark([*unplugged, "-Y", "websocket.opcode == 2"])
    assert await run_tshark([*unplugged, "-Y", "blip"]) == ""

    # With both, every binary WebSocket message is a BLIP frame...
    frames = await run_tshark([*keyed, "-Y", "websocket", "-T", "fields",
                               "-e", "frame.number", "-e", "websocket.opcode", "-e", "blip.messagenum"])
    binary = blip_frames = 0
    for line in frames.splitlines():
        _number, opcodes, messages = line.split("\t")
        binary += opcodes.split(",").count("2")
        blip_frames += len(messages.split(",")) if messages else 0
    assert binary > 10 and blip_frames == binary, frames
    assert await run_tshark([*keyed, "-Y", "_ws.malformed or _ws.expert.severity >= error"]) == ""
    # ...on the subprotocol the plugin names, showing the profiles and (CBOR bodies shown as
    # text) the records' data and the tenant's DID: the decryption is real.
    decoded = await run_tshark([*keyed, "-Y", "blip or http", "-T", "fields",
                                "-e", "http.sec_websocket_protocol", "-e", "blip.props",
                                "-e", "blip.messagebody"])
    assert "BLIP_3+P2PSync_1" in decoded
    profiles = set(PROFILE.findall(decoded))
    assert profiles >= PULL_PROFILES and profiles & REV_PROFILES, profiles
    # The records' text, from the bodies' bytes: the text fields above stop at a body's first
    # NUL, and the dissector shows each frame of a multi-frame message (a `revs` batch) apart,
    # so put each message's frames back together (sender, message number) first.
    bodies = await blip_bodies([*keyed, "-Y", "blip"])
    assert all(any(f"{SECRET} {i}".encode() in body for body in bodies) for i in range(5)), bodies
    assert ALICE.did in decoded
