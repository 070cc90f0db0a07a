"""One-shot pull between two real stores over loopback TCP (replication-profiles.md §3-§10)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio

from p2psync import blip
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import add_seconds
from p2psync.peer.peer import Peer
from p2psync.peer.session import HelloFailed
from p2psync.replication.hello import (
    Hello,
    HelloChannelMismatch,
    HelloProofInvalid,
    make_proof,
    new_hello,
    verify_proof,
)
from p2psync.replication.wire import APP_ID, PeerError, decode_body, encode_body
from tests.replication.support import chat_world, process_all, snapshot

BIG = 40_000  # above the 30,000-byte inline limit: travels by getAttachment


def _source(tmp_path: Path) -> tuple[Store, str]:
    w = chat_world()
    store = Store(tmp_path / "a.db")
    dwn = Dwn(store)
    process_all(dwn, w.tenant, w.ordered())
    for i in range(40):
        now = w.clock.tick()
        data = (b"x" * BIG) if i == 7 else f"note {i}".encode()
        write = RecordsWrite.create(signer=w.alice, data=data, schema="https://p2psync.example/note",
                                    data_format="text/plain", message_timestamp=now, date_created=now)
        reply = dwn.process_message(w.tenant, write.message, data)
        assert reply.code == 202, reply.detail
    return store, w.tenant


async def test_pull_twice_and_refusals(tmp_path: Path) -> None:
    src, tenant = _source(tmp_path)
    alice = chat_world().alice
    assert alice.did == tenant
    dst = Store(tmp_path / "b.db")
    server_peer = Peer(src, alice)
    client = Peer(dst, alice)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(server_peer.serve, "127.0.0.1", 0)
        url = f"ws://127.0.0.1:{server.port}/_p2psync"
        first = await client.sync(url, tenant=tenant)
        assert sorted(src.messages.cids(tenant)) == sorted(dst.messages.cids(tenant))
        a, b = snapshot(src, tenant), snapshot(dst, tenant)
        assert a.messages.keys() == b.messages.keys()
        assert a.data == b.data and a.events == b.events
        assert first.stats.revs_received > 0 and first.stats.attachments_fetched == 1
        assert first.stats.revs_applied + first.stats.dependencies_fetched >= len(a.messages)
        assert first.copy_rev is not None and first.copy_rev.startswith("1-")

        second = await client.sync(url, tenant=tenant)
        assert second.stats.revs_received == 0
        assert second.stats.items_offered == 0  # resumed from the frontier: nothing new listed
        assert second.copy_rev is not None and second.copy_rev.startswith("2-")

        # Another DID may say hello, but may not read alice's log.
        mallory = Peer(Store(tmp_path / "m.db"), Identity.generate())
        with pytest.raises(PeerError) as err:
            await mallory.sync(url, tenant=tenant)
        assert (err.value.code, err.value.name) == (403, "SyncNotAuthorized")
        nursery.cancel_scope.cancel()


async def test_forged_hello_is_refused(tmp_path: Path) -> None:
    src, tenant = _source(tmp_path)
    alice = chat_world().alice
    mallory = Identity.generate()
    server_peer = Peer(src, alice)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(server_peer.serve, "127.0.0.1", 0)
        url = f"ws://127.0.0.1:{server.port}/_p2psync"
        mine = new_hello(alice.did, "00000000-0000-4000-8000-000000000001")  # claims alice's DID
        got: dict[str, Hello] = {}

        async def on_hello(request: blip.Request) -> blip.Reply:
            got["theirs"] = Hello.from_wire(decode_body(request.body))
            return blip.Reply(body=encode_body({"proof": make_proof(mallory, mine, got["theirs"])}))

        async with blip.connect(url, app_id=APP_ID, handlers={"hello": on_hello}) as conn:
            # Before hello succeeds, every other profile is refused. The server sends its own
            # hello on connect and checks our forged proof: a refusal or the close, whichever first.
            with pytest.raises((blip.BlipError, blip.ConnectionClosed)) as early:
                await conn.request("getCollections", {}, encode_body({"collections": []}))
            if isinstance(early.value, blip.BlipError):
                assert (early.value.domain, early.value.code) == ("P2PSync", 401)
            with pytest.raises((blip.BlipError, blip.ConnectionClosed)):
                await conn.request("hello", {}, encode_body(mine.to_wire()))
                await conn.request("getCollections", {}, encode_body({"collections": []}))
            await conn.wait_closed()
            # §2: a failed hello closes with 1008 and the reason "P2PSync 401 <Name>".
            assert conn.close_code == 1008 and (conn.close_text or "").startswith("P2PSync 401 Hello")
        nursery.cancel_scope.cancel()


def test_verify_proof_checks() -> None:
    alice, mallory = Identity.generate(), Identity.generate()
    a = new_hello(alice.did, "00000000-0000-4000-8000-00000000000a")
    b = new_hello(mallory.did, "00000000-0000-4000-8000-00000000000b")
    verify_proof(make_proof(alice, a, b), b, a)  # alice proves to b over b's nonce
    with pytest.raises(HelloProofInvalid):
        verify_proof(make_proof(mallory, a, b), b, a)  # right payload, wrong key
    with pytest.raises(HelloProofInvalid):
        stale = Hello(b.did, b.store_id, bytes(32))
        verify_proof(make_proof(alice, a, stale), b, a)  # over another nonce
    # A peer's identity is Ed25519 (the proof is EdDSA): an ECDSA author cannot be a peer.
    carol = Identity.generate("key", "secp256k1")
    with pytest.raises(ValueError, match="Ed25519"):
        make_proof(carol, new_hello(carol.did, "00000000-0000-4000-8000-00000000000c"), b)


def test_a_proof_binds_the_tls_channel() -> None:
    alice, bob = Identity.generate(), Identity.generate()
    a = new_hello(alice.did, "00000000-0000-4000-8000-00000000000a")
    b = new_hello(bob.did, "00000000-0000-4000-8000-00000000000b")
    ours, relays = "tls-server-end-point:" + "A" * 43, "tls-server-end-point:" + "B" * 43
    verify_proof(make_proof(alice, a, b, ours), b, a, ours)
    for signed, seen in ((relays, ours), (None, ours), (ours, None)):
        # Another certificate (a relay's), a plain proof over TLS, a TLS proof over plain.
        with pytest.raises(HelloChannelMismatch, match="channel"):
            verify_proof(make_proof(alice, a, b, signed), b, a, seen)
    with pytest.raises(HelloProofInvalid) as info:  # another nonce and another channel: not a relay
        verify_proof(make_proof(alice, a, Hello(b.did, b.store_id, bytes(32)), relays), b, a, ours)
    assert not isinstance(info.value, HelloChannelMismatch)


async def test_hello_fails_against_forging_server(tmp_path: Path) -> None:
    alice, mallory = Identity.generate(), Identity.generate()
    store_mine = "00000000-0000-4000-8000-0000000000aa"

    forged = new_hello(alice.did, store_mine)

    async def send_own_hello(conn: blip.Connection) -> None:
        # A real passive sends its own hello too; the client checks the forged proof then.
        with contextlib.suppress(Exception):
            await conn.request("hello", {}, encode_body(forged.to_wire()))

    async def on_hello(request: blip.Request) -> blip.Reply:
        theirs = Hello.from_wire(decode_body(request.body))
        nursery.start_soon(send_own_hello, request.connection)
        return blip.Reply(body=encode_body({"proof": make_proof(mallory, forged, theirs)}))

    async with trio.open_nursery() as nursery:
        server = await nursery.start(blip.serve, "127.0.0.1", 0, APP_ID, {"hello": on_hello})
        client = Peer(Store(tmp_path / "c.db"), alice)
        with pytest.raises(HelloFailed):
            await client.sync(f"ws://127.0.0.1:{server.port}/_p2psync", tenant=alice.did)
        nursery.cancel_scope.cancel()


def _notes(dwn: Dwn, tenant: str, signer: Identity, n: int, first: str) -> None:
    now = first
    for i in range(n):
        now = add_seconds(now, 1)
        data = f"note {i} ".encode() * 20
        write = RecordsWrite.create(signer=signer, data=data, schema="https://p2psync.example/note",
                                    data_format="text/plain", message_timestamp=now, date_created=now)
        assert dwn.process_message(tenant, write.message, data).code == 202


@pytest.mark.parametrize("direction", ["pull", "push"])
async def test_a_catch_up_in_log_order_is_applied_in_runs(tmp_path: Path, direction: str) -> None:
    """Issue #17: a replica catching up applies the initial writes of a `revs` together
    (Dwn.apply_replicated_run), pulling and being pushed to alike, and ends as the source is."""
    src, tenant = _source(tmp_path)
    alice = chat_world().alice
    _notes(Dwn(src), tenant, alice, 300, "2031-01-01T00:00:00.000000Z")
    dst = Store(tmp_path / "b.db")
    server_peer = Peer(src if direction == "pull" else dst, alice)
    client = Peer(dst if direction == "pull" else src, alice)
    receiver = server_peer if direction == "push" else client
    async with trio.open_nursery() as nursery:
        server = await nursery.start(server_peer.serve, "127.0.0.1", 0)
        await client.sync(f"ws://127.0.0.1:{server.port}/_p2psync", tenant=tenant, direction=direction)
        nursery.cancel_scope.cancel()
    a, b = snapshot(src, tenant), snapshot(dst, tenant)
    assert a.messages == b.messages and a.data == b.data and a.events == b.events
    history = receiver.dwn.history
    assert history.run_applied >= 250 and history.run_aborts == 0
    assert history.verify(tenant) == {"missing": [], "extra": [], "changed": [], "data": []}
