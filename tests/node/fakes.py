"""A fake LAN for the node's discovery: adverts go to every other node's browser, in-process.

It stands in for mDNS where the real thing cannot run (outside a network namespace); the
shapes are those of p2psync.discovery (``PeerSeen``/``PeerGone``), so the node's logic runs
unchanged. The real discovery is tested in tests/discovery/ inside network namespaces.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from p2psync.node.discovery_api import AdvertInfo, DiscoveryLike

__all__ = ["FakeLan", "FakePeerGone", "FakePeerSeen"]


@dataclass(frozen=True)
class FakePeerSeen:
    name: str
    did: str
    sid: str
    addresses: tuple[str, ...]
    port: int
    tenants: frozenset[str]
    tenants_hashed: bool = False
    salt: str = ""
    version: str = "1"
    capabilities: tuple[str, ...] = ()
    last_seen: float = 0.0
    fingerprint: str | None = None

    def url(self) -> str:
        scheme = "ws" if self.fingerprint is None else "wss"
        return f"{scheme}://{self.addresses[0]}:{self.port}/_p2psync"

    def shares(self, tenant: str) -> bool:
        if self.tenants_hashed:
            return _hashed(self.salt, tenant) in self.tenants
        return tenant in self.tenants


@dataclass(frozen=True)
class FakePeerGone:
    name: str
    did: str
    sid: str


def _hashed(salt: str, did: str) -> str:
    return hashlib.sha256((salt + did).encode()).hexdigest()[:16]


def seen_of(advert: AdvertInfo, *, name: str | None = None, address: str = "127.0.0.1") -> FakePeerSeen:
    """What a browser would report for ``advert``."""
    salt = "s4lt" if advert.private else ""
    tenants = frozenset(_hashed(salt, t) for t in advert.tenants) if advert.private else frozenset(advert.tenants)
    return FakePeerSeen(name or advert.name or f"node-{advert.sid[:8]}", advert.did, advert.sid, (address,),
                        advert.port, tenants, advert.private, salt, "1", advert.capabilities, time.time(),
                        advert.fingerprint)


@dataclass
class FakeLan:
    """Every discovery made by :meth:`factory` sees the others' adverts."""

    members: list[_FakeDiscovery] = field(default_factory=list)

    def factory(self, advert: AdvertInfo | None, interfaces: list[str] | None) -> DiscoveryLike:
        member = _FakeDiscovery(self, advert)
        self.members.append(member)
        return member

    def announce(self, seen: Any) -> None:
        """Deliver a PeerSeen (or PeerGone) to every browser."""
        for member in self.members:
            member.deliver(seen)


class _FakeDiscovery:
    def __init__(self, lan: FakeLan, advert: AdvertInfo | None) -> None:
        self.lan = lan
        self.advert = advert
        self.seen: dict[str, Any] = {}
        self.subscribers: list[trio.MemorySendChannel[Any]] = []

    def deliver(self, event: Any) -> None:
        if self.advert is not None and event.sid == self.advert.sid:
            return
        if isinstance(event, FakePeerSeen):
            self.seen[event.sid] = event
        else:
            self.seen.pop(event.sid, None)
        for send in list(self.subscribers):
            try:
                send.send_nowait(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.subscribers.remove(send)  # that node stopped listening

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        mine = seen_of(self.advert) if self.advert is not None else None
        for other in list(self.lan.members):
            if other is not self and other.advert is not None:
                self.deliver(seen_of(other.advert))
        task_status.started()
        if mine is not None:
            self.lan.announce(mine)
        try:
            await trio.sleep_forever()
        finally:
            self.lan.members.remove(self)
            if mine is not None:
                self.lan.announce(FakePeerGone(mine.name, mine.did, mine.sid))

    def peers(self) -> list[Any]:
        return list(self.seen.values())

    def subscribe(self) -> trio.MemoryReceiveChannel[Any]:
        send, receive = trio.open_memory_channel[Any](100)
        self.subscribers.append(send)
        return receive
