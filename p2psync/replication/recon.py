"""Anti-entropy: the ``reconcile`` exchange that finds what two replicas' message sets differ by
(protocol/anti-entropy.md). Sans-I/O: bodies in, bodies out.

The initiator (:class:`Reconciliation`) holds the decoder; the responder (:func:`answer`) keeps
no state between requests, so a hostile initiator costs it bounded work per request and no
memory. Every request and reply is one small CBOR map (1-letter keys: bytes matter here).

1. **Opening** ``{c, h, n, s, l?}``: the initiator's 16-byte set digest, its count and its first
   coded symbol(s). The responder answers
   - ``{q: true}`` when the digests are equal (one small message each way);
   - ``{y, m}`` when it could peel the difference from those symbols alone (one or two
     messages differ): ``y`` the ids only the responder holds, ``m`` those only the initiator
     holds;
   - ``{n, e}`` otherwise: its count and its difference-estimator lanes.
   The estimate reply carries ``v``, the set's version (4 bytes of its digest).
2. **Symbols** ``{c, w: [lo, hi]}`` → ``{s, v}``: the responder's coded symbols ``[lo, hi)``. The
   first such request is sized from the estimate (:data:`MARGIN` × d̂, enough for ~99 % of
   decodes), later ones add half again, until the decoder is done or :data:`MAX_SYMBOL_INDEX`.
   A ``v`` that differs from the estimate reply's means the responder's set changed in between
   (``409 ReconcileSetChanged``: start again).

So: equal → 1 round trip; d ≤ 2 or so → 1; otherwise usually 2, rarely 3.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from p2psync.replication.riblt import (
    CHECK_BYTES,
    ESTIMATOR_LANES,
    SALT_BYTES,
    ZERO_SALT,
    Coder,
    Decoder,
    Key,
    Sketch,
    Symbols,
    estimate_difference,
)
from p2psync.replication.wire import refuse

__all__ = [
    "DIGEST_BYTES",
    "MARGIN",
    "MemorySet",
    "MAX_OPENING_SYMBOLS",
    "MAX_RECONCILE_BODY",
    "MAX_RESOLVE",
    "MAX_TAKE",
    "MAX_REPLY_SYMBOLS",
    "MAX_SYMBOL_INDEX",
    "PROFILE",
    "Reconciliation",
    "ReconResult",
    "SetView",
    "answer",
    "body_collection",
    "pack_ids",
    "parse_resolve",
    "resolve_request",
    "resolved_of",
    "pack_symbols",
    "unpack_ids",
    "unpack_symbols",
]

#: The BLIP profile (protocol/anti-entropy.md §4).
PROFILE: Final = "reconcile"
#: Bytes of the set digest compared in the opening: the LtHash's SHA-256 cut to 128 bits
#: (two different sets agree by chance with probability 2^-128).
DIGEST_BYTES: Final = 16
#: Symbols the opening carries: symbol 0 alone decodes a difference of one message.
OPENING_SYMBOLS: Final = 1
#: At most this many in an opening (a responder peels them synchronously).
MAX_OPENING_SYMBOLS: Final = 64
#: The highest symbol index anyone asks for: 2^18 symbols decode ~190,000 differences (3.4 MB
#: of symbols); past that, replaying the log is cheaper than reconciling. It also bounds what a
#: dishonest responder can make an initiator hold: ~30 MB of decoder state.
MAX_SYMBOL_INDEX: Final = 1 << 18
#: Symbols per reply: 131,072 × 13 bytes ≈ 1.7 MB, under the BLIP message limit with room.
MAX_REPLY_SYMBOLS: Final = 1 << 17
#: First symbol request = MARGIN × estimated difference + SLACK. Measured at d = 100 over 200
#: runs: decoding needed ≤ 1.76 d (p99) and the estimate was ≥ 0.82 d (p1), so 2 × d̂ decodes
#: in one request ~99 % of the time; a miss costs one more round trip, never a wrong answer.
MARGIN: Final = 2.0
SLACK: Final = 16
#: Growth of later symbol requests when the first was not enough.
GROWTH: Final = 0.5
#: Ids in a decoded-at-opening answer: at most what 64 symbols can peel.
MAX_DECODED_IDS: Final = 2 * MAX_OPENING_SYMBOLS
#: Bytes of the set version (its digest's first bytes) on replies that span requests: a set
#: that changed between two of them would mix two states in one decode (2^-32 to miss it).
VERSION_BYTES: Final = 4
#: Ids per resolve request (``r``): 4,096 × 8 bytes = 32 KiB asked, ~300 KiB answered.
MAX_RESOLVE: Final = 4096
#: CIDs per take request (``f``: "fetch these from me"): each is fetched and admitted before
#: the reply, so a request is bounded work (32 getDependencies of 128 refs).
MAX_TAKE: Final = 4096
#: A request body: the largest legitimate one is a take of 4,096 CIDs (~250 KiB).
MAX_RECONCILE_BODY: Final = 512 * 1024


class SetView(Protocol):
    """What reconciliation reads of one side's set (a maintained sketch, or a scan)."""

    @property
    def coder(self) -> Coder: ...

    @property
    def count(self) -> int: ...

    @property
    def digest(self) -> bytes:
        """At least :data:`DIGEST_BYTES` bytes identifying the set (its LtHash digest)."""
        ...

    def lanes(self) -> list[int]:
        """The difference estimator's lanes (each mod 2^16)."""
        ...

    def symbols(self, lo: int, hi: int) -> Symbols: ...


