"""Progress tokens and progress gaps: where a replica stands in one source's event log.

A ``ProgressToken`` names one entry of one source's event log: ``{streamId, epoch, position,
messageCid}`` (the causal scoped replication RFC, "Progress Token Contract"). Rules kept here:

- ``position`` is a decimal string on the wire, compared as an integer (never as text);
- tokens compare only within one ``(streamId, epoch)`` — their *domain*; comparing across
  domains raises ``ProgressTokenDomainMismatch``;
- a domain is local to the source log that issued it: a token means nothing to any other
  source, which answers it with a ``ProgressGap`` (``stream_mismatch``);
- two tokens at one position of one domain must name the same message; otherwise the source's
  log was rewritten without a new epoch (``ProgressTokenForked``).

``check_token`` decides, for the source side, whether a ``since`` token can be served from a
store's event log, and answers a ``ProgressGap`` (HTTP-like 410) when it cannot. The decision
itself is the pure ``gap_for`` over ``ReplayBounds``, so it can be driven without a store.

Everything here is sans-I/O; the store adapters (``replay_bounds``, ``check_token``,
``read_tokens``) are in :mod:`p2psync.state.log`. Wire forms and examples: ``protocol/replication-state.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, cast

from p2psync.dwn.errors import DwnError
from p2psync.dwn.progress import (
    MAX_DOMAIN_ID_CHARS,
    MAX_POSITION_DIGITS,
    ProgressToken,
    ProgressTokenDomainMismatch,
    ProgressTokenForked,
    ProgressTokenInvalid,
    is_message_cid,
)

__all__ = [
    "GAP_REASONS",
    "MAX_DOMAIN_ID_CHARS",
    "MAX_POSITION_DIGITS",
    "NO_COMPACTION",
    "GapReason",
    "ProgressGap",
    "ProgressGapError",
    "ProgressGapInvalid",
    "ProgressToken",
    "ProgressTokenDomainMismatch",
    "ProgressTokenForked",
    "ProgressTokenInvalid",
    "ReplayBounds",
    "gap_for",
    "is_message_cid",
]

# The compaction floor of a log that was never compacted: every position can be resumed from.
NO_COMPACTION: Final = 0

GapReason: TypeAlias = Literal["token_too_old", "epoch_mismatch", "stream_mismatch"]
#: The three reasons the RFC names for a gap, in the order ``gap_for`` tests them.
GAP_REASONS: Final[tuple[GapReason, ...]] = ("stream_mismatch", "epoch_mismatch", "token_too_old")


# --------------------------------------------------------------------------- errors


class ProgressGapInvalid(DwnError):
    """A ProgressGap received from elsewhere does not have the documented shape."""

    def __init__(self, detail: str) -> None:
        super().__init__("ProgressGapInvalid", detail, 400)


class ProgressGapError(DwnError):
    """A ``since`` token cannot be served: the 410 reply, carrying the gap metadata."""

    def __init__(self, gap: ProgressGap) -> None:
        super().__init__("ProgressGap", f"Progress token gap ({gap.reason})", 410)
        self.gap = gap


# --------------------------------------------------------------------------- gap


@dataclass(frozen=True, slots=True)
class ProgressGap:
    """Why a ``since`` token cannot be resumed from, and what the source can serve instead.

    ``oldest_available``/``latest_available`` are tokens of the source's *current* domain
    (so a consumer learns the new epoch); both are None when the log has no entry at all.
    A consumer answers any gap with repair, never by jumping to ``latest_available``.
    """

    requested: ProgressToken
    oldest_available: ProgressToken | None
    latest_available: ProgressToken | None
    reason: GapReason

    def __post_init__(self) -> None:
        if self.reason not in GAP_REASONS:
            raise ProgressGapInvalid(f"reason must be one of {', '.join(GAP_REASONS)}")

    def to_wire(self) -> dict[str, Any]:
        """The RFC's ``error`` object; absent (not null) available tokens on an empty log."""
        out: dict[str, Any] = {"code": "ProgressGap", "requested": self.requested.to_wire()}
        if self.oldest_available is not None:
            out["oldestAvailable"] = self.oldest_available.to_wire()
        if self.latest_available is not None:
            out["latestAvailable"] = self.latest_available.to_wire()
        out["reason"] = self.reason
        return out

    def to_reply(self) -> dict[str, Any]:
        """The whole 410 reply as the RFC writes it: ``{status, error}``."""
        return {"status": {"code": 410, "detail": "Progress token gap"}, "error": self.to_wire()}

    @classmethod
    def from_wire(cls, obj: Any) -> ProgressGap:
        """Parse the ``error`` object strictly (``ProgressGapInvalid`` / ``ProgressTokenInvalid``)."""
        if not isinstance(obj, Mapping):
            raise ProgressGapInvalid("a progress gap is an object")
        allowed = {"code", "requested", "oldestAvailable", "latestAvailable", "reason"}
        unknown = sorted(str(k) for k in set(obj) - allowed)
        if unknown:
            raise ProgressGapInvalid(f"unknown members: {', '.join(unknown)}")
        if obj.get("code") != "ProgressGap":
            raise ProgressGapInvalid("code must be ProgressGap")
        if "requested" not in obj:
            raise ProgressGapInvalid("requested is required")
        reason = obj.get("reason")
        if reason not in GAP_REASONS:
            raise ProgressGapInvalid(f"reason must be one of {', '.join(GAP_REASONS)}")
        oldest = obj.get("oldestAvailable")
        latest = obj.get("latestAvailable")
        if (oldest is None) != (latest is None):
            raise ProgressGapInvalid("oldestAvailable and latestAvailable come together or not at all")
        return cls(
            requested=ProgressToken.from_wire(obj["requested"]),
            oldest_available=None if oldest is None else ProgressToken.from_wire(oldest),
            latest_available=None if latest is None else ProgressToken.from_wire(latest),
            reason=cast(GapReason, reason),
        )


