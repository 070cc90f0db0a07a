"""Helpers for the BLIP tests: two connected cores, and two connected trio connections."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from p2psync.blip import Connection, HandlerSpec, accept_stream, connect_stream
from p2psync.blip.connection import BlipConnection, Event, MessageData, MessageStart


def pump(sender: BlipConnection, receiver: BlipConnection, max_bytes: int = 1 << 30) -> list[Event]:
    """Move every frame ``sender`` has to ``receiver``; return the events they produced."""
    events: list[Event] = []
    while sender.wants_to_send:
        frames = sender.frames_to_send(max_bytes)
        if not frames:
            break
        for frame in frames:
            events.extend(receiver.receive_message(frame))
    return events


def assemble(events: list[Event]) -> dict[tuple[int, int], tuple[dict[str, str], bytes, int]]:
    """Gather events into whole messages: (type, number) -> (properties, body, flags)."""
    starts: dict[tuple[int, int], MessageStart] = {}
    parts: dict[tuple[int, int], list[bytes]] = {}
    done: dict[tuple[int, int], tuple[dict[str, str], bytes, int]] = {}
    for event in events:
        if isinstance(event, MessageStart):
            key = (min(event.type, 1), event.number)
            starts[key] = event
            parts[key] = [event.body]
            if event.complete:
                done[key] = (event.properties, event.body, event.flags)
        elif isinstance(event, MessageData):
            key = (min(event.type, 1), event.number)
            parts[key].append(event.data)
            if event.complete:
                start = starts[key]
                done[key] = (start.properties, b"".join(parts[key]), start.flags)
    return done


@asynccontextmanager
async def connected_pair(
    client_handlers: Mapping[str, HandlerSpec] | None = None,
    server_handlers: Mapping[str, HandlerSpec] | None = None,
    **options: Any,
) -> AsyncIterator[tuple[Connection, Connection]]:
    """A client and a server connection joined by in-memory streams (deterministic)."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    server_box: list[Connection] = []
    ready = trio.Event()

    async def run_server() -> None:
        async with accept_stream(server_stream, handlers=server_handlers, **options) as server:
            server_box.append(server)
            ready.set()
            await server.wait_closed()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_server)
        async with connect_stream(client_stream, handlers=client_handlers, **options) as client:
            await ready.wait()
            yield client, server_box[0]
