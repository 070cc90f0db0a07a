"""The wider BLIP window (`wideWindow`, replication-profiles.md §15): two p2psync peers that
both offer it let 1,000,000 unacknowledged bytes of a message go; when either does not (an
older p2psync, another implementation) both keep BLIP's 128,000 — an older receiver calls a
sender past that broken. Large records arrive whole either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2psync.blip.wire import MAX_UNACKED_BYTES, WIDE_UNACKED_BYTES
from p2psync.peer import peer as peer_module
from p2psync.peer.peer import Peer
from p2psync.peer.session import PeerSession
from p2psync.replication.hello import OFFERED_CAPABILITIES, REVS, WIDE_WINDOW, new_hello
from tests.peer.support import Clock, assert_same, new_store, seeded, served, write_notes

ALICE = seeded("alice-window")


@pytest.mark.parametrize("narrow", [None, "passive", "active"], ids=["both-offer", "passive-without", "active-without"])
async def test_the_window_is_wide_only_when_both_offer_it(
    tmp_path: Path, narrow: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert WIDE_WINDOW in OFFERED_CAPABILITIES
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_notes(a, ALICE, 6, clock=Clock(), sizes={1: 3_000_000, 4: 2_500_000})
    passive, active = Peer(a, ALICE), Peer(b, ALICE)
    without = {"passive": passive.store_id, "active": active.store_id}.get(narrow or "")

    def hello(did: str, store_id: str, *args: object) -> object:
        offered = (REVS,) if store_id == without else OFFERED_CAPABILITIES
        return new_hello(did, store_id, *args, capabilities=offered)  # type: ignore[arg-type]

    monkeypatch.setattr(peer_module, "new_hello", hello)
    windows: list[int] = []
    original = PeerSession.hello

    async def recorded(self: PeerSession) -> None:
        await original(self)
        if self.conn is not None:
            windows.append(self.conn.send_window)

    monkeypatch.setattr(PeerSession, "hello", recorded)
    async with served(passive) as url:
        summary = await active.sync(url, tenant=ALICE.did, direction="pull")
    assert_same(a, b, ALICE)
    assert summary.pull is not None and summary.pull.attachments_fetched == 2
    expected = MAX_UNACKED_BYTES if narrow else WIDE_UNACKED_BYTES
    assert len(windows) == 2 and set(windows) == {expected}  # the active's session and the passive's
