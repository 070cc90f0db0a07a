"""One replication connection: ``hello``, collections, checkpoints, and the routing of the
profiles to each collection's :class:`~p2psync.peer.source.Source` and
:class:`~p2psync.peer.sink.Sink` (replication-profiles.md).

A :class:`PeerSession` wraps one BLIP connection, for either role. The active peer (it opened
the connection) declares collections, pulls through a sink and pushes through a source; the
passive peer answers `getCollections`, the checkpoint copies, feeds `subChanges` through a
source and takes `proposeChanges` into a sink. Whoever is the source of a direction answers
that direction's `getDependencies`, `getAttachment` and `proveAttachment`. Every profile but
``hello`` is refused with ``401 HelloRequired`` until hello has succeeded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import trio

from p2psync import blip
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.progress import ProgressToken
from p2psync.dwn.replication_types import DependencyRef, ReplicationWireError, ref_from_json
from p2psync.dwn.store import Store
from p2psync.peer.hello import Hello, HelloProofInvalid, make_proof, verify_proof
from p2psync.peer.observer import NO_OBSERVER, SyncObserver
from p2psync.peer.sink import Sink
from p2psync.peer.source import Source, message_entry
from p2psync.peer.wire import (
    DEFAULT_BATCH,
    DEFAULT_MAX_DATA,
    ERROR_DOMAIN,
    HELLO_MAX_BODY,
    HELLO_TIMEOUT,
    INLINE_DATA_MAX,
    MAX_BATCH,
    MAX_CHECKPOINT_BODY,
    MAX_COLLECTIONS,
    MAX_ENTRIES_PER_REF,
    MAX_INLINE_PER_DEPENDENCIES,
    MAX_OFFERED,
    MAX_REFS,
    MAX_UNANSWERED_REVS,
    PeerError,
    bool_property,
    decode_body,
    decode_map,
    encode_body,
    int_property,
    refuse,
)
from p2psync.replication.scope import SyncScope
from p2psync.state.committer import GroupCommitter, StoreUnavailable
from p2psync.state.copies import CheckpointCopies, CopyRevConflict, Origins
from p2psync.state.ledger import Ledger
from p2psync.state.local import LocalStoreFetcher
from p2psync.state.log import check_token

__all__ = [
    "ACTIVE_PROFILES",
    "ALL_PROFILES",
    "PASSIVE_PROFILES",
    "Collection",
    "HelloFailed",
    "PeerSession",
    "ReadDecision",
    "attachment_proof",
]

log = logging.getLogger("p2psync.peer")

#: Profiles each role answers (§2's table). The source of a direction answers its
#: getDependencies/getAttachment/proveAttachment, and either role can be a source.
_SOURCE_PROFILES: Final = frozenset({"getDependencies", "getAttachment", "proveAttachment"})
PASSIVE_PROFILES: Final = frozenset(
    {"getCollections", "getCheckpoint", "setCheckpoint", "subChanges", "proposeChanges", "rev", "norev"}
) | _SOURCE_PROFILES
ACTIVE_PROFILES: Final = frozenset({"changes", "rev", "norev"}) | _SOURCE_PROFILES
#: `getAttachment`s one sink keeps in flight on a connection (§12).
MAX_ATTACHMENTS_IN_FLIGHT: Final = 8
#: `getDependencies` one sink keeps in flight on a connection (§12).
MAX_DEPENDENCIES_IN_FLIGHT: Final = 16
#: `proveAttachment` nonce bounds (§9.2, Couchbase's).
PROVE_NONCE_MIN, PROVE_NONCE_MAX = 16, 255
#: Grants an active may bring per collection (§4.1, §12).
MAX_GRANTS: Final = 8


class HelloFailed(Exception):
    """Our side of hello failed (a bad proof, a timeout, a refused hello); the connection closed."""


@dataclass
class ReadDecision:
    """Whether the other peer may read a collection's tenant, and per message (§5)."""

    allowed: bool
    reason: str
    may_read: Callable[[dict[str, Any]], bool] | None  # None: everything (the tenant itself)
    still_valid: Callable[[], bool] | None = None


