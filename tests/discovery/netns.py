"""Private network namespaces for tests that need real multicast (mDNS) without touching the host.

Nothing here needs root: ``unshare -rn`` makes a user namespace (we are "root" inside it, mapped
to our own uid) plus a network namespace; inside that user namespace we may create further network
namespaces, veth pairs and bridges. Multicast sent inside never reaches a host interface, because
the namespaces' only links are the veths we make between them.

How it is arranged (all processes are ours and are killed on exit):

* a *keeper* ``unshare -rn sleep`` holds the outer user + net namespace;
* each further namespace is held by ``nsenter --target <keeper> --user --net unshare -n sleep``,
  i.e. a net namespace nested in the same user namespace;
* links are made from inside the user namespace with ``ip link add ... peer ... netns <pid>``;
* a program is run in a namespace with ``nsenter --target <pid> --user --net
  --preserve-credentials <argv>`` (``--preserve-credentials`` because ``unshare -r`` denies
  ``setgroups``, which a plain ``nsenter --user`` would call). nsenter execs, so the pid of the
  process you start *is* the program's pid: SIGKILL reaches it directly.

Two layouts:

``veth_pair()`` -- two namespaces joined by one veth pair (A: 10.77.0.1, B: 10.77.0.2)::

    from tests.discovery.netns import netns_unavailable, veth_pair
    if (why := netns_unavailable()) is not None:
        pytest.skip(why)
    with veth_pair() as (a, b):
        argv = a.command([sys.executable, "-m", "my.node", a.address])
        async with json_process(argv, name="a", log_dir=tmp_path) as node:  # tests/discovery/support.py
            await node.expect("ready")

``lan(n)`` -- ``n`` namespaces on one bridge, like ``n`` machines on a switch (10.77.0.1 ...
10.77.0.n, bridge in a hub namespace that runs nothing)::

    with lan(3) as nodes:
        for ns in nodes: ...

Every namespace has ``lo`` up (127.0.0.1 works inside, separately in each) and its veth up with
multicast on, a /24 on the veth and a route for 224.0.0.0/4 through it, so multicast senders that
do not pick an interface still stay on the veth. Bind servers and zeroconf to ``ns.address``; to
use a namespace's loopback instead, ``Namespace(ns.name, ns.pid, "lo", "127.0.0.1")``. Nothing
inside can reach the host or the internet.

A namespace lasts while its keeper or any process started in it runs: end what you start in it
(``json_process`` kills its process on exit). Keepers sleep ``lifetime`` seconds at most
(default 15 minutes), so a crashed test run cleans up after itself.

For a hand walk-through (docs, "two machines"), ``python -m tests.discovery.netns`` sets up a pair,
prints the ``nsenter`` command for each side and waits until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO

__all__ = ["SUBNET", "Namespace", "NetnsError", "lan", "netns_unavailable", "veth_pair"]

#: The /24 the namespaces' veths live in. Private (RFC 1918) and never routed anywhere: each
#: namespace's only non-loopback link is a veth we made.
SUBNET = "10.77.0"
#: How long a keeper may take to report that it is inside its namespace (seconds).
_READY_TIMEOUT = 10.0
#: How long namespaces live at most (seconds): past any test, short enough that a crashed run's
#: leftovers vanish soon. ``python -m tests.discovery.netns`` keeps its pair for a day.
DEFAULT_LIFETIME = 900.0
_NSENTER = ("nsenter", "--user", "--net", "--preserve-credentials")


class NetnsError(RuntimeError):
    """Setting up a namespace failed; ``code`` names the step, ``detail`` says what happened."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{code}: {detail}")