# --------------------------------------------------------------------------- decision


@dataclass(frozen=True, slots=True)
class ReplayBounds:
    """What one tenant's event log can replay, as the gap decision needs it.

    ``floor``: the compaction horizon. Entries at or below it may have been discarded by
    compaction, so only a token at or above it can be resumed from (the consumer then needs
    entries after its token, all of which are still there). ``NO_COMPACTION`` (0) today:
    entries the engine prunes (superseded writes, purged records) are deletions the
    reference makes too, not compaction, and never make a token too old.
    ``next_position``: the position the log will assign next; no token at or beyond it was
    ever issued by this log.
    """

    stream_id: str
    epoch: str
    next_position: int
    oldest: ProgressToken | None
    latest: ProgressToken | None
    floor: int = NO_COMPACTION


def gap_for(token: ProgressToken, bounds: ReplayBounds, cid_at_position: str | None = None) -> ProgressGap | None:
    """None when ``token`` can be resumed from this log, else the gap to answer.

    ``cid_at_position`` is the CID of the log's entry at ``token.position`` (None when there
    is no such entry, e.g. it was pruned). Tests, in order:

    1. another ``streamId``: ``stream_mismatch``;
    2. another ``epoch``: ``epoch_mismatch``;
    3. a position this log never issued (at or past ``next_position``), or an entry at the
       position naming another message: the log's continuity broke without a new epoch (a
       restore from backup, a copied file); answered as ``epoch_mismatch``, because the RFC
       has no other reason for it and the consumer's remedy (repair) is the same;
    4. a position below the compaction ``floor``: ``token_too_old``.
    """
    reason: GapReason | None = None
    if token.stream_id != bounds.stream_id:
        reason = "stream_mismatch"
    elif token.epoch != bounds.epoch or (
        token.position >= bounds.next_position
        or (cid_at_position is not None and cid_at_position != token.message_cid)
    ):
        reason = "epoch_mismatch"
    elif token.position < bounds.floor:
        reason = "token_too_old"
    if reason is None:
        return None
    return ProgressGap(token, bounds.oldest, bounds.latest, reason)
