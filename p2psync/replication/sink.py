"""The receiving side of one direction of one collection (replication-profiles.md §6.2, §7, §8).

A :class:`Sink` answers the source's listing (`changes` for a pull, `proposeChanges` for a
push) with statuses and applies each `rev` through the closure loop, in listed order,
fetching missing dependencies (`getDependencies`) and large data (`getAttachment`) from the
source on the same connection. Both directions run this same code: whether we opened the
connection only decides who keeps the tokens. A pull sink (the active peer) hands its
settled tokens to the ledger in the same commit as the applies they describe; a push sink
(the passive peer) keeps none (§7: the pusher owns its push checkpoint).

The store's quotas (issue #15) bound what a sink takes: a listing is taken only as far as its
items fit (the rest answered with the refusal's status, ``507`` or ``429``, and never taken
into the window, so no checkpoint passes them), a message that does not fit exactly is
refused before it is applied, and once either happened the sink takes nothing more: it fails
with the refusal as soon as what it already took is answered.

Sans-I/O: every method that needs the store or the other peer is a generator of effects
(:mod:`p2psync.replication.effects`), run by :class:`~p2psync.replication.protocol.ReplicationProtocol`.
Replies to `rev` wait for the group commit that holds the apply (§8.2 step 4).
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Callable, Collection, Generator
from dataclasses import replace
from typing import Any, Final, Protocol

from p2psync.dwn.datacid import data_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.progress import MAX_POSITION_DIGITS, ProgressToken, is_message_cid
from p2psync.dwn.replication_types import Deferred, DependencyRef, ReplicationApplyResult
from p2psync.errors import QuotaExceeded
from p2psync.replication.checkpoint import LinkState
from p2psync.replication.closure import (
    CLOSURE_FAILURE_CODES,
    CLOSURE_FORBIDDEN,
    ApplyRequest,
    ClosureAdmitter,
    ClosureOutcome,
    ReplicationEntry,
    Withheld,
    closure_operation_code,
    describe_refs,
    fetch_key,
)
from p2psync.replication.effects import (
    Apply,
    ApplyBatch,
    AwaitClaim,
    Call,
    ClaimMessages,
    Durable,
    HeldMessages,
    QuotaFit,
    RecordSteps,
    ReleaseClaims,
    Response,
    Signal,
    Slots,
    StoreRequest,
    Transition,
    VerifyAhead,
)
from p2psync.replication.observer import SyncObserver
from p2psync.replication.scope import RoleRecordsRef, SyncScope, SyncScopeUndecidable
from p2psync.replication.stats import MAX_REASON, NOT_APPLIED_KINDS, NotApplied, NotAppliedLog, SyncStats
from p2psync.replication.window import ProgressWindow, WindowItem
from p2psync.replication.wire import (
    DEFAULT_MAX_DATA,
    INLINE_DATA_MAX,
    MAX_ATTACHMENTS_IN_FLIGHT,
    MAX_ENTRIES_PER_REF,
    MAX_REFS,
    MAX_REVS_ITEMS,
    PeerError,
    decode_body,
    decode_map,
    encode_body,
    int_property,
    refuse,
)

__all__ = [
    "SETTLING_KINDS", "UNSETTLED_FROM", "Sink", "SinkHost", "check_data", "error_result", "unsettled_transition"
]

log = logging.getLogger("p2psync.peer")

#: Results that settle a token (§11's table).
#: Results after which the receiver holds the message, or something newer that replaced it.
HELD_KINDS: Final = frozenset({"Applied", "Duplicate", "Superseded"})
SETTLING_KINDS: Final = HELD_KINDS | {"Invalid"}
#: Link states a `rev` answered with a result that does not settle (``Incomplete``,
#: ``Deferred``) moves to ``repairing`` from: a link is not ``live`` while a message it was
#: offered did not apply (§11; a paused link stays paused).
UNSETTLED_FROM: Final = (LinkState.INITIAL, LinkState.LIVE, LinkState.DEGRADED_POLL)

#: What a configure whose role records did not all settle is named by (§10.2): the replica
#: then lacks a role record a reader may cite.
ROLE_RECORD_MISSING: Final = CLOSURE_FAILURE_CODES["Role"]

#: Out-of-line data a sink fetches ahead of its turn, while earlier messages apply. Without it,
#: each large record's transfer waited for the previous one's apply and the durable write of
#: its file; with it, the source's read, the transfer and the sink's write of consecutive
#: records overlap. Bounded so memory stays well under the 300 MB the issue allows per side.
#: Ours.
PREFETCH_BYTES: Final = 32 * 1024 * 1024

Effects = Generator[Any, Any, Any]

#: A listed position: canonical decimal (ProgressToken.from_wire's rule, checked per item here).
_POSITION: Final = re.compile(r"0|[1-9][0-9]*")


class SinkHost(Protocol):
    """What a sink needs of its connection's protocol object."""

    observer: SyncObserver
    #: every message that did not apply on this peer (the node's status lists the last ones)
    not_applied: NotAppliedLog
    dependency_slots: Slots
    attachment_slots: Slots

    @property
    def remote_store_id(self) -> str | None: ...

    @property
    def role_records(self) -> bool:
        """Whether the source answers ``RoleRecords`` refs (both hellos offer `roleRecords`)."""
        ...

    def signal(self) -> Signal: ...

    def store_later(self, request: StoreRequest) -> None: ...

    def spawn(self, gen: Effects, name: str) -> None: ...


