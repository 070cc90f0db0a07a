"""Issue #13's four user scenarios, with real nodes: replicas converge whatever the order.

Each device is a :class:`~p2psync.node.node.Node` of the same tenant (alice) over its own
SQLite file, serving on 127.0.0.1 and keeping a continuous ``both`` link with the peers it
dials, over real WebSockets. Devices are *apart* while stopped (a closed laptop) or while the
device between them is stopped (a hub that is down). What a person does on a device — a
create, an update, a delete, a prune — is a message signed with alice's key and processed by
that device's own engine (``Dwn.process_message`` on its store, as ``p2psync write`` does; the
CLI has no update or delete command yet), accepted there as the reference DWN would.

After the devices are together again and every link has caught up with the log it follows,
every device must hold the same messages (the same ``p2psync store digest``) and show alice
the same records (her RecordsQuery of everything) — and that state is the *canonical* state
of the messages the devices accepted: what one store holds after processing them all in
(messageTimestamp, message CID) order, as the reference would. Last, every link must be
``live`` with nothing left unapplied: no link may report ``live`` while a message it was
offered did not apply.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import ALL_RECORDS_FILTER, create_records_delete, create_records_query
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.node.config import NodeConfig, StaticPeer
from p2psync.node.node import Node
from p2psync.replication.checkpoint import Direction, DirectionCheckpoint, LinkState
from p2psync.state.digest import store_digest
from p2psync.state.ledger import Link
from tests.node.support import free_port
from tests.replication.support import Clock, seeded

ALICE = seeded("alice-user-scenarios")
TENANT = ALICE.did
NOTE = "https://p2psync.example/schemas/note"
FORUM = "https://p2psync.example/protocols/forum"
FORUM_DEFINITION: dict[str, Any] = {
    "protocol": FORUM,
    "published": True,
    "types": {"thread": {"dataFormats": ["text/plain"]}, "reply": {"dataFormats": ["text/plain"]}},
    "structure": {"thread": {"reply": {}}},
}
#: alice's query of every record is made at one fixed time, after every message of a test.
QUERY_TIMESTAMP = "2099-01-01T00:00:00.000000Z"
#: Deadlines for things that must happen (not timing assertions): a node starting or
#: stopping, links reconnecting and catching up. Generous for a loaded 2-core machine; a
#: scenario takes a few seconds.
NODE_DEADLINE = 30.0
SETTLE_DEADLINE = 60.0


# --------------------------------------------------------------------------- devices


@dataclass(eq=False)
class Device:
    """One device of alice: a store file, a fixed port, the peers it dials, and its node
    while it runs."""

    name: str
    path: Path
    port: int
    dials: tuple[Device, ...] = ()
    store: Store | None = None
    node: Node | None = None
    store_id: str | None = None
    _ended: trio.Event | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/_p2psync"

    def open(self) -> Store:
        if self.store is None:
            self.store = Store(self.path)
        return self.store

    @property
    def running(self) -> bool:
        return self.node is not None


@dataclass(eq=False)
class Authored:
    """A message a person wrote on a device, which that device's engine accepted."""

    label: str
    message: dict[str, Any]
    data: bytes | None

    @property
    def cid(self) -> str:
        return message_cid(self.message)

    @property
    def timestamp(self) -> str:
        return str(self.message["descriptor"]["messageTimestamp"])


