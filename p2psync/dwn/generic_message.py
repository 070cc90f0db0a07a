"""What every DWN message shares: signer and author, CIDs, ordering, signature structure.

Messages stay plain JSON-shaped dicts, exactly as they travel; these helpers read them the
way the reference's ``Message`` and ``AbstractMessage`` do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from p2psync.dwn import jws, schemas
from p2psync.dwn.encoding import compute_cid, message_cid
from p2psync.dwn.errors import DwnError

__all__ = [
    "GenericMessage",
    "compare_message_timestamp",
    "get_author",
    "get_newest_message",
    "get_oldest_message",
    "get_signer",
    "is_newer",
    "is_older",
    "message_cid",
    "validate_signature_structure",
]

Message = dict[str, Any]


def get_signer(message: Message) -> str | None:
    """DID that signed ``authorization.signature``; None for an unsigned message."""
    authorization = message.get("authorization")
    if authorization is None:
        return None
    return jws.signer_did(authorization["signature"])


def get_author(message: Message) -> str | None:
    """The logical author: the grantor of an author-delegated grant, else the signer."""
    authorization = message.get("authorization")
    if authorization is None:
        return None
    delegated = authorization.get("authorDelegatedGrant")
    if delegated is not None:
        return get_signer(delegated)
    return get_signer(message)


def compare_message_timestamp(a: Message, b: Message) -> int:
    """1 when ``a`` is newer, -1 when older, 0 when it is the same message.

    Ties on ``messageTimestamp`` fall back to the lexicographic order of message CIDs.
    """
    ta, tb = a["descriptor"]["messageTimestamp"], b["descriptor"]["messageTimestamp"]
    if ta != tb:
        return 1 if ta > tb else -1
    ca, cb = message_cid(a), message_cid(b)
    return (ca > cb) - (ca < cb)


def is_newer(a: Message, b: Message) -> bool:
    return compare_message_timestamp(a, b) > 0


def is_older(a: Message, b: Message) -> bool:
    return compare_message_timestamp(a, b) < 0


def get_newest_message(messages: Iterable[Message]) -> Message | None:
    newest: Message | None = None
    for m in messages:
        if newest is None or is_newer(m, newest):
            newest = m
    return newest


def get_oldest_message(messages: Iterable[Message]) -> Message | None:
    oldest: Message | None = None
    for m in messages:
        if oldest is None or is_older(m, oldest):
            oldest = m
    return oldest


def validate_signature_structure(
    signature: dict[str, Any],
    descriptor: dict[str, Any],
    payload_schema: str = "GenericSignaturePayload",
) -> dict[str, Any]:
    """One signature, a payload that passes its schema, and a matching ``descriptorCid``.

    The signature itself is *not* verified here (that is
    :func:`p2psync.dwn.authentication.authenticate`).
    """
    return check_signature_structure(signature, lambda: compute_cid(descriptor), payload_schema)


def check_signature_structure(
    signature: dict[str, Any],
    descriptor_cid: Callable[[], str],
    payload_schema: str = "GenericSignaturePayload",
) -> dict[str, Any]:
    """:func:`validate_signature_structure` with the descriptor's CID computed by the caller.

    ``descriptor_cid`` is called only after the payload passed its schema, where the
    reference computes it, so a failure to encode the descriptor surfaces at the same step.
    """
    if len(signature["signatures"]) != 1:
        raise DwnError(
            "AuthenticationMoreThanOneSignatureNotSupported",
            "expected no more than 1 signature for authorization purpose",
        )
    payload = jws.decode_payload(signature)
    schemas.validate(payload_schema, payload)
    expected = descriptor_cid()
    if payload.get("descriptorCid") != expected:
        raise DwnError(
            "AuthenticateDescriptorCidMismatch",
            f"provided descriptorCid {payload.get('descriptorCid')} does not match expected CID {expected}",
        )
    return payload


class GenericMessage:
    """A parsed signed-or-unsigned message: the reference's ``AbstractMessage``."""

    __slots__ = ("message", "signer", "author", "signature_payload")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.signer: str | None = None
        self.author: str | None = None
        self.signature_payload: dict[str, Any] | None = None
        authorization = message.get("authorization")
        if authorization is not None:
            self.signer = get_signer(message)
            delegated = authorization.get("authorDelegatedGrant")
            self.author = get_signer(delegated) if delegated is not None else self.signer
            self.signature_payload = jws.decode_payload(authorization["signature"])

    @property
    def is_signed_by_author_delegate(self) -> bool:
        return "authorDelegatedGrant" in self.message.get("authorization", {})

    @property
    def descriptor(self) -> dict[str, Any]:
        return self.message["descriptor"]  # type: ignore[no-any-return]

    @property
    def cid(self) -> str:
        return message_cid(self.message)
