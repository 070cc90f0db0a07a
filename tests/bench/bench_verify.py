"""Ed25519 verifies per second on one core: `cryptography` (V) against p2psync's verifier.

Run: PYTHONPATH=. .venv/bin/python tests/bench/bench_verify.py

V is plain `cryptography` (OpenSSL) on the same signatures in the same run, so the ratio
cancels the machine's speed. The verifier's figures: honest signatures (libsodium's fast path),
refusals of mangled ones with an honest key (fast path + R's subgroup check), signatures whose R
has a torsion part (what a hostile peer can force per message: the fast path's refusal, then the
slow path), the slow path alone (the reference's rule on libsodium's group operations), and the
same rule in pure Python (its statement, which the slow path was until 2026-12-02).
Then the ECDSA verifiers of p2psync/dwn/ecdsa.py (ES256K on secp256k1, ES256 on P-256), honest
signatures by a key already read from its JWK, as the engine verifies them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import nacl.bindings
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from p2psync.dwn import ecdsa, ed25519
from p2psync.dwn.did import Identity

SIGNATURES = 2_000  # distinct messages, each ~ a DWN JWS signing input
MESSAGE_BYTES = 400
REPEATS = 3  # best of three: the machine is shared, the best pass is the honest figure
SLOW_PATH_SAMPLES = 30
_Key = TypeVar("_Key")


def _rate(check: Callable[[_Key, bytes, bytes], object], cases: list[tuple[_Key, bytes, bytes]]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for pub, sig, msg in cases:
            check(pub, sig, msg)
        best = min(best, time.perf_counter() - start)
    return len(cases) / best


def _cryptography(pub: bytes, sig: bytes, msg: bytes) -> None:
    Ed25519PublicKey.from_public_bytes(pub).verify(sig, msg)


def main() -> None:
    keys = [Ed25519PrivateKey.generate() for _ in range(20)]  # a few signers, as in a tenant
    cases = []
    for i in range(SIGNATURES):
        key = keys[i % len(keys)]
        msg = os.urandom(MESSAGE_BYTES)
        cases.append((key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw), key.sign(msg), msg))
    assert all(ed25519.verify(*c) for c in cases)
    mangled = [(pub, sig[:40] + bytes([sig[40] ^ 1]) + sig[41:], msg) for pub, sig, msg in cases]
    assert not any(ed25519.verify(*c) for c in mangled)
    torsion = next(t for t in sorted(ed25519._torsion()) if t != ed25519._SODIUM_IDENTITY)
    crafted = [
        (pub, nacl.bindings.crypto_core_ed25519_add(sig[:32], torsion) + sig[32:], msg) for pub, sig, msg in cases
    ]
    assert not any(ed25519.verify(*c) for c in crafted)

    v = _rate(_cryptography, cases)
    ours = _rate(ed25519.verify, cases)
    refusals = _rate(ed25519.verify, mangled)
    forced = _rate(ed25519.verify, crafted)
    sodium = _rate(ed25519._sodium_outcome, crafted)
    slow = _rate(ed25519.reference_outcome, crafted[:SLOW_PATH_SAMPLES])
    print(f"{SIGNATURES} signatures over {MESSAGE_BYTES}-byte messages, best of {REPEATS}, one core")
    print(f"V  cryptography (OpenSSL) verify          {v:9.0f} /s")
    print(f"   p2psync ed25519.verify, honest         {ours:9.0f} /s   {ours / v:5.2f} V")
    print(f"   p2psync ed25519.verify, mangled S      {refusals:9.0f} /s   {refusals / v:5.2f} V")
    print(f"   p2psync ed25519.verify, R + torsion    {forced:9.0f} /s   {forced / v:5.2f} V   (forced slow path)")
    print(f"   the slow path alone (libsodium's ops)  {sodium:9.0f} /s   {sodium / v:5.2f} V")
    print(f"   the same rule in pure Python           {slow:9.0f} /s   {slow / v:5.3f} V")
    for crv in ecdsa.CURVES:
        signers = [Identity.generate("jwk", crv) for _ in range(20)]
        ec_cases = []
        for i in range(SIGNATURES):
            signer = signers[i % len(signers)]
            msg = os.urandom(MESSAGE_BYTES)
            ec_cases.append((ecdsa.key_from_jwk(signer.public_jwk()), signer.sign(msg), msg))
        assert all(ecdsa.outcome(*c)[0] for c in ec_cases)
        rate = _rate(ecdsa.outcome, ec_cases)
        print(f"   p2psync ecdsa {crv:9s} ({signers[0].jws_alg:6s})  {rate:9.0f} /s   {rate / v:5.2f} V")


if __name__ == "__main__":
    main()
