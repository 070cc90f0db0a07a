"""The echo peer and the BLIP layer over real loopback TCP sockets."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest
import trio

from p2psync import blip
from p2psync.blip.echo import (
    FAIL_CODE,
    FAIL_DOMAIN,
    FAIL_MESSAGE,
    HELLO_BODY,
    add_cli,
    run_cli,
    run_echo_server,
)
from p2psync.blip.wire import COMPRESSED, MSG

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_echo_profiles_over_tcp(nursery: trio.Nursery) -> None:
    server = await nursery.start(run_echo_server, "127.0.0.1", 0, "P2PSync_1")
    hellos: list[bytes] = []
    hello_seen = trio.Event()

    async def hello(request: blip.Request) -> blip.Reply:
        hellos.append(request.body)
        hello_seen.set()
        return blip.Reply()

    url = f"ws://127.0.0.1:{server.port}/any/path"
    async with blip.connect(url, handlers={"hello": hello}) as conn:
        reply = await conn.request("echo", {"X-Other": "1"}, b"ping")
        assert (reply.body, reply.properties) == (b"ping", {"X-Len": "4"})
        assert not reply.flags & COMPRESSED

        text = b"squeeze " * 1000
        reply = await conn.request("echo", {"X-Compress": "1"}, text)
        assert reply.body == text and reply.properties["X-Len"] == str(len(text))
        assert reply.flags & COMPRESSED

        with pytest.raises(blip.BlipError) as info:
            await conn.request("fail")
        assert info.value == blip.BlipError(FAIL_DOMAIN, FAIL_CODE, FAIL_MESSAGE)

        with pytest.raises(blip.BlipError) as info:
            await conn.request("no-such-profile")
        assert (info.value.domain, info.value.code) == ("BLIP", 404)

        reply = await conn.request("callme")
        assert reply.properties == {"X-Callback": "hello"}
        with trio.fail_after(10):
            await hello_seen.wait()
        assert hellos == [HELLO_BODY]
    assert len(server.connections) <= 1


async def test_large_and_small_messages_interleave_over_tcp(nursery: trio.Nursery) -> None:
    server = await nursery.start(run_echo_server, "127.0.0.1", 0, "P2PSync_1")
    big = os.urandom(10 * 1024 * 1024)
    progress_at_end: list[tuple[int, int, bool] | None] = []
    async with blip.connect(f"ws://127.0.0.1:{server.port}/") as conn:
        small_done = 0

        async def small(i: int) -> None:
            nonlocal small_done
            assert (await conn.request("echo", body=b"%d" % i)).body == b"%d" % i
            small_done += 1
            if small_done == 1000:
                progress_at_end.append(conn._core.outgoing_progress(MSG, 1))

        async with trio.open_nursery() as inner:

            async def large() -> None:
                assert (await conn.request("echo", body=big)).body == big

            inner.start_soon(large)
            while conn._core.outgoing_progress(MSG, 1) is None:
                await trio.sleep(0)
            for i in range(1000):
                inner.start_soon(small, i)
    (progress,) = progress_at_end
    assert progress is not None and 0 < progress[0] < len(big)


def test_add_cli_registers_blip_echo() -> None:
    parser = argparse.ArgumentParser(prog="p2psync")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["blip", "echo", "--host", "127.0.0.1", "--port", "0"])
    assert args.func is run_cli
    assert (args.host, args.port, args.app_id) == ("127.0.0.1", 0, "P2PSync_1")


@pytest.mark.parametrize(
    "command", [["-m", "p2psync.blip.echo"], ["-m", "p2psync", "blip", "echo"]], ids=str
)
async def test_echo_command_serves_other_implementations(command: list[str]) -> None:
    """The echo peer as another implementation's test would run it."""
    process = await trio.lowlevel.open_process(
        [sys.executable, *command, "--port", "0", "--app-id", "Interop_1"],
        cwd=REPO_ROOT,
        stdout=-1,
    )
    assert process.stdout is not None
    try:
        with trio.fail_after(30):
            banner = b""
            while b"\n" not in banner:
                chunk = await process.stdout.receive_some()
                assert chunk, "the echo peer exited before listening"
                banner += chunk
        line = banner.decode()
        assert "BLIP_3+Interop_1" in line
        url = line.split()[5]
        async with blip.connect(url, app_id="Interop_1") as conn:
            assert (await conn.request("echo", body=b"over a process")).body == b"over a process"
    finally:
        process.terminate()
        await process.wait()
