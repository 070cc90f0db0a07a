"""Discovery over real mDNS between network namespaces (issue #6's discovery acceptance).

Each node is ``tests.discovery.nsnode`` -- a real Peer and a real Discovery bound to its veth
address only -- started inside its own namespace (``tests.discovery.netns``). No multicast can
leave: the namespaces' only links are the veths made for the test.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.discovery.netns import Namespace, lan, netns_unavailable, veth_pair
from tests.discovery.support import JsonProcess, json_process
from tests.peer.support import seeded

_WHY_NOT = netns_unavailable()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"no private network namespaces: {_WHY_NOT}")


def did(seed: str) -> str:
    return seeded(seed).did


@asynccontextmanager
async def node(ns: Namespace, tmp_path: Path, name: str, **cfg: Any) -> AsyncIterator[JsonProcess]:
    cfg = {"address": ns.address, "db": str(tmp_path / f"{name}.db"), **cfg}
    argv = ns.command([sys.executable, "-m", "tests.discovery.nsnode", json.dumps(cfg)])
    async with json_process(argv, name=name, log_dir=tmp_path) as proc:
        yield proc


async def test_two_nodes_find_each_other(tmp_path: Path) -> None:
    """Each sees the other's DID, sid, address, port and tenants -- in clear from A, hashed from B
    (private) -- never itself; a changed advert is reported again."""
    with veth_pair() as (a, b):
        async with (
            node(a, tmp_path, "a", identity="node-a", tenants=["alice", "bob"], probe=["carol", "dave"]) as na,
            node(b, tmp_path, "b", identity="node-b", tenants=["carol"], private=True,
                 probe=["alice", "carol", "dave"]) as nb,
        ):
            ready_a, ready_b = await na.expect("ready"), await nb.expect("ready")
            assert ready_a["sid"] != ready_b["sid"]
            b_seen_by_a = await na.expect("seen")
            a_seen_by_b = await nb.expect("seen")

            assert b_seen_by_a["did"] == did("node-b") and b_seen_by_a["sid"] == ready_b["sid"]
            assert b_seen_by_a["name"] == ready_b["name"]
            assert b_seen_by_a["addresses"] == [b.address] and b_seen_by_a["port"] == ready_b["port"]
            assert b_seen_by_a["url"] == f"ws://{b.address}:{ready_b['port']}/_p2psync"
            assert b_seen_by_a["capabilities"] == ["pull", "push", "continuous"]
            assert b_seen_by_a["version"] == "1"
            # Private: one opaque hash, the DID itself nowhere; shares() still answers for carol only.
            assert b_seen_by_a["tenants_hashed"] is True and b_seen_by_a["salt"]
            assert len(b_seen_by_a["tenants"]) == 1 and did("carol") not in b_seen_by_a["tenants"]
            assert b_seen_by_a["shares"] == {"carol": True, "dave": False}

            assert a_seen_by_b["did"] == did("node-a") and a_seen_by_b["sid"] == ready_a["sid"]
            assert a_seen_by_b["addresses"] == [a.address] and a_seen_by_b["port"] == ready_a["port"]
            assert a_seen_by_b["tenants_hashed"] is False and a_seen_by_b["salt"] is None
            assert set(a_seen_by_b["tenants"]) == {did("alice"), did("bob")}
            assert a_seen_by_b["shares"] == {"alice": True, "carol": False, "dave": False}

            # A republishes with another tenant: B reports A again, with the new list.
            await na.send("tenants alice,bob,dave")
            await na.expect("updated")
            again = await nb.expect("seen", lambda e: did("dave") in e["tenants"])
            assert again["sid"] == ready_a["sid"] and again["shares"]["dave"] is True

            for proc, own in ((na, ready_a["sid"]), (nb, ready_b["sid"])):
                seen = proc.events("seen")
                assert seen and all(e["sid"] != own for e in seen)  # its own advert never shows up
                assert not proc.events("gone")
                await proc.send("stop")
                assert await proc.wait() == 0


async def test_leaving_peers_are_noticed(tmp_path: Path) -> None:
    """A clean stop is a goodbye, noticed at once; a SIGKILLed node is noticed when its records'
    TTL runs out and a query goes unanswered. Live peers outlive many TTLs."""
    ttl = {"ttl": 2, "check_every": 0.5, "resolve_timeout": 1.0}
    with lan(3) as (n1, n2, n3):
        async with (
            node(n1, tmp_path, "watcher", identity="watcher", **ttl) as watcher,
            node(n2, tmp_path, "polite", identity="polite", **ttl) as polite,
            node(n3, tmp_path, "killed", identity="killed", **ttl) as killed,
        ):
            sid_polite = (await polite.expect("ready"))["sid"]
            sid_killed = (await killed.expect("ready"))["sid"]
            while not {sid_polite, sid_killed} <= {e["sid"] for e in watcher.events("seen")}:
                await watcher.expect("seen")  # in whichever order they come

            # Two TTLs go by: the records expire and are re-queried, nobody is reported gone.
            meanwhile = await watcher.read_for(2 * ttl["ttl"])
            assert not [e for e in meanwhile if e["event"] == "gone"]

            await polite.send("stop")
            assert await polite.wait() == 0  # cancellation ended the node: goodbye sent, zeroconf closed
            gone = await watcher.expect("gone")
            assert gone["sid"] == sid_polite and gone["did"] == did("polite") and gone["reason"] == "goodbye"

            killed.kill()
            gone = await watcher.expect("gone")
            assert gone["sid"] == sid_killed and gone["did"] == did("killed") and gone["reason"] == "expired"
            assert not killed.events("stopped")


async def test_found_peers_sync(tmp_path: Path) -> None:
    """Two nodes with different records of one tenant find each other and each pulls from the
    other over the discovered URL; both end with the same store digest."""
    with veth_pair() as (a, b):
        async with (
            node(a, tmp_path, "a", identity="alice-peer", tenants=["alice-peer"], sync="alice-peer",
                 notes=20, prefix="from a") as na,
            node(b, tmp_path, "b", identity="alice-peer", tenants=["alice-peer"], sync="alice-peer", private=True,
                 notes=7, prefix="from b", clock="2030-06-01T00:00:00.000000Z") as nb,
        ):
            ready_a, ready_b = await na.expect("ready"), await nb.expect("ready")
            tenant = did("alice-peer")
            assert ready_a["digest"][tenant]["messages"] == 20 and ready_b["digest"][tenant]["messages"] == 7
            synced_a = await na.expect("synced")
            synced_b = await nb.expect("synced")
            assert synced_a["sid"] == ready_b["sid"] and synced_b["sid"] == ready_a["sid"]
            assert synced_a["applied"] == 7 and synced_b["applied"] == 20
            assert synced_a["digest"] == synced_b["digest"]
            assert synced_a["digest"][tenant]["messages"] == 27


# Stands in for avahi or a browser: a program that joins the mDNS group on the LAN interface.
JOIN_GROUP = """
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("", 5353))
group = socket.inet_aton("224.0.0.251") + socket.inet_aton(sys.argv[1])
s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, group)
print(json.dumps({"event": "joined"}), flush=True)
time.sleep(120)
"""


async def test_a_bound_node_keeps_to_its_interface(tmp_path: Path) -> None:
    """Nodes bound to 127.0.0.1 find each other but neither hear nor answer the mDNS of the
    machine's other interface -- even with another program joined to the group there, which on
    Linux would otherwise route that interface's mDNS to zeroconf's wildcard socket."""
    with veth_pair() as (host, lan_side):
        async with json_process(host.command([sys.executable, "-c", JOIN_GROUP, host.address]),
                                name="avahi", log_dir=tmp_path) as avahi:
            await avahi.expect("joined")
            local = Namespace(host.name, host.pid, "lo", "127.0.0.1")
            async with (
                node(local, tmp_path, "l1", identity="local-1") as l1,
                node(local, tmp_path, "l2", identity="local-2") as l2,
            ):
                ready_l2 = await l2.expect("ready")
                await l1.expect("ready")
                await l1.expect("seen", lambda e: e["sid"] == ready_l2["sid"])
                # A LAN node starts now: it announces and asks (QU first) while l1 and l2 listen.
                async with node(lan_side, tmp_path, "lan", identity="lan") as lan:
                    ready_lan = await lan.expect("ready")
                    await l1.read_for(3.0)
                    await l2.read_for(0.1)
                    await lan.read_for(0.1)
                    assert not lan.events("seen")  # nobody answered its questions from 10.77.0.1
                    assert not [e for e in l1.events("seen") + l2.events("seen") if e["sid"] == ready_lan["sid"]]
                    assert [e for e in l2.events("seen") if e["addresses"] == ["127.0.0.1"]]  # but l2 works
