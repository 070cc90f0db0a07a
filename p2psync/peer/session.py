"""One replication connection: ``hello``, then the passive (source) and active (sink) profiles.

A :class:`PeerSession` wraps one BLIP connection (replication-profiles.md). Implemented in this
slice: ``hello`` both ways (§3), ``getCollections`` (§4.1), ``getCheckpoint``/``setCheckpoint``
(§4.3), a one-shot pull feed (``subChanges``, ``changes``, ``rev``, ``norev``, §6 and §8),
``getDependencies`` (§10) and ``getAttachment`` (§9.1). Every profile but ``hello`` is refused
with ``401 HelloRequired`` until hello has succeeded.

The engine is synchronous and runs on the trio thread: a few ms per message (see FACTS.md),
acceptable for this slice; a store-owning worker thread is the next step.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from p2psync import blip
from p2psync.dwn.datacid import data_cid
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.progress import ProgressToken
from p2psync.dwn.replication_types import (
    Deferred,
    DependencyRef,
    ReplicationApplyResult,
    ReplicationWireError,
    ref_from_json,
)
from p2psync.dwn.store import Store
from p2psync.peer.copies import CheckpointCopies, CopyRevConflict
from p2psync.peer.hello import Hello, HelloProofInvalid, make_proof, verify_proof
from p2psync.peer.wire import (
    DEFAULT_BATCH,
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
from p2psync.replication.checkpoint import DirectionCheckpoint
from p2psync.replication.closure import ClosureAdmitter, ReplicationEntry
from p2psync.replication.ledger import Direction, Ledger, LinkKey, Step
from p2psync.replication.local import LocalStoreFetcher
from p2psync.replication.scope import SyncScope
from p2psync.replication.tokens import check_token

__all__ = ["ACTIVE_PROFILES", "PASSIVE_PROFILES", "Collection", "HelloFailed", "PeerSession", "SyncStats"]

log = logging.getLogger("p2psync.peer")

#: Profiles only the passive peer answers, and only the active peer answers (§2's table).
PASSIVE_PROFILES: Final = frozenset(
    {"getCollections", "getCheckpoint", "setCheckpoint", "subChanges", "getDependencies", "getAttachment"}
)
ACTIVE_PROFILES: Final = frozenset({"changes", "rev", "norev"})
#: Results that settle a token (§11's table).
SETTLING_KINDS: Final = frozenset({"Applied", "Duplicate", "Superseded", "Invalid"})


class HelloFailed(Exception):
    """Our side of hello failed (a bad proof, a timeout, a refused hello); the connection closed."""


@dataclass
class Collection:
    """A collection declared on this connection (passive side)."""

    tenant: str
    scope: SyncScope
    checkpoint_id: str


@dataclass
class SyncStats:
    """What one direction of one collection moved (the sink's counts)."""

    items_offered: int = 0
    items_skipped: int = 0  # answered 304
    revs_received: int = 0
    revs_applied: int = 0  # rev results that made new state (Applied)
    revs_settled: int = 0
    results: dict[str, int] = field(default_factory=dict)
    dependencies_fetched: int = 0
    attachments_fetched: int = 0
    bytes_received: int = 0


@dataclass
class _Item:
    token: ProgressToken
    wanted: bool
    data_size: int | None = None


class _RecordingApplier:
    """The local engine, remembering the root's last result (the ``rev`` reply, §8.2)."""

    def __init__(self, dwn: Dwn, root_cid: str) -> None:
        self.dwn = dwn
        self.root_cid = root_cid
        self.last: ReplicationApplyResult | None = None

    async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
        result = self.dwn.apply_replicated_message(tenant, entry.message, entry.data)
        if entry.cid == self.root_cid:
            self.last = result
        await trio.lowlevel.checkpoint()  # let the connection breathe between applies
        return result


class RemoteFetcher:
    """Answers the closure loop's refs from the source over BLIP (``getDependencies``, §10)."""

    def __init__(self, session: PeerSession, feed: SinkFeed) -> None:
        self.session = session
        self.feed = feed

    async def fetch(self, tenant: str, refs: Any) -> list[list[ReplicationEntry]]:
        out: list[list[ReplicationEntry]] = []
        refs = list(refs)
        for start in range(0, len(refs), MAX_REFS):
            chunk = refs[start : start + MAX_REFS]
            body = encode_body({"refs": [r.to_json() for r in chunk]})
            reply = await self.session.call("getDependencies", {"collection": str(self.feed.index)}, body)
            self.feed.stats.bytes_received += len(reply.body)
            answers = decode_map(reply.body).get("answers")
            if not isinstance(answers, list) or len(answers) != len(chunk):
                raise PeerError(400, "BodyInvalid", "getDependencies answers do not match the refs")
            for answer in answers:
                entries: list[ReplicationEntry] = []
                raw = answer.get("entries", []) if isinstance(answer, dict) else []
                for item in raw[:MAX_ENTRIES_PER_REF] if isinstance(raw, list) else []:
                    entries.append(await self.feed.entry_of(item))
                out.append(entries)
            self.feed.stats.dependencies_fetched += sum(len(a) for a in out)
        return out


class SinkFeed:
    """The active peer's side of one pull feed: statuses, revs in feed order, the ledger."""

    def __init__(
        self, session: PeerSession, index: int, tenant: str, key: LinkKey, since: ProgressToken | None
    ) -> None:
        self.session = session
        self.index = index
        self.tenant = tenant
        self.key = key
        self.domain = None if since is None else since.domain
        self.last: ProgressToken | None = since
        self.queue: deque[_Item] = deque()
        self.stats = SyncStats()
        self.caught_up = trio.Event()
        self._changed = trio.Event()
        self.ended = False

    # -- helpers ---------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def drained(self) -> bool:
        return self.caught_up.is_set() and not self.queue

    async def wait_drained(self) -> None:
        while not self.drained():
            if self.session.conn is not None and self.session.conn.closed:
                raise PeerError(503, "ConnectionLost", self.session.conn.close_reason or "closed")
            changed = self._changed
            with trio.move_on_after(1.0):
                await changed.wait()

    def _settle_heads(self) -> None:
        """Mark received+applied every settled head (304, through) up to the next wanted item."""
        steps: list[Step] = []
        while self.queue and not self.queue[0].wanted:
            item = self.queue.popleft()
            steps += [("received", item.token), ("applied", item.token)]
        if steps:
            self.session.ledger.record(self.key, Direction.PULL, steps)
            self._notify()

    async def entry_of(self, obj: Any) -> ReplicationEntry:
        """A MessageEntry (§8.1) as a ReplicationEntry, fetching out-of-line data (§9.1)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("message"), dict):
            raise PeerError(400, "BodyInvalid", "MessageEntry needs a message map")
        message: dict[str, Any] = obj["message"]
        entry = ReplicationEntry(message)
        size = obj.get("dataSize")
        data = obj.get("data")
        if size is None:
            return entry
        if type(size) is not int or size < 0:
            raise PeerError(400, "BodyInvalid", "dataSize must be an unsigned integer")
        if data is None:
            if size <= INLINE_DATA_MAX:
                raise PeerError(424, "AttachmentInvalid", "small data must travel inline")
            data = await self._attachment(entry.cid, message)
            self.stats.attachments_fetched += 1
        if not isinstance(data, bytes):
            raise PeerError(400, "BodyInvalid", "data must be a byte string")
        _check_data(message, size, data)
        return entry.with_data(data)

    async def _attachment(self, cid: str, message: dict[str, Any]) -> bytes:
        descriptor = message.get("descriptor") if isinstance(message.get("descriptor"), dict) else {}
        dcid = descriptor.get("dataCid") if isinstance(descriptor, dict) else None
        if not isinstance(dcid, str):
            raise PeerError(424, "AttachmentInvalid", "message names no dataCid")
        props = {"collection": str(self.index), "messageCid": cid, "dataCid": dcid}
        try:
            reply = await self.session.call("getAttachment", props, b"")
        except PeerError as exc:
            raise PeerError(424, "AttachmentUnavailable", str(exc)) from exc
        self.stats.bytes_received += len(reply.body)
        return reply.body

    # -- profiles --------------------------------------------------------------------------

    async def on_changes(self, body: Any) -> list[int]:
        if not isinstance(body, dict):
            refuse(400, "ChangesInvalid", "Changes must be a map")
        items = body.get("items", [])
        if not isinstance(items, list):
            refuse(400, "ChangesInvalid", "items must be an array")
        stream_id, epoch = body.get("streamId"), body.get("epoch")
        tokens: list[tuple[ProgressToken, int | None]] = []
        for raw in items:
            if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[0], str):
                refuse(400, "ChangesInvalid", "an item is [position, messageCid, recordId?, dataSize?]")
            try:
                token = ProgressToken.from_wire(
                    {"streamId": stream_id, "epoch": epoch, "position": raw[0], "messageCid": raw[1]}
                )
            except DwnError as exc:
                refuse(400, "ChangesInvalid", f"bad item: {exc}")
            size = raw[3] if len(raw) > 3 else None
            tokens.append((token, size if type(size) is int else None))
        through = None
        if "through" in body:
            try:
                through = ProgressToken.from_wire(body["through"])
            except DwnError as exc:
                refuse(400, "ChangesInvalid", f"bad through: {exc}")
        for token in [t for t, _ in tokens] + ([through] if through is not None else []):
            if self.domain is None:
                self.domain = token.domain
            if token.domain != self.domain:
                refuse(400, "ChangesInvalid", "one domain per feed")
        last = self.last
        for token, _ in tokens:
            if last is not None and token.position <= last.position:
                refuse(400, "ChangesInvalid", "items must ascend past everything listed before")
            last = token
        if through is not None and last is not None and through.position < last.position:
            refuse(400, "ChangesInvalid", "through is below the last item")
        statuses: list[int] = []
        store = self.session.store
        for token, size in tokens:
            have = store.messages.has(self.tenant, token.message_cid)
            statuses.append(304 if have else 0)
            self.queue.append(_Item(token, wanted=not have, data_size=size))
        self.stats.items_offered += len(tokens)
        self.stats.items_skipped += statuses.count(304)
        if through is not None and (last is None or through.position > last.position):
            self.queue.append(_Item(through, wanted=False))
            last = through
        self.last = last
        if not tokens and not self.caught_up.is_set():
            self.caught_up.set()
        self._settle_heads()
        while statuses and statuses[-1] == 0:
            statuses.pop()  # trailing zeros are implied (§6.2)
        return statuses

    def _wanted(self, position: int, cid: str) -> _Item:
        for item in self.queue:
            if item.wanted and item.token.position == position and item.token.message_cid == cid:
                return item
        refuse(409, "RevUnsolicited", f"no wanted item at {position}")

    async def _turn(self, item: _Item) -> None:
        while self.queue[0] is not item:
            changed = self._changed
            await changed.wait()

    async def on_rev(self, properties: dict[str, str], body: bytes) -> dict[str, Any]:
        position = int_property(properties, "position")
        cid = properties.get("messageCid", "")
        item = self._wanted(position, cid)
        await self._turn(item)
        try:
            self.stats.revs_received += 1
            self.stats.bytes_received += len(body)
            self.session.ledger.record_received(self.key, Direction.PULL, item.token)
            try:
                entry = await self.entry_of(decode_body(body))
            except PeerError as exc:
                raise _as_blip(exc) from exc
            if entry.cid != cid:
                refuse(400, "RevMismatch", "the message's CID is not messageCid")
            applier = _RecordingApplier(self.session.dwn, entry.cid)
            fetcher = RemoteFetcher(self.session, self)
            outcome = await ClosureAdmitter(self.tenant, entry).admit(applier, fetcher)
            result: ReplicationApplyResult = applier.last if applier.last is not None else Deferred("storage")
            if outcome.status == "deferred" and result.kind in SETTLING_KINDS:
                result = Deferred("storage")  # should not happen: the root settled, the closure did not
            self.stats.results[result.kind] = self.stats.results.get(result.kind, 0) + 1
            if result.kind == "Applied":
                self.stats.revs_applied += 1
            if result.kind in SETTLING_KINDS:
                # The engine committed the apply before returning: the token may settle now.
                self.session.ledger.record_applied(self.key, Direction.PULL, item.token)
                self.stats.revs_settled += 1
            return result.to_json()
        finally:
            self.queue.remove(item)
            self._settle_heads()
            self._notify()

    async def on_norev(self, properties: dict[str, str]) -> None:
        position = int_property(properties, "position")
        item = self._wanted(position, properties.get("messageCid", ""))
        await self._turn(item)
        try:
            self.session.ledger.record_received(self.key, Direction.PULL, item.token)
            if properties.get("error") == "404":  # the message left the source's log: settled
                self.session.ledger.record_applied(self.key, Direction.PULL, item.token)
        finally:
            self.queue.remove(item)
            self._settle_heads()
            self._notify()


def _as_blip(exc: PeerError) -> blip.BlipError:
    from p2psync.peer.wire import peer_error

    return peer_error(exc.code, exc.name, exc.detail)


def _check_data(message: dict[str, Any], size: int, data: bytes) -> None:
    """§8.2 step 2: the data must be ``dataSize`` bytes, equal to the descriptor, hashing to its dataCid."""
    descriptor = message.get("descriptor")
    if not isinstance(descriptor, dict):
        raise PeerError(424, "AttachmentInvalid", "message has no descriptor")
    if len(data) != size or descriptor.get("dataSize") != size:
        raise PeerError(424, "AttachmentInvalid", "data size does not match")
    if data_cid(data) != descriptor.get("dataCid"):
        raise PeerError(424, "AttachmentInvalid", "data does not hash to dataCid")


def _message_entry(entry: ReplicationEntry, *, inline: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"message": entry.message}
    if entry.data is not None:
        out["dataSize"] = len(entry.data)
        if inline and len(entry.data) <= INLINE_DATA_MAX:
            out["data"] = entry.data
    return out


class PeerSession:
    """One connection's replication state, for either role.

    ``active``: we opened the connection (we drive: getCollections, subChanges, ...).
    """

    def __init__(
        self,
        *,
        store: Store,
        dwn: Dwn,
        identity: Identity,
        ledger: Ledger,
        copies: CheckpointCopies,
        mine: Hello,
        active: bool,
    ) -> None:
        self.store = store
        self.dwn = dwn
        self.identity = identity
        self.ledger = ledger
        self.copies = copies
        self.mine = mine
        self.active = active
        self.conn: blip.Connection | None = None
        self.theirs: Hello | None = None
        self._theirs_arrived = trio.Event()
        self._proof_received = False
        self._hello_started = False
        self._hello_done = trio.Event()
        self._replied = trio.Event()
        self.hello_ok = False
        # passive (source) state
        self.collections: list[Collection | None] = []
        self._declared: set[tuple[str, str]] = set()
        self._feeds: set[int] = set()
        self._offered: OrderedDict[str, tuple[str, str, str]] = OrderedDict()  # cid -> tenant, recordId, dataCid
        self._rev_slots = trio.Semaphore(MAX_UNANSWERED_REVS)
        self._fetcher = LocalStoreFetcher(store)
        # active (sink) state
        self.sink_feeds: dict[int, SinkFeed] = {}

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
            # Spec: close with 1008 "P2PSync 401 HelloProofInvalid"; the BLIP layer closes with 1000.
            await self.conn.aclose()
            raise HelloFailed(str(exc) or type(exc).__name__) from exc
        self.hello_ok = True
        self._hello_done.set()

    async def _hello_quietly(self) -> None:
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
            request.connection.start_soon(self._hello_quietly)
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
            # Rule 3 keys on the proof's arrival; the reply reaches our hello task a scheduling
            # step after the frames, so we wait whenever our own hello is under way.
            if not self._proof_received and not self._hello_started:
                refuse(401, "HelloRequired", "no successful hello yet")
            await self._hello_done.wait()
            if not self.hello_ok:
                refuse(401, "HelloRequired", "hello failed")
        role = PASSIVE_PROFILES if not self.active else ACTIVE_PROFILES
        if request.profile not in role:
            refuse(409, "RoleMismatch", f"{request.profile} is not answered by this role")
        return await handler(request)

    async def call(self, profile: str, properties: dict[str, str], body: bytes) -> blip.Response:
        """A request to the other peer; ``P2PSync`` refusals come back as :class:`PeerError`."""
        assert self.conn is not None
        try:
            return await self.conn.request(profile, properties, body)
        except blip.BlipError as exc:
            if exc.domain == ERROR_DOMAIN:
                raise PeerError.from_blip(exc) from exc
            raise PeerError(exc.code, f"BLIP{exc.code}", exc.message) from exc

    # -- passive: collections and checkpoints (§4) -----------------------------------------

    def _collection(self, request: blip.Request) -> tuple[int, Collection]:
        index = int_property(request.properties, "collection")
        coll = self.collections[index] if index < len(self.collections) else None
        if coll is None:
            refuse(404, "CollectionNotFound", f"no collection {index}")
        return index, coll

    async def on_get_collections(self, request: blip.Request) -> blip.Reply:
        body = decode_map(request.body)
        colls = body.get("collections")
        if not isinstance(colls, list) or not 1 <= len(colls) <= MAX_COLLECTIONS:
            refuse(400, "BodyInvalid", "collections must hold 1 to 256 entries")
        if len(self.collections) + len(colls) > MAX_COLLECTIONS:
            refuse(413, "TooManyCollections", "at most 256 collections per connection")
        parsed: list[tuple[str, SyncScope, str]] = []
        for c in colls:
            if not isinstance(c, dict):
                refuse(400, "BodyInvalid", "a Collection must be a map")
            tenant, cid = c.get("tenant"), c.get("checkpointId")
            if not isinstance(tenant, str) or not tenant.startswith("did:"):
                refuse(400, "BodyInvalid", "tenant must be a DID")
            if not isinstance(cid, str) or not 1 <= len(cid) <= 256:
                refuse(400, "BodyInvalid", "checkpointId must be 1 to 256 characters")
            try:
                scope = SyncScope.from_wire(c.get("scope"))
            except DwnError as exc:
                refuse(400, "SyncScopeInvalid", str(exc))
            parsed.append((tenant, scope, cid))
        out: list[Any] = []
        for tenant, scope, cid in parsed:
            key = (tenant, scope.scope_id)
            if key in self._declared:
                self.collections.append(None)
                out.append(None)
                continue
            self._declared.add(key)
            self.collections.append(Collection(tenant, scope, cid))
            stored = self.copies.get(self.remote_did, cid)
            out.append({} if stored is None else {"rev": stored[1], **stored[0]})
        return blip.Reply(body=encode_body(out))

    async def on_get_checkpoint(self, request: blip.Request) -> blip.Reply:
        _, coll = self._collection(request)
        stored = self.copies.get(self.remote_did, coll.checkpoint_id)
        if stored is None:
            return blip.Reply(body=encode_body({}))
        return blip.Reply({"rev": stored[1]}, encode_body(stored[0]))

    async def on_set_checkpoint(self, request: blip.Request) -> blip.Reply:
        _, coll = self._collection(request)
        if len(request.body) > MAX_CHECKPOINT_BODY:
            refuse(413, "BodyTooLarge", "setCheckpoint body above 512 KiB")
        pair = decode_map(request.body)
        if set(pair) != {"pull", "push"}:
            refuse(400, "CheckpointInvalid", "a CheckpointPair has pull and push")
        try:
            rev = self.copies.set(self.remote_did, coll.checkpoint_id, pair, request.properties.get("rev"))
        except CopyRevConflict as exc:
            extra = {} if exc.current is None else {"rev": exc.current}
            refuse(409, "CheckpointRevConflict", "rev is not the stored one", **extra)
        except DwnError as exc:
            refuse(400, "CheckpointInvalid", str(exc))
        return blip.Reply({"rev": rev})

    # -- passive: the pull feed (§6) -------------------------------------------------------

    def _authorized_reader(self, tenant: str) -> bool:
        # Draft-0 slice: only the tenant itself reads; grants (§5) come later.
        return self.remote_did == tenant

    async def on_sub_changes(self, request: blip.Request) -> None:
        index, coll = self._collection(request)
        if not self._authorized_reader(coll.tenant):
            refuse(403, "SyncNotAuthorized", "the peer is not an authorized reader of the tenant")
        if index in self._feeds:
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
                raise blip.BlipError(ERROR_DOMAIN, 410, _json(gap.to_wire()))
        latest = self._latest(coll.tenant)
        self._feeds.add(index)
        await request.respond(blip.Reply(body=encode_body({} if latest is None else {"latest": latest.to_wire()})))
        assert self.conn is not None
        self.conn.start_soon(self._run_feed, index, coll, since, batch, continuous)

    def _latest(self, tenant: str) -> ProgressToken | None:
        if self.store.tenant_id(tenant, create=False) is None:
            return None
        entries = self.store.conn.execute(
            "SELECT e.position, e.cid FROM events e JOIN tenants t ON t.id = e.tenant WHERE t.did=?"
            " ORDER BY e.position DESC LIMIT 1",
            (tenant,),
        ).fetchone()
        if entries is None:
            return None
        stream_id, epoch = self.store.events.stream(tenant)
        return ProgressToken(stream_id, epoch, int(entries[0]), str(entries[1]))

    async def _run_feed(
        self, index: int, coll: Collection, since: ProgressToken | None, batch: int, continuous: bool
    ) -> None:
        # continuous mode is not in this slice: the feed ends after the caught-up changes.
        del continuous
        tenant = coll.tenant
        props = {"collection": str(index)}
        try:
            async with trio.open_nursery() as revs:
                examined: ProgressToken | None = since
                if self.store.tenant_id(tenant, create=False) is not None:
                    stream_id, epoch = self.store.events.stream(tenant)
                    after = since.position if since is not None else -1
                    while True:
                        rows = self.store.events.read(tenant, after=after, limit=batch)
                        if not rows:
                            break
                        items: list[list[Any]] = []
                        entries: list[tuple[ProgressToken, ReplicationEntry | None]] = []
                        for position, cid in rows:
                            token = ProgressToken(stream_id, epoch, position, cid)
                            examined, after = token, position
                            entry = self._fetcher.entry_by_cid(tenant, cid)
                            if entry is not None and not coll.scope.matches(entry.message):
                                continue
                            item: list[Any] = [str(position), cid]
                            record_id = entry.message.get("recordId") if entry is not None else None
                            if isinstance(record_id, str):
                                item.append(record_id)
                                if entry is not None and entry.data is not None:
                                    item.append(len(entry.data))
                            items.append(item)
                            entries.append((token, entry))
                        if not items:
                            continue
                        body = {"streamId": stream_id, "epoch": epoch, "items": items}
                        reply = await self.call("changes", props, encode_body(body))
                        statuses = decode_body(reply.body)
                        statuses = statuses if isinstance(statuses, list) else []
                        for i, (token, entry) in enumerate(entries):
                            status = statuses[i] if i < len(statuses) else 0
                            if status != 0:
                                continue
                            await self._rev_slots.acquire()  # in item order: the head always holds a slot
                            revs.start_soon(self._send_rev, index, tenant, token, entry)
                caught_up: dict[str, Any] = {"items": []}
                if examined is not None:
                    caught_up["through"] = examined.to_wire()
                await self.call("changes", props, encode_body(caught_up))
        except (PeerError, blip.ConnectionClosed) as exc:
            log.info("feed %d ended: %s", index, exc)
        finally:
            self._feeds.discard(index)

    async def _send_rev(self, index: int, tenant: str, token: ProgressToken, entry: ReplicationEntry | None) -> None:
        try:
            props = {"collection": str(index), "messageCid": token.message_cid, "position": str(token.position)}
            if entry is None:  # left the log between the listing and now (§8.3)
                assert self.conn is not None
                await self.conn.send_no_reply("norev", {**props, "error": "404"})
                return
            self._offer(tenant, entry)
            await self.call("rev", props, encode_body(_message_entry(entry)))
        except (PeerError, blip.ConnectionClosed) as exc:
            log.info("rev %s: %s", token.position, exc)
        finally:
            self._rev_slots.release()

    def _offer(self, tenant: str, entry: ReplicationEntry) -> None:
        """Remember a message whose data travels out of line (§9's offered set)."""
        if entry.data is None or len(entry.data) <= INLINE_DATA_MAX:
            return
        d = entry.message["descriptor"]
        self._offered[entry.cid] = (tenant, str(entry.message.get("recordId")), str(d.get("dataCid")))
        self._offered.move_to_end(entry.cid)
        while len(self._offered) > MAX_OFFERED:
            self._offered.popitem(last=False)

    # -- passive: dependencies and data (§9, §10) -----------------------------------------

    async def on_get_dependencies(self, request: blip.Request) -> blip.Reply:
        _, coll = self._collection(request)
        if not self._authorized_reader(coll.tenant):
            refuse(403, "SyncNotAuthorized", "the peer is not an authorized reader of the tenant")
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
            entries = [] if ref.terminal else self._fetcher.answer(coll.tenant, ref)[:MAX_ENTRIES_PER_REF]
            out = []
            for entry in entries:
                inline = entry.data is not None and len(entry.data) <= INLINE_DATA_MAX and len(entry.data) <= budget
                if inline and entry.data is not None:
                    budget -= len(entry.data)
                    out.append(_message_entry(entry))
                else:
                    if entry.data is not None:
                        self._offered[entry.cid] = (
                            coll.tenant, str(entry.message.get("recordId")), str(entry.message["descriptor"]["dataCid"])
                        )
                    out.append(_message_entry(entry, inline=False))
            answers.append({"entries": out})
        return blip.Reply(body=encode_body({"answers": answers}), urgent=True)

    async def on_get_attachment(self, request: blip.Request) -> blip.Reply:
        self._collection(request)
        cid, dcid = request.properties.get("messageCid"), request.properties.get("dataCid")
        offered = self._offered.get(cid or "")
        if offered is None or offered[2] != dcid:
            refuse(404, "MessageNotFound", "not offered on this connection")
        tenant, record_id, _ = offered
        data = self.store.data.get(tenant, record_id, offered[2])
        if data is None:
            entry = self._fetcher.entry_by_cid(tenant, cid or "")
            data = entry.data if entry is not None else None
        if data is None:
            refuse(404, "MessageNotFound", "the data left this store")
        return blip.Reply(body=data)

    # -- active: the sink of a pull (§6.2, §8) ---------------------------------------------

    def _sink(self, request: blip.Request) -> SinkFeed:
        index = int_property(request.properties, "collection")
        feed = self.sink_feeds.get(index)
        if feed is None:
            refuse(409, "ChangesUnsolicited", f"no open feed for collection {index}")
        return feed

    async def on_changes(self, request: blip.Request) -> blip.Reply:
        feed = self._sink(request)
        statuses = await feed.on_changes(decode_body(request.body))
        return blip.Reply(body=encode_body(statuses), urgent=True)

    async def on_rev(self, request: blip.Request) -> blip.Reply:
        feed = self._sink(request)
        result = await feed.on_rev(request.properties, request.body)
        return blip.Reply(body=encode_body(result))

    async def on_norev(self, request: blip.Request) -> None:
        feed = self._sink(request)
        await feed.on_norev(request.properties)

    def handlers(self) -> dict[str, Callable[[blip.Request], Awaitable[blip.Reply | None]]]:
        """Handlers by profile, all but ``hello`` behind :meth:`gate`."""
        table: dict[str, Callable[[blip.Request], Awaitable[Any]]] = {
            "getCollections": self.on_get_collections,
            "getCheckpoint": self.on_get_checkpoint,
            "setCheckpoint": self.on_set_checkpoint,
            "subChanges": self.on_sub_changes,
            "getDependencies": self.on_get_dependencies,
            "getAttachment": self.on_get_attachment,
            "changes": self.on_changes,
            "rev": self.on_rev,
            "norev": self.on_norev,
        }
        out: dict[str, Callable[[blip.Request], Awaitable[blip.Reply | None]]] = {"hello": self.on_hello}
        for profile, fn in table.items():
            out[profile] = _bind_gate(self, fn)
        return out


def _bind_gate(
    session: PeerSession, fn: Callable[[blip.Request], Awaitable[Any]]
) -> Callable[[blip.Request], Awaitable[blip.Reply | None]]:
    async def gated(request: blip.Request) -> blip.Reply | None:
        result: blip.Reply | None = await session.gate(request, fn)
        return result

    return gated


def _json(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


def empty_checkpoint() -> DirectionCheckpoint:
    return DirectionCheckpoint()
