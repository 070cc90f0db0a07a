"""Engine throughput: author N signed RecordsWrite with 1 KiB data, process them into a fresh
store, and run the same messages through the reference DWN's pipe for a side-by-side ratio.

    .venv/bin/python tests/bench/bench_engine.py [--count 10000] [--reference-count 1000] [--pipe-count N]

Prints messages/s for authoring and for processing (one core), and the reference's rate.
``--pipe-count`` (default: all N) also feeds the messages to ``p2psync dwn pipe`` in a child
process, as the interop runner does, and prints its rate and its CPU a message past start-up
(the child's CPU with the messages less its CPU with no input), over V.
Each processing run starts with the engine's per-message caches empty (signature checks and
timestamps are memoized by value), so every run verifies every signature. The Ed25519 verify
rate measured just before the runs tells how fast this machine is at the moment (the host is
shared; figures taken under load are lower across the board).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from p2psync.dwn import jws, timeutil  # noqa: E402
from p2psync.dwn.did import Identity  # noqa: E402
from p2psync.dwn.encoding import b64url_encode  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402


def author(n: int) -> tuple[Identity, list[tuple[dict[str, object], bytes]]]:
    alice = Identity.generate("key")
    out = []
    for _ in range(n):
        data = os.urandom(1024)
        out.append((RecordsWrite.create(signer=alice, data=data, data_format="application/octet-stream").message, data))
    return alice, out


def verify_rate(n: int = 2000, clock: Callable[[], float] = time.perf_counter) -> float:
    """Ed25519 verifications per second right now (the floor under any processing rate).

    ``clock=time.process_time``: per second of this process's CPU, the yardstick for CPU figures
    (a loaded host slows the wall-clock rate, not this one)."""
    key = Ed25519PrivateKey.generate()
    public, payload = key.public_key(), b"x" * 300
    signature = key.sign(payload)
    start = clock()
    for _ in range(n):
        public.verify(signature, payload)
    return n / (clock() - start)


def cold_caches() -> None:
    """Forget what earlier runs memoized per message, so a run verifies every signature."""
    jws._verify_entry.cache_clear()
    timeutil.validate_timestamp.cache_clear()


def reference_rate(tenant: str, messages: list[tuple[dict[str, object], bytes]]) -> float | None:
    harness = ROOT / "interop" / "harness.mjs"
    if not (ROOT / "interop" / "node_modules").exists() or not harness.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        lines = "".join(
            json.dumps({"op": "process", "tenant": tenant, "message": m, "data": b64url_encode(d)}) + "\n"
            for m, d in messages
        )
        start = time.perf_counter()
        proc = subprocess.run(["node", str(harness), "--store", tmp], input=lines, capture_output=True, text=True,
                              cwd=ROOT / "interop", timeout=1800)
        elapsed = time.perf_counter() - start
        codes = [json.loads(x)["status"]["code"] for x in proc.stdout.splitlines()]
        if codes.count(202) != len(messages):
            print(f"reference: unexpected codes {sorted(set(codes))}", file=sys.stderr)
        return len(messages) / elapsed


def _child_cpu(args: list[str], stdin: bytes) -> tuple[float, float, bytes]:
    """(CPU seconds, wall seconds, stdout) of one child process run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(args, input=stdin, capture_output=True, check=True, timeout=3600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.stdout


def pipe_run(tenant: str, messages: list[tuple[dict[str, object], bytes]]) -> tuple[float, float]:
    """(messages/s wall, CPU seconds a message past start-up) of ``p2psync dwn pipe``."""
    lines = "".join(
        json.dumps({"op": "process", "tenant": tenant, "message": m, "data": b64url_encode(d)}) + "\n"
        for m, d in messages
    ).encode()
    with tempfile.TemporaryDirectory() as tmp:
        pipe = [sys.executable, "-m", "p2psync", "dwn", "pipe", "--store"]
        idle, _, _ = _child_cpu([*pipe, f"{tmp}/idle.db"], b"")
        cpu, wall, out = _child_cpu([*pipe, f"{tmp}/bench.db"], lines)
    codes = [json.loads(x)["status"]["code"] for x in out.splitlines()]
    assert codes.count(202) == len(messages), sorted(set(codes))
    return len(messages) / wall, (cpu - idle) / len(messages)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--reference-count", type=int, default=1_000, help="messages sent through the reference")
    ap.add_argument("--batch", type=int, default=1_000, help="messages per transaction in the batched run")
    ap.add_argument("--pipe-count", type=int, default=None, help="messages sent through `p2psync dwn pipe`")
    args = ap.parse_args()

    t0 = time.perf_counter()
    alice, messages = author(args.count)
    t_author = time.perf_counter() - t0

    # The authored messages live through the run; keep the cyclic GC from rescanning them.
    gc.collect()
    gc.freeze()

    def process(batch: int) -> float:
        cold_caches()
        with tempfile.TemporaryDirectory() as tmp:
            dwn = Dwn(Store(Path(tmp) / "bench.db"))
            codes = []
            t0 = time.perf_counter()
            for i in range(0, len(messages), batch):
                # One commit per `batch` messages; each message is still atomic (a savepoint).
                with dwn.store.transaction():
                    codes += [dwn.process_message(alice.did, m, d).code for m, d in messages[i:i + batch]]
            elapsed = time.perf_counter() - t0
            dwn.close()
        assert codes.count(202) == len(codes), sorted(set(codes))
        return elapsed

    verifies = verify_rate()
    t_single = process(1)
    t_batched = process(args.batch)
    ours = args.count / t_batched
    print(f"machine:    Ed25519 verify {verifies:,.0f}/s now, load average {os.getloadavg()[0]:.1f}")
    print(f"authoring:  {args.count} RecordsWrite (1 KiB) in {t_author:.2f} s = {args.count / t_author:,.0f} msg/s")
    print(f"processing: {args.count} into a fresh store, a commit per message: {t_single:.2f} s = "
          f"{args.count / t_single:,.0f} msg/s")
    print(f"processing: {args.count} into a fresh store, a commit per {args.batch}: {t_batched:.2f} s = "
          f"{ours:,.0f} msg/s")
    pipe_count = args.count if args.pipe_count is None else min(args.pipe_count, args.count)
    if pipe_count:
        rate, cpu = pipe_run(alice.did, messages[:pipe_count])
        v_cpu = verify_rate(clock=time.process_time)
        print(f"pipe:       {pipe_count} through `p2psync dwn pipe`: {rate:,.0f} msg/s wall; {cpu * 1e6:,.0f} us CPU"
              f" a message past start-up = {cpu * v_cpu:.2f} verifies, {1 / cpu / v_cpu:.3f} V"
              f" (V by CPU time: {v_cpu:,.0f}/s)")
    ref = reference_rate(alice.did, messages[: args.reference_count]) if args.reference_count else None
    if ref is None:
        print("reference:  skipped (run `make test` once to install interop/node_modules)")
    else:
        print(f"reference:  {args.reference_count} of the same messages = {ref:,.0f} msg/s "
              f"(p2psync is {ours / ref:,.1f}x)")


if __name__ == "__main__":
    main()
