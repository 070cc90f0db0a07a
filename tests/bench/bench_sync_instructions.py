"""The syncing side of a pull in instructions a message: a figure the machine's load does not move.

    .venv/bin/python tests/bench/bench_sync_instructions.py [--count 1000] [--updates 0] [--cache DIR]

On these VMs the wall and CPU figures of tests/bench/bench_peer.py move by 10-30% between runs
minutes apart (the yardstick V too: 6,100-8,600 verifies a CPU second within one hour, the two
cores apart by up to 38%), more than most single changes gain. valgrind's callgrind counts the
instructions a process executes instead: the same code on the same input gives the same count
within ~0.1%, whatever else runs.

Builds (once, under ``--cache``) two stores of ``--count`` and 2 x ``--count`` signed 1 KiB
records, serves each from a plain process, and pulls it into an empty store with the syncing
process under callgrind. Its instructions a message are the difference of the two pulls over
``--count`` (start-up, imports and hello cancel out). The yardstick, in the same unit: the
instructions of one Ed25519 verify with ``cryptography`` (V's operation), counted the same way
(1,000 verifies less none, over 1,000). Prints both and their ratio, "instruction-verifies" a
message: issue #17's syncing-side row in a unit that holds still (it is not the same number as
bench_peer's, which is in CPU time: libsodium runs more instructions per second than Python).
Takes ~3 minutes for the default count. ``--updates K``: each record was written again K times
before the pull (the source's log holds its initial write, without data, and its latest write:
two messages a record, half of them updates), for the cost of a record's later writes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_peer import build, fold_journal, start_server  # noqa: E402

BENCH_PEER = ROOT / "tests" / "bench" / "bench_peer.py"

_COLLECTED = re.compile(r"Collected : (\d+)")

_VERIFY = """
import sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
key = Ed25519PrivateKey.from_private_bytes(bytes(32))
public, message = key.public_key(), b"x" * 300
signature = key.sign(message)
for _ in range(int(sys.argv[1])):
    public.verify(signature, message)
"""


def callgrind(command: list[str], env: dict[str, str] | None = None) -> int:
    """Instructions ``command`` executed, by callgrind (its own output file is discarded)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", *command],
            capture_output=True, text=True, env=env, check=False,
        )
    found = _COLLECTED.search(out.stderr)
    if out.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed on {command[:3]}: {out.stderr[-2000:]}")
    return int(found.group(1))


def verify_instructions(n: int = 1000) -> float:
    code = [sys.executable, "-c", _VERIFY]
    return (callgrind([*code, str(n)]) - callgrind([*code, "0"])) / n


def pull_instructions(source: Path) -> int:
    """Instructions of the syncing process pulling ``source`` (served by a plain process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        served = Path(tmp) / "source.db"
        served.write_bytes(source.read_bytes())  # serving writes its ledger: a copy each time
        server, url, _ = start_server(served, Path(tmp) / "port", env=env)
        try:
            return callgrind([sys.executable, str(BENCH_PEER), "--sync", str(Path(tmp) / "sink.db"), url, "pull", ""],
                             env=env)
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(timeout=60)


def store(cache: Path, count: int, updates: int = 0) -> Path:
    path = cache / (f"small-{count}x1024.db" if not updates else f"updated-{count}x{updates}x1024.db")
    if not path.exists():
        build(path, count, 1024, updates)
        fold_journal(path, count)
    return path


def logged(path: Path) -> int:
    """How many messages a pull of the store moves: its log's entries."""
    import apsw

    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = conn.execute("SELECT count(*) FROM events").fetchone()
        assert row is not None
        return int(row[0])
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--updates", type=int, default=0, help="later writes of each record before the pull")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "p2psync-bench-instructions")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    one, two = store(args.cache, args.count, args.updates), store(args.cache, 2 * args.count, args.updates)
    moved_one, moved_two = logged(one), logged(two)
    verify = verify_instructions()
    small, large = pull_instructions(one), pull_instructions(two)
    per_message = (large - small) / (moved_two - moved_one)
    print(f"yardstick: one Ed25519 verify with cryptography = {verify:,.0f} instructions")
    shape = f", each written {args.updates + 1} times" if args.updates else ""
    print(f"pull of {args.count:,} and {2 * args.count:,} records x 1 KiB{shape} ({moved_one:,} and {moved_two:,}"
          f" messages): the syncing process ran {small:,} and {large:,} instructions")
    print(f"syncing side: {per_message:,.0f} instructions a message = {per_message / verify:.2f} instruction-verifies")
    print(json.dumps({"verify": round(verify), "per_message": round(per_message),
                      "ratio": round(per_message / verify, 3)}))


if __name__ == "__main__":
    main()
