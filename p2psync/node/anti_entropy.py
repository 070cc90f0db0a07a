"""The node's periodic anti-entropy check of a link: when it runs, and what its outcome was.

Every link the node runs gets, once one of its rounds has caught up, a periodic
``Peer.reconcile(..., repair=True)`` in the link's direction (p2psync/peer/anti_entropy.py):
the backstop that finds and moves what the log sync missed (a message stored without a log
entry, a store restored from a backup, a bug). The node (p2psync/node/node.py) runs the loop;
this module holds its pure parts, so each rule is testable on its own:

- :class:`AntiEntropySchedule`: the wait before the next check, from the base interval with
  uniform jitter, doubling while nothing is found (up to a cap) and back to the base when a
  difference is found or the link reconnects;
- :func:`check_result`: a :class:`~p2psync.peer.anti_entropy.ReconcileSummary` read in the
  link's direction as one of :data:`OUTCOMES`;
- :class:`AntiEntropyStatus`: the last check and the next one, as the status file shows them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from p2psync.node.config import Direction
from p2psync.peer.anti_entropy import ReconcileSummary
from p2psync.peer.repair import REPAIRED
from p2psync.replication.sink import HELD_KINDS

__all__ = [
    "CHECK_TIMEOUT",
    "OUTCOMES",
    "AntiEntropySchedule",
    "AntiEntropyStatus",
    "CheckOutcome",
    "CheckResult",
    "check_result",
]

CheckOutcome = Literal["equal", "repaired", "unresolved", "failed"]
#: A check's outcomes (the ``outcome`` label of ``sync_antientropy_rounds_total``):
#: ``equal`` nothing to move in the link's direction; ``repaired`` what was missing was moved;
#: ``unresolved`` something found could not be moved (see the status's detail); ``failed`` the
#: check did not complete (the peer down, a refusal, a timeout).
OUTCOMES: Final[tuple[CheckOutcome, ...]] = ("equal", "repaired", "unresolved", "failed")
#: A check that takes longer than this is abandoned (``failed``) and runs again at the next
#: period; what it fetched so far is kept. A check of equal replicas is one round trip, and a
#: repair moves only the difference: ten minutes is a difference of many thousand messages.
CHECK_TIMEOUT: Final = 600.0


class AntiEntropySchedule:
    """The waits between one link's checks.

    The *interval* starts at ``interval``; each wait is drawn uniformly from ``interval × (1 ±
    jitter)``, never above ``max_interval`` (so many links started together spread out). A check
    that found nothing to move (or only what could not be moved) doubles the interval, up to
    ``max_interval``; one that moved something, or the link reconnecting, brings it back to
    ``interval``; a failed check leaves it as it was (the next period retries).
    """

    def __init__(self, interval: float, jitter: float, max_interval: float, rng: random.Random) -> None:
        if not (0 < interval <= max_interval and 0 <= jitter < 1):
            raise ValueError("need 0 < interval <= max_interval and 0 <= jitter < 1")
        self.base = interval
        self.jitter = jitter
        self.max_interval = max_interval
        self.interval = interval
        self._rng = rng

    def delay(self) -> float:
        """Seconds to wait before the next check."""
        low = self.interval * (1 - self.jitter)
        high = min(self.interval * (1 + self.jitter), self.max_interval)
        return self._rng.uniform(low, high)

    def after(self, outcome: CheckOutcome) -> None:
        """Adjust the interval to a check's outcome."""
        if outcome == "repaired":
            self.reset()
        elif outcome in ("equal", "unresolved"):
            self.interval = min(self.interval * 2, self.max_interval)

    def reset(self) -> None:
        """Back to the base interval (the link reconnected, or a difference was found)."""
        self.interval = self.base


@dataclass(frozen=True)
class CheckResult:
    """One check as the node counts it. ``local_lacks``/``remote_lacks``: the differences found
    (before the repair) on the sides the link's direction moves: what this replica lacks for a
    pulling link, what the peer lacks for a pushing one."""

    outcome: CheckOutcome
    local_lacks: int = 0
    remote_lacks: int = 0
    round_trips: int = 0
    bytes: int = 0
    detail: str | None = None  # why unresolved, or the failure's one line


def check_result(summary: ReconcileSummary, direction: Direction) -> CheckResult:
    """Read a ``reconcile(..., repair=True, direction=direction)`` as a :class:`CheckResult`.

    A one-way link answers only for its side: a pulling link whose peer lacks what this node
    holds is ``equal`` (moving it is not this link's job, and the reconcile reports the sets
    unequal), a pushing link ignores what this node lacks.
    """
    pull, push = direction in ("pull", "both"), direction in ("push", "both")
    local_lacks = len(summary.remote_only) if pull else 0
    remote_lacks = len(summary.local_only) if push else 0
    outcome, detail = _outcome(summary, direction, local_lacks, remote_lacks)
    return CheckResult(outcome, local_lacks, remote_lacks, summary.round_trips, summary.bytes, detail)


def _outcome(summary: ReconcileSummary, direction: Direction, local_lacks: int,
             remote_lacks: int) -> tuple[CheckOutcome, str | None]:
    found = local_lacks + remote_lacks
    if direction == "both":
        if summary.equal:
            return ("repaired" if found else "equal"), None
        return "unresolved", summary.unresolved or "the sets still differ"
    if not found:
        return "equal", None
    unsettled: dict[str, int] = {}
    if local_lacks:  # a pulling link: what it fetched
        fetched = summary.fetched
        if fetched is None:
            unsettled["not fetched"] = local_lacks
        else:
            unsettled.update(fetched.reasons())
            missing = local_lacks - sum(1 for o in fetched.outcomes if o.status in REPAIRED)
            if missing > 0 and not unsettled:
                unsettled["not fetched"] = missing
    if remote_lacks:  # a pushing link: what the peer took
        for kind, n in summary.pushed.items():
            if kind not in HELD_KINDS:
                unsettled[kind] = unsettled.get(kind, 0) + n
        missing = remote_lacks - sum(n for kind, n in summary.pushed.items() if kind in HELD_KINDS)
        if missing > 0 and not unsettled:
            unsettled["not taken"] = missing
    if not unsettled:
        return "repaired", None
    return "unresolved", ", ".join(f"{n} {why}" for why, n in sorted(unsettled.items()))


@dataclass
class AntiEntropyStatus:
    """A link's anti-entropy as ``p2psync peers`` and the status file show it."""

    enabled: bool = True
    checks: int = 0
    last_at: datetime | None = None
    last: CheckResult | None = None
    next_at: datetime | None = None  # None: not scheduled (before the link's first caught-up round)
    running: bool = False  # a check is under way
    interval: float | None = None  # the current base of the waits, seconds
    off_reason: str | None = None  # why a link has none while the node's setting is on

    def to_json(self) -> dict[str, Any]:
        last = self.last
        out: dict[str, Any] = {
            "enabled": self.enabled,
            "checks": self.checks,
            "lastCheck": None if self.last_at is None else self.last_at.isoformat(),
            "outcome": None if last is None else last.outcome,
            "nextCheck": None if self.next_at is None else self.next_at.isoformat(),
            "running": self.running,
            "interval": None if self.interval is None else round(self.interval, 1),
        }
        if self.off_reason is not None:
            out["offReason"] = self.off_reason
        if last is not None:
            out["localLacks"] = last.local_lacks
            out["remoteLacks"] = last.remote_lacks
            out["roundTrips"] = last.round_trips
            out["bytes"] = last.bytes
            if last.detail is not None:
                out["detail"] = last.detail
        return out
