"""Ed25519 verification that accepts and refuses exactly what the reference DWN does, fast.

The reference (dwn-sdk-js 0.5.2) verifies with ``@noble/ed25519`` 2.0.0 ``verifyAsync``. Its
rule, which :func:`reference_outcome` restates in pure Python, differs from RFC 8032's strict
verifiers (OpenSSL behind ``cryptography``, libsodium behind PyNaCl):

- A and R are decoded leniently (ZIP-215 style): any 255-bit y, even ``y >= p``, and x = 0 with
  the sign bit set; a y with no square root *throws* ("bad y coordinate 3"), as do a signature
  that is not 64 bytes and a key that is not 32 ("Uint8Array expected").
- S must be below L, else it throws ("invalid scalar, must be < L"); S = 0 is allowed.
- k = SHA-512(enc(R) ‖ enc(A) ‖ M) mod L over the points *re-encoded*: canonically, and the
  identity as 32 zero bytes (noble's ``toAffine`` maps the identity to (0, 0)), not the bytes sent.
- The equation is cofactored: [8]([S]B − R − [k]A) = identity. Small-order and mixed-order A
  and R are fine.

A throw is a refusal too: every handler answers ``messageReplyFromError(e, 401)`` around
``authenticate``, so the reply is 401 either way (only the detail text differs).

**The fast path and why it is exact.** Call an encoding *plain* when its y (the low 255 bits)
is below p and is neither 1 nor p − 1 (so it is canonical, x = 0 with the sign bit cannot occur,
and it is not the identity). When A and R are plain and S < L:

1. libsodium accepts ⇒ the reference accepts. libsodium checks S < L and compares the canonical
   encoding of [S]B − [k]A with R's bytes, k taken over the bytes sent; so R = [S]B − [k]A.
   The reference decodes A and R to the same points and re-encodes them to the same bytes
   (plain), so its k is the same, and [8]·identity = identity.
2. libsodium refuses, and A and R are both in the prime-order subgroup (libsodium's
   ``crypto_core_ed25519_is_valid_point``: canonical, on the curve, torsion-free, not of small
   order) ⇒ the reference refuses. X = [S]B − R − [k]A is then in the prime-order subgroup,
   where [8]X = identity only if X = identity (8 is prime to L), which is exactly libsodium's
   test with R canonical; so libsodium refused because X ≠ identity.

Everything else — a non-plain encoding, S ≥ L, a wrong length, a refusal with a torsion
component in A or R — goes to the slow path. Honest traffic never gets there; a refusal costs
one more subgroup check of R (A's is cached per key).

**The slow path** (:func:`_sodium_outcome`) is the reference's rule computed with libsodium's
group operations, which take any point on the curve given canonically:

- each encoding is decoded as noble does (y reduced mod p; x = 0 keeps no sign) and re-encoded
  canonically by libsodium, so k is hashed over the reference's bytes;
- [8]X = identity exactly when X is one of the eight points of order dividing 8, so the test is
  X = [S]B − R − [k]A against that set, with no multiplication by 8;
- libsodium multiplies only points of the prime-order subgroup, so [k]A is taken as [k′/8]([8]A)
  with k′ ≡ k (mod L) and 8 | k′. [k′]A differs from [k]A by [k′ − k]A, a multiple of [L]A, which
  has order dividing 8, so X moves by a point of that set and the verdict does not change.

It costs ~0.2 ms a signature here (a crafted R or key forces it), against ~1.9 ms for the same
rule in pure Python (:func:`reference_outcome`, kept as its statement and the tests' second
opinion) and ~57 µs for an honest signature (docs/benchmarks.md).

:func:`did_key_point_is_valid` is the other rule the reference applies to keys: a ``did:key``
resolves only if its key passes ``@noble/curves`` strict decoding and ``assertValidity``.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import threading
from collections.abc import Sequence
from typing import Final

import nacl.bindings
import nacl.exceptions
from nacl.exceptions import BadSignatureError

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493  # the prime order of the base point
_D = -121665 * pow(121666, -1, P) % P
_D2 = 2 * _D % P
_SQRT_M1 = pow(2, (P - 1) // 4, P)
_Y_MASK = (1 << 255) - 1
_BY = 4 * pow(5, -1, P) % P

# noble's error messages, the reply detail the reference gives when it throws.
THROW_LENGTH = "Uint8Array expected"
THROW_BAD_Y = "bad y coordinate 3"
THROW_SCALAR = "invalid scalar, must be < L"


class Outcome(enum.Enum):
    """What ``@noble/ed25519`` ``verifyAsync`` does with a signature."""

    ACCEPT = "accept"
    REFUSE = "refuse"  # returns false
    THROW = "throw"  # throws an Error; the DWN answers 401 as for a refusal


# Extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z.
_Point = tuple[int, int, int, int]
_IDENTITY: _Point = (0, 1, 1, 0)


def _add(p: _Point, q: _Point) -> _Point:
    x1, y1, z1, t1 = p
    x2, y2, z2, t2 = q
    a = (y1 - x1) * (y2 - x2) % P
    b = (y1 + x1) * (y2 + x2) % P
    c = t1 * _D2 * t2 % P
    d = 2 * z1 * z2 % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _double(p: _Point) -> _Point:
    x1, y1, z1, _ = p
    a = x1 * x1 % P
    b = y1 * y1 % P
    c = 2 * z1 * z1 % P
    h = a + b
    e = h - (x1 + y1) * (x1 + y1)
    g = a - b
    f = c + g
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _negate(p: _Point) -> _Point:
    return (-p[0] % P, p[1], p[2], -p[3] % P)


def _is_identity(p: _Point) -> bool:
    return p[0] % P == 0 and (p[1] - p[2]) % P == 0


def _affine(x: int, y: int) -> _Point:
    return (x, y, 1, x * y % P)


def _recover_x(y: int, sign: int) -> int | None:
    """The x with that sign bit for y (mod p), or None when y is not on the curve.

    x = 0 with the sign bit set gives 0, as noble's lenient decoder does (``mod(-0)``).
    """
    y2 = y * y % P
    u, v = (y2 - 1) % P, (_D * y2 + 1) % P
    x2 = u * pow(v, P - 2, P) % P
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * _SQRT_M1 % P
        if (x * x - x2) % P:
            return None
    if x & 1 != sign:
        x = -x % P
    return x


_B: _Point = _affine(_recover_x(_BY, 0) or 0, _BY)


def _decode_lenient(encoded: bytes) -> _Point | None:
    """noble/ed25519 2.0.0 ``Point.fromHex(bytes, false)``: any 255-bit y."""
    n = int.from_bytes(encoded, "little")
    y = (n & _Y_MASK) % P
    x = _recover_x(y, n >> 255)
    return None if x is None else _affine(x, y)


def _encode_as_reference(p: _Point) -> bytes:
    """noble's ``toRawBytes``: canonical, except that the identity is 32 zero bytes."""
    if _is_identity(p):
        return bytes(32)
    x, y, z, _ = p
    zi = pow(z, P - 2, P)
    x, y = x * zi % P, y * zi % P
    return (y | (x & 1) << 255).to_bytes(32, "little")


