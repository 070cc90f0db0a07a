"""Identities for ``did:key`` and ``did:jwk``, resolved offline.

Both methods carry the public key inside the DID itself, so resolution is pure computation:
``did:key:z6Mk…`` is base58btc(multicodec ed25519-pub ‖ key) and ``did:key:zQ3s…``
base58btc(multicodec secp256k1-pub ‖ compressed key), the two key types the reference's
resolver validates; its one verification method is ``<did>#<multibase key>``.
``did:jwk:<base64url JSON JWK>`` has one method ``<did>#0`` with any JWK: the reference
verifies Ed25519, secp256k1 and P-256 keys (:mod:`p2psync.dwn.ecdsa`), by the JWK's ``crv``.

An :class:`Identity` signs with Ed25519 (the default, and what peers prove their hellos with)
or ECDSA on secp256k1 or P-256.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from p2psync.dwn import ecdsa, schemas
from p2psync.dwn.ed25519 import did_key_point_is_valid
from p2psync.dwn.encoding import b64url_decode, b64url_decode_jwk, b64url_encode, json_compact
from p2psync.dwn.errors import DwnError

_ED25519_PUB_MULTICODEC = b"\xed\x01"
_SECP256K1_PUB_MULTICODEC = b"\xe7\x01"  # varint 0xe7
_DID_KEY_MULTICODECS: Final = {"Ed25519": _ED25519_PUB_MULTICODEC, "secp256k1": _SECP256K1_PUB_MULTICODEC}
_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58_ALPHABET)}


def _b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(_B58_ALPHABET[r])
    pad = len(data) - len(data.lstrip(b"\0"))
    return "1" * pad + "".join(reversed(out))


def _b58decode(text: str) -> bytes:
    n = 0
    for ch in text:
        if ch not in _B58_INDEX:
            raise ValueError(f"not base58btc: {ch!r}")
        n = n * 58 + _B58_INDEX[ch]
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    pad = len(text) - len(text.lstrip("1"))
    return b"\0" * pad + body


@dataclass(frozen=True)
class VerificationMethod:
    """One verification method of a resolved DID document."""

    id: str
    public_jwk: Any


def public_jwk(public_key: bytes) -> dict[str, str]:
    """The JWK of an Ed25519 public key, in the members and order the reference writes."""
    return {"crv": "Ed25519", "kty": "OKP", "x": b64url_encode(public_key)}


def ec_public_jwk(crv: str, x: int, y: int) -> dict[str, str]:
    """The JWK of an EC public key (``crv`` secp256k1 or P-256)."""
    return {"crv": crv, "kty": "EC", "x": b64url_encode(x.to_bytes(32, "big")),
            "y": b64url_encode(y.to_bytes(32, "big"))}


def _did_key_method(did: str, ident: str, raw: bytes) -> VerificationMethod | None:
    """The verification method of a did:key's decoded multicodec key, or None where the
    reference's resolver (``@web5/dids`` 1.2.0) resolves no document for it: another key
    type (a P-256 did:key among them), a wrong length, or a key it finds invalid."""
    if len(raw) == 34 and raw[:2] == _ED25519_PUB_MULTICODEC:
        # ``Ed25519.validatePublicKey``: no document for y >= p, x = 0 with the sign bit, a
        # non-point or the identity.
        if not did_key_point_is_valid(raw[2:]):
            return None
        return VerificationMethod(f"{did}#{ident}", public_jwk(raw[2:]))
    if len(raw) == 35 and raw[:2] == _SECP256K1_PUB_MULTICODEC and raw[2] in (2, 3):
        # ``Secp256k1.validatePublicKey``: a compressed point, 0 < x < p on the curve.
        x = int.from_bytes(raw[3:], "big")
        y = ecdsa.decompress(ecdsa.SECP256K1, x, raw[2] == 3)
        if y is None:
            return None
        return VerificationMethod(f"{did}#{ident}", ec_public_jwk(ecdsa.SECP256K1, x, y))
    return None


@functools.lru_cache(maxsize=4096)
def resolve(did: str) -> tuple[VerificationMethod, ...]:
    """Verification methods of a ``did:key`` or ``did:jwk`` DID; empty when unresolvable.

    An unresolvable DID is not an exception here: the caller turns "no key for this kid"
    into the 401 the reference answers.
    """
    if did.startswith("did:key:"):
        ident = did[len("did:key:") :]
        if not ident.startswith("z"):
            return ()
        try:
            raw = _b58decode(ident[1:])
        except ValueError:
            return ()
        method = _did_key_method(did, ident, raw)
        return () if method is None else (method,)
    if did.startswith("did:jwk:"):
        ident = did[len("did:jwk:") :]
        try:
            jwk = json.loads(b64url_decode(ident).decode("utf-8"))
        except (DwnError, UnicodeDecodeError, ValueError):
            return ()
        return (VerificationMethod(f"{did}#0", jwk),)
    return ()


#: What a kid names: an Ed25519 key's 32 bytes, or an EC key as the reference reads its JWK.
PublicKey = bytes | ecdsa.EcKey


@functools.lru_cache(maxsize=4096)
def verification_key(kid: str) -> PublicKey:
    """The public key ``kid`` names — raw Ed25519 bytes (32) or an :class:`ecdsa.EcKey` — or
    401 as the reference refuses it (``GeneralJwsVerifier.getPublicKey``, then the algorithm
    the JWK's ``crv`` picks).

    The Ed25519 bytes are not checked to be a point: the reference's verifier decides that
    (:mod:`p2psync.dwn.ed25519`), as it decides an EC key's use (:mod:`p2psync.dwn.ecdsa`).

    Cached: a did:key or did:jwk document is a function of the DID, so a kid's key never changes.
    """
    did = kid.split("#", 1)[0]
    method = next((m for m in resolve(did) if kid.endswith(m.id)), None)
    if method is None:
        raise DwnError(
            "GeneralJwsVerifierGetPublicKeyNotFound",
            "public key needed to verify signature not found in DID Document",
            401,
        )
    document_method = {
        "id": method.id,
        "type": "JsonWebKey" if did.startswith("did:jwk:") else "JsonWebKey2020",
        "controller": did,
        "publicKeyJwk": method.public_jwk,
    }
    try:
        schemas.validate("JwkVerificationMethod", document_method)
    except DwnError as exc:
        raise DwnError(exc.code, exc.detail, 401) from exc
    jwk = method.public_jwk  # a dict: the schema requires an object
    crv = jwk.get("crv")
    if crv == "Ed25519":
        return _ed25519_from_jwk(json_compact(jwk))
    if crv in ecdsa.CURVES:
        if jwk.get("kty") != "EC":  # the algorithm's validateKey, a DwnError in the reference
            code = "Secp256k1KeyNotValid" if crv == ecdsa.SECP256K1 else "Secp256r1KeyNotValid"
            raise DwnError(code, f"Invalid {crv} JWK: `kty` MUST be `EC`. `crv` MUST be `{crv}`", 401)
        return ecdsa.key_from_jwk(jwk)
    raise DwnError(
        "JwsVerifySignatureUnsupportedCrv", "unsupported crv. crv must be one of Ed25519,secp256k1,P-256", 401
    )


@functools.lru_cache(maxsize=4096)
def _ed25519_from_jwk(jwk_json: str) -> bytes:
    jwk = json.loads(jwk_json)
    if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
        raise DwnError("Ed25519InvalidJwk", "invalid jwk. kty MUST be OKP. crv MUST be Ed25519", 401)
    try:
        raw = b64url_decode_jwk(jwk.get("x", ""))
    except (DwnError, ValueError) as exc:
        raise DwnError("Ed25519InvalidJwk", "invalid Ed25519 public key", 401) from exc
    if len(raw) != 32:
        raise DwnError("Ed25519InvalidJwk", "invalid Ed25519 public key", 401)
    return raw


#: The JWS ``alg`` each signing algorithm writes in the protected header.
JWS_ALG: Final[dict[str, str]] = {"Ed25519": "EdDSA", ecdsa.SECP256K1: "ES256K", ecdsa.P256: "ES256"}
_EC_CURVES: Final[dict[str, ec.EllipticCurve]] = {ecdsa.SECP256K1: ec.SECP256K1(), ecdsa.P256: ec.SECP256R1()}


@dataclass(frozen=True)
class Identity:
    """A DID with its private key: what signs messages. Ed25519 unless made with another
    ``algorithm`` (``secp256k1`` or ``P-256``, which sign as ES256K and ES256)."""

    did: str
    key_id: str
    private_key: Ed25519PrivateKey | ec.EllipticCurvePrivateKey

    @property
    def algorithm(self) -> str:
        """``Ed25519``, ``secp256k1`` or ``P-256``: the JWK ``crv`` of the key."""
        if isinstance(self.private_key, Ed25519PrivateKey):
            return "Ed25519"
        return ecdsa.curve_of(self.private_key)

    @property
    def jws_alg(self) -> str:
        return JWS_ALG[self.algorithm]

    @property
    def public_key(self) -> bytes:
        """The raw public key: 32 bytes for Ed25519, SEC1 compressed (33) for an EC key."""
        public = self.private_key.public_key()
        if isinstance(public, ec.EllipticCurvePublicKey):
            return public.public_bytes(Encoding.X962, PublicFormat.CompressedPoint)
        return public.public_bytes(Encoding.Raw, PublicFormat.Raw)

    def public_jwk(self) -> dict[str, str]:
        public = self.private_key.public_key()
        if isinstance(public, ec.EllipticCurvePublicKey):
            numbers = public.public_numbers()
            return ec_public_jwk(self.algorithm, numbers.x, numbers.y)
        return public_jwk(self.public_key)

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.private_key, Ed25519PrivateKey):
            return self.private_key.sign(data)
        return ecdsa.sign(self.private_key, self.algorithm, data)

    @classmethod
    def generate(cls, method: str = "key", algorithm: str = "Ed25519") -> Identity:
        """A fresh identity under ``did:key`` (default) or ``did:jwk``."""
        if algorithm == "Ed25519":
            seed = Ed25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
            return cls.from_private_bytes(seed, method)
        curve = _EC_CURVES.get(algorithm)
        if curve is None:
            raise ValueError(f"unsupported algorithm {algorithm!r} (Ed25519, secp256k1 or P-256)")
        return cls._of(ec.generate_private_key(curve), method)

    @classmethod
    def from_private_bytes(cls, seed: bytes, method: str = "key", algorithm: str = "Ed25519") -> Identity:
        """The identity of a private key's bytes: an Ed25519 seed (32), or an EC scalar (32,
        big-endian) for ``algorithm`` secp256k1 or P-256."""
        if algorithm == "Ed25519":
            return cls._of(Ed25519PrivateKey.from_private_bytes(seed), method)
        curve = _EC_CURVES.get(algorithm)
        if curve is None:
            raise ValueError(f"unsupported algorithm {algorithm!r} (Ed25519, secp256k1 or P-256)")
        if len(seed) != 32:
            raise ValueError("an EC private key is 32 bytes")
        return cls._of(ec.derive_private_key(int.from_bytes(seed, "big"), curve), method)

    @classmethod
    def _of(cls, private_key: Ed25519PrivateKey | ec.EllipticCurvePrivateKey, method: str) -> Identity:
        unnamed = cls("", "", private_key)  # the key's own properties, before it has a DID
        if method == "key":
            multicodec = _DID_KEY_MULTICODECS.get(unnamed.algorithm)
            if multicodec is None:  # the reference's did:key resolver has no document for a P-256 key
                raise ValueError("did:key is Ed25519 or secp256k1 here, as the reference resolves it; use did:jwk")
            ident = "z" + _b58encode(multicodec + unnamed.public_key)
            did = f"did:key:{ident}"
            return cls(did, f"{did}#{ident}", private_key)
        if method == "jwk":
            did = "did:jwk:" + b64url_encode(json_compact(unnamed.public_jwk()).encode())
            return cls(did, f"{did}#0", private_key)
        raise ValueError(f"unsupported DID method {method!r} (key or jwk)")

    def private_bytes(self) -> bytes:
        if isinstance(self.private_key, Ed25519PrivateKey):
            return self.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return int(self.private_key.private_numbers().private_value).to_bytes(32, "big")

    def to_jwk(self) -> dict[str, str]:
        """Private JWK export (``d`` is the 32-byte seed or scalar), with the DID and key id beside it."""
        jwk = self.public_jwk()
        jwk["d"] = b64url_encode(self.private_bytes())
        return {"did": self.did, "kid": self.key_id, **jwk}

    @classmethod
    def from_jwk(cls, data: dict[str, str]) -> Identity:
        """Inverse of :meth:`to_jwk`; the DID method is taken from the stored DID."""
        method = "jwk" if str(data.get("did", "")).startswith("did:jwk:") else "key"
        ident = cls.from_private_bytes(b64url_decode(data["d"]), method, str(data.get("crv", "Ed25519")))
        if "did" in data and data["did"] != ident.did:
            raise ValueError("the key does not belong to the stored DID")
        return ident
