"""Signatures of waiting `rev`s checked on a worker thread (p2psync/peer/prewarm.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import trio

from p2psync.dwn import jws
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.peer.peer import Peer
from p2psync.peer.prewarm import SignaturePrewarmer
from p2psync.replication.digest import store_digest
from tests.peer.support import new_store, served, write_notes
from tests.replication.support import Clock, seeded

ALICE = seeded("prewarm-alice")


def signed(text: str) -> dict[str, Any]:
    now = Clock().tick()
    write = RecordsWrite.create(signer=ALICE, data=text.encode(), schema="https://p2psync.example/prewarm",
                                data_format="text/plain", message_timestamp=now, date_created=now)
    return write.message


async def drain(prewarmer: SignaturePrewarmer) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(prewarmer.run)
        while prewarmer.pending:
            await trio.sleep(0.01)
        await trio.sleep(0.05)  # the last batch's thread hop
        nursery.cancel_scope.cancel()


async def test_a_good_signature_is_verified_ahead_and_the_apply_finds_it_cached() -> None:
    message = signed("ahead of its turn")
    jws._verify_entry.cache_clear()
    prewarmer = SignaturePrewarmer()
    prewarmer.offer(message)
    assert prewarmer.offered == 1
    await drain(prewarmer)
    assert prewarmer.verified == 1
    hits = jws._verify_entry.cache_info().hits
    assert jws.verify(message["authorization"]["signature"]) == [ALICE.did]
    assert jws._verify_entry.cache_info().hits == hits + 1


async def test_a_forged_signature_is_never_cached_and_still_refused(tmp_path: Path) -> None:
    message = signed("tampered")
    forged = copy.deepcopy(message)
    sig = forged["authorization"]["signature"]["signatures"][0]
    sig["signature"] = ("A" if sig["signature"][0] != "A" else "B") + sig["signature"][1:]
    jws._verify_entry.cache_clear()
    prewarmer = SignaturePrewarmer()
    prewarmer.offer(forged)
    prewarmer.offer({"authorization": "not a map"})  # malformed: nothing to check, no error
    await drain(prewarmer)
    assert prewarmer.offered == 1 and prewarmer.verified == 0
    assert jws._verify_entry.cache_info().currsize == 0
    reply = Dwn(new_store(tmp_path, "target")).process_message(ALICE.did, forged, b"tampered")
    assert reply.code == 401, reply.detail


async def test_a_full_queue_drops_offers_instead_of_waiting() -> None:
    prewarmer = SignaturePrewarmer(queue=1)
    prewarmer.offer(signed("first"))
    prewarmer.offer(signed("second"))
    assert (prewarmer.offered, prewarmer.dropped) == (1, 1)


async def test_a_pull_prewarms_the_revs_that_wait(tmp_path: Path) -> None:
    """Over loopback: revs queued behind the first are checked ahead, and the result is the
    same store as without (the digest)."""
    source = new_store(tmp_path, "source")
    write_notes(source, ALICE, 60, clock=Clock())
    jws._verify_entry.cache_clear()
    puller = Peer(new_store(tmp_path, "puller"), ALICE)
    async with served(Peer(source, ALICE)) as url:
        summary = await puller.sync(url, tenant=ALICE.did)
    assert summary.pull is not None and summary.pull.revs_applied == 60
    assert store_digest(puller.store) == store_digest(source)
    # Both peers share this process's cache, but only the puller verifies during a sync: a hit
    # is an apply that found its signature already checked by the prewarmer.
    assert jws._verify_entry.cache_info().hits > 0
