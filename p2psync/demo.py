"""``p2psync demo``: the main job on its embedded default.

Three nodes of one person (a laptop, a phone, a desktop: one identity, three stores) start on
loopback in a private temporary directory, find each other over mDNS and keep continuous sync
over TLS (``wss://``, each node's certificate pinned from its advert, each hello bound to it).
The laptop then installs a protocol and writes notes, one of them with a few MiB of data; the
other two receive everything live. The demo ends when every node holds the same messages
(their ``store digest``), checks what arrived (signatures, data CIDs, the large record's bytes)
and prints the figures.

mDNS must not leave the machine. On Linux the demo runs itself inside a private network
namespace (``unshare -rn``: no root needed, only a loopback interface exists in there); where
that is not allowed it binds discovery to 127.0.0.1 and the loopback device only. It says which.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

import trio
from tqdm import tqdm

from p2psync.dwn.did import Identity
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.node.config import NodeConfig
from p2psync.node.node import Node
from p2psync.state.digest import store_digest

#: Set inside the namespace the demo re-runs itself in (and to skip trying one).
NAMESPACE_ENV: Final = "P2PSYNC_DEMO_NAMESPACE"

NOTES_PROTOCOL: dict[str, Any] = {
    "protocol": "https://p2psync.example/protocols/notes",
    "published": True,
    "types": {
        "note": {"schema": "https://p2psync.example/schemas/note", "dataFormats": ["text/plain"]},
        "attachment": {"dataFormats": ["application/octet-stream"]},
    },
    "structure": {
        "note": {
            "$actions": [{"who": "anyone", "can": ["read"]}],
            "attachment": {"$size": {"max": 16 * 1024 * 1024}},
        }
    },
}

DEVICES: Final = ("laptop", "phone", "desktop")
#: Notes the laptop writes (each a few hundred bytes), plus one attachment of this size:
#: large enough to travel by `getAttachment` rather than inline (above 30,000 bytes).
NOTES: Final = 200
ATTACHMENT_BYTES: Final = 4 * 1024 * 1024
#: The whole demo must finish well within a minute; this is the give-up point.
DEADLINE: Final = 90.0

# Linux network-interface ioctls (linux/sockios.h, linux/if.h): bring ``lo`` up in a fresh
# namespace without needing the ``ip`` program.
_SIOCGIFFLAGS: Final = 0x8913
_SIOCSIFFLAGS: Final = 0x8914
_IFF_UP: Final = 0x1
_IFF_RUNNING: Final = 0x40
_IFF_MULTICAST: Final = 0x1000


class DemoFailed(Exception):
    """The demo could not show convergence (the message says what was missing)."""


# --------------------------------------------------------------------------- isolation


def _namespace_usable() -> bool:
    """Whether ``unshare -rn`` works here (not on macOS, nor where user namespaces are off)."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _loopback_up() -> None:
    """Bring ``lo`` up with multicast (a new network namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        flags |= _IFF_UP | _IFF_RUNNING | _IFF_MULTICAST
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags))


def run_demo(out: TextIO | None = None, *, isolate: bool = True) -> int:
    """Run the demo (see the module doc); 0 once every node holds the same messages."""
    stream = out if out is not None else sys.stdout
    if isolate and os.environ.get(NAMESPACE_ENV) is None and out is None and _namespace_usable():
        # Same interpreter, same arguments, inside a user + network namespace of its own. -P
        # keeps the working directory off sys.path (a stray timeit.py there once shadowed the
        # standard library); PYTHONPATH names where this p2psync lives, installed or not.
        here = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, NAMESPACE_ENV: "1", "PYTHONPATH": path}
        command = ["unshare", "-rn", sys.executable, "-P", "-m", "p2psync", "demo"]
        return subprocess.run(command, env=env, check=False).returncode
    inside = os.environ.get(NAMESPACE_ENV) == "1"
    if inside:
        _loopback_up()
        where = "a private network namespace (unshare -rn): no packet leaves it"
    else:
        where = "127.0.0.1, discovery tied to the loopback device"
    try:
        return trio.run(_demo, stream, where)
    except DemoFailed as exc:
        print(f"demo failed: {exc}", file=stream, flush=True)
        return 1


# --------------------------------------------------------------------------- the demo


@dataclass
class _Device:
    name: str
    node: Node
    store: Store


async def _demo(out: TextIO, where: str) -> int:
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="p2psync-demo-") as tmp:
        identity = Identity.generate("key")
        tenant = identity.did
        say("p2psync demo: three devices of one person find each other and sync, no server")
        say(f"  identity   {tenant}")
        say(f"  network    {where}")
        say(f"  data       {tmp}")
        devices: list[_Device] = []
        for name in DEVICES:
            home = Path(tmp) / name
            home.mkdir()
            store = Store(home / "store.db")
            config = NodeConfig(data_dir=home, name=f"{name}-demo", host="127.0.0.1", port=0, tls=True,
                                discovery=True, interfaces=("127.0.0.1",), auto=True)
            devices.append(_Device(name, Node(config, store, identity), store))
        try:
            async with trio.open_nursery() as nursery:
                with trio.fail_after(DEADLINE):
                    for device in devices:
                        await nursery.start(device.node.run)
                    await _until_all_found(devices, say)
                    found = time.monotonic()
                    say()
                    say(f"  laptop   writes a protocol, {NOTES} notes and a "
                        f"{ATTACHMENT_BYTES // (1024 * 1024)} MiB attachment; the others receive them live:")
                    async with trio.open_nursery() as watching:
                        watching.start_soon(_watch_arrivals, devices, tenant, NOTES + 2, out)
                        written = await _write_on_laptop(devices[0], identity)
                        wrote = time.monotonic()
                    converged = time.monotonic()
                ok = _report(devices, tenant, written, say)
                say()
                say(f"  found each other in {found - started:.1f} s; wrote {written['messages']} messages "
                    f"({written['bytes'] / 1e6:.1f} MB of data) in {wrote - found:.1f} s; every node held all "
                    f"of them {converged - wrote:.1f} s after the last write")
                for device in devices:
                    device.node.stop()
        except trio.TooSlowError:
            raise DemoFailed(f"no convergence within {DEADLINE:.0f} s") from None
        finally:
            for device in devices:
                device.store.close()
    say(f"  {'all nodes converged' if ok else 'NODES DIFFER'} in {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


async def _until_all_found(devices: list[_Device], say: Any) -> None:
    """Until every node has discovered the other two over mDNS."""
    others = len(devices) - 1
    while not all(len(d.node.discovered()) >= others for d in devices):
        await trio.sleep(0.1)
    say()
    for device in devices:
        names = ", ".join(sorted(p.name.split(".")[0] for p in device.node.discovered()))
        tls = device.node.tls
        say(f"  {device.name:<8} listens on {device.node.url} (TLS {tls.fingerprint[:8] if tls else 'off'}…)"
            f"  found {names}")


async def _write_on_laptop(device: _Device, identity: Identity) -> dict[str, Any]:
    """The laptop installs the notes protocol and writes notes and one attachment, each
    through the node's group commit (so its feeds see them at once)."""
    committer, dwn, tenant = device.node.peer.committer, device.node.peer.dwn, identity.did
    proto = NOTES_PROTOCOL["protocol"]

    async def write(message: dict[str, Any], data: bytes | None = None) -> None:
        reply = await committer.write(lambda: dwn.process_message(tenant, message, data))
        if reply.code != 202:
            raise DemoFailed(f"the laptop could not write: {reply.code} {reply.detail}")

    await write(ProtocolsConfigure.create(definition=NOTES_PROTOCOL, signer=identity).message)
    first: RecordsWrite | None = None
    total = 0
    for i in range(NOTES):
        text = f"note {i + 1} of {NOTES}, written on the laptop: field report, site {i % 7}".encode()
        note = RecordsWrite.create(signer=identity, data=text, data_format="text/plain",
                                   schema=NOTES_PROTOCOL["types"]["note"]["schema"], protocol=proto,
                                   protocol_path="note")
        await write(note.message, text)
        total += len(text)
        first = first or note
    assert first is not None
    big = os.urandom(ATTACHMENT_BYTES)
    attachment = RecordsWrite.create(signer=identity, data=big, protocol=proto, protocol_path="note/attachment",
                                     parent_context_id=first.message["contextId"],
                                     data_format="application/octet-stream")
    await write(attachment.message, big)
    total += len(big)
    return {"messages": NOTES + 2, "bytes": total, "attachment": attachment.record_id,
            "attachment_sha256": hashlib.sha256(big).hexdigest()}


