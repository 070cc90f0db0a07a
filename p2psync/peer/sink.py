"""The receiving side of one direction of one collection (replication-profiles.md §6.2, §7, §8).

A :class:`Sink` answers the source's listing (`changes` for a pull, `proposeChanges` for a
push) with statuses and applies each `rev` through the closure loop, in listed order, fetching
missing dependencies (`getDependencies`) and large data (`getAttachment`) from the source on
the same connection. Both directions run this same code: whether we opened the connection or
not only decides who keeps the tokens. A pull sink (the active peer) hands its settled tokens
to the ledger in the same commit as the applies they describe; a push sink (the passive peer)
keeps no tokens (§7: the pusher owns its push checkpoint).

Replies to `rev` wait for the group commit that holds the apply (§8.2 step 4).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import trio

from p2psync.dwn.datacid import data_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.progress import ProgressToken
from p2psync.dwn.replication_types import Deferred, DependencyRef, ReplicationApplyResult
from p2psync.peer.stats import SyncStats
from p2psync.peer.window import ProgressWindow, WindowItem
from p2psync.peer.wire import (
    DEFAULT_MAX_DATA,
    INLINE_DATA_MAX,
    MAX_ENTRIES_PER_REF,
    MAX_REFS,
    PeerError,
    decode_body,
    decode_map,
    encode_body,
    int_property,
    refuse,
)
from p2psync.replication.checkpoint import CheckpointPendingOverflow
from p2psync.replication.closure import ClosureAdmitter, ClosureOutcome, ReplicationEntry, Withheld
from p2psync.state.committer import StoreUnavailable
from p2psync.state.ledger import Direction, LinkKey

if TYPE_CHECKING:
    from p2psync.peer.session import PeerSession

__all__ = ["SETTLING_KINDS", "Sink", "check_data"]

log = logging.getLogger("p2psync.peer")

#: Results that settle a token (§11's table).
SETTLING_KINDS: Final = frozenset({"Applied", "Duplicate", "Superseded", "Invalid"})

#: Out-of-line data a sink fetches ahead of its turn, while earlier `rev`s apply. Without it,
#: each large record's transfer waited for the previous one's apply (one 128 KB BLIP window
#: at a time); with it, transfers overlap applies. Bounded so memory stays well under the
#: 300 MB the issue allows per side. Ours.
PREFETCH_BYTES: Final = 32 * 1024 * 1024


class _Applier:
    """The local engine inside the peer's group commit; remembers the root's result and the
    last batch written (the `rev` reply waits for it)."""

    def __init__(self, session: PeerSession, root_cid: str) -> None:
        self.session = session
        self.root_cid = root_cid
        self.last: ReplicationApplyResult | None = None
        self.batch: Any = None

    async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
        session = self.session

        def apply_and_note_origin() -> ReplicationApplyResult:
            result = session.dwn.apply_replicated_message(tenant, entry.message, entry.data, cid=entry.cid)
            if result.kind == "Applied" and session.theirs is not None:
                session.origins.record(tenant, entry.cid, session.theirs.store_id)
            return result

        result, self.batch = session.committer.run(apply_and_note_origin)
        if entry.cid == self.root_cid:
            self.last = result
        return result


class _RemoteFetcher:
    """Answers the closure loop's refs from the source (``getDependencies``, §10)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    async def fetch(self, tenant: str, refs: Sequence[DependencyRef]) -> list[Sequence[ReplicationEntry]]:
        out: list[Sequence[ReplicationEntry]] = []
        refs = list(refs)
        sink = self.sink
        for start in range(0, len(refs), MAX_REFS):
            chunk = refs[start : start + MAX_REFS]
            sink.session.metrics.dependencies_missing(chunk)
            body = encode_body({"refs": [r.to_json() for r in chunk]})
            async with sink.session.dependency_slots:
                reply = await sink.session.call("getDependencies", {"collection": str(sink.index)}, body, urgent=True)
            sink.stats.bytes_received += len(reply.body)
            answers = decode_map(reply.body).get("answers")
            if not isinstance(answers, list) or len(answers) != len(chunk):
                raise PeerError(400, "BodyInvalid", "getDependencies answers do not match the refs")
            for answer in answers:
                entries: list[ReplicationEntry] = []
                raw = answer.get("entries", []) if isinstance(answer, dict) else []
                for item in raw[:MAX_ENTRIES_PER_REF] if isinstance(raw, list) else []:
                    entries.append(await sink.entry_of(item))
                withheld = isinstance(answer, dict) and answer.get("withheld") is True
                out.append(Withheld(entries) if withheld else entries)
                sink.stats.dependencies_fetched += len(entries)
        return out


