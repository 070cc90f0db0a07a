"""Running a program in a namespace and reading its JSON-lines reports, for the discovery tests
(and any other test whose subprocess prints one JSON object a line).

    async with json_process(ns.command([sys.executable, "-m", "tests.discovery.nsnode", cfg]),
                            name="a", log_dir=tmp_path) as node:
        ready = await node.expect("ready")
        await node.send("stop")

The process is killed (by its pid) when the block ends, if it is still running; its stderr is kept
in ``<log_dir>/<name>.log`` and quoted when an expectation times out.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

__all__ = ["REPO", "JsonProcess", "json_process"]

#: The repository root: ``python -m tests....`` must run from here.
REPO = Path(__file__).resolve().parents[2]
#: Long enough for a slow CI machine to start Python and register (probing takes ~1.5 s).
DEFAULT_TIMEOUT = 30.0


class JsonProcess:
    """A started process; ``history`` keeps every object it printed, in order."""

    def __init__(self, proc: trio.Process, name: str, log: Path) -> None:
        self.proc = proc
        self.name = name
        self.log = log
        self.history: list[dict[str, Any]] = []
        self._buffer = b""

    async def next(self) -> dict[str, Any] | None:
        """The next object printed, or None at end of output."""
        assert self.proc.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self.proc.stdout.receive_some(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        obj: dict[str, Any] = json.loads(line)
        self.history.append(obj)
        return obj

    async def expect(
        self,
        event: str,
        where: Callable[[dict[str, Any]], bool] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> dict[str, Any]:
        """Read until an object with ``"event": event`` (and ``where`` true) arrives."""
        with trio.move_on_after(timeout):
            while (obj := await self.next()) is not None:
                if obj.get("event") == event and (where is None or where(obj)):
                    return obj
        raise AssertionError(
            f"{self.name}: no {event!r} within {timeout} s; got {self.history}\n--- stderr ---\n{self.stderr()}"
        )

    async def read_for(self, seconds: float) -> list[dict[str, Any]]:
        """Everything printed during the next ``seconds``."""
        got: list[dict[str, Any]] = []
        with trio.move_on_after(seconds):
            while (obj := await self.next()) is not None:
                got.append(obj)
        return got

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def events(self, event: str) -> list[dict[str, Any]]:
        return [obj for obj in self.history if obj.get("event") == event]

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(line.encode() + b"\n")

    async def wait(self, timeout: float = DEFAULT_TIMEOUT) -> int:
        """Drain the output and wait for the exit code."""
        with trio.move_on_after(timeout):
            while await self.next() is not None:
                pass
            return await self.proc.wait()
        raise AssertionError(f"{self.name}: did not exit within {timeout} s\n--- stderr ---\n{self.stderr()}")

    def kill(self) -> None:
        """SIGKILL, no goodbye."""
        self.proc.kill()


@asynccontextmanager
async def json_process(argv: Sequence[str], *, name: str, log_dir: Path) -> AsyncIterator[JsonProcess]:
    log = log_dir / f"{name}.log"
    with log.open("wb") as err:
        proc = await trio.lowlevel.open_process(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=REPO
        )
    try:
        yield JsonProcess(proc, name, log)
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                await stream.aclose()
