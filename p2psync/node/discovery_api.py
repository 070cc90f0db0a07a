"""The shape of discovery the node needs (p2psync/discovery provides the real thing).

The node is written against these protocols, not the zeroconf-backed classes, so that its
logic is tested with a fake LAN (tests/node/fakes.py). :func:`zeroconf_discovery` builds the
real one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import trio

from p2psync import discovery

__all__ = [
    "AUTO_CAPABILITY",
    "AdvertInfo",
    "DiscoveryFactory",
    "DiscoveryLike",
    "PeerGoneLike",
    "PeerSeenLike",
    "zeroconf_discovery",
]

#: Capability a node advertises when it dials discovered peers itself (``auto``). A peer that
#: does not advertise it will not dial us, so we dial it whatever the store ids say.
AUTO_CAPABILITY: Final = "auto"


@runtime_checkable
class PeerSeenLike(Protocol):
    """A discovered node (``p2psync.discovery.PeerSeen``)."""

    @property
    def name(self) -> str: ...
    @property
    def did(self) -> str: ...
    @property
    def sid(self) -> str: ...
    @property
    def addresses(self) -> Sequence[str]: ...
    @property
    def port(self) -> int: ...
    @property
    def tenants(self) -> frozenset[str]: ...
    @property
    def tenants_hashed(self) -> bool: ...
    @property
    def capabilities(self) -> Any: ...
    @property
    def last_seen(self) -> Any: ...
    @property
    def fingerprint(self) -> str | None: ...

    def url(self) -> str: ...
    def shares(self, tenant: str) -> bool: ...


class PeerGoneLike(Protocol):
    """A node that left (``p2psync.discovery.PeerGone``)."""

    @property
    def name(self) -> str: ...
    @property
    def did(self) -> str: ...
    @property
    def sid(self) -> str: ...


class DiscoveryLike(Protocol):
    """Advertises this node (when given an advert) and browses for others."""

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...
    def peers(self) -> Any: ...
    def subscribe(self) -> Any: ...


@dataclass(frozen=True)
class AdvertInfo:
    """What the node advertises: its DID, store id, port, tenants (hashed when ``private``)."""

    did: str
    sid: str
    port: int
    tenants: tuple[str, ...]
    private: bool
    name: str | None
    capabilities: tuple[str, ...]
    fingerprint: str | None = None  # its TLS certificate's (None: plain ws://)


DiscoveryFactory = Callable[[AdvertInfo | None, list[str] | None], DiscoveryLike]


def zeroconf_discovery(advert: AdvertInfo | None, interfaces: list[str] | None) -> DiscoveryLike:
    """The real, mDNS discovery (p2psync.discovery) for ``advert`` on ``interfaces`` (None: all).

    Raises ``DiscoveryError`` when the advert cannot be published (a name or TXT too large)."""
    real: Any = None
    if advert is not None:
        # What every node can do, then ours (``auto``).
        capabilities = tuple(dict.fromkeys((*discovery.DEFAULT_CAPABILITIES, *advert.capabilities)))
        real = discovery.Advert(advert.did, advert.sid, advert.port, tenants=advert.tenants,
                                private=advert.private, name=advert.name, capabilities=capabilities,
                                fingerprint=advert.fingerprint)
    found: DiscoveryLike = discovery.Discovery(real, interfaces=interfaces, browse=True)
    return found
