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

Everything here is sans-I/O except the two store adapters (``replay_bounds``, ``check_token``),
which only read. Wire forms and examples: ``protocol/replication-state.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, cast

from p2psync.dwn.errors import DwnError
from p2psync.dwn.store import Store

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
    "check_token",
    "gap_for",
    "is_message_cid",
    "read_tokens",
    "replay_bounds",
]

# 128-bit positions (ULIDs, UUID-ordered backends) need 39 decimal digits; the RFC lets a
# backend use any monotonic integer, so 40 digits admits all of them and bounds the parse.
MAX_POSITION_DIGITS: Final = 40

# Ours: a UUID (our streamId and epoch) is 36 characters; 256 admits any sane identifier of
# another backend and bounds what a peer can make us store per token.
MAX_DOMAIN_ID_CHARS: Final = 256

# The compaction floor of a log that was never compacted: every position can be resumed from.
NO_COMPACTION: Final = 0

_POSITION_RE: Final = re.compile(r"0|[1-9][0-9]*")
# Every message CID is CIDv1 dag-cbor sha2-256 in base32: 36 bytes, 59 characters. The header
# bytes 01 71 12 20 fix "bafyrei" and the top two bits of the next character (a-h); 288 bits
# leave two zero bits in the last character (a, e, i, m, q, u, y or 4). A regex checks all of
# it ~20x faster than decoding, which matters at one token per replicated message.
_MESSAGE_CID_RE: Final = re.compile(r"bafyrei[a-h][a-z2-7]{50}[aeimquy4]")
_TOKEN_MEMBERS: Final = frozenset({"streamId", "epoch", "position", "messageCid"})

GapReason: TypeAlias = Literal["token_too_old", "epoch_mismatch", "stream_mismatch"]
#: The three reasons the RFC names for a gap, in the order ``gap_for`` tests them.
GAP_REASONS: Final[tuple[GapReason, ...]] = ("stream_mismatch", "epoch_mismatch", "token_too_old")


def is_message_cid(text: str) -> bool:
    """Whether ``text`` is a canonical message CID string (also the form of every recordId)."""
    return _MESSAGE_CID_RE.fullmatch(text) is not None


# --------------------------------------------------------------------------- errors


class ProgressTokenInvalid(DwnError):
    """A token (or a gap) received from elsewhere does not have the documented shape."""

    def __init__(self, detail: str) -> None:
        super().__init__("ProgressTokenInvalid", detail, 400)


class ProgressTokenDomainMismatch(DwnError):
    """Two tokens of different ``(streamId, epoch)`` were compared; they have no order."""

    def __init__(self, a: ProgressToken, b: ProgressToken) -> None:
        super().__init__(
            "ProgressTokenDomainMismatch",
            f"tokens of stream {a.stream_id}/{a.epoch} and {b.stream_id}/{b.epoch} cannot be compared",
            400,
        )
        self.tokens = (a, b)


class ProgressTokenForked(DwnError):
    """Two tokens share a domain and a position but name different messages.

    A source never emits two entries at one position, so this means its log was rewritten
    (a restore from backup, a copied store) without the new epoch the RFC requires.
    """

    def __init__(self, a: ProgressToken, b: ProgressToken) -> None:
        super().__init__(
            "ProgressTokenForked",
            f"position {a.position} of stream {a.stream_id}/{a.epoch} names both {a.message_cid} and {b.message_cid}",
            409,
        )
        self.tokens = (a, b)


class ProgressGapInvalid(DwnError):
    """A ProgressGap received from elsewhere does not have the documented shape."""

    def __init__(self, detail: str) -> None:
        super().__init__("ProgressGapInvalid", detail, 400)


class ProgressGapError(DwnError):
    """A ``since`` token cannot be served: the 410 reply, carrying the gap metadata."""

    def __init__(self, gap: ProgressGap) -> None:
        super().__init__("ProgressGap", f"Progress token gap ({gap.reason})", 410)
        self.gap = gap


# --------------------------------------------------------------------------- token


