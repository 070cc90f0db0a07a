"""Two peers in two processes over loopback: pull, push, and large records (issue #5).

    .venv/bin/python tests/bench/bench_peer.py [--count 100000] [--size 1024]
                                               [--big-count 100] [--big-mib 10] [--cache DIR] [--tls]

``P2PSYNC_BENCH_PROFILE=DIR`` runs both workers under cProfile (``DIR/serve.prof``,
``DIR/sync-pull.prof``, ...).

Builds (once, cached under ``--cache``) a store with ``--count`` signed records of ``--size``
bytes of data, and one with ``--big-count`` records of ``--big-mib`` MiB. Then, each in a fresh
pair of processes (one serving, one syncing, both ``python -m`` this file in a worker mode):

1. pull: the syncing side pulls the small records from the server into an empty store;
2. push: the syncing side pushes them to a server with an empty store;
3. large: pull of the large records (every one by ``getAttachment``).

Prints the yardstick V (Ed25519 verifies/s on one core with ``cryptography``, measured in the
same run, before and after), messages/s (records settled per wall-clock second of the sync,
process start and store building excluded) and that rate over V, each side's CPU (user + sys)
per message in verify units (CPU s / message × V), MB/s of record data for the large run, and
each side's peak RSS (``ru_maxrss``). Targets (issue #17): pull ≥ 0.5 V, syncing side ≤ 2
verifies of CPU a message, serving side ≤ 0.5.
``--tls``: the same over ``wss://`` (TLS 1.3, the server's certificate pinned), to see what
encryption costs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from tests.bench.bench_engine import verify_rate  # noqa: E402
from tests.replication.support import Clock, seeded  # noqa: E402

ALICE = seeded("bench-alice")
SCHEMA = "https://p2psync.example/bench"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _cpu_s() -> float:
    """CPU seconds this process used so far: the figure load on the machine distorts least."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build(path: Path, count: int, size: int) -> None:
    """``count`` records by alice with ``size`` bytes each (distinct data), committed in batches."""
    if path.exists():
        return
    tmp = path.with_suffix(".building")
    for leftover in tmp.parent.glob(tmp.name + "*"):
        leftover.unlink()
    store = Store(tmp)
    dwn = Dwn(store)
    clock = Clock("2030-01-01T00:00:00.000000Z")
    started = time.perf_counter()
    batch = 1000 if size <= 65536 else 4
    for start in range(0, count, batch):
        with store.transaction():
            for i in range(start, min(count, start + batch)):
                now = clock.tick()
                head = f"record {i:09d} ".encode()
                data = (head * (size // len(head) + 1))[:size]
                write = RecordsWrite.create(signer=ALICE, data=data, schema=SCHEMA,
                                            data_format="application/octet-stream",
                                            message_timestamp=now, date_created=now)
                reply = dwn.process_message(ALICE.did, write.message, data)
                assert reply.code == 202, reply.detail
        if start and start % 10000 == 0:
            print(f"  built {start:,} records ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    store.close()
    tmp.rename(path)
    for suffix in ("-wal", "-shm"):
        side = Path(str(tmp) + suffix)
        if side.exists():
            side.unlink()


# -- worker modes -------------------------------------------------------------------------------


def serve(store_path: str, port_file: str, tls: str) -> None:
    import trio

    from p2psync.blip.tls import new_certificate
    from p2psync.peer.peer import Peer

    async def main() -> None:
        cert = new_certificate() if tls == "tls" else None
        peer = Peer(Store(store_path), ALICE, tls=cert)
        async with trio.open_nursery() as nursery:
            server = await nursery.start(peer.serve, "127.0.0.1", 0)
            scheme = "ws" if cert is None else f"wss {cert.fingerprint}"
            Path(port_file).write_text(f"{server.port} {scheme}")
            # Serve until stdin closes (the orchestrator's signal), then report.
            ready = _cpu_s()
            await trio.to_thread.run_sync(sys.stdin.read)
            nursery.cancel_scope.cancel()
        print(json.dumps({"rss_mb": round(_rss_mb(), 1), "cpu_s": _cpu_s() - ready}), flush=True)

    trio.run(main)


def sync(store_path: str, url: str, direction: str, pin: str) -> None:
    import trio

    from p2psync.peer.peer import Peer, dialer

    async def main() -> dict[str, Any]:
        peer = Peer(Store(store_path), ALICE)
        started, cpu = time.perf_counter(), _cpu_s()
        target = dialer(url, pin=pin or None)
        summary = await peer.sync(target, tenant=ALICE.did, direction=direction)  # type: ignore[arg-type]
        seconds, cpu = time.perf_counter() - started, _cpu_s() - cpu
        stats = summary.pull if direction == "pull" else summary.push
        assert stats is not None
        return {"seconds": seconds, "cpu_s": cpu, "settled": stats.revs_settled, "results": stats.results,
                "bytes": stats.bytes_received if direction == "pull" else stats.bytes_sent,
                "rss_mb": round(_rss_mb(), 1)}

    print(json.dumps(trio.run(main)), flush=True)


# -- orchestration ------------------------------------------------------------------------------


def run_pair(server_store: Path, client_store: Path, direction: str, tls: bool = False) -> dict[str, Any]:
    me = [sys.executable, __file__]
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        server = subprocess.Popen([*me, "--serve", str(server_store), str(port_file), "tls" if tls else "plain"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.05)
            port, scheme, *pin = port_file.read_text().split()
            url = f"{scheme}://127.0.0.1:{port}/_p2psync"
            out = subprocess.run([*me, "--sync", str(client_store), url, direction, "".join(pin)],
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(out.stderr)
            result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            assert server.stdin is not None
            server.stdin.close()
            tail = server.stdout.read() if server.stdout is not None else ""
            server.wait(timeout=60)
        server_report = json.loads(tail.strip().splitlines()[-1])
        result["server_rss_mb"] = server_report["rss_mb"]
        result["server_cpu_s"] = server_report["cpu_s"]
        return result


def fresh(path: Path) -> Path:
    for p in (path, Path(str(path) + "-wal"), Path(str(path) + "-shm")):
        if p.exists():
            p.unlink()
    return path


def copy_store(src: Path, dst: Path) -> Path:
    import shutil

    fresh(dst)
    shutil.copyfile(src, dst)
    return dst


def profiled(role: str, run: Any, *args: str) -> None:
    """Run one worker, under cProfile when ``P2PSYNC_BENCH_PROFILE`` names a directory (the
    stats land in ``<dir>/<role>.prof``; figures taken that way are slower, only the shares count)."""
    out = os.environ.get("P2PSYNC_BENCH_PROFILE")
    if not out:
        run(*args)
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        run(*args)
    finally:
        profile.disable()
        profile.dump_stats(os.path.join(out, f"{role}.prof"))


def _cpu_line(r: dict[str, Any], count: int, v: float) -> str:
    """CPU per message on each side in verify units (CPU seconds per message × V): what bounds
    the rate when both sides share the machine's cores, in the unit the issue's targets use."""
    return (f"  CPU per message, in verifies: syncing side {r['cpu_s'] / count * v:.2f} "
            f"({r['cpu_s'] / count * 1e6:,.0f} us), serving side {r['server_cpu_s'] / count * v:.2f} "
            f"({r['server_cpu_s'] / count * 1e6:,.0f} us)")


def _rate_lines(what: str, r: dict[str, Any], count: int, v: float, roles: tuple[str, str]) -> str:
    rate = r["settled"] / r["seconds"]
    return (f"{what}: {rate:,.0f} messages/s = {rate / v:.3f} V ({r['seconds']:.1f} s; results {r['results']})\n"
            f"{_cpu_line(r, count, v)}\n"
            f"  RSS {roles[0]} {r['rss_mb']} MB, {roles[1]} {r['server_rss_mb']} MB")


def yardstick() -> float:
    """V, Ed25519 verifies/s on one core with ``cryptography``: best of three short passes, so a
    neighbour's burst lowers it less."""
    return max(verify_rate() for _ in range(3))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        profiled("serve", serve, sys.argv[2], sys.argv[3], sys.argv[4])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--sync":
        profiled(f"sync-{sys.argv[4]}", sync, sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--big-count", type=int, default=100)
    ap.add_argument("--big-mib", type=int, default=10)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "p2psync-bench"))
    ap.add_argument("--skip", nargs="*", default=[], choices=["pull", "push", "large"])
    ap.add_argument("--tls", action="store_true", help="over wss:// (TLS 1.3) instead of ws://")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    small = cache / f"small-{args.count}x{args.size}.db"
    big = cache / f"big-{args.big_count}x{args.big_mib}MiB.db"
    print(f"building stores in {cache} (cached between runs)...", file=sys.stderr)
    build(small, args.count, args.size)
    if "large" not in args.skip:
        build(big, args.big_count, args.big_mib * 1024 * 1024)
    work = cache / "work"
    work.mkdir(exist_ok=True)
    v = yardstick()
    print(f"two processes over loopback{' with TLS' if args.tls else ''}; {os.cpu_count()} CPUs; "
          f"yardstick V = {v:,.0f} Ed25519 verifies/s on one core (cryptography), measured now")
    if "pull" not in args.skip:
        r = run_pair(copy_store(small, work / "src.db"), fresh(work / "dst.db"), "pull", args.tls)
        print(_rate_lines(f"pull {args.count:,} x {args.size} B", r, args.count, v, ("puller", "source")))
    if "push" not in args.skip:
        r = run_pair(fresh(work / "dst.db"), copy_store(small, work / "src.db"), "push", args.tls)
        print(_rate_lines(f"push {args.count:,} x {args.size} B", r, args.count, v, ("pusher", "sink")))
    if "large" not in args.skip:
        r = run_pair(copy_store(big, work / "src.db"), fresh(work / "dst.db"), "pull", args.tls)
        mb = r["bytes"] / 1e6
        print(f"pull {args.big_count} x {args.big_mib} MiB: {mb / r['seconds']:,.1f} MB/s ({r['seconds']:.1f} s, "
              f"{mb:,.0f} MB); RSS puller {r['rss_mb']} MB, source {r['server_rss_mb']} MB")
    v_end = yardstick()
    print(f"yardstick V at the end: {v_end:,.0f} verifies/s ({v_end / v - 1:+.0%} from the start; "
          f"the ratios above use the start's V)")


if __name__ == "__main__":
    main()