@dataclass
class Fleet:
    """alice's devices in one trio run (see the module doc)."""

    tmp_path: Path
    nursery: trio.Nursery
    devices: dict[str, Device] = field(default_factory=dict)
    authored: list[Authored] = field(default_factory=list)
    clock: Clock = field(default_factory=lambda: Clock("2031-03-01T10:00:00.000000Z"))

    def add(self, name: str, dials: Iterable[Device] = ()) -> Device:
        device = self.devices[name] = Device(name, self.tmp_path / f"{name}.db", free_port(), tuple(dials))
        return device

    # -- running --------------------------------------------------------------------------------

    async def start(self, *devices: Device) -> None:
        """Start each device's node over its store (reopened as after a restart)."""
        for device in devices:
            assert device.node is None, f"{device.name} runs already"
            config = NodeConfig(host="127.0.0.1", port=device.port, name=device.name, auto=False, discovery=False,
                                peers=tuple(StaticPeer(d.url) for d in device.dials), metrics_port=None)
            node = device.node = Node(config, device.open(), ALICE)
            device.store_id = node.store_id
            ended = device._ended = trio.Event()

            async def run(node: Node, ended: trio.Event, *, task_status: trio.TaskStatus[Node]) -> None:
                try:
                    await node.run(task_status=task_status)
                finally:
                    ended.set()

            with trio.fail_after(NODE_DEADLINE):
                await self.nursery.start(run, node, ended)
        # A dialer whose peer was down waits out its backoff (up to minutes): "sync now".
        for device in self.devices.values():
            if device.node is not None:
                device.node.peer.retry_now()

    async def stop(self, *devices: Device) -> None:
        """Stop each device's node gracefully and close its store (a device turned off)."""
        for device in devices:
            assert device.node is not None and device._ended is not None and device.store is not None
            device.node.stop()
            with trio.fail_after(NODE_DEADLINE):
                await device._ended.wait()
            device.node = None
            device.store.close()
            device.store = None

    async def stop_all(self) -> None:
        await self.stop(*(d for d in self.devices.values() if d.running))

    # -- what a person does on a device -----------------------------------------------------------

    def author(self, device: Device, label: str, message: dict[str, Any], data: bytes | None = None) -> Authored:
        """Process ``message`` on ``device``'s own engine; it must be accepted there."""
        reply = Dwn(device.open()).process_message(TENANT, message, data)
        assert reply.code in (202, 204), f"{label} refused on {device.name}: {reply.code} {reply.detail}"
        authored = Authored(label, message, data)
        self.authored.append(authored)
        return authored

    def write_note(self, device: Device, label: str, text: str) -> RecordsWrite:
        now = self.clock.tick()
        write = RecordsWrite.create(signer=ALICE, data=text.encode(), schema=NOTE, data_format="text/plain",
                                    message_timestamp=now, date_created=now)
        self.author(device, label, write.message, text.encode())
        return write

    def update(self, device: Device, label: str, source: RecordsWrite, text: str) -> RecordsWrite:
        write = RecordsWrite.create_from(source.message, signer=ALICE, data=text.encode(),
                                         message_timestamp=self.clock.tick())
        self.author(device, label, write.message, text.encode())
        return write

    def delete(self, device: Device, label: str, record: RecordsWrite, *, prune: bool = False) -> None:
        message = create_records_delete(record_id=str(record.message["recordId"]), signer=ALICE,
                                        message_timestamp=self.clock.tick(), prune=prune)
        self.author(device, label, message)

    # -- waiting for the links ------------------------------------------------------------------

    def links(self) -> list[tuple[Device, Device]]:
        """(dialer, served) of every link between running devices."""
        return [(d, s) for d in self.devices.values() if d.running for s in d.dials if s.running]

    async def settle(self) -> None:
        """Until every link between running devices has caught up with both logs it follows:
        its pull checkpoint has received through the head of the served device's log, its push
        checkpoint through the head of its own (every listed message answered and the answer
        committed), and it has left ``initial``. Fails with what each link shows when that
        never happens, or when a link then reports ``live`` with a message it could not apply."""
        pairs = self.links()
        assert pairs, "no two running devices are linked"
        with trio.move_on_after(SETTLE_DEADLINE):
            while not all(caught_up(dialer, served) for dialer, served in pairs):
                await trio.sleep(0.05)
            self.honest(pairs)
            return
        raise AssertionError("the links never caught up:\n" + "\n".join(describe_link(d, s) for d, s in pairs))

    @staticmethod
    def honest(pairs: list[tuple[Device, Device]]) -> None:
        """No link reports ``live`` while a message it was offered did not apply (issue #13)."""
        dishonest = [describe_link(d, s) for d, s in pairs
                     if (view := link_view(d, s)) is not None and view[0] == LinkState.LIVE and (view[1] or view[2])]
        if dishonest:
            raise AssertionError("links report live with messages they could not apply:\n" + "\n".join(dishonest))

    # -- the verdict ------------------------------------------------------------------------------

    def label_of(self, cid: str) -> str:
        return next((a.label for a in self.authored if a.cid == cid), cid[-8:])

    def verdict(self) -> None:
        """Every device holds the same messages and shows alice the same records, and that is
        the canonical state of what the devices accepted (see the module doc)."""
        devices = list(self.devices.values())
        held = {d.name: self._held(d) for d in devices}
        digests = {d.name: store_digest(d.open(), TENANT).get(TENANT, {}).get("digest") for d in devices}
        if len(set(digests.values())) != 1:
            raise AssertionError("store digests differ:\n" + "\n".join(
                f"  {n}: {str(digests[n])[:12]}… over {len(held[n])} messages: {', '.join(held[n])}" for n in held))
        visible = {d.name: visible_records(d.open()) for d in devices}
        if len({json.dumps(v, sort_keys=True) for v in visible.values()}) != 1:
            raise AssertionError("alice sees different records:\n" + "\n".join(
                f"  {n}: {self._show(v)}" for n, v in visible.items()))
        canonical_store = Store(self.tmp_path / "canonical.db")
        try:
            dwn = Dwn(canonical_store)
            for authored in sorted(self.authored, key=lambda a: (a.timestamp, a.cid)):
                dwn.process_message(TENANT, authored.message, authored.data)
            canonical_held = sorted(self.label_of(c) for c in canonical_store.messages.cids(TENANT))
            canonical_visible = visible_records(canonical_store)
        finally:
            canonical_store.close()
        first = devices[0]
        if held[first.name] != canonical_held:
            raise AssertionError(f"the devices hold {held[first.name]}, the canonical state {canonical_held}")
        if visible[first.name] != canonical_visible:
            raise AssertionError(f"the devices show {self._show(visible[first.name])},"
                                 f" the canonical state {self._show(canonical_visible)}")

    def _held(self, device: Device) -> list[str]:
        return sorted(self.label_of(c) for c in device.open().messages.cids(TENANT))

    def _show(self, records: list[dict[str, Any]]) -> list[str]:
        return [f"{self.label_of(r['latest'])}" for r in records]

    async def healed(self) -> None:
        """Until every link is ``live`` with nothing left unapplied in either direction (and
        never ``live`` with something unapplied meanwhile)."""
        pairs = self.links()
        with trio.move_on_after(SETTLE_DEADLINE):
            while True:
                self.honest(pairs)
                if all(link_view(d, s) == (LinkState.LIVE, 0, 0) for d, s in pairs):
                    return
                await trio.sleep(0.05)
        raise AssertionError("the links never healed:\n" + "\n".join(describe_link(d, s) for d, s in pairs))


