"""The sending side of one direction of one collection (replication-profiles.md §6, §7, §8).

A :class:`Source` lists the tenant's log after a token — in scope, ascending — and sends a
`rev` for each item the sink wants. A pull feed (we are passive) lists with `changes` after the
puller's `subChanges`; a push (we are active) lists with `proposeChanges`, and then keeps the
push checkpoint from the sink's answers: statuses `304`/`413` and settling `rev` results mark
tokens applied, anything else leaves them unapplied (§11). Entries out of scope are passed
over: a pull feed covers them with `through`, a push settles them at once. A push the sink's
quota holds back (statuses `507`/`429`, §6.2) ends: those tokens are never recorded, so the
checkpoint stays before them, and the direction fails with the quota's refusal once the
`rev`s already sent are answered.

Flow control (§12): one listing in flight per feed, at most 1,000 unanswered `rev`s and
64 MiB of unanswered `rev` bodies per connection and direction, enforced before each send.
With ``continuous`` the source keeps listing new log entries as they are committed.

Sans-I/O, like :mod:`p2psync.replication.sink`: generators of effects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any, Final, Protocol

from p2psync.dwn.progress import ProgressToken
from p2psync.errors import QuotaExceeded
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.effects import (
    Call,
    ConnectionLost,
    Notify,
    ReadDecision,
    ReadPage,
    RecordSteps,
    Response,
    Signal,
    StillValid,
    Transition,
    WaitForLog,
)
from p2psync.replication.scope import SyncScope
from p2psync.replication.sink import HELD_KINDS, SETTLING_KINDS, unsettled_transition
from p2psync.replication.stats import NotApplied, NotAppliedLog, SyncStats
from p2psync.replication.window import ProgressWindow
from p2psync.replication.wire import (
    INLINE_DATA_MAX,
    MAX_REVS_BODY,
    MAX_REVS_ITEMS,
    PeerError,
    decode_body,
    encode_body,
)

__all__ = ["MAX_UNANSWERED_REV_BYTES", "Source", "SourceHost", "encode_message_entry", "encode_revs_body",
           "message_entry"]

log = logging.getLogger("p2psync.peer")

#: §12: bytes of unanswered `rev` bodies per connection and direction.
MAX_UNANSWERED_REV_BYTES: Final = 64 * 1024 * 1024
#: Listing statuses of a sink's quota (§6.2): the item and every one after it were not taken.
QUOTA_STATUSES: Final = {code: name for code, name in (QuotaExceeded.TENANT, QuotaExceeded.PEER)}

Effects = Generator[Any, Any, Any]
#: One listed message: its token, the entry (None: it left the log), its data size, and
#: whether the reader may read it (§5).
_Listed = tuple[ProgressToken, "ReplicationEntry | None", "int | None", bool]


class SourceHost(Protocol):
    """What a source needs of its connection's protocol object."""

    closed: bool
    close_reason: str | None
    #: every message that did not apply (here, or at the peer it was pushed to)
    not_applied: NotAppliedLog

    @property
    def remote_store_id(self) -> str | None: ...

    def signal(self) -> Signal: ...

    def spawn(self, gen: Effects, name: str) -> None: ...

    def offer(self, tenant: str, entry: ReplicationEntry, size: int | None = None) -> None: ...

    @property
    def batch_revs(self) -> bool:
        """Whether both hellos offer `revs` (§8.4): several messages per request."""
        ...


class _Budget:
    """Unanswered `rev`s of one direction: a count and a byte total, each capped (§12)."""

    def __init__(self, count: int, size: int, freed: Signal) -> None:
        self.max_count, self.max_size = count, size
        self.count = self.size = 0
        self._freed = freed

    def take(self, size: int, count: int = 1) -> Effects:
        # A body larger than the whole budget still goes, alone; so does a batch of more
        # messages than the cap.
        while self.count and (self.count + count > self.max_count or self.size + size > self.max_size):
            yield self._freed
        self.count += count
        self.size += size

    def give(self, size: int, count: int = 1) -> None:
        self.count -= count
        self.size -= size
        self._freed.fire()

    def drained(self) -> Effects:
        while self.count:
            yield self._freed


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


