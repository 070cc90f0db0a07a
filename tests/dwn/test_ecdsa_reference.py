"""p2psync's ECDSA (secp256k1, P-256) verification against the reference DWN's, vector by vector.

Every vector is a General JWS signed (or mis-signed) by a did:key or did:jwk EC key and goes
through the reference's ``GeneralJwsVerifier`` with the harness's offline resolver
(``interop/ed25519_oracle.mjs jws``, which resolves any key type) and through ours; the answers
must agree. The vectors are where the two libraries the reference uses read keys and
signatures in their own ways (p2psync/dwn/ecdsa.py): a secp256k1 key taken by ``x`` and the
parity of ``y`` alone, high ``s``, ``r`` or ``s`` out of range, compact against DER, noble's DER
parser, P-256 points off the curve, did:key encodings the resolver refuses, JWKs the schema
refuses.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.dwn import ecdsa, jws
from p2psync.dwn.did import Identity, _b58encode, ec_public_jwk, resolve, verification_key
from p2psync.dwn.encoding import b64url_encode, json_compact
from p2psync.dwn.errors import DwnError
from tests.dwn.oracle_utils import needs_reference, run_ed25519_oracle

_PAYLOAD = b64url_encode(json_compact({"descriptor": {"interface": "Records"}, "n": 1}).encode())
_CURVES = {ecdsa.SECP256K1: ec.SECP256K1(), ecdsa.P256: ec.SECP256R1()}
_N = {ecdsa.SECP256K1: ecdsa._CURVE[ecdsa.SECP256K1].n, ecdsa.P256: ecdsa._CURVE[ecdsa.P256].n}
_P = {ecdsa.SECP256K1: ecdsa._CURVE[ecdsa.SECP256K1].p, ecdsa.P256: ecdsa._CURVE[ecdsa.P256].p}


@dataclass(frozen=True)
class Vector:
    name: str
    doc: dict[str, Any]


def _private(crv: str, name: str) -> ec.EllipticCurvePrivateKey:
    scalar = int.from_bytes(hashlib.sha256(f"{crv}:{name}".encode()).digest(), "big") % _N[crv]
    return ec.derive_private_key(scalar, _CURVES[crv])


def _jwk_did(jwk: dict[str, Any]) -> tuple[str, str]:
    did = "did:jwk:" + b64url_encode(json_compact(jwk).encode())
    return did, f"{did}#0"


def _key_did(multicodec_key: bytes) -> tuple[str, str]:
    ident = "z" + _b58encode(multicodec_key)
    return f"did:key:{ident}", f"did:key:{ident}#{ident}"


def _protected(kid: str, alg: str) -> str:
    return b64url_encode(json_compact({"kid": kid, "alg": alg}).encode())


def _doc(kid: str, alg: str, sign: Callable[[bytes], bytes], payload: str = _PAYLOAD) -> dict[str, Any]:
    protected = _protected(kid, alg)
    signature = sign(f"{protected}.{payload}".encode())
    return {"payload": payload, "signatures": [{"protected": protected, "signature": b64url_encode(signature)}]}


def _fixed(signature: bytes) -> Callable[[bytes], bytes]:
    """A signer that ignores what it signs: the vector's signature as given."""
    def sign(_message: bytes) -> bytes:
        return signature

    return sign


def _der_int(value: int, *, minimal: bool = True, pad: int = 0) -> bytes:
    body = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
    if minimal and body[0] & 0x80:
        body = b"\0" + body
    body = b"\0" * pad + body
    return b"\x02" + bytes([len(body)]) + body


def _der(r: bytes, s: bytes, *, tag: int = 0x30, extra: bytes = b"", length_delta: int = 0) -> bytes:
    inner = r + s + extra
    return bytes([tag, len(inner) + length_delta]) + inner


def _split(sig: bytes) -> tuple[int, int]:
    return int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big")


