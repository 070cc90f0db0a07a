"""Honest link state and quick catch-up (issue #16) with nodes in one trio run over loopback.

- a link leaves ``live`` as soon as its peer is down, in the status file, ``peers`` and the
  metrics alike, and is ``live`` again once the peer is back;
- a passive device that was away long enough for its dialer's backoff to grow gets its backlog
  within seconds of coming back: at its start it tells the nodes that dialed it (their hello
  said where they listen), and they end their wait;
- an mDNS advert of a returning peer ends the wait too.

The dialer's backoff is made long from the first failure (``retry_schedule``), so a test needs
no minutes of failures to reach it.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from p2psync.cli.sync import status_lines, status_report
from p2psync.node.browse import node_status, peers_lines
from p2psync.node.node import Node
from tests.node.fakes import FakeLan
from tests.node.support import free_port, make_node, metric_samples, scrape, until
from tests.peer.support import Clock, seeded, write_notes

ALICE = seeded("alice-liveness")
#: The dialer's backoff in these tests: a minute from the first failure (30-60 s with jitter),
#: like a real link after about six failures; any catch-up within seconds is the peer's return.
LONG_BACKOFF = 60.0
#: The issue's acceptance: a returning device has its backlog within 5 s of coming back.
CATCH_UP = 5.0
#: A link whose peer is gone leaves `live` within a heartbeat (a BLIP ping interval, 20 s);
#: a peer that stops closes its sockets, so it is much sooner in practice.
HEARTBEAT = 20.0


def long_backoff(failures: int) -> float:
    return LONG_BACKOFF


def url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/_p2psync"


def count(node: Node) -> int:
    return node.store.messages.count(ALICE.did)


async def live_metric(node: Node) -> float:
    """The dialer's one link's ``sync_link_state{state="live"}``, scraped over HTTP."""
    assert node.metrics_url is not None
    _, body = await scrape(node.metrics_url)
    values = [v for s, v in metric_samples(body)["sync_link_state"] if s["state"] == "live"]
    assert len(values) == 1, values
    return values[0]


async def views(node: Node, status_path: Path) -> tuple[str, str, str, float] | None:
    """The link's state as ``status`` and the status file say it, the line ``peers`` prints, and
    the metric (None before the status file names the link)."""
    status = node_status(status_path)
    if status is None or not status["links"] or status["links"][0]["storeId"] is None:
        return None
    [link] = status["links"]
    [line] = [line for line in peers_lines([], status, 0) if line.startswith("  link ")]
    [shown] = status_report(node.store, status)["links"]
    [text] = [x for x in status_lines(status_report(node.store, status)) if x.startswith("  scope ")]
    assert shown["state"] in text
    return shown["state"], link["state"], line, await live_metric(node)


async def test_a_stopped_peer_is_not_live_anywhere_then_live_again(tmp_path: Path) -> None:
    port = free_port()
    status_path = tmp_path / "node-status.json"
    clock = Clock()
    dialer = make_node(tmp_path, "dialer", ALICE, peers=[url(port)], metrics=True, node={"status_path": status_path})
    passive = make_node(tmp_path, "passive", ALICE, port=port)
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run_passive(node: Node, cancel: trio.CancelScope, *, task_status: trio.TaskStatus[None]) -> None:
            with cancel:
                await node.run(task_status=task_status)

        await nursery.start(run_passive, passive, scope)
        await nursery.start(dialer.run)

        async def all_say(live: bool) -> bool:
            seen = await views(dialer, status_path)
            if seen is None:
                return False
            state, in_file, line, metric = seen
            return ((state == "live") == live and (in_file == "live") == live and (", live" in line) == live
                    and (metric == 1.0) == live)

        with trio.fail_after(30):
            while not await all_say(True):
                await trio.sleep(0.1)
        # The peer goes away abruptly (no graceful stop): its sockets close.
        scope.cancel()
        stopped = trio.current_time()
        with trio.fail_after(HEARTBEAT):
            while not await all_say(False):
                await trio.sleep(0.1)
        print(f"not live everywhere {trio.current_time() - stopped:.2f} s after the peer stopped")
        seen = await views(dialer, status_path)
        assert seen is not None
        state, _, line, _ = seen
        assert state in ("connecting", "backoff")
        assert "failure(s)" in line
        # It comes back (same store, same port) with a write the dialer does not have.
        write_notes(passive.store, ALICE, 2, clock=clock)
        back = Node(passive.config, passive.store, ALICE)
        await nursery.start(back.run)
        with trio.fail_after(30):
            while not await all_say(True):
                await trio.sleep(0.1)
        assert count(dialer) == 2
        dialer.stop()
        back.stop()


async def test_a_returning_passive_device_gets_its_backlog_within_seconds(tmp_path: Path) -> None:
    port = free_port()
    callers = tmp_path / "callers.json"
    dialer = make_node(tmp_path, "dialer", ALICE, peers=[url(port)], node={"retry_schedule": long_backoff})
    device = make_node(tmp_path, "device", ALICE, port=port, node={"callers_path": callers})
    clock = Clock()
    async with trio.open_nursery() as nursery:
        away = trio.CancelScope()

        async def run_device(*, task_status: trio.TaskStatus[None]) -> None:
            with away:
                await device.run(task_status=task_status)

        await nursery.start(run_device)
        await nursery.start(dialer.run)
        write_notes(dialer.store, ALICE, 3, clock=clock)
        await until(lambda: count(device) == 3 and [dialer.link_state(x) for x in dialer.links.values()] == ["live"])
        # The device remembers where the dialer listens (the dialer's hello said).
        assert json.loads(callers.read_text())[dialer.store_id]["url"] == dialer.url
        # The device goes away; the dialer's link backs off for a long time.
        away.cancel()
        [link] = dialer.links.values()
        await until(lambda: dialer.link_state(link) == "backoff")
        waiting = link.next_attempt_in()
        assert waiting is not None and waiting > LONG_BACKOFF / 2 - 5
        write_notes(dialer.store, ALICE, 20, clock=clock, prefix="while away")
        # It comes back: same store, same port.
        back = Node(device.config, device.store, ALICE, callers_path=callers)
        await nursery.start(back.run)
        returned = trio.current_time()
        with trio.fail_after(CATCH_UP):
            await until(lambda: count(back) == 23, timeout=CATCH_UP)
        print(f"backlog of 20 received {trio.current_time() - returned:.2f} s after the device came back "
              f"(the dialer was to wait {waiting:.0f} s more)")
        assert back.announced == 1
        dialer.stop()
        back.stop()


async def test_without_a_prompt_the_dialer_waits_out_its_backoff(tmp_path: Path) -> None:
    """The control: a device that does not tell its dialer (no callers file) waits."""
    port = free_port()
    dialer = make_node(tmp_path, "dialer", ALICE, peers=[url(port)], node={"retry_schedule": long_backoff})
    device = make_node(tmp_path, "device", ALICE, port=port)
    async with trio.open_nursery() as nursery:
        away = trio.CancelScope()

        async def run_device(*, task_status: trio.TaskStatus[None]) -> None:
            with away:
                await device.run(task_status=task_status)

        await nursery.start(run_device)
        await nursery.start(dialer.run)
        await until(lambda: [dialer.link_state(x) for x in dialer.links.values()] == ["live"])
        away.cancel()
        [link] = dialer.links.values()
        await until(lambda: dialer.link_state(link) == "backoff")
        back = Node(device.config, device.store, ALICE)
        await nursery.start(back.run)
        await trio.sleep(CATCH_UP)
        assert dialer.link_state(link) == "backoff"
        dialer.stop()
        back.stop()


async def test_an_advert_of_a_returning_peer_ends_the_backoff(tmp_path: Path) -> None:
    lan = FakeLan()
    port = free_port()
    dialer = make_node(tmp_path, "dialer", ALICE, auto=True, discovery=lan.factory,
                       node={"retry_schedule": long_backoff})
    peer = make_node(tmp_path, "peer", ALICE, port=port, auto=False, discovery=lan.factory)
    write_notes(peer.store, ALICE, 2, clock=Clock())
    async with trio.open_nursery() as nursery:
        away = trio.CancelScope()

        async def run_peer(*, task_status: trio.TaskStatus[None]) -> None:
            with away:
                await peer.run(task_status=task_status)

        await nursery.start(run_peer)
        await nursery.start(dialer.run)
        await until(lambda: count(dialer) == 2 and [dialer.link_state(x) for x in dialer.links.values()] == ["live"])
        [link] = dialer.links.values()
        away.cancel()  # it leaves the LAN (a goodbye); its link stays for the grace period
        await until(lambda: dialer.link_state(link) == "backoff")
        write_notes(peer.store, ALICE, 3, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="later")
        back = Node(peer.config, peer.store, ALICE, discovery=lan.factory)
        await nursery.start(back.run)
        returned = trio.current_time()
        with trio.fail_after(CATCH_UP):
            await until(lambda: count(dialer) == 5, timeout=CATCH_UP)
        print(f"caught up {trio.current_time() - returned:.2f} s after the advert")
        dialer.stop()
        back.stop()

