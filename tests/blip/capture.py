"""Capturing loopback traffic with tshark for the tests that check our bytes with Wireshark.

Capturing on ``lo`` needs root; CI runs as root and ``make test`` installs Debian's tshark.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

#: Generous bounds for tshark start-up and packet delivery on a loaded machine.
TSHARK_TIMEOUT = 60
#: How often a probe connection is dialled while waiting for tshark to show one.
PROBE_INTERVAL = 0.2


def require_tshark() -> str:
    """tshark's path; skips when capturing is impossible here (not root), fails when tshark is
    simply missing (a test that silently never runs checks nothing)."""
    if os.geteuid() != 0:
        pytest.skip("capturing on lo needs root (CI runs as root)")
    path = shutil.which("tshark")
    if path is None:
        pytest.fail("tshark is not installed; `make test` installs it (apt-get install tshark)")
    return path


async def run_tshark(args: list[str]) -> str:
    """tshark's standard output for ``args`` (text; bodies it prints raw are replaced)."""
    result = await trio.run_process([require_tshark(), *args], capture_stdout=True, capture_stderr=True)
    return result.stdout.decode("utf-8", "replace")


def _mentions(port: int) -> re.Pattern[bytes]:
    """A port as a source or destination in tshark's one-line summaries (not a number that
    happens to end a ``Seq=``, ``Len=`` or timestamp)."""
    return re.compile(rf"(?<![=\d.]){port}\b".encode())


@asynccontextmanager
async def loopback_capture(path: Path, port: int) -> AsyncIterator[None]:
    """Capture TCP to and from ``port`` on ``lo`` into ``path`` for the block.

    Two probe listeners make the capture's edges certain: the block starts only once tshark
    has shown a connection to the first (it is capturing), and ends only once it has shown
    one to the second, dialled after the block's last byte (everything before is in the file).
    """
    tshark = require_tshark()
    async with trio.open_nursery() as nursery:
        probes = [(await trio.open_tcp_listeners(0, host="127.0.0.1"))[0] for _ in range(2)]
        ready_port, done_port = (probe.socket.getsockname()[1] for probe in probes)

        async def accept_probes(probe: trio.SocketListener) -> None:
            while True:
                await (await probe.accept()).aclose()

        for probe in probes:
            nursery.start_soon(accept_probes, probe)
        ports = " or ".join(f"tcp port {p}" for p in (port, ready_port, done_port))
        process = await trio.lowlevel.open_process(
            [tshark, "-i", "lo", "-f", ports, "-w", str(path), "-l", "-P"], stdout=-1, stderr=-1
        )
        assert process.stdout is not None
        seen = b""

        async def wait_for(probe_port: int) -> None:
            nonlocal seen
            assert process.stdout is not None
            shown = _mentions(probe_port)
            while not shown.search(seen):
                with trio.move_on_after(PROBE_INTERVAL):
                    data = await process.stdout.receive_some()
                    if not data:
                        assert process.stderr is not None
                        problem = await process.stderr.receive_some()
                        pytest.fail(f"tshark stopped capturing: {problem.decode(errors='replace')}")
                    seen += data
                if not shown.search(seen):
                    await (await trio.open_tcp_stream("127.0.0.1", probe_port)).aclose()

        try:
            with trio.fail_after(TSHARK_TIMEOUT):
                await wait_for(ready_port)
            yield
            with trio.fail_after(TSHARK_TIMEOUT):
                await wait_for(done_port)
        finally:
            process.send_signal(signal.SIGINT)
            with trio.move_on_after(TSHARK_TIMEOUT):
                await process.wait()
            if process.returncode is None:
                process.kill()
            nursery.cancel_scope.cancel()
