"""Acceptance of issue #14: two nodes whose stores hold N messages and differ in D converge
through ``p2psync sync --repair``, moving only the missing messages.

    .venv/bin/python tests/bench/bench_antientropy.py [--n 100000] [--d 100] [--cache DIR]

1. Builds one store of ``--n`` signed RecordsWrites of one tenant (the engine verifies and
   stores each, 1,000 to a transaction; ``--cache DIR`` keeps it for the next run), folds its
   set journal as a running node would have, and copies the closed SQLite file twice.
2. Adds ``d // 2`` distinct writes to the first copy (node A) and ``d - d // 2`` to the second
   (node B).
3. Serves A with a real ``p2psync serve --port 0`` process and runs, as another process,
   ``p2psync sync URL --repair --both --json`` from B; then ``p2psync diff URL --json`` and
   ``p2psync store digest`` on both homes.

Prints what moved each way (which must be exactly the messages each side lacked), the round
trips and bytes of the reconciliation, the seconds, and whether the digests are then equal;
the last line is one summary::

    antientropy: n=N d=D fetched=F taken=T round_trips=R bytes=B seconds=S moved_only_missing=yes|no equal=yes|no

``seconds`` is the summary's (connection to close, both sides' sketches built from their
stores included); the sync process's wall time (Python start-up included) is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.cli.home import Home  # noqa: E402
from p2psync.dwn.did import Identity  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.store import Store, copy_store_files  # noqa: E402
from p2psync.replication.scope import SyncScope  # noqa: E402
from p2psync.state.setindex import SetIndex  # noqa: E402
from p2psync.state.sketches import SetSketches  # noqa: E402
from tests.peer.support import NOTE  # noqa: E402
from tests.replication.support import Clock, seeded  # noqa: E402

ALICE = seeded("bench-antientropy")
#: Messages a transaction while building (the engine's batched rate; bench_engine.py).
BATCH = 1_000
#: The extra writes start after any base's timestamps (one a second from 2030-05-01).
EXTRA_START = "2040-01-01T00:00:00.000000Z"
SQLITE_SUFFIXES = ("", "-wal", "-shm")
#: Bounded waits on the child processes (not timings).
SERVE_DEADLINE = 120.0
SYNC_DEADLINE = 3_600.0


def write(dwn: Dwn, author: Identity, count: int, clock: Clock, prefix: str) -> None:
    """``count`` signed notes by ``author`` in its own DWN, ``BATCH`` a transaction."""
    for start in range(0, count, BATCH):
        with dwn.store.transaction():
            for i in range(start, min(start + BATCH, count)):
                now = clock.tick()
                data = f"{prefix} {i}".encode()
                note = RecordsWrite.create(signer=author, data=data, schema=NOTE, data_format="text/plain",
                                           message_timestamp=now, date_created=now)
                reply = dwn.process_message(author.did, note.message, data)
                assert reply.code == 202, reply.detail


def copy_store(source: Path, target: Path) -> None:
    """A closed store's file (and any -wal/-shm left, and its blob files) under another name."""
    copy_store_files(source, target)


def base_store(n: int, root: Path, cache: Path | None) -> Path:
    """The store of ``n`` notes: from the cache when it holds one, else built (and cached)."""
    name = f"antientropy-base-{n}.db"
    if cache is not None and (cache / name).exists():
        print(f"base: {n:,} messages from {cache / name}")
        return cache / name
    path = root / name
    store = Store(path)
    started = time.monotonic()
    write(Dwn(store), ALICE, n, Clock(), "note")
    built = time.monotonic() - started
    started = time.monotonic()
    SetIndex(store).catch_up()  # what a running node has done after each commit
    folded = time.monotonic() - started
    store.close()
    print(f"base: built {n:,} signed messages in {built:.1f} s ({n / built:,.0f} msg/s), "
          f"set journal folded in {folded:.1f} s")
    if cache is None:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f"{name}.partial"
    copy_store(path, partial)
    for suffix in SQLITE_SUFFIXES:
        if Path(f"{partial}{suffix}").exists():
            os.replace(f"{partial}{suffix}", f"{cache / name}{suffix}")
    return cache / name


def node_home(root: Path, name: str, base: Path) -> Path:
    """A data directory holding ALICE's identity and a copy of the base store."""
    home = root / name
    Home(home).init(ALICE)
    copy_store(base, Home(home).store_path)
    return home


def add_extras(home: Path, count: int, prefix: str) -> set[str]:
    """``count`` notes only this node holds; their CIDs."""
    store = Store(Home(home).store_path)
    before = set(store.messages.cids(ALICE.did))
    write(Dwn(store), ALICE, count, Clock(EXTRA_START), prefix)
    added = set(store.messages.cids(ALICE.did)) - before
    store.close()
    assert len(added) == count
    return added


def sketch_seconds(home: Path) -> float:
    """Seconds to build the tenant's sketch from a store: what each new p2psync process (the
    syncing one, the served one) spends at its first reconcile, inside the summary's seconds."""
    store = Store(Home(home).store_path)
    sketches = SetSketches(store)
    sketches.index.catch_up()
    started = time.monotonic()
    sketches.view(ALICE.did, SyncScope.global_scope())
    seconds = time.monotonic() - started
    store.close()
    return seconds