# --- packing ----------------------------------------------------------------------------------


def pack_symbols(sym: Symbols, width: int) -> bytes:
    """Each symbol as ``idSum`` (width bytes) ‖ ``checkSum`` (4) ‖ ``count mod 256`` (1), big-endian.

    The count travels mod 256: the decoder needs only remote − local, which is ±1 on a pure
    symbol and 0 on an empty one, and modular subtraction keeps both (a wrapped ±257 would also
    need a matching 32-bit check to fool it).
    """
    out = bytearray()
    for key_id, check, count in zip(sym.ids, sym.checks, sym.counts, strict=True):
        out += key_id.to_bytes(width, "big")
        out += check.to_bytes(CHECK_BYTES, "big")
        out.append(count & 0xFF)
    return bytes(out)


def unpack_symbols(raw: Any, start: int, width: int, expected: int | None = None) -> Symbols:
    """Inverse of :func:`pack_symbols`; anything else is ``400 ReconcileInvalid``."""
    if not isinstance(raw, bytes):
        refuse(400, "ReconcileInvalid", "symbols are a byte string")
    step = width + CHECK_BYTES + 1
    if len(raw) % step:
        refuse(400, "ReconcileInvalid", f"symbols are {step}-byte records; {len(raw)} bytes is not a whole number")
    n = len(raw) // step
    if expected is not None and n != expected:
        refuse(400, "ReconcileInvalid", f"{n} symbols where {expected} were asked for")
    out = Symbols.empty(start, n)
    for j in range(n):
        at = j * step
        out.ids[j] = int.from_bytes(raw[at : at + width], "big")
        out.checks[j] = int.from_bytes(raw[at + width : at + width + CHECK_BYTES], "big")
        out.counts[j] = raw[at + step - 1]
    return out


def pack_ids(ids: Sequence[int], width: int) -> bytes:
    return b"".join(i.to_bytes(width, "big") for i in ids)


def unpack_ids(raw: Any, width: int, limit: int) -> list[int]:
    if not isinstance(raw, bytes) or len(raw) % width:
        refuse(400, "ReconcileInvalid", f"ids are {width}-byte records")
    if len(raw) // width > limit:
        refuse(413, "ReconcileTooLarge", f"more than {limit} ids")
    return [int.from_bytes(raw[i : i + width], "big") for i in range(0, len(raw), width)]


def _lanes_bytes(lanes: list[int]) -> bytes:
    return b"".join(v.to_bytes(2, "big") for v in lanes)


