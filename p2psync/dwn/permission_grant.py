"""Permission grants and requests as they are read from their records.

The reference's ``PermissionGrant`` and ``PermissionRequest`` (``src/protocols/permission-*.ts``
in dwn-sdk-js 0.5.2): a view over the data-encoded RecordsWrite of a permissions-protocol
record. It sits below both :mod:`p2psync.dwn.records_util` (which checks a delegated grant a
message embeds) and :mod:`p2psync.dwn.permissions` (which authors, fetches and validates
permission records), so neither has to import the other.
"""

from __future__ import annotations

import json
from typing import Any, Final

from p2psync.dwn.encoding import b64url_decode
from p2psync.dwn.js_values import JS_TYPE_ERROR, UNDEFINED, js_error, js_get
from p2psync.dwn.jws import signer_did

__all__ = [
    "JSON_SYNTAX_ERROR",
    "PermissionGrant",
    "PermissionRequest",
    "parse_json_data",
]

#: Code for permission data that is not JSON. The reference lets ``JSON.parse`` throw a plain
#: ``SyntaxError`` there (no DwnError code), so the record is not answered with a 400.
JSON_SYNTAX_ERROR: Final = "SyntaxError"


# --------------------------------------------------------------------------- data parsing


def parse_json_data(data: bytes) -> Any:
    """Parse record data as the reference does: ``JSON.parse(new TextDecoder().decode(data))``.

    Invalid UTF-8 becomes U+FFFD and one leading BOM is dropped (TextDecoder's defaults);
    ``NaN``/``Infinity``, which Python's parser would take, are refused as JS refuses them.
    Raises ``DwnError(SyntaxError)`` when the text is not JSON.
    """
    text = data.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise js_error(
            JSON_SYNTAX_ERROR, f"permission record data is not valid JSON: {exc}"
        ) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"Unexpected token {name[0]!r} in JSON")


def _decode_encoded_data(message: Any) -> Any:
    # `Encoder.base64UrlToObject(message.encodedData)`: TypeError when absent.
    encoded = js_get(message, "encodedData")
    if not isinstance(encoded, str):
        raise js_error(JS_TYPE_ERROR, "permission record has no encodedData to read")
    return parse_json_data(b64url_decode(encoded))


def _top_level(data: Any, key: str) -> Any:
    """A member of the decoded data; ``None`` when absent.

    At this level ``null`` and an absent member lead every check to the same outcome, so
    callers get plain ``None`` for both.
    """
    value = js_get(data, key)
    return None if value is UNDEFINED else value


def _signer_or_none(message: Any) -> str | None:
    authorization = js_get(message, "authorization")
    if authorization is UNDEFINED:
        return None
    return signer_did(js_get(authorization, "signature"))


# --------------------------------------------------------------------------- grants and requests


class PermissionGrant:
    """A permission grant read from its RecordsWrite (which must carry ``encodedData``).

    Attributes hold the values as the grant message states them; the grant data members are
    ``None`` when absent. ``scope`` is kept raw (a dict for any grant that passed
    :func:`validate_schema`; an embedded delegated grant is never schema-checked).
    """

    __slots__ = (
        "message",
        "data",
        "id",
        "grantor",
        "grantee",
        "date_granted",
        "date_expires",
        "request_id",
        "description",
        "delegated",
        "scope",
        "conditions",
    )

    def __init__(self, message: dict[str, Any]) -> None:
        descriptor = js_get(message, "descriptor")
        self.message = message
        self.id: str = _top_level(message, "recordId")
        self.grantor: str | None = _signer_or_none(message)
        self.grantee: str | None = _top_level(descriptor, "recipient")
        self.date_granted: str = _top_level(descriptor, "dateCreated")
        data = _decode_encoded_data(message)
        if data is None:
            raise js_error(JS_TYPE_ERROR, "Cannot read properties of null (reading 'dateExpires')")
        self.data: Any = data
        self.date_expires: Any = _top_level(data, "dateExpires")
        self.delegated: Any = _top_level(data, "delegated")
        self.description: Any = _top_level(data, "description")
        self.request_id: Any = _top_level(data, "requestId")
        self.scope: Any = _top_level(data, "scope")
        self.conditions: Any = _top_level(data, "conditions")

    @classmethod
    def parse(cls, message: dict[str, Any]) -> PermissionGrant:
        """Read a grant from its data-encoded RecordsWrite message."""
        return cls(message)

    def __repr__(self) -> str:
        return (
            f"PermissionGrant(id={self.id!r}, grantor={self.grantor!r}, grantee={self.grantee!r})"
        )


class PermissionRequest:
    """A permission request read from its data-encoded RecordsWrite."""

    __slots__ = (
        "message",
        "data",
        "id",
        "requester",
        "delegated",
        "description",
        "scope",
        "conditions",
    )

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message
        self.id: str = _top_level(message, "recordId")
        self.requester: str | None = _signer_or_none(message)
        data = _decode_encoded_data(message)
        if data is None:
            raise js_error(JS_TYPE_ERROR, "Cannot read properties of null (reading 'delegated')")
        self.data: Any = data
        self.delegated: Any = _top_level(data, "delegated")
        self.description: Any = _top_level(data, "description")
        self.scope: Any = _top_level(data, "scope")
        self.conditions: Any = _top_level(data, "conditions")

    @classmethod
    def parse(cls, message: dict[str, Any]) -> PermissionRequest:
        """Read a request from its data-encoded RecordsWrite message."""
        return cls(message)
