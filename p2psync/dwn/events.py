"""Event streams: how accepted messages reach live subscriptions (Messages/RecordsSubscribe).

The reference DWN has an optional ``EventStream`` (``subscribe(tenant, id, listener)`` and
``emit(tenant, event, indexes)``); without one, both subscribe handlers answer 501. This module
gives the same shape in Python and one in-process implementation, :class:`LocalEventStream`.
Nothing emits into it yet: the engine has no live subscription transport, so the engine itself
runs without an event stream and answers subscriptions 501, exactly as the reference does when
it is built without one (which is how the interop harness builds it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

Message = dict[str, Any]


@dataclass(frozen=True)
class MessageEvent:
    """What a subscriber receives: the message, and for a Records message its initial write."""

    message: Message
    initial_write: Message | None = None


#: ``listener(tenant, event, indexes)``: called for every event emitted to ``tenant``.
EventListener = Callable[[str, MessageEvent, dict[str, Any]], None]


@dataclass
class EventSubscription:
    """A live subscription; ``close()`` stops its deliveries (idempotent)."""

    id: str
    _close: Callable[[], None] = field(repr=False)

    def close(self) -> None:
        self._close()


class EventStream(Protocol):
    """The reference's ``EventStream`` contract."""

    def subscribe(
        self, tenant: str, subscription_id: str, listener: EventListener
    ) -> EventSubscription:
        """Register ``listener`` for ``tenant``'s events until the subscription is closed."""
        ...

    def emit(self, tenant: str, event: MessageEvent, indexes: dict[str, Any]) -> None:
        """Deliver ``event`` (stored under ``indexes``) to ``tenant``'s listeners."""
        ...


class LocalEventStream:
    """In-process event stream: listeners are called synchronously, in subscription order.

    Unlike the reference's ``EventEmitterStream``, a listener that raises does not make the
    emitting write fail (there, the exception escapes into the RecordsWrite that emitted);
    it is logged and the other listeners still run.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[str, list[tuple[int, EventListener]]] = {}
        self._next_token = 0

    def subscribe(
        self, tenant: str, subscription_id: str, listener: EventListener
    ) -> EventSubscription:
        with self._lock:
            token = self._next_token
            self._next_token += 1
            self._listeners.setdefault(tenant, []).append((token, listener))

        def close() -> None:
            with self._lock:
                listeners = self._listeners.get(tenant, [])
                remaining = [entry for entry in listeners if entry[0] != token]
                if remaining:
                    self._listeners[tenant] = remaining
                else:
                    self._listeners.pop(tenant, None)

        return EventSubscription(subscription_id, close)

    def emit(self, tenant: str, event: MessageEvent, indexes: dict[str, Any]) -> None:
        with self._lock:
            listeners = [listener for _, listener in self._listeners.get(tenant, [])]
        for listener in listeners:
            try:
                listener(tenant, event, indexes)
            except Exception:  # one faulty subscriber must not break the write or the others
                log.exception("event listener failed for tenant %s", tenant)

    def listener_count(self, tenant: str) -> int:
        """How many subscriptions ``tenant`` has open."""
        with self._lock:
            return len(self._listeners.get(tenant, []))
