"""Our echo peer against an independent BLIP_3 client written in Node (interop/blip_client.mjs).

The client shares no code with ``p2psync.blip``: it has its own varints, CRC, framing,
multiplexing and flow control, so agreement between the two is evidence about the wire format
rather than about one codebase agreeing with itself.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from p2psync import blip

REPO_ROOT = Path(__file__).resolve().parents[2]
INTEROP = REPO_ROOT / "interop"
CLIENT = INTEROP / "blip_client.mjs"
VECTORS = REPO_ROOT / "protocol" / "blip" / "vectors.json"
NODE = shutil.which("node")

#: How many checks ``runChecks`` in interop/blip_client.mjs makes against a peer.
PEER_CHECKS = 26
#: Generous bounds: the whole client run takes a few seconds on the 2-core CI machine.
CLIENT_TIMEOUT = 120.0
PEER_START_TIMEOUT = 20.0

if NODE is None:
    pytestmark = pytest.mark.skip(reason="node is not on PATH (the independent client is Node)")
elif not (INTEROP / "node_modules" / "ws").is_dir():
    pytestmark = pytest.mark.skip(reason="interop/node_modules/ws is missing: run `npm ci` in interop/")

LISTENING = re.compile(rb"listening on (ws://\S+)")


async def run_client(*args: str) -> tuple[int, list[str]]:
    """Run the Node client; return its exit code and stdout lines."""
    assert NODE is not None
    with trio.fail_after(CLIENT_TIMEOUT):
        result = await trio.run_process(
            [NODE, str(CLIENT), *args],
            cwd=REPO_ROOT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    lines = result.stdout.decode().splitlines()
    if result.stderr:
        print(result.stderr.decode(), file=sys.stderr)
    print("\n".join(lines))  # shown by pytest when an assertion fails
    return result.returncode, lines


@pytest.fixture
async def echo_peer_url(tmp_path: Path) -> AsyncIterator[str]:
    """Start ``python -m p2psync blip echo --port 0`` and yield the URL it prints."""
    log = (tmp_path / "echo.log").open("wb")
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "p2psync", "blip", "echo", "--host", "127.0.0.1", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=log,
    )
    try:
        assert process.stdout is not None
        seen = b""
        with trio.fail_after(PEER_START_TIMEOUT):
            while (match := LISTENING.search(seen)) is None:
                chunk = await process.stdout.receive_some()
                assert chunk, f"echo peer exited before listening: {seen!r}"
                seen += chunk
        yield match.group(1).decode() + "_p2psync"
    finally:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
        log.close()


async def test_echo_peer_passes_the_independent_client(echo_peer_url: str) -> None:
    # --strict-acks: one ACK per crossing of a 50,000-byte multiple, with the count at it.
    code, lines = await run_client(echo_peer_url, "--strict-acks")
    failures = [line for line in lines if line.startswith("FAIL")]
    assert failures == []
    assert code == 0
    assert lines[-1] == f"{PEER_CHECKS} passed, 0 failed"
    assert sum(line.startswith("ok ") for line in lines) == PEER_CHECKS


async def test_client_catches_a_peer_that_echoes_wrongly(nursery: trio.Nursery) -> None:
    """The client must be able to fail: a peer that drops the last byte of every echo."""

    async def short_echo(request: blip.Request) -> blip.Reply:
        body = request.body[:-1]
        return blip.Reply({"X-Len": str(len(request.body))}, body)

    server = await nursery.start(blip.serve, "127.0.0.1", 0, "P2PSync_1", {"echo": short_echo})
    code, lines = await run_client(f"ws://127.0.0.1:{server.port}/")
    assert code == 1
    failed = {line.split(":")[0].removeprefix("FAIL ") for line in lines if line.startswith("FAIL")}
    # Echo checks see the cut body; callme gets BLIP 404 from this peer.
    assert {"echo-1B", "echo-500B", "echo-300KiB-request", "concurrent-20", "callme"} <= failed
    assert "echo-0B" not in failed  # nothing to cut from an empty body
    assert "ok subprotocol (BLIP_3+P2PSync_1)" in lines
    assert re.fullmatch(r"\d+ passed, [1-9]\d* failed", lines[-1])


async def test_client_decodes_the_golden_vectors() -> None:
    streams = json.loads(VECTORS.read_text())["streams"]
    code, lines = await run_client("--vectors", str(VECTORS))
    assert code == 0
    assert lines[-1] == f"{len(streams)} passed, 0 failed"


async def test_client_rejects_a_tampered_vector(tmp_path: Path) -> None:
    vectors = json.loads(VECTORS.read_text())
    frame = vectors["streams"][0]["frames"][0]
    # Flip one bit of the body: the CRC the frame carries no longer matches.
    data = bytearray.fromhex(frame["hex"])
    data[5] ^= 0x01
    frame["hex"] = data.hex()
    tampered = tmp_path / "vectors.json"
    tampered.write_text(json.dumps(vectors))
    code, lines = await run_client("--vectors", str(tampered))
    assert code == 1
    assert lines[0].startswith(f"FAIL vectors/{vectors['streams'][0]['name']}: frame 1")
    assert "running CRC" in lines[0]