@dataclass(frozen=True)
class Namespace:
    """One network namespace: ``pid`` of the process holding it, its veth ``interface`` and
    IPv4 ``address`` (no prefix)."""

    name: str
    pid: int
    interface: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside this namespace (a list for subprocess/trio)."""
        return [_NSENTER[0], f"--target={self.pid}", *_NSENTER[1:], *argv]

    def run(self, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the namespace to completion and return its captured output."""
        done = subprocess.run(self.command(argv), capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise NetnsError("CommandFailed", f"{' '.join(argv)} in {self.name}: {done.stderr.strip()}")
        return done


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here (for ``pytest.skip``), or None when they can."""
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux / iproute2)"
    probe = subprocess.run(["unshare", "-rn", "ip", "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"unprivileged `unshare -rn` with veth is not allowed here: {probe.stderr.strip()}"
    return None


def _wait_ready(proc: subprocess.Popen[str], what: str) -> None:
    out: IO[str] | None = proc.stdout
    assert out is not None
    # The keeper prints "ready" only once it is inside the new namespace; before that its
    # /proc/<pid>/ns/net is still the parent's, and a link moved there would land in the wrong place.
    with selectors.DefaultSelector() as sel:
        sel.register(out, selectors.EVENT_READ)
        if not sel.select(_READY_TIMEOUT):
            raise NetnsError("KeeperTimeout", f"{what} did not start within {_READY_TIMEOUT} s")
    line = out.readline().strip()
    if line != "ready":
        err = proc.stderr.read() if proc.stderr is not None and proc.poll() is not None else ""
        raise NetnsError("KeeperFailed", f"{what}: {line!r} {err.strip()}")


class _Keepers:
    """The sleeping processes that hold the namespaces; ends them (by pid) on close."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, argv: list[str], what: str) -> int:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.procs.append(proc)
        _wait_ready(proc, what)
        return proc.pid

    def close(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def _hold(lifetime: float) -> list[str]:
    # A finite sleep: if the test process dies without cleaning up, the namespaces go away by themselves.
    return ["sh", "-c", f"echo ready; exec sleep {max(1, int(lifetime))}"]


def _ip(ns: Namespace | int, *args: str) -> None:
    pid = ns.pid if isinstance(ns, Namespace) else ns
    argv = [_NSENTER[0], f"--target={pid}", *_NSENTER[1:], "ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetnsError("IpFailed", f"ip {' '.join(args)}: {done.stderr.strip()}")


def _bring_up(pid: int, interface: str, address: str) -> None:
    _ip(pid, "link", "set", "lo", "multicast", "on")
    _ip(pid, "link", "set", "lo", "up")
    _ip(pid, "addr", "add", f"{address}/24", "dev", interface)
    _ip(pid, "link", "set", interface, "multicast", "on")
    _ip(pid, "link", "set", interface, "up")
    # Multicast without an explicit outgoing interface follows this route, i.e. stays on the veth.
    _ip(pid, "route", "add", "224.0.0.0/4", "dev", interface)


def _new_outer(keepers: _Keepers, lifetime: float) -> int:
    return keepers.start(["unshare", "-rn", *_hold(lifetime)], "outer namespace")


def _new_inner(keepers: _Keepers, outer: int, lifetime: float) -> int:
    return keepers.start([_NSENTER[0], f"--target={outer}", *_NSENTER[1:], "unshare", "-n", *_hold(lifetime)],
                         "inner namespace")


@contextlib.contextmanager
def veth_pair(lifetime: float = DEFAULT_LIFETIME) -> Iterator[tuple[Namespace, Namespace]]:
    """Two namespaces joined by a veth pair: A (``veth-a``, 10.77.0.1) and B (``veth-b``, 10.77.0.2).

    They last until the block ends, or ``lifetime`` seconds at most."""
    keepers = _Keepers()
    try:
        outer = _new_outer(keepers, lifetime)
        inner = _new_inner(keepers, outer, lifetime)
        _ip(outer, "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b", "netns", str(inner))
        a = Namespace("A", outer, "veth-a", f"{SUBNET}.1")
        b = Namespace("B", inner, "veth-b", f"{SUBNET}.2")
        for ns in (a, b):
            _bring_up(ns.pid, ns.interface, ns.address)
        yield a, b
    finally:
        keepers.close()


@contextlib.contextmanager
def lan(count: int, lifetime: float = DEFAULT_LIFETIME) -> Iterator[list[Namespace]]:
    """``count`` namespaces (``eth0``, 10.77.0.1 ...) on one bridge in a hub namespace, for the
    block or ``lifetime`` seconds at most."""
    if not 1 <= count <= 200:
        raise ValueError("count must be 1..200")
    keepers = _Keepers()
    try:
        hub = _new_outer(keepers, lifetime)
        _ip(hub, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip(hub, "link", "set", "br0", "up")
        nodes: list[Namespace] = []
        for i in range(count):
            pid = _new_inner(keepers, hub, lifetime)
            port = f"port{i}"
            _ip(hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", str(pid))
            _ip(hub, "link", "set", port, "master", "br0")
            _ip(hub, "link", "set", port, "up")
            ns = Namespace(f"N{i + 1}", pid, "eth0", f"{SUBNET}.{i + 1}")
            _bring_up(ns.pid, ns.interface, ns.address)
            nodes.append(ns)
        yield nodes
    finally:
        keepers.close()


def main() -> None:
    """Set up a pair and print how to enter each side; Ctrl-C tears it down."""
    if (why := netns_unavailable()) is not None:
        sys.exit(why)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with veth_pair(lifetime=86400) as (a, b):
        for ns in (a, b):
            print(f"{ns.name} ({ns.address} on {ns.interface}):  {' '.join(ns.command(['bash']))}")
        print("Ctrl-C to remove both namespaces.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
