"""General JWS (RFC 7515 §7.2.1), as DWN messages carry their signatures.

Signing input is ``protected.payload`` (both base64url); the protected header is the JSON
``{"kid": …, "alg": …}`` (``EdDSA``, ``ES256K`` or ``ES256``). Verification resolves ``kid``
against the signer's DID document and, as the reference does, lets the key's JWK ``crv`` pick
the algorithm, not the header's ``alg``.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from p2psync.dwn import ecdsa, ed25519, memo
from p2psync.dwn.did import Identity, PublicKey, verification_key
from p2psync.dwn.encoding import b64url_decode, b64url_encode, b64url_json, json_compact
from p2psync.dwn.errors import DwnError


def sign_payload(payload: dict[str, Any], signer: Identity) -> dict[str, Any]:
    """A General JWS over the JSON payload with one signature by ``signer``."""
    payload_b64 = b64url_encode(json_compact(payload).encode("utf-8"))
    protected = b64url_encode(json_compact({"kid": signer.key_id, "alg": signer.jws_alg}).encode())
    signature = signer.sign(f"{protected}.{payload_b64}".encode("ascii"))
    return {"payload": payload_b64, "signatures": [{"protected": protected, "signature": b64url_encode(signature)}]}


def signature_kid(entry: dict[str, Any]) -> str:
    """The ``kid`` of one signature entry; 401 when the header is not readable."""
    protected = entry.get("protected") if isinstance(entry, dict) else None
    if not isinstance(protected, str):
        raise DwnError("JwsProtectedHeaderInvalid", "protected header must be a string", 401)
    return _kid_of(protected)


@functools.lru_cache(maxsize=4096)
def _kid_of(protected: str) -> str:
    # The same few signers sign many messages: decode each header once.
    try:
        header = b64url_json(protected)
        kid = header["kid"]
    except (DwnError, KeyError, TypeError) as exc:
        raise DwnError("JwsProtectedHeaderInvalid", "cannot read kid from protected header", 401) from exc
    if not isinstance(kid, str):
        raise DwnError("JwsProtectedHeaderInvalid", "kid must be a string", 401)
    return kid


def signer_did(jws: dict[str, Any]) -> str:
    """DID of the first signer (the part of its ``kid`` before ``#``)."""
    return signature_kid(jws["signatures"][0]).split("#", 1)[0]


def decode_payload(jws: dict[str, Any]) -> dict[str, Any]:
    """The JSON object a JWS signs; 400 unless it is a plain object.

    The payload of the signature of the message being processed is decoded once (its parse
    and the history's footprint both read it); callers only read the dict.
    """
    held = memo.current()
    if held is None:
        return _decode_payload(jws)
    known = held.payload
    if known is not None and known[0] is jws:
        return known[1]
    payload = _decode_payload(jws)
    authorization = held.message.get("authorization") if isinstance(held.message, dict) else None
    if isinstance(authorization, dict) and authorization.get("signature") is jws:
        held.payload = (jws, payload)
    return payload


def _decode_payload(jws: dict[str, Any]) -> dict[str, Any]:
    try:
        payload = b64url_json(jws["payload"])
    except DwnError as exc:
        raise DwnError("JwsDecodePlainObjectPayloadInvalid", "payload is not a JSON object", 400) from exc
    if not isinstance(payload, dict):
        raise DwnError("JwsDecodePlainObjectPayloadInvalid", "signed payload must be a plain object", 400)
    return payload


def _signed(protected: str, payload: str, signature: str) -> tuple[str, PublicKey, bytes, bytes]:
    """What one signature entry asks to verify: (signer DID, key, signature, signing input);
    401 when its header, key or signature cannot be read."""
    kid = signature_kid({"protected": protected})
    key = verification_key(kid)
    did = kid.split("#", 1)[0]
    try:
        signature_bytes = b64url_decode(signature)
    except DwnError as exc:
        raise DwnError(
            "GeneralJwsVerifierInvalidSignature", f"Signature verification failed for {did}", 401
        ) from exc
    return did, key, signature_bytes, f"{protected}.{payload}".encode()


def signed_entry(protected: str, payload: str, signature: str) -> tuple[str, PublicKey, bytes, bytes]:
    """What one signature entry asks to verify: (signer DID, key, signature, signing input);
    :class:`~p2psync.dwn.errors.DwnError` (401) when it cannot be read. What a worker process
    verifying ahead computes, exactly as the engine will (p2psync/dwn/ahead.py)."""
    return _signed(protected, payload, signature)


#: Signature entries whose verdict is kept (a message processed again, as a late arrival's
#: replay does, is not verified again). An entry keeps its three strings, ~0.9 KB for a 1 KiB
#: record's: 65,536 of them held ~60 MB of a 100,000-message pull's 149 MB peak (issue #17's
#: RSS row), for replays that mostly reach further back than that anyway. Ours.
VERIFIED_ENTRIES: Final = 8192


@functools.lru_cache(maxsize=VERIFIED_ENTRIES)
def _verify_entry(protected: str, payload: str, signature: str) -> str:
    did, key, signature_bytes, signing_input = _signed(protected, payload, signature)
    # The reference refuses (false) or throws; both end in its handlers' 401. An acceptance
    # found ahead on another thread counts only for exactly these bytes (ed25519.Ahead).
    if isinstance(key, ecdsa.EcKey):
        accepted, thrown = ecdsa.outcome(key, signature_bytes, signing_input)
    else:
        outcome, thrown = ed25519.engine_outcome(key, signature_bytes, signing_input)
        accepted = outcome is ed25519.Outcome.ACCEPT
    if not accepted:
        why = f" ({thrown})" if thrown else ""
        raise DwnError("GeneralJwsVerifierInvalidSignature", f"Signature verification failed for {did}{why}", 401)
    return did


def signature_entries(jws: Any) -> list[tuple[str, str, str]]:
    """(protected, payload, signature) of each readable signature entry of a General JWS;
    what cannot be read is left out, for :func:`verify` to refuse."""
    payload = jws.get("payload") if isinstance(jws, dict) else None
    entries = jws.get("signatures") if isinstance(jws, dict) else None
    if not isinstance(payload, str) or not isinstance(entries, list):
        return []
    out = []
    for entry in entries:
        if isinstance(entry, dict):
            protected, signature = entry.get("protected"), entry.get("signature")
            if isinstance(protected, str) and isinstance(signature, str):
                out.append((protected, payload, signature))
    return out


def verify_ahead(jws: Any) -> int:
    """Verify ``jws``'s signatures into :data:`ed25519.AHEAD` (a worker thread's side of it);
    returns how many were accepted. Never raises: anything it cannot read, or a signature it
    refuses, is left for the engine's own :func:`verify`."""
    accepted = 0
    for protected, payload, signature in signature_entries(jws):
        try:
            _, key, signature_bytes, signing_input = _signed(protected, payload, signature)
        except Exception:  # the engine's own verify judges whatever this could not read
            continue
        if isinstance(key, ecdsa.EcKey):
            continue  # only Ed25519 is verified ahead; the engine verifies an EC signature itself
        if ed25519.AHEAD.verify(key, signature_bytes, signing_input) is ed25519.Outcome.ACCEPT:
            accepted += 1
    return accepted


def verify(jws: dict[str, Any]) -> list[str]:
    """Verify every signature of a General JWS; return the signer DIDs or raise 401."""
    signers = []
    for entry in jws["signatures"]:
        try:
            signers.append(_verify_entry(entry["protected"], jws["payload"], entry["signature"]))
        except (KeyError, TypeError) as exc:
            raise DwnError("GeneralJwsVerifierInvalidSignature", "malformed signature entry", 401) from exc
    return signers
