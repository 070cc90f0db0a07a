"""Sync over TLS (issue #15): ``wss://`` between two real peers on loopback, what an eavesdropper
on the wire sees, the hello bound to the TLS channel, and certificate pins.

The eavesdropper is a TCP relay that forwards bytes unchanged and keeps a copy; the man in the
middle is a relay that terminates TLS on both sides with its own certificate and forwards the
plaintext — the one attack the channel binding exists for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from p2psync import blip
from p2psync.blip.handshake import MAX_HANDSHAKES
from p2psync.blip.tls import TlsCertificate, TlsPinMismatch, client_context, new_certificate
from p2psync.errors import HandshakeFailed
from p2psync.peer.peer import Peer, dialer
from p2psync.state.digest import store_digest
from tests.peer.support import Clock, new_store, seeded, served, write_notes

ALICE = seeded("tls-alice")
SECRET = "the-secret-text-of-note"


def _pair(tmp_path: Path, *, tls: bool) -> tuple[Peer, Peer]:
    source = new_store(tmp_path, "source")
    write_notes(source, ALICE, 5, clock=Clock(), prefix=SECRET)
    server = Peer(source, ALICE, tls=new_certificate() if tls else None)
    client = Peer(new_store(tmp_path, "client"), ALICE)
    return server, client


async def _pipe(src: trio.abc.Stream, dst: trio.abc.Stream, seen: bytearray) -> None:
    try:
        while data := await src.receive_some(65536):
            seen += data
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        with trio.CancelScope(shield=True):
            await dst.aclose()


@asynccontextmanager
async def relay(
    target_port: int,
    *,
    accept: Callable[[trio.SocketStream], trio.abc.Stream] = lambda s: s,
    dial: Callable[[trio.SocketStream], trio.abc.Stream] = lambda s: s,
) -> AsyncIterator[tuple[int, bytearray, bytearray]]:
    """A relay on 127.0.0.1 to ``target_port``; yields its port and what passed each way (as the
    relay saw it: ciphertext when it only forwards, plaintext when ``accept``/``dial`` wrap TLS)."""
    upstream, downstream = bytearray(), bytearray()

    async def handler(inbound: trio.SocketStream) -> None:
        wrapped = accept(inbound)
        outbound = dial(await trio.open_tcp_stream("127.0.0.1", target_port))
        async with trio.open_nursery() as pipes:
            pipes.start_soon(_pipe, wrapped, outbound, upstream)
            pipes.start_soon(_pipe, outbound, wrapped, downstream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handler, 0)
        yield listeners[0].socket.getsockname()[1], upstream, downstream
        nursery.cancel_scope.cancel()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.mark.parametrize("tls", [True, False], ids=["wss", "ws"])
async def test_a_capture_of_a_wss_sync_holds_no_record_data_or_did(tmp_path: Path, tls: bool) -> None:
    server, client = _pair(tmp_path, tls=tls)
    async with served(server) as url, relay(_port(url)) as (port, upstream, downstream):
        summary = await client.sync(url.replace(str(_port(url)), str(port)), tenant=ALICE.did)
    assert summary.pull is not None and summary.pull.revs_settled == 5
    assert store_digest(client.store) == store_digest(server.store)
    wire = bytes(upstream + downstream)
    assert len(wire) > 5_000  # the whole sync went through the relay
    # The control case shows what the capture would give away without TLS (issue #15).
    leaked = [secret for secret in (SECRET.encode(), ALICE.did.encode(), b"_p2psync", b"BLIP_3")
              if secret in wire]
    if tls:
        assert leaked == []
    else:
        assert SECRET.encode() in leaked and ALICE.did.encode() in leaked


async def test_a_relay_that_terminates_tls_is_refused_on_both_sides(tmp_path: Path) -> None:
    server, client = _pair(tmp_path, tls=True)
    relay_cert = new_certificate()
    relay_server_ctx = relay_cert.server_context()

    def accept(stream: trio.SocketStream) -> trio.abc.Stream:
        return trio.SSLStream(stream, relay_server_ctx, server_side=True)

    def dial(stream: trio.SocketStream) -> trio.abc.Stream:
        return trio.SSLStream(stream, client_context(), server_hostname="127.0.0.1")

    before = store_digest(client.store)
    async with served(server) as url, relay(_port(url), accept=accept, dial=dial) as (port, upstream, downstream):
        with pytest.raises(HandshakeFailed) as info:
            await client.sync(f"wss://127.0.0.1:{port}/_p2psync", tenant=ALICE.did)
        await trio.sleep(0.2)  # let the server's close frame through the relay
    # The client refused the server's proof: it signs another certificate than the relay's.
    assert "channel" in str(info.value)
    # The server refused the client's (its close reason, in the plaintext the relay forwarded).
    assert b"P2PSync 401 HelloChannelMismatch" in bytes(downstream)
    # The relay saw the hellos but no record: nothing was served or stored.
    assert SECRET.encode() not in bytes(downstream)
    assert store_digest(client.store) == before


async def test_a_pinned_certificate_must_match(tmp_path: Path) -> None:
    server, client = _pair(tmp_path, tls=True)
    assert server.tls is not None
    async with served(server) as url:
        with pytest.raises(TlsPinMismatch, match="not the pinned"):
            await client.sync(dialer(url, pin=new_certificate().fingerprint), tenant=ALICE.did)
        summary = await client.sync(dialer(url, pin=server.tls.fingerprint), tenant=ALICE.did)
    assert summary.pull is not None and summary.pull.revs_settled == 5


async def test_plain_and_tls_ends_that_disagree_say_so(tmp_path: Path) -> None:
    server, _client = _pair(tmp_path, tls=True)
    async with served(server) as url:
        with pytest.raises(blip.ConnectionClosed, match="does the peer serve wss://"):
            async with blip.connect(url.replace("wss://", "ws://")):
                pass
    plain, _ = _pair(tmp_path / "plain", tls=False)
    async with served(plain) as url:
        with pytest.raises(blip.ConnectionClosed, match=r"TLS handshake .* failed.*plain ws://"):
            async with blip.connect(url.replace("ws://", "wss://")):
                pass


def test_a_certificate_round_trips_through_its_directory(tmp_path: Path) -> None:
    cert = new_certificate()
    cert.save(tmp_path / "tls")
    again = TlsCertificate.load(tmp_path / "tls")
    assert again == cert and again.fingerprint == cert.fingerprint and len(cert.fingerprint) == 43
    assert (tmp_path / "tls" / "key.pem").stat().st_mode & 0o777 == 0o600
    assert new_certificate().fingerprint != cert.fingerprint


async def test_handshakes_that_never_finish_do_not_lock_out_an_honest_peer(tmp_path: Path) -> None:
    """A stranger opening TCP connections and saying nothing holds at most MAX_HANDSHAKES slots;
    past that the oldest are dropped, and an honest peer still gets in (issue #15)."""
    server, client = _pair(tmp_path, tls=True)
    idle: list[trio.SocketStream] = []
    async with trio.open_nursery() as nursery:
        blip_server = await nursery.start(server.serve, "127.0.0.1", 0)
        port = blip_server.port
        for _ in range(MAX_HANDSHAKES + 40):
            idle.append(await trio.open_tcp_stream("127.0.0.1", port))
        with trio.fail_after(5):
            while blip_server.handshakes_dropped < 40:
                await trio.sleep(0.01)
        assert blip_server.handshaking <= MAX_HANDSHAKES
        with trio.fail_after(10):
            summary = await client.sync(f"wss://127.0.0.1:{port}/_p2psync", tenant=ALICE.did)
        assert summary.pull is not None and summary.pull.revs_settled == 5
        # The first ones opened were dropped: they read the end of the stream.
        with trio.fail_after(5):
            assert await idle[0].receive_some(100) == b""
        for stream in idle:
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_large_records_arrive_whole_over_tls(tmp_path: Path) -> None:
    """Record data above the inline limit travels by getAttachment over the TLS stream, 12 MiB
    at a time; the sink's bound on what it asks at once is checked exactly in
    tests/replication/test_protocol_pump.py."""
    source = new_store(tmp_path, "big-source")
    big = 12 * 1024 * 1024
    write_notes(source, ALICE, 6, clock=Clock(), sizes=dict.fromkeys(range(5), big))
    server = Peer(source, ALICE, tls=new_certificate())
    client = Peer(new_store(tmp_path, "big-client"), ALICE)
    async with served(server) as url:
        summary = await client.sync(url, tenant=ALICE.did)
    assert summary.pull is not None and summary.pull.revs_settled == 6 and summary.pull.bytes_received > 5 * big
    assert store_digest(client.store) == store_digest(source)
