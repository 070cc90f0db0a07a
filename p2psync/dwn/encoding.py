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
from collections.abc import Callable
from typing import Any

import cbor2
import dag_cbor

from p2psync.dwn import memo as _memo
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

_B64URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
# Characters that may end a 2-character (4 unused bits) or 3-character (2 unused bits) group.
_B64URL_LAST_OF_2 = frozenset(c for i, c in enumerate(_B64URL_ALPHABET) if i & 0xF == 0)
_B64URL_LAST_OF_3 = frozenset(c for i, c in enumerate(_B64URL_ALPHABET) if i & 0x3 == 0)
_B64URL_BYTES = _B64URL_ALPHABET.encode("ascii")
_B64URL_TO_STD = bytes.maketrans(b"-_", b"+/")
_STD_TO_B64URL = bytes.maketrans(b"+/", b"-_")
_B64_PADDING = (b"", b"", b"==", b"=")  # by length % 4


# --------------------------------------------------------------------------- base64url


def b64url_encode(data: bytes) -> str:
    """base64url without padding (RFC 4648 §5), as the reference writes it."""
    # binascii directly: base64.urlsafe_b64encode is two Python-level wrappers around it.
    return binascii.b2a_base64(data, newline=False).translate(_STD_TO_B64URL).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Strict base64url decoding: no padding, no stray characters, canonical trailing bits.

    The reference (multiformats' rfc4648 decoder) rejects stray characters and non-canonical
    trailing bits, so a lenient decoder would accept messages the reference refuses. It drops
    trailing ``=`` before it reads; its schemas hold a JWS's members and the other base64url
    members of a message to the unpadded alphabet, so there padding is refused before any
    decoding. What no schema holds so, a JWK's members, is read with :func:`b64url_decode_jwk`.
    """
    # Only alphabet characters: deleting them all must leave nothing (cheaper than a regex).
    if not isinstance(text, str) or not text.isascii():
        raise DwnError("Base64UrlInvalid", "not a canonical unpadded base64url string", 400)
    raw = text.encode("ascii")
    if raw.translate(None, _B64URL_BYTES):
        raise DwnError("Base64UrlInvalid", "not a canonical unpadded base64url string", 400)
    tail = len(text) % 4
    if tail == 1:
        raise DwnError("Base64UrlInvalid", "not a canonical unpadded base64url string", 400)
    # The last character of a partial group carries bits no byte uses; they must be zero.
    if (tail == 2 and text[-1] not in _B64URL_LAST_OF_2) or (tail == 3 and text[-1] not in _B64URL_LAST_OF_3):
        raise DwnError("Base64UrlInvalid", "non-canonical trailing bits", 400)
    try:
        return binascii.a2b_base64(raw.translate(_B64URL_TO_STD) + _B64_PADDING[tail])
    except (binascii.Error, ValueError) as exc:
        raise DwnError("Base64UrlInvalid", str(exc), 400) from exc


def b64url_decode_jwk(text: str) -> bytes:
    """A JWK member's bytes as the reference's verifiers decode them: :func:`b64url_decode`
    after any trailing ``=`` is dropped (multiformats' decoder does that first)."""
    return b64url_decode(text.rstrip("=") if isinstance(text, str) else text)


def data_b64url(data: bytes) -> str:
    """``b64url_encode(data)``: the text the data came in when the message being processed
    recorded it (:attr:`~p2psync.dwn.memo.MessageMemo.data_text`), saving ~4 µs a 1 KiB record."""
    held = _memo.current()
    known = held.data_text if held is not None else None
    if known is not None and known[0] is data:
        return known[1]
    return b64url_encode(data)


def b64url_json(text: str) -> Any:
    """Decode base64url, then parse the bytes as JSON (the JWS payload and header form)."""
    raw = b64url_decode(text)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DwnError("JsonInvalid", "base64url content is not JSON", 400) from exc


def compact_json_encoder(*, ensure_ascii: bool, allow_nan: bool = False) -> Callable[[Any], str]:
    """``json.JSONEncoder(separators=(",", ":"), ensure_ascii=..., allow_nan=...).encode``,
    the same text, with its C encoder built once: ``JSONEncoder.encode`` builds a new one on
    every call (~1 µs, three times a write; issue #17). Without the circular-reference check:
    the values are JSON-shaped trees (a cycle would be our bug, and ends in RecursionError)."""
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=allow_nan)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the standard path
        return encoder.encode
    string = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    chunks = make(None, encoder.default, string, None, ":", ",", False, False, allow_nan)
    join = "".join

    def encode(value: Any) -> str:
        return join(chunks(value, 0))

    return encode


_compact = compact_json_encoder(ensure_ascii=False)


def json_compact(value: Any) -> str:
    """``JSON.stringify`` of a JSON-shaped value: no spaces, keys in insertion order."""
    return _compact(value)


def in_dag_cbor_order(value: Any) -> Any:
    """``value`` with every map's keys in DAG-CBOR's order (shorter first, then bytewise): the
    order a message has when it comes over the wire, so a replica stores the same text whether
    it authored a message or received it. Returns ``value`` itself when already in that order
    (what a message decoded from the wire is), so facts kept about the object stay valid."""
    held = _memo.of(value)
    if held is not None and held.in_order:
        return value  # the message being processed, checked already (the pipe, then the engine)
    if _in_dag_cbor_order(value):
        if held is not None:
            held.in_order = True
        return value  # the common case (every replicated message): checked without copying
    return _reordered(value)


def _in_dag_cbor_order(value: Any) -> bool:
    """Whether every map of ``value`` is in DAG-CBOR key order (ASCII keys only; any other key
    leaves the answer to :func:`_reordered`)."""
    kind = type(value)
    if kind is dict:
        keys = tuple(value)
        in_order = _keys_in_order.get(keys)
        if in_order is None:
            in_order = _judge_key_order(keys)
        if not in_order:
            return False
        for member in value.values():
            if (type(member) is dict or type(member) is list) and not _in_dag_cbor_order(member):
                return False
        return True
    if kind is list:
        return all(_in_dag_cbor_order(member) for member in value if type(member) is dict or type(member) is list)
    return True


# Whether a map's keys, in insertion order, are in DAG-CBOR order: messages of one kind repeat
# the same few key sets, so each is judged once (a lookup instead of a loop a map; bounded).
_keys_in_order: dict[tuple[Any, ...], bool] = {}


def _judge_key_order(keys: tuple[Any, ...]) -> bool:
    length, previous, in_order = -1, "", True
    for key in keys:
        if type(key) is not str or not key.isascii():
            in_order = False
            break
        n = len(key)
        if n < length or (n == length and key <= previous):
            in_order = False
            break
        length, previous = n, key
    if len(_keys_in_order) < _KEY_ORDER_CACHE_MAX:
        _keys_in_order[keys] = in_order
    return in_order


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        items = [(key, _reordered(member)) for key, member in value.items()]
        keys = [key for key, _ in items]
        if not all(isinstance(key, str) for key in keys):
            return value  # not a JSON object: the integrity checks refuse it
        order = sorted(keys, key=_dag_cbor_key)
        if order == keys and all(member is value[key] for key, member in items):
            return value
        members = dict(items)
        return {key: members[key] for key in order}
    if isinstance(value, list):
        items_ = [_reordered(member) for member in value]
        return value if all(a is b for a, b in zip(items_, value, strict=True)) else items_
    return value


def _dag_cbor_key(key: str) -> tuple[int, bytes]:
    encoded = key.encode("utf-8")
    return len(encoded), encoded


def message_json(message: dict[str, Any]) -> str:
    """``json_compact(message)``, written once for the message being processed (its stored
    body and its archived body are the same text)."""
    held = _memo.of(message)
    if held is None:
        return _compact(message)
    if held.json is None:
        held.json = _compact(message)
    return held.json


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


def _exact_encode(value: Any) -> bytes:
    """The general encoder: cbor2's canonical form, or ``dag_cbor`` once a float is involved."""
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


# The fast encoder: DAG-CBOR of the JSON values messages are made of (str keys; str, int in
# the JS-safe range, bool, None, list, dict), written straight into a list of byte strings.
# cbor2's canonical mode sorts map keys through Python callbacks and costs ~3x more for a
# message. Anything else (a float, a big int, a bytes value, a non-str key, a lone
# surrogate) makes it give up, and the exact encoder above handles the whole value.


class _GiveUp(Exception):
    """The fast encoder met a value it does not handle; use :func:`_exact_encode`."""


def _head(major: int, n: int) -> bytes:
    """The initial bytes of a CBOR item: major type and argument, shortest form."""
    if n < 24:
        return bytes((major << 5 | n,))
    if n < 0x100:
        return bytes((major << 5 | 24, n))
    if n < 0x10000:
        return bytes((major << 5 | 25,)) + n.to_bytes(2, "big")
    if n < 0x100000000:
        return bytes((major << 5 | 26,)) + n.to_bytes(4, "big")
    return bytes((major << 5 | 27,)) + n.to_bytes(8, "big")


# Heads with an argument below 256, per major type: the common case is one list index.
_SMALL_HEADS = [[_head(major, n) for n in range(256)] for major in range(8)]
_UINT_HEADS, _NINT_HEADS, _TEXT_HEADS, _ARRAY_HEADS, _MAP_HEADS = (
    _SMALL_HEADS[0], _SMALL_HEADS[1], _SMALL_HEADS[3], _SMALL_HEADS[4], _SMALL_HEADS[5]
)

# Key order of a map, cached per tuple of keys in insertion order: messages of one kind
# repeat the same few key sets. Bounded so hostile input cannot grow it without limit.
_KEY_ORDER_CACHE_MAX = 4096
_key_orders: dict[tuple[str, ...], tuple[tuple[str, bytes], ...]] = {}


def _key_order(keys: tuple[Any, ...]) -> tuple[tuple[str, bytes], ...]:
    """DAG-CBOR map order (shorter UTF-8 key first, then bytewise) with each key's encoding."""
    items = []
    for key in keys:
        if type(key) is not str:
            raise _GiveUp
        raw = key.encode("utf-8")
        items.append((len(raw), raw, key))
    items.sort()
    order = tuple((key, _head(3, n) + raw) for n, raw, key in items)
    if len(_key_orders) < _KEY_ORDER_CACHE_MAX:
        _key_orders[keys] = order
    return order


def _fast_into(value: Any, out: list[bytes]) -> None:
    kind = type(value)
    if kind is str:
        raw = value.encode()
        n = len(raw)
        out.append(_TEXT_HEADS[n] if n < 0x100 else _head(3, n))
        out.append(raw)
    elif kind is dict:
        keys = tuple(value)
        order = _key_orders.get(keys) or _key_order(keys)
        n = len(order)
        out.append(_MAP_HEADS[n] if n < 0x100 else _head(5, n))
        for key, encoded_key in order:
            out.append(encoded_key)
            item = value[key]
            if type(item) is str:  # most members are strings: no call for them
                raw = item.encode()
                n = len(raw)
                out.append(_TEXT_HEADS[n] if n < 0x100 else _head(3, n))
                out.append(raw)
            else:
                _fast_into(item, out)
    elif kind is int:
        if value >= 0:
            if value > _JS_MAX_SAFE_INTEGER:
                raise _GiveUp
            out.append(_UINT_HEADS[value] if value < 0x100 else _head(0, value))
        else:
            if value < -_JS_MAX_SAFE_INTEGER:
                raise _GiveUp
            n = -1 - value
            out.append(_NINT_HEADS[n] if n < 0x100 else _head(1, n))
    elif kind is bool:
        out.append(b"\xf5" if value else b"\xf4")
    elif value is None:
        out.append(b"\xf6")
    elif kind is list:
        n = len(value)
        out.append(_ARRAY_HEADS[n] if n < 0x100 else _head(4, n))
        for item in value:
            _fast_into(item, out)
    else:
        raise _GiveUp


def _fast_encode(value: Any) -> bytes | None:
    """DAG-CBOR bytes of ``value``, or None when the fast encoder does not handle it."""
    out: list[bytes] = []
    try:
        _fast_into(value, out)
    except Exception:  # _GiveUp, a lone surrogate, a too-deep value: the exact path decides
        return None
    return b"".join(out)


def dag_cbor_encode(value: Any) -> bytes:
    """Encode a JSON-shaped value exactly as ``@ipld/dag-cbor`` does for the same JS value."""
    encoded = _fast_encode(value)
    return encoded if encoded is not None else _exact_encode(value)


# --------------------------------------------------------------------------- CIDs


# base32 without a per-character loop: a 40-byte block (64 groups of 5 bits) is one 320-bit
# integer; six steps move every 5-bit group into a byte of its own (160-bit halves into
# 256-bit slots, then 80 into 128, ... 5 into 8), and one ``bytes.translate`` maps the 64
# bytes to the alphabet. A step moves the high half of every slot up by ``shift`` bits:
# ``n + (n & high) * (2**shift - 1)`` (3 integer operations). A CID (36 bytes) is one
# block: ~3x fewer instructions than a lookup per 10 bits.
_B32_BLOCK_BYTES = 40
_B32_BLOCK_CHARS = 64


def _b32_spread_steps() -> tuple[tuple[int, int], ...]:
    steps = []
    slot, width = _B32_BLOCK_CHARS * 8, _B32_BLOCK_BYTES * 8  # 512-bit result, 320 bits in
    while width > 5:
        half, new_slot = width // 2, slot // 2
        high = 0
        for i in range(_B32_BLOCK_CHARS * 8 // slot):
            high |= ((1 << half) - 1) << (i * slot + half)
        steps.append((high, (1 << (new_slot - half)) - 1))
        slot, width = new_slot, half
    return tuple(steps)


(_B32_H0, _B32_M0), (_B32_H1, _B32_M1), (_B32_H2, _B32_M2), (_B32_H3, _B32_M3), (_B32_H4, _B32_M4), \
    (_B32_H5, _B32_M5) = _b32_spread_steps()
_B32_TABLE = bytes.maketrans(bytes(range(32)), b"abcdefghijklmnopqrstuvwxyz234567")


def _b32_groups(block: bytes) -> bytes:
    """64 bytes, each one 5-bit group of ``block`` (at most 40 bytes, zero-padded on the right)."""
    n = int.from_bytes(block, "big") << (8 * (_B32_BLOCK_BYTES - len(block)))
    n += (n & _B32_H0) * _B32_M0
    n += (n & _B32_H1) * _B32_M1
    n += (n & _B32_H2) * _B32_M2
    n += (n & _B32_H3) * _B32_M3
    n += (n & _B32_H4) * _B32_M4
    n += (n & _B32_H5) * _B32_M5
    return n.to_bytes(_B32_BLOCK_CHARS, "big")


def base32_multibase(cid_bytes: bytes) -> str:
    """multibase 'b': lowercase RFC 4648 base32 without padding (hot path: every CID)."""
    size = len(cid_bytes)
    if size <= _B32_BLOCK_BYTES:
        groups = _b32_groups(cid_bytes)
    else:
        groups = b"".join(
            _b32_groups(cid_bytes[i : i + _B32_BLOCK_BYTES]) for i in range(0, size, _B32_BLOCK_BYTES)
        )
    # keep only the characters that carry input bits
    return "b" + groups[: (size * 8 + 4) // 5].translate(_B32_TABLE).decode("ascii")


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
    held = _memo.of(message)
    if held is None:
        return _message_cid(message)
    if held.cid is None:
        encoding = held.descriptor_encoding
        if encoding is None and type(message) is dict and type(message.get("descriptor")) is dict:
            # Its parse will want the descriptor's encoding too: make it now, once.
            encoding = held.descriptor_encoding = DescriptorEncoding(message["descriptor"])
        held.cid = encoding.message_cid(message) if encoding is not None else _message_cid(message)
    return held.cid


def _message_cid(message: dict[str, Any]) -> str:
    if message.get("encodedData"):
        message = {k: v for k, v in message.items() if k != "encodedData"}
    return compute_cid(message)


class DescriptorEncoding:
    """A descriptor's DAG-CBOR, encoded once for the three CIDs a RecordsWrite derives from it.

    ``descriptorCid`` is the CID of the descriptor, the ``entryId`` the CID of the descriptor
    plus ``author``, and the message CID that of a map holding the descriptor: all three
    reuse the same encoded members. The descriptor must not change while this is in use.
    When the fast encoder does not handle the descriptor, every CID is computed the general
    way, so the results (and errors) are those of :func:`compute_cid` / :func:`message_cid`.
    """

    __slots__ = ("descriptor", "_keys", "_values", "_offsets", "_encoded", "_cid", "_with")

    def __init__(self, descriptor: dict[str, Any]) -> None:
        self.descriptor = descriptor
        self._keys: tuple[str, ...] = ()
        self._values: dict[str, bytes] = {}  # member name -> its encoded value
        self._offsets: list[int] = []  # where each member starts in the encoding, in map order
        self._encoded: bytes | None = None
        self._cid: str | None = None
        self._with: tuple[str, str, str] | None = None  # the last cid_with: (key, str value, CID)
        if type(descriptor) is not dict:
            return
        keys = tuple(descriptor)
        values = self._values
        offsets = self._offsets
        try:
            order = _key_orders.get(keys) or _key_order(keys)
            head = _map_head(len(order))
            parts = [head]
            position = len(head)
            for key, encoded_key in order:
                value = descriptor[key]
                if type(value) is str:  # most members: inline the common case
                    raw = value.encode()
                    n = len(raw)
                    encoded = (_TEXT_HEADS[n] if n < 0x100 else _head(3, n)) + raw
                else:
                    out: list[bytes] = []
                    _fast_into(value, out)
                    encoded = b"".join(out)
                values[key] = encoded
                offsets.append(position)
                position += len(encoded_key) + len(encoded)
                parts.append(encoded_key)
                parts.append(encoded)
        except Exception:  # see _fast_encode: the general path decides
            values.clear()
            return
        self._keys = keys
        self._encoded = b"".join(parts)

    @property
    def cid(self) -> str:
        """``compute_cid(descriptor)``."""
        if self._cid is None:
            self._cid = cid_of_bytes(self._encoded) if self._encoded is not None else compute_cid(self.descriptor)
        return self._cid

    def cid_with(self, key: str, value: Any) -> str:
        """``compute_cid({**descriptor, key: value})`` (the entry id, with ``author``)."""
        last = self._with
        if last is not None and type(value) is str and last[0] == key and last[1] == value:
            return last[2]
        cid = self._cid_with(key, value)
        if type(key) is str and type(value) is str:
            self._with = (key, value, cid)
        return cid

    def _cid_with(self, key: str, value: Any) -> str:
        encoded = self._encoded
        if encoded is not None and type(key) is str and key not in self._values:
            extra = _fast_encode(value)
            slot = _insertion_slot(self._keys, key) if extra is not None else None
            if extra is not None and slot is not None:
                # The new member's bytes go between the members that sort before and after it.
                index, encoded_key = slot
                n = len(self._keys)
                cut = self._offsets[index] if index < n else len(encoded)
                old_head = 1 if n < 24 else len(_map_head(n))
                return cid_of_bytes(
                    _map_head(n + 1) + encoded[old_head:cut] + encoded_key + extra + encoded[cut:]
                )
        return compute_cid({**self.descriptor, key: value})

    def message_cid(self, message: dict[str, Any]) -> str:
        """``message_cid(message)`` for a message whose ``descriptor`` is this one."""
        held = _memo.of(message)
        if held is None:
            return self._message_cid(message)
        if held.cid is None:
            held.cid = self._message_cid(message, held)
        return held.cid

    def _message_cid(self, message: dict[str, Any], held: _memo.MessageMemo | None = None) -> str:
        descriptor_encoded = self._encoded
        if (
            descriptor_encoded is not None
            and type(message) is dict
            and message.get("descriptor") is self.descriptor
            and not message.get("encodedData")  # else message_cid leaves it out: general path
        ):
            keys = tuple(message)
            out: list[bytes] = []
            try:
                order = _key_orders.get(keys) or _key_order(keys)
                out.append(_map_head(len(order)))
                for key, encoded_key in order:
                    out.append(encoded_key)
                    if key == "descriptor":
                        out.append(descriptor_encoded)
                    else:
                        _fast_into(message[key], out)
            except Exception:  # see _fast_encode
                return _message_cid(message)
            encoded = b"".join(out)
            if held is not None:
                held.encoded = encoded  # the message as it travels, for the store to keep
            return cid_of_bytes(encoded)
        return _message_cid(message)


# (keys of a map, a key it lacks) -> (where the key goes in map order, its encoding); bounded.
_insertion_slots: dict[tuple[tuple[str, ...], str], tuple[int, bytes]] = {}


def _insertion_slot(keys: tuple[str, ...], key: str) -> tuple[int, bytes] | None:
    slot = _insertion_slots.get((keys, key))
    if slot is None:
        try:
            raw = key.encode()
            rank = (len(raw), raw)
            index = sum(1 for k in keys if (len(kb := k.encode()), kb) < rank)
        except UnicodeEncodeError:  # a lone surrogate: the general path decides
            return None
        slot = (index, _head(3, len(raw)) + raw)
        if len(_insertion_slots) < _KEY_ORDER_CACHE_MAX:
            _insertion_slots[(keys, key)] = slot
    return slot


def _map_head(n: int) -> bytes:
    return _MAP_HEADS[n] if n < 0x100 else _head(5, n)


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