class Sink:
    """One direction's receiving side for collection ``index`` (see the module doc).

    ``key`` is the ledger link of a pull sink; None for a push sink (no tokens kept).
    """

    def __init__(
        self,
        session: PeerSession,
        index: int,
        tenant: str,
        *,
        key: LinkKey | None,
        since: ProgressToken | None = None,
        max_data: int = DEFAULT_MAX_DATA,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self.session = session
        self.index = index
        self.tenant = tenant
        self.key = key
        self.domain = None if since is None else since.domain
        self.max_data = max_data
        self.window = ProgressWindow()
        self.window.last = since
        self.stats = SyncStats()
        self.caught_up = trio.Event()
        self.failed: PeerError | None = None
        self._changed = trio.Event()
        self._on_progress = on_progress
        self._prefetch_room = PREFETCH_BYTES

    # -- plumbing ---------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
        # Wake only the `rev` whose turn it now is: hundreds may be waiting (§12's 1,000).
        first = self.window.first_open()
        if first is not None and first.turn is not None:
            first.turn.set()
        if self._on_progress is not None:
            self._on_progress()

    def fail(self, error: PeerError) -> None:
        """End this feed with ``error`` (seen by whoever waits on it)."""
        if self.failed is None:
            self.failed = error
        for item in self.window.open_items():
            if item.turn is not None:
                item.turn.set()
        self._notify()

    def drained(self) -> bool:
        return self.caught_up.is_set() and self.window.first_open() is None

    async def wait_drained(self) -> None:
        """Until caught up with every wanted `rev` answered (or the feed failed)."""
        while not self.drained():
            if self.failed is not None:
                raise self.failed
            conn = self.session.conn
            if conn is not None and conn.closed:
                raise PeerError(503, "ConnectionLost", conn.close_reason or "closed")
            changed = self._changed
            with trio.move_on_after(1.0):
                await changed.wait()
        if self.failed is not None:
            raise self.failed
        self._record_steps()

    def _record_steps(self) -> None:
        """Give the ledger the finished prefix of the window (inside the open batch, if any)."""
        steps = self.window.take_steps()
        if not steps or self.key is None:
            return
        try:
            self.session.ledger.record(self.key, Direction.PULL, steps)
        except CheckpointPendingOverflow as exc:
            # The ledger moved the link to repairing in the same batch; stop taking items up.
            self.fail(PeerError(409, "CheckpointPendingOverflow", str(exc)))

    def _settle_later(self) -> None:
        self.session.committer.before_commit(self._record_steps)

    async def _turn(self, item: WindowItem) -> None:
        """Wait until every item listed before ``item`` has an outcome (apply in listed order)."""
        if self.window.first_open() is not item:
            item.turn = trio.Event()
            await item.turn.wait()
        if self.failed is not None:
            raise _blip(self.failed)

    # -- data -------------------------------------------------------------------------------

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
            if size > self.max_data:
                raise PeerError(413, "BodyTooLarge", f"data of {size} bytes is above this peer's limit")
            data = await self._attachment(entry.cid, message, size)
            self.stats.attachments_fetched += 1
        if not isinstance(data, bytes):
            raise PeerError(400, "BodyInvalid", "data must be a byte string")
        check_data(message, size, data)
        return entry.with_data(data)

    async def _attachment(self, cid: str, message: dict[str, Any], size: int) -> bytes:
        descriptor = message.get("descriptor") if isinstance(message.get("descriptor"), dict) else {}
        dcid = descriptor.get("dataCid") if isinstance(descriptor, dict) else None
        if not isinstance(dcid, str):
            raise PeerError(424, "AttachmentInvalid", "message names no dataCid")
        props = {"collection": str(self.index), "messageCid": cid, "dataCid": dcid}
        try:
            data = await self.session.fetch_attachment(props, size)
        except PeerError as exc:
            raise PeerError(424, "AttachmentUnavailable", str(exc)) from exc
        self.stats.bytes_received += len(data)
        return data

    # -- listing: `changes` (pull) and `proposeChanges` (push) ------------------------------

    def on_listing(self, body: Any, *, pull: bool) -> list[int]:
        """Check one Changes body, take its items into the window, and return the statuses."""
        if not isinstance(body, dict):
            refuse(400, "ChangesInvalid", "Changes must be a map")
        items = body.get("items", [])
        if not isinstance(items, list):
            refuse(400, "ChangesInvalid", "items must be an array")
        stream_id, epoch = body.get("streamId"), body.get("epoch")
        listed: list[tuple[ProgressToken, int | None]] = []
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
            listed.append((token, size if type(size) is int else None))
        through = None
        if pull and "through" in body:
            try:
                through = ProgressToken.from_wire(body["through"])
            except DwnError as exc:
                refuse(400, "ChangesInvalid", f"bad through: {exc}")
        for token in [t for t, _ in listed] + ([through] if through is not None else []):
            if self.domain is None:
                self.domain = token.domain
            if token.domain != self.domain:
                refuse(400, "ChangesInvalid", "one domain per feed")
        last = self.window.last
        for token, _ in listed:
            if last is not None and token.position <= last.position:
                refuse(400, "ChangesInvalid", "items must ascend past everything listed before")
            last = token
        if through is not None and last is not None and through.position < last.position:
            refuse(400, "ChangesInvalid", "through is below the last item")
        statuses: list[int] = []
        has = self.session.store.messages.has
        for token, size in listed:
            if has(self.tenant, token.message_cid):
                status = 304
            elif size is not None and size > self.max_data:
                status = 413  # settled, and a link error (§6.2): counted, logged, never fetched
                self.stats.results["DataTooLarge"] = self.stats.results.get("DataTooLarge", 0) + 1
                log.warning("collection %d: %s has %d bytes of data, above this peer's limit of %d; skipped",
                            self.index, token.message_cid, size, self.max_data)
            else:
                status = 0
            statuses.append(status)
            self.window.add(token, settled=None if status == 0 else True)
        self.stats.items_offered += len(listed)
        self.stats.items_skipped += len(statuses) - statuses.count(0)
        if through is not None and (last is None or through.position > last.position):
            self.window.add(through, settled=True)
        if pull and not listed and not self.caught_up.is_set():
            self.caught_up.set()
        self._settle_later()
        self._notify()
        while statuses and statuses[-1] == 0:
            statuses.pop()  # trailing zeros are implied (§6.2)
        return statuses

    # -- `rev` and `norev` --------------------------------------------------------------------

    def _wanted(self, properties: dict[str, str]) -> WindowItem:
        position = int_property(properties, "position")
        item = self.window.get(position, properties.get("messageCid", ""))
        if item is None:
            refuse(409, "RevUnsolicited", f"no wanted item at {position}")
        return item

    async def _prefetch(self, obj: Any) -> tuple[int, ReplicationEntry | PeerError | None]:
        """Fetch a `rev`'s out-of-line data before its turn when the prefetch budget has room
        right now; returns the bytes reserved (give them back) and the entry or its error.

        Never waits for room: were the next-in-line `rev` to wait behind later ones holding the
        budget, nothing would move. A `rev` that finds no room fetches at its turn instead.
        """
        size = obj.get("dataSize") if isinstance(obj, dict) else None
        if (
            type(size) is not int
            or obj.get("data") is not None
            or not INLINE_DATA_MAX < size <= min(self.max_data, self._prefetch_room)
        ):
            return 0, None
        self._prefetch_room -= size
        try:
            return size, await self.entry_of(obj)
        except PeerError as exc:
            return size, exc
        except BaseException:
            self._prefetch_room += size
            raise

    async def on_rev(self, properties: dict[str, str], body: bytes) -> dict[str, Any]:
        """Apply one `rev` (§8.2); returns the ReplicationApplyResult once it is durable."""
        item = self._wanted(properties)
        cid = item.token.message_cid
        obj: Any = None
        early: ReplicationEntry | PeerError | None = None
        reserved = 0
        try:
            obj = decode_body(body)
        except PeerError as exc:
            early = exc
        if early is None:
            reserved, early = await self._prefetch(obj)
        try:
            await self._turn(item)
        except BaseException:
            self._prefetch_room += reserved
            raise
        settled = False
        applier = _Applier(self.session, cid)
        try:
            self.stats.revs_received += 1
            self.stats.bytes_received += len(body)
            try:
                if isinstance(early, PeerError):
                    raise early
                entry = early if early is not None else await self.entry_of(obj)
            except PeerError as exc:
                self.stats.results[exc.name] = self.stats.results.get(exc.name, 0) + 1
                raise _blip(exc) from exc
            if entry.cid != cid:
                refuse(400, "RevMismatch", "the message's CID is not messageCid")
            outcome = await ClosureAdmitter(self.tenant, entry).admit(applier, _RemoteFetcher(self))
            result: ReplicationApplyResult = applier.last if applier.last is not None else Deferred("storage")
            if outcome.status == "deferred" and result.kind in SETTLING_KINDS:
                result = Deferred("storage")  # the root settled but the closure did not: retry later
            self.stats.results[result.kind] = self.stats.results.get(result.kind, 0) + 1
            settled = result.kind in SETTLING_KINDS
            if result.kind == "Applied":
                self.stats.revs_applied += 1
            if settled:
                self.stats.revs_settled += 1
        finally:
            self._prefetch_room += reserved
            self.window.finish(item, settled=settled)
            self._settle_later()
            self._notify()
        # The message and its data are in the open transaction now: let go of them before
        # waiting for the commit, or a batch of 64 large records stays in memory until then.
        del entry, outcome
        obj = early = None
        if applier.batch is not None:
            try:
                await self.session.committer.durable(applier.batch)
            except StoreUnavailable as exc:
                refuse(503, "StoreUnavailable", str(exc))
        return result.to_json()

    async def admit(self, entry: ReplicationEntry) -> tuple[ReplicationApplyResult, ClosureOutcome]:
        """Apply one fetched message outside a listing (a repair's ``getDependencies`` answer):
        the same closure loop as a `rev`, dependencies and data fetched from the source on
        this connection. Returns once the apply is durable, with the root's result (``Deferred``
        when its closure did not settle) and the closure's outcome. No window, no tokens."""
        applier = _Applier(self.session, entry.cid)
        outcome = await ClosureAdmitter(self.tenant, entry).admit(applier, _RemoteFetcher(self))
        result: ReplicationApplyResult = applier.last if applier.last is not None else Deferred("storage")
        if outcome.status == "deferred" and result.kind in SETTLING_KINDS:
            result = Deferred("storage")
        if applier.batch is not None:
            try:
                await self.session.committer.durable(applier.batch)
            except StoreUnavailable as exc:
                raise PeerError(503, "StoreUnavailable", str(exc)) from exc
        return result, outcome

    async def on_norev(self, properties: dict[str, str]) -> None:
        item = self._wanted(properties)
        await self._turn(item)
        # 404: the message left the source's log, settled; 503 (or anything else): not now.
        self.window.finish(item, settled=properties.get("error") == "404")
        self._settle_later()
        self._notify()


def _blip(exc: PeerError) -> Exception:
    from p2psync.peer.wire import peer_error

    return peer_error(exc.code, exc.name, exc.detail)


def check_data(message: dict[str, Any], size: int, data: bytes) -> None:
    """§8.2 step 2: ``dataSize`` bytes, equal to the descriptor's, hashing to its dataCid."""
    descriptor = message.get("descriptor")
    if not isinstance(descriptor, dict):
        raise PeerError(424, "AttachmentInvalid", "message has no descriptor")
    if len(data) != size or descriptor.get("dataSize") != size:
        raise PeerError(424, "AttachmentInvalid", "data size does not match")
    if data_cid(data) != descriptor.get("dataCid"):
        raise PeerError(424, "AttachmentInvalid", "data does not hash to dataCid")
