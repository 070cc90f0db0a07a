"""The maintained set digests of a store, and the feed of changes to its sets of message CIDs.

Anti-entropy (issue #14) compares the *stored set* of each (tenant, scope): the CIDs of the
``messages`` rows of a tenant, or of those rows whose ``protocol`` column is one protocol. Each
set has an LtHash16 digest (:mod:`p2psync.replication.lthash`) that is kept up to date as
messages are stored and removed, never recomputed from the messages:

- SQL triggers on ``messages`` (schema 3, :mod:`p2psync.dwn.store`) write one row to
  ``set_journal`` per change (+1 stored, -1 removed), inside the transaction that made the
  change. Whatever changes ``messages`` — a handler, the undo and redo changesets of a warp
  (SQLite fires triggers when it applies a changeset), another process — is journaled, and a
  rolled-back transaction or savepoint takes its rows with it.
- :meth:`SetIndex.catch_up` folds the rows past the floor (``meta.set_journal_floor``) into
  ``set_digests`` (the tenant's row, scope ``''``, and its protocol's row), advances the floor
  and hands the folded changes to its subscribers — the in-memory reconciliation sketches.
  Folding costs one element hash per changed CID (about 8 µs), whoever folds.

Several folders. Any connection may fold (a node, ``p2psync store digest`` beside it): folds
are write transactions, so SQLite orders them. Folded rows are kept for a while
(:data:`JOURNAL_RETAIN`) so that a :class:`SetIndex` whose rows another connection folded
still sees them as changes; only when the rows it missed are gone (or on its first fold) does it
tell its subscribers to rebuild (``reset=True``), and they read :meth:`SetIndex.cids` inside
that fold's transaction, where the messages are exactly the state the fold reached.

Open transactions. A node's :class:`~p2psync.state.committer.GroupCommitter` keeps a write
transaction open across many writes; journal rows inside it may still roll back, so
:meth:`SetIndex.catch_up` does nothing while the connection is in a transaction: a node folds
between commits with ``committer.after_commit(index.catch_up_if_due)``, which runs before
another batch can open, once :data:`FOLD_BATCH` rows wait (a fold per 50-message commit spent
more on the fold than on its rows). :meth:`SetIndex.digest` is right either way: it folds first,
and adds the rows it could not fold (another connection holds the write lock). The rows not
folded are committed with their messages, so a crash loses nothing: the next fold takes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import apsw

from p2psync.dwn.store import Store
from p2psync.errors import LocalMisuse
from p2psync.replication.lthash import ElementSum, LtHash

__all__ = [
    "FLOOR_KEY",
    "FOLD_BATCH",
    "JOURNAL_RETAIN",
    "PRUNED_KEY",
    "TENANT_SCOPE",
    "SetChange",
    "SetDigest",
    "SetIndex",
    "SetListener",
]

log = logging.getLogger(__name__)

#: ``meta`` key: the last journal seq folded into ``set_digests``.
FLOOR_KEY: Final = "set_journal_floor"
#: ``meta`` key: the last journal seq deleted (rows up to it are gone).
PRUNED_KEY: Final = "set_journal_pruned"
#: The ``set_digests`` scope of a whole tenant (a protocol's scope is its URL, never empty).
TENANT_SCOPE: Final = ""
#: Folded journal rows kept, so that a fold by another connection does not force this one's
#: subscribers to rebuild. About 120 bytes a row: 1.2 MB. A node folds once FOLD_BATCH rows
#: wait (plus at most one commit's, committer.MAX_BATCH_WRITES), so a CLI's fold beside it is far
#: within this.
JOURNAL_RETAIN: Final = 10_000
#: Journal rows a node lets wait before it folds them after a commit (:meth:`SetIndex.catch_up_if_due`).
#: A fold's fixed cost (its own write transaction, the digest rows read and written, the floor)
#: was ~7 µs a message when each 50-message commit was folded (measured); over 1,024 rows it is
#: noise, and a digest or a reconciliation that comes sooner folds first (≤ ~15 ms of rows).
FOLD_BATCH: Final = 1024


@dataclass(frozen=True, slots=True)
class SetChange:
    """A CID entering (``delta`` +1) or leaving (-1) a tenant's stored set, with the protocol
    of its message (None for a message of no protocol)."""

    tenant: str
    protocol: str | None
    cid: str
    delta: int


@dataclass(frozen=True, slots=True)
class SetDigest:
    """How many CIDs a set holds and its LtHash16 digest (32 bytes)."""

    count: int
    digest: bytes

    def hex(self) -> str:
        return self.digest.hex()


#: ``callback(changes, reset)``: the changes of one fold in journal order; ``reset`` says the
#: subscriber's state may have missed changes and must be rebuilt from :meth:`SetIndex.cids`.
SetListener = Callable[[list[SetChange], bool], None]

_EMPTY_DIGEST: Final = LtHash().digest()


class _Subscription:
    __slots__ = ("callback", "fresh")

    def __init__(self, callback: SetListener) -> None:
        self.callback = callback
        self.fresh = True  # its first fold is a reset: it has built nothing yet


class _Scope:
    """A ``set_digests`` row being folded into."""

    __slots__ = ("count", "hash")

    def __init__(self, count: int, state: bytes | None) -> None:
        self.count = count
        self.hash = LtHash() if state is None else LtHash.from_state(state)


class SetIndex:
    """The maintained digests of ``store``'s sets and their change feed (see the module doc).

    Lives on the thread that owns ``store``'s connection; one per connection that serves
    subscribers (any number may answer :meth:`digest`).
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._seen: int | None = None  # the floor after this index's last fold (None: no fold yet)
        self._subscriptions: list[_Subscription] = []
        self._dids: dict[int, str] = {}
        #: folds done and journal rows folded by this index (for tests and metrics)
        self.folds = 0
        self.folded = 0

    # -- the feed ----------------------------------------------------------------------------

    def subscribe(self, callback: SetListener) -> Callable[[], None]:
        """Call ``callback(changes, reset)`` after each fold (its first with ``reset=True``).

        Callbacks run inside the fold's transaction, so :meth:`cids` read there is exactly the
        state the fold reached. A callback that raises rolls the fold back, and every
        subscriber is reset at the next one. Returns a function that unsubscribes.
        """
        sub = _Subscription(callback)
        self._subscriptions.append(sub)

        def unsubscribe() -> None:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)

        return unsubscribe

    def catch_up(self, *, wait: bool = True) -> list[SetChange]:
        """Fold the journal into ``set_digests`` and tell the subscribers; returns the changes
        this index had not seen, in journal order (a CID's changes that cancel out are left
        out). Does nothing while the connection is in a transaction (see the module doc), nor,
        unless ``wait``, while another connection holds the write lock."""
        conn = self.store.conn
        if conn.in_transaction:
            return []
        if not self._has_work():
            return []
        if wait:
            conn.execute("BEGIN IMMEDIATE")
        elif not self.store.try_begin_immediate():
            return []
        try:
            changes, reset, floor = self._fold()
            for sub in list(self._subscriptions):
                if changes or reset or sub.fresh:
                    sub.callback(changes, reset or sub.fresh)
                    sub.fresh = False
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._seen = None  # subscribers may hold changes that did not commit: reset them all
            raise
        self._seen = floor
        self.folds += 1
        return changes

    def catch_up_if_due(self) -> list[SetChange]:
        """:meth:`catch_up` once :data:`FOLD_BATCH` journal rows wait, or when another connection
        folded or a subscriber has built nothing yet; else nothing (a node calls it after each
        commit, on its event loop: so it never waits for another process's write lock, and the
        fold is left for the next commit). Every answer stays exact: :meth:`digest` and the
        sketches fold before they read."""
        conn = self.store.conn
        if conn.in_transaction:
            return []
        if self._seen is not None and not any(sub.fresh for sub in self._subscriptions):
            with conn:  # one read snapshot
                floor = self._meta_int(FLOOR_KEY)
                last = conn.execute("SELECT max(seq) FROM set_journal").fetchone()
            waiting = 0 if last is None or last[0] is None else int(last[0]) - floor
            if floor == self._seen and waiting < FOLD_BATCH:
                return []
        return self.catch_up(wait=False)

    def _has_work(self) -> bool:
        if self._seen is None or any(sub.fresh for sub in self._subscriptions):
            return True
        conn = self.store.conn
        with conn:  # one read snapshot
            floor = self._meta_int(FLOOR_KEY)
            last = conn.execute("SELECT max(seq) FROM set_journal").fetchone()
        return floor != self._seen or (last is not None and last[0] is not None and int(last[0]) > floor)

    def _fold(self) -> tuple[list[SetChange], bool, int]:
        """Inside the write transaction: (changes since this index's last fold, reset, new floor)."""
        conn = self.store.conn
        floor = self._meta_int(FLOOR_KEY)
        pruned = self._meta_int(PRUNED_KEY)
        seen = self._seen
        reset = seen is None or seen > floor or seen < pruned
        # Rows another connection folded since our last fold are changes for our subscribers
        # (already in set_digests); the rows past the floor are folded now.
        start = floor if reset or seen is None else seen
        net: dict[tuple[int, str | None, str], int] = {}
        to_fold: dict[tuple[int, str | None, str], int] = {}
        last = floor
        for seq, tid, protocol, cid, delta in conn.execute(
            "SELECT seq, tenant, protocol, cid, delta FROM set_journal WHERE seq>? ORDER BY seq", (start,)
        ):
            key = (int(tid), protocol, str(cid))
            net[key] = net.get(key, 0) + int(delta)
            if seq > floor:
                to_fold[key] = to_fold.get(key, 0) + int(delta)
                last = int(seq)
        if last > floor:
            self._apply(to_fold)
            self.folded += last - floor
            self._set_meta(FLOOR_KEY, last)
        horizon = last - JOURNAL_RETAIN
        if horizon > pruned:
            conn.execute("DELETE FROM set_journal WHERE seq<=?", (horizon,))
            self._set_meta(PRUNED_KEY, horizon)
        changes = [SetChange(self._did(tid), protocol, cid, delta)
                   for (tid, protocol, cid), delta in net.items() if delta]
        return changes, reset, last

    def _apply(self, deltas: dict[tuple[int, str | None, str], int]) -> None:
        """Add each net change to its tenant's and its protocol's ``set_digests`` rows."""
        conn = self.store.conn
        scopes: dict[tuple[int, str], _Scope] = {}

        def scope(tid: int, name: str) -> _Scope:
            found = scopes.get((tid, name))
            if found is None:
                row = conn.execute(
                    "SELECT count, state FROM set_digests WHERE tenant=? AND scope=?", (tid, name)
                ).fetchone()
                found = scopes[(tid, name)] = _Scope(0, None) if row is None else _Scope(int(row[0]), bytes(row[1]))
            return found

        def settle(tid: int, protocol: str | None, summed: ElementSum) -> None:
            targets = [scope(tid, TENANT_SCOPE)]
            if protocol:
                targets.append(scope(tid, protocol))
            for target in targets:
                target.hash.add_sum(summed)
                target.count += summed.added - summed.removed

        # One sum per (tenant, protocol), added to the tenant's hash and to the protocol's: an
        # element is hashed and summed once, whatever number of scopes it is in.
        sums: dict[tuple[int, str | None], ElementSum] = {}
        for (tid, protocol, cid), delta in deltas.items():
            if not delta:
                continue
            key = (tid, protocol or None)
            summed = sums.get(key)
            if summed is None:
                summed = sums[key] = ElementSum()
            for _ in range(abs(delta)):
                if summed.full:
                    settle(tid, protocol, summed)
                    summed = sums[key] = ElementSum()
                if delta > 0:
                    summed.add(cid)
                else:
                    summed.remove(cid)
        for (tid, protocol), summed in sums.items():
            settle(tid, protocol, summed)
        for (tid, name), s in scopes.items():
            if s.count == 0 and s.hash.is_empty():
                conn.execute("DELETE FROM set_digests WHERE tenant=? AND scope=?", (tid, name))
            else:
                conn.execute(
                    "INSERT INTO set_digests(tenant, scope, count, state) VALUES(?,?,?,?)"
                    " ON CONFLICT(tenant, scope) DO UPDATE SET count=excluded.count, state=excluded.state",
                    (tid, name, s.count, s.hash.state()),
                )

    # -- answers -----------------------------------------------------------------------------

    def digest(self, tenant: str, protocol: str | None = None) -> SetDigest:
        """The digest of ``tenant``'s stored set (or of its messages of ``protocol``), from
        ``set_digests`` after a :meth:`catch_up` — never from the messages."""
        self._try_catch_up()
        return self._digest(tenant, protocol)

    def union_digest(self, tenant: str, protocols: Iterable[str]) -> SetDigest:
        """The digest of the union of ``tenant``'s sets of ``protocols`` (disjoint: a message
        has one protocol), from their states: what anti-entropy.md §1 reconciles for a scope
        of one protocol, which carries the permissions protocol too."""
        self._try_catch_up()
        count, union = 0, LtHash()
        with self.store.conn:  # one read snapshot for all of them
            for protocol in dict.fromkeys(protocols):
                folded = self._folded(tenant, protocol)
                count += folded.count
                union.add_hash(folded.hash)
        return _set_digest(count, union)

    def digests(self, protocol: str | None = None) -> dict[str, SetDigest]:
        """Every tenant's :meth:`digest` (of the whole tenant, or of ``protocol``) whose set is
        not empty, in DID order."""
        self._try_catch_up()
        out: dict[str, SetDigest] = {}
        for did in sorted(self.store.tenants()):
            d = self._digest(did, protocol)
            if d.count:
                out[did] = d
        return out

    def _try_catch_up(self) -> None:
        try:
            self.catch_up()
        except apsw.BusyError:
            # Another connection kept the write lock past the busy timeout: the rows it has
            # not let us fold are added to the answer instead.
            log.info("set journal not folded: the store is busy; answering from the journal")

    def protocols(self, tenant: str) -> list[str]:
        """The protocols of which ``tenant`` holds messages (as folded), sorted."""
        self._try_catch_up()
        tid = self.store.tenant_id(tenant, create=False)
        if tid is None:
            return []
        rows = self.store.conn.execute(
            "SELECT scope FROM set_digests WHERE tenant=? AND scope<>? AND count>0 ORDER BY scope",
            (tid, TENANT_SCOPE),
        )
        return [str(r[0]) for r in rows]

    def _digest(self, tenant: str, protocol: str | None) -> SetDigest:
        folded = self._folded(tenant, protocol)
        return _set_digest(folded.count, folded.hash)

    def _folded(self, tenant: str, protocol: str | None) -> _Scope:
        """The folded state of one set, plus the journal rows not folded yet."""
        scope = _scope_of(protocol)
        tid = self.store.tenant_id(tenant, create=False)
        if tid is None:
            return _Scope(0, None)
        conn = self.store.conn
        with conn:  # one read snapshot (a savepoint inside an open transaction)
            row = conn.execute(
                "SELECT count, state FROM set_digests WHERE tenant=? AND scope=?", (tid, scope)
            ).fetchone()
            folded = _Scope(0, None) if row is None else _Scope(int(row[0]), bytes(row[1]))
            # Rows not folded yet: this connection's open transaction's, or committed by
            # another connection since catch_up.
            sql = "SELECT cid, delta FROM set_journal WHERE seq>? AND tenant=?"
            args: tuple[object, ...] = (self._meta_int(FLOOR_KEY), tid)
            if protocol is not None:
                sql += " AND protocol=?"
                args += (protocol,)
            for cid, delta in conn.execute(sql, args):
                folded.count += int(delta)
                if int(delta) > 0:
                    folded.hash.add(str(cid))
                else:
                    folded.hash.remove(str(cid))
        return folded

    def cids(self, tenant: str, protocol: str | None = None) -> list[str]:
        """The CIDs of ``tenant``'s stored set (or of ``protocol``), read from the messages: a
        scan, for a subscriber that rebuilds."""
        _scope_of(protocol)
        tid = self.store.tenant_id(tenant, create=False)
        if tid is None:
            return []
        if protocol is None:
            rows: Iterable[tuple[object, ...]] = self.store.conn.execute(
                "SELECT cid FROM messages WHERE tenant=?", (tid,))
        else:
            rows = self.store.conn.execute(
                "SELECT cid FROM messages WHERE tenant=? AND protocol=?", (tid, protocol))
        return [str(r[0]) for r in rows]

    def pending(self) -> int:
        """Journal rows not folded yet (as this connection sees them)."""
        return int(self.store.scalar(
            "SELECT count(*) FROM set_journal WHERE seq>?", (self._meta_int(FLOOR_KEY),)))

    # -- helpers -----------------------------------------------------------------------------

    def _meta_int(self, key: str) -> int:
        row = self.store.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return 0 if row is None else int(row[0])

    def _set_meta(self, key: str, value: int) -> None:
        self.store.conn.execute(
            "INSERT INTO meta(key, value) VALUES(?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, str(value)),
        )

    def _did(self, tid: int) -> str:
        did = self._dids.get(tid)
        if did is None:
            row = self.store.conn.execute("SELECT did FROM tenants WHERE id=?", (tid,)).fetchone()
            did = self._dids[tid] = str(row[0]) if row is not None else f"#{tid}"
        return did


def _scope_of(protocol: str | None) -> str:
    if protocol is None:
        return TENANT_SCOPE
    if not protocol:
        raise LocalMisuse("a protocol scope is a protocol URL, never empty")
    return protocol


def _set_digest(count: int, state: LtHash) -> SetDigest:
    if count == 0 and state.is_empty():
        return SetDigest(0, _EMPTY_DIGEST)
    return SetDigest(count, state.digest())
