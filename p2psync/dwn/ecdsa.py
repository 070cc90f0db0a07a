"""ECDSA signatures as the reference DWN verifies them: ``secp256k1`` (ES256K) and ``P-256`` (ES256).

The reference picks the algorithm by the JWK's ``crv`` (``signatureAlgorithms``), hashes the
signing input with SHA-256 and verifies with two different libraries, which read keys and
signatures differently. What each accepts, mirrored here (the arithmetic itself is OpenSSL's,
through ``cryptography``; ECDSA verification is the same equation in all three):

``secp256k1`` (dwn-sdk-js ``Secp256k1.verify``, ``@noble/secp256k1`` 2.0.0, ``lowS: false``)
    The JWK's ``x`` and ``y`` are compressed into ``02|03 ‖ x`` by the parity of ``y`` alone,
    then decompressed: the key is the curve point with that ``x`` and that parity, whatever
    ``y`` was otherwise (off the curve, ≥ p, empty). ``0 < x < p`` and ``x³ + 7`` a square.
    The signature must be 64 bytes (``r ‖ s``, compact) with ``0 < r, s < n``; a high ``s``
    is accepted.

``P-256`` (dwn-sdk-js ``Secp256r1.verify``, ``@noble/curves`` 1.4.2, ``lowS: false``)
    ``(x, y)`` must be a point of the curve as given (``0 ≤ x, y < p``, not both 0). A
    64-byte signature is compact ``r ‖ s``; any other length is DER, read by noble's parser
    (short-form lengths only, minimal positive integers, nothing after them); ``0 < r, s < n``.

Anything else the reference refuses (``false``) or throws on; both end in the handlers' 401,
so :func:`outcome` tells only whether it accepts, and why not.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from p2psync.dwn.encoding import b64url_decode_jwk
from p2psync.dwn.errors import DwnError

SECP256K1: Final = "secp256k1"
P256: Final = "P-256"
CURVES: Final = (SECP256K1, P256)


@dataclass(frozen=True)
class _Curve:
    p: int
    n: int
    a: int
    b: int
    ec_curve: ec.EllipticCurve


_CURVE: Final[dict[str, _Curve]] = {
    SECP256K1: _Curve(
        p=2**256 - 2**32 - 977,
        n=0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141,
        a=0,
        b=7,
        ec_curve=ec.SECP256K1(),
    ),
    P256: _Curve(
        p=2**256 - 2**224 + 2**192 + 2**96 - 1,
        n=0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551,
        a=-3,
        b=0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B,
        ec_curve=ec.SECP256R1(),
    ),
}


@dataclass(frozen=True)
class EcKey:
    """An EC public key as the reference's verifier for its ``crv`` reads the JWK: ``key`` is
    None when every signature by it is refused (``why`` says what the reference trips on)."""

    crv: str
    key: ec.EllipticCurvePublicKey | None
    why: str = ""


def _on_curve(curve: _Curve, x: int, y: int) -> bool:
    return (y * y - (x * x * x + curve.a * x + curve.b)) % curve.p == 0


def decompress(crv: str, x: int, odd: bool) -> int | None:
    """The ``y`` of the point with ``x`` and that parity, or None when ``x`` is not the
    abscissa of a point (``0 < x < p`` required). Both curves have p ≡ 3 (mod 4)."""
    curve = _CURVE[crv]
    if not 0 < x < curve.p:
        return None
    rhs = (x * x * x + curve.a * x + curve.b) % curve.p
    y = pow(rhs, (curve.p + 1) // 4, curve.p)
    if y * y % curve.p != rhs:
        return None
    return curve.p - y if (y & 1) != odd else y


def _coordinate(name: str, text: str | None) -> bytes | str:
    """A JWK coordinate's bytes as the reference decodes them (:func:`b64url_decode_jwk`), or
    why the reference throws instead: a member that is absent, not text or not base64url."""
    if text is None:
        return f"invalid EC public key: `{name}` is not base64url text"
    try:
        return b64url_decode_jwk(text)
    except (DwnError, ValueError):
        return f"invalid EC public key: `{name}` is not base64url"


def key_from_jwk(jwk: dict[str, Any]) -> EcKey:
    """The key the reference verifies with for ``jwk``, whose ``crv`` is one of :data:`CURVES`.
    Never raises: a key the reference cannot use comes back with ``key`` None."""
    def text(name: str) -> str | None:
        value = jwk.get(name)
        return value if isinstance(value, str) else None

    return _key(str(jwk["crv"]), text("kty"), text("x"), text("y"))


@functools.lru_cache(maxsize=4096)
def _key(crv: str, kty: str | None, x: str | None, y: str | None) -> EcKey:
    if kty != "EC":
        return EcKey(crv, None, f"invalid {crv} JWK: `kty` MUST be `EC`")
    x_bytes, y_bytes = _coordinate("x", x), _coordinate("y", y)
    if isinstance(x_bytes, str):
        return EcKey(crv, None, x_bytes)
    if isinstance(y_bytes, str):
        return EcKey(crv, None, y_bytes)
    curve = _CURVE[crv]
    if crv == SECP256K1:
        # Compressed by y's parity, then decompressed: only x and the parity of y count.
        x_int = int.from_bytes(x_bytes, "big")
        odd = bool(y_bytes) and bool(y_bytes[-1] & 1)
        if x_int >= 2**256:
            return EcKey(crv, None, "bigint expected")
        y_int = decompress(crv, x_int, odd)
        if y_int is None:
            return EcKey(crv, None, "Point is not on curve")
    else:
        # noble reads `BigInt('0x' + hex)`: empty bytes are a SyntaxError, not zero.
        if not x_bytes or not y_bytes:
            return EcKey(crv, None, "Cannot convert 0x to a BigInt")
        x_int, y_int = int.from_bytes(x_bytes, "big"), int.from_bytes(y_bytes, "big")
        if not (x_int < curve.p and y_int < curve.p):
            return EcKey(crv, None, "invalid affine point")
        if x_int == 0 and y_int == 0:
            return EcKey(crv, None, "bad point: ZERO")
        if not _on_curve(curve, x_int, y_int):
            return EcKey(crv, None, "bad point: equation left != right")
    try:
        public = ec.EllipticCurvePublicNumbers(x_int, y_int, curve.ec_curve).public_key()
    except ValueError as exc:  # pragma: no cover - checked above: on the curve, in range
        return EcKey(crv, None, str(exc))
    return EcKey(crv, public)


class _DerError(ValueError):
    pass


def _der_int(data: bytes) -> tuple[int, bytes]:
    """One INTEGER as noble's ``DER._parseInt`` reads it: (value, what follows)."""
    if len(data) < 2 or data[0] != 0x02:
        raise _DerError("Invalid signature integer tag")
    length = data[1]
    body = data[2 : 2 + length]
    if not length or len(body) != length:
        raise _DerError("Invalid signature integer: wrong length")
    if body[0] & 0x80:
        raise _DerError("Invalid signature integer: negative")
    if body[0] == 0 and not (len(body) > 1 and body[1] & 0x80):
        raise _DerError("Invalid signature integer: unnecessary leading zero")
    return int.from_bytes(body, "big"), data[2 + length :]


