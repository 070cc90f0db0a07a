"""Edge-case Ed25519 vectors, built with a small affine Edwards arithmetic of our own.

Independent of :mod:`p2psync.dwn.ed25519` on purpose (affine formulas, not extended ones), so
a slip in one shows up against the other and against the reference. Slow and fine for tests.

A vector is ``Vector(name, public_key, signature, message)``; ``build_vectors(message_for)``
makes the whole set, with ``message_for(public_key)`` giving the bytes to sign (a fixed message,
or a JWS signing input whose ``kid`` names the key).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, -1, P) % P
I_SQRT = pow(2, (P - 1) // 4, P)

Affine = tuple[int, int]
IDENT: Affine = (0, 1)


def inv(v: int) -> int:
    return pow(v, P - 2, P)


def add(p: Affine, q: Affine) -> Affine:
    (x1, y1), (x2, y2) = p, q
    t = D * x1 * x2 * y1 * y2 % P
    return ((x1 * y2 + y1 * x2) * inv(1 + t) % P, (y1 * y2 + x1 * x2) * inv(1 - t) % P)


def neg(p: Affine) -> Affine:
    return (-p[0] % P, p[1])


def mul(n: int, p: Affine) -> Affine:
    acc, base = IDENT, p
    while n:
        if n & 1:
            acc = add(acc, base)
        base = add(base, base)
        n >>= 1
    return acc


def x_for(y: int, sign: int) -> int | None:
    """x with the given parity for y, None when y is not on the curve."""
    y %= P
    x2 = (y * y - 1) * inv(D * y * y + 1) % P
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * I_SQRT % P
    if (x * x - x2) % P:
        return None
    return (-x % P) if (x & 1) != sign else x


BASE: Affine = (x_for(4 * inv(5) % P, 0) or 0, 4 * inv(5) % P)


def enc(p: Affine, *, y_plus_p: bool = False, sign: int | None = None) -> bytes:
    """Canonical encoding, or a non-canonical one: y + p (when it fits) or a forced sign bit."""
    x, y = p
    if y_plus_p:
        y += P
        assert y < 2**255, "y + p does not fit in 255 bits"
    bit = (x & 1) if sign is None else sign
    return (y | bit << 255).to_bytes(32, "little")


def enc_as_noble(p: Affine) -> bytes:
    """How noble/ed25519 2.0.0 re-encodes a point: the identity as 32 zero bytes."""
    return bytes(32) if p == IDENT else enc(p)


def h(*parts: bytes) -> int:
    return int.from_bytes(hashlib.sha512(b"".join(parts)).digest(), "little") % L


def secret(seed: int) -> tuple[int, int]:
    """A deterministic (scalar a, nonce r) pair."""
    d = hashlib.sha512(b"p2psync ed25519 vectors %d" % seed).digest()
    return int.from_bytes(d[:32], "little") % L, int.from_bytes(d[32:], "little") % L


def _order8_point() -> Affine:
    # [L]Q lies in the torsion group; take a y whose torsion part has order exactly 8.
    y = 2
    while True:
        x = x_for(y, 0)
        if x is not None:
            t = mul(L, (x, y))
            if mul(4, t) != IDENT:
                return t
        y += 1


T8 = _order8_point()
TORSION: list[Affine] = [mul(i, T8) for i in range(8)]  # TORSION[0] is the identity


@dataclass(frozen=True)
class Vector:
    name: str
    public_key: bytes
    signature: bytes
    message: bytes


def s_bytes(s: int) -> bytes:
    return s.to_bytes(32, "little")


def not_on_curve_y() -> int:
    y = 2
    while x_for(y, 0) is not None:
        y += 1
    return y


def build_vectors(message_for: Callable[[bytes], bytes]) -> list[Vector]:
    out: list[Vector] = []

    def add_vec(name: str, pub: bytes, sig: bytes, msg: bytes | None = None) -> None:
        out.append(Vector(name, pub, sig, message_for(pub) if msg is None else msg))

    def sign(a: int, pub: bytes, r_pt: Affine, r_bytes: bytes, r: int, *, k_over: bytes | None = None) -> bytes:
        """S = r + k·a with k over ``k_over`` (default: the bytes sent) ‖ pub ‖ M."""
        k = h(r_bytes if k_over is None else k_over, pub, message_for(pub))
        return r_bytes + s_bytes((r + k * a) % L)

    # Honest signatures, and the same with S + L, S = 0 and mangled bytes.
    for seed in range(3):
        a, r = secret(seed)
        pub = enc(mul(a, BASE))
        r_pt = mul(r, BASE)
        sig = sign(a, pub, r_pt, enc(r_pt), r)
        add_vec(f"honest-{seed}", pub, sig)
        if seed == 0:
            s = int.from_bytes(sig[32:], "little")
            add_vec("s-plus-l", pub, sig[:32] + s_bytes(s + L))
            add_vec("s-equals-l", pub, sig[:32] + s_bytes(L))
            add_vec("s-all-ones", pub, sig[:32] + b"\xff" * 32)
            add_vec("s-zero-honest-key", pub, sig[:32] + bytes(32))
            for i in (0, 5, 31, 32, 40, 63):
                mangled = bytearray(sig)
                mangled[i] ^= 0x01
                add_vec(f"mangled-sig-byte-{i}", pub, bytes(mangled))
            top = bytearray(sig)
            top[63] ^= 0x80
            add_vec("mangled-s-top-bit", pub, bytes(top))
            for i in (0, 31):
                mangled_pub = bytearray(pub)
                mangled_pub[i] ^= 0x01
                add_vec(f"mangled-key-byte-{i}", bytes(mangled_pub), sig)
            add_vec("mangled-message", pub, sig, message_for(pub) + b"x")
            add_vec("sig-63-bytes", pub, sig[:63])
            add_vec("sig-65-bytes", pub, sig + b"\0")
            add_vec("sig-empty", pub, b"")
            add_vec("key-31-bytes", pub[:31], sig)
            add_vec("key-33-bytes", pub + b"\0", sig)
            bad_y = not_on_curve_y()
            add_vec("key-not-on-curve", bad_y.to_bytes(32, "little"), sig)
            add_vec("r-not-on-curve", pub, bad_y.to_bytes(32, "little") + sig[32:])
            # R with the sign bit flipped: the negated point, an honest-looking forgery.
            flipped = bytearray(sig)
            flipped[31] ^= 0x80
            add_vec("r-sign-flipped", pub, bytes(flipped))

    a, r = secret(10)
    honest = mul(a, BASE)
    honest_pub = enc(honest)
    r_pt = mul(r, BASE)

    # Small-order keys: [8]([S]B − R − [k]A) = [8]([r]B − R) = identity for any k.
    for i, t in enumerate(TORSION):
        encodings = [("", enc(t))]
        if t[1] in (0, 1):  # y + p fits in 255 bits only for tiny y
            encodings += [("-y-plus-p", enc(t, y_plus_p=True)), ("-y-plus-p-signed", enc(t, y_plus_p=True, sign=1))]
        if t[0] == 0:
            encodings.append(("-x0-signed", enc(t, sign=1)))
        for suffix, pub in encodings:
            add_vec(f"key-torsion-{i}{suffix}", pub, enc(r_pt) + s_bytes(r))
    add_vec("key-identity-s-zero-r-identity", enc(IDENT), enc(IDENT) + bytes(32))
    add_vec("key-order2-s-zero-r-order4", enc(TORSION[4]), enc(TORSION[2]) + bytes(32))

    # Small-order R with an honest key: S = k·a, so [S]B − [k]A = identity and X = −R.
    for i, t in enumerate(TORSION):
        add_vec(f"r-torsion-{i}", honest_pub, sign(a, honest_pub, t, enc(t), 0))
    # The identity R: RFC 8032 hashes its bytes 01 00…; noble hashes its re-encoding, 00 00….
    ident = enc(IDENT)
    add_vec("r-identity-k-over-sent-bytes", honest_pub, sign(a, honest_pub, IDENT, ident, 0))
    add_vec(
        "r-identity-k-over-noble-bytes", honest_pub, sign(a, honest_pub, IDENT, ident, 0, k_over=enc_as_noble(IDENT))
    )
    # Non-canonical small-order R, k over the bytes sent vs over the canonical re-encoding.
    for label, t, kwargs in (
        ("identity-y-plus-p", IDENT, {"y_plus_p": True}),
        ("identity-x0-signed", IDENT, {"sign": 1}),
        ("order2-x0-signed", TORSION[4], {"sign": 1}),
        ("order4-y-plus-p", TORSION[2], {"y_plus_p": True}),
        ("order4-y-plus-p-signed", TORSION[6], {"y_plus_p": True}),
    ):
        sent = enc(t, **kwargs)
        add_vec(f"r-{label}-k-over-sent-bytes", honest_pub, sign(a, honest_pub, t, sent, 0))
        add_vec(
            f"r-{label}-k-over-reencoded", honest_pub, sign(a, honest_pub, t, sent, 0, k_over=enc_as_noble(t))
        )
    # S = 0 with small-order R and an honest key: valid only if k·a ≡ 0, which it is not.
    add_vec("s-zero-r-identity-honest-key", honest_pub, enc(IDENT) + bytes(32))

    # Mixed-order keys A = [a]B + T: cofactorless holds only when k·T = identity (k ≡ 0 mod the order).
    for i in (1, 2, 4):
        mixed = add(honest, TORSION[i])
        pub = enc(mixed)
        order = 8 // math.gcd(i, 8)  # of TORSION[i]
        killed = kept = 0
        for n in range(256):
            msg = message_for(pub) + b"#%d" % n
            k = h(enc(r_pt), pub, msg)
            sig = enc(r_pt) + s_bytes((r + k * a) % L)
            # Cofactorless [S]B = R + [k]A holds only when [k]T is the identity.
            if k % order == 0 and not killed:
                killed += 1
                add_vec(f"key-mixed-order-{order}-k-kills-torsion", pub, sig, msg)
            elif k % order and kept < 2:
                kept += 1
                add_vec(f"key-mixed-order-{order}-cofactored-only-{kept}", pub, sig, msg)
            if killed and kept == 2:
                break
    # Mixed-order R = [r]B + T with an honest key: a cofactored-only signature.
    for i in (1, 4):
        mixed_r = add(r_pt, TORSION[i])
        add_vec(f"r-mixed-order-{i}", honest_pub, sign(a, honest_pub, mixed_r, enc(mixed_r), r))
    return out
