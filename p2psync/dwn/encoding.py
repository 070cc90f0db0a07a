"""Byte-level encodings shared by the engine: base64url, DAG-CBOR and CIDv1 strings.

The reference DWN computes every message CID as CIDv1(dag-cbor, sha2-256) over the DAG-CBOR
encoding of a JSON-shaped object, and writes it in base32 (``bafyrei…``). cbor2's canonical
encoder produces the same bytes as DAG-CBOR (length-first key order, shortest integer heads)
for everything except floats, which it shrinks; DAG-CBOR always writes 64-bit floats. So the
hot path uses cbor2 and only objects that hold a non-integral float take the exact, slower
``dag_cbor`` path.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from typing import Any

import cbor2
import dag_cbor

from p2psync.dwn.errors import DwnError

# Multicodec and multihash codes (multiformats table).
CODEC_RAW = 0x55
CODEC_DAG_PB = 0x70
CODEC_DAG_CBOR = 0x71
MULTIHASH_SHA2_256 = 0x12

_CIDV1_DAG_CBOR_PREFIX = bytes([0x01, CODEC_DAG_CBOR, MULTIHASH_SHA2_256, 0x20])
_CIDV1_RAW_PREFIX = bytes([0x01, CODEC_RAW, MULTIHASH_SHA2_256, 0x20])

# JavaScript numbers are exact integers up to 2**53 - 1; the reference encodes an integral
# number as a CBOR integer, so we do the same for integral floats in that range.
_JS_MAX_SAFE_INTEGER = 2**53 - 1

_B64URL_RE = re.compile(r"[A-Za-z0-9_-]*")


# --------------------------------------------------------------------------- base64url


def b64url_encode(data: bytes) -> str:
    """base64url without padding (RFC 4648 §5), as the reference writes it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Strict base64url decoding: no padding, no stray characters, canonical trailing bits.

    The reference (multiformats' rfc4648 decoder) rejects all three, so a lenient decoder
    would accept messages the reference refuses.
    """
    if not isinstance(text, str) or _B64URL_RE.fullmatch(text) is None or len(text) % 4 == 1:
        raise DwnError("Base64UrlInvalid", "not a canonical unpadded base64url string", 400)
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise DwnError("Base64UrlInvalid", str(exc), 400) from exc
    if b64url_encode(data) != text:
        raise DwnError("Base64UrlInvalid", "non-canonical trailing bits", 400)
    return data


def b64url_json(text: str) -> Any:
    """Decode base64url, then parse the bytes as JSON (the JWS payload and header form)."""
    raw = b64url_decode(text)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DwnError("JsonInvalid", "base64url content is not JSON", 400) from exc


def json_compact(value: Any) -> str:
    """``JSON.stringify`` of a JSON-shaped value: no spaces, keys in insertion order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# --------------------------------------------------------------------------- DAG-CBOR


def _normalize(value: Any) -> tuple[Any, bool]:
    """Return ``value`` with integral floats turned into ints, and whether a float remains."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        has_float = False
        for key, item in value.items():
            item, f = _normalize(item)
            out[key] = item
            has_float = has_float or f
        return out, has_float
    if isinstance(value, list):
        items = []
        has_float = False
        for item in value:
            item, f = _normalize(item)
            items.append(item)
            has_float = has_float or f
        return items, has_float
    if type(value) is int and not -_JS_MAX_SAFE_INTEGER <= value <= _JS_MAX_SAFE_INTEGER:
        # A JS number past 2**53 is a double, and the reference encodes it as one.
        return float(value), True
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DwnError("DagCborInvalidNumber", "NaN and Infinity have no DAG-CBOR form", 400)
        if value.is_integer() and abs(value) <= _JS_MAX_SAFE_INTEGER:
            return int(value), False
        return value, True
    return value, False


def _has_float(value: Any) -> bool:
    # A cheap scan first (no recursion, no generators): most messages hold no float at
    # all, so they skip the copy and go straight to cbor2.
    stack = [value]
    pop, push_all = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            push_all(item.values())
        elif kind is list:
            push_all(item)
        elif kind is float or (kind is int and not -_JS_MAX_SAFE_INTEGER <= item <= _JS_MAX_SAFE_INTEGER):
            return True
    return False


def dag_cbor_encode(value: Any) -> bytes:
    """Encode a JSON-shaped value exactly as ``@ipld/dag-cbor`` does for the same JS value."""
    if _has_float(value):
        value, has_float = _normalize(value)
        if has_float:
            try:
                return bytes(dag_cbor.encode(value))
            except (TypeError, ValueError) as exc:
                raise DwnError("DagCborEncodeFailed", str(exc), 400) from exc
    try:
        return cbor2.dumps(value, canonical=True)
    except (TypeError, ValueError, cbor2.CBOREncodeError) as exc:
        raise DwnError("DagCborEncodeFailed", str(exc), 400) from exc


# --------------------------------------------------------------------------- CIDs


_B32_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
# Every 10-bit value to its two base32 characters: one lookup per 10 bits of input.
_B32_PAIRS = [a + b for a in _B32_ALPHABET for b in _B32_ALPHABET]


def base32_multibase(cid_bytes: bytes) -> str:
    """multibase 'b': lowercase RFC 4648 base32 without padding (hot path: every CID)."""
    pad = -len(cid_bytes) % 5
    n = int.from_bytes(cid_bytes + b"\0" * pad, "big")
    groups = (len(cid_bytes) + pad) // 5 * 4  # 10-bit groups
    pairs = _B32_PAIRS
    out = [pairs[(n >> (10 * i)) & 0x3FF] for i in range(groups - 1, -1, -1)]
    text = "".join(out)
    # drop the characters that encode only padding
    keep = (len(cid_bytes) * 8 + 4) // 5
    return "b" + text[:keep]


def cid_from_digest(codec: int, digest: bytes) -> str:
    """CIDv1 string for a sha2-256 digest under ``codec``."""
    return base32_multibase(bytes([0x01, codec, MULTIHASH_SHA2_256, 0x20]) + digest)


def cid_of_bytes(encoded: bytes) -> str:
    """CIDv1 of already DAG-CBOR-encoded bytes."""
    return base32_multibase(_CIDV1_DAG_CBOR_PREFIX + hashlib.sha256(encoded).digest())


def compute_cid(value: Any) -> str:
    """CIDv1(dag-cbor, sha2-256) of a JSON-shaped value: the reference's ``Cid.computeCid``."""
    return cid_of_bytes(dag_cbor_encode(value))


def message_cid(message: dict[str, Any]) -> str:
    """The reference's ``Message.getCid``: the whole message less a *non-empty* encodedData."""
    if message.get("encodedData"):
        message = {k: v for k, v in message.items() if k != "encodedData"}
    return compute_cid(message)


def raw_cid(data: bytes) -> str:
    """CIDv1(raw, sha2-256) of bytes."""
    return base32_multibase(_CIDV1_RAW_PREFIX + hashlib.sha256(data).digest())


_CID_STRING_RE = re.compile(r"b[a-z2-7]+")


def parse_cid(text: str) -> tuple[int, bytes]:
    """Parse a base32 CIDv1 string into (codec, sha2-256 digest); 400 when it is not one."""
    if not isinstance(text, str) or _CID_STRING_RE.fullmatch(text) is None:
        raise DwnError("ParseCidInvalid", f"{text!r} is not a base32 CIDv1", 400)
    body = text[1:].upper()
    try:
        raw = base64.b32decode(body + "=" * (-len(body) % 8))
    except (binascii.Error, ValueError) as exc:
        raise DwnError("ParseCidInvalid", f"{text!r} is not a base32 CIDv1", 400) from exc
    if len(raw) != 36 or raw[0] != 0x01 or raw[2] != MULTIHASH_SHA2_256 or raw[3] != 0x20:
        raise DwnError("ParseCidInvalid", f"{text!r} is not a sha2-256 CIDv1", 400)
    return raw[1], raw[4:]
