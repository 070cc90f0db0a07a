"""The active side of one connection for one collection, sans-I/O (replication-profiles.md
§2, §4.4, §6, §7, §11).

A :class:`SyncRound` runs, once hello has succeeded:

1. ``getCollections`` with the collection's checkpointId, which returns the passive's copy of
   the checkpoint pair; the ledger link of (tenant, remote, scope);
2. per direction, the start point: the local frontier when it equals the copy's; otherwise
   the lower safe point, the local document rewound to it (logged ``checkpoint_mismatch``);
3. pull (``subChanges`` into a sink) and push (our log through a source) side by side; a
   ``410 ProgressGap`` sends the link to ``repairing``, resets the pull document and replays
   the source from the start; a push whose own log changed stream or epoch resets its
   document;
4. the pair saved on the passive (``setCheckpoint``, MVCC ``rev``; a stale rev is re-read and
   retried) whenever the driver asks (:meth:`save`) and at the end; the link goes ``live``
   once caught up with every message it was offered settled (a `rev` answered ``Incomplete``
   or ``Deferred`` moves it to ``repairing`` at once, and only a later round that settles
   everything makes it ``live`` again).

Time is the driver's: it calls :meth:`save` on its own cadence, watches for a stall with the
progress callback, and :meth:`stop` ends a continuous round gracefully.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any, Final, Literal, Protocol

from p2psync.dwn.errors import DwnError
from p2psync.dwn.progress import ProgressToken
from p2psync.errors import CheckpointRevConflict
from p2psync.replication.checkpoint import Direction, DirectionCheckpoint, LinkState, checkpoint_id
from p2psync.replication.effects import (
    Collection,
    FlushCommits,
    LogDomain,
    OpenLink,
    Operation,
    ReadCheckpoint,
    RecordSteps,
    RecordSuccess,
    ResetCheckpoint,
    RewindCheckpoint,
    Slots,
    Transition,
)
from p2psync.replication.hello import Hello
from p2psync.replication.observer import SyncObserver
from p2psync.replication.scope import SyncScope
from p2psync.replication.sink import Sink
from p2psync.replication.source import Source
from p2psync.replication.stats import SyncStats
from p2psync.replication.wire import DEFAULT_BATCH, PeerError

__all__ = ["CAUGHT_UP_FROM", "RoundHost", "SyncRound"]

log = logging.getLogger("p2psync.peer")

Effects = Generator[Any, Any, Any]

#: Link states a round that caught up moves to ``live`` from.
CAUGHT_UP_FROM: Final = (LinkState.INITIAL, LinkState.REPAIRING, LinkState.DEGRADED_POLL)
#: Attempts at ``setCheckpoint`` when the copy's rev moved under us (another connection of ours).
SAVE_ATTEMPTS: Final = 2


class RoundHost(Protocol):
    """What a round needs of its connection's protocol object."""

    theirs: Hello | None
    collections: list[Collection | None]
    observer: SyncObserver

    def reconcile_repair(self, index: int, tenant: str, scope: SyncScope, *, push: bool,
                         stats: SyncStats | None = None) -> Effects: ...

    def start_operation(self, gen: Effects, name: str) -> Operation: ...

    def slots(self, count: int) -> Slots: ...

    def join(self, operations: list[Operation]) -> Effects: ...

    def declare(self, tenant: str, scope: SyncScope, checkpoint_id: str, grants: list[dict[str, Any]]) -> Effects: ...

    def set_checkpoint(self, index: int, pair: dict[str, Any], rev: str | None) -> Effects: ...

    def stop_feeds(self, error: PeerError) -> None: ...

    def pull(
        self, index: int, since: ProgressToken | None, *, key: Any, direction: Any, batch: int = DEFAULT_BATCH,
        continuous: bool = False, on_progress: Callable[[], None] | None = None,
    ) -> tuple[Operation, Sink]: ...

    def push(
        self, index: int, since: ProgressToken | None, *, key: Any, direction: Any, batch: int = DEFAULT_BATCH,
        continuous: bool = False, suppress_origin: str | None = None, replay_until: int = -1,
        on_progress: Callable[[], None] | None = None,
    ) -> tuple[Operation, Source]: ...


