"""The Messages interface (Query, Read, Subscribe) and RecordsSubscribe: parsing and authoring.

Mirrors dwn-sdk-js 0.5.2 ``interfaces/messages-*.ts``, ``interfaces/records-subscribe.ts`` and
``utils/messages.ts``. Each ``parse`` runs the reference's integrity checks in the reference's
order, after the engine's JSON-schema check; every failure is a 400-class :class:`DwnError`.

Messages-interface messages are always signed (their schema requires ``authorization``) and
carry no delegated grant; their author is their signer.
"""

from __future__ import annotations

import base64
from typing import Any, Final

from p2psync.dwn import js_values, records_util, schemas
from p2psync.dwn.did import Identity
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import GenericMessage, validate_signature_structure
from p2psync.dwn.permissions import PERMISSIONS_PROTOCOL_URI
from p2psync.dwn.records import create_authorization
from p2psync.dwn.timeutil import now_timestamp, validate_timestamp
from p2psync.dwn.urls import (
    normalize_protocol_url,
    validate_protocol_url_normalized,
    validate_schema_url_normalized,
)

__all__ = [
    "MessagesQuery",
    "MessagesRead",
    "MessagesSubscribe",
    "RecordsSubscribe",
    "convert_filters",
    "create_messages_query",
    "create_messages_read",
    "create_messages_subscribe",
    "create_records_subscribe",
    "message_cid_lookup_key",
    "normalize_filters",
]

Message = dict[str, Any]

MESSAGES: Final = "Messages"
RECORDS: Final = "Records"
QUERY: Final = "Query"
READ: Final = "Read"
SUBSCRIBE: Final = "Subscribe"

# Multicodec / multihash codes the reference's ``Cid.parseCid`` accepts (utils/cid.ts: only
# dag-cbor and sha2-256 are in its tables).
_DAG_CBOR: Final = 0x71
_SHA2_256: Final = 0x12
# What a CIDv0 implies: ``CID.inspectBytes`` reads a leading 18 (sha2-256) as version 0 dag-pb.
_CIDV0_MARKER: Final = 18

_B58_ALPHABET: Final = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX: Final = {c: i for i, c in enumerate(_B58_ALPHABET)}
_B32_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz234567"
_B32_INDEX: Final = {c: i for i, c in enumerate(_B32_ALPHABET)}


# --------------------------------------------------------------------------- message CIDs


def _invalid_cid(text: Any) -> DwnError:
    return DwnError("MessagesReadInvalidCid", f"{text} is not a valid CID")


def _base58btc_decode(text: str) -> bytes:
    # multiformats' base-x: leading '1's are zero bytes, a leading space or any character
    # outside the alphabet fails, the empty string is no bytes.
    if text == "":
        return b""
    zeros = len(text) - len(text.lstrip("1"))
    number = 0
    for ch in text[zeros:]:
        digit = _B58_INDEX.get(ch)
        if digit is None:
            raise ValueError("not base58btc")
        number = number * 58 + digit
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    return b"\0" * zeros + body


def _base32_decode(text: str) -> bytes:
    # multiformats' RFC 4648 decoder: trailing '=' ignored, leftover bits must be < 5 and zero.
    end = len(text)
    while end > 0 and text[end - 1] == "=":
        end -= 1
    out = bytearray()
    buffer = bits = 0
    for ch in text[:end]:
        value = _B32_INDEX.get(ch)
        if value is None:
            raise ValueError("not base32")
        buffer = ((buffer << 5) | value) & 0xFFFF
        bits += 5
        if bits >= 8:
            bits -= 8
            out.append((buffer >> bits) & 0xFF)
    if bits >= 5 or (buffer << (8 - bits)) & 0xFF:
        raise ValueError("unexpected end of base32 data")
    return bytes(out)


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    # Unsigned LEB128 as multiformats reads it: non-minimal encodings are accepted.
    value = shift = 0
    while True:
        if offset >= len(data):
            raise ValueError("could not decode varint")
        byte = data[offset]
        offset += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, offset


