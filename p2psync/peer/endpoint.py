"""Where a peer listens: the WebSocket path of the replication profiles and the URL built from
a host and port. Here, below the node, discovery and the CLI, because all three name peers by
this URL (``p2psync sync`` takes it, discovery and the node print and dial it)."""

from __future__ import annotations

import ipaddress
from typing import Final

from websockets.uri import parse_uri

__all__ = ["SYNC_PATH", "is_loopback", "peer_url", "plain_ws_refused", "ws_url"]

#: The WebSocket path of the replication profiles (protocol/replication-profiles.md §2).
SYNC_PATH: Final = "/_p2psync"


def peer_url(host: str, port: int, *, tls: bool) -> str:
    """``wss://host:port/_p2psync`` (``ws://`` without ``tls``), an IPv6 literal in brackets."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{'wss' if tls else 'ws'}://{shown}:{port}{SYNC_PATH}"


def ws_url(host: str, port: int) -> str:
    """``ws://host:port/_p2psync``, with an IPv6 literal in brackets."""
    return peer_url(host, port, tls=False)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): the one place plain ``ws://``
    is allowed without ``--insecure``, since nobody else can read it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plain_ws_refused(url: str) -> str | None:
    """Why dialing ``url`` in clear is refused without ``--insecure`` (a ``ws://`` URL whose host
    is not loopback: anyone on the network could read and change the sync), or None."""
    uri = parse_uri(url)
    if uri.secure or is_loopback(uri.host):
        return None
    return (f"{url} is plain ws:// to another host: anyone on the network could read the sync; "
            f"use wss:// (nodes serve it by default), or --insecure to allow it")