def der_signature(data: bytes) -> tuple[int, int]:
    """(r, s) of a DER signature as noble's ``DER.toSig`` reads it; ``ValueError`` otherwise."""
    if len(data) < 2 or data[0] != 0x30:
        raise _DerError("Invalid signature tag")
    if data[1] != len(data) - 2:
        raise _DerError("Invalid signature: incorrect length")
    r, rest = _der_int(data[2:])
    s, rest = _der_int(rest)
    if rest:
        raise _DerError("Invalid signature: left bytes after parsing")
    return r, s


def _signature(crv: str, signature: bytes) -> tuple[int, int]:
    """(r, s) as the reference reads a signature for ``crv``; ``ValueError`` when it refuses."""
    if len(signature) == 64:
        r, s = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    elif crv == SECP256K1:
        raise ValueError("signature must be 64 bytes")
    else:
        r, s = der_signature(signature)
    n = _CURVE[crv].n
    if not 0 < r < n:
        raise ValueError("r must be 0 < r < CURVE.n")
    if not 0 < s < n:
        raise ValueError("s must be 0 < s < CURVE.n")
    return r, s


def outcome(key: EcKey, signature: bytes, message: bytes) -> tuple[bool, str]:
    """(whether the reference accepts ``signature`` over ``message`` by ``key``, why not)."""
    if key.key is None:
        return False, key.why
    try:
        r, s = _signature(key.crv, signature)
    except ValueError as exc:
        return False, str(exc)
    try:
        key.key.verify(encode_dss_signature(r, s), message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False, ""
    return True, ""


def sign(private_key: ec.EllipticCurvePrivateKey, crv: str, message: bytes) -> bytes:
    """A compact ``r ‖ s`` signature over SHA-256(``message``) as the reference's libraries
    sign: the nonce of RFC 6979 (so a message signs the same every time), and on secp256k1
    ``s`` in the low half (noble's default there; both verifiers take either half)."""
    r, s = decode_dss_signature(private_key.sign(message, ec.ECDSA(hashes.SHA256(), deterministic_signing=True)))
    n = _CURVE[crv].n
    if crv == SECP256K1 and s > n // 2:
        s = n - s
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def curve_of(private_key: ec.EllipticCurvePrivateKey) -> str:
    """The JWK ``crv`` of an EC private key of one of the two curves."""
    name = private_key.curve.name
    if name == "secp256k1":
        return SECP256K1
    if name == "secp256r1":
        return P256
    raise ValueError(f"unsupported curve {name} (secp256k1 or P-256)")
