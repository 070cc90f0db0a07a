"""A pipe process: one JSON request per stdin line in, one JSON reply per stdout line out.

Reads and writes go through non-blocking file descriptors and ``selectors`` so that every
reply has a deadline: a pipe that hangs, dies or writes garbage becomes a :class:`PipeError`
for the caller, never a hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

# The placeholder a pipe command may use for its store path; without it the runner appends
# ``--store PATH`` to the command.
STORE_PLACEHOLDER = "{store}"

# Bytes read from a pipe's stdout per system call.
_READ_CHUNK = 1 << 16

# A reply line longer than this is treated as garbage (the largest real reply, a query of a
# few hundred entries, is well under 1 MiB).
MAX_REPLY_LINE = 16 * 1024 * 1024

# How much of a dead pipe's stderr to quote in the error.
_STDERR_TAIL = 2000


class PipeError(Exception):
    """The pipe died, timed out, or answered with something that is not a JSON object line."""


def pipe_command(argv: Sequence[str], store: Path) -> list[str]:
    """The command line for a pipe over ``store``: fills ``{store}`` or appends ``--store``."""
    if any(STORE_PLACEHOLDER in a for a in argv):
        return [a.replace(STORE_PLACEHOLDER, str(store)) for a in argv]
    return [*argv, "--store", str(store)]


class PipeProcess:
    """A started pipe. Use :meth:`send` then :meth:`receive` (or :meth:`request`)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        store: Path,
        stderr_path: Path,
        cwd: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.command = pipe_command(argv, store)
        self.stderr_path = stderr_path
        self._stderr_file: IO[bytes] = open(stderr_path, "wb")  # noqa: SIM115 - closed in close()
        try:
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr_file,
                cwd=cwd,
                env=env,
            )
        except OSError as exc:
            self._stderr_file.close()
            raise PipeError(f"cannot start {self.command[0]!r}: {exc}") from None
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._stdin = self._proc.stdin
        self._stdout = self._proc.stdout
        os.set_blocking(self._stdin.fileno(), False)
        os.set_blocking(self._stdout.fileno(), False)
        self._buffer = bytearray()
        self._eof = False

    # ------------------------------------------------------------------ I/O

    def _read_available(self) -> None:
        try:
            chunk = os.read(self._stdout.fileno(), _READ_CHUNK)
        except BlockingIOError:
            return
        if chunk:
            self._buffer.extend(chunk)
        else:
            self._eof = True

    def send(self, line: bytes, timeout: float) -> None:
        """Writes one request line; meanwhile keeps draining stdout so neither side blocks."""
        view = memoryview(line)
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._stdin.fileno(), selectors.EVENT_WRITE, "w")
            if not self._eof:
                sel.register(self._stdout.fileno(), selectors.EVENT_READ, "r")
            while view:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PipeError(f"timed out after {timeout:.0f} s writing a request")
                for key, _ in sel.select(remaining):
                    if key.data == "r":
                        self._read_available()
                        if self._eof:
                            sel.unregister(self._stdout.fileno())
                        continue
                    try:
                        written = os.write(self._stdin.fileno(), view)
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, ConnectionResetError):
                        raise PipeError(self._death("closed its stdin")) from None
                    view = view[written:]

    def receive(self, timeout: float) -> dict[str, Any]:
        """Reads the next reply line and decodes it as a JSON object."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._stdout.fileno(), selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                if self._eof:
                    raise PipeError(self._death("exited before replying"))
                if len(self._buffer) > MAX_REPLY_LINE:
                    raise PipeError(f"reply line longer than {MAX_REPLY_LINE} bytes")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PipeError(f"no reply within {timeout:.0f} s")
                if sel.select(remaining):
                    self._read_available()
        end = self._buffer.index(b"\n")
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        try:
            reply = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise PipeError(f"reply is not JSON: {line[:200]!r}") from None
        if not isinstance(reply, dict):
            raise PipeError(f"reply is not a JSON object: {line[:200]!r}")
        return reply

    def request(self, line: bytes, timeout: float) -> dict[str, Any]:
        """Sends one request and waits for its reply."""
        self.send(line, timeout)
        return self.receive(timeout)

    # ------------------------------------------------------------------ lifecycle

    def stderr_tail(self) -> str:
        """The last lines the pipe wrote to stderr (for error reports)."""
        self._stderr_file.flush()
        try:
            data = self.stderr_path.read_bytes()
        except OSError:
            return ""
        return data[-_STDERR_TAIL:].decode("utf-8", "replace").strip()

    def _death(self, what: str) -> str:
        code = self._proc.poll()
        status = f"exit code {code}" if code is not None else "still running"
        tail = self.stderr_tail()
        return f"pipe {what} ({status})" + (f"; stderr: {tail}" if tail else "")

    def close(self, timeout: float = 10.0) -> int | None:
        """Closes stdin (the pipe's signal to finish), waits, kills if it will not exit."""
        with contextlib.suppress(OSError):  # already broken: the pipe died
            self._stdin.close()
        try:
            code: int | None = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        self._stdout.close()
        self._stderr_file.close()
        return code

    def __enter__(self) -> PipeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
