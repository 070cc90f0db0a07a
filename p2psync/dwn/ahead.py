"""Signatures verified on a second core, ahead of the engine's turn (issue #17).

A sink receives messages in batches (a `revs` carries up to 64) and applies them one after the
other on its event loop's thread; the Ed25519 verify is ~15% of each apply. libsodium releases
the GIL while it verifies, so one worker thread can verify a batch's signatures while the engine
applies the messages before them: :class:`SignatureWorker` takes batches of messages and runs
:func:`p2psync.dwn.authentication.verify_ahead` on each, which keeps every acceptance in
:data:`p2psync.dwn.ed25519.AHEAD`, keyed by exactly the bytes verified. The engine still
verifies every signature it does not find there (see :class:`p2psync.dwn.ed25519.Ahead`):
nothing here decides whether a message is valid, only where the CPU is spent.

The thread starts with the first batch and ends after :data:`IDLE_SECONDS` without one (a new
batch starts it again), so an idle peer holds no thread and nobody has to stop it. It is worth
having only where a second core is free (:func:`second_core`); on one core it would take the
verify's CPU from the engine's own thread and add the GIL's hand-overs.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

from p2psync.dwn import jws
from p2psync.dwn.authentication import signed_jwses, verify_ahead
from p2psync.dwn.ed25519 import AHEAD, Outcome, outcome

__all__ = [
    "IDLE_SECONDS",
    "MAX_PENDING",
    "SignatureProcess",
    "SignatureWorker",
    "read_frame",
    "second_core",
    "signature_entries",
]

#: Seconds the worker waits for another batch before its thread ends. Ours: longer than a
#: sink's pause between `revs` under load, short enough that a finished sync leaves no thread.
IDLE_SECONDS: Final = 1.0
#: Messages queued and not verified yet past which a batch is not queued (the engine verifies
#: it inline): a worker that cannot keep up must not verify what was applied long ago. Half of
#: :data:`p2psync.dwn.ed25519.AHEAD_CAPACITY`, so what it verifies is still kept when used. Ours.
MAX_PENDING: Final = 1024


def second_core() -> bool:
    """Whether this process may run on more than one CPU."""
    try:
        return len(os.sched_getaffinity(0)) > 1
    except (AttributeError, OSError):  # not Linux
        return (os.cpu_count() or 1) > 1


class SignatureWorker:
    """One thread that verifies the signatures of batches of messages ahead of their apply."""

    def __init__(self, *, idle: float = IDLE_SECONDS, max_pending: int = MAX_PENDING) -> None:
        self.idle = idle
        self.max_pending = max_pending
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Event()
        self._idle.set()
        #: messages verified ahead; messages not queued (the worker was too far behind)
        self.verified = 0
        self.skipped = 0
        #: threads started so far (one per busy spell)
        self.started = 0

    def submit(self, messages: Sequence[Any]) -> bool:
        """Queue ``messages`` (decoded DWN messages) to have their signatures verified ahead;
        False when too many are queued already (the engine then verifies them itself)."""
        n = len(messages)
        if not n:
            return True
        with self._lock:
            if self._pending + n > self.max_pending:
                self.skipped += n
                return False
            self._pending += n
            AHEAD.expect(n)
            self._idle.clear()
            self._queue.put(tuple(messages))
            if self._thread is None:
                self.started += 1
                self._thread = threading.Thread(target=self._run, name="p2psync-verify-ahead", daemon=True)
                self._thread.start()
        return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Until every queued batch is verified (tests); False on timeout."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        while True:
            try:
                batch = self._queue.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():  # nothing was queued while we waited for the lock
                        self._thread = None
                        return
                continue
            try:
                for message in batch:
                    verify_ahead(message)
            finally:
                AHEAD.expect(-len(batch))
                with self._lock:
                    self._pending -= len(batch)
                    self.verified += len(batch)
                    if not self._pending:
                        self._idle.set()


# -- a worker process ------------------------------------------------------------------------

#: Seconds a worker process waits for another batch before it exits. Longer than the thread's:
#: a process costs a new interpreter importing the verifier to start (~0.3 s here). Ours.
PROCESS_IDLE_SECONDS: Final = 10.0
#: Messages a worker process verifies before it sends their acceptances back, so the engine
#: finds the first of a batch before the whole batch is done. Ours.
PROCESS_CHUNK: Final = 8
_FRAME: Final = struct.Struct(">I")


def signature_entries(message: Any) -> list[tuple[str, str, str]]:
    """(protected, payload, signature) of each signature :func:`p2psync.dwn.authentication.
    authenticate` verifies for ``message`` (what :func:`verify_ahead` reads); unreadable parts
    are left out, for the engine to judge."""
    return [entry for jws_ in signed_jwses(message) for entry in jws.signature_entries(jws_)]


class SignatureProcess:
    """:class:`SignatureWorker`'s job in a worker process of its own: no GIL shared with the
    engine, so the verifies (and reading their keys and signing inputs) leave the engine's core.

    :meth:`submit` sends each message's signature entries (three strings each) down a pipe; the
    worker (``python -m p2psync.dwn.ahead``) runs :func:`p2psync.dwn.ed25519.outcome` on exactly
    the bytes the engine would verify and sends back the acceptances, ``PROCESS_CHUNK`` messages
    at a time; a reader thread hands them to :data:`p2psync.dwn.ed25519.AHEAD`, where the engine
    takes each once for exactly its bytes and verifies anything else itself. The worker starts
    with the first batch and exits after ``idle`` seconds without one (or when this process
    ends: its pipe closes); a batch lost with it is only verified inline. :attr:`worker_cpu`
    counts the CPU seconds the workers spent, for figures that must include them.
    """

    def __init__(self, *, idle: float = PROCESS_IDLE_SECONDS, max_pending: int = MAX_PENDING,
                 chunk: int = PROCESS_CHUNK) -> None:
        self.idle = idle
        self.max_pending = max_pending
        self.chunk = chunk
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._pending = 0  # messages sent to the running worker and not answered yet
        self._idle = threading.Event()
        self._idle.set()
        self._ended_cpu = 0.0  # CPU seconds of workers that exited
        self._running_cpu = 0.0  # the running worker's, as it last reported
        #: messages verified by a worker; messages not sent (too many queued, or the worker gone)
        self.verified = 0
        self.skipped = 0
        #: workers started so far
        self.started = 0

    @property
    def worker_cpu(self) -> float:
        """CPU seconds spent by this object's worker processes so far (the running one's as of
        its last answer)."""
        with self._lock:
            return self._ended_cpu + self._running_cpu

    def submit(self, messages: Sequence[Any]) -> bool:
        """Send ``messages`` (decoded DWN messages) to have their signatures verified ahead;
        False when they were not sent (the engine then verifies them itself)."""
        n = len(messages)
        if not n:
            return True
        frame = pickle.dumps([signature_entries(m) for m in messages], protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self._pending + n > self.max_pending:
                self.skipped += n
                return False
            process = self._process if self._process is not None else self._start()
            self._pending += n
            AHEAD.expect(n)
            self._idle.clear()
        try:
            assert process.stdin is not None
            process.stdin.write(_FRAME.pack(len(frame)) + frame)
            process.stdin.flush()
        except (OSError, ValueError):  # the worker is gone: its reader gives back what was pending
            with self._lock:
                self.skipped += n
            return False
        return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Until every batch sent is answered (tests); False on timeout."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        """End the worker, if one runs (its pending batches are verified inline)."""
        with self._lock:
            process = self._process
        if process is not None and process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
            process.wait()

    def _start(self) -> subprocess.Popen[bytes]:
        # Under the lock. Its own interpreter, not a fork of this one (whose threads and event
        # loop a fork would copy mid-flight), not multiprocessing's spawn (which would import this
        # program's __main__ again).
        process = subprocess.Popen(
            [sys.executable, "-m", "p2psync.dwn.ahead", str(self.idle), str(self.chunk)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
        )
        self._process = process
        self._running_cpu = 0.0
        self.started += 1
        threading.Thread(target=self._read, args=(process,), name="p2psync-verify-reader", daemon=True).start()
        return process

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        stdout = process.stdout
        assert stdout is not None
        try:
            while True:
                answer = read_frame(stdout)
                if answer is None:
                    break
                count, found, cpu = answer
                AHEAD.accept(found)
                AHEAD.expect(-count)
                with self._lock:
                    self._pending -= count
                    self.verified += count
                    self._running_cpu = cpu
                    if not self._pending:
                        self._idle.set()
        finally:
            process.wait()
            with self._lock:
                lost, self._pending = self._pending, 0
                self._ended_cpu += self._running_cpu
                self._running_cpu = 0.0
                if self._process is process:
                    self._process = None
                self._idle.set()
            AHEAD.expect(-lost)
            with contextlib.suppress(OSError):
                stdout.close()
                if process.stdin is not None:
                    process.stdin.close()


def _read_exactly(stream: Any, size: int) -> bytes | None:
    """``size`` bytes from the unbuffered ``stream`` (a read may return fewer); None at its end."""
    parts, left = [], size
    while left:
        more = stream.read(left)
        if not more:
            return None
        parts.append(more)
        left -= len(more)
    return b"".join(parts)


def read_frame(stream: Any) -> Any:
    """One length-prefixed pickle from the unbuffered ``stream``; None at its end."""
    head = _read_exactly(stream, _FRAME.size)
    if head is None:
        return None
    body = _read_exactly(stream, _FRAME.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _serve(idle: float, chunk: int) -> None:
    """The worker process: verify each batch from stdin, send acceptances to stdout."""
    # Unbuffered: select() sees every byte not read yet (a buffered reader could hold a whole
    # frame that select() would not report).
    requests, answers = io.FileIO(sys.stdin.fileno(), "rb", closefd=False), sys.stdout.buffer
    while select.select([requests], [], [], idle)[0]:
        batch = read_frame(requests)
        if batch is None:
            return
        for start in range(0, len(batch), chunk):
            part = batch[start : start + chunk]
            found = []
            for entries in part:
                for protected, payload, signature in entries:
                    try:
                        _, key, signature_bytes, signing_input = jws.signed_entry(protected, payload, signature)
                    except Exception:  # the engine judges whatever cannot be read
                        continue
                    if not isinstance(key, bytes):
                        continue  # an EC signature: the engine verifies it itself
                    if outcome(key, signature_bytes, signing_input)[0] is Outcome.ACCEPT:
                        found.append((key, signature_bytes, signing_input))
            frame = pickle.dumps((len(part), found, time.process_time()), protocol=pickle.HIGHEST_PROTOCOL)
            answers.write(_FRAME.pack(len(frame)) + frame)
            answers.flush()


if __name__ == "__main__":
    _serve(float(sys.argv[1]), int(sys.argv[2]))