@asynccontextmanager
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    """alice's devices; every node is stopped at the end."""
    async with trio.open_nursery() as nursery:
        devices = Fleet(tmp_path, nursery)
        try:
            yield devices
        finally:
            with trio.CancelScope(shield=True):
                await devices.stop_all()


# --------------------------------------------------------------------------- reading stores and links


def head(store: Store) -> int | None:
    """The position of the last entry of alice's log in ``store`` (None: empty)."""
    entries = store.events.read(TENANT)
    return entries[-1][0] if entries else None


def _link(dialer: Device, served: Device) -> Link | None:
    assert dialer.node is not None
    remote = f"{TENANT}?storeId={served.store_id}"
    return next((lk for lk in dialer.node.peer.ledger.links(TENANT) if lk.key.remote == remote), None)


def _checkpoints(dialer: Device, link: Link) -> tuple[DirectionCheckpoint, DirectionCheckpoint]:
    assert dialer.node is not None
    ledger = dialer.node.peer.ledger
    return ledger.get_checkpoint(link.key, Direction.PULL)[0], ledger.get_checkpoint(link.key, Direction.PUSH)[0]


def _through(checkpoint: DirectionCheckpoint, position: int | None) -> bool:
    received = checkpoint.received_token
    return position is None or (received is not None and received.position >= position)


