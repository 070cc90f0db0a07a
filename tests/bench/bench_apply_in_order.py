"""The engine's replicated apply of a pull in log order: CPU and SQL statements a message, one
by one and in runs.

    .venv/bin/python tests/bench/bench_apply_in_order.py [--count 3000] [--batch 200] [--rounds 3]
        [--updates 0] [--instructions | --sql-time]

``--count`` signed 1 KiB RecordsWrite (new records, each sorting after everything the tenant
holds: what a pull in log order applies) go into a fresh store ``--batch`` to a commit (a
listing, which the sink commits together), as a sink hands them to the engine: decoded from
their wire form, with the CID computed from those bytes and the data's CID from its check.
Two ways, alternating for ``--rounds`` rounds (each on messages of its own): one by one through
``Dwn.apply_replicated_message`` (``alone``), and as the store service does, in runs through
``Dwn.apply_replicated_run`` (``runs``, issue #17). No network, no closure loop.

Prints the yardstick V (Ed25519 verifies/s on one core, same run), each way's CPU µs a message
(best of the rounds, and every round) and in verifies, the rate over V, and the SQL statements
each way runs a message (counted by an apsw exec trace on a further pass, so the count does not
slow the timed ones).

``--updates K``: each record is written K times more after its initial write, in log order
(what a device following edits applies); ``--count`` counts every message. ``--instructions``:
instead of timing, the ``runs`` way's instructions a message under valgrind's callgrind (the
apply of ``--count`` messages less the apply of half as many, over the difference; authored
once, outside the count), a figure the machine's load does not move. ``--sql-time``: instead,
the ``runs`` way's SQLite time a message, statement by statement (apsw's profile hook).
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn import datacid  # noqa: E402
from p2psync.dwn.encoding import dag_cbor_encode, message_cid  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.replicated import RunEntry  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from p2psync.replication.closure import ReplicationEntry  # noqa: E402
from p2psync.state.service import _RUN_RETRY_AFTER  # noqa: E402
from tests.bench.bench_engine import verify_rate  # noqa: E402
from tests.replication.support import Clock, seeded  # noqa: E402

ALICE = seeded("bench-alice")


def author(count: int, clock: Clock, updates: int = 0) -> list[tuple[dict[str, Any], bytes, str]]:
    """``count`` messages: new records, each followed by ``updates`` later writes of it with new
    data; (message, data, CID) each."""
    out: list[tuple[dict[str, Any], bytes, str]] = []
    i = 0
    while len(out) < count:
        now = clock.tick()
        data = (f"record {i:09d} ".encode() * 80)[:1024]
        write = RecordsWrite.create(signer=ALICE, data=data, schema="https://p2psync.example/bench",
                                    data_format="application/octet-stream", message_timestamp=now, date_created=now)
        out.append((write.message, data, message_cid(write.message)))
        for u in range(min(updates, count - len(out))):
            data = (f"update {i:09d} {u:05d} ".encode() * 80)[:1024]
            write = RecordsWrite.create_from(write.message, signer=ALICE, data=data, message_timestamp=clock.tick())
            out.append((write.message, data, message_cid(write.message)))
        i += 1
    return out


def wire_bodies(count: int, clock: Clock, updates: int = 0) -> list[bytes]:
    """``count`` messages (:func:`author`) as MessageEntry bodies (CBOR, each message in its wire form)."""
    return [cbor2.dumps({"message": cbor2.loads(dag_cbor_encode(message)), "data": data, "dataSize": len(data)})
            for message, data, _ in author(count, clock, updates)]


def received(body: bytes) -> RunEntry:
    """What a sink makes of a MessageEntry: the message decoded, its CID from the bytes, the
    data's CID from checking it."""
    obj = cbor2.loads(body)
    entry = ReplicationEntry(obj["message"], obj["data"])
    assert entry.data is not None
    return RunEntry(entry.message, entry.data, entry.cid, entry.encoded, datacid.data_cid(entry.data))


