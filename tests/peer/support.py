"""Shared pieces of the peer tests: stores with signed records, served peers, comparisons."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records import ALL_RECORDS_FILTER, create_records_query
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from tests.replication.support import Clock, seeded, snapshot

NOTE = "https://p2psync.example/note"

__all__ = ["NOTE", "Clock", "assert_same", "new_store", "seeded", "served", "write_notes"]


def new_store(tmp_path: Path, name: str) -> Store:
    return Store(tmp_path / f"{name}.db")


def write_notes(
    store: Store,
    author: Identity,
    count: int,
    *,
    clock: Clock,
    prefix: str = "note",
    sizes: dict[int, int] | None = None,
) -> list[str]:
    """``count`` signed records by ``author`` in its own DWN; returns their recordIds."""
    dwn = Dwn(store)
    ids = []
    for i in range(count):
        now = clock.tick()
        size = (sizes or {}).get(i)
        data = (bytes([i % 251]) * size) if size is not None else f"{prefix} {i}".encode()
        write = RecordsWrite.create(signer=author, data=data, schema=NOTE, data_format="text/plain",
                                    message_timestamp=now, date_created=now)
        reply = dwn.process_message(author.did, write.message, data)
        assert reply.code == 202, reply.detail
        ids.append(str(write.message["recordId"]))
    return ids


def query_result(store: Store, tenant: Identity) -> list[str]:
    """What a RecordsQuery of everything answers the tenant (record ids, in order)."""
    query = create_records_query(signer=tenant, filter=dict(ALL_RECORDS_FILTER))
    reply = Dwn(store).process_message(tenant.did, query)
    assert reply.code == 200, reply.detail
    return [str(e["recordId"]) for e in reply.entries or []]


def assert_same(a: Store, b: Store, tenant: Identity, *, events: bool = True) -> None:
    """Both stores hold the same messages and data, and answer the same query the same way
    (``events``: and list them in the same log order, which a reconciliation does not keep)."""
    sa, sb = snapshot(a, tenant.did), snapshot(b, tenant.did)
    assert sorted(sa.messages) == sorted(sb.messages)
    assert sa.data == sb.data
    assert sa.replaced == sb.replaced  # the definitions newer ones replaced travel too
    if events:
        assert sa.events == sb.events
    assert query_result(a, tenant) == query_result(b, tenant)


@asynccontextmanager
async def served(peer: Peer) -> AsyncIterator[str]:
    """Serve ``peer`` on 127.0.0.1 for the block; yields its URL (``wss://`` when it has a
    TLS certificate)."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(peer.serve, "127.0.0.1", 0)
        yield f"{'wss' if peer.tls is not None else 'ws'}://127.0.0.1:{server.port}/_p2psync"
        nursery.cancel_scope.cancel()
