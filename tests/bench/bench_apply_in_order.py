"""The engine's replicated apply of a pull in log order: CPU and SQL statements a message.

    .venv/bin/python tests/bench/bench_apply_in_order.py [--count 3000] [--batch 64]

``--count`` signed 1 KiB RecordsWrite (new records, each sorting after everything the tenant
holds: what a pull in log order applies) go through ``Dwn.apply_replicated_message`` into a
fresh store, ``--batch`` to a commit (the group committer's batch). No network, no closure
loop. Prints the yardstick V (Ed25519 verifies/s on one core, same run), CPU µs a message and
in verifies, the rate over V, and the SQL statements each apply runs (counted by an apsw
exec trace on a second pass, so the count does not slow the timed one).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.encoding import message_cid  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from tests.bench.bench_engine import verify_rate  # noqa: E402
from tests.replication.support import Clock, seeded  # noqa: E402

ALICE = seeded("bench-alice")


def author(count: int, clock: Clock) -> list[tuple[dict[str, Any], bytes, str]]:
    out = []
    for i in range(count):
        now = clock.tick()
        data = (f"record {i:09d} ".encode() * 80)[:1024]
        write = RecordsWrite.create(signer=ALICE, data=data, schema="https://p2psync.example/bench",
                                    data_format="application/octet-stream", message_timestamp=now, date_created=now)
        out.append((write.message, data, message_cid(write.message)))
    return out


def apply_all(dwn: Dwn, messages: list[tuple[dict[str, Any], bytes, str]], batch: int) -> None:
    conn = dwn.store.conn
    conn.execute("BEGIN IMMEDIATE")
    for i, (message, data, cid) in enumerate(messages):
        result = dwn.apply_replicated_message(ALICE.did, message, data, cid=cid)
        assert result.kind == "Applied", result
        if i % batch == batch - 1:
            conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")
    conn.execute("COMMIT")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    clock = Clock("2030-01-01T00:00:00.000000Z")
    timed, traced = author(args.count, clock), author(300, clock)
    with tempfile.TemporaryDirectory() as tmp:
        dwn = Dwn(Store(Path(tmp) / "replica.db"))
        v = verify_rate()
        started = time.process_time()
        apply_all(dwn, timed, args.batch)
        cpu = (time.process_time() - started) / args.count
        statements: Counter[str] = Counter()

        def trace(_cursor: Any, sql: str, _bindings: Any) -> bool:
            statements[sql.split("(")[0].strip()[:60]] += 1
            return True

        dwn.store.conn.exec_trace = trace
        apply_all(dwn, traced, args.batch)
        dwn.store.conn.exec_trace = None
        report = dwn.history.verify(ALICE.did)
        dwn.close()
    print(f"yardstick V = {v:,.0f} Ed25519 verifies/s on one core, measured now")
    print(f"apply in log order, {args.count} x 1 KiB, {args.batch} a commit: {cpu * 1e6:,.0f} us CPU a message"
          f" = {cpu * v:.2f} verifies; {1 / cpu:,.0f} msg/s = {1 / cpu / v:.3f} V")
    print(f"SQL statements an apply: {sum(statements.values()) / len(traced):.1f}")
    for sql, n in statements.most_common():
        print(f"  {n / len(traced):5.2f}  {sql}")
    print(f"store verify: {'the state is the canonical state of its archive' if not any(report.values()) else report}")


if __name__ == "__main__":
    main()