def p2psync(home: Path, *argv: str) -> list[str]:
    return [sys.executable, "-m", "p2psync", "--home", str(home), *argv]


def run_cli(home: Path, *argv: str, ok: tuple[int, ...] = (0,)) -> tuple[Any, float]:
    """Run one p2psync command; its JSON output and wall seconds."""
    started = time.monotonic()
    proc = subprocess.run(p2psync(home, *argv), capture_output=True, text=True, timeout=SYNC_DEADLINE,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.monotonic() - started
    if proc.returncode not in ok:
        raise SystemExit(f"p2psync {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return json.loads(proc.stdout), seconds


class Served:
    """``p2psync serve --port 0`` on a home, until :meth:`stop`."""

    def __init__(self, home: Path) -> None:
        self.proc = subprocess.Popen(p2psync(home, "serve", "--port", "0"), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # flushed at once by serve; a dead child gives ""
        match = re.fullmatch(r"serving (ws://\S+)\n", line)
        if match is None:
            self.stop()
            raise SystemExit(f"p2psync serve did not start: {line!r}")
        self.url = match[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=SERVE_DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run(n: int, d: int, root: Path, cache: Path | None) -> bool:
    base = base_store(n, root, cache)
    started = time.monotonic()
    a, b = node_home(root, "a", base), node_home(root, "b", base)
    only_a, only_b = d // 2, d - d // 2
    a_new = add_extras(a, only_a, "a only")
    b_new = add_extras(b, only_b, "b only")
    print(f"nodes: two copies of the base, {only_a} writes only on A and {only_b} only on B, "
          f"in {time.monotonic() - started:.1f} s")

    served = Served(a)
    try:
        summary, wall = run_cli(b, "sync", served.url, "--repair", "--both", "--json", "--no-progress", ok=(0, 3))
        after, diff_wall = run_cli(b, "diff", served.url, "--json", ok=(0, 3))
    finally:
        served.stop()
    digest_a, _ = run_cli(a, "store", "digest")
    digest_b, _ = run_cli(b, "store", "digest")

    fetched = summary.get("fetched", {})
    counts: dict[str, int] = fetched.get("counts", {})
    pushed: dict[str, int] = summary.get("pushed", {})
    n_fetched, n_taken = sum(counts.values()), sum(pushed.values())
    named_right = ({x["cid"] for x in summary["remoteOnly"]} == a_new
                   and {x["cid"] for x in summary["localOnly"]} == b_new)
    only_missing = (counts == ({"applied": only_a} if only_a else {}) and fetched.get("stored", 0) == only_a
                    and pushed == ({"Applied": only_b} if only_b else {}) and named_right)
    digests_equal = digest_a == digest_b
    held = digest_a.get(ALICE.did, {}).get("messages")

    print(f"sync --repair: you lacked {summary['youLack']}, they lacked {summary['theyLack']} "
          f"of {summary['localCount']:,} here / {summary['remoteCount']:,} there (estimate {summary.get('estimate')})")
    print(f"  fetched {n_fetched} {counts}, stored {fetched.get('stored')}, "
          f"{fetched.get('bytesReceived', 0):,} bytes received")
    print(f"  the peer took {n_taken} {pushed}")
    print(f"  reconciliation: {summary['roundTrips']} round trips, {summary['bytes']:,} bytes, "
          f"{summary['attempts']} check(s); {summary['seconds']:.2f} s (sync process wall {wall:.2f} s)")
    print(f"  moving only the missing messages: {'yes' if only_missing else 'NO'} "
          f"({n_fetched} fetched, {n_taken} taken; {only_a} and {only_b} were missing)")
    print(f"  equal afterwards: {'yes' if summary['equal'] else 'NO'}"
          + (f" ({summary['unresolved']})" if "unresolved" in summary else ""))
    print(f"diff afterwards: {'equal' if after['equal'] else 'DIFFERENT'}, {after['roundTrips']} round trip(s), "
          f"{after['bytes']} bytes, {after['seconds']:.2f} s (process wall {diff_wall:.2f} s)")
    print(f"store digest: {'equal' if digests_equal else 'DIFFERENT'} ({held:,} messages each)"
          if held is not None else "store digest: no messages")
    print(f"sketch: {sketch_seconds(b):.2f} s to build one side's from its store (a new process does it at its "
          "first reconcile, both sides here: inside the seconds above; a running node keeps it up to date)")
    ok = only_missing and bool(summary["equal"]) and bool(after["equal"]) and digests_equal
    yes_no = {True: "yes", False: "no"}
    print(f"antientropy: n={n} d={d} fetched={n_fetched} taken={n_taken} round_trips={summary['roundTrips']} "
          f"bytes={summary['bytes']} seconds={summary['seconds']:.3f} moved_only_missing={yes_no[only_missing]} "
          f"equal={yes_no[digests_equal and bool(after['equal'])]}", flush=True)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="messages both stores share")
    parser.add_argument("--d", type=int, default=100, help="messages they differ by (half on each side)")
    parser.add_argument("--cache", type=Path, help="keep the built base store here and reuse it")
    args = parser.parse_args()
    if args.n < 0 or args.d < 0:
        parser.error("--n and --d are not negative")
    with tempfile.TemporaryDirectory() as tmp:
        ok = run(args.n, args.d, Path(tmp), args.cache)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
