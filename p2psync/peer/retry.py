"""``RetryGate``: what a link's reconnect loop waits on between two attempts.

A link that keeps failing waits longer and longer (1 s doubling, up to 5 minutes: the ledger's
schedule). That is right for a peer that is away, and wrong the moment it comes back: a device
that returns would wait out whatever the backoff had reached. The gate keeps the wait
interruptible: whoever learns that the peer is back (an inbound connection from it, its mDNS
advert; p2psync/node) calls :meth:`RetryGate.peer_back`, and the wait ends within a small
random jitter, so a fleet that sees one node return does not dial it all in the same
millisecond. The gate also says whether a wait is under way and until when (``p2psync
status`` shows it).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

import trio

from p2psync.state.ledger import retry_delay

__all__ = ["BACK_JITTER", "BACK_VALID", "RetryGate", "ledger_schedule"]

#: The longest a link waits after its peer came back: a random 0–1 s spreads a fleet's dials
#: (ten nodes land ~100 ms apart) and still starts the catch-up "within a second or two".
BACK_JITTER: Final = 1.0
#: A "peer is back" heard while no wait is under way (the attempt is still failing) shortens
#: the next wait, if it starts within this many seconds; later, it is old news. Ours: an attempt
#: against a peer that just restarted fails within a connect timeout of a few seconds.
BACK_VALID: Final = 10.0


def ledger_schedule(failures: int) -> float:
    """The ledger's backoff in seconds after ``failures`` consecutive failures (1 s doubling,
    capped at 5 minutes)."""
    return retry_delay(failures).total_seconds()


class RetryGate:
    """The backoff of one link: its schedule, the wait in progress, and a way to end it early.

    ``schedule``: seconds to wait after n failures, before jitter (default: the ledger's);
    ``jitter``: the most :meth:`peer_back` leaves of a wait. Waits use the trio clock.
    """

    def __init__(
        self,
        *,
        schedule: Callable[[int], float] = ledger_schedule,
        jitter: float = BACK_JITTER,
        rng: random.Random | None = None,
    ) -> None:
        self.schedule = schedule
        self.jitter = jitter
        self._rng = rng or random.Random()
        #: trio time the wait under way ends; None while no wait is under way
        self.until: float | None = None
        self._changed = trio.Event()
        self._back_at: float | None = None  # when peer_back was heard outside a wait

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failures: the schedule with equal jitter
        (half fixed, half random: never a synchronized herd)."""
        return self.schedule(failures) * (0.5 + self._rng.random() / 2)

    async def wait(self, delay: float) -> None:
        """Sleep ``delay`` seconds, less if the peer comes back (or :meth:`now` is called)."""
        now = trio.current_time()
        if self._back_at is not None and now - self._back_at <= BACK_VALID:
            delay = min(delay, self._rng.random() * self.jitter)
        self._back_at = None
        self.until = now + delay
        try:
            while trio.current_time() < self.until:
                changed = self._changed
                with trio.move_on_at(self.until):
                    await changed.wait()
        finally:
            self.until = None

    def peer_back(self) -> bool:
        """The peer is back: end the wait under way within ``jitter`` (or shorten the next one,
        if it starts soon). Returns whether a wait was cut short."""
        now = trio.current_time()
        if self.until is None:
            self._back_at = now
            return False
        soon = now + self._rng.random() * self.jitter
        if soon >= self.until:
            return False
        self.until = soon
        self._fire()
        return True

    def now(self) -> None:
        """End the wait under way at once (an operator's "sync now")."""
        if self.until is not None:
            self.until = trio.current_time()
            self._fire()

    def _fire(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
