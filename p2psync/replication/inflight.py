"""Which messages some link of this store is receiving right now (issue #17).

A node hears of a new message from every peer it links to, often while one of those links is
still carrying it. The sink that lists a message first *claims* it here; a sink of another
link that lists it meanwhile declines it (`304` to a `changes`, `503` to a `proposeChanges`)
instead of having its body sent a second time, and keeps its own token open until the claim
ends. A claim ends when its sink's apply is durable (the message is held: the waiting sinks
settle their tokens) or when that sink gave up on it (a failed `rev`, a lost connection: the
waiting sinks leave their tokens unsettled, so their checkpoints never pass a message this
store does not hold and the next round offers it again).

One :class:`InFlightClaims` per store, shared by every connection of a peer, owned by the
driver (``Peer``, the simulator's peer) and reached by the protocol only through store
requests (``ClaimMessages``, ``ReleaseClaims``, ``AwaitClaim``). Plain memory, no I/O: a
process that crashes loses its claims along with the transfers they described.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["InFlightClaims"]


class InFlightClaims:
    """Message CIDs claimed by one sink each, and who waits for each claim to end."""

    def __init__(self) -> None:
        self._owner: dict[tuple[str, str], object] = {}
        self._waiting: dict[tuple[str, str], list[Callable[[bool], None]]] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def claim(self, tenant: str, cids: Iterable[str], claimant: object) -> set[str]:
        """Claim each of ``cids`` not claimed yet for ``claimant``; returns those another
        claimant holds (``claimant``'s own earlier claims count as its own)."""
        elsewhere: set[str] = set()
        for cid in cids:
            owner = self._owner.setdefault((tenant, cid), claimant)
            if owner is not claimant:
                elsewhere.add(cid)
        return elsewhere

    def release(self, tenant: str, cids: Iterable[str], claimant: object, *, held: bool) -> None:
        """End ``claimant``'s claims on ``cids`` (others' are left alone); ``held``: the store
        now durably holds them. Whoever waited is told ``held``."""
        for cid in cids:
            key = (tenant, cid)
            if self._owner.get(key) is not claimant:
                continue
            del self._owner[key]
            for tell in self._waiting.pop(key, ()):
                tell(held)

    def wait(self, tenant: str, cid: str, tell: Callable[[bool], None]) -> None:
        """Call ``tell(held)`` when the claim on ``cid`` ends (at once, ``False``, when there is
        none: whoever had it is gone without saying the message is held)."""
        key = (tenant, cid)
        if key not in self._owner:
            tell(False)
            return
        self._waiting.setdefault(key, []).append(tell)

    def holder(self, tenant: str, cid: str) -> object | None:
        """The claimant of ``cid`` (None: nobody is receiving it)."""
        return self._owner.get((tenant, cid))
