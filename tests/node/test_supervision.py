"""One node link's supervision, step by step (p2psync.node.node: _supervise, _run_round,
_record_failure, _back_off), with the peer's sync replaced by a script and trio's MockClock."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import trio
import trio.testing

from p2psync.node.links import LinkSpec
from p2psync.node.node import LINK_RETRY_CAP, Node, NodeLink
from p2psync.peer.session import HelloFailed
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import PeerError
from p2psync.state.ledger import retry_delay
from tests.node.support import make_node
from tests.peer.support import seeded

ALICE = seeded("alice-supervision")
URL = "ws://10.77.0.9:4984/_p2psync"


def _link() -> NodeLink:
    spec = LinkSpec(remote=f"url:{URL}", tenant=ALICE.did, scope=SyncScope.global_scope(), direction="pull",
                    url=URL, origin="static", label="phone")
    return NodeLink(spec)


def _scripted(node: Node, outcomes: list[BaseException | None]) -> list[float]:
    """Make ``node.peer.sync`` fail (or return) as ``outcomes`` say; returns the start times."""
    starts: list[float] = []

    async def sync(*_: Any, **__: Any) -> None:
        starts.append(trio.current_time())
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    node.peer.sync = sync  # type: ignore[method-assign,assignment]
    return starts


async def test_a_refused_link_backs_off_and_says_why(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    node = make_node(tmp_path, "n", ALICE)
    node._rng = random.Random(7)
    starts = _scripted(node, [PeerError(403, "SyncNotAuthorized", "no grant"), HelloFailed("HelloProofInvalid"), None])
    link = _link()
    await node._supervise(link)
    assert len(starts) == 3 and link.done.is_set()
    assert link.failures == 2
    assert link.last_error == f"hello with {URL} failed: HelloProofInvalid"
    # The node's own schedule: 1 s then 2 s, each with equal jitter (half to all of it).
    waits = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    for failures, wait in zip((1, 2), waits, strict=True):
        full = retry_delay(failures).total_seconds()
        assert full / 2 <= wait <= full


async def test_a_stopped_link_records_no_failure(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    node = make_node(tmp_path, "n", ALICE)
    link = _link()
    link.stop.set()
    starts = _scripted(node, [PeerError(503, "ConnectionLost", "closed")])
    await node._supervise(link)
    assert starts == [] and link.failures == 0 and link.done.is_set()


def test_one_failure_seen_twice_counts_once(tmp_path: Path) -> None:
    node = make_node(tmp_path, "n", ALICE)
    link = _link()
    refused = PeerError(403, "SyncNotAuthorized", "no grant")
    node._record_failure(link, refused)
    node._record_failure(link, refused)  # on its way out of the connection, then of the sync
    assert link.failures == 1 and link.last_error == f"{URL} refused: 403 SyncNotAuthorized: no grant"
    node._record_failure(link, KeyError("unexplained"))
    assert link.failures == 2 and link.last_error == "KeyError: 'unexplained'"


def test_the_backoff_is_capped(tmp_path: Path) -> None:
    node = make_node(tmp_path, "n", ALICE)
    link = _link()
    link.failures = 10_000
    assert LINK_RETRY_CAP / 2 <= node._backoff_delay(link) <= LINK_RETRY_CAP