def _double_scalar_mul(s: int, k: int, a: _Point) -> _Point:
    """[s]B + [k]A, one shared ladder (Straus)."""
    both = _add(_B, a)
    acc = _IDENTITY
    for bit in range(max(s.bit_length(), k.bit_length()) - 1, -1, -1):
        acc = _double(acc)
        sb, kb = s >> bit & 1, k >> bit & 1
        if sb and kb:
            acc = _add(acc, both)
        elif sb:
            acc = _add(acc, _B)
        elif kb:
            acc = _add(acc, a)
    return acc


def reference_outcome(public_key: bytes, signature: bytes, message: bytes) -> tuple[Outcome, str]:
    """The reference's verdict by its own rule, in pure Python (~1.9 ms: the rule's statement,
    which the tests hold :func:`_sodium_outcome` to).

    Returns the outcome and, for ``THROW``, noble's error message (else "").
    """
    if len(signature) != 64 or len(public_key) != 32:
        return Outcome.THROW, THROW_LENGTH
    a = _decode_lenient(public_key)
    if a is None:
        return Outcome.THROW, THROW_BAD_Y
    r = _decode_lenient(signature[:32])
    if r is None:
        return Outcome.THROW, THROW_BAD_Y
    s = int.from_bytes(signature[32:], "little")
    if s >= L:
        return Outcome.THROW, THROW_SCALAR
    digest = hashlib.sha512(_encode_as_reference(r) + _encode_as_reference(a) + message).digest()
    k = int.from_bytes(digest, "little") % L
    # [8]([S]B − R − [k]A) = identity, computed as [8]([S]B + [k](−A) − R).
    x = _add(_double_scalar_mul(s, k, _negate(a)), _negate(r))
    x = _double(_double(_double(x)))
    return (Outcome.ACCEPT if _is_identity(x) else Outcome.REFUSE), ""


