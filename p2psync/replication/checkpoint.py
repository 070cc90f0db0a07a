"""One direction's replication checkpoint and the mark-applied algorithm (sans-I/O).

A ``DirectionCheckpoint`` is the RFC's durable progress of one direction (pull or push) of
one link, in one source's token domain:

- ``receivedToken``: the highest token received from the source;
- ``contiguousAppliedToken``: the highest token T such that every token received up to T has
  been applied. The only legal resume point (``since``) after a restart;
- ``pendingTokens``: received beyond the contiguous frontier and already applied (applied out
  of order: the "sparse progression"); at most ``MAX_PENDING_TOKENS``;
- ``unappliedTokens`` (ours): received beyond the frontier and not yet applied (in flight, or
  blocked on dependencies); at most ``MAX_UNAPPLIED_TOKENS``.

Why the fourth list: positions are not adjacent (the RFC forbids assuming ``+1``; pruned log
entries leave holes), so the frontier can only be computed from *which* tokens beyond it were
received and which of those are applied. With both lists the document alone determines the
next state, restarts included, and ``contiguousAppliedToken`` is exact (after a pending
overflow it is conservative, never ahead, until the link's repair resets it).

Every transition is a pure function returning a new checkpoint; the ledger persists them.
The invariants (checked on construction, so every instance and every parsed document
satisfies them):

1. all tokens share one ``(streamId, epoch)``;
2. ``contiguous <= received``; both lists strictly ascending, disjoint, in ``(contiguous, received]``;
3. the lowest token beyond the frontier is unapplied (else the frontier would move past it);
   with nothing unapplied, nothing is pending and ``contiguous == received``.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from p2psync.dwn.encoding import compute_cid
from p2psync.dwn.errors import DwnError
from p2psync.replication.tokens import ProgressToken, ProgressTokenDomainMismatch

__all__ = [
    "Direction",
    "LinkState",
    "checkpoint_id",
    "MAX_PENDING_TOKENS",
    "MAX_UNAPPLIED_TOKENS",
    "CheckpointInvalid",
    "CheckpointPendingOverflow",
    "CheckpointTokenNotReceived",
    "DirectionCheckpoint",
]

# The RFC: "pendingTokens MUST NOT exceed 100 entries; on overflow, the link MUST transition
# to repairing".
MAX_PENDING_TOKENS: Final = 100
# Ours, the same bound for the other half of the window beyond the frontier: a link with more
# than 100 messages in flight or blocked is not live, it needs repair; and a checkpoint
# document stays under ~35 KB (about 170 bytes a token), cheap to rewrite on every commit.
MAX_UNAPPLIED_TOKENS: Final = 100

_MEMBERS: Final = frozenset({"receivedToken", "contiguousAppliedToken", "pendingTokens", "unappliedTokens"})


class CheckpointInvalid(DwnError):
    """A checkpoint document violates its shape or its invariants."""

    def __init__(self, detail: str) -> None:
        super().__init__("CheckpointInvalid", detail, 400)


class CheckpointTokenNotReceived(DwnError):
    """``applied`` was told of a token that was never recorded as received."""

    def __init__(self, token: ProgressToken) -> None:
        super().__init__("CheckpointTokenNotReceived", f"{token!r} was applied before it was received", 400)
        self.token = token


class CheckpointPendingOverflow(DwnError):
    """More than ``MAX_UNAPPLIED_TOKENS`` would be unapplied: the token was not recorded and
    the link must repair (the ledger moves it to ``repairing``)."""

    def __init__(self, token: ProgressToken) -> None:
        super().__init__(
            "CheckpointPendingOverflow",
            f"{MAX_UNAPPLIED_TOKENS} tokens are already unapplied; {token!r} not recorded",
            409,
        )
        self.token = token


def _position(token: ProgressToken) -> int:
    return token.position


def _index(tokens: Sequence[ProgressToken], token: ProgressToken) -> int | None:
    """Where ``token`` sits in an ascending list (None when absent); raises on a fork."""
    i = bisect.bisect_left(tokens, token.position, key=_position)
    if i < len(tokens) and tokens[i].position == token.position:
        tokens[i].compare(token)  # same position: same message, or ProgressTokenForked
        return i
    return None


def _insert(tokens: tuple[ProgressToken, ...], token: ProgressToken) -> tuple[ProgressToken, ...]:
    i = bisect.bisect_left(tokens, token.position, key=_position)
    return (*tokens[:i], token, *tokens[i:])


@dataclass(frozen=True, slots=True)
class DirectionCheckpoint:
    """The progress of one direction of one link. Immutable; transitions return new values."""

    received_token: ProgressToken | None = None
    contiguous_applied_token: ProgressToken | None = None
    pending_tokens: tuple[ProgressToken, ...] = ()
    unapplied_tokens: tuple[ProgressToken, ...] = ()

    def __post_init__(self) -> None:
        received, contiguous = self.received_token, self.contiguous_applied_token
        pending, unapplied = self.pending_tokens, self.unapplied_tokens
        if not isinstance(pending, tuple) or not isinstance(unapplied, tuple):
            raise CheckpointInvalid("token lists must be tuples")
        everything = [t for t in (received, contiguous, *pending, *unapplied) if t is not None]
        for t in everything:
            if not isinstance(t, ProgressToken):
                raise CheckpointInvalid("checkpoint members must be ProgressTokens")
            if not t.same_domain(everything[0]):
                raise CheckpointInvalid("checkpoint tokens must share one (streamId, epoch)")
        if len(pending) > MAX_PENDING_TOKENS:
            raise CheckpointInvalid(f"more than {MAX_PENDING_TOKENS} pendingTokens")
        if len(unapplied) > MAX_UNAPPLIED_TOKENS:
            raise CheckpointInvalid(f"more than {MAX_UNAPPLIED_TOKENS} unappliedTokens")
        if received is None:
            if everything:
                raise CheckpointInvalid("a checkpoint with tokens has a receivedToken")
            return
        if contiguous is not None and contiguous > received:
            raise CheckpointInvalid("contiguousAppliedToken is past receivedToken")
        for name, tokens in (("pendingTokens", pending), ("unappliedTokens", unapplied)):
            for a, b in zip(tokens, tokens[1:], strict=False):
                if not a < b:
                    raise CheckpointInvalid(f"{name} must be strictly ascending")
            if tokens and (tokens[-1] > received or (contiguous is not None and tokens[0] <= contiguous)):
                raise CheckpointInvalid(f"{name} must lie after contiguousAppliedToken and up to receivedToken")
        if {t.position for t in pending} & {t.position for t in unapplied}:
            raise CheckpointInvalid("a token cannot be both pending and unapplied")
        if not unapplied:
            if pending or contiguous != received:
                raise CheckpointInvalid("with nothing unapplied, contiguousAppliedToken equals receivedToken")
        elif pending and pending[0] < unapplied[0]:
            raise CheckpointInvalid("the lowest token past the frontier must be unapplied")

    @classmethod
    def _derived(
        cls,
        received: ProgressToken | None,
        contiguous: ProgressToken | None,
        pending: tuple[ProgressToken, ...],
        unapplied: tuple[ProgressToken, ...],
    ) -> DirectionCheckpoint:
        """A checkpoint computed by a transition from a valid one: it keeps the invariants by
        construction (the property tests re-check every step), so skip the O(n) validation
        that would otherwise dominate a step with many tokens in flight."""
        out = object.__new__(cls)
        object.__setattr__(out, "received_token", received)
        object.__setattr__(out, "contiguous_applied_token", contiguous)
        object.__setattr__(out, "pending_tokens", pending)
        object.__setattr__(out, "unapplied_tokens", unapplied)
        return out

    # -- queries ---------------------------------------------------------------------------

    @property
    def domain(self) -> tuple[str, str] | None:
        """``(streamId, epoch)`` of the tokens, None for an empty checkpoint."""
        return None if self.received_token is None else self.received_token.domain

    @property
    def is_empty(self) -> bool:
        return self.received_token is None

    def resume_token(self) -> ProgressToken | None:
        """The ``since`` to resume from: ``contiguousAppliedToken`` (None: from the start)."""
        return self.contiguous_applied_token

    def _check_domain(self, token: ProgressToken) -> None:
        if self.received_token is not None and not token.same_domain(self.received_token):
            raise ProgressTokenDomainMismatch(self.received_token, token)

    def _beyond_frontier(self, token: ProgressToken) -> bool:
        c = self.contiguous_applied_token
        return c is None or token > c  # ``>`` also checks a same-position token for a fork

    # -- transitions -----------------------------------------------------------------------

    def received(self, token: ProgressToken) -> DirectionCheckpoint:
        """Record that ``token`` was received (taken up for apply). Idempotent.

        A token at or below the frontier, or already tracked, changes nothing (duplicate
        delivery). A token past ``receivedToken`` becomes the new ``receivedToken`` and
        unapplied. One between the frontier and ``receivedToken`` that is not tracked (a
        re-delivery of one whose pending entry was dropped on overflow) is tracked again as
        unapplied, which is always safe. Raises ``ProgressTokenDomainMismatch`` for another
        domain, ``ProgressTokenForked`` for another message at a known position, and
        ``CheckpointPendingOverflow`` when the unapplied list is full.
        """
        self._check_domain(token)
        if not self._beyond_frontier(token):
            return self
        if _index(self.pending_tokens, token) is not None or _index(self.unapplied_tokens, token) is not None:
            return self
        received = self.received_token
        if len(self.unapplied_tokens) >= MAX_UNAPPLIED_TOKENS:
            raise CheckpointPendingOverflow(token)
        new_received = token if received is None or token > received else received
        return DirectionCheckpoint._derived(
            new_received, self.contiguous_applied_token, self.pending_tokens, _insert(self.unapplied_tokens, token)
        )

    def applied(self, token: ProgressToken) -> tuple[DirectionCheckpoint, bool]:
        """Record that ``token`` was applied; returns (new checkpoint, overflowed).

        Moves the frontier over every token that is now applied with nothing unapplied below
        it. ``overflowed`` is True when more than ``MAX_PENDING_TOKENS`` would be pending: the
        highest are dropped (forgetting an applied token only makes the frontier wait for its
        re-delivery, never skip anything) and the link must go to ``repairing``. A token at or
        below the frontier, or already pending, is a no-op; one never received raises
        ``CheckpointTokenNotReceived``.
        """
        self._check_domain(token)
        if not self._beyond_frontier(token) or _index(self.pending_tokens, token) is not None:
            return self, False
        i = _index(self.unapplied_tokens, token)
        if i is None:
            raise CheckpointTokenNotReceived(token)
        unapplied = self.unapplied_tokens[:i] + self.unapplied_tokens[i + 1 :]
        applied = _insert(self.pending_tokens, token)
        if not unapplied:
            return DirectionCheckpoint._derived(self.received_token, self.received_token, (), ()), False
        # Everything applied below the lowest unapplied token joins the contiguous prefix.
        cut = bisect.bisect_left(applied, unapplied[0].position, key=_position)
        contiguous = applied[cut - 1] if cut else self.contiguous_applied_token
        pending = applied[cut:]
        overflowed = len(pending) > MAX_PENDING_TOKENS
        if overflowed:
            pending = pending[:MAX_PENDING_TOKENS]
        return DirectionCheckpoint._derived(self.received_token, contiguous, pending, unapplied), overflowed

    def settled(self, token: ProgressToken) -> DirectionCheckpoint | None:
        """``received(token)`` then ``applied(token)`` where that is simply the next token with
        nothing unapplied before it (a pull taking a source's log in order: nearly every step
        pair); None otherwise, and the caller takes the two steps. Skips the lookups and
        tuples of the two general steps, run per settled message."""
        received = self.received_token
        if self.unapplied_tokens:
            return None
        if received is not None and not (token.same_domain(received) and token > received):
            return None
        return DirectionCheckpoint._derived(token, token, (), ())

    # -- wire ------------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The JSON/CBOR document; absent members are omitted (never null, never ``[]``)."""
        out: dict[str, Any] = {}
        if self.received_token is not None:
            out["receivedToken"] = self.received_token.to_wire()
        if self.contiguous_applied_token is not None:
            out["contiguousAppliedToken"] = self.contiguous_applied_token.to_wire()
        if self.pending_tokens:
            out["pendingTokens"] = [t.to_wire() for t in self.pending_tokens]
        if self.unapplied_tokens:
            out["unappliedTokens"] = [t.to_wire() for t in self.unapplied_tokens]
        return out

    @classmethod
    def from_wire(cls, obj: Any) -> DirectionCheckpoint:
        """Parse strictly: unknown members, nulls and broken invariants are refused."""
        if not isinstance(obj, Mapping):
            raise CheckpointInvalid("a direction checkpoint is an object")
        unknown = sorted(str(k) for k in set(obj) - _MEMBERS)
        if unknown:
            raise CheckpointInvalid(f"unknown checkpoint members: {', '.join(unknown)}")

        def token(member: str) -> ProgressToken | None:
            if member not in obj:
                return None
            if obj[member] is None:
                raise CheckpointInvalid(f"{member} must be absent rather than null")
            return ProgressToken.from_wire(obj[member])

        def tokens(member: str, limit: int) -> tuple[ProgressToken, ...]:
            value = obj.get(member, [])
            if not isinstance(value, list):
                raise CheckpointInvalid(f"{member} must be a list")
            if len(value) > limit:
                raise CheckpointInvalid(f"more than {limit} {member}")
            return tuple(ProgressToken.from_wire(v) for v in value)

        return cls(
            token("receivedToken"),
            token("contiguousAppliedToken"),
            tokens("pendingTokens", MAX_PENDING_TOKENS),
            tokens("unappliedTokens", MAX_UNAPPLIED_TOKENS),
        )


class Direction(StrEnum):
    """Which way a checkpoint's messages flow: ``pull`` (remote -> local), ``push`` (local -> remote)."""

    PULL = "pull"
    PUSH = "push"


class LinkState(StrEnum):
    """The RFC's link states.

    - ``initial``: created or resumed; catching up from its checkpoints, not yet live;
    - ``live``: realtime stream healthy and caught up;
    - ``degraded_poll``: realtime reconnects exhausted; polling anti-entropy, still trying;
    - ``repairing``: a gap, a closure hard-fail or a pending overflow; repair running;
    - ``paused``: stopped by an operator or a hard-error policy; nothing runs until resumed.
    """

    INITIAL = "initial"
    LIVE = "live"
    DEGRADED_POLL = "degraded_poll"
    REPAIRING = "repairing"
    PAUSED = "paused"


def checkpoint_id(active_store_id: str, passive_store_id: str, scope_id: str, tenant: str) -> str:
    """§4.2: the CID of the DAG-CBOR map of the four names of a collection copy."""
    return compute_cid(
        {"activeStoreId": active_store_id, "passiveStoreId": passive_store_id, "scopeId": scope_id, "tenant": tenant}
    )
