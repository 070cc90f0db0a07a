"""Signatures verified on a second core while the engine applies (issue #17): A/B in one process.

    .venv/bin/python tests/bench/bench_verify_ahead.py [--count 6400] [--batch 64]

``--count`` signed 1 KiB RecordsWrite (new records in log order, what a pull applies) go through
``Dwn.apply_replicated_message`` into a fresh store, a commit per ``--batch``, as the sink's
``ApplyBatch`` does. Batches alternate: one handed to a :class:`SignatureWorker` just before
its applies start (what the sink does when a `revs` arrives), the next applied alone. Each
mode's batches are timed apart, so load on the machine falls on both alike. Prints, per
message and per mode: the applying thread's CPU (what bounds the rate while a second core is
free), the process's CPU (every thread: the worker's verifies included), the wall time, and
how many signatures the engine found verified ahead.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn import ed25519  # noqa: E402
from p2psync.dwn.ahead import SignatureWorker  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from tests.bench.bench_apply_in_order import ALICE, author  # noqa: E402
from tests.bench.bench_engine import verify_rate  # noqa: E402
from tests.replication.support import Clock  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=6400)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    messages = author(args.count, Clock("2030-01-01T00:00:00.000000Z"))
    worker = SignatureWorker()
    # mode -> [applying thread CPU, process CPU, wall, messages, taken]
    totals: dict[str, list[float]] = {"ahead": [0.0, 0.0, 0.0, 0, 0], "inline": [0.0, 0.0, 0.0, 0, 0]}
    with tempfile.TemporaryDirectory() as tmp:
        dwn = Dwn(Store(Path(tmp) / "replica.db"))
        v = verify_rate()
        conn = dwn.store.conn
        for n, start in enumerate(range(0, len(messages), args.batch)):
            batch = messages[start:start + args.batch]
            mode = "ahead" if n % 2 else "inline"
            worker.wait_idle()
            taken = ed25519.AHEAD.taken
            t, p, w = time.thread_time(), time.process_time(), time.perf_counter()
            if mode == "ahead":
                worker.submit([m for m, _, _ in batch])
            conn.execute("BEGIN IMMEDIATE")
            for message, data, cid in batch:
                result = dwn.apply_replicated_message(ALICE.did, message, data, cid=cid)
                assert result.kind == "Applied", result
            conn.execute("COMMIT")
            if mode == "ahead":
                worker.wait_idle()  # its CPU counts to this batch
            row = totals[mode]
            row[0] += time.thread_time() - t
            row[1] += time.process_time() - p
            row[2] += time.perf_counter() - w
            row[3] += len(batch)
            row[4] += ed25519.AHEAD.taken - taken
        dwn.close()
    print(f"yardstick V = {v:,.0f} Ed25519 verifies/s on one core, measured now")
    print(f"{args.count} x 1 KiB in log order, {args.batch} a commit, batches alternating:")
    for mode, (thread, process, wall, count, ahead) in totals.items():
        print(f"  {mode:6}: applying thread {thread / count * 1e6:5.0f} us CPU a message, process "
              f"{process / count * 1e6:5.0f} us, wall {wall / count * 1e6:5.0f} us; "
              f"verified ahead and taken {ahead / count:.0%}")
    a, b = totals["ahead"], totals["inline"]
    print(f"  ahead / inline: applying thread {a[0] / a[3] / (b[0] / b[3]):.3f}, process "
          f"{a[1] / a[3] / (b[1] / b[3]):.3f}, wall {a[2] / a[3] / (b[2] / b[3]):.3f}")


if __name__ == "__main__":
    main()
