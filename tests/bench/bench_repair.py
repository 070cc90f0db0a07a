"""Repair by CID (``Peer.fetch_messages``) against a pull of the same messages, in one process.

    .venv/bin/python tests/bench/bench_repair.py [--count 5000] [--size 256]

Builds a store with ``--count`` signed records of ``--size`` bytes, serves it on 127.0.0.1,
and into two empty stores (a) fetches every CID with ``fetch_messages`` (128 refs per
``getDependencies``, one closure and one durable commit per message), (b) pulls with
``Peer.sync``. Both peers share this process and its one trio thread, so the figures compare
the two paths; bench_peer.py measures a pull between two processes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.store import Store  # noqa: E402
from p2psync.peer.peer import Peer  # noqa: E402
from tests.peer.support import served, write_notes  # noqa: E402
from tests.replication.support import Clock, seeded  # noqa: E402

ALICE = seeded("bench-repair")


async def run(count: int, size: int, root: Path) -> None:
    source = Store(root / "source.db")
    started = time.monotonic()
    write_notes(source, ALICE, count, clock=Clock(), sizes=dict.fromkeys(range(count), size))
    print(f"built {count} records of {size} B in {time.monotonic() - started:.1f} s")
    cids = source.messages.cids(ALICE.did)
    async with served(Peer(source, ALICE)) as url:
        repaired = Store(root / "repaired.db")
        started = time.monotonic()
        summary = await Peer(repaired, ALICE).fetch_messages(url, tenant=ALICE.did, cids=cids)
        seconds = time.monotonic() - started
        assert summary.counts() == {"applied": count}, summary.counts()
        print(f"fetch_messages: {count} messages in {seconds:.2f} s ({count / seconds:,.0f} msg/s)")
        pulled = Store(root / "pulled.db")
        started = time.monotonic()
        await Peer(pulled, ALICE).sync(url, tenant=ALICE.did)
        seconds = time.monotonic() - started
        print(f"sync pull:      {count} messages in {seconds:.2f} s ({count / seconds:,.0f} msg/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run, args.count, args.size, Path(tmp))


if __name__ == "__main__":
    main()