@dataclass
class Collection:
    """A collection declared on this connection (both sides keep the list)."""

    tenant: str
    scope: SyncScope
    checkpoint_id: str
    decision: ReadDecision | None = None


class PeerSession:
    """One connection's replication state, for either role.

    ``active``: we opened the connection (we declare collections, pull and push).
    """

    def __init__(
        self,
        *,
        store: Store,
        dwn: Dwn,
        identity: Identity,
        ledger: Ledger,
        copies: CheckpointCopies,
        committer: GroupCommitter,
        mine: Hello,
        active: bool,
        accept_push: bool = True,
        max_unanswered_revs: int = MAX_UNANSWERED_REVS,
        authorizer: Any = None,
        max_data: int = DEFAULT_MAX_DATA,
    ) -> None:
        self.store = store
        self.dwn = dwn
        self.identity = identity
        self.ledger = ledger
        self.copies = copies
        self.committer = committer
        self.mine = mine
        self.active = active
        self.accept_push = accept_push
        self.max_unanswered_revs = max_unanswered_revs
        self.authorizer = authorizer
        #: record data above this is not taken (413 in the listing answer, §6.2)
        self.max_data = max_data
        self.conn: blip.Connection | None = None
        self.theirs: Hello | None = None
        self._theirs_arrived = trio.Event()
        self._proof_received = False
        self._hello_started = False
        self._hello_done = trio.Event()
        self._replied = trio.Event()
        self.hello_ok = False
        self.collections: list[Collection | None] = []
        self._declared: set[tuple[str, str]] = set()
        self.sources: dict[int, Source] = {}
        self.sinks: dict[int, Sink] = {}
        self._offered: OrderedDict[str, tuple[str, str, str]] = OrderedDict()  # cid -> tenant, recordId, dataCid
        self.fetcher = LocalStoreFetcher(store)
        self.origins = Origins(store)
        self._attachment_slots = trio.Semaphore(MAX_ATTACHMENTS_IN_FLIGHT)
        self.dependency_slots = trio.Semaphore(MAX_DEPENDENCIES_IN_FLIGHT)
        self.metrics: SyncObserver = NO_OBSERVER  # the Peer's (set by Peer._new_session)
        self._handlers: dict[str, Callable[[blip.Request], Awaitable[blip.Reply | None]]] | None = None

    # -- hello (§3) ------------------------------------------------------------------------

    @property
    def remote_did(self) -> str:
        assert self.theirs is not None
        return self.theirs.did

    async def hello(self) -> None:
        """Send our hello and verify the other's proof; close the connection on failure."""
        assert self.conn is not None
        if self._hello_started:
            await self._hello_done.wait()
            if not self.hello_ok:
                raise HelloFailed("hello failed")
            return
        self._hello_started = True
        try:
            with trio.fail_after(HELLO_TIMEOUT):
                reply = await self.conn.request("hello", {}, encode_body(self.mine.to_wire()), urgent=True)
                self._proof_received = True
                await self._theirs_arrived.wait()
                assert self.theirs is not None
                verify_proof(decode_map(reply.body).get("proof"), self.mine, self.theirs)
                await self._replied.wait()
        except (HelloProofInvalid, blip.BlipError, blip.ConnectionClosed, trio.TooSlowError) as exc:
            self._hello_done.set()
            log.info("hello failed: %s", exc)
            name = "HelloTimeout" if isinstance(exc, trio.TooSlowError) else "HelloProofInvalid"
            await _close(self.conn, 1008, f"P2PSync 401 {name}")
            raise HelloFailed(str(exc) or type(exc).__name__) from exc
        self.hello_ok = True
        self._hello_done.set()
        # The one line a passive node logs per connection (its links are the other side's).
        log.info("%s %s (storeId %s)", "connected to" if self.active else "connection from", self.theirs.did,
                 self.theirs.store_id)

    async def hello_quietly(self) -> None:
        with contextlib.suppress(HelloFailed):
            await self.hello()

    async def on_hello(self, request: blip.Request) -> blip.Reply:
        if self.theirs is not None:
            refuse(409, "HelloRepeated", "a second hello")
        if len(request.body) > HELLO_MAX_BODY:
            refuse(400, "HelloInvalid", "hello body too large")
        theirs = Hello.from_wire(decode_body(request.body, empty_map=False))
        if theirs.store_id == self.mine.store_id:
            refuse(400, "SelfConnection", "the other peer is this store")
        self.theirs = theirs
        self._theirs_arrived.set()
        if not self._hello_started:
            # The passive starts its own hello here at the latest (the BLIP server's on_connect
            # may not run before the first request is dispatched).
            request.connection.start_soon(self.hello_quietly)
            await trio.lowlevel.checkpoint()  # let our hello be queued before this reply
        proof = make_proof(self.identity, self.mine, theirs)
        await request.respond(blip.Reply(body=encode_body({"proof": proof}), urgent=True))
        self._replied.set()
        return blip.Reply()

    async def gate(
        self, request: blip.Request, handler: Callable[[blip.Request], Awaitable[blip.Reply | None]]
    ) -> blip.Reply | None:
        """§3 rule 3: before hello, 401; between the proof's arrival and its check, wait."""
        if not self.hello_ok:
            # Before the other's hello has arrived there is nothing to wait for: 401 at once.
            # After it, its proof check is at most one round trip away, so we wait for it.
            if self.theirs is None:
                refuse(401, "HelloRequired", "no successful hello yet")
            await self._hello_done.wait()
            if not self.hello_ok:
                refuse(401, "HelloRequired", "hello failed")
        role = PASSIVE_PROFILES if not self.active else ACTIVE_PROFILES
        if request.profile not in role:
            refuse(409, "RoleMismatch", f"{request.profile} is not answered by this role")
        return await handler(request)

    async def close(self, code: int, name: str, detail: str = "") -> None:
        """Close the connection with 1008 and the reason ``P2PSync <code> <Name>`` (§2)."""
        if self.conn is None:
            return
        log.info("closing: P2PSync %d %s %s", code, name, detail)
        await _close(self.conn, 1008, f"P2PSync {code} {name}")

    async def call(
        self, profile: str, properties: dict[str, str], body: bytes, *, compress: bool = False, urgent: bool = False
    ) -> blip.Response:
        """A request to the other peer; ``P2PSync`` refusals come back as :class:`PeerError`."""
        assert self.conn is not None
        try:
            return await self.conn.request(profile, properties, body, compress=compress, urgent=urgent)
        except blip.BlipError as exc:
            if exc.domain == ERROR_DOMAIN:
                raise PeerError.from_blip(exc) from exc
            raise PeerError(exc.code, f"BLIP{exc.code}", exc.message) from exc

    # -- collections (§4) -------------------------------------------------------------------

    def collection(self, properties: dict[str, str]) -> tuple[int, Collection]:
        index = int_property(properties, "collection")
        coll = self.collections[index] if index < len(self.collections) else None
        if coll is None:
            refuse(404, "CollectionNotFound", f"no collection {index}")
        return index, coll

    def declare(self, tenant: str, scope: SyncScope, checkpoint_id: str) -> int:
        """Active side: remember a collection we are about to declare; returns its index."""
        self.collections.append(Collection(tenant, scope, checkpoint_id))
        return len(self.collections) - 1

    def refused(self, index: int) -> None:
        """Active side: the passive answered ``null`` for this index."""
        self.collections[index] = None

    async def on_get_collections(self, request: blip.Request) -> blip.Reply:
        body = decode_map(request.body)
        colls = body.get("collections")
        if not isinstance(colls, list) or not 1 <= len(colls) <= MAX_COLLECTIONS:
            refuse(400, "BodyInvalid", "collections must hold 1 to 256 entries")
        if len(self.collections) + len(colls) > MAX_COLLECTIONS:
            refuse(413, "TooManyCollections", "at most 256 collections per connection")
        parsed: list[tuple[str, SyncScope, str, list[Any]]] = []
        for c in colls:
            if not isinstance(c, dict):
                refuse(400, "BodyInvalid", "a Collection must be a map")
            tenant, cid, grants = c.get("tenant"), c.get("checkpointId"), c.get("grants", [])
            if not isinstance(tenant, str) or not tenant.startswith("did:"):
                refuse(400, "BodyInvalid", "tenant must be a DID")
            if not isinstance(cid, str) or not 1 <= len(cid) <= 256:
                refuse(400, "BodyInvalid", "checkpointId must be 1 to 256 characters")
            if not isinstance(grants, list) or len(grants) > MAX_GRANTS:
                refuse(400, "BodyInvalid", f"grants must be an array of at most {MAX_GRANTS} messages")
            try:
                scope = SyncScope.from_wire(c.get("scope"))
            except DwnError as exc:
                refuse(400, "SyncScopeInvalid", str(exc))
            parsed.append((tenant, scope, cid, grants))
        out: list[Any] = []
        for tenant, scope, cid, grants in parsed:
            key = (tenant, scope.scope_id)
            if key in self._declared:
                self.collections.append(None)
                out.append(None)
                continue
            self._declared.add(key)
            await self._apply_grants(tenant, grants)
            self.collections.append(Collection(tenant, scope, cid))
            stored = self.copies.get(self.remote_did, cid)
            out.append({} if stored is None else {"rev": stored[1], **stored[0]})
        return blip.Reply(body=encode_body(out))

    async def _apply_grants(self, tenant: str, grants: list[Any]) -> None:
        """§4.1: grants the active brings are replicated messages of the tenant; apply valid ones."""
        for grant in grants:
            if not isinstance(grant, dict) or not isinstance(grant.get("message"), dict):
                continue
            data = grant.get("data")
            message: dict[str, Any] = grant["message"]

            def apply(m: dict[str, Any] = message, d: Any = data) -> Any:
                return self.dwn.apply_replicated_message(tenant, m, d if isinstance(d, bytes) else None)

            try:
                await self.committer.write(apply)
            except StoreUnavailable as exc:
                refuse(503, "StoreUnavailable", str(exc))

    async def on_get_checkpoint(self, request: blip.Request) -> blip.Reply:
        _, coll = self.collection(request.properties)
        stored = self.copies.get(self.remote_did, coll.checkpoint_id)
        if stored is None:
            return blip.Reply(body=encode_body({}))
        return blip.Reply({"rev": stored[1]}, encode_body(stored[0]))

    async def on_set_checkpoint(self, request: blip.Request) -> blip.Reply:
        _, coll = self.collection(request.properties)
        if len(request.body) > MAX_CHECKPOINT_BODY:
            refuse(413, "BodyTooLarge", "setCheckpoint body above 512 KiB")
        pair = decode_map(request.body)
        if set(pair) != {"pull", "push"}:
            refuse(400, "CheckpointInvalid", "a CheckpointPair has pull and push")
        rev_given = request.properties.get("rev")
        try:
            # Through the group commit: the reply only after a durable commit (§4.3).
            rev = await self.committer.write(
                lambda: self.copies.set(self.remote_did, coll.checkpoint_id, pair, rev_given)
            )
        except CopyRevConflict as exc:
            extra = {} if exc.current is None else {"rev": exc.current}
            refuse(409, "CheckpointRevConflict", "rev is not the stored one", **extra)
        except DwnError as exc:
            refuse(400, "CheckpointInvalid", str(exc))
        except StoreUnavailable as exc:
            refuse(503, "StoreUnavailable", str(exc))
        return blip.Reply({"rev": rev})

    # -- authorization (§5) -----------------------------------------------------------------

    def decision(self, coll: Collection) -> ReadDecision:
        """May the other peer read ``coll``'s tenant (cached per collection)?"""
        if coll.decision is None:
            coll.decision = self._decide(coll)
        return coll.decision

    def _decide(self, coll: Collection) -> ReadDecision:
        if self.remote_did == coll.tenant:
            return ReadDecision(True, "the tenant itself", None)
        if self.authorizer is None:
            return ReadDecision(False, "no grants are honoured by this peer", None)
        decided = self.authorizer.reader(coll.tenant, self.remote_did, coll.scope)
        if not decided.allowed:
            return ReadDecision(False, decided.reason, None)
        authorizer, tenant = self.authorizer, coll.tenant
        return ReadDecision(
            True, decided.reason,
            lambda message: bool(authorizer.may_read(tenant, decided, message)),
            lambda: bool(authorizer.still_valid(tenant, decided)),
        )

    def _require_reader(self, coll: Collection) -> ReadDecision:
        decision = self.decision(coll)
        if not decision.allowed:
            refuse(403, "SyncNotAuthorized", decision.reason or "the peer is not an authorized reader")
        return decision

    # -- the passive's pull feed (§6) -------------------------------------------------------

    async def on_sub_changes(self, request: blip.Request) -> None:
        index, coll = self.collection(request.properties)
        decision = self._require_reader(coll)
        if index in self.sources:
            refuse(409, "FeedActive", "this collection already has a feed")
        continuous = bool_property(request.properties, "continuous")
        batch = min(int_property(request.properties, "batch", default=DEFAULT_BATCH), MAX_BATCH)
        if batch < 1:
            refuse(400, "PropertyInvalid", "batch must be at least 1")
        body = decode_map(request.body)
        since: ProgressToken | None = None
        if "since" in body:
            try:
                since = ProgressToken.from_wire(body["since"])
            except DwnError as exc:
                refuse(400, "ProgressTokenInvalid", str(exc))
            gap = check_token(self.store, coll.tenant, since)
            if gap is not None:
                raise blip.BlipError(ERROR_DOMAIN, 410, json.dumps(gap.to_wire(), separators=(",", ":")))
        latest = self._latest(coll.tenant)
        source = Source(self, index, coll.tenant, coll.scope, batch=batch, continuous=continuous,
                        may_read=decision.may_read)
        if decision.still_valid is not None:
            source.still_valid = decision.still_valid
        self.sources[index] = source
        await request.respond(blip.Reply(body=encode_body({} if latest is None else {"latest": latest.to_wire()})))
        assert self.conn is not None
        self.conn.start_soon(self._run_feed, source, since)

    def _latest(self, tenant: str) -> ProgressToken | None:
        if self.store.tenant_id(tenant, create=False) is None:
            return None
        row = self.store.conn.execute(
            "SELECT e.position, e.cid FROM events e JOIN tenants t ON t.id = e.tenant WHERE t.did=?"
            " ORDER BY e.position DESC LIMIT 1",
            (tenant,),
        ).fetchone()
        if row is None:
            return None
        stream_id, epoch = self.store.events.stream(tenant)
        return ProgressToken(stream_id, epoch, int(row[0]), str(row[1]))

    async def _run_feed(self, source: Source, since: ProgressToken | None) -> None:
        try:
            await source.run(since)
        except PeerError as exc:
            log.info("feed %d ended: %s", source.index, exc)
            if exc.code == 403:
                await self.close(403, "SyncNotAuthorized", exc.detail)
        except blip.ConnectionClosed as exc:
            log.info("feed %d ended: %s", source.index, exc)
        except BaseExceptionGroup as group:
            # `rev`s in flight when the other peer went away fail together: still just closed.
            _, rest = group.split(blip.ConnectionClosed)
            if rest is not None:
                raise
            log.info("feed %d ended: the connection closed", source.index)
        finally:
            self.sources.pop(source.index, None)

    # -- the passive's push sink (§7) -------------------------------------------------------

    async def on_propose_changes(self, request: blip.Request) -> blip.Reply:
        index, coll = self.collection(request.properties)
        if not self.accept_push:
            refuse(403, "PushRefused", "this peer does not take pushes")
        sink = self.sinks.get(index)
        if sink is None:
            sink = self.sinks[index] = Sink(self, index, coll.tenant, key=None, max_data=self.max_data)
        statuses = sink.on_listing(decode_body(request.body), pull=False)
        return blip.Reply(body=encode_body(statuses), urgent=True)

    # -- sinks: `changes`, `rev`, `norev` (§6.2, §8) -----------------------------------------

    def _sink(self, request: blip.Request) -> Sink:
        index = int_property(request.properties, "collection")
        sink = self.sinks.get(index)
        if sink is None:
            name = "ChangesUnsolicited" if request.profile == "changes" else "RevUnsolicited"
            refuse(409, name, f"no open sink for collection {index}")
        return sink

    async def on_changes(self, request: blip.Request) -> blip.Reply:
        statuses = self._sink(request).on_listing(decode_body(request.body), pull=True)
        return blip.Reply(body=encode_body(statuses), urgent=True)

    async def on_rev(self, request: blip.Request) -> blip.Reply:
        started, kind = self.metrics.rev_started(), "Error"
        try:
            result = await self._sink(request).on_rev(request.properties, request.body)
            kind = str(result.get("kind"))
        finally:
            self.metrics.rev_finished(started, kind)
        return blip.Reply(body=encode_body(result))

    async def on_norev(self, request: blip.Request) -> None:
        await self._sink(request).on_norev(request.properties)

    # -- sources: dependencies and data (§9, §10) -------------------------------------------

    def offer(self, tenant: str, entry: Any, size: int | None = None) -> None:
        """Remember a message whose data travels out of line (§9's offered set); ``size``:
        that of data the entry does not carry."""
        if entry.data is not None:
            size = len(entry.data)
        if size is None or size <= INLINE_DATA_MAX:
            return
        d = entry.message["descriptor"]
        self._offered[entry.cid] = (tenant, str(entry.message.get("recordId")), str(d.get("dataCid")))
        self._offered.move_to_end(entry.cid)
        while len(self._offered) > MAX_OFFERED:
            self._offered.popitem(last=False)

    async def on_get_dependencies(self, request: blip.Request) -> blip.Reply:
        _, coll = self.collection(request.properties)
        decision = self._require_reader(coll)
        raw = decode_map(request.body).get("refs")
        if not isinstance(raw, list) or not raw:
            refuse(400, "DependencyRefInvalid", "refs must be a non-empty array")
        if len(raw) > MAX_REFS:
            refuse(413, "TooManyRefs", "at most 128 refs")
        refs: list[DependencyRef] = []
        for r in raw:
            try:
                refs.append(ref_from_json(r))
            except (ReplicationWireError, DwnError, ValueError) as exc:
                refuse(400, "DependencyRefInvalid", str(exc))
        budget = MAX_INLINE_PER_DEPENDENCIES
        answers: list[dict[str, Any]] = []
        for ref in refs:
            entries = [] if ref.terminal else self.fetcher.answer(coll.tenant, ref)[:MAX_ENTRIES_PER_REF]
            out: list[dict[str, Any]] = []
            withheld = False
            for entry in entries:
                if decision.may_read is not None and not decision.may_read(entry.message):
                    withheld = True
                    continue
                size = len(entry.data) if entry.data is not None else 0
                inline = entry.data is not None and size <= INLINE_DATA_MAX and size <= budget
                if inline:
                    budget -= size
                    out.append(message_entry(entry))
                else:
                    if entry.data is not None:
                        self._offered[entry.cid] = (
                            coll.tenant, str(entry.message.get("recordId")), str(entry.message["descriptor"]["dataCid"])
                        )
                    out.append(message_entry(entry, inline=False))
            answer: dict[str, Any] = {"entries": out}
            if withheld:
                answer["withheld"] = True
            answers.append(answer)
        return blip.Reply(body=encode_body({"answers": answers}), urgent=True, compress=True)

    def _offered_data(self, properties: dict[str, str]) -> bytes:
        self.collection(properties)
        cid, dcid = properties.get("messageCid"), properties.get("dataCid")
        offered = self._offered.get(cid or "")
        if offered is None or offered[2] != dcid:
            refuse(404, "MessageNotFound", "not offered on this connection")
        tenant, record_id, _ = offered
        data = self.store.data.get(tenant, record_id, offered[2])
        if data is None:
            entry = self.fetcher.entry_by_cid(tenant, cid or "")
            data = entry.data if entry is not None else None
        if data is None:
            refuse(404, "MessageNotFound", "the data left this store")
        return data

    async def on_get_attachment(self, request: blip.Request) -> blip.Reply:
        return blip.Reply(body=self._offered_data(request.properties))

    async def on_prove_attachment(self, request: blip.Request) -> blip.Reply:
        nonce = decode_map(request.body).get("nonce")
        if not isinstance(nonce, bytes) or not PROVE_NONCE_MIN <= len(nonce) <= PROVE_NONCE_MAX:
            refuse(400, "BodyInvalid", "nonce must be 16 to 255 bytes")
        data = self._offered_data(request.properties)
        return blip.Reply(body=encode_body({"proof": attachment_proof(nonce, data)}))

    async def fetch_attachment(self, properties: dict[str, str], size: int) -> bytes:
        """`getAttachment` (§9.1), read as it streams; more than ``size`` bytes closes the
        connection (BLIP cannot cancel a reply)."""
        assert self.conn is not None
        async with self._attachment_slots:
            buf = bytearray()
            try:
                async with self.conn.request_stream("getAttachment", properties) as reply:
                    async for chunk in reply.body_stream:
                        buf += chunk
                        if len(buf) > size:
                            await self.close(413, "AttachmentTooLong", properties.get("messageCid", ""))
                            raise PeerError(424, "AttachmentInvalid", "more data than dataSize")
            except blip.BlipError as exc:
                if exc.domain == ERROR_DOMAIN:
                    raise PeerError.from_blip(exc) from exc
                raise PeerError(exc.code, f"BLIP{exc.code}", exc.message) from exc
            return bytes(buf)

    def handlers(self) -> dict[str, Callable[[blip.Request], Awaitable[blip.Reply | None]]]:
        """Handlers by profile, all but ``hello`` behind :meth:`gate` (built once per session:
        every `rev` looks its handler up here)."""
        if self._handlers is None:
            self._handlers = self._make_handlers()
        return self._handlers

    def _make_handlers(self) -> dict[str, Callable[[blip.Request], Awaitable[blip.Reply | None]]]:
        table: dict[str, Callable[[blip.Request], Awaitable[Any]]] = {
            "getCollections": self.on_get_collections,
            "getCheckpoint": self.on_get_checkpoint,
            "setCheckpoint": self.on_set_checkpoint,
            "subChanges": self.on_sub_changes,
            "proposeChanges": self.on_propose_changes,
            "getDependencies": self.on_get_dependencies,
            "getAttachment": self.on_get_attachment,
            "proveAttachment": self.on_prove_attachment,
            "changes": self.on_changes,
            "rev": self.on_rev,
            "norev": self.on_norev,
        }
        out: dict[str, Callable[[blip.Request], Awaitable[blip.Reply | None]]] = {"hello": self.on_hello}
        for profile, fn in table.items():
            out[profile] = _bind_gate(self, fn)
        return out


#: Every profile a peer answers (the BLIP handler table is built from this).
ALL_PROFILES: Final = ("hello", *sorted(PASSIVE_PROFILES | ACTIVE_PROFILES))


def attachment_proof(nonce: bytes, data: bytes) -> bytes:
    """§9.2: sha256(len(nonce) as one byte ‖ nonce ‖ data)."""
    digest = hashlib.sha256(bytes([len(nonce)]))
    digest.update(nonce)
    digest.update(data)
    return digest.digest()


async def _close(conn: blip.Connection, code: int, reason: str) -> None:
    """Close with a WebSocket code and reason (§2: 1008 and ``P2PSync <code> <Name>``)."""
    await conn.aclose(code=code, reason=reason)


def _bind_gate(
    session: PeerSession, fn: Callable[[blip.Request], Awaitable[Any]]
) -> Callable[[blip.Request], Awaitable[blip.Reply | None]]:
    async def gated(request: blip.Request) -> blip.Reply | None:
        result: blip.Reply | None = await session.gate(request, fn)
        return result

    return gated