def _domain_id(value: Any, member: str) -> str:
    if not isinstance(value, str):
        raise ProgressTokenInvalid(f"{member} must be a string")
    if not value or len(value) > MAX_DOMAIN_ID_CHARS:
        raise ProgressTokenInvalid(f"{member} must be 1 to {MAX_DOMAIN_ID_CHARS} characters")
    return value


@dataclass(frozen=True, slots=True)
class ProgressToken:
    """One entry of one source's event log (the RFC's ``ProgressToken``).

    ``position`` is held as a Python int (arbitrary precision, so BigInt-safe) and travels as
    its canonical decimal string. Construction validates every member, so any instance is
    well-formed. ``==`` compares all four members; ``<``/``<=``/``>``/``>=`` and ``compare``
    order by position within one domain and raise across domains.
    """

    stream_id: str
    epoch: str
    position: int
    message_cid: str

    def __post_init__(self) -> None:
        _domain_id(self.stream_id, "streamId")
        _domain_id(self.epoch, "epoch")
        if type(self.position) is not int or self.position < 0:
            raise ProgressTokenInvalid("position must be a non-negative integer")
        if self.position >= 10**MAX_POSITION_DIGITS:
            raise ProgressTokenInvalid(f"position has more than {MAX_POSITION_DIGITS} digits")
        if not isinstance(self.message_cid, str):
            raise ProgressTokenInvalid("messageCid must be a string")
        if not is_message_cid(self.message_cid):
            raise ProgressTokenInvalid("messageCid must be a message CID (CIDv1, dag-cbor, sha2-256, base32)")

    # -- domain and order ------------------------------------------------------------------

    @property
    def domain(self) -> tuple[str, str]:
        """``(streamId, epoch)``: the log generation this token's position belongs to."""
        return (self.stream_id, self.epoch)

    def same_domain(self, other: ProgressToken) -> bool:
        return self.stream_id == other.stream_id and self.epoch == other.epoch

    def compare(self, other: ProgressToken) -> int:
        """-1, 0 or 1 by position; raises across domains and on a forked position."""
        if not self.same_domain(other):
            raise ProgressTokenDomainMismatch(self, other)
        if self.position == other.position:
            if self.message_cid != other.message_cid:
                raise ProgressTokenForked(self, other)
            return 0
        return -1 if self.position < other.position else 1

    def __lt__(self, other: ProgressToken) -> bool:
        return self.compare(other) < 0

    def __le__(self, other: ProgressToken) -> bool:
        return self.compare(other) <= 0

    def __gt__(self, other: ProgressToken) -> bool:
        return self.compare(other) > 0

    def __ge__(self, other: ProgressToken) -> bool:
        return self.compare(other) >= 0

    # -- wire ------------------------------------------------------------------------------

    def to_wire(self) -> dict[str, str]:
        """The JSON/CBOR object: four strings, the position as canonical decimal."""
        return {
            "streamId": self.stream_id,
            "epoch": self.epoch,
            "position": str(self.position),
            "messageCid": self.message_cid,
        }

    @classmethod
    def from_wire(cls, obj: Any) -> ProgressToken:
        """Parse the wire object strictly.

        Refused (``ProgressTokenInvalid``): a non-object, a missing or unknown member, a
        non-string member, an empty or over-long ``streamId``/``epoch``, a ``position`` that is
        not canonical decimal (sign, spaces, leading zeros, non-ASCII digits) or has more than
        ``MAX_POSITION_DIGITS`` digits, a ``messageCid`` that is not a CIDv1 string. Unknown
        members are refused rather than dropped: a resume must send back the exact token.
        """
        if not isinstance(obj, Mapping):
            raise ProgressTokenInvalid("a progress token is an object")
        keys = set(obj)
        missing = sorted(_TOKEN_MEMBERS - keys)
        if missing:
            raise ProgressTokenInvalid(f"progress token lacks {', '.join(missing)}")
        unknown = sorted(str(k) for k in keys - _TOKEN_MEMBERS)
        if unknown:
            raise ProgressTokenInvalid(f"progress token has unknown members {', '.join(unknown)}")
        position = obj["position"]
        if not isinstance(position, str):
            raise ProgressTokenInvalid("position must be a decimal string")
        if len(position) > MAX_POSITION_DIGITS or _POSITION_RE.fullmatch(position) is None:
            raise ProgressTokenInvalid(
                f"position must be a canonical decimal string of at most {MAX_POSITION_DIGITS} digits"
            )
        return cls(
            stream_id=_domain_id(obj["streamId"], "streamId"),
            epoch=_domain_id(obj["epoch"], "epoch"),
            position=int(position),
            message_cid=cast(str, obj["messageCid"]),
        )

    @classmethod
    def coerce(cls, value: object) -> ProgressToken:
        """A ``ProgressToken`` from a token, its wire object, or any object with the same
        four attributes (such as the engine's ``replication_types.ProgressToken``)."""
        if isinstance(value, ProgressToken):
            return value
        if isinstance(value, Mapping):
            return cls.from_wire(value)
        duck: Any = value
        try:
            return cls(duck.stream_id, duck.epoch, duck.position, duck.message_cid)
        except AttributeError:
            raise ProgressTokenInvalid(f"cannot read a progress token from {type(value).__name__}") from None

    def __repr__(self) -> str:
        return f"ProgressToken({self.stream_id}/{self.epoch}@{self.position} {self.message_cid})"


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


