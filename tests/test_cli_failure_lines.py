"""The one-line failure messages of `sync`, `serve` links and `peers` (p2psync.errors.describe).

Found walking through docs/getting-started.md: a refused TCP connection read
"cannot connect to ws://…: Error connecting to ('10.77.0.2', 4984): Connection refused" (the
address twice), and a peer that stopped mid-round read "… refused: 503 ConnectionLost", although
nothing refused anything.
"""

from __future__ import annotations

import socket

import pytest
import trio

from p2psync.blip import connect
from p2psync.errors import describe as describe_failure
from p2psync.replication.wire import PeerError


def _closed_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_refused_connection_names_the_url_once_and_the_os_reason() -> None:
    url = f"ws://127.0.0.1:{_closed_port()}/_p2psync"
    with pytest.raises(OSError) as caught:
        async with connect(url, handlers={}):
            pass  # pragma: no cover - nothing listens there
    line = describe_failure(caught.value, url)
    assert line == f"cannot connect to {url}: Connection refused"


def test_a_dropped_connection_is_not_called_a_refusal() -> None:
    url = "ws://10.77.0.2:4984/_p2psync"
    line = describe_failure(PeerError(503, "ConnectionLost", "peer closed the stream"), url)
    assert line == f"lost the connection to {url}: peer closed the stream"


def test_a_real_refusal_still_says_refused() -> None:
    url = "ws://10.77.0.1:4984/_p2psync"
    line = describe_failure(PeerError(403, "SyncNotAuthorized", "no grant"), url)
    assert line == f"{url} refused: 403 SyncNotAuthorized: no grant"


async def test_a_silent_address_is_reported_as_not_answering() -> None:
    # What a firewall that drops SYNs looks like to the caller (the handshake timeout fires).
    assert describe_failure(trio.TooSlowError(), "ws://x:1/_p2psync") == "ws://x:1/_p2psync did not answer in time"
