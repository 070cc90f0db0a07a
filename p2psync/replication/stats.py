"""What a sync moved: per-direction counters, progress reports and the final summary."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["SyncProgress", "SyncStats", "SyncSummary"]


@dataclass
class SyncStats:
    """One direction of one collection. A pull counts at the sink (us), a push at the source (us)."""

    items_offered: int = 0
    items_skipped: int = 0  # answered 304 or 413
    echoes_suppressed: int = 0  # push: entries that came from the sink, settled unproposed
    revs_received: int = 0  # sink: `rev`s that arrived
    revs_sent: int = 0  # source: `rev`s sent
    revs_applied: int = 0  # results that made new state (Applied)
    revs_settled: int = 0
    results: dict[str, int] = field(default_factory=dict)
    dependencies_fetched: int = 0
    attachments_fetched: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    latest: int | None = None  # the source's newest log position when the feed opened (pull)
    # messages moved by reconciliation instead of the log (pull: fetched by CID; push: taken
    # by the peer); their results are counted in ``results`` and ``revs_applied`` too
    reconciled: int = 0

    def count_reconciled(self, results: dict[str, int]) -> None:
        for kind, n in results.items():
            self.results[kind] = self.results.get(kind, 0) + n
            self.reconciled += n
        self.revs_applied += results.get("Applied", 0)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class SyncProgress:
    """A progress report for a progress bar (``Peer.sync(on_progress=...)``)."""

    direction: Literal["pull", "push"]
    messages: int  # settled so far
    bytes: int
    items_offered: int
    latest: int | None  # the source's newest position when the feed opened (pull), else None
    position: int | None  # the last position listed so far


@dataclass
class SyncSummary:
    """What one ``Peer.sync`` round did."""

    tenant: str
    remote: str
    pull: SyncStats | None
    push: SyncStats | None
    checkpoint: dict[str, Any]
    copy_rev: str | None
    seconds: float = 0.0
    rounds: int = 1
    state: str = "live"

    @property
    def stats(self) -> SyncStats:
        """The pull stats, or the push stats of a push-only sync."""
        stats = self.pull if self.pull is not None else self.push
        assert stats is not None
        return stats

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tenant": self.tenant,
            "remote": self.remote,
            "seconds": round(self.seconds, 3),
            "rounds": self.rounds,
            "state": self.state,
            "checkpoint": self.checkpoint,
        }
        if self.copy_rev is not None:
            out["copyRev"] = self.copy_rev
        if self.pull is not None:
            out["pull"] = self.pull.to_json()
        if self.push is not None:
            out["push"] = self.push.to_json()
        return out