def message_cid_lookup_key(text: Any) -> str:
    """The store key a MessagesRead ``messageCid`` finds, or 400 ``MessagesReadInvalidCid``.

    The reference accepts what multiformats' ``CID.parse`` accepts (base32 ``b…``, base58btc
    ``z…`` and bare CIDv0 ``Q…``) when it is a CIDv1 of dag-cbor with a sha2-256 multihash.
    The message store then looks up the CID's string form: a base32 input is looked up
    verbatim (multiformats caches the source string), any other input under its canonical
    base32 form. So a base58btc spelling of a stored message's CID finds it, while a base32
    one with ``=`` padding or non-minimal varints parses but finds nothing.
    """
    if not isinstance(text, str) or text == "":
        raise _invalid_cid(text)
    prefix = text[0]
    try:
        if prefix == "Q":
            data = _base58btc_decode(text)
        elif prefix == "z":
            data = _base58btc_decode(text[1:])
        elif prefix == "b":
            data = _base32_decode(text[1:])
        else:
            raise ValueError("unsupported multibase")
        version, offset = _read_varint(data, 0)
        codec = 0x70  # dag-pb, what a CIDv0 is
        if version == _CIDV0_MARKER:
            version, offset = 0, 0
        else:
            codec, offset = _read_varint(data, offset)
        if version not in (0, 1):
            raise ValueError("invalid CID version")
        prefix_size = offset
        multihash_code, offset = _read_varint(data, offset)
        digest_size, offset = _read_varint(data, offset)
        size = offset + digest_size
        multihash = data[prefix_size:size]
        if len(multihash) != size - prefix_size or len(data) != size:
            raise ValueError("incorrect CID length")
        if version == 0 and prefix != "Q":
            raise ValueError("a CIDv0 string has no multibase prefix")
    except ValueError:
        raise _invalid_cid(text) from None
    if codec != _DAG_CBOR or multihash_code != _SHA2_256:
        raise _invalid_cid(text)
    if prefix == "b":
        return text
    canonical = bytes([0x01, _DAG_CBOR]) + multihash
    return "b" + base64.b32encode(canonical).decode("ascii").lower().rstrip("=")


# --------------------------------------------------------------------------- filters


def _reject_null(value: Any) -> None:
    # removeUndefinedProperties recurses into every object and calls Object.keys on it,
    # which throws for null.
    if value is None:
        raise js_values.js_error(
            js_values.JS_TYPE_ERROR, "Cannot convert undefined or null to object"
        )
    if isinstance(value, dict):
        for item in value.values():
            _reject_null(item)
    elif isinstance(value, list):
        for item in value:
            _reject_null(item)


