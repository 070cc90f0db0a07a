"""What discovery publishes (:class:`Advert`) and what it reports (:class:`PeerSeen`, :class:`PeerGone`)."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Final, Literal

from p2psync.discovery.txt import DiscoveryError, tenant_hash
from p2psync.peer.endpoint import peer_url

__all__ = [
    "DEFAULT_CAPABILITIES",
    "DEFAULT_TTL",
    "SERVICE_TYPE",
    "Advert",
    "PeerGone",
    "PeerSeen",
    "default_instance_name",
]

#: The DNS-SD service type of a p2psync node (RFC 6763 §7: ``_<service>._tcp``).
SERVICE_TYPE: Final = "_p2psync._tcp.local."
#: What a node does unless told otherwise: answer pulls, accept pushes, keep links open.
DEFAULT_CAPABILITIES: Final = ("pull", "push", "continuous")
#: TTL of the SRV and address records (RFC 6762 §10: 120 s for records that name a host). A node
#: killed without a goodbye is noticed as gone about this long after its last answer.
DEFAULT_TTL: Final = 120
#: An instance name is one DNS label: at most 63 bytes of UTF-8 (RFC 6763 §4.1.1).
MAX_INSTANCE_BYTES: Final = 63
#: Characters of the store id appended to the host name in the default instance name.
SHORT_SID_CHARS: Final = 8


def _check_instance(name: str) -> None:
    size = len(name.encode("utf-8"))
    if not 1 <= size <= MAX_INSTANCE_BYTES:
        raise DiscoveryError("AdvertInvalid", f"instance name must be 1-{MAX_INSTANCE_BYTES} bytes of UTF-8")
    # Control characters are legal DNS-SD but useless in a name people read; dots confuse the
    # many tools that split service names on them, so we keep both out.
    if any(ord(c) < 0x20 or c in ".\x7f" for c in name):
        raise DiscoveryError("AdvertInvalid", f"instance name {name!r} contains a dot or a control character")


def default_instance_name(sid: str, hostname: str | None = None) -> str:
    """``<host>-<first 8 characters of the store id>``: readable, and unique because the sid is."""
    host = (hostname if hostname is not None else socket.gethostname()).split(".")[0]
    host = "".join(c for c in host if ord(c) >= 0x20 and c != "\x7f") or "p2psync"
    suffix = "-" + sid[:SHORT_SID_CHARS]
    room = MAX_INSTANCE_BYTES - len(suffix.encode("utf-8"))
    host = host.encode("utf-8")[:room].decode("utf-8", errors="ignore")
    return host + suffix


@dataclass(frozen=True)
class Advert:
    """What this node publishes.

    ``tenants`` are the DIDs it syncs (hashed in the TXT record when ``private``); ``name`` is the
    instance name (default :func:`default_instance_name`); ``ttl`` the SRV/address records' TTL in
    seconds; ``addresses`` the IPs to publish (default: the addresses discovery is bound to, or
    every non-loopback IPv4 address of the host) -- they should be where the peer listens;
    ``fingerprint`` that of the TLS certificate it serves ``wss://`` with (None: plain ``ws://``).
    """

    did: str
    sid: str
    port: int
    tenants: tuple[str, ...] = ()
    private: bool = False
    name: str | None = None
    capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES
    ttl: int = DEFAULT_TTL
    addresses: tuple[str, ...] = ()
    fingerprint: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise DiscoveryError("AdvertInvalid", f"port {self.port} is not 1-65535")
        if self.ttl < 1:
            raise DiscoveryError("AdvertInvalid", f"ttl {self.ttl} must be at least 1 second")
        if self.name is not None:
            _check_instance(self.name)
        for address in self.addresses:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise DiscoveryError("AdvertInvalid", f"{address!r} is not an IP address") from None

    @property
    def instance(self) -> str:
        """The instance name to register (before any rename for a conflict)."""
        return self.name if self.name is not None else default_instance_name(self.sid)


@dataclass(frozen=True)
class PeerSeen:
    """A resolved remote node; also a row of :meth:`Discovery.peers`.

    ``tenants`` holds DIDs, or hex hashes when ``tenants_hashed`` (then ``salt`` is the advert's
    salt); test membership with :meth:`shares`. ``last_seen`` is the ``time.time()`` at which its
    records were last known to be live. ``fingerprint``: its TLS certificate's, when it serves
    ``wss://`` (a dialer pins it).
    """

    name: str
    did: str
    sid: str
    addresses: tuple[str, ...]
    port: int
    tenants: frozenset[str]
    tenants_hashed: bool
    salt: str | None
    version: str
    capabilities: tuple[str, ...]
    last_seen: float = field(compare=False)
    fingerprint: str | None = None

    def url(self) -> str:
        """The URL of the first address (IPv4 first), as ``p2psync sync`` takes it: ``wss://``
        when the advert names a certificate, else ``ws://``."""
        if not self.addresses:
            raise DiscoveryError("NoAddress", f"{self.name} published no address")
        return peer_url(self.addresses[0], self.port, tls=self.fingerprint is not None)

    def shares(self, tenant: str) -> bool:
        """Whether the peer advertises ``tenant`` (a DID), in clear or as its salted hash."""
        if self.tenants_hashed:
            return self.salt is not None and tenant_hash(self.salt, tenant) in self.tenants
        return tenant in self.tenants


@dataclass(frozen=True)
class PeerGone:
    """A peer left: it said goodbye (``reason="goodbye"``), its records expired and a query got no
    answer (``"expired"``), or its record changed into one we cannot read (``"invalid"``)."""

    name: str
    did: str
    sid: str
    reason: Literal["goodbye", "expired", "invalid"] = "goodbye"
