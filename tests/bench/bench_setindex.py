"""The maintained set digests: what LtHash16, the journal triggers and a fold cost.

    .venv/bin/python tests/bench/bench_setindex.py [--count 20000] [--batch 1000]

Prints, per message or CID:
- LtHash16 add and remove (pure Python; SHAKE-256's 2,048 bytes alone, for scale);
- ``MessageStore.put`` and ``delete`` in transactions of ``--batch`` rows, on a schema-3 store
  and on the same store with the journal triggers dropped (what schema 2 cost);
- a fold (``SetIndex.catch_up``) of the journal those puts wrote, per row;
- answering a digest from the folded state, against computing one from the messages.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.encoding import compute_cid  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from p2psync.replication.lthash import DOMAIN, LtHash, lthash_digest  # noqa: E402
from p2psync.state.setindex import SetIndex  # noqa: E402

TENANT = "did:example:bench"
PROTOCOLS = [f"https://example.com/p{i}" for i in range(10)]


def per_item(fn: Callable[[], object], n: int) -> float:
    """µs per item of ``fn`` (which handles ``n`` items); the best of three runs."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best / n * 1e6


def fill(store: Store, cids: list[str], batch: int) -> float:
    """Put every CID (a small message each, as bench_engine's writes); seconds taken."""
    start = time.perf_counter()
    for i in range(0, len(cids), batch):
        with store.transaction():
            for j, cid in enumerate(cids[i:i + batch], i):
                store.messages.put(
                    TENANT,
                    {"descriptor": {"interface": "Records", "method": "Write"}, "n": j},
                    {"interface": "Records", "method": "Write", "protocol": PROTOCOLS[j % len(PROTOCOLS)],
                     "recordId": cid},
                    cid=cid,
                )
    return time.perf_counter() - start


def drain(store: Store, cids: list[str], batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(cids), batch):
        with store.transaction():
            for cid in cids[i:i + batch]:
                store.messages.delete(TENANT, cid)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=1_000)
    args = ap.parse_args()
    n = args.count
    cids = [compute_cid({"bench": i}) for i in range(n)]

    h = LtHash()
    shake = per_item(lambda: [hashlib.shake_256(DOMAIN + c.encode()).digest(2048) for c in cids], n)
    add = per_item(lambda: h.update(adds=cids), n)
    remove = per_item(lambda: h.update(removes=cids), n)
    print(f"lthash16: add {add:.1f} µs, remove {remove:.1f} µs a CID (SHAKE-256 to 2,048 bytes alone: {shake:.1f} µs)")

    with tempfile.TemporaryDirectory() as tmp:
        plain = Store(Path(tmp) / "plain.db")
        for trigger in ("set_journal_insert", "set_journal_delete", "set_journal_update"):
            plain.conn.execute(f"DROP TRIGGER {trigger}")
        journaled = Store(Path(tmp) / "journaled.db")
        plain.tenant_id(TENANT)
        journaled.tenant_id(TENANT)
        # alternate, so neither store has the warmer cache throughout
        put_plain = put_journaled = del_plain = del_journaled = float("inf")
        for _ in range(3):
            put_plain = min(put_plain, fill(plain, cids, args.batch))
            put_journaled = min(put_journaled, fill(journaled, cids, args.batch))
            del_plain = min(del_plain, drain(plain, cids, args.batch))
            del_journaled = min(del_journaled, drain(journaled, cids, args.batch))
        us = 1e6 / n
        print(f"put ({args.batch} a transaction): {put_plain * us:.1f} µs without the journal trigger, "
              f"{put_journaled * us:.1f} µs with it (+{(put_journaled - put_plain) * us:.1f} µs)")
        print(f"delete: {del_plain * us:.1f} µs without, {del_journaled * us:.1f} µs with "
              f"(+{(del_journaled - del_plain) * us:.1f} µs)")

        index = SetIndex(journaled)
        index.catch_up()  # fold the churn of the runs above
        fill(journaled, cids, args.batch)
        rows = index.pending()
        start = time.perf_counter()
        index.catch_up()
        fold = time.perf_counter() - start
        print(f"fold of {rows} journal rows (tenant and protocol scopes): {fold / rows * 1e6:.1f} µs a row, "
              f"{fold:.2f} s")

        start = time.perf_counter()
        for _ in range(100):
            maintained = index.digest(TENANT)
        answer = (time.perf_counter() - start) / 100
        start = time.perf_counter()
        scanned = lthash_digest(journaled.messages.cids(TENANT))
        scan = time.perf_counter() - start
        assert maintained.digest == scanned and maintained.count == n
        print(f"digest of {n} messages: {answer * 1e3:.2f} ms from the maintained state, "
              f"{scan * 1e3:.0f} ms computed from the messages")
        plain.close()
        journaled.close()


if __name__ == "__main__":
    main()
