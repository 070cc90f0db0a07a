"""Error replies never echo unbounded input (issue #15): a request naming a huge profile, or a
handler refusing with a huge message, gets an ERR of bounded size — a few hundred compressed
bytes must not buy ~100 KB of queued reply."""

from __future__ import annotations

from functools import partial

import pytest
import trio

from p2psync import blip
from p2psync.blip.rpc import MAX_ERROR_MESSAGE_BYTES, MAX_QUOTED_PROFILE

APP = "Bounds"


async def refuse_loudly(request: blip.Request) -> blip.Reply:
    raise blip.BlipError("Test", 400, "é" * 1_000_000)


async def test_an_unknown_profile_is_quoted_briefly(nursery: trio.Nursery) -> None:
    server = await nursery.start(partial(blip.serve, "127.0.0.1", 0, APP, {}))
    async with blip.connect(f"ws://127.0.0.1:{server.port}/_blip", app_id=APP) as conn:
        with trio.fail_after(10), pytest.raises(blip.BlipError) as info:
            await conn.request("p" * 100_000, compress=True)
    assert info.value.code == 404
    assert len(info.value.message) < MAX_QUOTED_PROFILE + 32


async def test_a_handlers_refusal_is_cut_to_the_bound(nursery: trio.Nursery) -> None:
    server = await nursery.start(partial(blip.serve, "127.0.0.1", 0, APP, {"loud": refuse_loudly}))
    async with blip.connect(f"ws://127.0.0.1:{server.port}/_blip", app_id=APP) as conn:
        with trio.fail_after(10), pytest.raises(blip.BlipError) as info:
            await conn.request("loud")
    assert info.value.code == 400
    assert 0 < len(info.value.message.encode()) <= MAX_ERROR_MESSAGE_BYTES
    assert set(info.value.message) == {"é"}  # cut on a character boundary
