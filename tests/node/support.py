"""Shared pieces of the node tests: nodes on loopback, polling, scraping metrics."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from p2psync.dwn.did import Identity
from p2psync.node.config import NodeConfig, StaticPeer
from p2psync.node.discovery_api import DiscoveryFactory
from p2psync.node.node import Node
from tests.peer.support import new_store

__all__ = ["free_port", "make_node", "metric_samples", "scrape", "until"]


def free_port() -> int:
    """A port nothing listens on right now (for configs that must name each other's port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def make_node(
    tmp_path: Path,
    name: str,
    identity: Identity,
    *,
    port: int = 0,
    peers: Iterable[str] = (),
    auto: bool = False,
    discovery: DiscoveryFactory | None = None,
    metrics: bool = False,
    gone_grace: float = 60.0,
    node: dict[str, Any] | None = None,
    **config: Any,
) -> Node:
    """A node over a fresh store ``<tmp_path>/<name>.db`` listening on 127.0.0.1; ``node``: more
    arguments of :class:`Node` (``status_path``, ``callers_path``, ``retry_schedule``)."""
    cfg = NodeConfig(host="127.0.0.1", port=port, peers=tuple(StaticPeer(u) for u in peers), auto=auto,
                     discovery=discovery is not None, metrics_port=0 if metrics else None, name=name, **config)
    return Node(cfg, new_store(tmp_path, name), identity, discovery=discovery, gone_grace=gone_grace, **(node or {}))


async def until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``predicate`` until it holds (a deadline, not a timing assertion: fails only if
    the thing never happens)."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


async def scrape(url: str) -> tuple[str, str]:
    """GET ``url`` (http://127.0.0.1:port/path) with a plain socket; (status line, body)."""
    rest = url.removeprefix("http://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], body.decode()


def metric_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parse an exposition with prometheus_client's parser: sample name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out