class Sink:
    """One direction's receiving side for collection ``index`` (see the module doc).

    ``key`` is the ledger link of a pull sink; None for a push sink (no tokens kept).
    """

    def __init__(
        self,
        host: SinkHost,
        index: int,
        tenant: str,
        *,
        key: Any,
        since: ProgressToken | None = None,
        max_data: int = DEFAULT_MAX_DATA,
        direction: Any = None,
        scope: SyncScope | None = None,
    ) -> None:
        self.host = host
        self.index = index
        self.tenant = tenant
        #: the collection's scope: a failed closure of a message outside its intent (a closure
        #: operation the source listed) is named by that operation's class
        self.scope = scope
        self.key = key
        self.direction = direction
        self.domain = None if since is None else since.domain
        self.max_data = max_data
        self.window = ProgressWindow()
        self.window.last = since
        self.stats = SyncStats()
        self.caught_up = False
        self.failed: PeerError | None = None
        #: `rev`s this feed applied with a result that did not settle them (``Incomplete``,
        #: ``Deferred``): their tokens stay unapplied, and the link is not ``live``
        self.unsettled = 0
        #: the message CID whose claim by another link a `proposeChanges` answer waits on
        self.awaiting: str | None = None
        #: closures that failed for want of a hard dependency, by root CID, until their root's
        #: result is taken (:meth:`_take_result`)
        self.closure_failures: dict[str, ClosureOutcome] = {}
        #: refs the source answered with nothing (or withheld) since the last listing, by fetch key
        self.unanswered: dict[tuple[str, ...], list[ReplicationEntry] | Withheld] = {}
        #: fired on every change of the window (listing, outcome, failure)
        self.changed = host.signal()
        #: called on every change too (progress reports, the stall watchdog)
        self.on_progress: Callable[[], None] | None = None
        #: bytes of :data:`PREFETCH_BYTES` not held by a fetch ahead (:meth:`_ahead_of`)
        self._prefetch_room = PREFETCH_BYTES
        #: fetches ahead waiting for room, in their messages' turn order (listed position)
        self._ahead_waiting: list[_Ahead] = []
        #: the DID charged for what this sink stores (a push by a peer that may not read the
        #: tenant); None: nobody (we pulled it, or the pusher may read the tenant)
        self.payer: str | None = None
        #: a quota refused something: nothing more is taken, and the sink fails with this
        #: once what it already took is answered
        self.full: QuotaExceeded | None = None
        #: message CIDs this sink claimed in the store's in-flight claims (it receives them;
        #: other links decline them until it released them)
        self.claimed: set[str] = set()

    # -- plumbing ---------------------------------------------------------------------------

    def _notify(self) -> None:
        if self.full is not None and self.failed is None and self.window.first_open() is None:
            self.fail(self.full)  # what it took is answered; it takes nothing more
            return
        self.changed.fire()
        # Wake only the `rev` whose turn it now is: hundreds may be waiting (§12's 1,000).
        first = self.window.first_turn()
        if first is not None and first.turn is not None:
            first.turn.fire()
        if self.on_progress is not None:
            self.on_progress()

    def fail(self, error: PeerError) -> None:
        """End this feed with ``error`` (seen by whoever waits on it)."""
        if self.failed is None:
            self.failed = error
        self._release(tuple(self.claimed), held=False)  # other links wait for these: not coming
        for item in self.window.open_items():
            if item.turn is not None:
                item.turn.fire()
        self._notify()

    def drained(self) -> bool:
        return self.caught_up and self.window.first_open() is None

    def wait_drained(self) -> Effects:
        """Until caught up with every wanted `rev` answered (or the feed failed)."""
        while not self.drained():
            if self.failed is not None:
                raise self.failed
            yield self.changed
        if self.failed is not None:
            raise self.failed
        steps = self.window.take_steps()
        if steps and self.key is not None:
            yield RecordSteps(self.key, self.direction, tuple(steps), index=self.index)

    def _settle_later(self) -> None:
        """Hand the finished prefix of the window to the ledger in the open commit."""
        steps = self.window.take_steps()
        if steps and self.key is not None:
            self.host.store_later(RecordSteps(self.key, self.direction, tuple(steps), at_commit=True, index=self.index))

    def _turn(self, item: WindowItem) -> Effects:
        """Wait until every item listed before ``item`` has an outcome (apply in listed order)."""
        while self.failed is None and self.window.first_turn() is not item:
            if item.turn is None:
                item.turn = self.host.signal()
            yield item.turn
        if self.failed is not None:
            raise self.failed

    def _count(self, kind: str, n: int = 1) -> None:
        self.stats.results[kind] = self.stats.results.get(kind, 0) + n

    def note_result(self, cid: str, result: ReplicationApplyResult, failure: ClosureOutcome | None = None) -> None:
        """Keep a message that did not apply (Invalid, Incomplete, or a closure that failed) in
        this sync's stats and the peer's log, with a line on the log (``-v``)."""
        entry: NotApplied | None
        if failure is not None and failure.code is not None:
            entry = NotApplied(cid, self.tenant, result.kind, failure.code, (failure.detail or "")[:MAX_REASON],
                               "here", self.host.remote_store_id)
        elif result.kind not in NOT_APPLIED_KINDS:
            if result.kind in HELD_KINDS:  # held here now: no longer "did not apply"
                self.stats.not_applied.settle(cid)
                self.host.not_applied.settle(cid)
            return
        else:
            entry = NotApplied.of(cid, self.tenant, result.to_json(), peer=self.host.remote_store_id)
        if entry is not None:
            self.stats.not_applied.add(entry)
            self.host.not_applied.add(entry)
            log.info("collection %d: %s did not apply: %s (%s): %s", self.index, cid, entry.result, entry.code,
                     entry.reason)

    def quota_refused(self, refusal: QuotaExceeded, messages: int) -> None:
        """A quota refused ``messages`` messages (0: a request that named none): counted in the
        results under the refusal's name and by the observer; the sink takes nothing more."""
        if messages:
            self._count(refusal.name, messages)
        self.host.observer.quota_refused(refusal.kind, self.tenant)
        if self.full is None:
            self.full = refusal

    # -- data -------------------------------------------------------------------------------

    def read_entry(self, obj: Any) -> tuple[ReplicationEntry, int | None]:
        """A MessageEntry (§8.1) as a ReplicationEntry with its inline data checked, and the
        size of the out-of-line data still to fetch (§9.1; None: there is none)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("message"), dict):
            raise PeerError(400, "BodyInvalid", "MessageEntry needs a message map")
        message: dict[str, Any] = obj["message"]
        size = obj.get("dataSize")
        if size is None:
            return ReplicationEntry(message), None
        if type(size) is not int or size < 0:
            raise PeerError(400, "BodyInvalid", "dataSize must be an unsigned integer")
        data = obj.get("data")
        if data is None:
            if size <= INLINE_DATA_MAX:
                raise PeerError(424, "AttachmentInvalid", "small data must travel inline")
            if size > self.max_data:
                raise PeerError(413, "BodyTooLarge", f"data of {size} bytes is above this peer's limit")
            return ReplicationEntry(message), size
        if not isinstance(data, bytes):
            raise PeerError(400, "BodyInvalid", "data must be a byte string")
        return ReplicationEntry(message, data, data_cid=check_data(message, size, data)), None

    def entry_of(self, obj: Any) -> Effects:
        """A MessageEntry (§8.1) as a ReplicationEntry, fetching out-of-line data (§9.1)."""
        entry, size = self.read_entry(obj)
        if size is None:
            return entry
        data = yield from self._attachment(entry.cid, entry.message, size)
        self.stats.attachments_fetched += 1
        return entry.with_data(data, check_data(entry.message, size, data))

    def _attachment(self, cid: str, message: dict[str, Any], size: int) -> Effects:
        descriptor = message.get("descriptor") if isinstance(message.get("descriptor"), dict) else {}
        dcid = descriptor.get("dataCid") if isinstance(descriptor, dict) else None
        if not isinstance(dcid, str):
            raise PeerError(424, "AttachmentInvalid", "message names no dataCid")
        props = {"collection": str(self.index), "messageCid": cid, "dataCid": dcid}
        slots = self.host.attachment_slots
        taken = yield from slots.acquire(max(size, slots.capacity // MAX_ATTACHMENTS_IN_FLIGHT))
        try:
            reply: Response = yield Call("getAttachment", props, max_reply=size)
        except PeerError as exc:
            raise PeerError(424, "AttachmentUnavailable", str(exc)) from exc
        finally:
            slots.release(taken)
        self.stats.bytes_received += len(reply.body)
        return reply.body

    def fetch(self, refs: list[DependencyRef]) -> Effects:
        """Answer the closure loop's refs from the source (``getDependencies``, §10). A ref the
        source had nothing for (or withheld) earlier on this feed is answered so again without
        asking until the next listing: the closures of one batch share their lookups (the
        strict-closure rules' batch sharing), so a batch of roots missing one parent costs one
        round trip, not one each. What the source did give is in the store by then anyway."""
        known = [self.unanswered.get(fetch_key(ref)) for ref in refs]
        wanted = [ref for ref, answer in zip(refs, known, strict=True) if answer is None]
        fetched = iter((yield from self._fetch(wanted)) if wanted else ())
        out: list[Any] = []
        for ref, answer in zip(refs, known, strict=True):
            if answer is None:
                answer = next(fetched)
                if not answer:  # nothing (or withheld): the same answer for the rest of this batch
                    self.unanswered[fetch_key(ref)] = answer
            out.append(answer)
        return out

    def _fetch(self, refs: list[DependencyRef]) -> Effects:
        out: list[Any] = []
        for start in range(0, len(refs), MAX_REFS):
            chunk = refs[start : start + MAX_REFS]
            self.host.observer.dependencies_missing(chunk)
            for answer in (yield from self._get_dependencies([r.to_json() for r in chunk])):
                entries = yield from self._answer_entries(answer)
                withheld = isinstance(answer, dict) and answer.get("withheld") is True
                out.append(Withheld(entries) if withheld else entries)
        return out

    def _get_dependencies(self, refs: list[dict[str, Any]]) -> Effects:
        """One `getDependencies` (§10): the raw answers, one per ref."""
        body = encode_body({"refs": refs})
        slots = self.host.dependency_slots
        yield from slots.acquire()
        try:
            reply: Response = yield Call("getDependencies", {"collection": str(self.index)}, body, urgent=True)
        finally:
            slots.release()
        self.stats.bytes_received += len(reply.body)
        answers = decode_map(reply.body).get("answers")
        if not isinstance(answers, list) or len(answers) != len(refs):
            raise PeerError(400, "BodyInvalid", "getDependencies answers do not match the refs")
        return answers

    def _answer_entries(self, answer: Any) -> Effects:
        """The entries of one answer, their out-of-line data fetched (§9.1)."""
        entries: list[ReplicationEntry] = []
        raw = answer.get("entries", []) if isinstance(answer, dict) else []
        for item in raw[:MAX_ENTRIES_PER_REF] if isinstance(raw, list) else []:
            entries.append((yield from self.entry_of(item)))
        self.stats.dependencies_fetched += len(entries)
        return entries

    def admit(self, entry: ReplicationEntry, first: Any = None) -> Effects:
        """Run ``entry``'s closure: apply it and what it needs, fetching from the source.
        Returns ``(result of the root, closure outcome, ticket of the last write)``; the result
        is ``Deferred`` when the closure did not settle. ``first``: the answer to the root's
        first apply when it was made already (an :class:`ApplyBatch`'s): ``(result, ticket)``
        or the exception it raised."""
        admitter = ClosureAdmitter(self.tenant, entry)
        origin = self.host.remote_store_id
        root: ReplicationApplyResult | None = None
        ticket: Any = None
        request = admitter.request
        while not isinstance(request, ClosureOutcome):
            if isinstance(request, ApplyRequest):
                answer, first = first, None
                if answer is None:
                    try:
                        answer = yield Apply(self.tenant, request.entry, origin, self.payer)
                    except Exception as exc:
                        answer = exc
                if isinstance(answer, QuotaExceeded):
                    # Nothing of it was written. Nothing more is taken: the `rev`s after it
                    # fail at their turn and stay unrecorded, so no checkpoint passes it.
                    self.quota_refused(answer, 1)
                    self.fail(answer)
                    raise answer
                if isinstance(answer, Exception):  # the store failed: not the message's fault
                    request = admitter.apply_failed(f"{type(answer).__name__}: {answer}")
                    continue
                result, ticket = answer
                if request.entry.cid == entry.cid:
                    root = result
                request = admitter.receive_apply(result)
            else:
                try:
                    answers = yield from self.fetch(list(request.refs))
                except Exception as exc:
                    request = admitter.fetch_failed(f"{type(exc).__name__}: {exc}")
                    continue
                request = admitter.receive_fetch(answers)
        outcome = request
        final: ReplicationApplyResult = root if root is not None else Deferred("storage")
        if outcome.status == "deferred" and final.kind in SETTLING_KINDS:
            final = Deferred("storage")  # the root settled but the closure did not: retry later
        if outcome.code is not None and final.kind not in SETTLING_KINDS:
            self._closure_failed(entry, outcome)
        if final.kind in HELD_KINDS and self._brings_roles(entry.message):
            final, ticket = yield from self._admit_role_records(entry, final, ticket)
        return final, outcome, ticket

    def _brings_roles(self, message: Any) -> bool:
        """Whether admitting ``message`` takes the role records with it: a configure of this
        subset's protocol, from a source that answers ``RoleRecords`` refs (§10.2)."""
        if self.scope is None or self.scope.kind != "subset" or not self.host.role_records:
            return False
        descriptor = message.get("descriptor") if isinstance(message, dict) else None
        definition = descriptor.get("definition") if isinstance(descriptor, dict) else None
        return (descriptor is not None and descriptor.get("interface") == "Protocols"
                and descriptor.get("method") == "Configure" and isinstance(definition, dict)
                and definition.get("protocol") == self.scope.protocol)

    def _admit_role_records(self, configure: ReplicationEntry, result: ReplicationApplyResult,
                            ticket: Any) -> Effects:
        """Admit every record at the role paths of the source's newest definition (§10.2), page
        by page, each through its own closure. The effective listing lists a role record only if
        its path was a role when it was listed, so a re-configure that made a path a role would
        leave the records already there unlisted, and a reader citing one would be refused here
        and let in at the source. Returns the configure's ``(result, ticket)``: ``Deferred``,
        its token unsettled and the link ``repairing``, unless every role record settled."""
        assert self.scope is not None and self.scope.protocol is not None
        failure: ClosureOutcome | None = None
        after: str | None = None
        while True:
            ref = RoleRecordsRef(self.scope.protocol, after)
            try:
                (answer,) = yield from self._get_dependencies([ref.to_json()])
                entries = yield from self._answer_entries(answer)
                after = _continuation(answer, after)
            except Exception as exc:  # the source or the connection failed: ask again next round
                failure = failure or self._role_failure(configure, f"role records not fetched: {exc}")
                break
            if isinstance(answer, dict) and answer.get("withheld") is True and failure is None:
                failure = self._role_failure(configure, "the source withheld role records", CLOSURE_FORBIDDEN)
            for role in (e for e in entries if _answers_role_records(ref, e, entries)):
                got, outcome, role_ticket = yield from self.admit(role)
                self.closure_failures.pop(role.cid, None)  # named by the configure, below
                if role_ticket is not None:
                    ticket = role_ticket  # the configure's reply waits for the last of their commits
                if got.kind not in SETTLING_KINDS and failure is None:
                    failure = self._role_failure(configure, f"role record {role.cid}: {outcome.detail or got.kind}")
            if after is None:
                break
        if failure is None:
            return result, ticket
        self.closure_failures[configure.cid] = failure
        self.host.observer.closure_failed(failure.code or "")
        log.warning("collection %d: %s stays unsettled: %s", self.index, configure.cid, failure.detail)
        return Deferred("storage"), ticket

    @staticmethod
    def _role_failure(configure: ReplicationEntry, why: str, code: str = ROLE_RECORD_MISSING) -> ClosureOutcome:
        return ClosureOutcome("deferred", configure.cid, 0, detail=f"{code}: {configure.cid}: {why}", code=code,
                              needed_by=configure.cid)

    def _closure_failed(self, entry: ReplicationEntry, outcome: ClosureOutcome) -> None:
        """A hard dependency of ``cid`` could not be had: say which (the RFC's diagnostics:
        root, dependency class, the dependency, the code) and keep the outcome for the result
        this root is counted with (:meth:`_take_result`: the link's ``repairing`` code)."""
        cid = entry.cid
        if self.scope is not None and self.scope.kind != "global" and not _in_intent(self.scope, entry.message):
            code = closure_operation_code(entry.message)
            if code is not None and code != outcome.code:
                outcome = replace(outcome, code=code, detail=f"{code}: {cid} is a closure operation of the scope; "
                                                             f"{outcome.detail}")
        self.closure_failures[cid] = outcome
        self.host.observer.closure_failed(outcome.code or "")
        dependency = outcome.dependency
        log.warning("collection %d: closure of %s incomplete: %s (%s %s, needed by %s); it stays unapplied",
                    self.index, cid, outcome.code, dependency.type if dependency is not None else "-",
                    describe_refs([dependency]) if dependency is not None else "-", outcome.needed_by)

    # -- listing: `changes` (pull) and `proposeChanges` (push) ------------------------------

    def on_listing(self, body: Any, *, pull: bool) -> Effects:
        """Check one Changes body, take its items into the window, and return the statuses.
        A failed sink (its peer is stopping) refuses listings too: nothing may move the
        ledger after the final save. Items are taken only as far as they fit the store's
        quotas: from the first that does not, every item is answered with the refusal's
        status and left out of the window (a listing of which no new item fits is refused)."""
        if self.failed is not None:
            raise self.failed
        listed, through, unnamed = self._parse_listing(body, pull=pull)
        self.unanswered.clear()  # a new batch: the source may hold what it lacked before
        if self.full is not None:
            self.quota_refused(self.full, len(listed))
            raise self.full
        held: set[str] = set()
        if listed:
            held = yield HeldMessages(self.tenant, tuple(t.message_cid for t, _ in listed),
                                      tuple(t.message_cid for t, size in listed if size is not None))
        again: set[str] = set()  # held here, taken anyway: nothing new to store
        if unnamed and self.scope is not None and self.scope.kind == "subset" and self.host.role_records:
            # A subset's configure travels even when held here (got from another peer, or
            # applied in a round cut before its role records came): its apply asks for them.
            again = held & unnamed
            held = held - unnamed
        statuses: list[int] = []
        for token, size in listed:
            if token.message_cid in held:
                statuses.append(304)
            elif size is not None and size > self.max_data:
                statuses.append(413)
            else:
                statuses.append(0)
        elsewhere = yield from self._claim(listed, statuses, pull=pull)
        if elsewhere and not pull:
            yield from self._await_pushed_elsewhere(listed, statuses, elsewhere)
        taken = yield from self._fit(listed, statuses, again)
        self._release(tuple(t.message_cid for t, _ in listed[taken:]), held=False)
        for (token, size), status in zip(listed[:taken], statuses[:taken], strict=True):
            if status == 413:  # settled, and a link error (§6.2): counted, logged, never fetched
                self._count("DataTooLarge")
                log.warning("collection %d: %s has %d bytes of data, above this peer's limit of %d; skipped",
                            self.index, token.message_cid, size, self.max_data)
            if token.message_cid in elsewhere and pull:
                item = self.window.add(token)
                item.elsewhere = True
                self.host.spawn(self._await_elsewhere(item, elsewhere[token.message_cid]), "elsewhere")
            else:
                self.window.add(token, settled=None if status == 0 else True)
        self.stats.items_offered += len(listed)
        self.stats.items_skipped += sum(1 for status in statuses[:taken] if status)
        last = self.window.last
        if taken == len(listed) and through is not None and (last is None or through.position > last.position):
            self.window.add(through, settled=True)
        if pull and not listed:
            self.caught_up = True
        self._settle_later()
        self._notify()
        while statuses and statuses[-1] == 0:
            statuses.pop()  # trailing zeros are implied (§6.2)
        return statuses

    def _claim(self, listed: list[tuple[ProgressToken, int | None]], statuses: list[int], *, pull: bool) -> Effects:
        """Claim the wanted items in the store's in-flight claims; those another link of this
        store is receiving already are declined (issue #17): ``304`` to a `changes` (this sink
        keeps the token open until that apply is durable: :meth:`_await_elsewhere`), ``503``
        for now to a `proposeChanges` (:meth:`_await_pushed_elsewhere` settles it before the
        answer). Returns the declined CIDs, each with the serial of the claim it waits on."""
        wanted = tuple(token.message_cid for (token, _), status in zip(listed, statuses, strict=True) if status == 0)
        if not wanted:
            return {}
        elsewhere: dict[str, int] = yield ClaimMessages(self.tenant, wanted, self)
        for i, (token, _) in enumerate(listed):
            if statuses[i] == 0:
                if token.message_cid in elsewhere:
                    statuses[i] = 304 if pull else 503
                else:
                    self.claimed.add(token.message_cid)
        self.stats.items_elsewhere += len(elsewhere)
        return elsewhere

    def _await_pushed_elsewhere(self, listed: list[tuple[ProgressToken, int | None]], statuses: list[int],
                                elsewhere: dict[str, int]) -> Effects:
        """A `proposeChanges` answers each item another link is receiving once that apply has
        ended: ``304`` when it is durable, ``503`` when it failed. Answered ``503`` at once, the
        pusher would keep the token unsettled until its next round, and a continuous round never
        ends: its link would stay short of ``live`` and its push frontier behind that message
        for as long as the connection lasts. Waiting cannot deadlock: each claim waited on is
        the one this listing was told of (by its serial: not one another link made later), so
        made before this listing's own, and an apply only waits on items listed before it."""
        for i, (token, _) in enumerate(listed):
            if statuses[i] == 503 and token.message_cid in elsewhere:
                self.awaiting = token.message_cid
                held = yield AwaitClaim(self.tenant, token.message_cid, elsewhere[token.message_cid])
                self.awaiting = None
                statuses[i] = 304 if held else 503
        if self.failed is not None:  # stopped meanwhile: fail() released this listing's claims
            raise self.failed

    def _release(self, cids: tuple[str, ...], *, held: bool) -> None:
        """End this sink's claims on ``cids`` (those it holds): ``held``, its apply is durable."""
        mine = tuple(cid for cid in cids if cid in self.claimed)
        if mine:
            self.claimed.difference_update(mine)
            self.host.store_later(ReleaseClaims(self.tenant, mine, self, held))

    def _await_elsewhere(self, item: WindowItem, serial: int) -> Effects:
        """A `changes` item declined because another link was receiving it: settled once that
        apply is durable; when that link gave up, left unsettled like a `Deferred` result (the
        checkpoint stays before it and the next round offers it again: nothing is lost)."""
        held = yield AwaitClaim(self.tenant, item.token.message_cid, serial)
        if item.done:
            return
        self.window.finish(item, settled=bool(held))
        if not held and self.failed is None:
            self.unsettled += 1
            if self.key is not None:
                self.host.store_later(unsettled_transition(self.key, self.direction, "Deferred"))
        self._settle_later()
        self._notify()

    def _fit(self, listed: list[tuple[ProgressToken, int | None]], statuses: list[int],
             held: Collection[str] = ()) -> Effects:
        """How many of ``listed`` to take (the wanted ones fit the quotas up to the first that
        does not); the statuses from there on become the refusal's code. Raises the refusal
        when no wanted item fits. ``held``: items taken though held here, which store nothing
        new and so are not charged (a store exactly at its quota still takes them)."""
        wanted = [i for i, status in enumerate(statuses) if status == 0 and listed[i][0].message_cid not in held]
        if not wanted:
            return len(listed)
        fits, refusal = yield QuotaFit(self.tenant, self.payer, tuple(listed[i][1] for i in wanted))
        if refusal is None:
            return len(listed)
        if fits == 0:
            # Nothing new fits: refuse the request, which says why (and, for a spent budget,
            # when to come back); what it listed that is held here is answered next time.
            self.quota_refused(refusal, len(wanted))
            self._notify()
            raise refusal
        taken = wanted[fits]
        self.quota_refused(refusal, len(wanted) - fits)
        statuses[taken:] = [refusal.code] * (len(listed) - taken)
        return taken

    def _parse_listing(
        self, body: Any, *, pull: bool
    ) -> tuple[list[tuple[ProgressToken, int | None]], ProgressToken | None, set[str]]:
        """The items (token, dataSize), ``through``, and the CIDs listed without a recordId: the
        messages that are no Records message (in a subset's listing, its protocol's configures)."""
        if not isinstance(body, dict):
            refuse(400, "ChangesInvalid", "Changes must be a map")
        items = body.get("items", [])
        if not isinstance(items, list):
            refuse(400, "ChangesInvalid", "items must be an array")
        stream_id, epoch = body.get("streamId"), body.get("epoch")
        listed: list[tuple[ProgressToken, int | None]] = []
        unnamed: set[str] = set()
        first: ProgressToken | None = None
        for raw in items:
            if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[0], str):
                refuse(400, "ChangesInvalid", "an item is [position, messageCid, recordId?, dataSize?]")
            position, cid = raw[0], raw[1]
            if first is not None and len(position) <= MAX_POSITION_DIGITS and _POSITION.fullmatch(position) \
                    and type(cid) is str and is_message_cid(cid):
                # What from_wire checks of an item, its domain aside: the first item's, checked.
                token = ProgressToken.of_own_log(first, int(position), cid)
            else:
                try:
                    token = ProgressToken.from_wire(
                        {"streamId": stream_id, "epoch": epoch, "position": position, "messageCid": cid}
                    )
                except DwnError as exc:
                    refuse(400, "ChangesInvalid", f"bad item: {exc}")
                first = first or token
            size = raw[3] if len(raw) > 3 else None
            listed.append((token, size if type(size) is int else None))
            if len(raw) < 3 or raw[2] is None:
                unnamed.add(token.message_cid)
        through = None
        if pull and "through" in body:
            try:
                through = ProgressToken.from_wire(body["through"])
            except DwnError as exc:
                refuse(400, "ChangesInvalid", f"bad through: {exc}")
        # Every item is in the first one's domain (each other item was made in it, or refused).
        for token in [t for t in (first, through) if t is not None]:
            if self.domain is None:
                self.domain = token.domain
            if token.domain != self.domain:
                refuse(400, "ChangesInvalid", "one domain per feed")
        last = self.window.last
        previous = -1 if last is None else last.position
        for token, _ in listed:
            if token.position <= previous:
                refuse(400, "ChangesInvalid", "items must ascend past everything listed before")
            previous = token.position
        if listed:
            last = listed[-1][0]
        if through is not None and last is not None and through.position < last.position:
            refuse(400, "ChangesInvalid", "through is below the last item")
        return listed, through, unnamed

    # -- `rev` and `norev` --------------------------------------------------------------------

    def _wanted(self, properties: dict[str, str]) -> WindowItem:
        position = int_property(properties, "position")
        item = self.window.get(position, properties.get("messageCid", ""))
        if item is None:
            refuse(409, "RevUnsolicited", f"no wanted item at {position}")
        item.arrived = True  # the caller lets fetches ahead go on once it queued its own
        return item

    # -- out-of-line data fetched ahead of its turn -------------------------------------------

    def _ahead_of(self, item: WindowItem, obj: Any) -> _Ahead | None:
        """Queue the fetch of a received entry's out-of-line data ahead of its turn; None when
        it has none to fetch (or more than the prefetch budget, or than ``max_data``).

        Fetches start in turn order as :data:`PREFETCH_BYTES` has room, and only once every
        message before theirs arrived: requests that arrive together are not handled in the
        order they were sent, and a later one that took the room first would leave the next in
        line to fetch at its turn, after them (measured: one attachment at a time, at 4 KiB
        frames, then all three ahead landing together). Nothing waits for
        room at its turn: an entry whose fetch has not started when its turn comes is fetched
        then (:meth:`_take_ahead`), as if it had never been queued, so the message in line
        always moves whatever later ones hold."""
        size = obj.get("dataSize") if isinstance(obj, dict) else None
        ahead = None
        if type(size) is int and obj.get("data") is None and INLINE_DATA_MAX < size <= min(self.max_data,
                                                                                          PREFETCH_BYTES):
            ahead = _Ahead(item, obj, size, self.host.signal())
            bisect.insort(self._ahead_waiting, ahead, key=_Ahead.turn_order)
        self._start_ahead()  # its arrival may let those behind it go too
        return ahead

    def _start_ahead(self) -> None:
        waiting = self._ahead_waiting
        if not waiting:
            return
        while waiting and self.failed is None and waiting[0].size <= self._prefetch_room \
                and self.window.arrived_before(waiting[0].item):
            ahead = waiting.pop(0)
            self._prefetch_room -= ahead.size
            ahead.state = _Ahead.RESERVED
            self.host.spawn(self._fetch_ahead(ahead), "fetch ahead")

    def _fetch_ahead(self, ahead: _Ahead) -> Effects:
        try:
            ahead.entry = yield from self.entry_of(ahead.obj)
        except PeerError as exc:
            ahead.error = exc
        finally:
            ahead.obj = None
            ahead.done = True
            ahead.finished.fire()
            if ahead.orphaned:
                self._give_back(ahead)

    def _take_ahead(self, ahead: _Ahead) -> Effects:
        """At its turn: the entry its fetch ahead read (waiting for it to end), or read now."""
        if ahead.state == _Ahead.WAITING:
            self._ahead_waiting.remove(ahead)
            ahead.state = _Ahead.AT_TURN
            assert ahead.obj is not None
            return (yield from self.entry_of(ahead.obj))
        while not ahead.done:
            yield ahead.finished
        if ahead.error is not None:
            raise ahead.error
        assert ahead.entry is not None
        entry, ahead.entry = ahead.entry, None
        return entry

    def _drop_ahead(self, ahead: _Ahead | None) -> None:
        """Its message was answered (or will not be): give back what its fetch holds."""
        if ahead is None:
            return
        if ahead.state == _Ahead.WAITING:
            self._ahead_waiting.remove(ahead)
            ahead.state = _Ahead.AT_TURN
        elif not ahead.done:
            ahead.orphaned = True  # the fetch gives its room back when it ends
        else:
            self._give_back(ahead)

    def _give_back(self, ahead: _Ahead) -> None:
        ahead.entry = None
        if ahead.state == _Ahead.RESERVED:
            ahead.state = _Ahead.RETURNED
            self._prefetch_room += ahead.size
            self._start_ahead()

    def on_rev(self, properties: dict[str, str], body: bytes) -> Effects:
        """Apply one `rev` (§8.2); returns the ReplicationApplyResult (JSON) once durable."""
        item = self._wanted(properties)
        cid = item.token.message_cid
        obj: Any = None
        early: PeerError | None = None
        ahead: _Ahead | None = None
        try:
            obj = decode_body(body)
        except PeerError as exc:
            early = exc
            self._start_ahead()
        if early is None:
            ahead = self._ahead_of(item, obj)
        try:
            yield from self._turn(item)
        except BaseException:
            self._drop_ahead(ahead)
            raise
        settled = False
        ticket: Any = None
        try:
            self.stats.revs_received += 1
            self.stats.bytes_received += len(body)
            # its refusal, or the entry fetched ahead, or the entry read now
            reading = early if early is not None else self._take_ahead(ahead) if ahead is not None \
                else self.entry_of(obj)
            result, ticket = yield from self._admit_listed(cid, reading)
            settled = self._take_result(cid, result)
        except BaseException:
            self._release((cid,), held=False)
            raise
        finally:
            self._drop_ahead(ahead)
            if not item.done:
                self.window.finish(item, settled=settled)
            self._settle_later()
            self._notify()
        # The message and its data are in the open transaction now: let go of them before
        # waiting for the commit, or a batch of 64 large records stays in memory until then.
        obj = early = None
        if ticket is not None:
            try:
                yield from durable(ticket)
            except BaseException:
                self._release((cid,), held=False)
                raise
        self._release((cid,), held=result.kind in HELD_KINDS)
        return result.to_json()

    def _take_result(self, cid: str, result: ReplicationApplyResult) -> bool:
        """Count a message's final result (and name it if it did not apply); returns whether it
        settles its token (§11). A closure that failed for want of a hard dependency names the
        link's ``repairing`` by its code (``ClosureParentChainMissing``, ...)."""
        self._count(result.kind)
        failure = self.closure_failures.pop(cid, None)
        self.note_result(cid, result, failure)
        settled = result.kind in SETTLING_KINDS
        if not settled:
            self.unsettled += 1
            if self.key is not None:
                code = failure.code if failure is not None and failure.code is not None else result.kind
                self.host.store_later(unsettled_transition(self.key, self.direction, code))
        if result.kind == "Applied":
            self.stats.revs_applied += 1
        if settled:
            self.stats.revs_settled += 1
        return settled

    def on_revs(self, body: bytes) -> Effects:
        """Apply the messages of one `revs` (§8.4), each in its listed turn as a `rev` would be;
        returns the reply's ``results`` (one per message, in order) once every apply they hold
        is durably committed. A message refused on its own (a bad entry, one not asked for, a
        data mismatch) gets its own error there; the others go on.

        The members whose turns come one after the other are applied by one
        :class:`ApplyBatch` (issue #17: one store request, not one per message); a message
        found ``Incomplete`` ends that run, goes through the closure loop, and the next run
        applies what follows it — the order a `rev` per message would have."""
        raw = decode_map(body).get("revs")
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_REVS_ITEMS:
            refuse(400, "BodyInvalid", f"revs must be an array of 1 to {MAX_REVS_ITEMS} entries")
        self.stats.bytes_received += len(body)
        # Their signatures may be verified on another core while this thread reads and applies
        # them (the engine still verifies whatever that did not accept).
        self.host.store_later(VerifyAhead(tuple(
            obj["message"] for obj in raw if type(obj) is dict and type(obj.get("message")) is dict)))
        members = self._revs_members(raw)
        del raw
        results: list[Any] = [None] * len(members)
        commits: list[tuple[Any, list[int]]] = []  # each commit, and the results it holds
        held: list[tuple[str, int]] = []  # each message held once its commit is: CID, result
        try:
            i = 0
            while i < len(members):
                i = yield from self._revs_run(members, i, results, commits, held)
        except BaseException:
            self._release(tuple(cid for cid, _ in held), held=False)
            raise
        finally:
            for member in members:
                self._drop_ahead(member.ahead)
        members.clear()  # the data is in the open transaction: let go of it before waiting
        lost: set[int] = set()  # results whose commit failed
        try:
            for ticket, indices in commits:
                try:
                    yield from durable(ticket)
                except PeerError as exc:
                    for i in indices:
                        results[i] = error_result(exc)
                        lost.add(i)
        except BaseException:
            self._release(tuple(cid for cid, _ in held), held=False)
            raise
        if lost:
            self._release(tuple(cid for cid, i in held if i in lost), held=False)
        self._release(tuple(cid for cid, i in held if i not in lost), held=True)
        return results

    def _revs_members(self, raw: list[Any]) -> list[_RevsMember]:
        """Read every member of a `revs`: its wanted item and its entry, or its refusal."""
        members: list[_RevsMember] = []
        taken: set[int] = set()  # a second member naming an item finds it answered already
        for obj in raw:
            try:
                if not isinstance(obj, dict) or not isinstance(obj.get("position"), str):
                    refuse(400, "BodyInvalid", "a revs member is a MessageEntry with position and messageCid")
                cid = obj.get("messageCid")
                item = self._wanted({"position": obj["position"], "messageCid": cid if isinstance(cid, str) else ""})
                if id(item) in taken:
                    refuse(409, "RevUnsolicited", f"no wanted item at {item.token.position}")
            except PeerError as exc:
                members.append(_RevsMember(None, error=exc))
                continue
            taken.add(id(item))
            member = _RevsMember(item)
            try:
                entry, size = self.read_entry(obj)
            except PeerError as exc:
                member.error, member.counted = exc, True
            else:
                if size is not None:
                    member.fetch = obj  # out-of-line data: fetched ahead, or at its turn
                    member.ahead = self._ahead_of(item, obj)
                elif entry.cid != cid:
                    member.error = PeerError(400, "RevMismatch", "the message's CID is not messageCid")
                else:
                    member.entry = entry
            members.append(member)
        self._start_ahead()  # their arrival may let fetches behind them go
        return members

    def _revs_run(self, members: list[_RevsMember], i: int, results: list[Any],
                  commits: list[tuple[Any, list[int]]], held: list[tuple[str, int]]) -> Effects:
        """Answer members ``i``… of a `revs` whose turns come one after the other (see
        :meth:`on_revs`); returns the index of the first member not answered yet."""
        first = members[i]
        if first.item is None:
            assert first.error is not None
            results[i] = error_result(first.error)
            return i + 1
        try:
            yield from self._turn(first.item)
        except PeerError as exc:
            results[i] = error_result(exc)
            return i + 1
        if first.fetch is not None:
            obj, first.fetch = first.fetch, None
            ahead, first.ahead = first.ahead, None
            try:
                entry = yield from (self.entry_of(obj) if ahead is None else self._take_ahead(ahead))
            except PeerError as exc:
                first.error, first.counted = exc, True
            else:
                if entry.cid != obj.get("messageCid"):
                    first.error = PeerError(400, "RevMismatch", "the message's CID is not messageCid")
                else:
                    first.entry = entry
            finally:
                # the entry is this run's now: its room goes to the next fetch ahead
                self._drop_ahead(ahead)
        # The run: this member, and those after it whose turns follow one another now.
        items = [first.item]
        end = i + 1
        while end < len(members) and members[end].fetch is None:
            item = members[end].item
            if item is not None:
                items.append(item)
            end += 1
        turns = self.window.in_turn(items)
        if turns < len(items):
            stop = items[turns]
            end = next(j for j in range(i, end) if members[j].item is stop)
        run = members[i:end]
        entries = tuple(m.entry for m in run if m.entry is not None)
        done: list[tuple[ReplicationApplyResult, Any]] = []
        error: Exception | None = None
        if entries:
            try:
                done, error = yield ApplyBatch(self.tenant, entries, self.host.remote_store_id, self.payer)
            except Exception as exc:  # the store failed: each message's closure says so
                error = exc
        answers: list[Any] = [*done, error] if error is not None else done
        unheld: list[str] = []
        k = 0
        j = i
        try:
            for j, member in enumerate(run, i):
                item = member.item
                if item is None:
                    assert member.error is not None
                    results[j] = error_result(member.error)
                    continue
                if k == len(answers) and (member.entry is not None or j != i and self.failed is not None):
                    # The batch stopped before it (the next run applies it), or a closure
                    # before it failed the sink (the next run refuses it, as a `rev`'s turn).
                    return j
                self.stats.revs_received += 1
                cid = item.token.message_cid
                if member.entry is None:
                    assert member.error is not None
                    if member.counted:
                        self._count(member.error.name)
                    results[j] = error_result(member.error)
                    unheld.append(cid)
                    if not item.done:
                        self.window.finish(item, settled=False)
                    continue
                answer = answers[k]
                k += 1
                try:
                    if isinstance(answer, Exception) or answer[0].kind == "Incomplete" \
                            or self._brings_roles(member.entry.message):
                        result, _, ticket = yield from self.admit(member.entry, first=answer)
                    else:
                        result, ticket = answer
                except PeerError as exc:  # a quota refused it: the sink takes nothing more
                    results[j] = error_result(exc)
                    unheld.append(cid)
                    if not item.done:
                        self.window.finish(item, settled=False)
                    return j + 1
                settled = self._take_result(cid, result)
                if not item.done:
                    self.window.finish(item, settled=settled)
                if result.kind in HELD_KINDS:
                    held.append((cid, j))
                else:
                    unheld.append(cid)
                if ticket is not None:
                    if commits and commits[-1][0] is ticket:
                        commits[-1][1].append(j)
                    else:
                        commits.append((ticket, [j]))
                results[j] = result.to_json()
                member.entry = None  # in the open transaction now
                if k == len(answers) and len(answers) < len(entries):
                    return j + 1  # its closure ran: the next run applies what follows it
            return end
        finally:
            if unheld:
                self._release(tuple(unheld), held=False)
            self._settle_later()
            self._notify()

    def _admit_listed(self, cid: Any, entry: Any) -> Effects:
        """Admit the message of a `rev` or a `revs` member: ``entry`` is its ReplicationEntry, a
        refusal met while reading it, or the effects that read it; it must be the ``cid`` its
        item listed. Returns ``(result, ticket of its commit)``."""
        try:
            if isinstance(entry, PeerError):
                raise entry
            if not isinstance(entry, ReplicationEntry):
                entry = yield from entry
        except PeerError as exc:
            self._count(exc.name)
            raise
        if entry.cid != cid:
            refuse(400, "RevMismatch", "the message's CID is not messageCid")
        result, _, ticket = yield from self.admit(entry)
        return result, ticket

    def on_norev(self, properties: dict[str, str]) -> Effects:
        item = self._wanted(properties)
        self._start_ahead()
        yield from self._turn(item)
        # 404: the message left the source's log, settled; 503 (or anything else): not now.
        self._release((item.token.message_cid,), held=False)
        self.window.finish(item, settled=properties.get("error") == "404")
        self._settle_later()
        self._notify()


class _RevsMember:
    """One member of a `revs`: its wanted item (None: it names none) and its entry, or the
    refusal it is answered with, or the MessageEntry to read at its turn (``fetch``: its data
    travels out of line)."""

    __slots__ = ("ahead", "counted", "entry", "error", "fetch", "item")

    def __init__(self, item: WindowItem | None, *, error: PeerError | None = None) -> None:
        self.item = item
        self.entry: ReplicationEntry | None = None
        self.error = error
        #: the refusal is counted under its name in the stats (an entry that did not read)
        self.counted = False
        self.fetch: Any = None
        #: the fetch of ``fetch``'s data ahead of its turn, if one was queued
        self.ahead: _Ahead | None = None


class _Ahead:
    """The fetch of one entry's out-of-line data ahead of its turn (:meth:`Sink._ahead_of`)."""

    WAITING: Final = 0  # queued until the prefetch budget has room
    RESERVED: Final = 1  # started with ``size`` bytes of the budget, given back once
    RETURNED: Final = 2  # started with room that is given back
    AT_TURN: Final = 3  # fetched at its turn instead (it holds no room), or dropped unstarted

    __slots__ = ("done", "entry", "error", "finished", "item", "obj", "orphaned", "size", "state")

    def __init__(self, item: WindowItem, obj: dict[str, Any], size: int, finished: Signal) -> None:
        self.item = item
        self.obj: dict[str, Any] | None = obj
        self.size = size
        self.finished = finished
        self.state = _Ahead.WAITING
        self.done = False
        self.entry: ReplicationEntry | None = None
        self.error: PeerError | None = None
        #: its message was answered while the fetch ran: it gives its room back when it ends
        self.orphaned = False

    def turn_order(self) -> int:
        return self.item.token.position


def _continuation(answer: Any, after: str | None) -> str | None:
    """A ``RoleRecords`` answer's ``next`` (§10.2): None on the last page; a recordId past
    ``after`` otherwise (anything else could page forever)."""
    following = answer.get("next") if isinstance(answer, dict) else None
    if following is None:
        return None
    if not (isinstance(following, str) and is_message_cid(following) and (after is None or following > after)):
        raise PeerError(400, "BodyInvalid", "a RoleRecords answer's next must be a recordId past after")
    return following


def _answers_role_records(ref: RoleRecordsRef, entry: ReplicationEntry, page: list[ReplicationEntry]) -> bool:
    """Whether ``entry`` belongs in an answer to ``ref``: a write of its protocol, or the delete
    of a record the page writes (a delete names only its record). Anything else is dropped."""
    descriptor = entry.message.get("descriptor") if isinstance(entry.message, dict) else None
    if not isinstance(descriptor, dict) or descriptor.get("interface") != "Records":
        return False
    if descriptor.get("method") == "Write":
        return descriptor.get("protocol") == ref.protocol
    return descriptor.get("method") == "Delete" and descriptor.get("recordId") in {e.record_id for e in page}


def _in_intent(scope: SyncScope, message: Any) -> bool:
    """Whether ``message`` is in ``scope``'s intent; a message the scope cannot decide from the
    message alone (a RecordsDelete) counts as in it."""
    try:
        return not isinstance(message, dict) or scope.matches(message)
    except (SyncScopeUndecidable, AttributeError, TypeError):
        return True


def unsettled_transition(key: Any, direction: Any, kind: str) -> Transition:
    """The link ``key`` to ``repairing``: a `rev` of ``direction`` was answered ``kind``, a
    result that leaves its token unapplied. Made before the token is recorded, so the link is
    never ``live`` with it unapplied; the round that next catches up with everything settled
    makes it ``live`` again (:class:`~p2psync.replication.round.SyncRound`)."""
    return Transition(key, LinkState.REPAIRING, "unsettled", direction=direction, error_code=kind,
                      only_from=UNSETTLED_FROM)


def error_result(error: PeerError) -> dict[str, Any]:
    """A refusal of one message of a `revs` as its member of ``results`` (§8.4): the status and
    the §13 ERR body, as a `rev` would have been refused."""
    return {"status": error.code, "error": error.body}


def durable(ticket: Any) -> Effects:
    """Wait for the commit holding ``ticket``; a failed commit is ``503 StoreUnavailable``."""
    try:
        yield Durable(ticket)
    except PeerError:
        raise
    except Exception as exc:
        refuse(503, "StoreUnavailable", str(exc))


def check_data(message: dict[str, Any], size: int, data: bytes) -> str:
    """§8.2 step 2: ``dataSize`` bytes, equal to the descriptor's, hashing to its dataCid;
    returns that CID."""
    descriptor = message.get("descriptor")
    if not isinstance(descriptor, dict):
        raise PeerError(424, "AttachmentInvalid", "message has no descriptor")
    if len(data) != size or descriptor.get("dataSize") != size:
        raise PeerError(424, "AttachmentInvalid", "data size does not match")
    cid = data_cid(data)
    if cid != descriptor.get("dataCid"):
        raise PeerError(424, "AttachmentInvalid", "data does not hash to dataCid")
    return cid
