"""Two peers in two processes over loopback, and every figure of issue #17's table in one run.

    .venv/bin/python tests/bench/bench_peer.py [--count 100000] [--size 1024]
        [--big-count 100] [--big-mib 10] [--cache DIR] [--tls]
        [--reference-count 2000] [--engine-count 10000]
        [--skip pull push large blip engine reference]

``P2PSYNC_BENCH_PROFILE=DIR`` runs both sync workers under cProfile (``DIR/serve.prof``,
``DIR/sync-pull.prof``, ...). ``P2PSYNC_BENCH_SAMPLE=DIR`` samples their stacks every
millisecond of CPU instead (SIGPROF; far less distortion than cProfile) and writes the folded
stacks to ``DIR/<role>.folded`` (one ``frame;frame;... count`` line a distinct stack, the
format flame graph tools read).

Builds (once, cached under ``--cache``) a store with ``--count`` signed records of ``--size``
bytes of data, and one with ``--big-count`` records of ``--big-mib`` MiB, their set journals
folded as a node that wrote them would have (the cost is printed; it is the store's, not the
serving side's). Then:

1. pull: a syncing process pulls the small records from a serving process into an empty store;
2. push: the syncing process pushes them to a serving process with an empty store;
3. large: pull of the large records (every one by ``getAttachment``);
4. blip: the BLIP layer alone moving ``--big-mib`` MiB bodies peer → client between two processes
   (``bench_blip.large_download_two_processes``, the ``down 10 MiB`` row of ``bench_blip.py``),
   with BLIP's window and with the wider one two p2psync peers agree in hello (the ratio's yardstick);
5. engine: the first ``--engine-count`` messages of the small store through ``p2psync dwn pipe``
   (one process, one core, a commit per message);
6. reference: the first ``--reference-count`` of the same messages through the reference DWN
   (``@tbd54566975/dwn-sdk-js@0.5.2`` on Node, ``interop/harness.mjs``), the same pipe protocol.

What it prints, and how each figure is taken:

- V, the yardstick: Ed25519 verifies per CPU second on one core with ``cryptography``, best of
  three short passes, measured at the start (every ratio uses it) and again at the end (to show
  drift); the wall-clock rate is printed beside it (lower than V when the machine is busy:
  then the wall-clock figures below are pulled down as well, and the CPU figures are the ones
  to read).
- messages/s: records settled per wall-clock second of the sync (process start and store
  building excluded), and that over V; beside it the CPU-bound rate, messages over the CPU
  seconds of the busier process (the rate if each process had a core to itself).
- CPU per message per side, in verifies: CPU seconds (user + sys) of the process over the run,
  per message, times V.
- flatness (pull): the syncing side samples its settled count (= its stored count: it starts
  empty) with the wall-clock time and its own CPU time, at most every ``SAMPLE_INTERVAL``
  seconds (the last sample is taken when the last message settled, not when the sync returned);
  the time at which the count crossed a given number is interpolated linearly between the two
  samples around it. Two windows of the same size, W = count / 10 messages: the *early* window
  is centred on count / 10 stored (5,000 → 15,000 with ``--count 100000``), the *late* one ends
  at the last message (90,000 → 100,000). Each rate is W over the time the window took; the
  figure is late / early (the issue's "rate at 100,000 stored over rate at 10,000", target
  ≥ 0.9). The same ratio per CPU second of the syncing side is printed beside it (load on the
  machine moves it less), and the wall rate of each tenth of the pull, to show the curve.
- large: MB/s of record data (10^6 bytes per wall-clock second) and that over the BLIP layer's
  own MB/s for bodies of the same size measured in the same run, before the pull and again
  after it, the ratio taking their mean (target ≥ 0.6). Each is also given CPU-bound (bytes
  over the CPU seconds of the busier process), which load distorts less.
- engine and reference: each pipe's rate counts from its first reply to its last, (n - 1)
  messages over that time, so process start-up (Node loading the library, ~1 s) is left out;
  the engine's is also given per CPU second of the pipe process (its start-up CPU, measured
  with an empty input, subtracted). The reference's rate is printed beside the engine's rate
  over the same first messages and the pull's rate.
- RSS: each process's peak resident set (``VmHWM``; ``ru_maxrss`` would carry the orchestrating
  process's peak across fork and exec into the workers' figure).

A final table lists every measure with its figure, the issue's target and whether it is met.
The rows on record bodies in a mesh are measured by ``tests/bench/bench_mesh.py``, not here.
Targets are for the issue's sizes (100,000 × 1 KiB, 100 × 10 MiB); a smaller run marks the
size it used. ``--tls``: the same over ``wss://`` (TLS 1.3, the server's certificate pinned),
to see what encryption costs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from p2psync.blip.wire import MAX_UNACKED_BYTES, WIDE_UNACKED_BYTES  # noqa: E402
from p2psync.dwn.encoding import b64url_decode, b64url_encode  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.store import BLOBS_SUFFIX, Store, copy_store_files  # noqa: E402
from p2psync.state.setindex import SetIndex  # noqa: E402
from tests.bench.bench_blip import LARGE_SIZES, large_download_two_processes  # noqa: E402
from tests.replication.support import Clock, seeded  # noqa: E402

ALICE = seeded("bench-alice")
SCHEMA = "https://p2psync.example/bench"
#: Seconds between two samples of the syncing side's settled count (a few thousand samples in
#: a 100,000-message pull; each costs one list append).
SAMPLE_INTERVAL = 0.02


def _rss_mb() -> float:
    """Peak resident set of this process (``VmHWM``). Not ``ru_maxrss``: Linux keeps it across
    fork and exec, so a worker would report the orchestrator's peak (e.g. from building stores)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _cpu_s(peer: Any = None) -> float:
    """CPU seconds this process used so far: the figure load on the machine distorts least.
    With ``peer``, its signature worker process's too (P2PSYNC_VERIFY_AHEAD=process): the
    issue counts a second core's CPU in the figures."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime + float(getattr(getattr(peer, "ahead", None), "worker_cpu", 0.0))


def build(path: Path, count: int, size: int, updates: int = 0) -> None:
    """``count`` records by alice with ``size`` bytes each (distinct data), committed in batches;
    each then written again ``updates`` times with new data of that size (its log keeps the
    initial write, without data, and the latest)."""
    if path.exists():
        return
    tmp = path.with_suffix(".building")
    for leftover in tmp.parent.glob(tmp.name + "*"):
        if leftover.is_dir():  # its blob files
            import shutil

            shutil.rmtree(leftover)
        else:
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
                for u in range(updates):
                    data = (f"update {u:03d} ".encode() + data)[:size]
                    write = RecordsWrite.create_from(write.message, signer=ALICE, data=data,
                                                     message_timestamp=clock.tick())
                    reply = dwn.process_message(ALICE.did, write.message, data)
                    assert reply.code == 202, reply.detail
        if start and start % 10000 == 0:
            print(f"  built {start:,} records ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    store.close()
    fold_journal(tmp, count)
    if Path(str(tmp) + BLOBS_SUFFIX).is_dir():
        Path(str(tmp) + BLOBS_SUFFIX).rename(str(path) + BLOBS_SUFFIX)
    tmp.rename(path)
    for suffix in ("-wal", "-shm"):
        side = Path(str(tmp) + suffix)
        if side.exists():
            side.unlink()


def fold_journal(path: Path, count: int) -> None:
    """Fold the store's set journal (the anti-entropy digests' change rows, one a stored
    message) as a node that had written the messages would have, a batch after each commit
    (``committer.after_commit``). ``build`` writes through the engine alone, so without this the
    serving process's first commit folded all ``count`` rows and the serving side's CPU carried
    the store's own bookkeeping for every message it ever stored (~10 us a message measured)."""
    store = Store(path)
    try:
        cpu = time.process_time()
        index = SetIndex(store)
        index.catch_up()
        if index.folded:
            print(f"  folded the set journal: {index.folded:,} rows, "
                  f"{(time.process_time() - cpu) / max(count, 1) * 1e6:.1f} us CPU a stored message "
                  f"(the store's bookkeeping, not serving)", file=sys.stderr)
    finally:
        store.close()


