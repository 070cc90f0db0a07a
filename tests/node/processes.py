"""``p2psync serve`` in child processes, and reading the stores they write (shared by the
process and network-namespace tests)."""

from __future__ import annotations

import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from p2psync.cli.home import Home
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from tests.peer.support import Clock

__all__ = ["NodeProcess", "config_file", "event_counts", "make_home", "read_only", "wait_for", "write_records"]

REPO = Path(__file__).resolve().parents[2]
# Bounded waits on child processes (not timing assertions): generous for a loaded 2-core box.
STARTUP_DEADLINE = 30.0
EXIT_DEADLINE = 20.0


class NodeProcess:
    """``p2psync --home HOME serve ARGS`` in a child process, its output read by a thread."""

    def __init__(self, home: Path, *args: str, prefix: Sequence[str] = ()) -> None:
        # ``prefix``: e.g. a network namespace's nsenter (which execs: the pid is p2psync's).
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "p2psync", "--home", str(home), "serve", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = time.monotonic() + STARTUP_DEADLINE
        first = self.next_line(deadline)
        match = re.fullmatch(r"serving (wss?://[0-9.]+:(\d+)/_p2psync)\n", first)
        assert match is not None, first + self._stderr_now()
        self.url, self.port = match[1], int(match[2])
        self.fingerprint: str | None = None  # of its TLS certificate, when it serves wss://
        if self.url.startswith("wss://"):
            self.fingerprint = self.next_line(deadline).removeprefix("tls: ").strip()
        self.did = self.next_line(deadline).removeprefix("did: ").strip()
        self.store_id = self.next_line(deadline).removeprefix("storeId: ").strip()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def _stderr_now(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return "\n" + self.proc.stderr.read()

    def next_line(self, deadline: float) -> str:
        try:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
        except queue.Empty:
            raise AssertionError("p2psync serve printed nothing in time") from None
        assert line, "p2psync serve exited early" + self._stderr_now()
        self.out.append(line)
        return line

    def stop(self, signum: signal.Signals = signal.SIGTERM) -> tuple[int, list[str], str]:
        """Send ``signum``; (exit code, the rest of stdout, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            self.proc.wait(timeout=EXIT_DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"p2psync serve ignored {signum.name}") from None
        rest = []
        while (line := self.lines.get(timeout=EXIT_DEADLINE)) != "":
            rest.append(line)
        assert self.proc.stderr is not None
        return self.proc.returncode, rest, self.proc.stderr.read()


def read_only(path: Path) -> sqlite3.Connection:
    """A reader on a store a child process writes (WAL: it never blocks the writer)."""
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)


def event_counts(path: Path, tenant: str) -> tuple[int, int]:
    """(events, distinct message CIDs) in a store's event log for ``tenant``."""
    if not path.exists():
        return 0, 0
    with read_only(path) as db:
        row = db.execute(
            "SELECT count(*), count(DISTINCT e.cid) FROM events e JOIN tenants t ON t.id = e.tenant WHERE t.did = ?",
            (tenant,),
        ).fetchone()
    db.close()
    return int(row[0]), int(row[1])


def wait_for(predicate: Callable[[], bool], deadline: float, what: str, poll: float = 0.02) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen in {deadline:.0f} s")
        time.sleep(poll)


def make_home(path: Path, identity: Identity) -> Home:
    home = Home(path)
    home.init(identity)
    return home


def write_records(store: Store, identity: Identity, count: int, *, start: str, prefix: str) -> None:
    """``count`` signed records, committed in batches (fast: one transaction per 1,000)."""
    dwn = Dwn(store)
    clock = Clock(start)
    for first in range(0, count, 1000):
        with store.transaction():
            for i in range(first, min(count, first + 1000)):
                now = clock.tick()
                data = f"{prefix} {i:06d}".encode()
                write = RecordsWrite.create(signer=identity, data=data, schema="https://p2psync.example/node-test",
                                            data_format="text/plain", message_timestamp=now, date_created=now)
                reply = dwn.process_message(identity.did, write.message, data)
                assert reply.code == 202, reply.detail


def config_file(home: Home, text: str) -> Path:
    path = home.path / "node.toml"
    path.write_text(text)
    return path


