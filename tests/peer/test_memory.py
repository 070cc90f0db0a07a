"""The same replication over in-memory streams under trio's MockClock (virtual time).

The WebSocket handshake, BLIP framing, pings and timeouts are the real code
(``p2psync.blip.memory_pair``); only the bytes travel through memory, so backoff delays,
poll intervals and checkpoint cadences pass in virtual time and the tests are deterministic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from p2psync import blip
from p2psync.blip.pumps import IDLE_TIMEOUT
from p2psync.peer.peer import Peer
from p2psync.replication.wire import APP_ID
from p2psync.state.ledger import Direction
from tests.peer.support import Clock, assert_same, new_store, seeded, write_notes

ALICE = seeded("alice-memory")


@pytest.fixture
def patient_clock() -> trio.testing.MockClock:
    """Virtual time that jumps once the loop has been idle 5 ms of real time, not at once: a
    record's data file is read and hashed on a worker thread, and a clock that jumped while it
    ran could pass the stall watchdog's 120 s and cut the connection (seen in ~4% of runs)."""
    return trio.testing.MockClock(autojump_threshold=0.005)


class Link:
    """Connects an active peer to a passive one over fresh memory streams, and can cut them."""

    def __init__(self, passive: Peer) -> None:
        self.passive = passive
        self.opened = 0
        self.current: tuple[blip.Connection, blip.Connection] | None = None

    @asynccontextmanager
    async def __call__(self, handlers: dict[str, Any]) -> AsyncIterator[blip.Connection]:
        self.opened += 1
        async with blip.memory_pair(APP_ID, handlers, self.passive.handlers(active=False)) as (a, b):
            self.current = (a, b)
            yield a

    async def cut(self) -> None:
        assert self.current is not None
        await self.current[1].aclose(code=1001, reason="going away")


async def until(predicate: Callable[[], bool], seconds: float = 600) -> None:
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.05)


@pytest.mark.parametrize("direction", ["pull", "push", "both"])
async def test_one_shot_in_memory(tmp_path: Path, patient_clock: trio.testing.MockClock, direction: str) -> None:
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    clock = Clock()
    write_notes(a, ALICE, 12, clock=clock, prefix="a", sizes={3: 50_000})
    write_notes(b, ALICE, 7, clock=clock, prefix="b")
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    summary = await active.sync(Link(passive), tenant=ALICE.did, direction=direction)  # type: ignore[arg-type]
    if direction == "both":
        assert_same(a, b, ALICE)
    if summary.pull is not None:
        assert summary.pull.results == {"Applied": 12} and summary.pull.attachments_fetched == 1
    if summary.push is not None:
        assert summary.push.results == {"Applied": 7}
    held_a, held_b = len(a.messages.cids(ALICE.did)), len(b.messages.cids(ALICE.did))
    assert (held_a, held_b) == {"pull": (12, 19), "push": (19, 7), "both": (19, 19)}[direction]


async def test_continuous_reconnects_with_backoff(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """A live link survives drops: it reconnects after a backoff and resumes from its frontier."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 5, clock=Clock())
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    link = Link(passive)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: active.sync(link, tenant=ALICE.did, direction="both", continuous=True))
        await until(lambda: len(b.messages.cids(ALICE.did)) == 5)
        write_notes(b, ALICE, 3, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="on b")
        await until(lambda: len(a.messages.cids(ALICE.did)) == 8)

        cut_at = trio.current_time()
        await link.cut()
        write_notes(a, ALICE, 4, clock=Clock("2032-01-01T00:00:00.000000Z"), prefix="after the cut")
        await until(lambda: len(b.messages.cids(ALICE.did)) == 12)
        back_after = trio.current_time() - cut_at
        assert link.opened == 2
        assert back_after >= 0.5  # the first retry waits 1 s with equal jitter: 0.5 to 1 s
        key = active.ledger.links()[0].key
        assert active.ledger.link(key).failure_count == 0  # caught up again: healthy

        # retry_now() skips the backoff: after a second cut the link is back at once.
        await link.cut()
        current = link.current
        assert current is not None
        await until(lambda: current[0].closed, 5)
        asked_at = trio.current_time()
        active.retry_now()
        await until(lambda: link.opened == 3, 5)
        assert trio.current_time() - asked_at < 0.5
        nursery.cancel_scope.cancel()
    assert_same(a, b, ALICE)
    pull, _ = active.ledger.get_checkpoint(key, Direction.PULL)
    assert pull.contiguous_applied_token is not None


async def test_a_silent_peer_is_dropped_by_the_idle_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A passive that stops answering (a dead laptop lid) is noticed in virtual time."""
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 3, clock=Clock())
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    left, right = trio.testing.memory_stream_pair()
    frozen = trio.Event()

    class Freezing(trio.abc.Stream):
        """The passive's end: once frozen, it neither reads nor writes (and never closes)."""

        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            if frozen.is_set():
                await trio.sleep_forever()
            await right.send_all(data)

        async def wait_send_all_might_not_block(self) -> None:
            await right.wait_send_all_might_not_block()

        async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
            if frozen.is_set():
                await trio.sleep_forever()
            return await right.receive_some(max_bytes)

        async def send_eof(self) -> None:
            await trio.sleep_forever()

        async def aclose(self) -> None:
            await right.aclose()

    @asynccontextmanager
    async def connect(handlers: dict[str, Any]) -> AsyncIterator[blip.Connection]:
        async with blip.memory_pair(APP_ID, handlers, passive.handlers(active=False),
                                    streams=(left, Freezing())) as (conn, _):
            yield conn

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: active.sync(connect, tenant=ALICE.did, continuous=True))
        await until(lambda: len(b.messages.cids(ALICE.did)) == 3)
        frozen.set()
        started = trio.current_time()
        key = active.ledger.links()[0].key
        await until(lambda: active.ledger.link(key).failure_count >= 1, 3600)
        assert trio.current_time() - started >= IDLE_TIMEOUT / 2
        nursery.cancel_scope.cancel()
