"""What a peer tells an observer while it replicates (for metrics; see p2psync/node/metrics.py).

The peer calls these at a few points of its hot path, so an observer must be cheap and must
never raise. The default, :data:`NO_OBSERVER`, does nothing. Link states, checkpoints and
links entering ``repairing`` are not reported here: they are ledger events
(``Ledger.add_listener``) and ledger rows, read where they are needed. What a repair moved is
(:meth:`SyncObserver.gap_repaired`): the ledger does not know it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

from p2psync.dwn.replication_types import DependencyRef

__all__ = ["NO_OBSERVER", "NoObserver", "SyncObserver"]


class SyncObserver(Protocol):
    """Receives the peer's apply-side events (both roles: a `rev` is applied by whichever side
    is the sink of its direction)."""

    def rev_started(self) -> float:
        """A `rev` arrived; returns an opaque start mark handed back to :meth:`rev_finished`."""
        ...

    def rev_finished(self, started: float, kind: str) -> None:
        """That `rev` was answered (its apply durable) or failed; ``kind`` is the
        ReplicationApplyResult kind (``Applied``, ``Duplicate``, ...) or ``Error``."""
        ...

    def dependencies_missing(self, refs: Sequence[DependencyRef]) -> None:
        """The closure loop asks the source for these dependencies (they are not here)."""
        ...

    def closure_failed(self, code: str) -> None:
        """A closure ended without a hard dependency it needs (``code``: the strict-closure
        RFC's, e.g. ``ClosureParentChainMissing``); its root stays unapplied."""
        ...

    def push_refused(self, tenant: str, remote: str) -> None:
        """A push (``proposeChanges``, a take, grants brought in ``getCollections``) for a tenant
        this peer does not store was refused (``403 PushRefused``)."""
        ...

    def quota_refused(self, kind: str, tenant: str) -> None:
        """A quota of this store refused something of ``tenant`` (issue #15): a request, a
        `rev`, or the rest of a listing; ``kind`` is ``tenant`` (``507 TenantQuotaExceeded``)
        or ``peer`` (``429 PeerQuotaExceeded``)."""
        ...

    def gap_repaired(self, reason: str, fetched: int, taken: int) -> None:
        """A round reconciled instead of replaying (``reason``: ``progress_gap``,
        ``never_linked``, ``checkpoint_mismatch``), fetching ``fetched`` messages and handing
        over ``taken`` (protocol/anti-entropy.md §7)."""
        ...


class NoObserver:
    """The observer of a peer nobody watches."""

    def rev_started(self) -> float:
        return 0.0

    def rev_finished(self, started: float, kind: str) -> None:
        return None

    def dependencies_missing(self, refs: Sequence[DependencyRef]) -> None:
        return None

    def closure_failed(self, code: str) -> None:
        return None

    def push_refused(self, tenant: str, remote: str) -> None:
        return None

    def quota_refused(self, kind: str, tenant: str) -> None:
        return None

    def gap_repaired(self, reason: str, fetched: int, taken: int) -> None:
        return None


NO_OBSERVER: Final[SyncObserver] = NoObserver()