def _is_plain(encoded: bytes) -> bool:
    y = int.from_bytes(encoded, "little") & _Y_MASK
    return y < P and y != 1 and y != P - 1


@functools.lru_cache(maxsize=4096)
def _key_in_prime_subgroup(public_key: bytes) -> bool:
    # A key signs many messages: one scalar multiplication per key, not per refusal.
    return bool(nacl.bindings.crypto_core_ed25519_is_valid_point(public_key))


def outcome(public_key: bytes, signature: bytes, message: bytes) -> tuple[Outcome, str]:
    """What the reference does with this signature: libsodium where that is provably the same
    answer (see the module docstring), the reference's rule on libsodium's group operations elsewhere.
    """
    if (
        len(signature) == 64
        and len(public_key) == 32
        and int.from_bytes(signature[32:], "little") < L
        and _is_plain(public_key)
        and _is_plain(signature[:32])
    ):
        try:
            nacl.bindings.crypto_sign_open(signature + message, public_key)
        except BadSignatureError:
            if _key_in_prime_subgroup(public_key) and nacl.bindings.crypto_core_ed25519_is_valid_point(
                signature[:32]
            ):
                return Outcome.REFUSE, ""
        else:
            return Outcome.ACCEPT, ""
    return _sodium_outcome(public_key, signature, message)


#: libsodium's encoding of the identity (noble hashes it as 32 zero bytes instead).
_SODIUM_IDENTITY: Final = (1).to_bytes(32, "little")
_L_INVERSE_MOD_8: Final = pow(L, -1, 8)


def _canonical(encoded: bytes) -> bytes | None:
    """The canonical encoding of the point noble's lenient decoder reads from these 32 bytes,
    None when it throws ("bad y coordinate"): y reduced mod p, the sign dropped where x = 0."""
    n = int.from_bytes(encoded, "little")
    y = (n & _Y_MASK) % P
    sign = 0 if y in (1, P - 1) else n >> 255
    try:  # libsodium decodes the canonical form and encodes the point it finds
        return nacl.bindings.crypto_core_ed25519_add((y | sign << 255).to_bytes(32, "little"), _SODIUM_IDENTITY)
    except nacl.exceptions.RuntimeError:  # y has no x: not on the curve
        return None


def _reference_bytes(canonical: bytes) -> bytes:
    """How noble encodes a point for k: canonically, the identity as 32 zero bytes."""
    return bytes(32) if canonical == _SODIUM_IDENTITY else canonical


@functools.lru_cache(maxsize=4096)
def _key_terms(public_key: bytes) -> tuple[bytes, bytes] | None:
    """A as noble hashes it, and [8]A (libsodium's encoding); None when A throws. Per key."""
    a = _canonical(public_key)
    if a is None:
        return None
    a8 = a
    for _ in range(3):
        a8 = nacl.bindings.crypto_core_ed25519_add(a8, a8)
    return _reference_bytes(a), a8


@functools.cache
def _torsion() -> frozenset[bytes]:
    """libsodium's encodings of the eight points X with [8]X = identity."""
    y = 2
    while True:  # [L]Q of the first point Q on the curve whose [L]Q has order 8
        x = _recover_x(y, 0)
        if x is not None:
            t = _double_scalar_mul(0, L, _affine(x, y))
            if not _is_identity(_double(_double(t))):
                break
        y += 1
    first = _encode_as_reference(t)
    points, point = {_SODIUM_IDENTITY}, first
    while point != _SODIUM_IDENTITY:
        points.add(point)
        point = nacl.bindings.crypto_core_ed25519_add(point, first)
    assert len(points) == 8
    return frozenset(points)


