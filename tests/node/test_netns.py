"""Two real nodes on two "machines" (network namespaces joined by a veth pair) find each other
with mDNS and sync by themselves, as docs/operator.md tells a user to run them; `p2psync
peers` run on one lists the other; a node that stops is seen leaving.

No multicast leaves the machine: the namespaces' only link is the veth between them
(tests/discovery/netns.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2psync.dwn.store import Store
from tests.discovery.netns import netns_unavailable, veth_pair
from tests.node.processes import REPO, STARTUP_DEADLINE, NodeProcess, event_counts, make_home, wait_for, write_records
from tests.peer.support import seeded

OWNER = seeded("node-netns-owner")
#: Discovery takes a few seconds (zeroconf probes ~1.5 s before announcing); then the sync.
FIND_AND_SYNC_DEADLINE = 60.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def namespaces_usable() -> None:
    if (why := netns_unavailable()) is not None:
        pytest.skip(why)


@pytest.mark.usefixtures("namespaces_usable")
def test_two_machines_find_each_other_and_sync(tmp_path: Path) -> None:
    a_home, b_home = make_home(tmp_path / "a", OWNER), make_home(tmp_path / "b", OWNER)
    store = Store(a_home.store_path)
    write_records(store, OWNER, 12, start="2030-01-01T00:00:00.000000Z", prefix="on a")
    store.close()
    with veth_pair() as (a_ns, b_ns):
        # As the guide says: listen on the LAN address, and --auto. Discovery turns itself on.
        a = NodeProcess(a_home.path, "--host", a_ns.address, "--auto", "--name", "machine-a", prefix=a_ns.command([]))
        b = NodeProcess(b_home.path, "--host", b_ns.address, "--auto", "--name", "machine-b", prefix=b_ns.command([]))
        try:
            deadline = time.monotonic() + STARTUP_DEADLINE
            line = a.next_line(deadline)
            assert line == f"discovery: on ({a_ns.address}), auto-sync with peers that share a tenant\n"
            wait_for(lambda: event_counts(b_home.store_path, OWNER.did) == (12, 12), FIND_AND_SYNC_DEADLINE,
                     "b receiving a's records")
            # And the other way, live.
            store = Store(b_home.store_path)
            write_records(store, OWNER, 3, start="2031-01-01T00:00:00.000000Z", prefix="on b")
            store.close()
            wait_for(lambda: event_counts(a_home.store_path, OWNER.did) == (15, 15), FIND_AND_SYNC_DEADLINE,
                     "a receiving b's records")
            # `p2psync peers` on b's machine lists a, and what b's running node sees.
            done = subprocess.run(
                b_ns.command([sys.executable, "-m", "p2psync", "--home", str(b_home.path), "peers", "--json",
                              "--wait", "2", "--interface", b_ns.address]),
                capture_output=True, text=True, timeout=STARTUP_DEADLINE, cwd=REPO,
            )
            assert done.returncode == 0, done.stderr
            report = json.loads(done.stdout)
            found = {p["name"]: p for p in report["found"]}
            assert set(found) <= {"machine-a", "machine-b"} and not found["machine-a"]["self"]
            if "machine-b" in found:  # b's own node may answer the browse too: marked as itself
                assert found["machine-b"]["self"]
            assert found["machine-a"]["url"] == a.url and found["machine-a"]["tenants"] == [OWNER.did]
            # On a LAN address the nodes serve TLS, the advert names the certificate, and the
            # link that dials pins it (its round runs over wss:// to that certificate).
            assert a.url.startswith("wss://") and found["machine-a"]["fingerprint"] == a.fingerprint
            assert found["machine-a"]["storeId"] == a.store_id
            assert [p["name"] for p in report["node"]["peers"]] == ["machine-a"]
            # Exactly one of the two dials (the smaller store id); the other only serves.
            dialer, other = (a_home, b_home) if a.store_id < b.store_id else (b_home, a_home)
            links = {home: json.loads((home.path / "node-status.json").read_text())["links"]
                     for home in (a_home, b_home)}
            assert len(links[dialer]) == 1 and links[dialer][0]["connected"] and links[other] == []
            dialed = a if dialer is b_home else b
            assert links[dialer][0]["pin"] == links[dialer][0]["fingerprint"] == dialed.fingerprint
            # a stops: b sees it leave (its goodbye), and keeps running.
            code, rest, err = a.stop(signal.SIGTERM)
            assert code == 0 and rest[-1] == "stopped (SIGTERM)\n", err

            def a_gone() -> bool:
                status = json.loads((b_home.path / "node-status.json").read_text())
                return [p["goneFor"] is not None for p in status["peers"]] == [True]

            wait_for(a_gone, FIND_AND_SYNC_DEADLINE, "b noticing that a left")
        finally:
            for node in (a, b):
                if node.proc.poll() is None:
                    code, rest, err = node.stop(signal.SIGTERM)
                    assert code == 0, err