class Source:
    """Sends one direction of collection ``index`` (see the module doc).

    ``push_key``: the ledger link whose push checkpoint this source keeps (a push); None for a
    pull feed (the puller keeps the tokens). ``decision``: what the reader may read (§5).
    """

    def __init__(
        self,
        host: SourceHost,
        index: int,
        tenant: str,
        scope: SyncScope,
        *,
        batch: int,
        continuous: bool,
        max_unanswered_revs: int,
        decision: ReadDecision,
        push_key: Any = None,
        direction: Any = None,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self.host = host
        self.index = index
        self.tenant = tenant
        self.scope = scope
        self.batch = batch
        self.continuous = continuous
        self.push_key = push_key
        self.direction = direction
        self.decision = decision
        self.stats = SyncStats()
        self.window = ProgressWindow() if push_key is not None else None
        self.caught_up = False
        self._budget = _Budget(max_unanswered_revs, MAX_UNANSWERED_REV_BYTES, host.signal())
        self._on_progress = on_progress
        self.position: int | None = None
        self._examined: ProgressToken | None = None  # the last log entry looked at
        self._through_sent = -1
        #: push only: settle without proposing entries that came from this store (§11 echo
        #: suppression), except at or below ``replay_until`` (a range replayed after a rewind
        #: or reset, which the sink may have lost)
        self.suppress_origin: str | None = None
        self.replay_until = -1
        #: set to end a continuous feed at its next pass (the peer is stopping)
        self.stopping = False
        #: a failure of a `rev`'s ledger step: ends the run at its next pass
        self.failure: PeerError | None = None
        #: push only: `rev`s the sink answered with a result that did not settle them
        #: (``Incomplete``, ``Deferred``), and listed items it answered `503`: their tokens
        #: stay unapplied, the link is not ``live``
        self.unsettled = 0

    @property
    def pushing(self) -> bool:
        return self.push_key is not None

    @property
    def props(self) -> dict[str, str]:
        return {"collection": str(self.index)}

    # -- listing ----------------------------------------------------------------------------

    def run(self, since: ProgressToken | None) -> Effects:
        """List from ``since`` until caught up (and on, when continuous); returns when done.

        Raises :class:`PeerError` for a refusal of the other side (``ConnectionLost`` when the
        connection ended); the caller decides what ends the direction.
        """
        self._examined = since
        after = since.position if since is not None else -1
        told_caught_up = False
        while not self.stopping:
            yield from self._check_still_allowed()
            rows = yield ReadPage(self.tenant, after, self.batch, self.scope, self.decision,
                                  self.suppress_origin if self.pushing else None, self.replay_until)
            if rows:
                self._examined, after = rows[-1].token, rows[-1].token.position
            self.position = after if after >= 0 else None
            if rows:
                yield from self._list_page(rows)
                continue
            # Nothing more in the log right now.
            yield from self._tell_caught_up(first=not told_caught_up)
            told_caught_up = True
            if not self.continuous:
                break
            yield WaitForLog()
        yield from self._budget.drained()
        yield from self._record_push()
        if isinstance(self.failure, QuotaExceeded):
            raise self.failure  # a `rev` the sink's quota refused: not done, whatever came after

    @property
    def _profile(self) -> str:
        return "proposeChanges" if self.pushing else "changes"

    def _check_still_allowed(self) -> Effects:
        """§5: a feed that relies on a grant re-checks it every pass; a `rev` ledger failure
        or the end of the connection ends it."""
        if self.host.closed:
            raise ConnectionLost(self.host.close_reason or "closed")
        if not self.decision.everything and not (yield StillValid(self.tenant, self.decision)):
            raise PeerError(403, "SyncNotAuthorized", "the grant this feed relied on is no longer valid")
        if self.failure is not None:
            raise self.failure

    def _list_page(self, rows: list[Any]) -> Effects:
        """List one page's wanted rows and send the `rev`s the sink asks for; a page with
        nothing to list (echoes, out of scope) only settles its tokens."""
        wanted = self._take_page(rows)
        if not wanted:
            yield from self._record_push()
            return
        first = wanted[0][0]
        items = [_item(token, entry, size) for token, entry, size, _ in wanted]
        body = {"streamId": first.stream_id, "epoch": first.epoch, "items": items}
        reply: Response = yield Call(self._profile, self.props, encode_body(body))
        self.stats.items_offered += len(items)
        wanted_revs, declined = self._on_listed(wanted, decode_body(reply.body))
        if declined and self.push_key is not None:
            # Not now (`503`): offered again after a resume, so the link is not `live` till then.
            self.unsettled += declined
            yield unsettled_transition(self.push_key, self.direction, "Deferred")
        self._record_push_later()
        self._progress()
        yield from self._send_revs(wanted_revs)
        if isinstance(self.failure, QuotaExceeded):
            # The sink took part of the listing: let the `rev`s it asked for be answered (and
            # recorded) before the direction ends with its quota's refusal.
            yield from self._budget.drained()
            yield from self._record_push()
            raise self.failure

    def _tell_caught_up(self, *, first: bool) -> Effects:
        """A pull feed says it is caught up once (an empty listing with ``through``), then
        moves ``through`` on when later passes examined more; a push just notes it."""
        examined = self._examined
        if first:
            if not self.pushing:
                caught_up: dict[str, Any] = {"items": []}
                if examined is not None:
                    caught_up["through"] = examined.to_wire()
                yield Call(self._profile, self.props, encode_body(caught_up))
            self.caught_up = True
            self._progress()
        elif not self.pushing and examined is not None and examined.position > self._through_sent:
            yield Call(self._profile, self.props, encode_body({"items": [], "through": examined.to_wire()}))
        if not self.pushing and examined is not None:
            self._through_sent = examined.position

    def _take_page(self, rows: list[Any]) -> list[_Listed]:
        """The page's rows to list; echoes and out-of-scope rows are settled on a push."""
        wanted: list[_Listed] = []
        window = self.window
        for row in rows:
            if row.kind == "listed":
                wanted.append((row.token, row.entry, row.size, row.readable))
                if window is not None:
                    window.add(row.token)
                continue
            if row.kind == "echo":
                self.stats.echoes_suppressed += 1
            if window is not None:
                window.add(row.token, settled=True)  # the sink has it, or it is out of scope
        return wanted

    def _on_listed(self, wanted: list[Any], statuses: Any) -> tuple[list[Any], int]:
        """The items the sink asked for, and how many it declined for now (left unsettled)."""
        statuses = statuses if isinstance(statuses, list) else []
        wanted_revs: list[Any] = []
        held_back = declined = 0
        for i, listed in enumerate(wanted):
            token = listed[0]
            status = statuses[i] if i < len(statuses) else 0
            if status == 0:
                wanted_revs.append(listed)
                continue
            if status in QUOTA_STATUSES and self.pushing:
                # Held back by the sink's quota: left open in the window, so neither it nor
                # anything after it is recorded, and offered again in a later round.
                name = QUOTA_STATUSES[status]
                self.stats.results[name] = self.stats.results.get(name, 0) + 1
                held_back += 1
                continue
            self.stats.items_skipped += 1
            if self.window is not None:
                item = self.window.get(token.position, token.message_cid)
                if item is not None:
                    # 304 and 413 settle; 503 and anything else are offered again later.
                    settled = status in (304, 413)
                    ProgressWindow.finish(item, settled=settled)
                    declined += not settled
        if held_back and self.failure is None:
            code = next(status for status in statuses if status in QUOTA_STATUSES)
            self.failure = QuotaExceeded(code, QUOTA_STATUSES[code],
                                         f"the peer's quota held back {held_back} of {len(wanted)} messages listed")
        return wanted_revs, declined

    def _send_revs(self, wanted: list[Any]) -> Effects:
        """Start a `rev` per wanted item — or, when both peers offer it, a `revs` per run of
        consecutive items whose data travels inline (§8.4) — taking each one's budget here, in
        item order: were the revs to compete for freed budget, a later `rev` could take the
        slot the sink's next-in-line one needs, and with the budget full of later ones nothing
        would move.

        Each message is encoded once, and a `revs` body is put together from its members'
        bytes (:func:`encode_message_entry`): encoding the whole body as one value went down
        the general encoder (the data is a byte string) and cost more than the rest of sending."""
        batching = self.host.batch_revs
        # A `revs` counts as many unanswered `rev`s as it carries messages (§12).
        most = min(MAX_REVS_ITEMS, self._budget.max_count)
        run: list[tuple[ProgressToken, ReplicationEntry, bytes]] = []
        run_bytes = _REVS_ENVELOPE_MAX
        for token, entry, size, readable in wanted:
            body = None
            if entry is not None and readable:
                data = entry.data
                inline = data is not None and len(data) <= INLINE_DATA_MAX
                message = entry.encoded if entry.encoded is not None else encode_body(entry.message)
                if batching and (inline or (data is None and size is None)):
                    # Goes in a `revs`: the entry with its token's position and CID.
                    member = _message_entry_cbor(message, data, size, token)
                    if run and (len(run) >= most or run_bytes + len(member) > MAX_REVS_BODY):
                        yield from self._start_batch(run)
                        run, run_bytes = [], _REVS_ENVELOPE_MAX
                    run.append((token, entry, member))
                    run_bytes += len(member)
                    continue
                body = _message_entry_cbor(message, data, size)
            if run:
                yield from self._start_batch(run)
                run, run_bytes = [], _REVS_ENVELOPE_MAX
            yield from self._budget.take(len(body) if body is not None else 0)
            self.host.spawn(self._send_rev(token, entry, size, body), "rev")
        if run:
            yield from self._start_batch(run)

    def _start_batch(self, run: list[tuple[ProgressToken, ReplicationEntry, bytes]]) -> Effects:
        if len(run) == 1:  # one message: a plain `rev` says the same in fewer bytes
            token, entry, _ = run[0]
            body = encode_message_entry(entry)
            yield from self._budget.take(len(body))
            self.host.spawn(self._send_rev(token, entry, None, body), "rev")
            return
        body = encode_revs_body([member for _, _, member in run])
        yield from self._budget.take(len(body), len(run))
        self.host.spawn(self._send_batch([token for token, _, _ in run], body), "revs")

    def _send_batch(self, tokens: list[ProgressToken], body: bytes) -> Effects:
        """One `revs` request (§8.4): each message's result settles its token as a `rev`'s
        would; a refusal of the whole request leaves them all unsettled."""
        done = 0
        try:
            self.stats.revs_sent += len(tokens)
            self.stats.bytes_sent += len(body)
            try:
                # Not compressed: on loopback deflate cost more CPU than it saved (§12).
                reply: Response = yield Call("revs", self.props, body)
                results = decode_body(reply.body)
                results = results.get("results") if isinstance(results, dict) else None
                outcomes: list[Any] = results if isinstance(results, list) else []
            except PeerError as exc:
                log.info("revs of collection %d: %s", self.index, exc)
                outcomes = [exc] * len(tokens)
            answered = len(outcomes)
            for i, token in enumerate(tokens):
                result = outcomes[i] if i < answered else None
                settled, step = self._tally(_batch_outcome(result), token, result)
                if step is not None:
                    yield step
                self._finish(token, settled)
                done += 1
        finally:
            for token in tokens[done:]:  # cancelled, or the connection ended
                self._finish(token, False)
            self._budget.give(len(body), len(tokens))
            self._progress()

    def _tally(self, outcome: str | PeerError, token: ProgressToken, result: Any = None
               ) -> tuple[bool, Transition | None]:
        """Count one message's outcome (a result kind or a refusal; ``result``: the peer's
        ReplicationApplyResult, named if it did not apply). Returns whether it settles, and the
        link transition to yield when it does not settle a push (else None): a plain function,
        not a generator, since it runs once per message and almost never has one."""
        if isinstance(outcome, PeerError):
            self.stats.results[outcome.name] = self.stats.results.get(outcome.name, 0) + 1
            if isinstance(outcome, QuotaExceeded) and self.failure is None:
                self.failure = outcome  # the sink takes nothing more: end the direction with it
            return False, None
        kind = outcome
        self.stats.results[kind] = self.stats.results.get(kind, 0) + 1
        refused = NotApplied.of(token.message_cid, self.tenant, result, where="peer", peer=self.host.remote_store_id)
        if refused is None:
            if kind in HELD_KINDS:  # the peer holds it now: no longer "did not apply" there
                self.stats.not_applied.settle(token.message_cid, "peer", self.host.remote_store_id)
                self.host.not_applied.settle(token.message_cid, "peer", self.host.remote_store_id)
        else:
            self.stats.not_applied.add(refused)
            self.host.not_applied.add(refused)
            log.info("collection %d: %s did not apply at the peer: %s (%s): %s", self.index, token.message_cid,
                     refused.result, refused.code, refused.reason)
        settled = kind in SETTLING_KINDS
        step: Transition | None = None
        if not settled and self.push_key is not None:
            self.unsettled += 1
            step = unsettled_transition(self.push_key, self.direction, kind)
        if kind == "Applied":
            self.stats.revs_applied += 1
        if settled:
            self.stats.revs_settled += 1
        return settled, step

    def _finish(self, token: ProgressToken, settled: bool) -> None:
        if self.window is not None:
            item = self.window.get(token.position, token.message_cid)
            if item is not None:
                ProgressWindow.finish(item, settled=settled)
            self._record_push_later()

    def _send_rev(
        self, token: ProgressToken, entry: ReplicationEntry | None, size: int | None, body: bytes | None
    ) -> Effects:
        props = {"collection": str(self.index), "messageCid": token.message_cid, "position": str(token.position)}
        settled = False
        try:
            if entry is None:  # left the log between the listing and now (§8.3)
                settled = True
                yield Notify("norev", {**props, "error": "404"})
                return
            if body is None:  # the reader may not read it (§5): not settled, never sent
                yield Notify("norev", {**props, "error": "403", "reason": "not readable"})
                return
            self.host.offer(self.tenant, entry, size)
            self.stats.revs_sent += 1
            self.stats.bytes_sent += len(body) + (size if size is not None and size > INLINE_DATA_MAX else 0)
            reply: Response = yield Call("rev", props, body, compress=len(body) > 1024)
            result = decode_body(reply.body)
            kind = result.get("kind") if isinstance(result, dict) else None
            settled, step = self._tally(kind if isinstance(kind, str) else "Unknown", token, result)
            if step is not None:
                yield step
        except PeerError as exc:
            log.info("rev %s of collection %d: %s", token.position, self.index, exc)
            self._tally(exc, token)
        finally:
            self._budget.give(len(body) if body is not None else 0)
            self._finish(token, settled)
            self._progress()

    def _push_steps(self) -> RecordSteps | None:
        if self.window is None or self.push_key is None:
            return None
        steps = self.window.take_steps()
        if not steps:
            return None
        return RecordSteps(self.push_key, self.direction, tuple(steps), index=self.index)

    def _record_push(self) -> Effects:
        request = self._push_steps()
        if request is not None:
            yield request

    def _record_push_later(self) -> None:
        request = self._push_steps()
        if request is not None:
            self.host.spawn(self._record(request), "record push")

    def _record(self, request: RecordSteps) -> Effects:
        try:
            yield request
        except PeerError as exc:
            if self.failure is None:
                self.failure = exc

    def _progress(self) -> None:
        if self._on_progress is not None:
            self._on_progress()


# -- DAG-CBOR of a MessageEntry, from its members' bytes ------------------------------------------
# Map keys sort shorter first, then bytewise (DAG-CBOR): data, message, dataSize, position,
# messageCid. Each key below is its own encoding (text head + UTF-8).
_DATA_KEY: Final = b"\x64data"
_MESSAGE_KEY: Final = b"\x67message"
_DATA_SIZE_KEY: Final = b"\x68dataSize"
_POSITION_KEY: Final = b"\x68position"
_MESSAGE_CID_KEY: Final = b"\x6amessageCid"
#: ``{"revs": [`` up to the array's head: a map of one member, the key, then the array head.
_REVS_KEY: Final = b"\xa1\x64revs"
#: The bytes of a `revs` body besides its members, at most: the map head and key, and the
#: array head of up to 64 members (2 bytes).
_REVS_ENVELOPE_MAX: Final = len(_REVS_KEY) + 2


#: Integers beyond this are JS doubles, which the deterministic encoder writes as floats.
_JS_MAX_SAFE_INTEGER: Final = 2**53 - 1


def _cbor_head(major: int, n: int) -> bytes:
    """A CBOR item's initial bytes: major type and argument in the shortest form (RFC 8949 §3)."""
    if n < 256:
        return _SMALL_HEADS[major][n]
    for info, width in ((25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * width):
            return bytes((major << 5 | info,)) + n.to_bytes(width, "big")
    raise ValueError(f"{n} does not fit a CBOR head")


#: Heads with an argument below 256, per major type: one byte below 24, two from 24.
_SMALL_HEADS: Final = tuple(
    tuple(bytes((major << 5 | n,)) if n < 24 else bytes((major << 5 | 24, n)) for n in range(256))
    for major in range(8)
)


def _cbor_text(text: str) -> bytes:
    raw = text.encode()
    return _cbor_head(3, len(raw)) + raw


def _message_entry_cbor(
    message: bytes, data: bytes | None, size: int | None, token: ProgressToken | None = None
) -> bytes:
    """:func:`encode_message_entry` from the message's own encoding (see there)."""
    parts = [b"", _MESSAGE_KEY, message]
    members = 1
    if data is not None:
        if len(data) <= INLINE_DATA_MAX:
            parts[1:1] = (_DATA_KEY, _cbor_head(2, len(data)), data)
            members += 1
        size = len(data)
    if size is not None:
        parts += (_DATA_SIZE_KEY, _cbor_head(0, size) if 0 <= size <= _JS_MAX_SAFE_INTEGER else encode_body(size))
        members += 1
    if token is not None:
        parts += (_POSITION_KEY, _cbor_text(str(token.position)), _MESSAGE_CID_KEY, _cbor_text(token.message_cid))
        members += 2
    parts[0] = _SMALL_HEADS[5][members]
    return b"".join(parts)


def encode_message_entry(
    entry: ReplicationEntry, *, size: int | None = None, token: ProgressToken | None = None
) -> bytes:
    """``encode_body(message_entry(entry, size=size))``, byte for byte, with the token's
    ``position`` and ``messageCid`` added when given (a `revs` member, §8.4); the message is
    encoded alone, so the data never goes through the general encoder."""
    message = entry.encoded if entry.encoded is not None else encode_body(entry.message)
    return _message_entry_cbor(message, entry.data, size, token)


def encode_revs_body(members: list[bytes]) -> bytes:
    """``encode_body({"revs": [...]})`` of members already encoded (:func:`encode_message_entry`)."""
    return b"".join([_REVS_KEY, _cbor_head(4, len(members)), *members])


def _batch_outcome(obj: Any) -> str | PeerError:
    """One member of a `revs` reply's ``results`` (§8.4): a ReplicationApplyResult (read by its
    ``kind``) or ``{"status": code, "error": §13 body}``, read into its refusal class as an ERR
    would be. Anything else reads as ``Unknown`` (not settled)."""
    if isinstance(obj, PeerError):
        return obj
    if not isinstance(obj, dict):
        return "Unknown"
    status, error = obj.get("status"), obj.get("error")
    if type(status) is int and isinstance(error, dict):
        name, detail = error.get("code"), error.get("detail")
        return PeerError.read(status, name if isinstance(name, str) else "Unknown",
                              detail if isinstance(detail, str) else "", error)
    kind = obj.get("kind")
    return kind if isinstance(kind, str) else "Unknown"


def _item(token: ProgressToken, entry: ReplicationEntry | None, size: int | None) -> list[Any]:
    item: list[Any] = [str(token.position), token.message_cid]
    record_id = entry.record_id if entry is not None else None
    if record_id is not None:
        item.append(record_id)
        if size is not None:
            item.append(size)
    return item
