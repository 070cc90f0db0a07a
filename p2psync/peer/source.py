"""The sending side of one direction of one collection (replication-profiles.md §6, §7, §8).

A :class:`Source` lists the tenant's log after a token — in scope, ascending — and sends a
`rev` for each item the sink wants. A pull feed (we are passive) lists with `changes` after the
puller's `subChanges`; a push (we are active) lists with `proposeChanges`, and then keeps the
push checkpoint from the sink's answers: statuses `304`/`413` and settling `rev` results mark
tokens applied, anything else leaves them unapplied (§11). Entries out of scope are passed
over: a pull feed covers them with `through`, a push settles them at once.

Flow control (§12): one listing in flight per feed, at most 1,000 unanswered `rev`s and
64 MiB of unanswered `rev` bodies per connection and direction, enforced before each send.
With ``continuous`` the source keeps listing new log entries as they are committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import trio

from p2psync.dwn.progress import ProgressToken
from p2psync.peer.sink import SETTLING_KINDS
from p2psync.peer.stats import SyncStats
from p2psync.peer.window import ProgressWindow
from p2psync.peer.wire import INLINE_DATA_MAX, PeerError, decode_body, encode_body
from p2psync.replication.checkpoint import CheckpointPendingOverflow
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.scope import SyncScope
from p2psync.state.ledger import Direction, LinkKey

if TYPE_CHECKING:
    from p2psync.peer.session import PeerSession

__all__ = ["MAX_UNANSWERED_REV_BYTES", "POLL_INTERVAL", "Source", "message_entry"]

log = logging.getLogger("p2psync.peer")

#: §12: bytes of unanswered `rev` bodies per connection and direction.
MAX_UNANSWERED_REV_BYTES: Final = 64 * 1024 * 1024
#: How often a continuous feed looks at the log when no local commit woke it (writes by other
#: processes on the same store file are only seen this way). Ours.
POLL_INTERVAL: Final = 0.5


class _Budget:
    """Unanswered `rev`s of one direction: a count and a byte total, each capped (§12)."""

    def __init__(self, count: int, size: int) -> None:
        self.max_count, self.max_size = count, size
        self.count = self.size = 0
        self._freed = trio.Event()

    async def take(self, size: int) -> None:
        # A body larger than the whole budget still goes, alone.
        while self.count >= self.max_count or (self.count and self.size + size > self.max_size):
            freed = self._freed
            await freed.wait()
        self.count += 1
        self.size += size

    def give(self, size: int) -> None:
        self.count -= 1
        self.size -= size
        self._freed.set()
        self._freed = trio.Event()

    async def drained(self) -> None:
        while self.count:
            freed = self._freed
            await freed.wait()


def message_entry(entry: ReplicationEntry, *, inline: bool = True, size: int | None = None) -> dict[str, Any]:
    """A MessageEntry (§8.1): the message, and its data inline when small enough.

    ``size``: the size of data the entry does not carry (kept out of line, not read).
    """
    out: dict[str, Any] = {"message": entry.message}
    if entry.data is not None:
        out["dataSize"] = len(entry.data)
        if inline and len(entry.data) <= INLINE_DATA_MAX:
            out["data"] = entry.data
    elif size is not None:
        out["dataSize"] = size
    return out


#: One listed message: its token, the entry (None: it left the log) and its data size.
_Listed = tuple[ProgressToken, "ReplicationEntry | None", "int | None"]


class Source:
    """Sends one direction of collection ``index`` (see the module doc).

    ``push_key``: the ledger link whose push checkpoint this source keeps (a push); None for a
    pull feed (the puller keeps the tokens).
    """

    def __init__(
        self,
        session: PeerSession,
        index: int,
        tenant: str,
        scope: SyncScope,
        *,
        batch: int,
        continuous: bool,
        push_key: LinkKey | None = None,
        may_read: Callable[[dict[str, Any]], bool] | None = None,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self.session = session
        self.index = index
        self.tenant = tenant
        self.scope = scope
        self.batch = batch
        self.continuous = continuous
        self.push_key = push_key
        self.may_read = may_read
        self.stats = SyncStats()
        self.window = ProgressWindow() if push_key is not None else None
        self.caught_up = trio.Event()
        self._budget = _Budget(session.max_unanswered_revs, MAX_UNANSWERED_REV_BYTES)
        self._on_progress = on_progress
        self.position: int | None = None
        self._through_sent = -1
        #: re-checked on every pass of a feed: a revoked or expired grant ends it (§5)
        self.still_valid: Callable[[], bool] | None = None
        #: push only: settle without proposing entries that came from this store (§11 echo
        #: suppression), except at or below ``replay_until`` (a range replayed after a rewind
        #: or reset, which the sink may have lost)
        self.suppress_origin: str | None = None
        self.replay_until = -1

    @property
    def pushing(self) -> bool:
        return self.push_key is not None

    # -- listing ----------------------------------------------------------------------------

    def _rows(self, after: int) -> list[tuple[int, str]]:
        return self.session.store.events.read(self.tenant, after=after, limit=self.batch)

    async def run(self, since: ProgressToken | None) -> None:
        """List from ``since`` until caught up (and on, when continuous); returns when done.

        Raises :class:`PeerError` for a refusal of the other side and lets
        ``blip.ConnectionClosed`` through; the caller decides what ends the direction.
        """
        store = self.session.store
        props = {"collection": str(self.index)}
        profile = "proposeChanges" if self.pushing else "changes"
        examined: ProgressToken | None = since
        after = since.position if since is not None else -1
        told_caught_up = False
        async with trio.open_nursery() as revs:
            while True:
                if self.still_valid is not None and not self.still_valid():
                    raise PeerError(403, "SyncNotAuthorized", "the grant this feed relied on is no longer valid")
                stream_id = epoch = None
                if store.tenant_id(self.tenant, create=False) is not None:
                    stream_id, epoch = store.events.stream(self.tenant)
                rows = self._rows(after) if stream_id is not None else []
                echoes: set[str] = set()
                if self.suppress_origin is not None and rows:
                    echoes = self.session.origins.from_store(
                        self.tenant, [c for p, c in rows if p > self.replay_until], self.suppress_origin
                    )
                items: list[list[Any]] = []
                wanted: list[_Listed] = []
                for position, cid in rows:
                    assert stream_id is not None and epoch is not None
                    token = ProgressToken(stream_id, epoch, position, cid)
                    examined, after = token, position
                    if cid in echoes and self.window is not None:
                        self.window.add(token, settled=True)  # it came from the sink: it has it
                        self.stats.echoes_suppressed += 1
                        continue
                    listed = self.session.fetcher.listed_entry(self.tenant, cid)
                    entry, size = listed if listed is not None else (None, None)
                    if entry is not None and not self.scope.matches(entry.message):
                        if self.window is not None:
                            self.window.add(token, settled=True)  # passed over: out of scope
                        continue
                    item: list[Any] = [str(position), cid]
                    record_id = entry.message.get("recordId") if entry is not None else None
                    if isinstance(record_id, str):
                        item.append(record_id)
                        if size is not None:
                            item.append(size)
                    items.append(item)
                    wanted.append((token, entry, size))
                    if self.window is not None:
                        self.window.add(token)
                self.position = after if after >= 0 else None
                if items:
                    body = {"streamId": stream_id, "epoch": epoch, "items": items}
                    reply = await self.session.call(profile, props, encode_body(body))
                    self.stats.items_offered += len(items)
                    await self._send_revs(self._on_listed(wanted, decode_body(reply.body)), revs)
                    continue
                if rows:
                    self._record_push()  # a page with nothing in scope: its tokens are settled
                    continue
                # Nothing more in the log right now.
                if not told_caught_up:
                    if not self.pushing:
                        caught_up: dict[str, Any] = {"items": []}
                        if examined is not None:
                            caught_up["through"] = examined.to_wire()
                        await self.session.call(profile, props, encode_body(caught_up))
                    told_caught_up = True
                    self.caught_up.set()
                elif not self.pushing and examined is not None and examined.position > self._through_sent:
                    await self.session.call(profile, props, encode_body({"items": [], "through": examined.to_wire()}))
                if not self.pushing and examined is not None:
                    self._through_sent = examined.position
                if not self.continuous:
                    break
                with trio.move_on_after(POLL_INTERVAL):
                    await self.session.committer.wait_commit()
            await self._budget.drained()
        self._record_push()

    def _on_listed(self, wanted: list[_Listed], statuses: Any) -> list[_Listed]:
        statuses = statuses if isinstance(statuses, list) else []
        wanted_revs: list[_Listed] = []
        for i, listed in enumerate(wanted):
            token = listed[0]
            status = statuses[i] if i < len(statuses) else 0
            if status == 0:
                wanted_revs.append(listed)
                continue
            self.stats.items_skipped += 1
            if self.window is not None:
                item = self.window.get(token.position, token.message_cid)
                if item is not None:
                    # 304 and 413 settle; 503 and anything else are offered again later.
                    ProgressWindow.finish(item, settled=status in (304, 413))
        self._record_push()
        self._progress()
        return wanted_revs

    async def _send_revs(self, wanted: list[_Listed], revs: trio.Nursery) -> None:
        """Start a `rev` per wanted item, taking each one's budget here, in item order: were
        the tasks to compete for freed budget, a later `rev` could take the slot the sink's
        next-in-line one needs, and with the budget full of later ones nothing would move."""
        for token, entry, size in wanted:
            body = None
            if entry is not None and (self.may_read is None or self.may_read(entry.message)):
                body = encode_body(message_entry(entry, size=size))
            await self._budget.take(len(body) if body is not None else 0)
            revs.start_soon(self._send_rev, token, entry, size, body)

    async def _send_rev(
        self, token: ProgressToken, entry: ReplicationEntry | None, size: int | None, body: bytes | None
    ) -> None:
        props = {"collection": str(self.index), "messageCid": token.message_cid, "position": str(token.position)}
        settled = False
        try:
            if entry is None:  # left the log between the listing and now (§8.3)
                settled = True
                assert self.session.conn is not None
                await self.session.conn.send_no_reply("norev", {**props, "error": "404"})
                return
            if body is None:  # the reader may not read it (§5): not settled, never sent
                assert self.session.conn is not None
                await self.session.conn.send_no_reply("norev", {**props, "error": "403", "reason": "not readable"})
                return
            self.session.offer(self.tenant, entry, size)
            self.stats.revs_sent += 1
            self.stats.bytes_sent += len(body) + (size if size is not None and size > INLINE_DATA_MAX else 0)
            reply = await self.session.call("rev", props, body, compress=len(body) > 1024)
            result = decode_body(reply.body)
            kind = result.get("kind") if isinstance(result, dict) else None
            kind = kind if isinstance(kind, str) else "Unknown"
            self.stats.results[kind] = self.stats.results.get(kind, 0) + 1
            settled = kind in SETTLING_KINDS
            if kind == "Applied":
                self.stats.revs_applied += 1
            if settled:
                self.stats.revs_settled += 1
        except PeerError as exc:
            log.info("rev %s of collection %d: %s", token.position, self.index, exc)
            self.stats.results[exc.name] = self.stats.results.get(exc.name, 0) + 1
        finally:
            self._budget.give(len(body) if body is not None else 0)
            if self.window is not None:
                item = self.window.get(token.position, token.message_cid)
                if item is not None:
                    ProgressWindow.finish(item, settled=settled)
                self._record_push()
            self._progress()

    def _record_push(self) -> None:
        if self.window is None or self.push_key is None:
            return
        steps = self.window.take_steps()
        if not steps:
            return
        try:
            self.session.ledger.record(self.push_key, Direction.PUSH, steps)
        except CheckpointPendingOverflow as exc:
            raise PeerError(409, "CheckpointPendingOverflow", str(exc)) from exc

    def _progress(self) -> None:
        if self._on_progress is not None:
            self._on_progress()

