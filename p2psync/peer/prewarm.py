"""Signature checks of queued `rev`s on a worker thread, ahead of their apply.

A sink applies `rev`s one at a time, in listed order, on the trio thread; up to 1,000 of them
wait for their turn (§12). Ed25519 verification is about a third of an apply, and
``cryptography`` releases the GIL while it verifies (two threads verify twice as fast as one
here). So while a `rev` waits, its signatures are checked on a worker thread, in batches, and
the engine's verification cache (:func:`p2psync.dwn.jws._verify_entry`) holds the answer when
the apply asks for it: the trio thread's share of the work shrinks by that third on a machine
with a core to spare.

Only successes are cached, so this can never let a bad signature through: a forged message
is verified again, on the trio thread, by the apply itself, and refused there. The queue is
best-effort: when it is full an offer is dropped and that `rev` verifies at apply time.
"""

from __future__ import annotations

from typing import Any, Final

import trio

from p2psync.dwn import jws

__all__ = ["PREWARM_BATCH", "PREWARM_QUEUE", "SignaturePrewarmer"]

#: Signatures verified per thread hop: a hop costs tens of microseconds, a verify ~100 us.
PREWARM_BATCH: Final = 64
#: Signatures waiting at most; the sink's own bound on unanswered `rev`s is 1,000 (§12).
PREWARM_QUEUE: Final = 1024
#: The signature members of a message's ``authorization`` that the engine verifies.
_SIGNED: Final = ("signature", "ownerSignature")


def _signatures(message: Any) -> list[tuple[str, str, str]]:
    """(protected, payload, signature) of every General JWS signature ``message`` carries;
    anything malformed is left out (the apply reports it)."""
    authorization = message.get("authorization") if isinstance(message, dict) else None
    if not isinstance(authorization, dict):
        return []
    out: list[tuple[str, str, str]] = []
    for member in _SIGNED:
        jws_object = authorization.get(member)
        if not isinstance(jws_object, dict):
            continue
        payload, entries = jws_object.get("payload"), jws_object.get("signatures")
        if not isinstance(payload, str) or not isinstance(entries, list):
            continue
        for entry in entries:
            if isinstance(entry, dict):
                protected, signature = entry.get("protected"), entry.get("signature")
                if isinstance(protected, str) and isinstance(signature, str):
                    out.append((protected, payload, signature))
    return out


def _verify_batch(batch: list[tuple[str, str, str]]) -> int:
    """On the worker thread: verify each, caching the good ones; returns how many were good."""
    good = 0
    for protected, payload, signature in batch:
        try:
            jws._verify_entry(protected, payload, signature)
        except Exception:  # a bad signature: not cached, the apply refuses it
            continue
        good += 1
    return good


class SignaturePrewarmer:
    """Verifies offered messages' signatures on a worker thread (see the module doc); run
    :meth:`run` in a nursery for as long as offers may come."""

    def __init__(self, *, queue: int = PREWARM_QUEUE, batch: int = PREWARM_BATCH) -> None:
        self._send, self._receive = trio.open_memory_channel[tuple[str, str, str]](queue)
        self.batch = batch
        #: counters for tests and metrics
        self.offered = 0
        self.dropped = 0
        self.verified = 0

    def offer(self, message: Any) -> None:
        """Queue ``message``'s signatures; never waits (a full queue drops them)."""
        for item in _signatures(message):
            try:
                self._send.send_nowait(item)
            except trio.WouldBlock:
                self.dropped += 1
                return
            self.offered += 1

    async def run(self) -> None:
        """Verify batches until cancelled."""
        receive = self._receive
        while True:
            batch = [await receive.receive()]
            while len(batch) < self.batch:
                try:
                    batch.append(receive.receive_nowait())
                except trio.WouldBlock:
                    break
            # abandon_on_cancel: a batch in flight at shutdown only fills a cache.
            self.verified += await trio.to_thread.run_sync(_verify_batch, batch, abandon_on_cancel=True)

    @property
    def pending(self) -> int:
        """Signatures queued and not yet verified."""
        return self._send.statistics().current_buffer_used
