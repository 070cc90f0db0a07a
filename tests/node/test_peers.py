"""``p2psync peers``: a browse (over the fake LAN; the mDNS one runs in tests/discovery/) and
the running node's status file."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import trio

from p2psync.node.browse import anti_entropy_line, node_status, peers_lines, run_peers
from p2psync.node.discovery_api import AdvertInfo
from p2psync.node.node import Node
from tests.node.fakes import FakeLan
from tests.node.support import free_port, until
from tests.peer.support import new_store, seeded

ALICE = seeded("alice-peers")
BOB = "did:key:z6MkbobPeers"


def advertise(lan: FakeLan, name: str, sid: str, *, private: bool = False) -> None:
    """A node on the fake LAN (its advert is visible to every browser)."""
    lan.factory(AdvertInfo(ALICE.did, sid, 4984, (ALICE.did, BOB), private, name, ("auto",)), None)


def test_peers_lists_what_a_browse_finds(tmp_path: Path) -> None:
    lan = FakeLan()
    advertise(lan, "kitchen", "2222")
    advertise(lan, "attic", "1111", private=True)
    out = io.StringIO()
    assert run_peers(wait=0.05, as_json=True, interfaces=None, status_path=tmp_path / "none.json", out=out,
                     factory=lan.factory) == 0
    report = json.loads(out.getvalue())
    assert report["node"] is None
    assert [p["name"] for p in report["found"]] == ["attic", "kitchen"]
    attic, kitchen = report["found"]
    assert attic["private"] and attic["tenants"] is None
    assert kitchen["tenants"] == sorted([ALICE.did, BOB]) and kitchen["url"] == "ws://127.0.0.1:4984/_p2psync"
    assert kitchen["did"] == ALICE.did and kitchen["storeId"] == "2222" and "auto" in kitchen["capabilities"]
    out = io.StringIO()
    run_peers(wait=0.05, as_json=False, interfaces=None, status_path=None, out=out, factory=lan.factory)
    text = out.getvalue()
    assert text.startswith("found 2 node(s) in 0.05 s:\n  attic  ws://127.0.0.1:4984/_p2psync\n")
    assert "tenants: private (tenants hashed); last seen 0 s ago" in text
    assert f"tenants: {ALICE.did}, {BOB}; last seen" in text or f"tenants: {BOB}, {ALICE.did}; last seen" in text


def test_nothing_found_points_at_the_guide() -> None:
    lines = peers_lines([], None, 3)
    assert lines == ["found 0 node(s) in 3 s (see docs/operator.md: a peer that is never found)"]


async def test_the_running_node_status_file(tmp_path: Path) -> None:
    from p2psync.node.config import NodeConfig, StaticPeer

    status_path = tmp_path / "node-status.json"
    unreachable = f"ws://127.0.0.1:{free_port()}/_p2psync"  # nobody listens there
    config = NodeConfig(port=0, peers=(StaticPeer(unreachable),))
    node = Node(config, new_store(tmp_path, "n"), ALICE, status_path=status_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)

        def link_failed() -> bool:
            status = node_status(status_path)
            return status is not None and bool(status["links"]) and status["links"][0]["failures"] > 0

        await until(link_failed)
        status = node_status(status_path)
        assert status is not None and status["storeId"] == node.store_id and status["url"] == node.url
        [link] = status["links"]
        assert link["url"] == unreachable and not link["connected"] and link["origin"] == "static"
        assert link["lastError"].startswith(f"cannot connect to {unreachable}")
        text = "\n".join(peers_lines([], status, 1))
        assert f"link {unreachable}: {ALICE.did} (global, both), connecting (" in text or \
            f"link {unreachable}: {ALICE.did} (global, both), backoff (" in text
        # Its anti-entropy waits for a round that catches up.
        assert link["antiEntropy"]["checks"] == 0 and link["antiEntropy"]["nextCheck"] is None
        assert "    anti-entropy: no check yet; first once the link's round catches up" in text
        node.stop()
    assert not status_path.exists()


def test_the_anti_entropy_line() -> None:
    shown = {"enabled": True, "checks": 3, "lastCheck": "2031-01-01T00:00:00+00:00", "outcome": "unresolved",
             "localLacks": 2, "remoteLacks": 0, "roundTrips": 2, "bytes": 900, "detail": "2 deferred",
             "nextCheck": None, "running": True}
    line = anti_entropy_line(shown)
    assert line is not None and line.startswith("anti-entropy: last check ")
    assert line.endswith(": unresolved (this node lacked 2, the peer 0; 2 round trip(s), 900 bytes): 2 deferred; "
                         "running now")
    assert anti_entropy_line({"enabled": False}) == "anti-entropy off"
    assert anti_entropy_line(None) is None  # a status file written before anti-entropy


def test_a_dead_node_status_file_is_ignored(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "node-status.json"
    path.write_text(json.dumps({"pid": int(done.stdout), "links": [], "peers": []}))
    assert node_status(path) is None  # killed without cleaning up: not a running node
    path.write_text("{not json")
    assert node_status(path) is None
