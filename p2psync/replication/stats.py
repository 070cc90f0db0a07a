"""What a sync moved: per-direction counters, progress reports and the final summary."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

__all__ = ["MAX_NOT_APPLIED", "MAX_NOT_APPLIED_TRACKED", "MAX_REASON", "NOT_APPLIED_KINDS", "NotApplied",
           "NotAppliedLog", "SyncProgress", "SyncStats", "SyncSummary"]

#: How many messages that did not apply a summary or a status names one by one (the latest
#: ones: a user fixing a cause looks at the newest); past that they are only counted. Ours: a
#: screenful, and a status file that stays small whatever a peer sends.
MAX_NOT_APPLIED: Final = 20
#: The results of a message that will not apply by itself: ``Invalid`` (refused for good: a
#: forged signature, a rule of the DWN) and ``Incomplete`` (something it depends on never
#: arrived). Both hold a link out of ``live`` (Incomplete) or settle it silently (Invalid);
#: either way the user is shown which messages, and why.
NOT_APPLIED_KINDS: Final = frozenset({"Invalid", "Incomplete"})
#: Messages that left the named list and are still remembered by CID, so that they leave the
#: count when they apply (~100 bytes each in the store and in memory). Ours.
MAX_NOT_APPLIED_TRACKED: Final = 1000
_ABSENT: Final = object()
# A reason that starts with a DWN error code ("RecordsWriteSignatureInvalid: ...") names it.
_CODE: Final = re.compile(r"([A-Z][A-Za-z0-9]+):")
# A reason comes from the peer (a push's answer); keep a line of it.
#: Characters of a reason kept in a not-applied record.
MAX_REASON: Final = 300


@dataclass(frozen=True)
class NotApplied:
    """One message that did not apply: where (``here`` for what this node received, ``peer``
    for what this node pushed), its CID, the result kind, a code and the reason."""

    message_cid: str
    tenant: str
    result: str  # Invalid | Incomplete
    code: str  # the DWN error code the reason names, else the result kind
    reason: str
    where: Literal["here", "peer"] = "here"
    peer: str | None = None  # the other side's storeId, when known

    @classmethod
    def of(cls, cid: str, tenant: str, result: Any, *, where: Literal["here", "peer"] = "here",
           peer: str | None = None) -> NotApplied | None:
        """The record of a ReplicationApplyResult in its JSON form; None unless it is one of
        :data:`NOT_APPLIED_KINDS`."""
        kind = result.get("kind") if isinstance(result, dict) else None
        if kind not in NOT_APPLIED_KINDS:
            return None
        if kind == "Invalid":
            reason = str(result.get("reason") or "no reason given")[:MAX_REASON]
            match = _CODE.match(reason)
            code = match[1] if match else "Invalid"
        else:
            missing = result.get("missing")
            refs = [_ref_text(r) for r in missing] if isinstance(missing, list) else []
            reason = ("it depends on what never arrived: " + "; ".join(refs[:3])
                      + (f" and {len(refs) - 3} more" if len(refs) > 3 else ""))[:MAX_REASON]
            code = "DependencyMissing"
        return cls(cid, tenant, str(kind), code, reason, where, peer)

    def to_json(self) -> dict[str, Any]:
        out = {"messageCid": self.message_cid, "tenant": self.tenant, "result": self.result, "code": self.code,
               "reason": self.reason, "where": self.where}
        if self.peer is not None:
            out["peer"] = self.peer
        return out

    @classmethod
    def from_json(cls, obj: Any) -> NotApplied | None:
        """The record :meth:`to_json` wrote; None for anything else (a row edited by hand)."""
        if not isinstance(obj, dict):
            return None
        texts = [obj.get(k) for k in ("messageCid", "tenant", "result", "code", "reason")]
        where, peer = obj.get("where", "here"), obj.get("peer")
        if not all(isinstance(t, str) for t in texts) or where not in ("here", "peer") \
                or not (peer is None or isinstance(peer, str)):
            return None
        cid, tenant, result, code, reason = (str(t) for t in texts)
        return cls(cid, tenant, result, code, reason[:MAX_REASON], where, peer)

    def line(self) -> str:
        """One line for a person: ``CID: Invalid (Code): reason``."""
        at = " at the peer" if self.where == "peer" else ""
        return f"{self.message_cid}: {self.result}{at} ({self.code}): {self.reason}"


def _ref_text(ref: Any) -> str:
    if not isinstance(ref, dict):
        return "?"
    named = ", ".join(f"{k} {v}" for k, v in ref.items() if k not in ("type", "terminal"))
    return f"{ref.get('type', '?')} ({named})" if named else str(ref.get("type", "?"))


@dataclass
class NotAppliedLog:
    """The messages that did not apply and have not applied since: the latest
    :data:`MAX_NOT_APPLIED` of them, and how many (a message seen again counts once). A
    message that applies later (its dependency arrived, a peer took it on a later push) leaves
    the list and the count (:meth:`settle`), also after it left the list for newer ones: the
    log remembers those by CID (:attr:`overflow`, the latest :data:`MAX_NOT_APPLIED_TRACKED`;
    one older than that stays counted for good)."""

    count: int = 0
    last: list[NotApplied] = field(default_factory=list)
    #: what left :attr:`last` for newer entries and has not applied since, oldest first:
    #: ``(messageCid, where)`` to ``(tenant, the peer's storeId or None)``
    overflow: dict[tuple[str, str], tuple[str, str | None]] = field(default_factory=dict)
    #: called after each change (a peer keeps the log in its store, a node rewrites its status
    #: file); must not raise
    listeners: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)

    def add(self, entry: NotApplied) -> None:
        """Keep ``entry``; a message already in the log (a round's reconciliation fetched it,
        then its log offered it again; a peer retries it every round) moves to the end instead
        of counting twice."""
        key = (entry.message_cid, entry.where)
        again = [i for i, e in enumerate(self.last) if (e.message_cid, e.where) == key]
        for i in reversed(again):
            del self.last[i]
        if not again and self.overflow.pop(key, _ABSENT) is _ABSENT:
            self.count += 1
        self.last.append(entry)
        for gone in self.last[:-MAX_NOT_APPLIED]:
            self.overflow[(gone.message_cid, gone.where)] = (gone.tenant, gone.peer)
        del self.last[:-MAX_NOT_APPLIED]
        while len(self.overflow) > MAX_NOT_APPLIED_TRACKED:
            del self.overflow[next(iter(self.overflow))]
        self._changed()

    def settle(self, message_cid: str, where: Literal["here", "peer"] = "here", peer: str | None = None) -> None:
        """``message_cid`` applied after all: here (``where="here"``, from whichever peer or
        path), or at the peer ``peer`` that had refused it (``where="peer"``). Runs for every
        applied message, so the common case (an empty log) costs two tests."""
        if not self.last and not self.overflow:
            return
        for i, e in enumerate(self.last):
            if e.message_cid == message_cid and e.where == where and (where == "here" or e.peer == peer):
                del self.last[i]
                break
        else:
            key = (message_cid, where)
            if key not in self.overflow or (where == "peer" and self.overflow[key][1] != peer):
                return
            del self.overflow[key]
        self.count = max(self.count - 1, len(self.last) + len(self.overflow))
        self._changed()

    def clear(self) -> None:
        """Forget every entry (a user read them: ``status --clear-not-applied``)."""
        self.last.clear()
        self.overflow.clear()
        self.count = 0

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "last": [e.to_json() for e in self.last]}

    def lines(self, indent: str = "  ") -> list[str]:
        """``N message(s) did not apply`` and one line per listed message (none when N is 0)."""
        if not self.count:
            return []
        shown = f" (the last {len(self.last)}:)" if self.count > len(self.last) else ":"
        return [f"{self.count} message(s) did not apply{shown}"] + [f"{indent}{e.line()}" for e in self.last]


@dataclass
class SyncStats:
    """One direction of one collection. A pull counts at the sink (us), a push at the source (us)."""

    items_offered: int = 0
    items_skipped: int = 0  # answered 304 or 413
    items_elsewhere: int = 0  # declined: another link of this store was receiving them (issue #17)
    echoes_suppressed: int = 0  # push: entries that came from the sink, settled unproposed
    revs_received: int = 0  # sink: `rev`s that arrived
    revs_sent: int = 0  # source: `rev`s sent
    revs_applied: int = 0  # results that made new state (Applied)
    revs_settled: int = 0
    results: dict[str, int] = field(default_factory=dict)
    dependencies_fetched: int = 0
    attachments_fetched: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    latest: int | None = None  # the source's newest log position when the feed opened (pull)
    # messages moved by reconciliation instead of the log (pull: fetched by CID; push: taken
    # by the peer); their results are counted in ``results`` and ``revs_applied`` too
    reconciled: int = 0
    #: the messages of ``results``' Invalid and Incomplete, by CID (the last ones)
    not_applied: NotAppliedLog = field(default_factory=NotAppliedLog)

    def count_reconciled(self, results: dict[str, int]) -> None:
        for kind, n in results.items():
            self.results[kind] = self.results.get(kind, 0) + n
            self.reconciled += n
        self.revs_applied += results.get("Applied", 0)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        out["results"] = dict(self.results)
        if self.not_applied.count:
            out["not_applied"] = self.not_applied.to_json()
        else:
            del out["not_applied"]
        return out


@dataclass(frozen=True)
class SyncProgress:
    """A progress report for a progress bar (``Peer.sync(on_progress=...)``)."""

    direction: Literal["pull", "push"]
    messages: int  # settled so far
    bytes: int
    items_offered: int
    latest: int | None  # the source's newest position when the feed opened (pull), else None
    position: int | None  # the last position listed so far


@dataclass
class SyncSummary:
    """What one ``Peer.sync`` round did."""

    tenant: str
    remote: str
    pull: SyncStats | None
    push: SyncStats | None
    checkpoint: dict[str, Any]
    copy_rev: str | None
    seconds: float = 0.0
    rounds: int = 1
    state: str = "live"

    @property
    def stats(self) -> SyncStats:
        """The pull stats, or the push stats of a push-only sync."""
        stats = self.pull if self.pull is not None else self.push
        assert stats is not None
        return stats

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tenant": self.tenant,
            "remote": self.remote,
            "seconds": round(self.seconds, 3),
            "rounds": self.rounds,
            "state": self.state,
            "checkpoint": self.checkpoint,
        }
        if self.copy_rev is not None:
            out["copyRev"] = self.copy_rev
        if self.pull is not None:
            out["pull"] = self.pull.to_json()
        if self.push is not None:
            out["push"] = self.push.to_json()
        return out