def alone(dwn: Dwn, entries: list[RunEntry]) -> None:
    for e in entries:
        assert e.data is not None and e.data_cid is not None
        with datacid.known(e.data, e.data_cid):
            result = dwn.apply_replicated_message(ALICE.did, e.message, e.data, cid=e.cid, encoded=e.encoded)
        assert result.kind == "Applied", result


def in_runs(dwn: Dwn, entries: list[RunEntry]) -> None:
    """As the store service does: a run where one starts, else one alone and no new try for
    the next few (``_RUN_RETRY_AFTER``)."""
    i, next_run = 0, 0
    while i < len(entries):
        if i >= next_run:
            ran = dwn.apply_replicated_run(ALICE.did, entries[i:])
            if ran:
                assert all(r.kind == "Applied" for r in ran), ran
                i += len(ran)
                continue
            next_run = i + _RUN_RETRY_AFTER
        alone(dwn, entries[i : i + 1])
        i += 1


def apply_all(dwn: Dwn, bodies: list[bytes], batch: int, way: Callable[[Dwn, list[RunEntry]], None]) -> None:
    conn = dwn.store.conn
    for start in range(0, len(bodies), batch):
        conn.execute("BEGIN IMMEDIATE")
        way(dwn, [received(body) for body in bodies[start : start + batch]])
        conn.execute("COMMIT")


WAYS: dict[str, Callable[[Dwn, list[RunEntry]], None]] = {"alone": alone, "runs": in_runs}


def apply_only(path: str, n: int, batch: int) -> None:
    """(What callgrind runs.) Apply the first ``n`` bodies pickled at ``path`` the ``runs`` way,
    the first alone (it makes the tenant)."""
    bodies = pickle.loads(Path(path).read_bytes())[:n]
    with tempfile.TemporaryDirectory() as tmp:
        dwn = Dwn(Store(Path(tmp) / "replica.db"))
        apply_all(dwn, bodies[:1], 1, alone)
        apply_all(dwn, bodies[1:], batch, in_runs)
        dwn.close()


def instructions(count: int, batch: int, updates: int) -> None:
    from tests.bench.bench_sync_instructions import callgrind, verify_instructions

    clock = Clock("2030-01-01T00:00:00.000000Z")
    bodies = wire_bodies(1, clock) + wire_bodies(count, clock, updates)
    half = count // 2
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bodies.pickle"
        path.write_bytes(pickle.dumps(bodies))
        command = [sys.executable, str(Path(__file__).resolve()), "--apply-only", str(path)]
        small = callgrind([*command, str(1 + half), str(batch)], env=env)
        large = callgrind([*command, str(1 + count), str(batch)], env=env)
    verify = verify_instructions()
    per_message = (large - small) / (count - half)
    shape = f", each record written {updates + 1} times" if updates else ""
    print(f"yardstick: one Ed25519 verify with cryptography = {verify:,.0f} instructions")
    print(f"runs way, {half:,} and {count:,} x 1 KiB in log order{shape}, {batch} a commit: {small:,} and {large:,}"
          f" instructions; {per_message:,.0f} a message = {per_message / verify:.2f} instruction-verifies")


