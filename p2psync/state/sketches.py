"""The reconciliation sketches of one store, kept up to date (protocol/anti-entropy.md §6).

:class:`SetSketches` answers ``reconcile`` requests (:meth:`answer`) and gives the initiator
its own side (:meth:`view`, :meth:`cids_of`). For the default coder and the scopes a replica
reconciles all the time (a whole tenant, one protocol), it keeps each set's first
:data:`SKETCH_SIZE` coded symbols and its id → CID map in memory, built on first use from the
store (O(n), ~20 µs a message) and then updated from :class:`~p2psync.state.setindex.SetIndex`'s
change feed (~20 µs a change), so a session costs the responder nothing proportional to the
set. Salted retries (after a short-id collision) are computed from a scan and the last one is
cached. The digests are the SetIndex's maintained LtHashes.

A maintained set is read only when two replicas' digests differ, while a node that pulls or is
written to changes it with every commit; so changes are queued and walked into the sketch when
it is read (or when :data:`PENDING_LIMIT` of them wait), and a set whose unread changes
outnumber its members is dropped, to be built again from a scan if it is ever asked for: a
rebuild costs what that many changes cost, so this never spends more than twice the cheaper of
the two (the ski-rental argument), and a replica that nobody reconciles with spends nothing.

A protocol's set is what a source lists for its scope (anti-entropy.md §1): the messages of the
protocol and of the permissions protocol, so a change of a permission record reaches every
maintained protocol set of its tenant, and a digest is the sum of two protocols' states.
Subset scopes (path or context prefixes) are not reconciled yet: ``400 ReconcileScopeUnsupported``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Final

from p2psync.dwn.permissions import PERMISSIONS_PROTOCOL_URI
from p2psync.dwn.store import Store
from p2psync.errors import LocalMisuse
from p2psync.replication.lthash import lthash_digest
from p2psync.replication.recon import MemorySet, SetView, answer, parse_resolve
from p2psync.replication.riblt import Coder, Key, Sketch, Symbols
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import refuse
from p2psync.state.setindex import SetChange, SetDigest, SetIndex

__all__ = ["PENDING_LIMIT", "SKETCH_SIZE", "SetSketches"]

#: Symbols kept per maintained set: decodes ~16,000 differences (2^15 / ~1.4 / margin) without
#: a scan; ~21 µs a change to keep (measured on a loaded host: ~25 before the float walk), ~3 MB a set.
SKETCH_SIZE: Final = 1 << 15
#: Salted (collision retry) views kept: a session asks one salt several times in a row.
SALTED_CACHE: Final = 2
#: Changes queued for a maintained set before they are walked into its sketch anyway: ~20 ms
#: of walking on the store's thread at ~21 µs a change, and ~200 KB of queued CIDs.
PENDING_LIMIT: Final = 1024

_Set = tuple[str, str | None]  # (tenant, protocol or None for the whole tenant)


class _Maintained:
    """A maintained set: its sketch and id → CIDs map, and the changes not walked into them yet."""

    __slots__ = ("by_id", "pending", "sketch", "unread")

    def __init__(self, coder: Coder, cids: Iterable[str]) -> None:
        self.sketch = Sketch(coder, SKETCH_SIZE)
        self.by_id: dict[int, str | list[str]] = {}
        for cid in cids:
            self.change(cid, 1)
        #: (cid, delta) in feed order, not in ``sketch`` and ``by_id`` yet
        self.pending: list[tuple[str, int]] = []
        #: changes walked in since the set was last read (what keeping it has cost unread)
        self.unread = 0

    def settle(self) -> None:
        """Walk the queued changes into the sketch and the id map."""
        pending, self.pending = self.pending, []
        for cid, delta in pending:
            self.change(cid, delta)

    def change(self, cid: str, delta: int) -> None:
        key = self.sketch.coder.key(cid)
        self.sketch.add(key, delta)
        held = self.by_id.get(key.id)
        if delta > 0:
            if held is None:
                self.by_id[key.id] = cid
            else:  # two CIDs under one short id: keep both (a collision, retried with a salt)
                self.by_id[key.id] = [*(held if isinstance(held, list) else [held]), cid]
        elif isinstance(held, list):
            rest = [c for c in held if c != cid]
            self.by_id[key.id] = rest[0] if len(rest) == 1 else rest
        elif held == cid:
            del self.by_id[key.id]

    def keys(self) -> list[Key]:
        coder = self.sketch.coder
        return [coder.key(c) for held in self.by_id.values() for c in (held if isinstance(held, list) else [held])]


class _MaintainedView:
    """:class:`SetView` over a maintained set and the index's digest."""

    def __init__(self, kept: _Maintained, count: int, digest: bytes, *, snapshot: bool = False) -> None:
        self._sketch = kept.sketch.copy() if snapshot else kept.sketch
        self._kept = kept
        self._count = count
        self._digest = digest

    @property
    def coder(self) -> Coder:
        return self._sketch.coder

    @property
    def count(self) -> int:
        return self._count

    @property
    def digest(self) -> bytes:
        return self._digest

    def lanes(self) -> list[int]:
        return self._sketch.estimator.lanes()

    def symbols(self, lo: int, hi: int) -> Symbols:
        sketch = self._sketch
        return sketch.range(lo, hi) if hi <= sketch.size else sketch.range(lo, hi, self._kept.keys())


