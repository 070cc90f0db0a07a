"""Pages a replicated apply dirties, by b-tree, at a given number of stored messages (issue #17).

    .venv/bin/python tests/bench/bench_apply_pages.py [--count 20000] [--at 16000] [--window 1024]
        [--batch 64] [--cache DIR]

Replays the first ``--at`` + ``--window`` messages of bench_peer's store (built once, cached
under ``--cache``, the same file bench_peer uses) into a fresh store the way the syncing side
applies them: ``apply_replicated_message`` with the CID and DAG-CBOR the sink computed, the
origin noted, a commit every ``--batch`` messages (default ``BATCH``). Over the window (starting at ``--at`` stored,
the WAL emptied first and not checkpointed inside it) it prints:

- WAL frames a message, by the b-tree each frame's page belongs to (``dbstat``): what COMMIT
  writes, and later the checkpoint reads and copies. A load-proof figure: it counts pages,
  not time, and replays exactly;
- read and write system calls a message (``/proc/self/io``), user and system CPU;
- SQL statements a message (SQLite's own profile clock counts milliseconds: too coarse here).

The flatness of issue #17 (rate at 100,000 stored over the rate at 10,000) follows the frames:
``--count 100000 --at 90000`` against ``--at 8000``.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import apsw  # noqa: E402

from p2psync.dwn.encoding import b64url_decode, dag_cbor_encode, message_cid  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from p2psync.state.copies import Origins  # noqa: E402
from tests.bench.bench_peer import ALICE, build  # noqa: E402

#: Messages a commit by default: a full `revs` of 64 (what the sink committed before its
#: group commits spanned consecutive `revs`; a pull now commits a listing of 200 at a time).
BATCH = 64
#: A WAL frame's header (SQLite's file format, section 4.1).
FRAME_HEADER = 24


def read_messages(path: Path, n: int) -> list[tuple[dict[str, object], bytes | None]]:
    """The first ``n`` messages in log order, as they travel (read only: the cached store is
    not migrated by a newer p2psync)."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    out: list[tuple[dict[str, object], bytes | None]] = []
    try:
        for (body,) in conn.execute(
            "SELECT m.body FROM events e JOIN messages m ON m.tenant = e.tenant AND m.cid = e.cid"
            " ORDER BY e.position LIMIT ?", (n,)
        ):
            stored = json.loads(str(body))
            encoded = stored.pop("encodedData", None)
            out.append((stored, b64url_decode(encoded) if isinstance(encoded, str) else None))
    finally:
        conn.close()
    return out


def wal_frames(store: Store, wal: Path) -> Counter[str]:
    """Frames in the WAL file by the name of the b-tree their page belongs to."""
    names = {int(page): str(name) for name, page in store.conn.execute("SELECT name, pageno FROM dbstat")}
    page_size = int(store.scalar("PRAGMA page_size"))
    data = wal.read_bytes()
    frames: Counter[str] = Counter()
    offset = 32  # the WAL header
    while offset + FRAME_HEADER + page_size <= len(data):
        (page,) = struct.unpack(">I", data[offset:offset + 4])
        frames[names.get(page, "(freed)")] += 1
        offset += FRAME_HEADER + page_size
    return frames


def io_calls() -> tuple[int, int]:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20_000, help="messages in the source store (bench_peer's)")
    ap.add_argument("--at", type=int, default=16_000, help="stored messages when the window starts")
    ap.add_argument("--window", type=int, default=1024, help="messages measured (a multiple of --batch)")
    ap.add_argument("--batch", type=int, default=BATCH, help="messages a commit")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "p2psync-bench"))
    args = ap.parse_args()
    batch = args.batch
    at, window = args.at - args.at % batch, args.window - args.window % batch
    if at + window > args.count:
        ap.error("--at + --window must not exceed --count")
    source = Path(args.cache) / f"small-{args.count}x1024.db"
    build(source, args.count, 1024)
    messages = read_messages(source, at + window)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "replica.db"
        store = Store(path)
        dwn, origins = Dwn(store), Origins(store)
        conn = store.conn
        statements: Counter[str] = Counter()
        measuring = False

        def traced(_cursor: object, sql: str, _bindings: object) -> bool:
            if measuring:
                statements[" ".join(sql.split())[:100]] += 1
            return True

        conn.exec_trace = traced
        for start in range(0, at + window, batch):
            if start == at:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                conn.execute("PRAGMA wal_autocheckpoint=0")
                measuring = True
                calls, times = io_calls(), os.times()
            conn.execute("BEGIN IMMEDIATE")
            for message, data in messages[start:start + batch]:
                cid = message_cid(message)
                result = dwn.apply_replicated_message(ALICE.did, message, data, cid=cid,
                                                      encoded=dag_cbor_encode(message))
                assert result.kind == "Applied", result
                origins.record(ALICE.did, cid, "bench-origin")
            conn.execute("COMMIT")
        measuring = False
        after_calls, after_times = io_calls(), os.times()
        frames = wal_frames(store, Path(str(path) + "-wal"))
        store.close()
    per = 1 / window
    print(f"{window:,} replicated 1 KiB writes applied at {at:,} stored, commits of {batch}:")
    print(f"  WAL frames a message: {sum(frames.values()) * per:.2f}")
    for name, n in frames.most_common():
        if n * per >= 0.01:
            print(f"    {n * per:5.2f}  {name}")
    user, system = (after_times.user - times.user) * per, (after_times.system - times.system) * per
    print(f"  system calls a message: {(after_calls[0] - calls[0]) * per:.1f} reads, "
          f"{(after_calls[1] - calls[1]) * per:.1f} writes; CPU a message: user {user * 1e6:.0f} us, "
          f"system {system * 1e6:.0f} us (applies and COMMITs; no checkpoint inside the window)")
    print(f"  SQL statements a message: {sum(statements.values()) * per:.2f}")
    for sql, n in statements.most_common():
        print(f"    {n * per:5.2f}  {sql}")


if __name__ == "__main__":
    main()