def caught_up(dialer: Device, served: Device) -> bool:
    link = _link(dialer, served)
    if link is None or link.state == LinkState.INITIAL:
        return False
    assert dialer.store is not None and served.store is not None
    pull, push = _checkpoints(dialer, link)
    return _through(pull, head(served.store)) and _through(push, head(dialer.store))


def link_view(dialer: Device, served: Device) -> tuple[LinkState, int, int] | None:
    """(state, unapplied pull tokens, unapplied push tokens) of the link, None when none."""
    link = _link(dialer, served)
    if link is None:
        return None
    pull, push = _checkpoints(dialer, link)
    return link.state, len(pull.unapplied_tokens), len(push.unapplied_tokens)


def describe_link(dialer: Device, served: Device) -> str:
    link = _link(dialer, served)
    if link is None:
        return f"  {dialer.name} -> {served.name}: no link"
    pull, push = _checkpoints(dialer, link)
    assert dialer.store is not None and served.store is not None

    def at(cp: DirectionCheckpoint) -> str:
        c, r = cp.contiguous_applied_token, cp.received_token
        return (f"applied {None if c is None else c.position}, received {None if r is None else r.position},"
                f" unapplied {len(cp.unapplied_tokens)}")

    return (f"  {dialer.name} -> {served.name}: {link.state}, {link.failure_count} failure(s)"
            f" ({link.last_error or 'no error'}); pull {at(pull)} of {served.name}'s head {head(served.store)};"
            f" push {at(push)} of {dialer.name}'s head {head(dialer.store)}")


def visible_records(store: Store) -> list[dict[str, Any]]:
    """What alice's RecordsQuery of every record answers: per record its id and the CID of
    the write it shows (its latest state), with the data's CID."""
    query = create_records_query(signer=ALICE, filter=dict(ALL_RECORDS_FILTER), message_timestamp=QUERY_TIMESTAMP)
    reply = Dwn(store).process_message(TENANT, query)
    assert reply.code == 200, reply.detail
    out = []
    for entry in reply.entries or []:
        shown = {k: v for k, v in entry.items() if k not in ("encodedData", "initialWrite")}
        out.append({"recordId": entry["recordId"], "latest": message_cid(shown),
                    "dataCid": entry["descriptor"].get("dataCid")})
    return sorted(out, key=lambda r: str(r["recordId"]))


# --------------------------------------------------------------------------- the scenarios


async def test_two_devices_delete_the_same_record_while_apart(tmp_path: Path) -> None:
    """1. A and C each delete one note while apart; then they sync both ways."""
    async with fleet(tmp_path) as f:
        c = f.add("c")
        a = f.add("a", dials=[c])
        note = f.write_note(a, "note", "shared")
        f.write_note(a, "bystander", "stays")
        await f.start(c, a)
        await f.settle()
        await f.stop(a, c)
        # Apart: each device deletes the note, A first.
        f.delete(a, "delete@a", note)
        f.delete(c, "delete@c", note)
        await f.start(c, a)
        await f.settle()
        f.verdict()
        await f.healed()


async def test_a_delete_then_a_later_update_on_another_device(tmp_path: Path) -> None:
    """2. A deletes a note; C, apart, later updates it (a later timestamp); then they sync."""
    async with fleet(tmp_path) as f:
        c = f.add("c")
        a = f.add("a", dials=[c])
        note = f.write_note(a, "note", "draft")
        f.write_note(a, "bystander", "stays")
        await f.start(c, a)
        await f.settle()
        await f.stop(a, c)
        f.delete(a, "delete@a", note)
        f.update(c, "update@c", note, "edited later")
        await f.start(c, a)
        await f.settle()
        f.verdict()
        await f.healed()


