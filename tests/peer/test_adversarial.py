"""Attacks a stranger on the LAN can make, against a real serving node (issue #15).

The node is a ``p2psync serve`` child process with its own data directory. Each attack runs with
:data:`ABUSERS` abusive connections at once, and each test checks what the issue asks of the node:

- its resident memory (``VmHWM`` of the child, the kernel's exact peak, reset before the attack)
  stays under :data:`RSS_BOUND`;
- a legitimate sync (a second device of the node's tenant pulling everything) completes while
  the attack is under way and again after it;
- the node's store is unchanged (``store digest`` before and after).

The figures (before / peak / after) are printed with ``-s`` and quoted in docs/operator.md.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from p2psync import blip
from p2psync.blip.codec import FrameEncoder
from p2psync.blip.handshake import MAX_WEBSOCKET_MESSAGE
from p2psync.blip.wire import COMPRESSED, MORE_COMING, MSG, encode_message_head
from p2psync.cli.home import Home
from p2psync.dwn.did import Identity
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from p2psync.peer.session import REPLICATION_MAX_MESSAGE, SERVED_GATHER_BYTES
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import APP_ID, HELLO_TIMEOUT, encode_body
from p2psync.state.digest import store_digest
from tests.blip.rawpeer import RawPeer
from tests.peer.support import Clock, write_notes

pytestmark = pytest.mark.slow

#: Abusive connections at once in every attack (the issue's acceptance: "10 abusive connections").
ABUSERS = 10
#: The node's resident memory must stay below this through every attack (the issue: < 300 MB).
RSS_BOUND = 300 * 1024 * 1024
#: Records the node holds, pulled by the legitimate device during and after each attack.
NOTES = 30
#: Bounded waits on the child (not timing assertions): generous for a loaded 2-core machine.
STARTUP_DEADLINE = 30.0
EXIT_DEADLINE = 20.0


@dataclass
class Node:
    proc: subprocess.Popen[str]
    home: Path
    url: str
    port: int
    identity: Identity
    figures: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def status(self, key: str) -> int:
        """A ``/proc/PID/status`` figure in bytes (VmRSS, VmHWM)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(f"no {key} for the node")

    def reset_peak(self) -> None:
        """Let VmHWM start again from the current RSS (Linux: ``5`` > clear_refs)."""
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")

    def digest(self) -> dict[str, object]:
        store = Store(self.home / "store.db")
        try:
            return store_digest(store)
        finally:
            store.close()

    def alive(self) -> None:
        assert self.proc.poll() is None, f"the node died (exit {self.proc.returncode})"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    home = tmp_path_factory.mktemp("adversarial") / "node"
    identity = Identity.generate()
    Home(home).init(identity)
    store = Store(home / "store.db")
    write_notes(store, identity, NOTES, clock=Clock())
    store.close()
    # Into files, not pipes: the node logs a line per refused connection, and a full pipe
    # would stop it.
    out, log = home.parent / "serve.out", home.parent / "serve.log"
    with open(out, "w") as stdout, open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "p2psync", "--home", str(home), "serve", "--port", "0"],
                                stdout=stdout, stderr=stderr, text=True)
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE
        match = None
        while match is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            match = re.search(r"^serving (ws://127\.0\.0\.1:(\d+)/\S+)$", out.read_text(), re.MULTILINE)
        assert match is not None, f"p2psync serve printed {out.read_text()!r} {log.read_text()!r}"
        node = Node(proc, home, match[1], int(match[2]), identity)
        yield node
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=EXIT_DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "Traceback" not in log.read_text()
    figures = node.figures
    if figures:
        print("\nnode RSS, MiB (before / peak / after):")
        for name, (before, peak, after) in figures.items():
            print(f"  {name:<40} {before / 2**20:6.0f} {peak / 2**20:6.0f} {after / 2**20:6.0f}")


# ------------------------------------------------------------------------------ the harness


async def legitimate_sync(node: Node, tmp_path: Path, name: str) -> None:
    """A second device of the node's tenant pulls everything into an empty store."""
    store = Store(tmp_path / f"{name}.db")
    try:
        with trio.fail_after(60):
            summary = await Peer(store, node.identity).sync(node.url, tenant=node.identity.did)
        assert summary.pull is not None and summary.pull.revs_applied == NOTES
        assert store_digest(store) == node.digest()
    finally:
        store.close()


Attacker = Callable[[int, trio.Event, trio.Event], Awaitable[None]]


async def under_attack(node: Node, tmp_path: Path, name: str, attacker: Attacker, abusers: int = ABUSERS) -> int:
    """Run ``attacker(i, underway, stop)`` on ``abusers`` connections at once. Once every one
    of them has set ``underway``, a legitimate sync must complete while they go on; then
    ``stop`` is set, and once they all ended another sync must complete. Memory and the store
    are checked around it; returns the RSS before."""
    node.alive()
    digest = node.digest()
    before = node.status("VmRSS")
    node.reset_peak()
    underway = [trio.Event() for _ in range(abusers)]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for i in range(abusers):
            nursery.start_soon(attacker, i, underway[i], stop)
        with trio.fail_after(60):
            for event in underway:
                await event.wait()
        await legitimate_sync(node, tmp_path, f"{name}-during")
        stop.set()
    node.alive()
    await legitimate_sync(node, tmp_path, f"{name}-after")
    peak = node.status("VmHWM")
    await trio.sleep(0.5)
    after = node.status("VmRSS")
    node.figures[name] = (before, peak, after)
    assert peak < RSS_BOUND, f"{name}: the node reached {peak / 2**20:.0f} MiB"
    assert node.digest() == digest
    return before


CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


async def until_closed(peer: RawPeer, frames: list[bytes], underway: trio.Event) -> int | None:
    """Send ``frames`` (raw BLIP frames) one WebSocket message each until the node hangs up;
    the close code it sent (None: it never did)."""
    try:
        for frame in frames:
            await peer.send(frame)
    except CLOSED:
        pass  # the node closed it
    underway.set()
    close = await peer.closed_with(10)
    return None if close is None else close.code


# ------------------------------------------------------------------------------ the attacks


async def test_many_unfinished_messages_before_hello(node: Node, tmp_path: Path) -> None:
    """(a) Messages begun and never finished, before saying hello: each compressed first frame
    inflates to just under the pre-hello message limit (200 KiB from ~200 bytes). The node used
    to gather 128 MiB of them per connection (589 MiB RSS); now two messages' worth, then 1009."""
    encoder = FrameEncoder()
    chunk = encode_message_head({"Profile": "getCollections"}) + bytes(200 * 1024)
    frames = [encoder.encode(n, MSG | MORE_COMING | COMPRESSED, chunk) for n in range(1, 1001)]

    async def attacker(i: int, underway: trio.Event, stop: trio.Event) -> None:
        while not stop.is_set():
            peer = await RawPeer.connect(node.port, APP_ID)
            assert await until_closed(peer, frames, underway) in (1009, 1013)

    await under_attack(node, tmp_path, "(a) unfinished messages before hello", attacker)


#: A compressed frame body of 15 MiB of zeros: ~15 KiB on the wire (about 1,000 to 1).
BOMB = 15 * 1024 * 1024


async def test_deflate_bombs(node: Node, tmp_path: Path) -> None:
    """(b) Compressed frames inflating ~1,000 times: eight messages each begun with a bomb, then
    a second bomb for each. Before hello a frame may inflate only to what a hello-sized message
    holds, so the first bomb ends the connection (1002); they used to be gathered (728 MiB)."""
    encoder = FrameEncoder()
    head = encode_message_head({"Profile": "getCollections"})
    frames = [encoder.encode(n, MSG | MORE_COMING | COMPRESSED, head + bytes(BOMB)) for n in range(1, 9)]
    frames += [encoder.encode(n, MSG | MORE_COMING | COMPRESSED, bytes(BOMB)) for n in range(1, 9)]
    assert sum(map(len, frames)) < BOMB // 50

    async def attacker(i: int, underway: trio.Event, stop: trio.Event) -> None:
        while not stop.is_set():
            peer = await RawPeer.connect(node.port, APP_ID)
            assert await until_closed(peer, frames, underway) == 1002

    await under_attack(node, tmp_path, "(b) deflate bombs", attacker)


async def test_unread_requests_to_unknown_profiles(node: Node, tmp_path: Path) -> None:
    """(c) 17,000 requests to unknown profiles, compressed, and not one reply read."""
    encoder = FrameEncoder()
    head = encode_message_head({"Profile": "x" * 1000})
    frames = [encoder.encode(n, MSG | COMPRESSED, head) for n in range(1, 17_001)]

    async def attacker(i: int, underway: trio.Event, stop: trio.Event) -> None:
        peer = await RawPeer.connect(node.port, APP_ID)
        try:
            for start in range(0, len(frames), 500):
                for frame in frames[start:start + 500]:
                    peer.ws.send_binary(frame)
                await peer.flush()
        except CLOSED:
            pass
        underway.set()
        await stop.wait()
        close = await peer.closed_with(10)  # read at last: what did the node say?
        codes.append(None if close is None else close.code)

    codes: list[int | None] = []
    await under_attack(node, tmp_path, "(c) unread requests, unknown profiles", attacker)
    assert codes == [1008] * ABUSERS  # it stopped answering, past 512 KiB queued before hello


async def test_connections_that_never_say_hello(node: Node, tmp_path: Path) -> None:
    """(d) Connections that finish the WebSocket handshake and say nothing: three per abuser,
    each abuser from its own address, 30 of the 32 unproven slots. The node closes each at its
    hello deadline (1008). (From one address at most 16 are let in: test_pre_hello.py.)"""
    codes: list[int | None] = []

    async def attacker(i: int, underway: trio.Event, stop: trio.Event) -> None:
        peers = [await RawPeer.connect(node.port, APP_ID, local_address=f"127.0.0.{i + 2}") for _ in range(3)]
        underway.set()
        for peer in peers:
            close = await peer.closed_with(HELLO_TIMEOUT + 10)
            codes.append(None if close is None else close.code)

    await under_attack(node, tmp_path, "(d) connections that never say hello", attacker)
    assert codes == [1008] * 3 * ABUSERS


