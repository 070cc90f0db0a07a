"""``p2psync peers``: browse the LAN for nodes for a few seconds, and show what the node
running on this data directory knows (its status file), if one runs."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import trio

from p2psync.node.discovery_api import DiscoveryFactory, PeerSeenLike, zeroconf_discovery
from p2psync.node.links import state_text
from p2psync.node.node import peer_json

__all__ = ["PeersFailure", "anti_entropy_line", "browse", "node_status", "peers_lines", "run_peers", "seconds_until"]


class PeersFailure(Exception):
    """Browsing could not start (no usable interface, zeroconf refused); one line."""


async def browse(wait: float, interfaces: list[str] | None, factory: DiscoveryFactory | None = None) -> list[Any]:
    """The peers discovery sees after browsing ``wait`` seconds (nothing advertised)."""
    if factory is None:
        factory = zeroconf_discovery
    discovery = factory(None, interfaces)
    async with trio.open_nursery() as nursery:
        await nursery.start(discovery.run)
        await trio.sleep(wait)
        found = discovery.peers()
        nursery.cancel_scope.cancel()
    return list(found.values() if isinstance(found, dict) else found)


def node_status(path: Path) -> dict[str, Any] | None:
    """The running node's status file, or None when no node runs (no file, or a dead pid: a
    node killed with SIGKILL leaves its file behind)."""
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict) or not isinstance(status.get("pid"), int):
        return None
    pid: int = status["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    out: dict[str, Any] = status
    return out


def _age(last_seen: Any) -> str:
    """'2 s ago' from a datetime or an epoch time; as given otherwise."""
    if isinstance(last_seen, str):
        try:
            last_seen = datetime.fromisoformat(last_seen)
        except ValueError:
            return str(last_seen)
    if isinstance(last_seen, datetime):
        seconds = (datetime.now(UTC) - last_seen).total_seconds()
    elif isinstance(last_seen, int | float) and last_seen > 1e9:
        seconds = time.time() - last_seen
    else:
        return "-" if last_seen is None else str(last_seen)
    return f"{max(seconds, 0):.0f} s ago"


def peers_lines(found: list[dict[str, Any]], status: dict[str, Any] | None, wait: float) -> list[str]:
    """``peers`` for a person."""
    lines = [f"found {len(found)} node(s) in {wait:g} s" + (":" if found else
                                                              " (see docs/operator.md: a peer that is never found)")]
    for peer in found:
        tenants = "private (tenants hashed)" if peer["private"] else ", ".join(peer["tenants"]) or "none"
        lines.append(f"  {peer['name']}  {peer['url']}" + ("  (this node)" if peer.get("self") else ""))
        lines.append(f"    did {peer['did']}  storeId {peer['storeId']}")
        tls = f"TLS certificate {peer['fingerprint']}" if peer.get("fingerprint") else "plain ws:// (no TLS)"
        lines.append(f"    {tls}")
        lines.append(f"    tenants: {tenants}; last seen {_age(peer['lastSeen'])}")
    if status is not None:
        own = f", TLS certificate {status['fingerprint']}" if status.get("fingerprint") else ""
        lines.append(f"the node running here (pid {status['pid']}, {status.get('url')}{own}) knows:")
        for peer in status.get("peers", []):
            gone = peer.get("goneFor")
            left = f"  (gone {gone} s ago)" if gone is not None else ""
            lines.append(f"  peer {peer['name']}  {peer['url']}{left}")
        for link in status.get("links", []):
            state = state_text(link.get("state", "connecting"), link["failures"],
                               seconds_until(link.get("nextAttemptAt")))
            scope = link.get("scopeName") or link["scope"]  # a subset's prefixes and scopeId
            lines.append(f"  link {link['peer']}: {link['tenant']} ({scope}, {link['direction']}), {state}"
                         + (f"; last error: {link['lastError']}" if link.get("lastError") else ""))
            check = anti_entropy_line(link.get("antiEntropy"))
            if check is not None:
                lines.append(f"    {check}")
        if not status.get("peers") and not status.get("links"):
            lines.append("  no peers and no links yet")
    return lines


def anti_entropy_line(check: Any) -> str | None:
    """A link's anti-entropy in the status file (``NodeLink.to_json``) for a person: the last
    check (when, outcome, what each side lacked) and the next one. None when there is none."""
    if not isinstance(check, dict):
        return None
    if not check.get("enabled", True):
        return "anti-entropy off" + (f" ({check['offReason']})" if check.get("offReason") else "")
    if check.get("lastCheck") is None:
        last = "no check yet"
    else:
        last = f"last check {_age(check['lastCheck'])}: {check.get('outcome')}"
        if check.get("outcome") != "failed":
            last += (f" (this node lacked {check.get('localLacks', 0)}, the peer {check.get('remoteLacks', 0)};"
                     f" {check.get('roundTrips', 0)} round trip(s), {check.get('bytes', 0)} bytes)")
        if check.get("detail"):
            last += f": {check['detail']}"
    if check.get("running"):
        nxt = "running now"
    elif check.get("nextCheck") is not None:
        nxt = f"next in {_until(check['nextCheck'])}"
    else:
        nxt = "first once the link's round catches up"
    return f"anti-entropy: {last}; {nxt}"


def _until(at: str) -> str:
    seconds = seconds_until(at)
    return at if seconds is None else f"{seconds:.0f} s"


def seconds_until(at: Any) -> float | None:
    """Seconds from now to the ISO time ``at`` (0 when past; None when not a time)."""
    if not isinstance(at, str):
        return None
    try:
        seconds = (datetime.fromisoformat(at) - datetime.now(UTC)).total_seconds()
    except ValueError:
        return None
    return max(seconds, 0.0)


def run_peers(
    *,
    wait: float,
    as_json: bool,
    interfaces: list[str] | None,
    status_path: Path | None,
    out: TextIO | None = None,
    factory: DiscoveryFactory | None = None,
) -> int:
    """Browse, print, return the exit code (0)."""
    stream = out if out is not None else sys.stdout
    if wait < 0:
        raise PeersFailure("--wait must be zero or more seconds")
    try:
        found: list[PeerSeenLike] = trio.run(browse, wait, interfaces, factory)
    except OSError as exc:
        raise PeersFailure(f"cannot browse for peers: {exc.strerror or exc}") from None
    rows = sorted((peer_json(p) for p in found), key=lambda r: (r["name"], r["storeId"]))
    status = node_status(status_path) if status_path is not None else None
    for row in rows:
        # The node running on this data directory answers a browse too: say which one it is.
        row["self"] = status is not None and row["storeId"] == status.get("storeId")
    if as_json:
        print(json.dumps({"found": rows, "node": status}, indent=2), file=stream)
    else:
        print("\n".join(peers_lines(rows, status, wait)), file=stream)
    return 0