class SyncRound:
    """One active round (see the module doc). ``totals``: per-direction stats kept across
    rounds of one sync; ``on_progress(direction)``: called whenever a direction moves."""

    def __init__(
        self,
        proto: RoundHost,
        *,
        tenant: str,
        scope: SyncScope,
        local_store_id: str,
        pull: bool,
        push: bool,
        continuous: bool = False,
        batch: int = DEFAULT_BATCH,
        grants: list[dict[str, Any]] | None = None,
        totals: dict[str, SyncStats] | None = None,
        on_progress: Callable[[Literal["pull", "push"]], None] | None = None,
    ) -> None:
        self.proto = proto
        self.tenant = tenant
        self.scope = scope
        self.local_store_id = local_store_id
        self.pull = pull
        self.push = push
        self.continuous = continuous
        self.batch = batch
        self.grants = grants or []
        self.totals = totals if totals is not None else {}
        self.on_progress = on_progress
        self.remote: str | None = None
        self.key: Any = None
        self.index = 0
        self.copy_rev: str | None = None
        self.sink: Sink | None = None
        self.source: Source | None = None
        self.stopped = False
        #: the final save has begun (the driver's periodic save stands aside)
        self.finishing = False
        self._saved: dict[str, Any] | None = None
        #: one save at a time, each reading the ledger when its turn comes: a periodic save
        #: still in flight must not land after (and over) the final one
        self._saving = proto.slots(1)
        self._replay_until = -1
        #: why a pull that starts from nothing does (``never_linked``/``checkpoint_mismatch``)
        self._restart: str | None = None
        self._directions: list[Operation] = []

    # -- commands for the driver ------------------------------------------------------------

    def stop(self) -> None:
        """End the directions gracefully: refuse what our sinks are still sent and end a
        continuous source at its next pass; the round then saves and returns."""
        self.stopped = True
        self.proto.stop_feeds(PeerError(503, "Stopping", "this peer is stopping"))

    # -- the round ------------------------------------------------------------------------------

    def run(self) -> Effects:
        """The whole round; returns when every direction has caught up (one-shot) or the round
        was stopped, with the pair saved. Raises the first direction's failure."""
        yield from self._open()
        pull_since = yield from self._start(Direction.PULL, self._copy.get("pull", {}))
        push_since = yield from self._start(Direction.PUSH, self._copy.get("push", {}))
        if self.pull and pull_since is None and self._restart is not None:
            # A first sync with a peer, or a copy in another domain: reconcile instead of
            # replaying the whole log (protocol/anti-entropy.md §7).
            heads = yield from self._reconcile_instead(self._restart, push=self.push and push_since is None)
            if heads is not None:
                pull_since, ours = heads
                push_since = ours if ours is not None else push_since
        if self.pull:
            self._directions.append(self.proto.start_operation(self._pull(pull_since), "pull"))
        if self.push:
            self._directions.append(self.proto.start_operation(self._push(push_since), "push"))
        yield from self.proto.join(self._directions)
        self.finishing = True
        yield FlushCommits()
        yield from self.save()
        if not self.stopped and (yield from self._settled()):
            yield Transition(self.key, LinkState.LIVE, "caught_up", only_from=CAUGHT_UP_FROM)
        yield RecordSuccess(self.key)

    def _open(self) -> Effects:
        theirs = self.proto.theirs
        assert theirs is not None, "a round starts after hello"
        self.remote = f"{theirs.did}?storeId={theirs.store_id}"
        cp_id = checkpoint_id(self.local_store_id, theirs.store_id, self.scope.scope_id, self.tenant)
        self.index, self._copy = yield from self.proto.declare(self.tenant, self.scope, cp_id, self.grants)
        self.key = yield OpenLink(self.tenant, self.remote, self.scope)
        rev = self._copy.get("rev")
        self.copy_rev = rev if isinstance(rev, str) else None

    def _start(self, direction: Direction, copy_doc: Any) -> Effects:
        """§4.4: where a direction starts, rewinding the local document when the copy differs."""
        local, _ = yield ReadCheckpoint(self.key, direction)
        try:
            copy = DirectionCheckpoint.from_wire(copy_doc if isinstance(copy_doc, dict) else {})
        except Exception:  # a broken copy counts as none: restart from the start, safely
            copy = DirectionCheckpoint()
        mine, theirs = local.contiguous_applied_token, copy.contiguous_applied_token
        if direction == Direction.PULL:
            self._restart = "never_linked" if mine is None and theirs is None else "checkpoint_mismatch"
        if mine == theirs:
            if local.pending_tokens or local.unapplied_tokens:
                # The round replays from the frontier anyway; a token left unapplied whose entry
                # has since left the source's log would never be listed again, and would hold
                # the frontier back for good (p2psync sim finds it within a few hundred steps).
                yield RewindCheckpoint(self.key, direction, mine, "unsettled_at_resume")
            return mine
        if direction == Direction.PUSH and local.received_token is not None:
            # Replaying below what we had pushed: the sink may have lost those; no suppression.
            self._replay_until = local.received_token.position
        safe = min(mine, theirs) if mine is not None and theirs is not None and mine.same_domain(theirs) else None
        if safe != mine or local.pending_tokens or local.unapplied_tokens:
            yield RewindCheckpoint(self.key, direction, safe, "checkpoint_mismatch")
        return safe

    # -- pull -----------------------------------------------------------------------------------

    def _pull(self, since: ProgressToken | None) -> Effects:
        stats = self.totals.setdefault("pull", SyncStats())
        while True:
            operation, sink = self.proto.pull(
                self.index, since, key=self.key, direction=Direction.PULL, batch=self.batch,
                continuous=self.continuous, on_progress=lambda: self._progress("pull"),
            )
            self.sink = sink
            sink.stats = stats
            try:
                yield from self.proto.join([operation])
            except PeerError as exc:
                if self.stopped:
                    return  # our own sink refused what still came: the round saves and ends
                if exc.code != 410:
                    raise
                # §11 gap: repairing, reset the pull document, then reconcile and resume after the
                # source's head (anti-entropy.md §7); a replay from the start when that fails.
                log.info("pull from %s: %s; repairing", self.remote, exc.detail)
                yield Transition(self.key, LinkState.REPAIRING, "progress_gap", direction=Direction.PULL,
                                 error_code="ProgressGap")
                yield ResetCheckpoint(self.key, Direction.PULL, "progress_gap")
                heads = yield from self._reconcile_instead("progress_gap", push=False)
                since = heads[0] if heads is not None else None
                continue
            yield FlushCommits()
            if self.continuous and not self.stopped:
                if (yield from self._settled()):
                    yield Transition(self.key, LinkState.LIVE, "caught_up", only_from=CAUGHT_UP_FROM)
                yield RecordSuccess(self.key)  # healthy again: the next backoff starts short
                # Live until stopped, or until the feed fails: the connection ended, a ledger
                # step overflowed, or a quota of our store stopped taking it (issue #15).
                # Each of those fails the sink.
                while not self.stopped and sink.failed is None:
                    yield sink.changed
                if not self.stopped and sink.failed is not None:
                    raise sink.failed
            return

    def _reconcile_instead(self, reason: str, *, push: bool) -> Effects:
        """Reconcile with the source, fetch what we lack (and with ``push`` hand over what it
        lacks), and set the pull document (and the push one) to resume after the heads read
        with the reconciled sets. ``(pull since, push since)``, or None: replay instead."""
        found = yield from self.proto.reconcile_repair(self.index, self.tenant, self.scope, push=push,
                                                       stats=self.totals.setdefault("pull", SyncStats()))
        if found is None:
            return None
        theirs, ours, fetched, taken = found
        try:
            heads = [None if h is None else ProgressToken.from_wire(h) for h in (theirs, ours)]
        except DwnError as exc:
            log.info("%s with %s: the head token is malformed (%s); replaying", reason, self.remote, exc)
            return None
        pull_since = yield from self._resume_after(Direction.PULL, heads[0])
        push_since = (yield from self._resume_after(Direction.PUSH, heads[1])) if push else None
        yield FlushCommits()
        self.totals.setdefault("pull", SyncStats()).count_reconciled(fetched)
        if push:
            self.totals.setdefault("push", SyncStats()).count_reconciled(taken)
        n_fetched, n_taken = sum(fetched.values()), sum(taken.values())
        log.info("%s with %s: reconciled (%d fetched, %d taken) instead of replaying",
                 reason, self.remote, n_fetched, n_taken)
        self.proto.observer.gap_repaired(reason, n_fetched, n_taken)
        return pull_since, push_since

    def _resume_after(self, direction: Direction, token: ProgressToken | None) -> Effects:
        """Make ``token`` (None: an empty log) the direction's frontier."""
        if token is not None:
            yield RecordSteps(self.key, direction, (("received", token), ("applied", token)))
        return token

    def _settled(self) -> Effects:
        """Whether the link may be ``live``: no `rev` of this round was answered with a result
        that leaves it unapplied (the sink or source then moved the link to ``repairing``), and
        neither checkpoint holds a token received and not applied. A link that reported
        ``live`` with a message it could not apply would hide it for good: nothing re-offers
        it before the next round (issue #13)."""
        if (self.sink is not None and self.sink.unsettled) or (self.source is not None and self.source.unsettled):
            return False
        for direction in (Direction.PULL, Direction.PUSH):
            checkpoint, _ = yield ReadCheckpoint(self.key, direction)
            if checkpoint.unapplied_tokens:
                return False
        return True

    # -- push -----------------------------------------------------------------------------------

    def _push(self, since: ProgressToken | None) -> Effects:
        since = yield from self._push_domain(since)
        theirs = self.proto.theirs
        assert theirs is not None
        operation, source = self.proto.push(
            self.index, since, key=self.key, direction=Direction.PUSH, batch=self.batch, continuous=self.continuous,
            suppress_origin=theirs.store_id, replay_until=self._replay_until,
            on_progress=lambda: self._progress("push"),
        )
        self.source = source
        source.stats = self.totals.setdefault("push", SyncStats())
        yield from self.proto.join([operation])

    def _push_domain(self, since: ProgressToken | None) -> Effects:
        """§11: a pusher whose own log changed stream or epoch resets its push document."""
        if since is None:
            return since
        domain = yield LogDomain(self.tenant)
        if domain is None or since.domain == domain:
            return since
        self._replay_until = 1 << 62  # a new log: replay everything, suppress nothing
        yield Transition(self.key, LinkState.REPAIRING, "epoch_changed", direction=Direction.PUSH)
        yield ResetCheckpoint(self.key, Direction.PUSH, "epoch_changed")
        return None

    # -- checkpoints (§4.3, §4.4) ---------------------------------------------------------------

    def save(self) -> Effects:
        """Send the pair as the ledger holds it (only committed documents, §4.4 order)."""
        if self.key is None:
            return
        yield from self._saving.acquire()
        try:
            yield from self._save()
        finally:
            self._saving.release()

    def _save(self) -> Effects:
        yield FlushCommits()
        pull, _ = yield ReadCheckpoint(self.key, Direction.PULL)
        push, _ = yield ReadCheckpoint(self.key, Direction.PUSH)
        pair = {"pull": pull.to_wire(), "push": push.to_wire()}
        if pair == self._saved:
            return
        for _ in range(SAVE_ATTEMPTS):
            try:
                rev = yield from self.proto.set_checkpoint(self.index, pair, self.copy_rev)
            except CheckpointRevConflict as exc:
                # Another connection of ours wrote it (a stale rev): take the current rev, retry.
                self.copy_rev = exc.current
                continue
            self.copy_rev = rev
            self._saved = pair
            return
        raise CheckpointRevConflict(self.copy_rev, "the copy changed twice while saving")

    def _progress(self, direction: Literal["pull", "push"]) -> None:
        if self.on_progress is not None:
            self.on_progress(direction)