# -- worker modes -------------------------------------------------------------------------------


def serve(store_path: str, port_file: str, tls: str) -> None:
    import trio

    from p2psync.blip.tls import new_certificate
    from p2psync.dwn import ed25519
    from p2psync.peer.peer import Peer

    async def main() -> None:
        cert = new_certificate() if tls == "tls" else None
        peer = Peer(Store(store_path), ALICE, tls=cert)
        async with trio.open_nursery() as nursery:
            server = await nursery.start(peer.serve, "127.0.0.1", 0)
            scheme = "ws" if cert is None else f"wss {cert.fingerprint}"
            Path(port_file).write_text(f"{server.port} {scheme}")
            # Serve until stdin closes (the orchestrator's signal), then report.
            ready, loop = _cpu_s(peer), time.thread_time()
            memo = getattr(ed25519, "AHEAD", None)  # None: code from before the signature worker
            await trio.to_thread.run_sync(sys.stdin.read)
            nursery.cancel_scope.cancel()
        print(json.dumps({"rss_mb": round(_rss_mb(), 1), "cpu_s": _cpu_s(peer) - ready,
                          # the receiving side of a push: its event loop's thread, its worker, its commits
                          "loop_cpu_s": time.thread_time() - loop, "commits": peer.committer.commits,
                          "ahead_kept": memo.kept if memo is not None else 0,
                          "ahead_taken": memo.taken if memo is not None else 0}), flush=True)

    trio.run(main)