def _compact(r: int, s: int) -> bytes:
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def _signature_variants(crv: str, honest: bytes) -> list[tuple[str, bytes]]:
    n = _N[crv]
    r, s = _split(honest)
    minimal = _der(_der_int(r), _der_int(s))
    negative_r = r.to_bytes(32, "big")
    return [
        ("honest", honest),
        ("high-s", _compact(r, n - s)),
        ("r-zero", _compact(0, s)),
        ("s-zero", _compact(r, 0)),
        ("r-is-n", _compact(n, s)),
        ("s-is-n", _compact(r, n)),
        ("r-max", _compact(2**256 - 1, s)),
        ("s-max", _compact(r, 2**256 - 1)),
        ("truncated", honest[:63]),
        ("extended", honest + b"\0"),
        ("empty", b""),
        ("flip-first", bytes([honest[0] ^ 1]) + honest[1:]),
        ("flip-last", honest[:-1] + bytes([honest[-1] ^ 0x80])),
        ("der", minimal),
        ("der-high-s", _der(_der_int(r), _der_int(n - s))),
        ("der-padded-r", _der(_der_int(r, pad=1), _der_int(s))),
        ("der-unpadded-r", _der(b"\x02" + bytes([len(negative_r)]) + negative_r, _der_int(s))
         if negative_r[0] & 0x80 else _der(_der_int(r, minimal=False), _der_int(s))),
        ("der-trailing", _der(_der_int(r), _der_int(s), extra=b"\0")),
        ("der-long-length", b"\x30\x81" + minimal[1:2] + minimal[2:]),
        ("der-short-length", _der(_der_int(r), _der_int(s), length_delta=-1)),
        ("der-set-tag", _der(_der_int(r), _der_int(s), tag=0x31)),
        ("der-r-zero", _der(_der_int(0), _der_int(s))),
        ("der-r-is-n", _der(_der_int(n), _der_int(s))),
        ("der-one-int", _der(_der_int(r), b"")),
        ("der-bit-string", _der(b"\x03" + _der_int(r)[1:], _der_int(s))),
    ]


def build_vectors() -> list[Vector]:
    vectors: list[Vector] = []
    for crv, alg in ((ecdsa.SECP256K1, "ES256K"), (ecdsa.P256, "ES256")):
        key = _private(crv, "honest")
        numbers = key.public_key().public_numbers()
        x, y, p = numbers.x, numbers.y, _P[crv]
        jwk = ec_public_jwk(crv, x, y)
        kids = [("jwk", _jwk_did(jwk)[1])]
        if crv == ecdsa.SECP256K1:
            kids.append(("key", _key_did(b"\xe7\x01" + bytes([2 + (y & 1)]) + x.to_bytes(32, "big"))[1]))
        for method, kid in kids:
            protected = _protected(kid, alg)
            honest = ecdsa.sign(key, crv, f"{protected}.{_PAYLOAD}".encode())
            for name, sig in _signature_variants(crv, honest):
                vectors.append(Vector(f"{crv}/{method}/{name}", _doc(kid, alg, _fixed(sig))))
            vectors.append(Vector(f"{crv}/{method}/other-payload",
                                  _doc(kid, alg, _fixed(honest), payload=b64url_encode(b'{"n":2}'))))
            vectors.append(Vector(f"{crv}/{method}/bad-base64", {
                "payload": _PAYLOAD, "signatures": [{"protected": protected, "signature": "!!"}]}))

        def signed_by(name: str, key_jwk: dict[str, Any], signer: ec.EllipticCurvePrivateKey = key,
                      crv: str = crv, alg: str = alg) -> Vector:
            kid = _jwk_did(key_jwk)[1]
            return Vector(f"{crv}/jwk/{name}", _doc(kid, alg, lambda m: ecdsa.sign(signer, crv, m)))

        b64 = b64url_encode
        other_y = p - y
        vectors += [
            signed_by("y-plus-2", {**jwk, "y": b64((y + 2).to_bytes(32, "big"))}),
            signed_by("y-negated", {**jwk, "y": b64(other_y.to_bytes(32, "big"))}),
            signed_by("y-plus-p", {**jwk, "y": b64((y + p).to_bytes(33, "big"))}),
            signed_by("y-empty", {**jwk, "y": ""}),
            signed_by("y-one-byte", {**jwk, "y": b64(bytes([y & 0xFF]))}),
            signed_by("y-absent", {k: v for k, v in jwk.items() if k != "y"}),
            signed_by("x-leading-zero", {**jwk, "x": b64(x.to_bytes(33, "big"))}),
            signed_by("x-empty", {**jwk, "x": ""}),
            signed_by("x-zero", {**jwk, "x": b64(bytes(32))}),
            signed_by("x-is-p", {**jwk, "x": b64(p.to_bytes(32, "big"))}),
            signed_by("x-plus-1", {**jwk, "x": b64((x + 1).to_bytes(32, "big"))}),
            signed_by("both-zero", {**jwk, "x": b64(bytes(32)), "y": b64(bytes(32))}),
            signed_by("x-not-base64url", {**jwk, "x": jwk["x"] + "="}),
            signed_by("kty-okp", {**jwk, "kty": "OKP"}),
            signed_by("kty-absent", {k: v for k, v in jwk.items() if k != "kty"}),
            signed_by("with-d", {**jwk, "d": b64(bytes(32))}),
            signed_by("alg-number", {**jwk, "alg": 5}),
            signed_by("with-alg-kid", {**jwk, "alg": alg, "kid": "k1"}),
            signed_by("x-number", {**jwk, "x": 5}),
            signed_by("crv-p384", {**jwk, "crv": "P-384"}),
            signed_by("crv-x25519", {**jwk, "crv": "X25519", "kty": "OKP"}),
            signed_by("other-key", jwk, signer=_private(crv, "someone else")),
        ]
    # did:key encodings of EC keys the reference's resolver (@web5/dids 1.2.0) has no document for.
    k1 = _private(ecdsa.SECP256K1, "honest").public_key().public_numbers()
    x32, y32 = k1.x.to_bytes(32, "big"), k1.y.to_bytes(32, "big")
    p_k1 = _P[ecdsa.SECP256K1]
    p256 = _private(ecdsa.P256, "honest").public_key().public_numbers()
    not_on_k1 = next(v for v in range(1, 100) if ecdsa.decompress(ecdsa.SECP256K1, v, False) is None)
    for name, raw in [
        ("uncompressed", b"\xe7\x01\x04" + x32 + y32),
        ("prefix-05", b"\xe7\x01\x05" + x32),
        ("x-not-on-curve", b"\xe7\x01\x02" + not_on_k1.to_bytes(32, "big")),
        ("x-is-p-plus-1", b"\xe7\x01\x02" + (p_k1 + 1).to_bytes(32, "big")),
        ("x-zero", b"\xe7\x01\x02" + bytes(32)),
        ("short", b"\xe7\x01\x02" + x32[:31]),
        ("p256", b"\x80\x24" + bytes([2 + (p256.y & 1)]) + p256.x.to_bytes(32, "big")),
    ]:
        kid = _key_did(raw)[1]
        vectors.append(Vector(f"did:key/{name}", _doc(kid, "ES256K", _fixed(bytes(64)))))
    return vectors


