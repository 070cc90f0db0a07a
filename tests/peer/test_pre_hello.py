"""Before the other side's hello proof checks out, a peer takes only hello-sized messages and
only so many such connections at once (issue #15): a stranger cannot make it gather 64 MiB
messages, or hold every slot, without proving anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from websockets.client import ClientProtocol
from websockets.frames import CloseCode
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

import p2psync.peer.peer as peer_module
from p2psync import blip
from p2psync.blip.codec import FrameEncoder
from p2psync.blip.wire import COMPRESSED, MORE_COMING, MSG, encode_message_head, subprotocol_for
from p2psync.peer.peer import Peer
from p2psync.peer.session import PRE_HELLO_MAX_MESSAGE, REPLICATION_MAX_MESSAGE
from p2psync.replication.wire import APP_ID
from tests.blip.rawpeer import RawPeer
from tests.peer.support import new_store, seeded, served

ALICE = seeded("pre-hello")


async def silent(request: blip.Request) -> blip.Reply:
    await trio.sleep_forever()  # a stranger who never answers the peer's hello
    raise AssertionError("unreachable")


async def test_a_large_request_before_hello_is_refused_unread(tmp_path: Path) -> None:
    async with served(Peer(new_store(tmp_path, "a"), ALICE)) as url, blip.connect(
            url, app_id=APP_ID, handlers={"hello": silent}) as conn:
        with trio.fail_after(10), pytest.raises(blip.BlipError) as info:
            await conn.request("getCollections", body=b"\x00" * (PRE_HELLO_MAX_MESSAGE + 1))
    assert info.value.code == 413


async def test_after_hello_the_replication_limit_applies(tmp_path: Path) -> None:
    peer = Peer(new_store(tmp_path, "b"), ALICE)
    async with served(Peer(new_store(tmp_path, "a"), ALICE)) as url, blip.connect(
            url, app_id=APP_ID, handlers=peer.handlers(active=True)) as conn:
        session = peer.session_for(conn, active=True)
        assert conn.max_message_size == PRE_HELLO_MAX_MESSAGE
        await session.hello()
        assert conn.max_message_size == REPLICATION_MAX_MESSAGE < blip.rpc.MAX_MESSAGE_SIZE
        with trio.fail_after(10), pytest.raises(blip.BlipError) as info:
            # Gathered whole now, then refused by the profile itself (not a map of collections).
            await conn.request("getCollections", body=b"\x00" * (PRE_HELLO_MAX_MESSAGE + 1))
        assert info.value.code != 413
        # The served side too: past the replication limit a message is refused, not gathered.
        with trio.fail_after(20), pytest.raises(blip.BlipError) as info:
            await conn.request("getCollections", body=b"\x00" * (REPLICATION_MAX_MESSAGE + 1))
        assert info.value.code == 413


async def test_connections_that_never_prove_anything_are_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_module, "MAX_UNPROVEN_CONNECTIONS", 2)
    store = new_store(tmp_path, "a")
    async with served(Peer(store, ALICE)) as url:
        async with blip.connect(url, app_id=APP_ID, handlers={"hello": silent}) as first, blip.connect(
                url, app_id=APP_ID, handlers={"hello": silent}) as second:
            async with blip.connect(url, app_id=APP_ID, handlers={"hello": silent}) as third:
                with trio.fail_after(5):
                    await third.wait_closed()
                assert third.close_code == 1013 and "TooManyConnections" in (third.close_text or "")
            assert not first.closed and not second.closed
        # The strangers gone, a peer that proves its DID gets in and syncs.
        with trio.fail_after(10):
            while True:
                try:
                    await Peer(new_store(tmp_path, "b"), ALICE).sync(url, tenant=ALICE.did)
                    break
                except Exception:  # their slots are freed when the server notices the close
                    await trio.sleep(0.1)


async def test_one_address_cannot_take_every_unproven_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that opens silent connections gets MAX_UNPROVEN_PER_ADDRESS of the unproven slots;
    another host still gets in, and so does an honest peer from the first host."""
    monkeypatch.setattr(peer_module, "MAX_UNPROVEN_PER_ADDRESS", 2)
    async with served(Peer(new_store(tmp_path, "a"), ALICE)) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        first = [await RawPeer.connect(port, APP_ID, local_address="127.0.0.2") for _ in range(2)]
        third = await RawPeer.connect(port, APP_ID, local_address="127.0.0.2")
        close = await third.closed_with(5)
        assert close is not None and close.code == 1013 and "TooManyConnections" in close.reason
        other = await RawPeer.connect(port, APP_ID, local_address="127.0.0.3")
        assert await other.closed_with(0.5) is None  # another host: let in (until its hello deadline)
        assert [await p.closed_with(0.1) for p in first] == [None, None]  # not closed by the node
        summary = await Peer(new_store(tmp_path, "b"), ALICE).sync(url, tenant=ALICE.did)
        assert summary.pull is not None


async def test_the_limits_hold_from_the_first_frame(tmp_path: Path) -> None:
    """Frames sent in the same write as the WebSocket handshake are read before the peer's
    session is attached: the connection is opened with hello-sized limits already, so a
    frame inflating to 4 MiB there is a deflate bomb (it used to be gathered)."""
    async with served(Peer(new_store(tmp_path, "a"), ALICE)) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        ws = ClientProtocol(parse_uri(url), subprotocols=[Subprotocol(subprotocol_for(APP_ID))])
        ws.send_request(ws.connect())
        opened = ClientProtocol(parse_uri(url), state=State.OPEN)  # frames the same bytes, unasked
        head = encode_message_head({"Profile": "getCollections"})
        opened.send_binary(FrameEncoder().encode(1, MSG | MORE_COMING | COMPRESSED, head + bytes(4 << 20)))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"".join(ws.data_to_send() + opened.data_to_send()))
        close = await RawPeer(stream, ws).closed_with(5)
    assert close is not None and close.code == CloseCode.PROTOCOL_ERROR and "inflates beyond" in close.reason
