"""Writes through the CLI while the device's node applies a large incoming batch (issue #16).

    PYTHONPATH=. .venv/bin/python tests/bench/bench_writes_during_apply.py [--messages 3000]
        [--writes 250] [--processes 25]

Device A holds ``--messages`` records. Device B (the same tenant, a new store) runs
``p2psync serve``; A pushes everything to it with ``p2psync sync --push`` while B's user writes
``--writes`` records with ``p2psync write``: ``--processes`` of them as real processes, the rest
by one helper process that runs the CLI's ``main()`` once per write (each opening the store
anew, as a process does). Prints how many writes failed (non-zero exit) and how many printed a
traceback, whether ``store verify`` is clean, and whether both stores end with the same digest
after a final sync.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.cli.home import Home  # noqa: E402
from p2psync.dwn.did import Identity  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402

#: The helper: run ``p2psync write`` through main() N times in one process; print one JSON line
#: per write with its exit code and whether stderr held a traceback.
HELPER = r"""
import contextlib, io, json, sys, time, traceback
from p2psync.cli import main
home, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for i in range(n):
    err, out = io.StringIO(), io.StringIO()
    t = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(["--home", home, "write", "--data", f"{tag} {i}", "--data-format", "text/plain"])
        except BaseException:
            traceback.print_exc()
            code = 99
    print(json.dumps({"code": code, "err": err.getvalue(), "seconds": time.monotonic() - t}), flush=True)
"""


def cli(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "p2psync", "--home", str(home), *argv],
                          capture_output=True, text=True, cwd=ROOT, check=False)


def fill(home: Path, n: int) -> None:
    identity = Identity.from_jwk(json.loads((home / "identity.json").read_text()))
    dwn = Dwn(Store(Home(home).store_path))
    with dwn.store.transaction():
        for i in range(n):
            data = f"old record {i}".encode()
            message = RecordsWrite.create(signer=identity, data=data, data_format="text/plain").message
            assert dwn.process_message(identity.did, message, data).code == 202
    dwn.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--writes", type=int, default=250)
    parser.add_argument("--processes", type=int, default=25)
    parser.add_argument("--show", action="store_true", help="print the first traceback")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="p2psync-writes-"))
    a, b = tmp / "a", tmp / "b"
    assert cli(a, "init").returncode == 0
    assert cli(b, "init", "--import-key", str(a / "identity.json")).returncode == 0
    started = time.monotonic()
    fill(a, args.messages)
    print(f"device A: {args.messages} records in {time.monotonic() - started:.1f} s")

    node = subprocess.Popen([sys.executable, "-m", "p2psync", "--home", str(b), "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert node.stdout is not None
    match = re.match(r"serving (ws://\S+)", node.stdout.readline())
    assert match is not None
    url = match[1]
    node_err: list[str] = []
    threading.Thread(target=lambda: node_err.extend(node.stderr or []), daemon=True).start()

    results: list[dict[str, Any]] = []
    push_done: dict[str, float] = {}

    def push() -> None:
        t = time.monotonic()
        done = cli(a, "sync", url, "--push", "--json")
        push_done["seconds"] = time.monotonic() - t
        push_done["code"] = done.returncode
        if done.returncode:
            print("push failed:", done.stderr.strip()[-400:])
        else:
            push_done["offered"] = json.loads(done.stdout)["push"]["items_offered"]

    def helper() -> None:
        n = args.writes - args.processes
        proc = subprocess.Popen([sys.executable, "-c", HELPER, str(b), str(n), "helper"],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert proc.stdout is not None
        for line in proc.stdout:
            results.append(json.loads(line))
        proc.wait()

    def processes() -> None:
        for i in range(args.processes):
            t = time.monotonic()
            done = cli(b, "write", "--data", f"process {i}", "--data-format", "text/plain")
            results.append({"code": done.returncode, "err": done.stderr, "seconds": time.monotonic() - t})

    threads = [threading.Thread(target=f) for f in (push, helper, processes)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    failed = [r for r in results if r["code"] != 0]
    tracebacks = [r for r in results if "Traceback" in r["err"]]
    print(f"push: exit {push_done.get('code')}, {push_done.get('offered')} offered, "
          f"in {push_done.get('seconds', 0):.1f} s; writes took {elapsed:.1f} s")
    print(f"writes: {len(results)}, failed: {len(failed)}, with a traceback: {len(tracebacks)}")
    seconds = sorted(r["seconds"] for r in results)
    print(f"a write took: median {seconds[len(seconds) // 2]:.3f} s, 95th percentile "
          f"{seconds[len(seconds) * 95 // 100]:.3f} s, longest {seconds[-1]:.3f} s")
    for r in failed[:3]:
        print("  e.g.:", r["err"].strip().splitlines()[-1] if r["err"].strip() else f"exit {r['code']}")
    if tracebacks and "--show" in sys.argv:
        print(tracebacks[0]["err"])
    node_tracebacks = sum("Traceback" in line for line in node_err)
    print(f"node stderr: {len(node_err)} line(s), {node_tracebacks} traceback(s)")

    node.terminate()
    node.wait(timeout=30)
    verify = cli(b, "store", "verify")
    print("store verify (B):", verify.stdout.strip() or verify.stderr.strip())
    # converge: B serves again, A syncs both ways, and the digests must match
    node = subprocess.Popen([sys.executable, "-m", "p2psync", "--home", str(b), "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    assert node.stdout is not None
    match = re.match(r"serving (ws://\S+)", node.stdout.readline())
    assert match is not None
    both = cli(a, "sync", match[1], "--both")
    node.terminate()
    node.wait(timeout=30)
    da, db = cli(a, "store", "digest").stdout, cli(b, "store", "digest").stdout
    print(f"final sync --both: exit {both.returncode}; digests equal: {da == db}")
    return 0 if not failed and da == db and verify.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