def _our_answer(doc: dict[str, Any]) -> dict[str, Any]:
    try:
        jws.verify(doc)
    except DwnError as exc:
        assert exc.status == 401, (exc.code, exc.detail)
        return {"outcome": "throw", "code": exc.code}
    return {"outcome": "accept"}


def _agree(vectors: list[Vector], answers: list[dict[str, Any]]) -> None:
    for v, ref in zip(vectors, answers, strict=True):
        ours = _our_answer(v.doc)
        assert ours["outcome"] == ref["outcome"], (v.name, ref, ours)
        if ref.get("code"):  # a DwnError there: the same code here; a noble throw or `false`: any 401
            assert ours["code"] == ref["code"], (v.name, ref, ours)


@pytest.fixture(scope="module")
def vectors_and_answers() -> tuple[list[Vector], list[dict[str, Any]]]:
    vectors = build_vectors()
    return vectors, run_ed25519_oracle("jws", [{"jws": v.doc} for v in vectors])


@needs_reference
def test_every_ecdsa_vector_gets_the_reference_answer(
    vectors_and_answers: tuple[list[Vector], list[dict[str, Any]]],
) -> None:
    vectors, answers = vectors_and_answers
    jws._verify_entry.cache_clear()
    _agree(vectors, answers)
    # and they tell something apart: each curve accepts some and refuses others
    accepted = {v.name for v, a in zip(vectors, answers, strict=True) if a["outcome"] == "accept"}
    for crv in (ecdsa.SECP256K1, ecdsa.P256):
        assert f"{crv}/jwk/honest" in accepted and f"{crv}/jwk/high-s" in accepted
        assert f"{crv}/jwk/r-zero" not in accepted and f"{crv}/jwk/other-key" not in accepted
    assert {"secp256k1/jwk/y-plus-2", "secp256k1/key/honest", "P-256/jwk/der"} <= accepted
    assert not {"P-256/jwk/y-plus-2", "secp256k1/jwk/der", "secp256k1/jwk/y-negated"} & accepted