def sync(store_path: str, url: str, direction: str, pin: str) -> None:
    import trio

    from p2psync.peer.peer import Peer, dialer
    from p2psync.replication.stats import SyncProgress

    # (seconds since the sync began, messages settled, this process's CPU seconds since then)
    samples: list[tuple[float, int, float]] = []

    from p2psync.dwn import ed25519

    latencies: list[float] = []  # seconds from each `rev` (or `revs`) arriving to its reply
    waits: list[float] = []  # seconds each wait for a durable commit took

    class Latency:
        """Records each `rev` reply's latency (the sink holds a reply until its commit)."""

        def __getattr__(self, name: str) -> Any:
            return lambda *args: None

        def rev_started(self) -> float:
            return time.perf_counter()

        def rev_finished(self, started: float, kind: str) -> None:
            latencies.append(time.perf_counter() - started)

    async def main() -> dict[str, Any]:
        peer = Peer(Store(store_path), ALICE)
        peer.metrics = Latency()
        durable = peer.committer.durable

        async def timed_durable(batch: Any) -> None:
            # How long a reply waits for the commit that holds its applies (held back longer
            # when a commit groups more `revs`).
            start = time.perf_counter()
            try:
                await durable(batch)
            finally:
                waits.append(time.perf_counter() - start)

        peer.committer.durable = timed_durable  # type: ignore[method-assign]
        started, cpu = time.perf_counter(), _cpu_s(peer)
        start_cpu = time.process_time()
        loop_cpu = time.thread_time()  # the event loop's thread alone (trio runs on this one)
        memo = getattr(ed25519, "AHEAD", None)  # None: code from before the signature worker
        ahead = (memo.kept, memo.taken) if memo is not None else (0, 0)
        last = started
        newest = (0.0, 0, 0.0)  # the latest change, so the final count is timed when it was reached

        def on_progress(progress: SyncProgress) -> None:
            nonlocal last, newest
            now = time.perf_counter()
            if progress.messages != newest[1]:
                newest = (round(now - started, 4), progress.messages, round(time.process_time() - start_cpu, 4))
            if now - last >= SAMPLE_INTERVAL:
                samples.append(newest)
                last = now

        target = dialer(url, pin=pin or None)
        summary = await peer.sync(target, tenant=ALICE.did, direction=direction,  # type: ignore[arg-type]
                                  on_progress=on_progress)
        seconds, cpu = time.perf_counter() - started, _cpu_s(peer) - cpu
        loop = time.thread_time() - loop_cpu
        stats = summary.pull if direction == "pull" else summary.push
        assert stats is not None
        if not samples or samples[-1] != newest:
            samples.append(newest)
        latencies.sort()
        waits.sort()
        sink = {"loop_cpu_s": loop, "commits": peer.committer.commits,
                "durable_ms": [round(waits[int(q * (len(waits) - 1))] * 1000, 1) for q in (0.5, 0.9, 0.99, 1.0)]
                if waits else [],
                "ahead_kept": memo.kept - ahead[0] if memo is not None else 0,
                "ahead_taken": memo.taken - ahead[1] if memo is not None else 0,
                "latency_ms": [round(latencies[int(q * (len(latencies) - 1))] * 1000, 1) for q in (0.5, 0.9, 0.99, 1.0)]
                if latencies else []}
        return {"seconds": seconds, "cpu_s": cpu, "settled": stats.revs_settled, "results": stats.results, **sink,
                "direction": direction,
                "bytes": stats.bytes_received if direction == "pull" else stats.bytes_sent,
                "rss_mb": round(_rss_mb(), 1), "samples": samples}

    print(json.dumps(trio.run(main)), flush=True)


# -- orchestration ------------------------------------------------------------------------------


def start_server(server_store: Path, port_file: Path, *, tls: bool = False,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str, str]:
    """A serving process of ``server_store`` (it serves until its stdin closes, then prints its
    report), its URL and its certificate pin ("" without TLS), once it listens."""
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(server_store), str(port_file),
                               "tls" if tls else "plain"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise SystemExit("the server did not start")
        time.sleep(0.05)
    port, scheme, *pin = port_file.read_text().split()
    return server, f"{scheme}://127.0.0.1:{port}/_p2psync", "".join(pin)