def sql_time(count: int, batch: int, updates: int) -> None:
    """The runs way's SQLite time by statement (apsw's profile hook), over a second ``count``
    messages after a first ``count`` filled the store. SQLite times a statement with its VFS's
    clock, in whole milliseconds on Unix: a statement's figure is how often its runs crossed a
    millisecond, unbiased over many runs but coarse for one seldom run."""
    clock = Clock("2030-01-01T00:00:00.000000Z")
    bodies = wire_bodies(1, clock) + wire_bodies(2 * count, clock, updates)
    elapsed: Counter[str] = Counter()
    runs: Counter[str] = Counter()

    def profile(sql: str, nanoseconds: int) -> None:
        statement = " ".join(sql.split())[:72]
        elapsed[statement] += nanoseconds
        runs[statement] += 1

    with tempfile.TemporaryDirectory() as tmp:
        dwn = Dwn(Store(Path(tmp) / "replica.db"))
        apply_all(dwn, bodies[: 1 + count], batch, in_runs)
        dwn.store.conn.set_profile(profile)
        started = time.process_time()
        apply_all(dwn, bodies[1 + count :], batch, in_runs)
        cpu = (time.process_time() - started) / count
        dwn.store.conn.set_profile(None)
        dwn.close()
    print(f"runs way, {count:,} x 1 KiB after {count:,}, {batch} a commit: {cpu * 1e6:,.0f} us CPU a message"
          f" (with the hook); SQLite {sum(elapsed.values()) / count / 1000:,.1f} us a message (wall clock):")
    for statement, ns in elapsed.most_common(12):
        print(f"  {ns / count / 1000:6.1f} us  {runs[statement] / count:5.2f} a message  {statement}")


def main() -> None:
    if sys.argv[1:2] == ["--apply-only"]:
        apply_only(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--updates", type=int, default=0, help="later writes of each record, after it")
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead")
    ap.add_argument("--sql-time", action="store_true", help="where SQLite's time goes, statement by statement, instead")
    args = ap.parse_args()
    if args.instructions:
        instructions(args.count, args.batch, args.updates)
        return
    if args.sql_time:
        sql_time(args.count, args.batch, args.updates)
        return
    clock = Clock("2030-01-01T00:00:00.000000Z")
    first = wire_bodies(1, clock)
    cpu: dict[str, list[float]] = {name: [] for name in WAYS}
    statements: dict[str, Counter[str]] = {name: Counter() for name in WAYS}
    traced = 300
    v = verify_rate()
    reports = []
    for _ in range(args.rounds):
        for name, way in WAYS.items():
            timed = wire_bodies(args.count, clock, args.updates)
            with tempfile.TemporaryDirectory() as tmp:
                dwn = Dwn(Store(Path(tmp) / "replica.db"))
                apply_all(dwn, first, 1, alone)  # the tenant exists, as in a pull's second listing
                started = time.process_time()
                apply_all(dwn, timed, args.batch, way)
                cpu[name].append((time.process_time() - started) / args.count)
                if not statements[name]:
                    seen = statements[name]

                    def trace(_cursor: Any, sql: str, _bindings: Any, seen: Counter[str] = seen) -> bool:
                        seen[sql.split("(")[0].strip()[:60]] += 1
                        return True

                    dwn.store.conn.exec_trace = trace
                    apply_all(dwn, wire_bodies(traced, clock, args.updates), args.batch, way)
                    dwn.store.conn.exec_trace = None
                reports.append(dwn.history.verify(ALICE.did))
                dwn.close()
    print(f"yardstick V = {v:,.0f} Ed25519 verifies/s on one core, measured now")
    shape = f" (each record written {args.updates + 1} times)" if args.updates else ""
    for name in WAYS:
        best = min(cpu[name])
        rounds = " ".join(f"{c * 1e6:,.0f}" for c in cpu[name])
        print(f"{name:>5}: {args.count} x 1 KiB in log order{shape}, {args.batch} a commit:"
              f" {best * 1e6:,.0f} us CPU a message (rounds: {rounds}) = {best * v:.2f} verifies;"
              f" {1 / best:,.0f} msg/s = {1 / best / v:.3f} V;"
              f" {sum(statements[name].values()) / traced:.1f} SQL statements a message")
    best_alone, best_runs = min(cpu["alone"]), min(cpu["runs"])
    print(f"runs over alone: {best_runs / best_alone:.3f} of the CPU a message")
    for name in WAYS:
        print(f"SQL statements a message, {name}:")
        for sql, n in statements[name].most_common():
            print(f"  {n / traced:5.2f}  {sql}")
    ok = not any(any(r.values()) for r in reports)
    print(f"store verify: {'each state is the canonical state of its archive' if ok else reports}")


if __name__ == "__main__":
    main()
