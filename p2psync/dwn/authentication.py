"""Authentication: every signature a message's authorization carries must verify.

The reference's ``authenticate`` (``src/core/auth.ts`` in dwn-sdk-js 0.5.2). It lives above
:mod:`p2psync.dwn.records_write` because a delegated grant is itself a RecordsWrite whose
structure is checked before its signature.
"""

from __future__ import annotations

from typing import Any

from p2psync.dwn import jws
from p2psync.dwn.errors import DwnError
from p2psync.dwn.records_write import RecordsWrite

__all__ = ["authenticate", "signed_jwses", "verify_ahead"]


def authenticate(authorization: dict[str, Any] | None) -> None:
    """Verify every signature the authorization carries (401 on the first failure)."""
    if authorization is None:
        raise DwnError("AuthenticateJwsMissing", "Missing JWS.", 401)
    jws.verify(authorization["signature"])
    if "ownerSignature" in authorization:
        jws.verify(authorization["ownerSignature"])
    for key in ("authorDelegatedGrant", "ownerDelegatedGrant"):
        grant = authorization.get(key)
        if grant is not None:
            # The delegated grant is itself a RecordsWrite; parse it for structure first.
            RecordsWrite.parse(grant)
            jws.verify(grant["authorization"]["signature"])


def signed_jwses(message: Any) -> list[dict[str, Any]]:
    """The General JWSes :func:`authenticate` verifies for ``message``, those that can be read:
    what a worker verifying ahead takes (p2psync/dwn/ahead.py)."""
    authorization = message.get("authorization") if isinstance(message, dict) else None
    if not isinstance(authorization, dict):
        return []
    jwses = [authorization.get("signature"), authorization.get("ownerSignature")]
    for key in ("authorDelegatedGrant", "ownerDelegatedGrant"):
        grant = authorization.get(key)
        inner = grant.get("authorization") if isinstance(grant, dict) else None
        if isinstance(inner, dict):
            jwses.append(inner.get("signature"))
    return [jws_ for jws_ in jwses if isinstance(jws_, dict)]


def verify_ahead(message: Any) -> int:
    """Verify, on a worker thread, the signatures :func:`authenticate` will verify for
    ``message``, keeping each acceptance for the engine (:class:`p2psync.dwn.ed25519.Ahead`);
    returns how many were accepted. Never raises: whatever it cannot read is left to the
    engine, which checks the structure and verifies again anything not kept."""
    return sum(jws.verify_ahead(jws_) for jws_ in signed_jwses(message))
