"""Writes through the CLI never fail because the device's node is replicating (issue #16).

The device's node is a real ``p2psync serve`` process; a peer pushes thousands of messages to
it with a real ``p2psync sync --push`` while the device's user writes: some writes are real
``p2psync write`` processes, the rest come from one helper process that runs the CLI's
``main()`` once per write, opening the store anew each time as a process does (a process per
write costs ~0.8 s of start-up here, mostly imports, and more beside a busy node: 500 of them
would take minutes).
tests/bench/bench_writes_during_apply.py is the same scenario with figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import apsw
import pytest

from p2psync.cli import common
from p2psync.cli.home import Home
from p2psync.demo import NOTES_PROTOCOL
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from tests.test_cli_sync import run, run_json, serving

REPO = Path(__file__).resolve().parents[1]
PUSHED = 4000  # records on the peer: a push that lasts several seconds here
WRITES = 500
# Of WRITES; the rest through the helper. A process costs ~0.8 s idle and ~2.5 s beside the
# node's apply on a 2-core box (measured), so 30 of them in 2 threads last about as long as the
# helper's 470 writes.
REAL_PROCESSES = 30
WRITER_THREADS = 2  # real processes at a time

#: ``python -c HELPER HOME N TAG``: N writes through main(), one JSON line each.
HELPER = r"""
import contextlib, io, json, sys
from p2psync.cli import main
home, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for i in range(n):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(["--home", home, "write", "--data", f"{tag} {i}", "--data-format", "text/plain"])
        except BaseException as exc:
            print(f"Traceback: {exc!r}", file=sys.stderr)
            code = 99
    print(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue()}), flush=True)
"""


def _cli(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "p2psync", "--home", str(home), *argv],
                          capture_output=True, text=True, cwd=REPO, check=False)


def _fill(home: Path, n: int) -> None:
    identity = Identity.from_jwk(json.loads((home / "identity.json").read_text()))
    dwn = Dwn(Store(Home(home).store_path))
    with dwn.store.transaction():
        for i in range(n):
            data = f"older record {i}".encode()
            message = RecordsWrite.create(signer=identity, data=data, data_format="text/plain").message
            assert dwn.process_message(identity.did, message, data).code == 202
    dwn.close()


@pytest.mark.slow
def test_writes_while_the_node_applies_a_push_all_succeed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(capsys, a, "init")[0] == 0
    assert run(capsys, b, "init", "--import-key", str(a / "identity.json"))[0] == 0
    _fill(a, PUSHED)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    pushed: list[subprocess.CompletedProcess[str]] = []

    with serving(b) as node:
        def push() -> None:
            pushed.append(_cli(a, "sync", node.url, "--push", "--json"))

        def helper() -> None:
            proc = subprocess.Popen([sys.executable, "-c", HELPER, str(b), str(WRITES - REAL_PROCESSES), "helper"],
                                    stdout=subprocess.PIPE, text=True, cwd=REPO)
            assert proc.stdout is not None
            for line in proc.stdout:
                with lock:
                    results.append(json.loads(line))
            proc.wait()

        def processes(first: int) -> None:
            for i in range(first, REAL_PROCESSES, WRITER_THREADS):
                done = _cli(b, "write", "--data", f"process {i}", "--data-format", "text/plain")
                with lock:
                    results.append({"code": done.returncode, "out": done.stdout, "err": done.stderr})

        threads = [threading.Thread(target=push), threading.Thread(target=helper)]
        threads += [threading.Thread(target=processes, args=(k,)) for k in range(WRITER_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        assert len(results) == WRITES
        failed = [r for r in results if r["code"] != 0 or "Traceback" in r["err"]]
        assert failed == [], f"{len(failed)} of {WRITES} writes failed, e.g. {failed[0]['err'][-500:]}"
        assert pushed[0].returncode == 0, pushed[0].stderr
        assert json.loads(pushed[0].stdout)["push"]["items_offered"] == PUSHED

        # The premise: the writes were admitted while the push was being applied, i.e. some
        # written message sits in B's archive between two pushed ones.
        written = {json.loads(r["out"])["messageCid"] for r in results}
        conn = apsw.Connection(str(Home(b).store_path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            order = [str(cid) for (cid,) in conn.execute("SELECT cid FROM archive ORDER BY id")]
        finally:
            conn.close()
        assert len(order) == PUSHED + WRITES
        positions = [i for i, cid in enumerate(order) if cid not in written]
        assert any(positions[0] < i < positions[-1] for i, cid in enumerate(order) if cid in written)

        # The peer converges: it pulls the writes back from the node.
        assert run(capsys, a, "sync", node.url, "--both")[0] == 0

    code, out, err = run(capsys, b, "store", "verify")
    assert code == 0, out + err
    assert run_json(capsys, a, "store", "digest") == run_json(capsys, b, "store", "digest")


def test_a_store_locked_too_long_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process keeps the write lock past the CLI's wait: one line, no traceback; the
    next write, once the lock is free, succeeds."""
    home = tmp_path / "home"
    assert run(capsys, home, "init")[0] == 0
    monkeypatch.setattr(common, "CLI_BUSY_TIMEOUT", 0.2)
    definition = tmp_path / "notes.json"
    definition.write_text(json.dumps(NOTES_PROTOCOL))
    other = apsw.Connection(str(Home(home).store_path))
    other.execute("BEGIN IMMEDIATE")
    try:
        for argv in (["write", "--data", "x"], ["protocol", "install", str(definition)]):
            code, out, err = run(capsys, home, *argv)
            assert code == 1
            assert "Traceback" not in err and len(err.splitlines()) == 1, err
            assert "the store is busy" in err and "0.2 s" in err, err
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert run_json(capsys, home, "write", "--data", "x")["status"] == 202
