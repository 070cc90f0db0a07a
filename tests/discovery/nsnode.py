"""A small p2psync node for the namespace tests: a real Peer serving on one address and a real
Discovery bound to it, reporting on stdout as JSON lines.

Run as ``python -m tests.discovery.nsnode '<json config>'`` from the repository root, inside a
namespace (``Namespace.command``). Config keys: ``address``, ``db``, ``identity`` (a seed name),
``tenants`` (seed names), ``private``, ``ttl``, ``check_every``, ``resolve_timeout``, ``notes``
(records to write first), ``prefix``, ``clock`` (first timestamp), ``probe`` (seed names whose
``shares()`` to report), ``sync`` (a seed name: pull that tenant from every peer that shares it).

Out (one JSON object a line): ``ready`` {port, sid, did, name}; ``seen`` {the PeerSeen, url,
shares}; ``gone`` {name, did, sid, reason}; ``synced`` {sid, digest}; ``stopped``.
In (stdin lines): ``stop`` ends the node cleanly (goodbye sent); ``tenants a,b`` republishes the
advert with those tenants. End of stdin also stops it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

import trio

from p2psync.discovery import Advert, Discovery, DiscoveryEvent, PeerGone, PeerSeen
from p2psync.dwn.store import Store
from p2psync.peer.peer import Peer
from p2psync.state.copies import store_id
from p2psync.state.digest import store_digest
from tests.peer.support import Clock, seeded, write_notes


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def did_of(seed: str) -> str:
    return seeded(seed).did


async def lines(stream: trio.lowlevel.FdStream) -> Any:
    buffer = b""
    while True:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode().strip()


async def main(cfg: dict[str, Any]) -> None:
    store = Store(Path(cfg["db"]))
    identity = seeded(cfg["identity"])
    if cfg.get("notes"):
        write_notes(store, identity, cfg["notes"], clock=Clock(cfg.get("clock", "2030-05-01T00:00:00.000000Z")),
                    prefix=cfg.get("prefix", "note"))
    peer = Peer(store, identity)
    tenants = tuple(did_of(t) for t in cfg.get("tenants", []))
    probes = {t: did_of(t) for t in cfg.get("probe", [])}
    sync_tenant = did_of(cfg["sync"]) if cfg.get("sync") else None
    synced: set[str] = set()

    async def pull(seen: PeerSeen) -> None:
        assert sync_tenant is not None
        summary = await peer.sync(seen.url(), tenant=sync_tenant, direction="pull")
        pulled = summary.pull.revs_applied if summary.pull is not None else None
        emit("synced", sid=seen.sid, applied=pulled, digest=store_digest(store, sync_tenant))

    async def watch(events: trio.MemoryReceiveChannel[DiscoveryEvent], nursery: trio.Nursery) -> None:
        async for event in events:
            if isinstance(event, PeerGone):
                emit("gone", **dataclasses.asdict(event))
                continue
            row = dataclasses.asdict(event)
            row["tenants"] = sorted(event.tenants)
            emit("seen", url=event.url(), shares={k: event.shares(v) for k, v in probes.items()}, **row)
            if sync_tenant is not None and event.shares(sync_tenant) and event.sid not in synced:
                synced.add(event.sid)
                nursery.start_soon(pull, event)

    async with trio.open_nursery() as nursery:
        server = await nursery.start(peer.serve, cfg["address"], 0)
        advert = Advert(identity.did, store_id(store), server.port, tenants=tenants,
                        private=bool(cfg.get("private")), ttl=int(cfg.get("ttl", 120)))
        discovery = Discovery(advert, interfaces=[cfg["address"]], check_every=float(cfg.get("check_every", 15)),
                              resolve_timeout=float(cfg.get("resolve_timeout", 3)))
        events = discovery.subscribe()
        await nursery.start(discovery.run)
        emit("ready", port=server.port, sid=advert.sid, did=advert.did, name=discovery.name,
             digest=store_digest(store))
        nursery.start_soon(watch, events, nursery)
        async for line in lines(trio.lowlevel.FdStream(0)):
            if line == "stop":
                break
            if line.startswith("tenants "):
                advert = dataclasses.replace(advert, tenants=tuple(did_of(t) for t in line[8:].split(",") if t))
                await discovery.update(advert)
                emit("updated", tenants=list(advert.tenants))
        nursery.cancel_scope.cancel()
    emit("stopped")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("p2psync.discovery").setLevel(logging.DEBUG)
    trio.run(main, json.loads(sys.argv[1]))
