"""MessagesQuery over a large event log: N logged writes, then queries through the engine.

    .venv/bin/python tests/bench/bench_messages.py [--count 100000]

Prints the time of a whole-log query, a protocol-filtered one (1 entry in 10 matches), and a
query resuming from a cursor near the end (what a replica polling for news does).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.did import Identity  # noqa: E402
from p2psync.dwn.encoding import compute_cid  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.messages_interface import create_messages_query  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from p2psync.dwn.timeutil import add_seconds  # noqa: E402

EPOCH = "2030-01-01T00:00:00.000000Z"
PROTOCOLS = [f"https://example.com/p{i}" for i in range(10)]


def indexes(i: int, author: str) -> dict[str, Any]:
    """Index key-values shaped like a RecordsWrite's (what the event log keeps per entry)."""
    stamp = add_seconds(EPOCH, i)
    return {
        "interface": "Records",
        "method": "Write",
        "protocol": PROTOCOLS[i % len(PROTOCOLS)],
        "protocolPath": "thread",
        "dataCid": compute_cid({"data": i}),
        "dataSize": 1024,
        "dataFormat": "application/octet-stream",
        "dateCreated": stamp,
        "messageTimestamp": stamp,
        "isLatestBaseState": True,
        "published": False,
        "author": author,
        "recordId": compute_cid({"record": i}),
        "entryId": compute_cid({"entry": i}),
    }


def timed(dwn: Dwn, tenant: str, message: dict[str, Any]) -> tuple[float, int]:
    start = time.perf_counter()
    reply = dwn.process_message(tenant, message)
    elapsed = time.perf_counter() - start
    assert reply.code == 200, reply.detail
    return elapsed, len(reply.entries or [])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=100_000)
    args = parser.parse_args()
    alice = Identity.generate("key")
    with tempfile.TemporaryDirectory() as tmp:
        dwn = Dwn(Store(Path(tmp) / "bench.db"))
        start = time.perf_counter()
        with dwn.store.transaction():
            for i in range(args.count):
                dwn.store.events.append(alice.did, compute_cid({"message": i}), indexes(i, alice.did))
        print(f"appended {args.count} events in {time.perf_counter() - start:.2f} s")

        whole = create_messages_query(signer=alice)
        seconds, n = timed(dwn, alice.did, whole)
        print(f"whole log:          {n:>7} entries in {seconds * 1000:8.1f} ms")
        by_protocol = create_messages_query(signer=alice, filters=[{"protocol": PROTOCOLS[3]}])
        seconds, n = timed(dwn, alice.did, by_protocol)
        print(f"one protocol:       {n:>7} entries in {seconds * 1000:8.1f} ms")
        last = dwn.store.events.read(alice.did, after=args.count - 100)
        cursor = {"messageCid": last[0][1], "value": last[0][0]}
        resume = create_messages_query(signer=alice, cursor=cursor)
        seconds, n = timed(dwn, alice.did, resume)
        print(f"from a cursor:      {n:>7} entries in {seconds * 1000:8.1f} ms")
        dwn.close()


if __name__ == "__main__":
    main()
