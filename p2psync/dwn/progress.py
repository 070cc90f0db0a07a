"""The progress token: one entry of one source's event log, as replication names it.

``{streamId, epoch, position, messageCid}`` (the causal scoped replication RFC, "Progress
Token Contract"). It lives in the engine package because the engine's replicated apply
answers with one (``Applied.position``); everything that orders, stores or checks tokens
(``p2psync.replication.tokens``, the ledger) uses this one class. Wire form and examples:
``protocol/replication-state.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from p2psync.dwn.errors import DwnError

__all__ = [
    "MAX_DOMAIN_ID_CHARS",
    "MAX_POSITION_DIGITS",
    "ProgressToken",
    "ProgressTokenDomainMismatch",
    "ProgressTokenForked",
    "ProgressTokenInvalid",
    "is_message_cid",
]

# 128-bit positions (ULIDs, UUID-ordered backends) need 39 decimal digits; the RFC lets a
# backend use any monotonic integer, so 40 digits admits all of them and bounds the parse.
MAX_POSITION_DIGITS: Final = 40

# Ours: a UUID (our streamId and epoch) is 36 characters; 256 admits any sane identifier of
# another backend and bounds what a peer can make us store per token.
MAX_DOMAIN_ID_CHARS: Final = 256

_POSITION_RE: Final = re.compile(r"0|[1-9][0-9]*")
# Every message CID is CIDv1 dag-cbor sha2-256 in base32: 36 bytes, 59 characters. The header
# bytes 01 71 12 20 fix "bafyrei" and the top two bits of the next character (a-h); 288 bits
# leave two zero bits in the last character (a, e, i, m, q, u, y or 4). A regex checks all of
# it ~20x faster than decoding, which matters at one token per replicated message.
_MESSAGE_CID_RE: Final = re.compile(r"bafyrei[a-h][a-z2-7]{50}[aeimquy4]")
_TOKEN_MEMBERS: Final = frozenset({"streamId", "epoch", "position", "messageCid"})


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

    @classmethod
    def of_own_log(cls, domain: ProgressToken, position: int, message_cid: str) -> ProgressToken:
        """The token of another entry of ``domain``'s log, read from this store's own event log.

        Not checked again: ``domain``'s stream and epoch were checked when it was built, the
        position is the log's integer key and the CID one the engine computed. A page of the
        log builds a token per entry, and the checks cost more than half of building one (~0.9 of
        1.5 µs).
        """
        token = object.__new__(cls)
        setter = object.__setattr__
        setter(token, "stream_id", domain.stream_id)
        setter(token, "epoch", domain.epoch)
        setter(token, "position", position)
        setter(token, "message_cid", message_cid)
        return token

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