def normalize_filters(filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``Messages.normalizeFilters``: protocol URLs normalized, empty filters dropped."""
    normalized: list[dict[str, Any]] = []
    for flt in filters:
        copy = dict(flt)
        if isinstance(copy.get("protocol"), str):
            copy["protocol"] = normalize_protocol_url(copy["protocol"])
        _reject_null(list(copy.values()))
        if copy:
            normalized.append(copy)
    return normalized


def convert_filters(filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``Messages.convertFilters``: MessagesFilters as event-log filters.

    A filter naming a protocol also brings in the permission records (grants, requests,
    revocations) about that protocol, which live in the permissions protocol and carry the
    protocol as their ``protocol`` tag; that filter comes first, as in the reference.
    ``messageTimestamp: {from, to}`` becomes ``{gte, lt}``.
    """
    converted: list[dict[str, Any]] = []
    for flt in filters:
        time_range = flt.get("messageTimestamp")
        if "protocol" in flt:
            permission_filter: dict[str, Any] = {
                "protocol": PERMISSIONS_PROTOCOL_URI,
                **records_util.convert_tags_filter({"protocol": flt["protocol"]}),
            }
            if time_range is not None:
                range_filter = records_util.convert_range_criterion(time_range)
                if range_filter is not None:
                    permission_filter["messageTimestamp"] = range_filter
            converted.append(permission_filter)
        copy = dict(flt)
        if js_values.js_truthy(time_range):
            range_filter = records_util.convert_range_criterion(time_range)
            if range_filter is not None:
                copy["messageTimestamp"] = range_filter
                copy.pop("dateUpdated", None)
        converted.append(copy)
    return converted


def _validate_filter_protocols(filters: list[dict[str, Any]]) -> None:
    for flt in filters:
        if flt.get("protocol") is not None:
            validate_protocol_url_normalized(flt["protocol"])


# --------------------------------------------------------------------------- parsed messages


class MessagesQuery(GenericMessage):
    """A parsed MessagesQuery: which of a tenant's event-log entries to list."""

    __slots__ = ()

    @classmethod
    def parse(cls, message: Message) -> MessagesQuery:
        """Signature structure, then normalized filter protocols (the reference checks no
        timestamp here)."""
        descriptor = message["descriptor"]
        validate_signature_structure(message["authorization"]["signature"], descriptor)
        _validate_filter_protocols(descriptor["filters"])
        return cls(message)


class MessagesRead(GenericMessage):
    """A parsed MessagesRead: one stored message (with its data, for a RecordsWrite) by CID."""

    __slots__ = ()

    @classmethod
    def parse(cls, message: Message) -> MessagesRead:
        """The CID first, then signature structure and timestamp."""
        descriptor = message["descriptor"]
        message_cid_lookup_key(descriptor.get("messageCid"))
        validate_signature_structure(message["authorization"]["signature"], descriptor)
        validate_timestamp(descriptor["messageTimestamp"])
        return cls(message)

    @property
    def lookup_key(self) -> str:
        """The store key the requested CID resolves to (see :func:`message_cid_lookup_key`)."""
        return message_cid_lookup_key(self.descriptor["messageCid"])


class MessagesSubscribe(GenericMessage):
    """A parsed MessagesSubscribe: a live feed of a tenant's events matching the filters."""

    __slots__ = ()

    @classmethod
    def parse(cls, message: Message) -> MessagesSubscribe:
        """Signature structure, normalized filter protocols, then the timestamp."""
        descriptor = message["descriptor"]
        validate_signature_structure(message["authorization"]["signature"], descriptor)
        _validate_filter_protocols(descriptor["filters"])
        validate_timestamp(descriptor["messageTimestamp"])
        return cls(message)


class RecordsSubscribe(GenericMessage):
    """A parsed RecordsSubscribe: a live feed of the records a RecordsQuery would list."""

    __slots__ = ()

    @classmethod
    def parse(cls, message: Message) -> RecordsSubscribe:
        """The reference's order: signature structure, delegated grant, role needs a
        ``protocolPath``, normalized URLs, timestamp."""
        descriptor = message["descriptor"]
        flt = descriptor["filter"]
        payload = None
        if "authorization" in message:
            signature = message["authorization"]["signature"]
            payload = validate_signature_structure(signature, descriptor)
        records_util.validate_delegated_grant_referential_integrity(message, payload)
        if payload is not None and "protocolRole" in payload and "protocolPath" not in flt:
            raise DwnError(
                "RecordsSubscribeFilterMissingRequiredProperties",
                "Role-authorized subscriptions must include `protocolPath` in the filter",
            )
        if "protocol" in flt:
            validate_protocol_url_normalized(flt["protocol"])
        if "schema" in flt:
            validate_schema_url_normalized(flt["schema"])
        validate_timestamp(descriptor["messageTimestamp"])
        return cls(message)


# --------------------------------------------------------------------------- authoring


def create_messages_query(
    *,
    signer: Identity,
    filters: list[dict[str, Any]] | None = None,
    cursor: dict[str, Any] | None = None,
    message_timestamp: str | None = None,
    permission_grant_id: str | None = None,
) -> Message:
    """Author a MessagesQuery (filters normalized and empty ones dropped, as ``create`` does)."""
    descriptor: dict[str, Any] = {
        "interface": MESSAGES,
        "method": QUERY,
        "filters": normalize_filters(filters) if filters else [],
        "messageTimestamp": message_timestamp or now_timestamp(),
    }
    if cursor is not None:
        descriptor["cursor"] = cursor
    message: Message = {
        "descriptor": descriptor,
        "authorization": create_authorization(
            descriptor, signer, permission_grant_id=permission_grant_id
        ),
    }
    schemas.validate("MessagesQuery", message)
    return message


def create_messages_read(
    *,
    signer: Identity,
    message_cid: str,
    message_timestamp: str | None = None,
    permission_grant_id: str | None = None,
) -> Message:
    """Author a MessagesRead of the message with CID ``message_cid``."""
    descriptor: dict[str, Any] = {
        "interface": MESSAGES,
        "method": READ,
        "messageCid": message_cid,
        "messageTimestamp": message_timestamp or now_timestamp(),
    }
    message: Message = {
        "descriptor": descriptor,
        "authorization": create_authorization(
            descriptor, signer, permission_grant_id=permission_grant_id
        ),
    }
    schemas.validate("MessagesRead", message)
    message_cid_lookup_key(message_cid)
    return message


def create_messages_subscribe(
    *,
    signer: Identity,
    filters: list[dict[str, Any]] | None = None,
    message_timestamp: str | None = None,
    permission_grant_id: str | None = None,
) -> Message:
    """Author a MessagesSubscribe (the reference's ``create`` does not normalize its filters)."""
    descriptor: dict[str, Any] = {
        "interface": MESSAGES,
        "method": SUBSCRIBE,
        "filters": list(filters) if filters is not None else [],
        "messageTimestamp": message_timestamp or now_timestamp(),
    }
    message: Message = {
        "descriptor": descriptor,
        "authorization": create_authorization(
            descriptor, signer, permission_grant_id=permission_grant_id
        ),
    }
    schemas.validate("MessagesSubscribe", message)
    return message


def create_records_subscribe(
    *,
    filter: dict[str, Any],  # noqa: A002 - the reference's option name
    signer: Identity | None = None,
    message_timestamp: str | None = None,
    protocol_role: str | None = None,
    delegated_grant: Message | None = None,
) -> Message:
    """Author a RecordsSubscribe, signed when ``signer`` is given (filter URLs normalized)."""
    descriptor: dict[str, Any] = {
        "interface": RECORDS,
        "method": SUBSCRIBE,
        "messageTimestamp": message_timestamp or now_timestamp(),
        "filter": records_util.normalize_filter(filter),
    }
    message: Message = {"descriptor": descriptor}
    if signer is not None:
        message["authorization"] = create_authorization(
            descriptor, signer, protocol_role=protocol_role, delegated_grant=delegated_grant
        )
    schemas.validate("RecordsSubscribe", message)
    return message
