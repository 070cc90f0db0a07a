"""LtHash16: a homomorphic hash of a set of message CIDs, kept up to date one CID at a time.

Two replicas hold the same set of messages for a tenant (or a protocol of it) exactly when
their set digests are equal; a replica keeps its digest current as messages are stored and
removed, so the equality check of anti-entropy costs one small message and no scan.

Specification (normative; ``protocol/examples/lthash-vectors.json`` has test vectors):

- **Element.** The element of a CID (its canonical base32 string) is
  ``SHAKE-256(b"p2psync-lthash-v1\\x00" || ascii(cid))`` read to 2,048 bytes, taken as 1,024
  little-endian unsigned 16-bit lanes.
- **State.** The state of a set is the lane-wise sum modulo 2^16 of its elements' lanes,
  serialized as 1,024 little-endian uint16 (2,048 bytes). The empty set's state is 2,048 zero
  bytes. Adding a CID adds its element lane-wise mod 2^16; removing one subtracts it. The state
  of a set therefore depends on nothing but the set: not the order of additions, not a CID that
  was added and removed again.
- **Digest.** ``SHA-256(state)``: 32 bytes, printed as 64 lowercase hex digits.

The state is a multiset hash: adding a CID twice is not adding it once. A store's message set
never holds a CID twice (``messages_cid`` is unique per tenant), so the multiset is a set.

Why this construction. An incremental set hash needs a combining operation with an inverse,
and the obvious ones are weak. XOR of per-element hashes is linear over GF(2): given about as
many candidate elements as the hash has bits, Gaussian elimination finds a subset whose XOR is
any chosen value, so a forged set with a chosen digest is cheap (and pairs cancel). A sum of
hashes modulo 2^256 (AdHash) falls to Wagner's generalized birthday algorithm unless the
modulus is thousands of bits long. LtHash sums vectors of many small lanes instead (the
lattice hash of Bellare and Micciancio, "A New Paradigm for Collision-Free Hashing:
Incrementality at Reduced Cost", EUROCRYPT 1997): finding a collision is an instance of the
short integer solution (SIS) lattice problem. Lewi et al., "Securing Update
Propagation with Homomorphic Hashing" (Facebook, 2019) analyse LtHash16 with 1,024 lanes at
more than 200 bits of security and run it at scale to check replicated databases. Hashing the
state with SHA-256 only shortens what is compared and printed; the state (2 KB) is what a
replica keeps and updates.

Performance (pure Python; ``tests/bench/bench_setindex.py``). The lanes are kept as two Python
integers, the even and the odd lanes, each lane in a 32-bit slot with 16 bits of headroom
above it: adding an element is two big-integer additions, and the slots are reduced mod 2^16
only every :data:`_OPS_BEFORE_REDUCE` operations (or when the state is read). SHAKE-256's
2,048 bytes (16 Keccak permutations) are most of an add's cost (about 5 of 8 µs here).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Final

__all__ = [
    "DOMAIN",
    "EMPTY_STATE",
    "LANES",
    "STATE_BYTES",
    "Element",
    "ElementSum",
    "LtHash",
    "element",
    "lthash_digest",
]

#: Domain separation of the element hash (version 1 of this construction).
DOMAIN: Final = b"p2psync-lthash-v1\x00"
#: 16-bit lanes (Lewi et al.'s LtHash16 parameters).
LANES: Final = 1024
STATE_BYTES: Final = 2 * LANES
EMPTY_STATE: Final = bytes(STATE_BYTES)

# Each lane sits in a 32-bit slot of one of two integers (even lanes, odd lanes).
_LOW16: Final = int.from_bytes(b"\xff\xff\x00\x00" * (LANES // 2), "little")
# 2^16 in every slot: removing adds (2^16 - lane), which is never negative, so no slot borrows.
_TWO16: Final = int.from_bytes(b"\x00\x00\x01\x00" * (LANES // 2), "little")
# A reduced slot holds < 2^16, and each operation adds <= 2^16: after this many operations a
# slot holds at most 0xFFFF + 0xFFFF * 0x10000 = 2^32 - 1, so nothing carries into the next.
_OPS_BEFORE_REDUCE: Final = 0xFFFF


def element(cid: str) -> bytes:
    """The element of ``cid``: 2,048 bytes, 1,024 little-endian uint16 lanes."""
    return hashlib.shake_256(DOMAIN + cid.encode("ascii")).digest(STATE_BYTES)


class Element:
    """A CID's element split into its even and odd lanes, ready to add to an :class:`LtHash`
    (to add one CID to several hashes, compute this once)."""

    __slots__ = ("even", "odd")

    def __init__(self, even: int, odd: int) -> None:
        self.even = even
        self.odd = odd

    @classmethod
    def of(cls, cid: str) -> Element:
        x = int.from_bytes(element(cid), "little")
        return cls(x & _LOW16, (x >> 16) & _LOW16)


class ElementSum:
    """Elements added and removed, summed to be applied to :class:`LtHash` es at once (a fold
    adds a commit's CIDs to their tenant's hash and to their protocol's).

    Splitting each element into even and odd lanes costs a shift and two masks of 16,384-bit
    integers; the sum needs one mask an element instead: it keeps the plain sum S of the
    elements (carries run across lanes) and the sum E of their even lanes (each in a 32-bit
    slot); the odd lanes' sum is then exactly (S − E) / 2¹⁶. Slots of E stay below 2³² for up to
    :attr:`CAPACITY` elements, once ``removed``·2¹⁶ is added to each (as
    :meth:`LtHash.remove_element` does): past that, apply the sum and start another.
    """

    __slots__ = ("_even", "_plain", "added", "removed")

    #: Elements a sum may hold (see :data:`_OPS_BEFORE_REDUCE`).
    CAPACITY: Final = _OPS_BEFORE_REDUCE - 1

    def __init__(self) -> None:
        self._plain = 0
        self._even = 0
        self.added = 0
        self.removed = 0

    @property
    def full(self) -> bool:
        return self.added + self.removed >= self.CAPACITY

    def add(self, cid: str) -> None:
        x = int.from_bytes(element(cid), "little")
        self._plain += x
        self._even += x & _LOW16
        self.added += 1

    def remove(self, cid: str) -> None:
        x = int.from_bytes(element(cid), "little")
        self._plain -= x
        self._even -= x & _LOW16
        self.removed += 1

    def lanes(self) -> tuple[int, int]:
        """(even, odd) slot integers to add to an :class:`LtHash`'s, every slot in [0, 2³²)."""
        if self.added + self.removed > self.CAPACITY:
            raise ValueError(f"an ElementSum holds at most {self.CAPACITY} elements")
        bias = self.removed * _TWO16
        return self._even + bias, ((self._plain - self._even) >> 16) + bias


class LtHash:
    """The LtHash16 state of a set of CIDs (see the module doc), updated in place."""

    __slots__ = ("_even", "_odd", "_ops")

    def __init__(self) -> None:
        self._even = 0
        self._odd = 0
        self._ops = 0  # operations since the slots were last reduced

    @classmethod
    def from_state(cls, state: bytes) -> LtHash:
        """The hash whose :meth:`state` is ``state`` (2,048 bytes)."""
        if len(state) != STATE_BYTES:
            raise ValueError(f"an LtHash16 state is {STATE_BYTES} bytes, not {len(state)}")
        h = cls()
        x = int.from_bytes(state, "little")
        h._even, h._odd = x & _LOW16, (x >> 16) & _LOW16
        return h

    def copy(self) -> LtHash:
        h = LtHash()
        h._even, h._odd, h._ops = self._even, self._odd, self._ops
        return h

    def add(self, cid: str) -> None:
        """Add ``cid`` to the set."""
        self.add_element(Element.of(cid))

    def remove(self, cid: str) -> None:
        """Remove ``cid`` from the set (the inverse of :meth:`add`)."""
        self.remove_element(Element.of(cid))

    def add_element(self, e: Element) -> None:
        self._even += e.even
        self._odd += e.odd
        self._count_op()

    def remove_element(self, e: Element) -> None:
        self._even += _TWO16 - e.even
        self._odd += _TWO16 - e.odd
        self._count_op()

    def add_sum(self, s: ElementSum) -> None:
        """Add every element ``s`` added and remove every one it removed."""
        even, odd = s.lanes()
        if self._ops + s.added + s.removed >= _OPS_BEFORE_REDUCE:
            self._reduce()  # then at most CAPACITY operations' worth is added to reduced slots
        self._even += even
        self._odd += odd
        self._ops += s.added + s.removed

    def add_hash(self, other: LtHash) -> None:
        """Add every element of ``other``'s set: the state of the union of two disjoint sets."""
        self._reduce()
        other._reduce()
        self._even += other._even
        self._odd += other._odd
        self._count_op()

    def update(self, adds: Iterable[str] = (), removes: Iterable[str] = ()) -> None:
        """Add every CID of ``adds`` and remove every CID of ``removes``."""
        for cid in adds:
            self.add_element(Element.of(cid))
        for cid in removes:
            self.remove_element(Element.of(cid))

    def _count_op(self) -> None:
        self._ops += 1
        if self._ops >= _OPS_BEFORE_REDUCE:
            self._reduce()

    def _reduce(self) -> None:
        self._even &= _LOW16
        self._odd &= _LOW16
        self._ops = 0

    def state(self) -> bytes:
        """The 2,048-byte state: 1,024 little-endian uint16 lanes."""
        self._reduce()
        return (self._even | (self._odd << 16)).to_bytes(STATE_BYTES, "little")

    def digest(self) -> bytes:
        """SHA-256 of the state (32 bytes)."""
        return hashlib.sha256(self.state()).digest()

    def hexdigest(self) -> str:
        return self.digest().hex()

    def is_empty(self) -> bool:
        """Whether the state is the empty set's (lanes all zero)."""
        self._reduce()
        return self._even == 0 and self._odd == 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LtHash):
            return NotImplemented
        self._reduce()
        other._reduce()
        return self._even == other._even and self._odd == other._odd

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"LtHash({self.hexdigest()[:16]}…)"


def lthash_digest(cids: Iterable[str]) -> bytes:
    """The digest of the set ``cids`` computed from scratch (each CID counted once per occurrence)."""
    h = LtHash()
    h.update(cids)
    return h.digest()