def run_pair(server_store: Path, client_store: Path, direction: str, tls: bool = False) -> dict[str, Any]:
    me = [sys.executable, __file__]
    with tempfile.TemporaryDirectory() as tmp:
        server, url, pin = start_server(server_store, Path(tmp) / "port", tls=tls)
        try:
            out = subprocess.run([*me, "--sync", str(client_store), url, direction, pin],
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
        result["server"] = server_report
        return result


def fresh(path: Path) -> Path:
    import shutil

    for p in (path, Path(str(path) + "-wal"), Path(str(path) + "-shm")):
        if p.exists():
            p.unlink()
    shutil.rmtree(str(path) + BLOBS_SUFFIX, ignore_errors=True)
    return path


def copy_store(src: Path, dst: Path) -> Path:
    fresh(dst)
    copy_store_files(src, dst)
    return dst


def profiled(role: str, run: Any, *args: str) -> None:
    """Run one worker, under cProfile when ``P2PSYNC_BENCH_PROFILE`` names a directory (the
    stats land in ``<dir>/<role>.prof``; figures taken that way are slower, only the shares count)."""
    sample_dir = os.environ.get("P2PSYNC_BENCH_SAMPLE")
    if sample_dir:
        sampled(os.path.join(sample_dir, f"{role}.folded"), run, *args)
        return
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


#: The stack sampler's period, in CPU seconds (``P2PSYNC_BENCH_SAMPLE``).
SAMPLE_CPU = 0.001


def sampled(path: str, run: Any, *args: str) -> None:
    """Run one worker with a SIGPROF stack sampler (every ``SAMPLE_CPU`` seconds of CPU) and
    write the folded stacks to ``path``. The handler runs between bytecodes on the main thread,
    so time in a C call (SQLite, a verify) is charged to the Python line that made it."""
    import collections
    import signal
    import types

    counts: collections.Counter[tuple[str, ...]] = collections.Counter()
    names: dict[types.CodeType, str] = {}

    def name(code: types.CodeType) -> str:
        found = names.get(code)
        if found is None:
            where = code.co_filename.rsplit("/p2psync/", 1)[-1].rsplit("/site-packages/", 1)[-1]
            found = names[code] = f"{where}:{code.co_qualname}"
        return found

    def on_sample(signum: int, frame: types.FrameType | None) -> None:
        stack = []
        while frame is not None:
            stack.append(name(frame.f_code))
            frame = frame.f_back
        counts[tuple(reversed(stack))] += 1

    signal.signal(signal.SIGPROF, on_sample)
    signal.setitimer(signal.ITIMER_PROF, SAMPLE_CPU, SAMPLE_CPU)
    try:
        run(*args)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        with open(path, "w") as f:
            for stack, n in counts.most_common():
                f.write(f"{';'.join(stack)} {n}\n")


def _cpu_line(r: dict[str, Any], count: int, v: float) -> str:
    """CPU per message on each side in verify units (CPU seconds per message × V): what bounds
    the rate when both sides share the machine's cores, in the unit the issue's targets use."""
    line = (f"  CPU per message, in verifies: syncing side {r['cpu_s'] / count * v:.2f} "
            f"({r['cpu_s'] / count * 1e6:,.0f} us), serving side {r['server_cpu_s'] / count * v:.2f} "
            f"({r['server_cpu_s'] / count * 1e6:,.0f} us)")
    # Each process's figure counts every thread of it (the signature worker too); the
    # receiving side's event loop thread alone is what bounds the rate while a second core is free.
    if r.get("direction", "pull") == "pull" and "loop_cpu_s" in r:
        line += (f"\n  the syncing side's event loop thread: {r['loop_cpu_s'] / count * 1e6:,.0f} us a message; "
                 f"signatures verified ahead {r['ahead_kept']:,}, taken {r['ahead_taken']:,}; "
                 f"{r['commits']:,} commits ({count / max(r['commits'], 1):.0f} messages a commit); "
                 f"`rev` reply latency p50/p90/p99/max {r['latency_ms']} ms, of which waiting for "
                 f"the commit {r['durable_ms']} ms")
    elif "loop_cpu_s" in r.get("server", {}):
        served = r["server"]
        line += (f"\n  the receiving (serving) side's event loop thread: {served['loop_cpu_s'] / count * 1e6:,.0f} us "
                 f"a message; signatures verified ahead {served['ahead_kept']:,}, taken {served['ahead_taken']:,}; "
                 f"{served['commits']:,} commits ({count / max(served['commits'], 1):.0f} messages a commit)")
    return line


def _rate_lines(what: str, r: dict[str, Any], count: int, v: float, roles: tuple[str, str]) -> str:
    rate = r["settled"] / r["seconds"]
    bound = r["settled"] / max(r["cpu_s"], r["server_cpu_s"])
    return (f"{what}: {rate:,.0f} messages/s = {rate / v:.3f} V ({r['seconds']:.1f} s; results {r['results']}; "
            f"CPU-bound {bound:,.0f}/s = {bound / v:.3f} V)\n"
            f"{_cpu_line(r, count, v)}\n"
            f"  RSS {roles[0]} {r['rss_mb']} MB, {roles[1]} {r['server_rss_mb']} MB")


def verify_rates(n: int = 2000) -> tuple[float, float]:
    """Ed25519 verifies with ``cryptography`` per CPU second and per wall-clock second."""
    key = Ed25519PrivateKey.generate()
    public, payload = key.public_key(), b"x" * 300
    signature = key.sign(payload)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        public.verify(signature, payload)
    return n / (time.process_time() - cpu), n / (time.perf_counter() - wall)


def yardstick() -> tuple[float, float, dict[int, float]]:
    """(V, the wall-clock rate, V of each core): V is Ed25519 verifies per CPU second on one
    core with ``cryptography``, best of three short passes on each core this process may run
    on (pinned there in turn), averaged over the cores. Per CPU second, because a busy
    neighbour takes wall-clock time from the loop and would make every ratio look better than
    it is; on a quiet machine the two agree. Each core, because the bench's two processes use
    both, and the cores of a virtual machine need not run at one speed: on 2026-11-25 one
    measured 8,900-9,700 while the other measured 6,500-7,300, and V taken on whichever core the
    scheduler picked moved every ratio by a third between two runs."""
    cores = sorted(os.sched_getaffinity(0))
    per_core: dict[int, tuple[float, float]] = {}
    try:
        for core in cores:
            os.sched_setaffinity(0, {core})
            passes = [verify_rates() for _ in range(3)]
            per_core[core] = (max(p[0] for p in passes), max(p[1] for p in passes))
    finally:
        os.sched_setaffinity(0, cores)
    v = sum(cpu for cpu, _ in per_core.values()) / len(per_core)
    wall = sum(w for _, w in per_core.values()) / len(per_core)
    return v, wall, {core: cpu for core, (cpu, _) in per_core.items()}


def describe_cores(per_core: dict[int, float]) -> str:
    """The cores' own V, and a warning when they differ by more than 10%."""
    text = ", ".join(f"core {core} {v:,.0f}" for core, v in per_core.items())
    spread = max(per_core.values()) / min(per_core.values()) - 1
    if spread > 0.10:
        text += f"; the cores differ by {spread:.0%}: the ratios are that uncertain"
    return text


# -- flatness ---------------------------------------------------------------------------------


def crossing(samples: list[tuple[float, int, float]], n: float) -> tuple[float, float] | None:
    """(wall, CPU) seconds when the settled count reached ``n``, each interpolated linearly
    between the samples around it."""
    before = (0.0, 0, 0.0)
    for sample in samples:
        if sample[1] >= n:
            if sample[1] == before[1]:
                return sample[0], sample[2]
            f = (n - before[1]) / (sample[1] - before[1])
            return before[0] + (sample[0] - before[0]) * f, before[2] + (sample[2] - before[2]) * f
        before = sample
    return None


def window_rates(samples: list[tuple[float, int, float]], lo: int, hi: int) -> tuple[float, float] | None:
    """Messages per wall-clock second and per CPU second of the syncing side from ``lo`` to
    ``hi`` settled."""
    start, end = crossing(samples, lo), crossing(samples, hi)
    if start is None or end is None or end[0] <= start[0] or end[1] <= start[1]:
        return None
    return (hi - lo) / (end[0] - start[0]), (hi - lo) / (end[1] - start[1])


@dataclass
class Flatness:
    window: int
    early: tuple[int, int]
    late: tuple[int, int]
    early_rate: float
    late_rate: float
    early_cpu_rate: float  # messages per CPU second of the syncing side
    late_cpu_rate: float
    tenths: list[float]  # wall rate in each tenth of the pull, for the shape of the curve

    @property
    def ratio(self) -> float:
        return self.late_rate / self.early_rate

    @property
    def cpu_ratio(self) -> float:
        return self.late_cpu_rate / self.early_cpu_rate


def flatness(samples: list[tuple[float, int, float]], count: int) -> Flatness | None:
    """The rates in two windows of count / 10 messages: centred on count / 10 stored, and
    ending at the last message (see the module docstring)."""
    window = count // 10
    if window < 10:
        return None
    early = (count // 10 - window // 2, count // 10 - window // 2 + window)
    late = (count - window, count)
    first, last = window_rates(samples, *early), window_rates(samples, *late)
    if first is None or last is None:
        return None
    tenths = [window_rates(samples, i * window, (i + 1) * window) for i in range(10)]
    return Flatness(window, early, late, first[0], last[0], first[1], last[1],
                    [t[0] if t else 0.0 for t in tenths])


# -- the engine and the reference through their pipes -----------------------------------------


def first_messages(store_path: Path, tenant: str, n: int) -> list[tuple[dict[str, Any], bytes | None]]:
    """The store's first ``n`` messages in log order, as they travel: ``encodedData`` taken out
    as the data (or the data read from the data table)."""
    store = Store(store_path)
    try:
        out = []
        for _, cid in store.events.read(tenant, limit=n):
            stored = store.messages.get(tenant, cid)
            assert stored is not None
            message = {k: v for k, v in stored.items() if k != "encodedData"}
            data: bytes | None = None
            if isinstance(stored.get("encodedData"), str):
                data = b64url_decode(stored["encodedData"])
            elif "dataCid" in message.get("descriptor", {}):
                data = store.data.get(tenant, message["recordId"], message["descriptor"]["dataCid"])
            out.append((message, data))
        return out
    finally:
        store.close()


@dataclass
class PipeRun:
    reply_times: list[float]  # perf_counter when each reply line arrived
    codes: list[int]
    cpu_s: float  # the pipe process's CPU seconds, its start-up's subtracted

    def rate(self, n: int | None = None) -> float:
        """Messages/s over the first ``n`` replies, first reply to last ((n - 1) messages)."""
        times = self.reply_times[: n or len(self.reply_times)]
        return (len(times) - 1) / (times[-1] - times[0])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _pipe_once(command: list[str], cwd: Path, lines: list[str]) -> tuple[list[float], list[int], float]:
    cpu = _children_cpu()
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(command, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=errors, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        stdin = proc.stdin

        def feed() -> None:
            for line in lines:
                stdin.write(line)
            stdin.close()

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        times, codes = [], []
        for reply in proc.stdout:
            times.append(time.perf_counter())
            codes.append(json.loads(reply)["status"]["code"])
        writer.join()
        if proc.wait() != 0 or len(codes) != len(lines):
            errors.seek(0)
            raise SystemExit(f"{command[:2]} failed ({len(codes)} replies of {len(lines)}): {errors.read()[-2000:]}")
    return times, codes, _children_cpu() - cpu


def run_pipe(command: list[str], cwd: Path, tenant: str,
             messages: list[tuple[dict[str, Any], bytes | None]]) -> PipeRun:
    """``messages`` through a fresh pipe process (protocol/interop-pipe.md), then the same with
    no input, to take its start-up CPU out."""
    lines = [json.dumps({"op": "process", "tenant": tenant, "message": m,
                         **({} if d is None else {"data": b64url_encode(d)})}) + "\n" for m, d in messages]
    with tempfile.TemporaryDirectory() as tmp:
        times, codes, cpu = _pipe_once([*command, str(Path(tmp) / "run")], cwd, lines)
    with tempfile.TemporaryDirectory() as tmp:
        _, _, startup = _pipe_once([*command, str(Path(tmp) / "idle")], cwd, [])
    return PipeRun(times, codes, cpu - startup)


def engine_command() -> list[str]:
    return [sys.executable, "-m", "p2psync", "dwn", "pipe", "--store"]


def reference_command() -> list[str] | None:
    """``node interop/harness.mjs --store``, when interop/ is installed (``npm ci`` there)."""
    harness = ROOT / "interop" / "harness.mjs"
    if not (ROOT / "interop" / "node_modules").exists() or not harness.exists():
        return None
    return ["node", str(harness), "--store"]


# -- the summary --------------------------------------------------------------------------------


@dataclass
class Row:
    measure: str
    figure: str
    target: str
    met: bool | None  # None: no target, or not measured in this run
    full_size: bool = True  # measured at the size


def summary_table(rows: list[Row]) -> str:
    def verdict(row: Row) -> str:
        if row.met is None:
            return "—"
        return ("met" if row.met else "NOT met") + ("" if row.full_size else " *")

    header = ("measure", "figure", "target", "met")
    cells = [header] + [(r.measure, r.figure, r.target, verdict(r)) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip() for cell in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


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
    ap.add_argument("--reference-count", type=int, default=2_000,
                    help="first messages of the small store sent through the reference DWN")
    ap.add_argument("--engine-count", type=int, default=10_000,
                    help="first messages of the small store sent through `p2psync dwn pipe`")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "p2psync-bench"))
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["pull", "push", "large", "blip", "engine", "reference"])
    ap.add_argument("--tls", action="store_true", help="over wss:// (TLS 1.3) instead of ws://")
    args = ap.parse_args()
    full = args.count == 100_000 and args.size == 1024  # the sizes
    big_full = args.big_count == 100 and args.big_mib == 10
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    small = cache / f"small-{args.count}x{args.size}.db"
    big = cache / f"big-{args.big_count}x{args.big_mib}MiB.db"
    print(f"building stores in {cache} (cached between runs)...", file=sys.stderr)
    build(small, args.count, args.size)
    fold_journal(small, args.count)  # a store cached by an older bench may not be folded yet
    if "large" not in args.skip:
        build(big, args.big_count, args.big_mib * 1024 * 1024)
        fold_journal(big, args.big_count)
    work = cache / "work"
    work.mkdir(exist_ok=True)
    v, v_wall, per_core = yardstick()
    print(f"two processes over loopback{' with TLS' if args.tls else ''}; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}; yardstick V = {v:,.0f} Ed25519 verifies per CPU second on "
          f"one core (cryptography), measured now ({v_wall:,.0f} per wall-clock second; {describe_cores(per_core)})")
    size = f"{args.count:,} x {args.size} B"
    rows: list[Row] = []
    pull_rate = None
    if "pull" not in args.skip:
        r = run_pair(copy_store(small, work / "src.db"), fresh(work / "dst.db"), "pull", args.tls)
        pull_rate = r["settled"] / r["seconds"]
        print(_rate_lines(f"pull {size}", r, args.count, v, ("puller", "source")))
        sink_cpu, source_cpu = r["cpu_s"] / args.count * v, r["server_cpu_s"] / args.count * v
        flat = flatness(r["samples"], args.count)
        if flat is None:
            print("  flatness: too few messages or samples to measure")
        else:
            print(f"  flatness: {flat.early_rate:,.0f} messages/s while stored went {flat.early[0]:,} -> "
                  f"{flat.early[1]:,}, {flat.late_rate:,.0f}/s for {flat.late[0]:,} -> {flat.late[1]:,} "
                  f"(windows of {flat.window:,}): late / early = {flat.ratio:.2f}; per CPU second of the "
                  f"syncing side {flat.early_cpu_rate:,.0f} and {flat.late_cpu_rate:,.0f}: {flat.cpu_ratio:.2f}")
            print(f"  messages/s in each tenth of the pull: {' '.join(f'{t:,.0f}' for t in flat.tenths)}")
        mark = "" if full else f" (at {args.count:,})"
        rows += [
            Row(f"pull {size}, two processes", f"{pull_rate / v:.3f} V ({pull_rate:,.0f}/s)", ">= 0.5 V",
                pull_rate / v >= 0.5, full),
            Row(f"syncing side CPU per message (pull){mark}", f"{sink_cpu:.2f} verifies", "<= 2 verifies",
                sink_cpu <= 2, full),
            Row(f"serving side CPU per message (pull){mark}", f"{source_cpu:.2f} verifies", "<= 0.5 verify",
                source_cpu <= 0.5, full),
            Row(f"rate at {flat.late[1]:,} stored over rate at {args.count // 10:,}" if flat else "flatness",
                f"{flat.ratio:.2f} (CPU {flat.cpu_ratio:.2f})" if flat else "not measured", ">= 0.9",
                flat.ratio >= 0.9 if flat else None, full),
            Row(f"RSS per side during the pull{mark}", f"{r['rss_mb']:.0f} / {r['server_rss_mb']:.0f} MB",
                "< 150 MB", max(r["rss_mb"], r["server_rss_mb"]) < 150, full),
        ]
    if "push" not in args.skip:
        r = run_pair(fresh(work / "dst.db"), copy_store(small, work / "src.db"), "push", args.tls)
        print(_rate_lines(f"push {size}", r, args.count, v, ("pusher", "sink")))
    blip_mbs = None
    if "blip" not in args.skip:
        label = f"{args.big_mib} MiB"
        if label not in LARGE_SIZES:
            print(f"blip: bench_blip measures {', '.join(LARGE_SIZES)} bodies, not {label}; skipped")
        else:
            narrow = large_download_two_processes(label)
            print(f"BLIP layer alone, {label} bodies peer -> client, two processes, BLIP's window "
                  f"({MAX_UNACKED_BYTES:,} bytes): {narrow[0]:,.1f} MB/s ({narrow[1]:,.0f} MB/s CPU-bound)")
            # The ratio's yardstick: BLIP with the window two p2psync peers agree in hello.
            blip_mbs = large_download_two_processes(label, WIDE_UNACKED_BYTES)
            print(f"BLIP layer alone, the same with the peers' window ({WIDE_UNACKED_BYTES:,} bytes): "
                  f"{blip_mbs[0]:,.1f} MB/s ({blip_mbs[1]:,.0f} MB/s CPU-bound)")
    if "large" not in args.skip:
        r = run_pair(copy_store(big, work / "src.db"), fresh(work / "dst.db"), "pull", args.tls)
        mb = r["bytes"] / 1e6
        wall, bound = mb / r["seconds"], mb / max(r["cpu_s"], r["server_cpu_s"])
        print(f"pull {args.big_count} x {args.big_mib} MiB: {wall:,.1f} MB/s ({r['seconds']:.1f} s, {mb:,.0f} MB; "
              f"{bound:,.0f} MB/s CPU-bound); RSS puller {r['rss_mb']} MB, source {r['server_rss_mb']} MB")
        print(f"  CPU: puller {r['cpu_s']:.1f} s, source {r['server_cpu_s']:.1f} s")
        if blip_mbs is not None:
            # The yardstick again, after the pull: BLIP alone moved by up to 30% within half an
            # hour on one machine (364-502 MB/s), so the ratio takes the mean of the two.
            after = large_download_two_processes(f"{args.big_mib} MiB", WIDE_UNACKED_BYTES)
            print(f"  BLIP layer alone again, after the pull: {after[0]:,.1f} MB/s ({after[1]:,.0f} MB/s "
                  f"CPU-bound); the ratio uses the mean of both: {(blip_mbs[0] + after[0]) / 2:,.1f} MB/s")
            blip_mbs = ((blip_mbs[0] + after[0]) / 2, (blip_mbs[1] + after[1]) / 2)
            print(f"  over the BLIP layer's own: {wall / blip_mbs[0]:.2f} (CPU-bound {bound / blip_mbs[1]:.2f})")
            rows.append(Row(f"pull {args.big_count} x {args.big_mib} MiB, MB/s over BLIP's own",
                            f"{wall / blip_mbs[0]:.2f} ({wall:,.0f} / {blip_mbs[0]:,.0f} MB/s)", ">= 0.6",
                            wall / blip_mbs[0] >= 0.6, big_full))
    engine = None
    if "engine" not in args.skip:
        n = min(args.engine_count, args.count)
        engine = run_pipe(engine_command(), ROOT, ALICE.did, first_messages(small, ALICE.did, n))
        ok = engine.codes.count(202)
        rate = engine.rate()
        per_cpu = f"{n / engine.cpu_s:,.0f} per CPU second = {n / engine.cpu_s / v:.3f} V" if engine.cpu_s > 0 else ""
        print(f"engine alone, `p2psync dwn pipe`, {n:,} signed writes, one process: {rate:,.0f} messages/s = "
              f"{rate / v:.3f} V ({per_cpu}; {ok:,} of {n:,} accepted)")
        rows.append(Row(f"engine alone, `p2psync dwn pipe`, {n:,} signed writes", f"{rate / v:.3f} V ({rate:,.0f}/s)",
                        ">= 0.35 V", rate / v >= 0.35 and ok == n, n == 10_000))
    if "reference" not in args.skip:
        command = reference_command()
        n = min(args.reference_count, args.count)
        if command is None:
            print("reference: skipped (run `npm ci` in interop/ once to install the reference DWN)")
        else:
            ref = run_pipe(command, ROOT / "interop", ALICE.did, first_messages(small, ALICE.did, n))
            ok, rate = ref.codes.count(202), ref.rate()
            beside = []
            if engine is not None and len(engine.codes) >= n:
                ours = engine.rate(n)
                beside.append(f"p2psync's pipe on the same {n:,}: {ours:,.0f}/s = {ours / v:.3f} V, "
                              f"{ours / rate:,.1f}x")
            if pull_rate is not None:
                beside.append(f"the pull above: {pull_rate:,.0f}/s, {pull_rate / rate:,.1f}x")
            print(f"reference DWN (dwn-sdk-js 0.5.2, Node), the first {n:,} messages of this store: "
                  f"{rate:,.0f} messages/s = {rate / v:.4f} V ({ok:,} of {n:,} accepted)"
                  + "".join(f"\n  {b}" for b in beside))
            rows.append(Row(f"reference DWN, same first {n:,} messages (for comparison)",
                            f"{rate / v:.4f} V ({rate:,.0f}/s)", "—", None))
    v_end, v_end_wall, per_core_end = yardstick()
    print(f"yardstick V at the end: {v_end:,.0f} verifies per CPU second ({v_end / v - 1:+.0%} from the start; "
          f"the ratios above use the start's V), {v_end_wall:,.0f} per wall-clock second "
          f"({describe_cores(per_core_end)}); load average {os.getloadavg()[0]:.1f}")
    rows += [Row("record bodies sent per message, 4-node mesh", "—", "<= 3.3", None),
             Row("bodies received per message, returning device", "—", "1", None)]
    print("\nissue #17, quiet machine targets (* measured below the issue's size: indicative only; "
          "the mesh rows are tests/bench/bench_mesh.py's)")
    print(summary_table(rows))


if __name__ == "__main__":
    main()