def _sodium_outcome(public_key: bytes, signature: bytes, message: bytes) -> tuple[Outcome, str]:
    """:func:`reference_outcome`'s verdict, with libsodium's group operations (the module
    docstring's slow path): the same checks in the same order, the same throws."""
    if len(signature) != 64 or len(public_key) != 32:
        return Outcome.THROW, THROW_LENGTH
    terms = _key_terms(public_key)
    if terms is None:
        return Outcome.THROW, THROW_BAD_Y
    a_bytes, a8 = terms
    r = signature[:32]
    s = int.from_bytes(signature[32:], "little")
    if s >= L or not _is_plain(r):
        canonical = _canonical(r)  # noble decodes R before it reads S
        if canonical is None:
            return Outcome.THROW, THROW_BAD_Y
        r = canonical
        if s >= L:
            return Outcome.THROW, THROW_SCALAR
    # A plain R is its own canonical encoding when it decodes; the subtraction below finds out.
    k = int.from_bytes(hashlib.sha512(_reference_bytes(r) + a_bytes + message).digest(), "little") % L
    k8 = (k + L * (-k * _L_INVERSE_MOD_8 % 8)) // 8  # [k8]([8]A) = [k']A, k' ≡ k (mod L)
    sb = nacl.bindings.crypto_scalarmult_ed25519_base_noclamp(s.to_bytes(32, "little")) if s else _SODIUM_IDENTITY
    ka = (
        nacl.bindings.crypto_scalarmult_ed25519_noclamp(k8.to_bytes(32, "little"), a8)
        if k8 and a8 != _SODIUM_IDENTITY
        else _SODIUM_IDENTITY
    )
    try:
        x = nacl.bindings.crypto_core_ed25519_sub(nacl.bindings.crypto_core_ed25519_sub(sb, ka), r)
    except nacl.exceptions.RuntimeError:  # only R can be off the curve here
        return Outcome.THROW, THROW_BAD_Y
    return (Outcome.ACCEPT if x in _torsion() else Outcome.REFUSE), ""


def verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when the reference DWN accepts the signature (it refuses or throws otherwise)."""
    return outcome(public_key, signature, message)[0] is Outcome.ACCEPT


class Ahead:
    """Acceptances found ahead of the engine's turn, on another core (issue #17).

    A sink that has received a batch of messages verifies their signatures on a worker thread
    (libsodium releases the GIL) while the engine applies the messages before them:
    :meth:`verify` runs :func:`outcome` itself and keeps an acceptance, keyed by exactly the
    bytes verified (key, signature, signing input), so no other message can take it. The engine
    asks :func:`engine_outcome`, which takes a kept acceptance of exactly its bytes once and
    otherwise verifies inline as it always did: a refusal, a throw, a verdict not reached yet
    (or being reached while the engine verifies), or one evicted, all end in :func:`outcome` on
    the engine's own thread. Only acceptances are kept: a refusal's detail, and what a forged
    message costs, stay the engine's. What the engine verified inline first is noted, so the
    worker, arriving late, does not verify it again.

    Bounded (``capacity`` acceptances and as many notes, the oldest dropped first) and safe
    across threads.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._accepted: dict[tuple[bytes, bytes, bytes], None] = {}
        self._inline: dict[tuple[bytes, bytes, bytes], None] = {}  # verified by the engine first
        self._lock = threading.Lock()
        #: acceptances kept, taken by the engine, dropped unused; verifies the worker skipped
        #: because the engine had done them (for tests and the bench)
        self.kept = 0
        self.taken = 0
        self.dropped = 0
        self.late = 0
        #: engine verifies that found no acceptance (and verified inline)
        self.missed = 0
        #: messages handed to a worker and not verified yet (:meth:`expect`); while there are
        #: none, the engine's own verifies are not noted
        self.pending = 0

    def expect(self, n: int) -> None:
        """``n`` more (or, negative, fewer) messages are on their way to :meth:`verify`."""
        with self._lock:
            self.pending += n

    def verify(self, public_key: bytes, signature: bytes, message: bytes) -> Outcome | None:
        """:func:`outcome` of these bytes (on any thread), an acceptance kept for the engine;
        None when the engine verified them already (nothing is done)."""
        key = (public_key, signature, message)
        with self._lock:
            if self._inline.pop(key, True) is None:
                self.late += 1
                return None
        verdict = outcome(public_key, signature, message)[0]
        if verdict is Outcome.ACCEPT:
            with self._lock:
                self._accepted[key] = None
                self.kept += 1
                self.dropped += _bound(self._accepted, self.capacity)
        return verdict

    def accept(self, found: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        """Keep acceptances :func:`outcome` reached for these exact bytes elsewhere (a worker
        process running this very function, :class:`p2psync.dwn.ahead.SignatureProcess`); those
        the engine verified first are only counted late."""
        with self._lock:
            for key in found:
                if self._inline.pop(key, True) is None:
                    self.late += 1
                    continue
                self._accepted[key] = None
                self.kept += 1
            self.dropped += _bound(self._accepted, self.capacity)

    def take(self, public_key: bytes, signature: bytes, message: bytes) -> bool:
        """Whether an acceptance of exactly these bytes was kept (it is used up). When none
        was, the caller verifies them itself: noted, so that the worker does not."""
        if not self._accepted and not self.pending:
            self.missed += 1  # nothing kept, nothing coming (the engine alone: no lock taken)
            return False
        key = (public_key, signature, message)
        with self._lock:
            if self._accepted.pop(key, True) is None:
                self.taken += 1
                return True
            self.missed += 1
            if self.pending > 0:
                self._inline[key] = None
                _bound(self._inline, self.capacity)
        return False

    def clear(self) -> None:
        """Forget every acceptance and note, and zero the counts (tests)."""
        with self._lock:
            self._accepted.clear()
            self._inline.clear()
            self.kept = self.taken = self.dropped = self.late = self.missed = 0


def _bound(entries: dict[tuple[bytes, bytes, bytes], None], capacity: int) -> int:
    """Drop the oldest entries past ``capacity``; returns how many."""
    dropped = 0
    while len(entries) > capacity:
        del entries[next(iter(entries))]
        dropped += 1
    return dropped


#: Acceptances (and notes of signatures the engine verified first) kept at most: twice the
#: messages a worker may have queued (ahead.MAX_PENDING), so none is dropped before its use;
#: ~0.7 KB each for a 1 KiB record's signature, ~1.4 MB at most. Ours.
AHEAD_CAPACITY: Final = 2048
#: The one memo the engine consults (per process: keyed by exact bytes, any peer may fill it).
AHEAD: Final = Ahead(AHEAD_CAPACITY)


def engine_outcome(public_key: bytes, signature: bytes, message: bytes) -> tuple[Outcome, str]:
    """The engine's verdict: an acceptance :data:`AHEAD` kept for exactly these bytes, else
    :func:`outcome` inline."""
    if AHEAD.take(public_key, signature, message):
        return Outcome.ACCEPT, ""
    return outcome(public_key, signature, message)


@functools.lru_cache(maxsize=4096)
def did_key_point_is_valid(public_key: bytes) -> bool:
    """Whether a ``did:key``'s Ed25519 key resolves in the reference (``@web5/crypto``
    ``Ed25519.validatePublicKey``: ``@noble/curves`` strict ``fromHex`` + ``assertValidity``).

    Strict decoding refuses y ≥ p and x = 0 with the sign bit set; ``assertValidity`` refuses
    the identity. Other small-order and mixed-order points pass.
    """
    if len(public_key) != 32:
        return False
    n = int.from_bytes(public_key, "little")
    y = n & _Y_MASK
    if y >= P:
        return False
    x = _recover_x(y, n >> 255)
    if x is None or (x == 0 and n >> 255):
        return False
    return not (x == 0 and y == 1)
