"""The in-flight window of one direction: tokens in stream order, handed to the ledger in order.

A direction's checkpoint computes its frontier from *which* tokens were received and which of
those were applied (replication-state.md), so the ledger must learn of tokens in stream
order: a token settled early must not be applied before an earlier one is even received, or
the frontier would pass the earlier one. The window keeps the tokens a direction has listed
(pull: the source's `changes`; push: our own `proposeChanges`) in order, collects each one's
outcome as it comes (a `304`, a `rev` result, a failure), and turns the finished prefix into
ledger steps: settled → received + applied, not settled → received only (it stays unapplied
and holds the frontier; §11's table says which outcomes settle).

Sans-I/O: :meth:`take_steps` returns the steps; the caller records them in the batch that
holds the applies they describe (:class:`~p2psync.state.committer.GroupCommitter`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from p2psync.dwn.progress import ProgressToken

__all__ = ["ProgressWindow", "Step", "WindowItem"]

#: One ledger step: a token received, or received and applied (the ledger takes them in order).
Step: TypeAlias = tuple[Literal["received", "applied"], ProgressToken]

_OPEN: Final = 0
_SETTLED: Final = 1
_UNSETTLED: Final = 2


@dataclass(slots=True)
class WindowItem:
    """One listed token and what became of it."""

    token: ProgressToken
    state: int = _OPEN
    #: fired when every item before this one has an outcome (a Signal, made by whoever waits)
    turn: Any = None
    #: another link of this store is receiving its message: it waits for that apply (open
    #: until then, so no checkpoint passes it) without holding up the turns after it
    elsewhere: bool = False
    #: its message (or the source's word that there is none) arrived
    arrived: bool = False

    @property
    def done(self) -> bool:
        return self.state != _OPEN


class ProgressWindow:
    """Tokens of one direction in stream order (see the module doc)."""

    def __init__(self) -> None:
        self._items: deque[WindowItem] = deque()
        self._by_position: dict[int, WindowItem] = {}
        self.last: ProgressToken | None = None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def open_count(self) -> int:
        return sum(1 for item in self._items if not item.done)

    def add(self, token: ProgressToken, *, settled: bool | None = None) -> WindowItem:
        """Append ``token`` (strictly after every token added before); ``settled`` gives its
        outcome at once (a `304`, a `through`), None leaves it open."""
        if self.last is not None and token.position <= self.last.position:
            raise ValueError(f"token {token.position} is not after {self.last.position}")
        item = WindowItem(token)
        if settled is not None:
            item.state = _SETTLED if settled else _UNSETTLED
        self._items.append(item)
        self._by_position[token.position] = item
        self.last = token
        return item

    def get(self, position: int, message_cid: str) -> WindowItem | None:
        """The open item at ``position`` naming ``message_cid`` (None when there is none)."""
        item = self._by_position.get(position)
        if item is None or item.done or item.token.message_cid != message_cid:
            return None
        return item

    def head(self) -> WindowItem | None:
        return self._items[0] if self._items else None

    def first_open(self) -> WindowItem | None:
        for item in self._items:
            if not item.done:
                return item
        return None

    def first_turn(self) -> WindowItem | None:
        """The open item whose turn it is: every item before it has an outcome or waits for
        another link (such an item never blocks the applies after it: the other link may be
        waiting for one of them)."""
        for item in self._items:
            if not item.done and not item.elsewhere:
                return item
        return None

    def in_turn(self, items: list[WindowItem]) -> int:
        """How many of ``items`` (in order) take their turns one right after the other from now:
        the first is the item whose turn it is, and each next one is the first open item not
        waiting for another link after the one before (a `revs`' consecutive wanted items)."""
        n = 0
        for item in self._items:
            if n == len(items):
                break
            if item.done or item.elsewhere:
                continue
            if item is not items[n]:
                break
            n += 1
        return n

    def arrived_before(self, item: WindowItem) -> bool:
        """Whether every open item before ``item`` has arrived (False if it is not here)."""
        for other in self._items:
            if other is item:
                return True
            if not (other.done or other.arrived or other.elsewhere):
                return False
        return False

    def open_items(self) -> list[WindowItem]:
        return [item for item in self._items if not item.done]

    @staticmethod
    def finish(item: WindowItem, *, settled: bool) -> None:
        """Record an open item's outcome."""
        if item.done:
            raise ValueError(f"token {item.token.position} already has an outcome")
        item.state = _SETTLED if settled else _UNSETTLED

    def take_steps(self) -> list[Step]:
        """Remove the finished prefix and return its ledger steps, in order."""
        steps: list[Step] = []
        items = self._items
        while items and items[0].state != _OPEN:
            item = items.popleft()
            del self._by_position[item.token.position]
            steps.append(("received", item.token))
            if item.state == _SETTLED:
                steps.append(("applied", item.token))
        return steps

    def abandon(self) -> None:
        """Forget every item (the connection ended; the ledger already holds what was durable)."""
        self._items.clear()
        self._by_position.clear()