def _lanes_of(raw: Any) -> list[int]:
    if not isinstance(raw, bytes) or len(raw) != 2 * ESTIMATOR_LANES:
        refuse(400, "ReconcileInvalid", f"estimator lanes are {2 * ESTIMATOR_LANES} bytes")
    return [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 1 << 53:
        refuse(400, "ReconcileInvalid", "a count is an integer 0 ≤ n < 2^53")
    return value


def coder_of(body: dict[str, Any]) -> Coder:
    """The request's coder: ``t`` salt (16 bytes) and ``i`` id width, defaults when absent."""
    salt = body.get("t", ZERO_SALT)
    width = body.get("i", 8)
    if not isinstance(salt, bytes) or len(salt) != SALT_BYTES:
        refuse(400, "ReconcileInvalid", f"t (salt) is {SALT_BYTES} bytes")
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= 8:
        refuse(400, "ReconcileInvalid", "i (id width) is 1 to 8")
    return Coder(width, salt)


def _coder_members(coder: Coder) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if coder.salt != ZERO_SALT:
        out["t"] = coder.salt
    if coder.width != 8:
        out["i"] = coder.width
    return out


def body_collection(body: dict[str, Any]) -> int:
    """The collection index ``c`` (absent: 0)."""
    index = body.get("c", 0)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        refuse(400, "ReconcileInvalid", "c (collection) is a non-negative integer")
    return index


def resolve_request(coder: Coder, ids: Sequence[int], collection: int | None = None) -> dict[str, Any]:
    """``{c, r, t?, i?}``: the CIDs the responder holds under these ids."""
    out: dict[str, Any] = {} if collection is None else {"c": collection}
    out.update(_coder_members(coder))
    out["r"] = pack_ids(ids, coder.width)
    return out


def parse_resolve(body: dict[str, Any]) -> tuple[Coder, list[int]]:
    coder = coder_of(body)
    return coder, unpack_ids(body.get("r"), coder.width, MAX_RESOLVE)


def resolved_of(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``k`` list of a resolve reply: ``{cid, kind, recordId?, protocol?}`` per message."""
    items = reply.get("k")
    if not isinstance(items, list) or len(items) > 4 * MAX_RESOLVE:
        refuse(400, "ReconcileInvalid", "k is a list of resolved messages")
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("cid"), str):
            refuse(400, "ReconcileInvalid", "a resolved message is a map with a cid")
        out.append(item)
    return out


# --- responder ---------------------------------------------------------------------------------


def answer(body: dict[str, Any], view_for: Callable[[Coder], SetView]) -> dict[str, Any]:
    """The responder's reply to one ``reconcile`` request body (``c`` is the caller's business).

    ``view_for(coder)`` gives this side's set under the request's coder. Malformed or
    over-limit requests raise a ``PeerError`` (``400 ReconcileInvalid``, ``413
    ReconcileTooLarge``).
    """
    coder = coder_of(body)
    if "w" in body:
        want = body["w"]
        if (not isinstance(want, list) or len(want) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in want)):
            refuse(400, "ReconcileInvalid", "w is [lo, hi]")
        lo, hi = want
        if not 0 <= lo < hi:
            refuse(400, "ReconcileInvalid", "w needs 0 ≤ lo < hi")
        if hi > MAX_SYMBOL_INDEX or hi - lo > MAX_REPLY_SYMBOLS:
            refuse(413, "ReconcileTooLarge",
                   f"at most {MAX_REPLY_SYMBOLS} symbols a request, below index {MAX_SYMBOL_INDEX}")
        view = view_for(coder)
        return {"s": pack_symbols(view.symbols(lo, hi), coder.width), "v": view.digest[:VERSION_BYTES]}
    digest = body.get("h")
    if not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
        refuse(400, "ReconcileInvalid", f"h (digest) is {DIGEST_BYTES} bytes")
    n_theirs = _count(body.get("n"))
    raw = body.get("s", b"")
    step = coder.width + CHECK_BYTES + 1
    if isinstance(raw, bytes) and len(raw) > MAX_OPENING_SYMBOLS * step:
        refuse(413, "ReconcileTooLarge", f"an opening carries at most {MAX_OPENING_SYMBOLS} symbols")
    theirs = unpack_symbols(raw, 0, coder.width)
    view = view_for(coder)
    if view.digest[:DIGEST_BYTES] == digest and view.count == n_theirs:
        return {"q": True}
    if len(theirs):
        decoder = Decoder(coder)
        decoder.feed(theirs, view.symbols(0, len(theirs)))
        if decoder.done and n_theirs - len(decoder.remote_only) + len(decoder.local_only) == view.count:
            # remote = the initiator: its extra ids are what this side lacks.
            return {"y": pack_ids(decoder.local_only, coder.width), "m": pack_ids(decoder.remote_only, coder.width)}
    return {"n": view.count, "e": _lanes_bytes(view.lanes()), "v": view.digest[:VERSION_BYTES]}


# --- initiator ---------------------------------------------------------------------------------


@dataclass
class ReconResult:
    """What a reconciliation found, in short ids of its coder."""

    equal: bool
    #: Ids the peer holds and this side lacks.
    remote_only: list[int] = field(default_factory=list)
    #: Ids this side holds and the peer lacks.
    local_only: list[int] = field(default_factory=list)
    round_trips: int = 0
    symbols: int = 0
    estimate: float | None = None
    remote_count: int = 0
    #: the responder's log head token (wire form) when the opening asked for it (``l``)
    head: Any = None

    @property
    def differences(self) -> int:
        return len(self.remote_only) + len(self.local_only)


class Reconciliation:
    """The initiator's side: ``opening()``, then ``receive(reply)`` until it returns ``None``.

    :attr:`result` is set when finished. A reply that cannot come from an honest peer, or a
    difference too large to decode under :data:`MAX_SYMBOL_INDEX`, raises a ``PeerError``
    (``400 ReconcileInvalid``, ``422 ReconcileFailed``); the caller falls back to a replay or
    retries with a fresh salt (a short-id collision, protocol/anti-entropy.md §5).
    """

    def __init__(self, local: SetView, collection: int | None = None, opening_symbols: int = OPENING_SYMBOLS,
                 *, want_head: bool = False) -> None:
        self.local = local
        #: ask the responder for its log head token with the opening (``l``, §7)
        self.want_head = want_head
        self._head: Any = None
        self.coder = local.coder
        self.collection = collection
        self._opening_symbols = opening_symbols
        self._decoder = Decoder(self.coder)
        self._asked: tuple[int, int] | None = None
        self.round_trips = 0
        self.result: ReconResult | None = None
        self._estimate: float | None = None
        self._remote_count = 0
        self._version: bytes | None = None

    def _request(self, **members: Any) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.collection is None else {"c": self.collection}
        out.update(_coder_members(self.coder))
        out.update(members)
        return out

    def opening(self) -> dict[str, Any]:
        self.round_trips = 1
        request = self._request(h=self.local.digest[:DIGEST_BYTES], n=self.local.count,
                                s=pack_symbols(self.local.symbols(0, self._opening_symbols), self.coder.width))
        if self.want_head:
            request["l"] = True
        return request

    def receive(self, reply: Any) -> dict[str, Any] | None:
        """Take the reply to the last request; the next request body, or ``None`` when done."""
        if not isinstance(reply, dict):
            refuse(400, "ReconcileInvalid", "a reply is a map")
        if self._asked is None:
            return self._after_opening(reply)
        lo, hi = self._asked
        self._check_version(reply)
        remote = unpack_symbols(reply.get("s"), lo, self.coder.width, expected=hi - lo)
        self._decoder.feed(remote, self.local.symbols(lo, hi))
        if self._decoder.corrupt:
            refuse(422, "ReconcileFailed", "the symbols do not decode to a difference of two sets "
                                           "(a short-id collision or a dishonest peer)")
        if self._decoder.done:
            remote_only, local_only = self._decoder.remote_only, self._decoder.local_only
            if self.local.count - len(local_only) + len(remote_only) != self._remote_count:
                refuse(422, "ReconcileFailed", "the decoded difference does not match the counts "
                                               "(a short-id collision)")
            self._finish(ReconResult(False, list(remote_only), list(local_only)))
            return None
        if hi >= self._limit():
            refuse(422, "ReconcileFailed", f"not decoded within {hi} symbols")
        return self._ask(hi, min(MAX_SYMBOL_INDEX, hi + max(SLACK, min(MAX_REPLY_SYMBOLS, math.ceil(hi * GROWTH)))))

    def _after_opening(self, reply: dict[str, Any]) -> dict[str, Any] | None:
        self._head = reply.get("l")
        if reply.get("q") is True:
            self._remote_count = self.local.count
            self._finish(ReconResult(True))
            return None
        if "y" in reply or "m" in reply:
            y = unpack_ids(reply.get("y", b""), self.coder.width, MAX_DECODED_IDS)
            m = unpack_ids(reply.get("m", b""), self.coder.width, MAX_DECODED_IDS)
            self._remote_count = self.local.count + len(y) - len(m)
            self._finish(ReconResult(False, y, m))
            return None
        self._remote_count = _count(reply.get("n"))
        self._check_version(reply)
        lanes = _lanes_of(reply.get("e"))
        self._estimate = estimate_difference(self.local.lanes(), self.local.count, lanes, self._remote_count)
        hi = min(MAX_SYMBOL_INDEX, SLACK + math.ceil(MARGIN * max(2.0, self._estimate)))
        return self._ask(0, hi)

    @property
    def estimate(self) -> float | None:
        """The estimated difference, once the responder's estimator arrived."""
        return self._estimate

    @property
    def remote_count(self) -> int:
        """The responder's count, once an opening reply gave it (0 before)."""
        return self._remote_count

    def _limit(self) -> int:
        """No honest decode needs more than ~2 symbols per difference, and the difference is at
        most both sets: past 3 × (n_local + n_remote) + 64 the stream is not a set's."""
        return min(MAX_SYMBOL_INDEX, 3 * (self.local.count + self._remote_count) + 64)

    def _check_version(self, reply: dict[str, Any]) -> None:
        version = reply.get("v")
        if not isinstance(version, bytes) or len(version) != VERSION_BYTES:
            refuse(400, "ReconcileInvalid", f"v (set version) is {VERSION_BYTES} bytes")
        if self._version is None:
            self._version = version
        elif version != self._version:
            refuse(409, "ReconcileSetChanged", "the peer's set changed during the reconciliation; start again")

    def _ask(self, lo: int, hi: int) -> dict[str, Any]:
        hi = min(hi, lo + MAX_REPLY_SYMBOLS, MAX_SYMBOL_INDEX)
        self._asked = (lo, hi)
        self.round_trips += 1
        return self._request(w=[lo, hi])

    def _finish(self, result: ReconResult) -> None:
        result.round_trips = self.round_trips
        result.symbols = self._decoder.received
        result.estimate = self._estimate
        result.remote_count = self._remote_count
        result.head = self._head
        self.result = result


class MemorySet:
    """A :class:`SetView` held in memory: a sketch of the first ``size`` symbols, the keys (for
    symbols past it) and the digest. Used for scopes no sketch is maintained for, salted retries,
    tests and the benchmark."""

    def __init__(self, coder: Coder, cids: Sequence[str], size: int, digest: bytes,
                 sketch: Sketch | None = None) -> None:
        self._coder = coder
        self._digest = digest
        self._keys: list[Key] | None = None
        self._cids = cids
        if sketch is None:
            sketch = Sketch(coder, size)
            self._keys = [coder.key(c) for c in cids]
            for key in self._keys:
                sketch.add(key)
        self.sketch = sketch

    @property
    def coder(self) -> Coder:
        return self._coder

    @property
    def count(self) -> int:
        return self.sketch.count

    @property
    def digest(self) -> bytes:
        return self._digest

    def lanes(self) -> list[int]:
        return self.sketch.estimator.lanes()

    def symbols(self, lo: int, hi: int) -> Symbols:
        if hi <= self.sketch.size:
            return self.sketch.range(lo, hi)
        if self._keys is None:
            self._keys = [self._coder.key(c) for c in self._cids]
        return self.sketch.range(lo, hi, self._keys)
