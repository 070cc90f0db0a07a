"""Anti-entropy with one peer: find what the two replicas' sets differ by, and repair it
(protocol/anti-entropy.md §4–§5; docs/operator.md, *Anti-entropy*).

:func:`reconcile_with` opens one connection (hello, ``getCollections`` with a one-off
checkpointId, like a repair by CID), runs the ``reconcile`` exchange over the local set's
maintained sketch, resolves the ids it decoded to CIDs (ours from the local map, the peer's
with a resolve request), and with ``repair``:

- fetches what the peer holds and we lack by CID (``getDependencies`` and the closure loop,
  :class:`~p2psync.peer.repair._Repair`), when we may pull;
- asks the peer to take what we hold and it lacks (``f``: it fetches each from us the same way),
  when we may push and it takes pushes;
- checks again (one round trip when equal). A check that still differs after a repair moved
  nothing new, or a decode that does not add up, is a short-id collision (or a dishonest
  peer): the next attempt uses a fresh random salt (§5), at most :data:`MAX_ATTEMPTS` in all.

Nothing changes without ``repair``: ``p2psync diff`` prints the summary. A one-way repair
(``pull`` or ``push`` only) ends without ``unresolved`` when what still differs is only what
its direction does not move.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from p2psync.blip.wire import encode_message_head, frame_header
from p2psync.errors import QuotaExceeded
from p2psync.peer.repair import (
    Connector,
    RepairingPeer,
    RepairProgress,
    RepairSummary,
    WantedMessage,
    _Repair,
    one_off_collection,
)
from p2psync.peer.session import PeerSession
from p2psync.replication.recon import (
    MAX_RESOLVE,
    MAX_TAKE,
    Reconciliation,
    ReconResult,
    resolve_request,
    resolved_of,
)
from p2psync.replication.riblt import SALT_BYTES, Coder
from p2psync.replication.scope import SyncScope
from p2psync.replication.wire import MAX_REFS, PeerError
from p2psync.state.sketches import SetSketches

__all__ = ["MAX_ATTEMPTS", "ReconcileSummary", "message_bytes", "reconcile_with"]

#: Reconciliations per call: the first, the check after a repair, and salted retries. A
#: collision survives a fresh salt with probability ~n²/2^65 (8-byte ids): two are plenty.
MAX_ATTEMPTS: Final = 4
#: BLIP_3's per-frame CRC.
_CRC_BYTES: Final = 4


def message_bytes(properties: dict[str, str], body: bytes) -> int:
    """Bytes of a single-frame, uncompressed BLIP message carrying ``properties`` and ``body``:
    what ``p2psync diff`` and tests/bench/bench_recon.py count (WebSocket framing, 2–4 bytes a
    message, aside)."""
    return len(frame_header(1, 0)) + len(encode_message_head(properties)) + len(body) + _CRC_BYTES


@dataclass
class ReconcileSummary:
    """What one :func:`reconcile_with` found and did."""

    tenant: str
    remote: str
    scope: SyncScope
    #: the sets were (or, after the repair, became) equal
    equal: bool = False
    #: before any repair: what each side held that the other lacked ({cid, kind, recordId?, protocol?})
    remote_only: list[dict[str, Any]] = field(default_factory=list)
    local_only: list[dict[str, Any]] = field(default_factory=list)
    local_count: int = 0
    remote_count: int = 0
    round_trips: int = 0
    bytes: int = 0
    attempts: int = 0
    estimate: float | None = None
    fetched: RepairSummary | None = None
    pushed: dict[str, int] = field(default_factory=dict)
    #: a repair's exchange of the definitions a newer one replaced (the sets leave them out):
    #: counts by result kind of those fetched and those the peer took, less what was held
    definitions: dict[str, dict[str, int]] = field(default_factory=dict)
    #: why the sets still differ after a repair (None when equal or not repairing)
    unresolved: str | None = None
    seconds: float = 0.0

    @property
    def differences(self) -> int:
        return len(self.remote_only) + len(self.local_only)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tenant": self.tenant, "remote": self.remote, "scope": self.scope.to_wire(),
            "equal": self.equal, "localCount": self.local_count, "remoteCount": self.remote_count,
            "youLack": len(self.remote_only), "theyLack": len(self.local_only),
            "roundTrips": self.round_trips, "bytes": self.bytes, "attempts": self.attempts,
            "seconds": round(self.seconds, 3),
            "remoteOnly": self.remote_only, "localOnly": self.local_only,
        }
        if self.estimate is not None:
            out["estimate"] = round(self.estimate, 1)
        if self.fetched is not None:
            out["fetched"] = {"counts": self.fetched.counts(), "stored": self.fetched.stored,
                              "bytesReceived": self.fetched.stats.bytes_received}
        if self.pushed:
            out["pushed"] = self.pushed
        if any(self.definitions.values()):
            out["definitions"] = {k: v for k, v in self.definitions.items() if v}
        if self.unresolved is not None:
            out["unresolved"] = self.unresolved
        return out


async def reconcile_with(
    peer: RepairingPeer,
    sketches: SetSketches,
    connect: Connector,
    *,
    tenant: str,
    scope: SyncScope | None = None,
    repair: bool = False,
    pull: bool = True,
    push: bool = True,
    on_progress: Callable[[RepairProgress], None] | None = None,
    definitions: bool = True,
) -> ReconcileSummary:
    """Reconcile ``tenant``'s set in ``scope`` with the peer ``connect`` reaches (module doc).
    A repair then exchanges the definitions newer ones replaced, which the sets leave out
    (``definitions`` False: only when the sets differed).

    Raises :class:`PeerError` for refusals (``403 ReconcileNotAuthorized``, ``400
    ReconcileScopeUnsupported``, …) and ``HelloFailed``/``OSError``/``blip.ConnectionClosed``
    as a sync does.
    """
    scope = scope or SyncScope.global_scope()
    started = time.monotonic()
    async with one_off_collection(peer, connect, tenant, scope) as (session, index, remote):
        summary = ReconcileSummary(tenant, remote, scope)
        anti_entropy = _AntiEntropy(peer, sketches, session, index, summary, on_progress)
        await anti_entropy.run(repair, pull, push)
        if repair and (definitions or summary.differences):
            await anti_entropy.definitions(pull, push)
    summary.seconds = time.monotonic() - started
    return summary


class _AntiEntropy:
    def __init__(self, peer: RepairingPeer, sketches: SetSketches, session: PeerSession, index: int,
                 summary: ReconcileSummary, on_progress: Callable[[RepairProgress], None] | None) -> None:
        self.peer = peer
        self.sketches = sketches
        self.session = session
        self.index = index
        self.summary = summary
        self.on_progress = on_progress
        self.tenant, self.scope = summary.tenant, summary.scope
        self._local_count = 0

    async def run(self, repair: bool, pull: bool, push: bool) -> None:
        s = self.summary
        coder = Coder()
        tried: set[str] = set()  # CIDs a repair already went for
        counted = False
        for attempt in range(1, MAX_ATTEMPTS + 1):
            s.attempts = attempt
            try:
                result = await self._exchange(coder)
            except PeerError as exc:
                if exc.name not in ("ReconcileFailed", "ReconcileSetChanged") or attempt == MAX_ATTEMPTS:
                    raise
                if exc.name == "ReconcileFailed":  # a collision, maybe: another salt
                    coder = Coder(salt=secrets.token_bytes(SALT_BYTES))
                continue
            if not counted:  # the first exchange that got through (an attempt may have failed)
                counted = True
                s.local_count, s.remote_count = self._local_count, result.remote_count
                s.estimate = result.estimate
            if result.equal:
                s.equal = True
                return
            theirs = await self._resolve(coder, result.remote_only)
            mine = self.sketches.describe(self.tenant, self.sketches.cids_of(self.tenant, self.scope, coder,
                                                                                 result.local_only))
            if attempt == 1 or not (s.remote_only or s.local_only):
                s.remote_only, s.local_only = theirs, mine
            if not repair:
                return
            new = {d["cid"] for d in theirs if pull} | {d["cid"] for d in mine if push}
            if not new:
                return  # what differs is only what this direction does not move: done
            if not new - tried:
                # Nothing left that a repair has not gone for: a collision hid the rest, or what
                # remains cannot be applied here (superseded, refused) or not in this direction.
                if attempt == MAX_ATTEMPTS or coder.salt != Coder().salt:
                    s.unresolved = (f"{len(theirs)} message(s) here lack and {len(mine)} there lack remain "
                                    "after a repair (see fetched/pushed for why)")
                    return
                coder = Coder(salt=secrets.token_bytes(SALT_BYTES))
                continue
            tried |= new
            if pull and theirs:
                await self._fetch([d["cid"] for d in theirs])
            if push and mine:
                await self._push([d["cid"] for d in mine])
        s.unresolved = s.unresolved or "the sets still differ after every attempt"

    async def definitions(self, pull: bool, push: bool) -> None:
        """The replaced definitions the sets leave out, both ways (ReplicationProtocol's
        ``exchange_definitions``): a peer that takes no pushes is reported, as for messages."""
        proto = self.session.proto
        fetched, taken = await self.session.run(
            proto.exchange_definitions(self.index, self.tenant, self.scope, pull=pull, push=push))
        self.summary.definitions = {"fetched": fetched, "taken": taken if taken is not None else {"PushRefused": 1}}

    async def _exchange(self, coder: Coder) -> ReconResult:
        view = self.sketches.view(self.tenant, self.scope, coder)
        self._local_count = view.count  # the set this exchange compared
        recon = Reconciliation(view, collection=self.index or None)
        request: dict[str, Any] | None = recon.opening()
        while request is not None:
            reply, raw, response = await self.session.run(self.session.proto.reconcile(request))
            self.summary.bytes += message_bytes({"Profile": "reconcile"}, raw)
            self.summary.bytes += message_bytes(response.properties, response.body)
            request = recon.receive(reply)
        assert recon.result is not None
        self.summary.round_trips += recon.result.round_trips
        return recon.result

    async def _resolve(self, coder: Coder, ids: Sequence[int]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for start in range(0, len(ids), MAX_RESOLVE):
            request = resolve_request(coder, ids[start : start + MAX_RESOLVE], self.index or None)
            reply, _, _ = await self.session.run(self.session.proto.reconcile(request))
            out.extend(resolved_of(reply))
        return sorted(out, key=lambda d: str(d["cid"]))

    async def _fetch(self, cids: list[str]) -> None:
        s = self.summary
        if s.fetched is None:
            s.fetched = RepairSummary(self.tenant, s.remote)
            self.session.proto.repair_sink(self.index).stats = s.fetched.stats
        wanted = [WantedMessage(c) for c in cids]
        await _Repair(self.peer.store, self.session, self.index, self.tenant, s.fetched, len(wanted),
                      self.on_progress).run(wanted, MAX_REFS)

    async def _push(self, cids: list[str]) -> None:
        for start in range(0, len(cids), MAX_TAKE):
            body: dict[str, Any] = {"f": cids[start : start + MAX_TAKE]}
            if self.index:
                body["c"] = self.index
            try:
                reply, _, _ = await self.session.run(self.session.proto.reconcile(body))
            except PeerError as exc:
                # The peer takes no pushes (403), or no more of the tenant (its quota, issue
                # #15): what is left is reported unmoved, as the peer said why.
                if exc.code != 403 and not isinstance(exc, QuotaExceeded):
                    raise
                self.summary.pushed[exc.name] = self.summary.pushed.get(exc.name, 0) + len(cids) - start
                return
            counts = reply.get("k")
            if isinstance(counts, dict):
                for kind, n in counts.items():
                    if isinstance(kind, str) and isinstance(n, int):
                        self.summary.pushed[kind] = self.summary.pushed.get(kind, 0) + n