class SetSketches:
    """Sketches and resolution for one store (see the module doc)."""

    def __init__(self, store: Store, index: SetIndex | None = None, *,
                 flush: Callable[[], None] | None = None) -> None:
        self.store = store
        self.index = index if index is not None else SetIndex(store)
        # Commits a writer's open batch (a node's group commit): the sketches and the digests
        # must read one committed state, and journal rows inside an open transaction are not
        # folded (they may still roll back).
        self._flush = flush
        self._kept: dict[_Set, _Maintained] = {}
        self._salted: OrderedDict[tuple[_Set, Coder], MemorySet] = OrderedDict()
        self.index.subscribe(self._on_changes)
        #: sets built from a scan (first use, a reset, a salt): for tests and metrics
        self.builds = 0

    def _on_changes(self, changes: list[SetChange], reset: bool) -> None:
        self._salted.clear()
        if reset:
            self._kept.clear()
            return
        if not self._kept:
            return
        touched: dict[_Set, _Maintained] = {}
        for change in changes:
            sets: tuple[_Set, ...] = ((change.tenant, None),)
            if change.protocol == PERMISSIONS_PROTOCOL_URI:  # in every protocol's set (§1)
                sets += tuple(key for key in self._kept if key[0] == change.tenant and key[1] is not None)
            elif change.protocol is not None:
                sets += ((change.tenant, change.protocol),)
            for key in sets:
                kept = self._kept.get(key)
                if kept is not None:
                    kept.pending.append((change.cid, change.delta))
                    touched[key] = kept
        for key, kept in touched.items():
            if len(kept.pending) < PENDING_LIMIT:
                continue
            if kept.unread + len(kept.pending) > max(kept.sketch.count, PENDING_LIMIT):
                del self._kept[key]  # rebuilding it when asked costs less than keeping it
            else:
                kept.unread += len(kept.pending)
                kept.settle()

    @staticmethod
    def _set_of(tenant: str, scope: SyncScope) -> _Set:
        if scope.kind == "global":
            return tenant, None
        if scope.kind == "protocol":
            return tenant, scope.protocol
        refuse(400, "ReconcileScopeUnsupported", "reconciliation covers a whole tenant or one protocol")

    def _cids(self, key: _Set) -> list[str]:
        """The members of a set, read from the messages (a scan)."""
        return [cid for protocol in _protocols(key) for cid in self.index.cids(key[0], protocol)]

    def _digest(self, key: _Set) -> SetDigest:
        tenant, protocol = key
        if protocol is None:
            return self.index.digest(tenant)
        return self.index.union_digest(tenant, (protocol, PERMISSIONS_PROTOCOL_URI))

    def _catch_up(self) -> None:
        if self._flush is not None:
            self._flush()
        if self.store.conn.in_transaction:
            raise LocalMisuse("reconciliation reads committed sets: commit the open transaction first")
        self.index.catch_up()

    def _maintained(self, key: _Set) -> _Maintained:
        kept = self._kept.get(key)
        if kept is None:
            self.builds += 1
            kept = self._kept[key] = _Maintained(Coder(), self._cids(key))
        else:
            kept.settle()
            kept.unread = 0
        return kept

    def view(self, tenant: str, scope: SyncScope, coder: Coder | None = None) -> SetView:
        """This store's set of ``tenant``'s messages in ``scope`` under ``coder`` (default: 8-byte
        unsalted ids, the maintained sketch)."""
        key = self._set_of(tenant, scope)
        self._catch_up()
        digest = self._digest(key)
        if coder is None or coder.is_default:
            # A snapshot: the set may change while a session asks for more symbols.
            return _MaintainedView(self._maintained(key), digest.count, digest.digest, snapshot=True)
        salted = self._salted.get((key, coder))
        if salted is None:
            self.builds += 1
            cids = self._cids(key)
            salted = MemorySet(coder, cids, min(SKETCH_SIZE, 2 * len(cids) + 64), lthash_digest(cids))
            self._salted[(key, coder)] = salted
            while len(self._salted) > SALTED_CACHE:
                self._salted.popitem(last=False)
        return salted

    def cids_of(self, tenant: str, scope: SyncScope, coder: Coder, ids: Iterable[int]) -> list[str]:
        """The CIDs this store holds under short ids ``ids`` (a collision gives several)."""
        key = self._set_of(tenant, scope)
        self._catch_up()
        wanted = set(ids)
        if coder.is_default:
            by_id = self._maintained(key).by_id
            out: list[str] = []
            for i in wanted:
                held = by_id.get(i)
                if held is not None:
                    out.extend(held if isinstance(held, list) else [held])
            return sorted(out)
        return sorted(c for c in self._cids(key) if coder.key(c).id in wanted)

    def describe(self, tenant: str, cids: Iterable[str]) -> list[dict[str, Any]]:
        """``{cid, kind, recordId?, protocol?, messageTimestamp?}`` of each held message (what
        ``p2psync diff`` prints about a difference; a write's messageTimestamp is its
        dateModified)."""
        tid = self.store.tenant_id(tenant, create=False)
        out: list[dict[str, Any]] = []
        if tid is None:
            return out
        for cid in cids:
            row = self.store.conn.execute(
                "SELECT interface, method, record_id, protocol, json_extract(body, '$.descriptor.messageTimestamp')"
                " FROM messages WHERE tenant=? AND cid=?", (tid, cid)
            ).fetchone()
            if row is None:
                continue
            item: dict[str, Any] = {"cid": cid, "kind": f"{row[0]}{row[1]}"}
            if row[2]:
                item["recordId"] = row[2]
            if row[3]:
                item["protocol"] = row[3]
            if isinstance(row[4], str):
                item["messageTimestamp"] = row[4]
            out.append(item)
        return out

    def answer(self, tenant: str, scope: SyncScope, body: dict[str, Any]) -> dict[str, Any]:
        """The reply to one ``reconcile`` request body (resolve ``r`` included)."""
        if "r" in body:
            coder, ids = parse_resolve(body)
            return {"k": self.describe(tenant, self.cids_of(tenant, scope, coder, ids))}
        return answer(body, lambda coder: self.view(tenant, scope, coder))


def _protocols(key: _Set) -> tuple[str | None, ...]:
    """The stored sets (by protocol column) a set is the union of: a scope of one protocol
    carries the permissions protocol's messages too (anti-entropy.md §1, the listing's rule 2)."""
    protocol = key[1]
    if protocol is None or protocol == PERMISSIONS_PROTOCOL_URI:
        return (protocol,)
    return protocol, PERMISSIONS_PROTOCOL_URI
