"""Finding p2psync nodes on the local network with mDNS/DNS-SD (``protocol/discovery.md``).

:class:`Discovery` advertises an :class:`Advert` as ``_p2psync._tcp.local.`` and keeps a table of
the :class:`PeerSeen` it resolves, reporting :class:`PeerGone` when one leaves.
"""

from p2psync.discovery.model import (
    DEFAULT_CAPABILITIES,
    DEFAULT_TTL,
    SERVICE_TYPE,
    Advert,
    PeerGone,
    PeerSeen,
    default_instance_name,
)
from p2psync.discovery.service import CHECK_EVERY, RESOLVE_TIMEOUT, Discovery, DiscoveryEvent
from p2psync.discovery.txt import DiscoveryError, TxtRecord, decode_txt, encode_txt, tenant_hash

__all__ = [
    "CHECK_EVERY",
    "DEFAULT_CAPABILITIES",
    "DEFAULT_TTL",
    "RESOLVE_TIMEOUT",
    "SERVICE_TYPE",
    "Advert",
    "Discovery",
    "DiscoveryError",
    "DiscoveryEvent",
    "PeerGone",
    "PeerSeen",
    "TxtRecord",
    "decode_txt",
    "default_instance_name",
    "encode_txt",
    "tenant_hash",
]
