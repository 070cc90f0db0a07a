"""Where a peer listens: the WebSocket path of the replication profiles and the URL built from
a host and port. Here, below the node, discovery and the CLI, because all three name peers by
this URL (``p2psync sync`` takes it, discovery and the node print and dial it)."""

from __future__ import annotations

from typing import Final

__all__ = ["SYNC_PATH", "ws_url"]

#: The WebSocket path of the replication profiles (protocol/replication-profiles.md §2).
SYNC_PATH: Final = "/_p2psync"


def ws_url(host: str, port: int) -> str:
    """``ws://host:port/_p2psync``, with an IPv6 literal in brackets."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"ws://{shown}:{port}{SYNC_PATH}"
