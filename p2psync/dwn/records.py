"""Authoring of RecordsRead, RecordsQuery and RecordsDelete messages (RecordsWrite has its own module)."""

from __future__ import annotations

from typing import Any

from p2psync.dwn import jws, records_util
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import compute_cid, message_cid
from p2psync.dwn.timeutil import now_timestamp

Message = dict[str, Any]

# A RecordsQuery filter must name at least one property; this one admits every record (each
# was created after 2000), for "list everything".
ALL_RECORDS_FILTER: dict[str, Any] = {"dateCreated": {"from": "2000-01-01T00:00:00.000000Z"}}


def create_authorization(
    descriptor: dict[str, Any],
    signer: Identity,
    *,
    permission_grant_id: str | None = None,
    protocol_role: str | None = None,
    delegated_grant: Message | None = None,
) -> dict[str, Any]:
    """``authorization`` of a non-RecordsWrite message: a JWS over descriptorCid and options."""
    items: list[tuple[str, Any]] = [
        ("descriptorCid", compute_cid(descriptor)),
        ("delegatedGrantId", message_cid(delegated_grant) if delegated_grant is not None else None),
        ("permissionGrantId", permission_grant_id),
        ("protocolRole", protocol_role),
    ]
    authorization: dict[str, Any] = {"signature": jws.sign_payload({k: v for k, v in items if v is not None}, signer)}
    if delegated_grant is not None:
        authorization["authorDelegatedGrant"] = delegated_grant
    return authorization


def create_records_read(
    *,
    filter: dict[str, Any],
    signer: Identity | None = None,
    message_timestamp: str | None = None,
    permission_grant_id: str | None = None,
    protocol_role: str | None = None,
    delegated_grant: Message | None = None,
) -> Message:
    descriptor = {
        "interface": "Records",
        "method": "Read",
        "filter": records_util.normalize_filter(filter),
        "messageTimestamp": message_timestamp or now_timestamp(),
    }
    message: Message = {"descriptor": descriptor}
    if signer is not None:
        message["authorization"] = create_authorization(
            descriptor, signer, permission_grant_id=permission_grant_id,
            protocol_role=protocol_role, delegated_grant=delegated_grant,
        )
    return message


def create_records_query(
    *,
    filter: dict[str, Any],
    signer: Identity | None = None,
    message_timestamp: str | None = None,
    date_sort: str | None = None,
    pagination: dict[str, Any] | None = None,
    protocol_role: str | None = None,
    delegated_grant: Message | None = None,
) -> Message:
    descriptor: dict[str, Any] = {
        "interface": "Records",
        "method": "Query",
        "messageTimestamp": message_timestamp or now_timestamp(),
        "filter": records_util.normalize_filter(filter),
    }
    if date_sort is not None:
        descriptor["dateSort"] = date_sort
    if pagination is not None:
        descriptor["pagination"] = pagination
    message: Message = {"descriptor": descriptor}
    if signer is not None:
        message["authorization"] = create_authorization(
            descriptor, signer, protocol_role=protocol_role, delegated_grant=delegated_grant
        )
    return message


def create_records_delete(
    *,
    record_id: str,
    signer: Identity,
    message_timestamp: str | None = None,
    prune: bool = False,
    protocol_role: str | None = None,
    delegated_grant: Message | None = None,
) -> Message:
    descriptor = {
        "interface": "Records",
        "method": "Delete",
        "messageTimestamp": message_timestamp or now_timestamp(),
        "recordId": record_id,
        "prune": prune,
    }
    return {
        "descriptor": descriptor,
        "authorization": create_authorization(
            descriptor, signer, protocol_role=protocol_role, delegated_grant=delegated_grant
        ),
    }
