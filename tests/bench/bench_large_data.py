"""The store's own cost of a large record's data: keeping it, committing it, reading it back.

    PYTHONPATH=. .venv/bin/python tests/bench/bench_large_data.py [--count 20] [--mib 10]

One process, no network: ``--count`` records of ``--mib`` MiB processed through the engine
(a commit each, then a WAL checkpoint, as a node's would be), then each read back through
``DataStore.get``. Prints CPU ms a record for each phase and the process's I/O counts from
/proc/self/io (bytes and system calls: load does not move them), so two versions of the store
compare by counts on a busy machine. The data CID is computed before the timed part (a sink
has it from the transfer) and given to the engine the way the sink gives it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn import datacid  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from tests.replication.support import Clock, seeded  # noqa: E402


def io_counts() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--mib", type=int, default=10)
    args = ap.parse_args()
    alice, clock, size = seeded("alice"), Clock(), args.mib * 1024 * 1024
    records = []
    for i in range(args.count):
        now = clock.tick()
        data = (f"record {i:06d} ".encode() * (size // 14 + 1))[:size]
        write = RecordsWrite.create(signer=alice, data=data, data_format="application/octet-stream",
                                    message_timestamp=now, date_created=now)
        records.append((write.message, data, datacid.data_cid(data)))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "s.db")
        dwn = Dwn(store)
        before, cpu = io_counts(), time.process_time()
        for message, data, cid in records:
            with store.transaction(), datacid.known(data, cid):
                result = dwn.apply_replicated_message(alice.did, message, data)
                assert result.kind == "Applied", result
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        kept_cpu, after = time.process_time() - cpu, io_counts()
        cpu = time.process_time()
        for message, _data, cid in records:
            assert len(store.data.get(alice.did, message["recordId"], cid) or b"") == size
        read_cpu, read = time.process_time() - cpu, io_counts()
        store.close()
    n = args.count
    print(f"{n} x {args.mib} MiB: keep + commit + checkpoint {1000 * kept_cpu / n:.1f} ms CPU a record, "
          f"read back {1000 * read_cpu / n:.1f} ms")
    print(f"  written: {(after['wchar'] - before['wchar']) / n / 2**20:.1f} MiB a record in "
          f"{(after['syscw'] - before['syscw']) / n:,.0f} write calls; read: "
          f"{(after['rchar'] - before['rchar']) / n / 2**20:.1f} MiB in {(after['syscr'] - before['syscr']) / n:,.0f} "
          f"calls while keeping, {(read['rchar'] - after['rchar']) / n / 2**20:.1f} MiB in "
          f"{(read['syscr'] - after['syscr']) / n:,.0f} calls reading back")


if __name__ == "__main__":
    main()