async def test_websocket_messages_over_the_limit(node: Node, tmp_path: Path) -> None:
    """(e) A WebSocket message over the limit, again and again: closed with 1009 at once."""
    message = bytes(MAX_WEBSOCKET_MESSAGE + 1)
    codes: list[int | None] = []

    async def attacker(i: int, underway: trio.Event, stop: trio.Event) -> None:
        while not stop.is_set():
            peer = await RawPeer.connect(node.port, APP_ID)
            try:
                await peer.send(message)
                close = await peer.closed_with(10)
            except CLOSED:
                close = None  # the node hung up while the rest of the message was on its way
            codes.append(None if close is None else close.code)
            underway.set()

    await under_attack(node, tmp_path, "(e) WebSocket messages over the limit", attacker)
    assert codes.count(1009) >= ABUSERS and set(codes) <= {1009, None}


async def test_a_strangers_push_is_refused(node: Node, tmp_path: Path) -> None:
    """(f) Strangers who prove a throw-away did:key and push their own tenant's messages:
    refused with 403 PushRefused (proposeChanges, and a reconciliation's take), nothing stored."""
    strangers = [Identity.generate() for _ in range(ABUSERS)]
    refusals: list[str] = []

    async def attacker(i: int, underway: trio.Event, stop: trio.Event) -> None:
        stranger = strangers[i]
        store = Store(tmp_path / f"stranger-{i}.db")
        write_notes(store, stranger, 20, clock=Clock(), prefix="junk")
        rows = store.events.read(stranger.did, after=-1)
        stream_id, epoch = store.events.stream(stranger.did)
        listing = {"streamId": stream_id, "epoch": epoch, "items": [[str(p), c] for p, c in rows]}
        pusher = Peer(store, stranger)
        try:
            while not stop.is_set():
                async with blip.connect(node.url, app_id=APP_ID, handlers=pusher.handlers(active=True)) as conn:
                    # Driven by hand: our own pusher would not even try (it checks the sink may read).
                    session = pusher.session_for(conn, active=True)
                    await session.hello()
                    opened = session.proto.open_collection(stranger.did, SyncScope.global_scope(), f"cp-{i}")
                    index, _ = await session.run(opened)
                    for profile, body in (("proposeChanges", listing), ("reconcile", {"f": [c for _, c in rows]})):
                        with pytest.raises(blip.BlipError) as info:
                            await conn.request(profile, {"collection": str(index)}, encode_body(body))
                        refusals.append(info.value.message)
                underway.set()
        finally:
            store.close()

    await under_attack(node, tmp_path, "(f) strangers' pushes", attacker)
    assert refusals and all("PushRefused" in r for r in refusals)
    tenants = set(node.digest())
    assert tenants == {node.identity.did} and not tenants & {s.did for s in strangers}


async def test_proven_strangers_gathering_to_the_caps_and_memory_returns(node: Node, tmp_path: Path) -> None:
    """(g) Ten strangers each prove a throw-away did:key (the full limits apply then) and start
    messages of the largest size a connection takes after hello, never finishing them: each is
    closed with 1009 at two messages' worth gathered (32 MiB), or with 1013 once all of them
    together hold the node's gathering budget (128 MiB, SERVED_GATHER_BYTES). With BLIP's
    64 MiB messages and 512 MiB budget this reached ~690 MiB. Once they are gone the node's
    heap goes back to the system (p2psync/blip/heap.py)."""
    codes: list[int | None] = []

    async def attacker(i: int, underway: trio.Event, stop: trio.Event) -> None:
        store = Store(tmp_path / f"gatherer-{i}.db")
        peer = Peer(store, Identity.generate())
        chunk = bytes(range(256)) * 256
        try:
            async with blip.connect(node.url, app_id=APP_ID, handlers=peer.handlers(active=True)) as conn:
                await peer.session_for(conn, active=True).hello()
                core = conn._core  # raw BLIP: messages begun and never ended
                with contextlib.suppress(blip.ConnectionClosed):
                    while not conn.closed:
                        number = core.send_request({"Profile": "getCollections"}, b"", more_body=True)
                        for _ in range(REPLICATION_MAX_MESSAGE // len(chunk) - 1):  # one chunk short
                            core.append_body(MSG, number, chunk, end=False)
                            conn._wake_writer()
                            while core.outgoing_backlog(MSG, number) and not conn.closed:
                                await trio.sleep(0.001)
                        underway.set()  # one message held: the legitimate sync goes once all are
                codes.append(conn.close_code)
        finally:
            underway.set()
            store.close()

    before = await under_attack(node, tmp_path, "(g) proven strangers gathering", attacker)
    _, peak, after = node.figures["(g) proven strangers gathering"]
    assert len(codes) == ABUSERS and set(codes) <= {1009, 1013} and 1013 in codes, codes
    assert peak > before + SERVED_GATHER_BYTES // 2  # they did hold what they gathered...
    assert after < before + 32 * 2**20  # ...and it went back