async def test_a_prune_then_a_later_edit_of_the_thread(tmp_path: Path) -> None:
    """3. A prunes a thread with a reply; C, apart, later edits the thread; then they sync."""
    async with fleet(tmp_path) as f:
        c = f.add("c")
        a = f.add("a", dials=[c])
        f.author(a, "forum protocol", ProtocolsConfigure.create(
            definition=FORUM_DEFINITION, signer=ALICE, message_timestamp=f.clock.tick()).message)
        now = f.clock.tick()
        thread = RecordsWrite.create(signer=ALICE, data=b"a thread", protocol=FORUM, protocol_path="thread",
                                     data_format="text/plain", message_timestamp=now, date_created=now)
        f.author(a, "thread", thread.message, b"a thread")
        now = f.clock.tick()
        reply = RecordsWrite.create(signer=ALICE, data=b"a reply", protocol=FORUM, protocol_path="thread/reply",
                                    parent_context_id=str(thread.message["contextId"]), data_format="text/plain",
                                    message_timestamp=now, date_created=now)
        f.author(a, "reply", reply.message, b"a reply")
        f.write_note(a, "bystander", "stays")
        await f.start(c, a)
        await f.settle()
        await f.stop(a, c)
        f.delete(a, "prune@a", thread, prune=True)
        f.update(c, "thread edit@c", thread, "the thread, edited later")
        await f.start(c, a)
        await f.settle()
        f.verdict()
        await f.healed()


@pytest.mark.parametrize("first", ["together", "delete", "update"])
async def test_a_line_through_a_hub_that_was_down(tmp_path: Path, first: str) -> None:
    """4. A - B - C (A and C dial the hub B). B is stopped; A deletes a note while C updates it
    (later); then B is restarted and everything heals.

    ``first`` decides which edit reaches the hub first: ``together`` restarts B with A and C
    running (either may win); ``delete`` keeps C off until A has synced with B; ``update``
    keeps A off until C has.
    """
    async with fleet(tmp_path) as f:
        b = f.add("b")
        a = f.add("a", dials=[b])
        c = f.add("c", dials=[b])
        note = f.write_note(a, "note", "draft")
        f.write_note(a, "bystander", "stays")
        await f.start(b, a, c)
        await f.settle()
        await f.stop(b)
        # The hub is down; A and C go on (their links retry), and edit.
        f.delete(a, "delete@a", note)
        f.update(c, "update@c", note, "edited later")
        if first == "together":
            await f.start(b)
        else:
            early, late = (a, c) if first == "delete" else (c, a)
            await f.stop(late)
            await f.start(b)
            await f.settle()
            await f.start(late)
        await f.settle()
        f.verdict()
        await f.healed()


# --------------------------------------------------------------------------- controls
#
# The same moves with edits that do not conflict: these converged before replicated apply
# reached the canonical state too (the scenarios above did not), so a failure of the scenarios
# points at replicated apply or the links, not at this harness.


async def test_control_two_devices_apart_with_edits_that_do_not_conflict(tmp_path: Path) -> None:
    async with fleet(tmp_path) as f:
        c = f.add("c")
        a = f.add("a", dials=[c])
        note = f.write_note(a, "note", "draft")
        other = f.write_note(a, "other", "another")
        await f.start(c, a)
        await f.settle()
        await f.stop(a, c)
        f.delete(a, "delete@a", note)
        f.update(c, "update other@c", other, "edited later")
        f.write_note(c, "new@c", "written on c")
        await f.start(c, a)
        await f.settle()
        f.verdict()
        await f.healed()


async def test_control_a_line_through_a_hub_that_was_down(tmp_path: Path) -> None:
    async with fleet(tmp_path) as f:
        b = f.add("b")
        a = f.add("a", dials=[b])
        c = f.add("c", dials=[b])
        note = f.write_note(a, "note", "draft")
        other = f.write_note(a, "other", "another")
        await f.start(b, a, c)
        await f.settle()
        await f.stop(b)
        f.delete(a, "delete@a", note)
        f.update(c, "update other@c", other, "edited later")
        await f.start(b)
        await f.settle()
        f.verdict()
        await f.healed()