# --------------------------------------------------------------------------- store adapters
#
# The engine's EventLog has no "bounds" call yet (the RFC's Gate A asks for one: oldest and
# latest per tenant stream), so the two figures it lacks are read from its tables directly.
# Read-only; replace with EventLog methods when the store grows them.


def replay_bounds(store: Store, tenant: str, floor: int = NO_COMPACTION) -> ReplayBounds | None:
    """The replay bounds of ``tenant``'s log, or None when this store has no log for it.

    Never creates the tenant: a remote asking about a tenant we do not hold must not make us
    allocate a stream for it.
    """
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return None
    stream_id, epoch = store.events.stream(tenant)
    next_position = int(store.scalar("SELECT next_position FROM tenants WHERE id=?", (tid,)))
    first = store.events.read(tenant, after=-1, limit=1)
    last = store.conn.execute(
        "SELECT position, cid FROM events WHERE tenant=? ORDER BY position DESC LIMIT 1", (tid,)
    ).fetchone()
    return ReplayBounds(
        stream_id=stream_id,
        epoch=epoch,
        next_position=next_position,
        oldest=ProgressToken(stream_id, epoch, first[0][0], first[0][1]) if first else None,
        latest=None if last is None else ProgressToken(stream_id, epoch, int(last[0]), str(last[1])),
        floor=floor,
    )


def _cid_at(store: Store, tenant: str, position: int) -> str | None:
    entries = store.events.read(tenant, after=position - 1, limit=1)
    return entries[0][1] if entries and entries[0][0] == position else None


def check_token(store: Store, tenant: str, token: ProgressToken, floor: int = NO_COMPACTION) -> ProgressGap | None:
    """Whether ``token`` (a consumer's ``since``) can be served from ``tenant``'s log here.

    None: replay every entry after ``token.position``. A ``ProgressGap`` otherwise; a tenant
    this store holds no log for answers ``stream_mismatch`` with no available tokens.
    ``floor`` is the log's compaction horizon (``NO_COMPACTION``: we never compact yet).
    """
    bounds = replay_bounds(store, tenant, floor)
    if bounds is None:
        return ProgressGap(token, None, None, "stream_mismatch")
    same_domain = token.domain == (bounds.stream_id, bounds.epoch)
    cid = _cid_at(store, tenant, token.position) if same_domain and token.position < bounds.next_position else None
    return gap_for(token, bounds, cid)


def read_tokens(
    store: Store, tenant: str, since: ProgressToken | None, limit: int | None = None
) -> list[ProgressToken]:
    """The source side of a pull: tokens of the entries after ``since`` (all when None).

    Raises ``ProgressGapError`` (410) when ``since`` cannot be served.
    """
    if since is not None:
        gap = check_token(store, tenant, since)
        if gap is not None:
            raise ProgressGapError(gap)
    if store.tenant_id(tenant, create=False) is None:
        return []
    stream_id, epoch = store.events.stream(tenant)
    after = since.position if since is not None else -1
    return [ProgressToken(stream_id, epoch, p, c) for p, c in store.events.read(tenant, after=after, limit=limit)]
