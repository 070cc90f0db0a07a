"""``Peer``: a store and an identity that serve and run replication (replication-profiles.md).

``await peer.serve(host, port, task_status=...)`` accepts connections (the passive role);
``await peer.sync(url, tenant=..., direction="pull")`` opens one (the active role) and pulls
one tenant's global scope once, returning a :class:`SyncSummary`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Literal

import trio

from p2psync import blip
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import Store
from p2psync.peer.copies import CheckpointCopies, checkpoint_id, store_id
from p2psync.peer.hello import new_hello
from p2psync.peer.session import PeerSession, SinkFeed, SyncStats
from p2psync.peer.wire import APP_ID, PeerError, decode_body, encode_body
from p2psync.replication.checkpoint import DirectionCheckpoint
from p2psync.replication.ledger import Direction, Ledger
from p2psync.replication.scope import SyncScope

__all__ = ["AGENT", "Peer", "SyncSummary"]

AGENT = "p2psync/0.1.0"


@dataclass
class SyncSummary:
    """What one ``sync`` did."""

    tenant: str
    remote: str
    stats: SyncStats
    checkpoint: dict[str, Any]
    copy_rev: str | None


class Peer:
    """A replicating peer over one store, proving ``identity``'s DID in hello."""

    def __init__(self, store: Store, identity: Identity) -> None:
        self.store = store
        self.identity = identity
        self.dwn = Dwn(store)
        self.ledger = Ledger.for_store(store)
        self.copies = CheckpointCopies(store)
        self.store_id = store_id(store)
        self._sessions: weakref.WeakKeyDictionary[blip.Connection, PeerSession] = weakref.WeakKeyDictionary()

    def _new_session(self, active: bool) -> PeerSession:
        return PeerSession(
            store=self.store, dwn=self.dwn, identity=self.identity, ledger=self.ledger, copies=self.copies,
            mine=new_hello(self.identity.did, self.store_id, AGENT), active=active,
        )

    def _session_for(self, conn: blip.Connection, active: bool) -> PeerSession:
        session = self._sessions.get(conn)
        if session is None:
            session = self._new_session(active)
            session.conn = conn
            self._sessions[conn] = session
        return session

    def _handlers(self, active: bool) -> dict[str, Any]:
        profiles = ["hello", "getCollections", "getCheckpoint", "setCheckpoint", "subChanges",
                    "getDependencies", "getAttachment", "changes", "rev", "norev"]
        peer = self

        def make(profile: str) -> Any:
            async def handler(request: blip.Request) -> blip.Reply | None:
                session = peer._session_for(request.connection, active)
                result: blip.Reply | None = await session.handlers()[profile](request)
                return result
            return handler

        return {p: make(p) for p in profiles}

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[blip.BlipServer] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the passive role until cancelled (``server = await nursery.start(peer.serve, ...)``)."""

        # The passive's hello starts when the active's arrives (PeerSession.on_hello); the
        # active sends its hello first thing, and a silent active is cut by BLIP's idle timeout.
        await blip.serve(host, port, APP_ID, self._handlers(active=False), task_status=task_status)

    async def sync(self, url: str, *, tenant: str, direction: Literal["pull"] = "pull") -> SyncSummary:
        """One-shot pull of ``tenant``'s global scope from the peer at ``url``."""
        if direction != "pull":
            raise NotImplementedError("only pull is implemented in this slice")
        async with blip.connect(url, app_id=APP_ID, handlers=self._handlers(active=True)) as conn:
            session = self._session_for(conn, active=True)
            await session.hello()
            assert session.theirs is not None
            scope = SyncScope.global_scope()
            cp_id = checkpoint_id(self.store_id, session.theirs.store_id, scope.scope_id, tenant)
            reply = await session.call(
                "getCollections", {},
                encode_body({"collections": [{"tenant": tenant, "scope": scope.to_wire(), "checkpointId": cp_id}]}),
            )
            copies = decode_body(reply.body)
            copy = copies[0] if isinstance(copies, list) and copies else None
            if copy is None:
                raise PeerError(404, "CollectionNotFound", "the peer refused the collection")
            link = self.ledger.open_link(tenant, f"{session.theirs.did}?storeId={session.theirs.store_id}", scope)
            local, _ = self.ledger.get_checkpoint(link.key, Direction.PULL)
            copy_pull = DirectionCheckpoint.from_wire(copy.get("pull", {})) if copy else DirectionCheckpoint()
            since = _start_token(local, copy_pull)
            feed = SinkFeed(session, 0, tenant, link.key, since)
            session.sink_feeds[0] = feed
            await session.call(
                "subChanges", {"collection": "0"}, encode_body({} if since is None else {"since": since.to_wire()})
            )
            await feed.wait_drained()
            pull, _ = self.ledger.get_checkpoint(link.key, Direction.PULL)
            push, _ = self.ledger.get_checkpoint(link.key, Direction.PUSH)
            props = {"collection": "0"}
            if copy.get("rev"):
                props["rev"] = copy["rev"]
            body = encode_body({"pull": pull.to_wire(), "push": push.to_wire()})
            done = await session.call("setCheckpoint", props, body)
            self.ledger.record_success(link.key)
            await conn.aclose()
            return SyncSummary(tenant, link.key.remote, feed.stats, pull.to_wire(), done.properties.get("rev"))


def _start_token(local: DirectionCheckpoint, copy: DirectionCheckpoint) -> Any:
    """§4.4 on start: equal frontiers resume; otherwise the lower safe point (or the start).

    Deviation (draft 0 slice): the local document is not rewound (the ledger has no rewind
    yet); a replay below the frontier only re-offers items, which are 304 and no-op marks.
    """
    mine, theirs = local.contiguous_applied_token, copy.contiguous_applied_token
    if mine == theirs:
        return mine
    if mine is not None and theirs is not None and mine.same_domain(theirs):
        return min(mine, theirs)
    return None
