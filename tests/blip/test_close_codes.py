"""Closing with a WebSocket close code and reason, and the other side observing both.

The peer layer refuses a peer with ``1008`` and ``P2PSync <code> <Name>``
(replication-profiles.md §2 and §13); these tests check that code and reason travel over real
loopback WebSockets in both directions and reach every request still waiting on either side.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import pytest
import trio
import trio.testing

from p2psync import blip
from p2psync.blip import Connection, ConnectionClosed, Reply, Request
from p2psync.blip.lifecycle import MAX_CLOSE_REASON_BYTES

REFUSAL = "P2PSync 401 HelloProofInvalid"


class Side:
    """One end: a handler that holds requests forever, and what its own requests ended with."""

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.holding = trio.Event()  # the peer's request reached our handler
        self.failures: list[ConnectionClosed] = []
        self.done = trio.Event()  # our own request has ended

    async def hang(self, request: Request) -> Reply:
        self.holding.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def ask(self, conn: Connection) -> None:
        try:
            await conn.request("hang", body=b"waiting")
        except ConnectionClosed as exc:
            self.failures.append(exc)
        finally:
            self.done.set()


@pytest.mark.parametrize("closer", ["client", "server"])
async def test_close_code_and_reason_reach_the_other_side(
    closer: Literal["client", "server"], nursery: trio.Nursery
) -> None:
    client, server = Side(), Side()

    async def on_connect(conn: Connection) -> None:
        server.conn = conn
        conn.start_soon(server.ask, conn)
        if closer == "server":
            with trio.fail_after(10):
                await client.holding.wait()
                await server.holding.wait()
            # From one of the connection's own tasks: returns at once, the close goes on.
            await conn.aclose(code=1008, reason=REFUSAL)

    listening = await nursery.start(
        partial(blip.serve, "127.0.0.1", 0, handlers={"hang": server.hang}, on_connect=on_connect)
    )
    url = f"ws://127.0.0.1:{listening.port}/_p2psync"
    async with blip.connect(url, handlers={"hang": client.hang}) as conn:
        client.conn = conn
        nursery.start_soon(client.ask, conn)
        with trio.fail_after(10):
            await client.holding.wait()
            await server.holding.wait()
            if closer == "client":
                await conn.aclose(code=1008, reason=REFUSAL)
            await conn.wait_closed()
            await client.done.wait()
            await server.done.wait()
        assert server.conn is not None
        await server.conn.wait_closed()

    for side in (client, server):
        assert side.conn is not None
        assert (side.conn.close_code, side.conn.close_text) == (1008, REFUSAL)
        # The request each side had in flight failed with the code and the reason.
        (failure,) = side.failures
        assert (failure.close_code, failure.close_text) == (1008, REFUSAL)
        assert REFUSAL in failure.reason
        # So does a request made afterwards.
        with pytest.raises(ConnectionClosed) as info:
            await side.conn.request("hang")
        assert (info.value.close_code, info.value.close_text) == (1008, REFUSAL)
    closing, closed = (client, server) if closer == "client" else (server, client)
    assert closing.conn is not None and closed.conn is not None
    assert closing.conn.close_reason == f"closed by this side (1008 {REFUSAL})"
    assert closed.conn.close_reason == f"peer closed the WebSocket (1008 {REFUSAL})"


async def test_default_close_is_normal_without_reason(nursery: trio.Nursery) -> None:
    accepted: list[Connection] = []

    async def on_connect(conn: Connection) -> None:
        accepted.append(conn)

    listening = await nursery.start(partial(blip.serve, "127.0.0.1", 0, on_connect=on_connect))
    async with blip.connect(f"ws://127.0.0.1:{listening.port}/") as conn:
        assert (conn.close_code, conn.close_text) == (None, None)  # open
        with trio.fail_after(10):
            while not accepted:
                await trio.sleep(0.01)
    (server_conn,) = accepted
    with trio.fail_after(10):
        await server_conn.wait_closed()
    assert (conn.close_code, conn.close_text, conn.close_reason) == (1000, "", "closed by this side")
    assert (server_conn.close_code, server_conn.close_text) == (1000, "")
    assert server_conn.close_reason == "peer closed the WebSocket (1000)"


@pytest.mark.parametrize(
    ("code", "reason"),
    [(1006, ""), (1005, ""), (999, ""), (2000, ""), (5000, ""), (1000, "x" * (MAX_CLOSE_REASON_BYTES + 1)),
     (1008, "é" * (MAX_CLOSE_REASON_BYTES // 2 + 1))],
    ids=["1006", "1005", "999", "2000", "5000", "reason-too-long", "utf8-reason-too-long"],
)
async def test_close_codes_that_cannot_be_sent_are_refused(code: int, reason: str) -> None:
    async def echo(request: Request) -> Reply:
        return Reply(body=request.body)

    async with blip.memory_pair(handlers_b={"echo": echo}) as (a, b):
        with pytest.raises(ValueError):
            await a.aclose(code=code, reason=reason)
        # Nothing happened: the connection still works.
        assert not a.closed
        assert (await a.request("echo", body=b"still open")).body == b"still open"


@pytest.mark.parametrize(
    ("code", "reason"), [(1001, ""), (4000, "app-defined"), (1008, "é" * 61)], ids=["1001", "4000", "utf8-reason"]
)
async def test_codes_that_can_be_sent_arrive(code: int, reason: str) -> None:
    async with blip.memory_pair() as (a, b):
        await b.aclose(code=code, reason=reason)
        await a.wait_closed()
        assert (a.close_code, a.close_text) == (b.close_code, b.close_text) == (code, reason)


async def test_aclose_from_deep_inside_a_handler_returns_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """A handler's own child task closes the connection: aclose must not wait for the close
    to finish (that waits for the handler itself), and the peer still gets code and reason."""
    took: list[float] = []

    async def refuse(request: Request) -> Reply:
        async def close_it() -> None:
            start = trio.current_time()
            await request.connection.aclose(code=1008, reason=REFUSAL)
            took.append(trio.current_time() - start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(close_it)
        await trio.sleep_forever()  # cancelled when the connection ends
        raise AssertionError("unreachable")

    async with blip.memory_pair(handlers_b={"refuse": refuse}) as (a, b):
        with pytest.raises(ConnectionClosed) as info:
            await a.request("refuse")
        assert (info.value.close_code, info.value.close_text) == (1008, REFUSAL)
        await b.wait_closed()
    assert took == [0.0]
    assert b.close_reason == f"closed by this side (1008 {REFUSAL})"