async def _watch_arrivals(devices: list[_Device], tenant: str, expected: int, out: TextIO) -> None:
    """Progress per receiving node until each holds ``expected`` messages: a bar each on a
    terminal, a line at every quarter otherwise (a log has no use for redrawn bars)."""
    receivers = devices[1:]
    live = out.isatty()
    bars = {d.name: tqdm(total=expected, desc=f"  {d.name:<8}", file=out, leave=True, disable=not live,
                         bar_format="{desc} {bar:30} {n_fmt}/{total_fmt} messages") for d in receivers}
    quarters = {d.name: 0 for d in receivers}
    try:
        while True:
            done = True
            for device in receivers:
                held = device.store.messages.count(tenant)
                bars[device.name].update(held - bars[device.name].n)
                quarter = min(4, held * 4 // expected)
                if not live and quarter > quarters[device.name]:
                    quarters[device.name] = quarter
                    print(f"  {device.name:<8} {held:>4}/{expected} messages", file=out, flush=True)
                done = done and held >= expected
            if done:
                return
            await trio.sleep(0.1)
    finally:
        for bar in bars.values():
            bar.close()


def _report(devices: list[_Device], tenant: str, written: dict[str, Any], say: Any) -> bool:
    """Digests per node and a read-back of the attachment on each receiver; True when all agree."""
    say()
    digests = {}
    for device in devices:
        entry = store_digest(device.store, tenant).get(tenant, {"messages": 0, "digest": "-"})
        digests[device.name] = entry["digest"]
        say(f"  {device.name:<8} {entry['messages']:>4} messages  digest {entry['digest']}")
    same = len(set(digests.values())) == 1
    say(f"  {'same messages on every node' if same else 'the nodes hold DIFFERENT messages'}")
    checked = all(_attachment_ok(d, tenant, written) for d in devices[1:])
    say(f"  attachment read back on every receiver: {'sha256 matches' if checked else 'MISMATCH'}")
    links = [link.spec for d in devices for link in d.node.links.values()]
    secure = bool(links) and all(spec.url.startswith("wss://") and spec.pin for spec in links)
    say(f"  {len(links)} links, " + ("all over TLS with the advertised certificate pinned" if secure
                                     else "NOT ALL OVER PINNED TLS"))
    return same and checked and secure


def _attachment_ok(device: _Device, tenant: str, written: dict[str, Any]) -> bool:
    """RecordsRead of the attachment on ``device`` (signed by the tenant), bytes compared."""
    read = create_records_read(signer=device.node.identity, filter={"recordId": written["attachment"]})
    reply = device.node.peer.dwn.process_message(tenant, read)
    return bool(reply.code == 200) and hashlib.sha256(reply.data or b"").hexdigest() == written["attachment_sha256"]
