"""Which messages some link of this store is receiving right now (issue #17).

A node hears of a new message from every peer it links to, often while one of those links is
still carrying it. The sink that lists a message first *claims* it here; a sink of another
link that lists it meanwhile declines it instead of having its body sent a second time: to a
`changes` it answers `304` and keeps its own token open until the claim ends; to a
`proposeChanges` (whose tokens the pusher keeps) it answers once the claim has ended. A claim
ends when its sink's apply is durable (the message is held: the waiting sinks settle their
tokens, a push is answered `304`) or when that sink gave up on it (a failed `rev`, a lost
connection: the waiting sinks leave their tokens unsettled and a push is answered `503`, so no
checkpoint passes a message this store does not hold and the next round offers it again).

One :class:`InFlightClaims` per store, shared by every connection of a peer, owned by the
driver (``Peer``, the simulator's peer) and reached by the protocol only through store
requests (``ClaimMessages``, ``ReleaseClaims``, ``AwaitClaim``). Plain memory, no I/O: a
process that crashes loses its claims along with the transfers they described.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

__all__ = ["RECENT_ENDS", "InFlightClaims"]

#: how many ended claims' outcomes are remembered, for a sink that waits on a claim it was
#: told of just before it ended
RECENT_ENDS: Final = 4096


class InFlightClaims:
    """Message CIDs claimed by one sink each, and who waits for each claim to end.

    Each claim has a serial number, so that a sink waits for the very claim it was told of:
    once that claim ends, a later claim on the same message (by a link that listed it
    afterwards) is not waited on. That is what makes waiting safe: a sink only ever waits on
    claims made before its own listing's, so no two sinks can wait on each other.
    """

    def __init__(self) -> None:
        self._owner: dict[tuple[str, str], tuple[object, int]] = {}
        self._waiting: dict[tuple[str, str], list[Callable[[bool], None]]] = {}
        self._serial = 0
        #: the last :data:`RECENT_ENDS` claims that ended: their serial and whether each left it held
        self._ended: OrderedDict[tuple[str, str], tuple[int, bool]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def claim(self, tenant: str, cids: Iterable[str], claimant: object) -> dict[str, int]:
        """Claim each of ``cids`` not claimed yet for ``claimant``; returns those another
        claimant holds, each with that claim's serial (``claimant``'s own earlier claims count
        as its own)."""
        elsewhere: dict[str, int] = {}
        for cid in cids:
            key = (tenant, cid)
            held = self._owner.get(key)
            if held is None:
                self._serial += 1
                self._owner[key] = (claimant, self._serial)
            elif held[0] is not claimant:
                elsewhere[cid] = held[1]
        return elsewhere

    def release(self, tenant: str, cids: Iterable[str], claimant: object, *, held: bool) -> None:
        """End ``claimant``'s claims on ``cids`` (others' are left alone); ``held``: the store
        now durably holds them. Whoever waited is told ``held``."""
        for cid in cids:
            key = (tenant, cid)
            owner = self._owner.get(key)
            if owner is None or owner[0] is not claimant:
                continue
            del self._owner[key]
            self._ended[key] = (owner[1], held)
            self._ended.move_to_end(key)
            if len(self._ended) > RECENT_ENDS:
                self._ended.popitem(last=False)
            for tell in self._waiting.pop(key, ()):
                tell(held)

    def wait(self, tenant: str, cid: str, tell: Callable[[bool], None], serial: int | None = None) -> None:
        """Call ``tell(held)`` when the claim on ``cid`` numbered ``serial`` (None: whichever
        holds it now) ends. When that claim has ended already, at once: how it ended, if it is
        the last claim on ``cid`` to end and among the :data:`RECENT_ENDS` last of all (a sink
        told of a claim asks to wait on it one store request later), else ``False`` (not known
        to be held: the message is offered again)."""
        key = (tenant, cid)
        owner = self._owner.get(key)
        if owner is not None and (serial is None or owner[1] == serial):
            self._waiting.setdefault(key, []).append(tell)
            return
        ended = self._ended.get(key)
        tell(ended is not None and (serial is None or ended[0] == serial) and ended[1])

    def holder(self, tenant: str, cid: str) -> object | None:
        """The claimant of ``cid`` (None: nobody is receiving it)."""
        owner = self._owner.get((tenant, cid))
        return None if owner is None else owner[0]
