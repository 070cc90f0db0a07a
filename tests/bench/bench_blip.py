"""BLIP over loopback: round trips per second and MB/s for large bodies.

    .venv/bin/python tests/bench/bench_blip.py

Runs the peer in a second process (two peers are two processes; this machine has two cores),
then both ends in one process. Prints the figures and writes them under ``## BLIP`` in
``docs/benchmarks.md``. Compression is off.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync import blip  # noqa: E402
from p2psync.blip import connection as connection_module  # noqa: E402

ROUND_TRIP_BODY = 500  # bytes per request (the figure)
IN_FLIGHT = 64  # concurrent requests
ROUND_TRIPS = 20_000
WARM_UP = 2_000
LARGE_SIZES = {"1 MiB": 1 << 20, "10 MiB": 10 << 20}
LARGE_TOTAL = 100 << 20  # bytes moved per large-body figure
BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"
COMMAND = ".venv/bin/python tests/bench/bench_blip.py"

T = TypeVar("T")


async def handle_echo(request: blip.Request) -> blip.Reply:
    return blip.Reply(body=request.body)


async def handle_sink(request: blip.Request) -> blip.Reply:
    return blip.Reply({"X-Len": str(len(request.body))})


_BLOBS: dict[int, bytes] = {}


async def handle_source(request: blip.Request) -> blip.Reply:
    size = int(request.properties["X-Size"])
    blob = _BLOBS.get(size)
    if blob is None:
        blob = _BLOBS[size] = os.urandom(size)
    return blip.Reply(body=blob)


async def handle_cpu(request: blip.Request) -> blip.Reply:
    """The peer's CPU time so far, so the bench can tell CPU cost from a busy machine."""
    return blip.Reply({"X-CPU": repr(time.process_time())})


HANDLERS: dict[str, blip.HandlerSpec] = {
    "echo": handle_echo,
    "sink": handle_sink,
    "source": handle_source,
    "cpu": handle_cpu,
}


class Clocks:
    """Wall time and the CPU time of both processes over one measurement."""

    def __init__(self, conn: blip.Connection, same_process: bool) -> None:
        self.conn = conn
        self.same_process = same_process

    async def _peer_cpu(self) -> float:
        if self.same_process:
            return 0.0
        return float((await self.conn.request("cpu")).properties["X-CPU"])

    async def start(self) -> None:
        self.peer = await self._peer_cpu()
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    async def stop(self) -> tuple[float, float]:
        """(wall seconds, CPU seconds of the busier process)."""
        wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        peer = await self._peer_cpu() - self.peer
        return wall, max(cpu, peer)


async def serve_forever(port: int) -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(blip.serve, "127.0.0.1", port, blip.DEFAULT_APP_ID, HANDLERS)
        print(f"PORT {server.port}", flush=True)


async def round_trips(clocks: Clocks, count: int) -> tuple[float, float]:
    conn = clocks.conn
    body = os.urandom(ROUND_TRIP_BODY)
    per_task = count // IN_FLIGHT

    async def worker() -> None:
        for _ in range(per_task):
            await conn.request("echo", body=body)

    await clocks.start()
    async with trio.open_nursery() as nursery:
        for _ in range(IN_FLIGHT):
            nursery.start_soon(worker)
    wall, cpu = await clocks.stop()
    done = per_task * IN_FLIGHT
    return done / wall, done / cpu


