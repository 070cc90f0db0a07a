"""Figures for the replication ledger's hot path: token parsing, the pure mark-applied step,
and committed checkpoint updates (one commit per message vs. one per batch).

    .venv/bin/python tests/bench/bench_ledger.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.encoding import compute_cid  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from p2psync.replication.checkpoint import DirectionCheckpoint  # noqa: E402
from p2psync.replication.scope import SyncScope  # noqa: E402
from p2psync.replication.tokens import ProgressToken  # noqa: E402
from p2psync.state.ledger import Direction, Ledger, Step  # noqa: E402

N = 20_000
BATCH = 500


def rate(label: str, count: int, seconds: float) -> None:
    print(f"{label:<58} {count / seconds:>12,.0f} /s   ({seconds * 1e6 / count:.1f} µs each)")


def main() -> None:
    cids = [compute_cid({"n": i}) for i in range(N)]
    tokens = [ProgressToken("stream", "epoch", i + 1, c) for i, c in enumerate(cids)]
    wires = [t.to_wire() for t in tokens]

    start = time.perf_counter()
    for w in wires:
        ProgressToken.from_wire(w)
    rate("ProgressToken.from_wire", N, time.perf_counter() - start)

    start = time.perf_counter()
    cp = DirectionCheckpoint()
    for t in tokens:
        cp, _ = cp.received(t).applied(t)
    rate("DirectionCheckpoint received+applied, in order", N, time.perf_counter() - start)

    start = time.perf_counter()
    cp = DirectionCheckpoint()
    window = 50  # 50 in flight, applied in reverse order within each window
    for i in range(0, N, window):
        chunk = tokens[i : i + window]
        for t in chunk:
            cp = cp.received(t)
        for t in reversed(chunk):
            cp, _ = cp.applied(t)
    rate("DirectionCheckpoint, 50 in flight applied out of order", N, time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store.db")
        ledger = Ledger.for_store(store)
        key = ledger.open_link("did:key:z6MkTenant", "did:key:z6MkRemote", SyncScope.global_scope()).key
        count = 2_000
        start = time.perf_counter()
        for t in tokens[:count]:
            ledger.record(key, Direction.PULL, [("received", t), ("applied", t)])
        rate("Ledger.record, one commit per message (store file, WAL)", count, time.perf_counter() - start)

        start = time.perf_counter()
        rest = tokens[count:]
        for i in range(0, len(rest), BATCH):
            steps: list[Step] = []
            for t in rest[i : i + BATCH]:
                steps += [("received", t), ("applied", t)]
            ledger.record(key, Direction.PULL, steps)
        rate(f"Ledger.record, one commit per {BATCH} messages", len(rest), time.perf_counter() - start)

        rev = ledger.get_checkpoint(key, Direction.PULL)[1]
        body = ledger.get_checkpoint(key, Direction.PULL)[0]
        start = time.perf_counter()
        for _ in range(count):
            rev = ledger.set_checkpoint(key, Direction.PULL, body, rev)
        rate("Ledger.set_checkpoint (compare-and-set, commit)", count, time.perf_counter() - start)
        store.close()


if __name__ == "__main__":
    main()