@needs_reference
def test_the_vectors_answer_the_same_verified_ahead() -> None:
    """An EC signature is never verified ahead (only Ed25519 is); asking changes no answer."""
    vectors = build_vectors()
    answers = run_ed25519_oracle("jws", [{"jws": v.doc} for v in vectors])
    jws._verify_entry.cache_clear()
    for v in vectors:
        assert jws.verify_ahead(v.doc) == 0, v.name
    _agree(vectors, answers)


def test_identities_of_each_algorithm_sign_what_they_verify() -> None:
    for algorithm, methods in (("Ed25519", ("key", "jwk")), ("secp256k1", ("key", "jwk")), ("P-256", ("jwk",))):
        for method in methods:
            ident = Identity.from_private_bytes(hashlib.sha256(algorithm.encode()).digest(), method, algorithm)
            assert ident.algorithm == algorithm
            doc = jws.sign_payload({"n": 1}, ident)
            assert jws.verify(doc) == [ident.did]
            again = Identity.from_jwk(ident.to_jwk())
            assert again == ident or (again.did, again.key_id, again.private_bytes()) == (
                ident.did, ident.key_id, ident.private_bytes())
            assert jws.sign_payload({"n": 1}, again) == doc  # RFC 6979: the same signature
            key = verification_key(ident.key_id)
            assert isinstance(key, bytes) is (algorithm == "Ed25519")
    with pytest.raises(ValueError, match="did:key"):
        Identity.generate("key", "P-256")  # the reference resolves no P-256 did:key


def test_did_key_secp256k1_resolves_to_the_point_it_compresses() -> None:
    ident = Identity.from_private_bytes(bytes(31) + b"\x07", "key", "secp256k1")
    assert ident.did.startswith("did:key:zQ3s")  # the multicodec prefix every secp256k1 did:key shows
    (method,) = resolve(ident.did)
    assert isinstance(ident.private_key, ec.EllipticCurvePrivateKey)
    numbers = ident.private_key.public_key().public_numbers()
    assert method.public_jwk == ec_public_jwk("secp256k1", numbers.x, numbers.y)


def _mangle(draw: Callable[..., Any], crv: str, honest: bytes) -> bytes:
    sig = bytearray(honest)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "r-random", "s-random", "s-negate", "truncate", "der"]))
        if kind == "flip" and sig:
            sig[draw(st.integers(0, len(sig) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif kind == "r-random" and len(sig) == 64:
            sig[:32] = draw(st.binary(min_size=32, max_size=32))
        elif kind == "s-random" and len(sig) == 64:
            sig[32:] = draw(st.binary(min_size=32, max_size=32))
        elif kind == "s-negate" and len(sig) == 64:
            sig[32:] = ((_N[crv] - int.from_bytes(sig[32:], "big")) % 2**256).to_bytes(32, "big")
        elif kind == "truncate":
            sig = sig[: draw(st.integers(0, len(sig)))]
        elif kind == "der" and len(sig) == 64:
            r, s = _split(bytes(sig))
            sig = bytearray(_der(_der_int(r), _der_int(s)))
    return bytes(sig)


@needs_reference
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.data_too_large, HealthCheck.too_slow])
@given(st.data())
def test_mangled_ecdsa_signatures_get_the_reference_answer(data: st.DataObject) -> None:
    """An honest signature over the real signing input, bit-flipped, re-randomised, its s
    negated, cut short or DER-encoded: one Node call for 100 of them."""
    vectors = []
    for i in range(100):
        crv = data.draw(st.sampled_from([ecdsa.SECP256K1, ecdsa.P256]))
        key = _private(crv, "honest")
        numbers = key.public_key().public_numbers()
        kid = _jwk_did(ec_public_jwk(crv, numbers.x, numbers.y))[1]
        honest = ecdsa.sign(key, crv, f"{_protected(kid, 'ES256')}.{_PAYLOAD}".encode())
        sig = _mangle(data.draw, crv, honest)
        vectors.append(Vector(f"mangled-{i}-{crv}", _doc(kid, "ES256", _fixed(sig))))
    answers = run_ed25519_oracle("jws", [{"jws": v.doc} for v in vectors])
    jws._verify_entry.cache_clear()
    _agree(vectors, answers)