async def upload(clocks: Clocks, size: int) -> tuple[float, float]:
    conn = clocks.conn
    body = os.urandom(size)
    await conn.request("sink", body=body)  # warm-up
    count = max(2, LARGE_TOTAL // size)
    await clocks.start()
    for _ in range(count):
        reply = await conn.request("sink", body=body)
        assert reply.properties["X-Len"] == str(size)
    wall, cpu = await clocks.stop()
    return size * count / wall / 1e6, size * count / cpu / 1e6


async def download(clocks: Clocks, size: int) -> tuple[float, float]:
    conn = clocks.conn
    props = {"X-Size": str(size)}
    await conn.request("source", props)  # warm-up (the peer makes its blob)
    count = max(2, LARGE_TOTAL // size)
    await clocks.start()
    for _ in range(count):
        reply = await conn.request("source", props)
        assert len(reply.body) == size
    wall, cpu = await clocks.stop()
    return size * count / wall / 1e6, size * count / cpu / 1e6


async def measure(port: int, same_process: bool = False) -> dict[str, tuple[float, float]]:
    figures: dict[str, tuple[float, float]] = {}
    async with blip.connect(f"ws://127.0.0.1:{port}/bench") as conn:
        clocks = Clocks(conn, same_process)
        await round_trips(clocks, WARM_UP)
        figures["rt"] = await round_trips(clocks, ROUND_TRIPS)
        for label, size in LARGE_SIZES.items():
            figures[f"up {label}"] = await upload(clocks, size)
            figures[f"down {label}"] = await download(clocks, size)
    return figures


async def measure_same_process() -> dict[str, tuple[float, float]]:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(blip.serve, "127.0.0.1", 0, blip.DEFAULT_APP_ID, HANDLERS)
        figures = await measure(server.port, same_process=True)
        nursery.cancel_scope.cancel()
    return figures


def with_peer_process(run: Callable[[int], Awaitable[T]], window: int | None = None) -> T:
    """``run(port)`` under trio against this file's handlers served by a second process
    (sending with a flow-control ``window`` other than BLIP's when given)."""
    extra = [] if window is None else ["--window", str(window)]
    peer = subprocess.Popen(
        [sys.executable, __file__, "--serve", "0", *extra], stdout=subprocess.PIPE, text=True
    )
    try:
        assert peer.stdout is not None
        line = peer.stdout.readline()
        match = re.match(r"PORT (\d+)", line)
        if not match:
            raise SystemExit(f"the peer process did not start: {line!r}")
        return trio.run(run, int(match.group(1)))
    finally:
        peer.terminate()
        peer.wait()


def measure_two_processes() -> dict[str, tuple[float, float]]:
    return with_peer_process(measure)


def large_download_two_processes(label: str = "10 MiB", window: int | None = None) -> tuple[float, float]:
    """(wall MB/s, CPU-bound MB/s) of ``LARGE_SIZES[label]`` bodies, peer → client, the peer in a
    second process: the same measurement as the ``down`` rows of the full run, alone. The peer
    sends with BLIP's window, or ``window`` (what two p2psync peers agree in hello)."""

    async def run(port: int) -> tuple[float, float]:
        async with blip.connect(f"ws://127.0.0.1:{port}/bench") as conn:
            return await download(Clocks(conn, same_process=False), LARGE_SIZES[label])

    return with_peer_process(run, window)


def report(two: dict[str, tuple[float, float]], one: dict[str, tuple[float, float]] | None) -> str:
    """The ``## BLIP`` section: two processes (wall and CPU-bound), and one process if run."""
    load = os.getloadavg()[0]
    rows = [("rt", f"round trips, {ROUND_TRIP_BODY}-byte requests, {IN_FLIGHT} in flight")]
    for label in LARGE_SIZES:
        rows.append((f"up {label}", f"{label} bodies, client → peer"))
        rows.append((f"down {label}", f"{label} bodies, peer → client"))
    lines = [
        "## BLIP",
        "",
        f"Command: `{COMMAND}` (loopback TCP; compression off; {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; load average {load:.1f} at the end; "
        f"measured {time.strftime('%Y-%m-%d')}).",
        "",
        "| what | peer in a 2nd process | CPU-bound | peer in the same process | target |",
        "|---|---|---|---|---|",
    ]
    for key, name in rows:
        unit, target = ("/s", "≥ 9,000/s") if key == "rt" else (" MB/s", "≥ 100 MB/s")
        wall, cpu = two[key]
        same = f"{one[key][0]:,.0f}{unit}" if one else "—"
        lines.append(f"| {name} | {wall:,.0f}{unit} | {cpu:,.0f}{unit} | {same} | {target} |")
    lines += [
        "",
        "Wall-clock figures. *CPU-bound* divides the two-process work by the CPU time of the "
        "busier process: the rate if each process had a core to itself (other jobs on this "
        "machine lower the wall-clock figures, not this one). In the same process both ends "
        "share one core. MB = 10^6 bytes.",
        "",
    ]
    return "\n".join(lines)


def write_section(section: str) -> None:
    """Replace (or add) the ``## BLIP`` section of docs/benchmarks.md, leaving the rest."""
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else "# Benchmarks\n\n"
    pattern = re.compile(r"^## BLIP\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    BENCHMARKS_MD.parent.mkdir(parents=True, exist_ok=True)
    BENCHMARKS_MD.write_text(text.rstrip("\n") + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--two-process-only", action="store_true", help="skip the same-process run")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--window", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    if args.serve is not None:
        if args.window is not None:  # every connection of this process sends with it
            setattr(connection_module, "MAX_UNACKED_BYTES", args.window)  # noqa: B010 (the module's own copy)
        trio.run(serve_forever, args.serve)
        return
    two = measure_two_processes()
    one = None if args.two_process_only else trio.run(measure_same_process)
    section = report(two, one)
    print(section)
    if not args.no_write:
        write_section(section)
        print(f"written to {BENCHMARKS_MD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
