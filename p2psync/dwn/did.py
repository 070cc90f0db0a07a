"""Ed25519 identities for ``did:key`` and ``did:jwk``, resolved offline.

Both methods carry the public key inside the DID itself, so resolution is pure computation:
``did:key:z6Mk…`` is base58btc(multicodec ed25519-pub ‖ key), its one verification method is
``<did>#<multibase key>``; ``did:jwk:<base64url JSON JWK>`` has one method ``<did>#0``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from p2psync.dwn.ed25519 import did_key_point_is_valid
from p2psync.dwn.encoding import b64url_decode, b64url_encode, json_compact
from p2psync.dwn.errors import DwnError

_ED25519_PUB_MULTICODEC = b"\xed\x01"
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
        if len(raw) != 34 or raw[:2] != _ED25519_PUB_MULTICODEC:
            return ()
        # The reference's resolver validates the key (@web5/crypto validatePublicKey) and
        # resolves no document for y >= p, x = 0 with the sign bit, a non-point or the identity.
        if not did_key_point_is_valid(raw[2:]):
            return ()
        return (VerificationMethod(f"{did}#{ident}", public_jwk(raw[2:])),)
    if did.startswith("did:jwk:"):
        ident = did[len("did:jwk:") :]
        try:
            jwk = json.loads(b64url_decode(ident).decode("utf-8"))
        except (DwnError, UnicodeDecodeError, ValueError):
            return ()
        return (VerificationMethod(f"{did}#0", jwk),)
    return ()


@functools.lru_cache(maxsize=4096)
def verification_key(kid: str) -> bytes:
    """The raw Ed25519 public key (32 bytes) that ``kid`` names, or 401 as the reference refuses it.

    The bytes are not checked to be a point: the reference's verifier decides that
    (:mod:`p2psync.dwn.ed25519`).

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
    return _ed25519_from_jwk(json_compact(method.public_jwk))


@functools.lru_cache(maxsize=4096)
def _ed25519_from_jwk(jwk_json: str) -> bytes:
    jwk = json.loads(jwk_json)
    if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
        raise DwnError("Ed25519InvalidJwk", "invalid jwk. kty MUST be OKP. crv MUST be Ed25519", 401)
    try:
        raw = b64url_decode(jwk.get("x", ""))
    except (DwnError, ValueError) as exc:
        raise DwnError("Ed25519InvalidJwk", "invalid Ed25519 public key", 401) from exc
    if len(raw) != 32:
        raise DwnError("Ed25519InvalidJwk", "invalid Ed25519 public key", 401)
    return raw


@dataclass(frozen=True)
class Identity:
    """A DID with its Ed25519 private key: what signs messages."""

    did: str
    key_id: str
    private_key: Ed25519PrivateKey

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)

    @classmethod
    def generate(cls, method: str = "key") -> Identity:
        """A fresh identity under ``did:key`` (default) or ``did:jwk``."""
        return cls.from_private_bytes(Ed25519PrivateKey.generate().private_bytes(
            Encoding.Raw, PrivateFormat.Raw, NoEncryption()), method)

    @classmethod
    def from_private_bytes(cls, seed: bytes, method: str = "key") -> Identity:
        private_key = Ed25519PrivateKey.from_private_bytes(seed)
        pub = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        if method == "key":
            ident = "z" + _b58encode(_ED25519_PUB_MULTICODEC + pub)
            did = f"did:key:{ident}"
            return cls(did, f"{did}#{ident}", private_key)
        if method == "jwk":
            did = "did:jwk:" + b64url_encode(json_compact(public_jwk(pub)).encode())
            return cls(did, f"{did}#0", private_key)
        raise ValueError(f"unsupported DID method {method!r} (key or jwk)")

    def private_bytes(self) -> bytes:
        return self.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def to_jwk(self) -> dict[str, str]:
        """Private JWK export (``d`` is the 32-byte seed), with the DID and key id beside it."""
        jwk = public_jwk(self.public_key)
        jwk["d"] = b64url_encode(self.private_bytes())
        return {"did": self.did, "kid": self.key_id, **jwk}

    @classmethod
    def from_jwk(cls, data: dict[str, str]) -> Identity:
        """Inverse of :meth:`to_jwk`; the DID method is taken from the stored DID."""
        method = "jwk" if str(data.get("did", "")).startswith("did:jwk:") else "key"
        ident = cls.from_private_bytes(b64url_decode(data["d"]), method)
        if "did" in data and data["did"] != ident.did:
            raise ValueError("the key does not belong to the stored DID")
        return ident
