"""Carries out the replication protocol's store requests against one store.

:class:`~p2psync.replication.protocol.ReplicationProtocol` asks for reads and writes as
typed :class:`~p2psync.replication.effects.StoreRequest` values; a :class:`StoreService`
answers them with the engine, the ledger, the checkpoint copies, the origins, the local
fetcher and the read authorizer of one store, all writes going through its
:class:`~p2psync.state.committer.GroupCommitter`. The store's own failures are mapped here to
the profiles' refusals (§13), so the protocol only ever sees a :class:`PeerError`. The
store's quotas (:class:`~p2psync.state.quota.Quotas`, issue #15) are enforced here too: an
apply that would pass one is refused before anything of it is written.

Most requests are synchronous (:meth:`StoreService.run`). The ``durable`` ones wait for a
commit: the trio driver awaits the group commit itself (:meth:`writer` gives it the write), and
:meth:`run_now` commits at once (a test that pumps two protocols with no event loop).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import apsw

from p2psync.dwn import datacid
from p2psync.dwn.ahead import SignatureProcess, SignatureWorker
from p2psync.dwn.canonical import archived_without_data
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import get_newest_message
from p2psync.dwn.progress import ProgressToken
from p2psync.dwn.protocols import fetch_all_role_paths
from p2psync.dwn.replicated import MAX_RUN, MIN_RUN, RunEntry
from p2psync.dwn.replication_types import ReplicationApplyResult
from p2psync.dwn.store import Store
from p2psync.errors import CheckpointRevConflict, LocalMisuse, QuotaExceeded
from p2psync.replication import effects as fx
from p2psync.replication.checkpoint import CheckpointPendingOverflow
from p2psync.replication.scope import ListingFacts, RoleRecordsRef, SyncScope
from p2psync.replication.wire import PeerError
from p2psync.state.authz import ReadAuthorizer
from p2psync.state.committer import GroupCommitter, StoreUnavailable
from p2psync.state.copies import CheckpointCopies, Origins
from p2psync.state.ledger import Ledger
from p2psync.state.local import LocalStoreFetcher
from p2psync.state.log import check_token, replay_bounds
from p2psync.state.quota import Quotas
from p2psync.state.sketches import SetSketches

__all__ = ["StoreService"]

#: CIDs per ``IN (...)`` lookup: under SQLite's oldest default of 999 bound parameters.
#: The log's entries of definitions a newer one replaced (archived, not stored), in log order.
_REPLACED_DEFINITIONS: Final = (
    "SELECT e.cid, a.body FROM events e JOIN archive a ON a.tenant=e.tenant AND a.cid=e.cid"
    " WHERE e.tenant=? AND a.record_id IS NULL"
    " AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.tenant=e.tenant AND m.cid=e.cid) ORDER BY e.position"
)
_IN_CHUNK: Final = 500
#: (tenant, protocol) pairs whose role paths are kept: a node lists subsets of a few protocols.
_ROLE_CACHE: Final = 256
#: Entries of a batch applied one by one after a try at a run that took none, before the next
#: try: a batch of updates or duplicates costs a try every few entries, not one each. Ours.
_RUN_RETRY_AFTER: Final = 8


class StoreService:
    """The store side of a peer's connections (see the module doc)."""

    def __init__(
        self,
        store: Store,
        *,
        dwn: Dwn,
        ledger: Ledger,
        copies: CheckpointCopies,
        committer: GroupCommitter,
        authorizer: Any = None,
        quotas: Quotas | None = None,
        ahead: SignatureWorker | SignatureProcess | None = None,
    ) -> None:
        self.store = store
        #: verifies received messages' signatures on another core (None: the engine alone does)
        self.ahead = ahead
        #: the store's quotas (None: nothing bounded)
        self.quotas = quotas
        self.dwn = dwn
        self.ledger = ledger
        self.copies = copies
        self.committer = committer
        self.authorizer = authorizer if authorizer is not None else ReadAuthorizer(store)
        self.origins = Origins(store)
        self.fetcher = LocalStoreFetcher(store)
        #: the reconciliation sketches (protocol/anti-entropy.md), kept up to date
        self.sketches = SetSketches(store, flush=lambda: self._flush(fx.FlushCommits()))
        # Fold the set changes once a batch of journal rows waits: a reconcile never starts with
        # a long journal to fold, and digests and sketches fold first anyway (setindex.FOLD_BATCH).
        committer.after_commit(self.sketches.index.catch_up_if_due)
        #: $role paths of each (tenant, protocol) a subset is listed for, by its configures' CIDs
        self._roles: dict[tuple[str, str], tuple[frozenset[str], frozenset[str]]] = {}
        #: ledger steps waiting for the open batch's commit, by (link key, direction)
        self._at_commit: dict[tuple[Any, Any], list[Any]] = {}
        self._sync: dict[type, Callable[[Any], Any]] = {
            fx.ReadCopy: self._read_copy,
            fx.Authorize: self._authorize,
            fx.StillValid: self._still_valid,
            fx.OpenFeed: self._open_feed,
            fx.ReadPage: self._read_page,
            fx.AnswerRefs: self._answer_refs,
            fx.AnswerReconcile: self._answer_reconcile,
            fx.LocalSetView: self._local_set_view,
            fx.LocalCids: lambda r: self.sketches.cids_of(r.tenant, r.scope, r.coder, r.ids),
            fx.LocalDefinitions: self._local_definitions,
            fx.ReadOffered: self._read_offered,
            fx.HeldMessages: self._held,
            fx.QuotaFit: self._quota_fit,
            fx.VerifyAhead: self._verify_ahead,
            fx.Apply: self._apply,
            fx.ApplyBatch: self._apply_batch,
            fx.RecordSteps: self._record_steps,
            fx.FlushCommits: self._flush,
            fx.OpenLink: lambda r: self.ledger.open_link(r.tenant, r.remote, r.scope).key,
            fx.ReadCheckpoint: lambda r: self.ledger.get_checkpoint(r.key, r.direction),
            fx.RewindCheckpoint: lambda r: self.ledger.rewind_checkpoint(r.key, r.direction, r.to, reason=r.reason),
            fx.ResetCheckpoint: self._reset,
            fx.Transition: self._transition,
            fx.RecordSuccess: lambda r: self.ledger.record_success(r.key),
            fx.LogDomain: self._log_domain,
        }

    # -- dispatch -----------------------------------------------------------------------------

    def run(self, request: fx.StoreRequest) -> Any:
        """Carry out a synchronous request (not ``durable``)."""
        return self._sync[type(request)](request)

    def run_now(self, request: fx.StoreRequest) -> Any:
        """Any request, synchronously: a ``durable`` one commits at once."""
        if not request.durable:
            return self.run(request)
        try:
            if isinstance(request, fx.WaitForLog):
                return None
            if isinstance(request, fx.Durable):
                self.committer.flush()
                return None
            result, _ = self.committer.run(self.writer(request))
            self.committer.flush()
            return result
        except StoreUnavailable as exc:
            raise exc.as_refusal() from exc

    def record_at_commit(self, request: fx.RecordSteps, failed: Callable[[int, PeerError], None]) -> None:
        """Give the ledger ``request``'s steps just before the open batch commits; an overflow
        is reported to ``failed(index, error)`` (the sink then stops taking items). Steps of one
        link and direction in one batch are recorded together, in order: one ledger write per
        batch, not one per `rev`."""
        slot = (request.key, request.direction)
        pending = self._at_commit.get(slot)
        if pending is not None:
            pending.extend(request.steps)
            return
        steps = self._at_commit[slot] = list(request.steps)

        def hook() -> None:
            del self._at_commit[slot]
            try:
                self.ledger.record(request.key, request.direction, steps)
            except CheckpointPendingOverflow as exc:
                failed(request.index, PeerError(409, "CheckpointPendingOverflow", str(exc)))

        self.committer.before_commit(hook)

    # -- writes that wait for a commit ---------------------------------------------------------

    def writer(self, request: fx.StoreRequest) -> Callable[[], Any]:
        """The write of a durable ``WriteCopy`` or ``ApplyGrant``, for the group commit."""
        if isinstance(request, fx.WriteCopy):
            return lambda: self._write_copy(request)
        if isinstance(request, fx.ApplyGrant):
            return self._grant_writer(request)
        raise LocalMisuse(f"not a durable write: {request!r}")

    def _grant_writer(self, request: fx.ApplyGrant) -> Callable[[], Any]:
        """A grant brought in ``getCollections`` is a write like any other: one that does not fit
        the tenant's quota is not applied (nobody's push budget is charged: it is the tenant's
        own message, and the collection is refused or served whatever becomes of it)."""
        tenant, message, data = request.tenant, request.message, request.data
        quotas = self.quotas
        if quotas is not None and quotas.watching(tenant, None):
            try:
                quotas.check(tenant, None, quotas.cost(tenant, message, str(message_cid(message)), data))
            except QuotaExceeded:
                return lambda: None
        return lambda: self.dwn.apply_replicated_message(tenant, message, data)

    def _write_copy(self, request: fx.WriteCopy) -> str:
        try:
            return self.copies.set(request.peer_did, request.checkpoint_id, request.pair, request.rev)
        except CheckpointRevConflict:
            raise  # already the 409 refusal, with the stored rev in its body
        except DwnError as exc:
            raise PeerError(400, "CheckpointInvalid", str(exc)) from exc

    # -- synchronous requests ------------------------------------------------------------------

    def _read_copy(self, request: fx.ReadCopy) -> tuple[dict[str, Any], str] | None:
        return self.copies.get(request.peer_did, request.checkpoint_id)

    def _authorize(self, request: fx.Authorize) -> fx.ReadDecision:
        if self.authorizer is None:
            return fx.ReadDecision(False, "no grants are honoured by this peer")
        decided = self.authorizer.reader(request.tenant, request.reader, request.scope)
        if not decided.allowed:
            return fx.ReadDecision(False, decided.reason)
        return fx.ReadDecision(True, decided.reason, decided)

    def _still_valid(self, request: fx.StillValid) -> bool:
        grant = request.decision.grant
        return grant is None or bool(self.authorizer.still_valid(request.tenant, grant))

    def _may_read(self, tenant: str, decision: fx.ReadDecision) -> Callable[[dict[str, Any]], bool] | None:
        grant = decision.grant
        if grant is None:
            return None
        authorizer = self.authorizer
        return lambda message: bool(authorizer.may_read(tenant, grant, message))

    def _open_feed(self, request: fx.OpenFeed) -> tuple[Any, ProgressToken | None]:
        store, tenant = self.store, request.tenant
        gap = check_token(store, tenant, request.since) if request.since is not None else None
        if gap is not None or store.tenant_id(tenant, create=False) is None:
            return gap, None
        row = store.conn.execute(
            "SELECT e.position, e.cid FROM events e JOIN tenants t ON t.id = e.tenant WHERE t.did=?"
            " ORDER BY e.position DESC LIMIT 1",
            (tenant,),
        ).fetchone()
        if row is None:
            return None, None
        stream_id, epoch = store.events.stream(tenant)
        return None, ProgressToken(stream_id, epoch, int(row[0]), str(row[1]))

    def _read_page(self, request: fx.ReadPage) -> list[fx.PageRow]:
        # List only committed entries: one in the open batch can be rolled back by a crash and
        # its position reused by another message, under a token a puller already keeps.
        self._flush(fx.FlushCommits())
        store, tenant = self.store, request.tenant
        if store.tenant_id(tenant, create=False) is None:
            return []
        stream_id, epoch = store.events.stream(tenant)
        # Each entry with its message's stored text, read in one statement for the page.
        rows = self.fetcher.log_page(tenant, request.after, request.limit)
        echoes: set[str] = set()
        if request.suppress_origin is not None and rows:
            echoes = self.origins.from_store(
                tenant, [c for p, c, _ in rows if p > request.replay_until], request.suppress_origin
            )
        may_read = self._may_read(tenant, request.decision)
        scope = request.scope
        # The whole tenant lists everything: no per-message test (issue #17's fast path).
        in_scope = None if scope.kind == "global" else self._lister(tenant, scope)
        subset = scope.kind == "subset"
        listed_entry = self.fetcher.listed_entry
        page: list[fx.PageRow] = []
        domain: ProgressToken | None = None
        for position, cid, stored in rows:
            # The first token checks the domain; the others share it (ProgressToken.of_own_log).
            if domain is None:
                token = domain = ProgressToken(stream_id, epoch, position, cid)
            else:
                token = ProgressToken.of_own_log(domain, position, cid)
            # A subset sink asks for the role records of each configure listed to it (§10.2),
            # so a configure (the one entry without a recordId) is proposed even to the store
            # it came from: this source may hold records at a path it made a role.
            if cid in echoes and not (subset and (stored is None or stored[3] is None)):
                page.append(fx.PageRow(token, "echo"))
                continue
            listed = listed_entry(tenant, cid, stored)
            entry, size = listed if listed is not None else (None, None)
            if entry is not None and in_scope is not None and not in_scope(cid, entry.message):
                page.append(fx.PageRow(token, "out_of_scope"))
                continue
            readable = entry is not None and (may_read is None or may_read(entry.message))
            page.append(fx.PageRow(token, "listed", entry, size, readable))
        return page

    def _lister(self, tenant: str, scope: SyncScope) -> Callable[[str, dict[str, Any]], bool]:
        """Whether a listed message is in ``scope``'s effective listing (``SyncScope.lists``:
        intent plus the closure a sink cannot ask for). A RecordsDelete names no protocol, so
        its stored indexes (which carry its record's) decide."""
        roles = self._role_paths(tenant, scope.protocol) if scope.kind == "subset" and scope.protocol else ()
        get_indexes = self.store.messages.get_indexes
        matches = scope.matches

        def lists(cid: str, message: dict[str, Any]) -> bool:
            descriptor = message.get("descriptor")
            if isinstance(descriptor, dict) and descriptor.get("interface") == "Records" \
                    and descriptor.get("method") == "Delete":
                return scope.lists(ListingFacts.of(get_indexes(tenant, cid) or {}), roles)
            # Intent first: it decides most of a scope's messages, at less cost.
            return matches(message) or scope.lists(ListingFacts.of(message), roles)

        return lists

    def _role_paths(self, tenant: str, protocol: str) -> frozenset[str]:
        """The ``$role`` paths of the newest stored definition of ``protocol``, cached by the
        CIDs of the stored configures (a new configure changes them, so the cache follows)."""
        where = (" FROM messages m JOIN tenants t ON t.id = m.tenant"
                 " WHERE t.did=? AND m.interface='Protocols' AND m.method='Configure' AND m.protocol=?")
        conn = self.store.conn
        key = (tenant, protocol)
        stamp = frozenset(str(cid) for (cid,) in conn.execute("SELECT m.cid" + where, (tenant, protocol)))
        cached = self._roles.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]  # (asked once a page: the bodies are read only when they changed)
        newest = get_newest_message([json.loads(str(body)) for (body,) in conn.execute("SELECT m.body" + where,
                                                                                      (tenant, protocol))])
        paths: frozenset[str] = frozenset()
        if newest is not None:
            structure = newest["descriptor"]["definition"].get("structure")
            if isinstance(structure, dict):
                paths = frozenset(fetch_all_role_paths("", structure, []))
        if len(self._roles) >= _ROLE_CACHE:
            self._roles.clear()
        self._roles[key] = (stamp, paths)
        return paths

    def _answer_refs(self, request: fx.AnswerRefs) -> list[tuple[list[Any], bool, str | None]]:
        may_read = self._may_read(request.tenant, request.decision)
        out: list[tuple[list[Any], bool, str | None]] = []
        for ref in request.refs:
            after: str | None = None
            if isinstance(ref, RoleRecordsRef):
                paths = self._role_paths(request.tenant, ref.protocol)
                entries, after = self.fetcher.role_records(request.tenant, ref.protocol, paths, ref.after,
                                                           request.limit)
            else:
                entries = [] if ref.terminal else self.fetcher.answer(request.tenant, ref)[: request.limit]
            readable = [e for e in entries if may_read is None or may_read(e.message)]
            out.append((readable, len(readable) != len(entries), after))
        return out

    def _log_head(self, tenant: str) -> dict[str, Any] | None:
        """The tenant's log head token after committing the open batch, so that the set a
        reconcile reads next (it commits too, then reads without yielding) and the head agree
        (protocol/anti-entropy.md §7)."""
        self._flush(fx.FlushCommits())
        bounds = replay_bounds(self.store, tenant)
        return None if bounds is None or bounds.latest is None else bounds.latest.to_wire()

    def _answer_reconcile(self, request: fx.AnswerReconcile) -> dict[str, Any]:
        with _set_reads():
            head = self._log_head(request.tenant) if request.body.get("l") is True else None
            reply = self.sketches.answer(request.tenant, request.scope, request.body)
        if request.body.get("l") is True:
            reply["l"] = head
        return reply

    def _local_set_view(self, request: fx.LocalSetView) -> tuple[Any, dict[str, Any] | None]:
        with _set_reads():
            head = self._log_head(request.tenant)
            return self.sketches.view(request.tenant, request.scope, request.coder), head

    def _local_definitions(self, request: fx.LocalDefinitions) -> tuple[tuple[str, ...], tuple[str, ...]]:
        tid = self.store.tenant_id(request.tenant, create=False)
        if tid is None:
            return (), ()
        scope, conn = request.scope, self.store.conn

        def within(body: Any) -> bool:
            message = json.loads(str(body))
            return scope.matches(message) or scope.lists(ListingFacts.of(message))

        protocols = sorted({str(protocol) for protocol, body in conn.execute(
            "SELECT protocol, body FROM messages WHERE tenant=? AND interface='Protocols' AND method='Configure'",
            (tid,)) if within(body)})
        replaced = [str(cid) for cid, body in conn.execute(_REPLACED_DEFINITIONS, (tid,)) if within(body)]
        return tuple(protocols), tuple(replaced)

    def _read_offered(self, request: fx.ReadOffered) -> bytes | None:
        data = self.store.data.get(request.tenant, request.record_id, request.data_cid)
        if data is None:
            entry = self.fetcher.entry_by_cid(request.tenant, request.message_cid)
            data = entry.data if entry is not None else None
        return data

    def _held(self, request: fx.HeldMessages) -> set[str]:
        tid = self.store.tenant_id(request.tenant, create=False)
        if tid is None:
            return set()
        held = self._present("messages", tid, request.cids)
        if len(held) < len(request.cids):
            # A listing names a message by its log CID; a zero-byte record is stored under the
            # reference's CID (its empty encodedData included), so look for the log entry: the
            # log has exactly one per stored message, and one per replaced protocol definition
            # (archived here: held too).
            held |= self._present("events", tid, [c for c in request.cids if c not in held])
        offered = held.intersection(request.with_data)
        if offered:
            held -= archived_without_data(self.store, request.tenant, offered)
        return held

    def _present(self, table: str, tid: int, cids: Sequence[str]) -> set[str]:
        """Those of ``cids`` that ``table`` (messages or events) has rows for: one query per
        :data:`_IN_CHUNK` CIDs rather than one per CID."""
        execute = self.store.conn.execute
        found: set[str] = set()
        for i in range(0, len(cids), _IN_CHUNK):
            chunk = cids[i : i + _IN_CHUNK]
            sql = f"SELECT cid FROM {table} WHERE tenant=? AND cid IN ({','.join('?' * len(chunk))})"
            found.update(str(c) for (c,) in execute(sql, (tid, *chunk)))
        return found

    def _quota_fit(self, request: fx.QuotaFit) -> tuple[int, QuotaExceeded | None]:
        if self.quotas is None:
            return len(request.sizes), None
        return self.quotas.fit(request.tenant, request.payer, request.sizes)

    def _verify_ahead(self, request: fx.VerifyAhead) -> None:
        if self.ahead is not None:
            self.ahead.submit(request.messages)

    def _apply(self, request: fx.Apply) -> tuple[ReplicationApplyResult, Any]:
        return self._apply_entry(request.tenant, request.entry, request.origin, request.payer)

    def _apply_batch(self, request: fx.ApplyBatch) -> tuple[list[tuple[ReplicationApplyResult, Any]],
                                                            Exception | None]:
        # Each entry's write counts in the group commit as its own Apply's would; a run of
        # initial writes in log order goes to the engine together (issue #17). Stops where the
        # sink has work to do before the next entry.
        done: list[tuple[ReplicationApplyResult, Any]] = []
        tenant, origin, payer = request.tenant, request.origin, request.payer
        entries = request.entries
        # A quota is charged message by message, before each is written: no runs under one.
        runs = self.quotas is None or not self.quotas.watching(tenant, payer)
        i, next_run = 0, 0
        while i < len(entries):
            if runs and i >= next_run and len(entries) - i >= MIN_RUN:
                try:
                    ran = self._apply_run(tenant, entries[i:], origin)
                except Exception as exc:
                    return done, exc
                if ran:
                    done.extend(ran)
                    i += len(ran)
                    continue
                # None could be taken together here: try again a few entries on, not at each.
                next_run = i + _RUN_RETRY_AFTER
            try:
                answer = self._apply_entry(tenant, entries[i], origin, payer)
            except Exception as exc:
                return done, exc
            done.append(answer)
            i += 1
            if answer[0].kind == "Incomplete":
                break
        return done, None

    def _apply_run(self, tenant: str, entries: Sequence[Any],
                   origin: str | None) -> list[tuple[ReplicationApplyResult, Any]]:
        """The leading run of ``entries`` the engine takes together (Dwn.apply_replicated_run),
        as one write of that many messages in the open group commit; [] when none."""
        run = [RunEntry(e.message, e.data, e.cid, e.encoded, e.data_cid) for e in entries[:MAX_RUN]]

        def apply_run() -> list[ReplicationApplyResult]:
            results = self.dwn.apply_replicated_run(tenant, run)
            if results and origin is not None:
                self.origins.record_many(tenant, [entry.cid for entry in run[: len(results)]], origin)
            return results

        size = sum(len(e.data) for e in run if e.data is not None)
        results, ticket = self.committer.run(apply_run, size=size, writes=len)
        return [(result, ticket) for result in results]

    def _apply_entry(self, tenant: str, entry: Any, origin: str | None,
                     payer: str | None) -> tuple[ReplicationApplyResult, Any]:
        quotas = self.quotas if self.quotas is not None and self.quotas.watching(tenant, payer) else None
        if quotas is not None:
            # Before the group commit opens: a refused message writes nothing, not even a batch.
            quotas.check(tenant, payer, quotas.cost(tenant, entry.message, entry.cid, entry.data))

        def apply_and_note_origin() -> ReplicationApplyResult:
            before = quotas.usage(tenant) if quotas is not None else None
            data, known = entry.data, entry.data_cid
            if known is not None and type(data) is bytes:
                # The sink hashed this very object checking it: the engine need not again.
                with datacid.known(data, known):
                    result = self.dwn.apply_replicated_message(tenant, entry.message, data, cid=entry.cid,
                                                               encoded=entry.encoded)
            else:
                result = self.dwn.apply_replicated_message(tenant, entry.message, data, cid=entry.cid,
                                                           encoded=entry.encoded)
            # A superseded arrival (an older update, a write after a delete) is archived too:
            # its origin says which device's write lost (`p2psync show`). It has no log entry,
            # so echo suppression, which reads origins of log entries, is unchanged.
            if result.kind in ("Applied", "Superseded") and origin is not None:
                self.origins.record(tenant, entry.cid, origin)
            if quotas is not None and before is not None:
                quotas.admitted(tenant, payer, before)  # charged in the apply's own transaction
            return result

        return self.committer.run(apply_and_note_origin, size=len(entry.data) if entry.data is not None else 0)

    def _record_steps(self, request: fx.RecordSteps) -> None:
        try:
            self.ledger.record(request.key, request.direction, list(request.steps))
        except CheckpointPendingOverflow as exc:
            raise PeerError(409, "CheckpointPendingOverflow", str(exc)) from exc

    def _reset(self, request: fx.ResetCheckpoint) -> str:
        _, rev = self.ledger.get_checkpoint(request.key, request.direction)
        return self.ledger.reset_checkpoint(request.key, request.direction, rev, reason=request.reason)

    def _transition(self, request: fx.Transition) -> Any:
        if request.only_from is not None and self.ledger.link(request.key).state not in request.only_from:
            return None
        return self.ledger.transition(request.key, request.state, reason=request.reason, direction=request.direction,
                                      error_code=request.error_code)

    def _log_domain(self, request: fx.LogDomain) -> tuple[str, str] | None:
        if self.store.tenant_id(request.tenant, create=False) is None:
            return None
        stream_id, epoch = self.store.events.stream(request.tenant)
        return stream_id, epoch

    def _flush(self, request: fx.FlushCommits) -> None:
        try:
            self.committer.flush()
        except StoreUnavailable as exc:
            raise exc.as_refusal() from exc


@contextmanager
def _set_reads() -> Iterator[None]:
    """A reconciliation's reads of the set need the write lock for a moment (to fold the
    journal) and a connection outside any transaction: another process holding the lock past
    the busy timeout, or an open transaction, is ``503 StoreBusy`` (a round then replays)."""
    try:
        yield
    except apsw.BusyError as exc:
        raise PeerError(503, "StoreBusy", "the store is locked by another writer; try again") from exc
    except LocalMisuse as exc:
        raise PeerError(503, "StoreBusy", str(exc)) from exc
