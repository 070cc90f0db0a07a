"""Encodings: the fast DAG-CBOR path and the reused descriptor encoding give the exact bytes
and CIDs of the general path; base32 and base64url match RFC 4648."""

from __future__ import annotations

import base64
import json
from typing import Any

import dag_cbor
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2psync.dwn import encoding
from p2psync.dwn.encoding import (
    DescriptorEncoding,
    b64url_decode,
    b64url_encode,
    base32_multibase,
    compact_json_encoder,
    compute_cid,
    dag_cbor_encode,
    json_compact,
    message_cid,
)
from p2psync.dwn.errors import DwnError

# Keys of several UTF-8 lengths and byte orders (the map order is length first, then bytes).
_keys = st.one_of(
    st.sampled_from(["", "a", "b", "aa", "z", "é", "ab", "author", "descriptor", "recordId", "€", "\U0001f600"]),
    st.text(max_size=6),
)
_ints = st.one_of(
    st.integers(min_value=-300, max_value=70_000),
    st.integers(min_value=-(2**64), max_value=2**64),  # past 2**53 the reference writes a double
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    _ints,
    st.text(max_size=300),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1.0, -0.0, 2.5, 2.0**53, 1e300]),
)
json_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(_keys, children, max_size=6),
    ),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None)
@given(json_values)
def test_fast_path_gives_the_general_paths_bytes(value: Any) -> None:
    # The general path is the engine's former (and fallback) encoder; the fast path must
    # agree with it byte for byte wherever it does not give up.
    expected = encoding._exact_encode(value)
    assert dag_cbor_encode(value) == expected
    fast = encoding._fast_encode(value)
    assert fast is None or fast == expected


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_fast_path_agrees_with_the_dag_cbor_library(value: Any) -> None:
    fast = encoding._fast_encode(value)
    if fast is not None:
        assert fast == bytes(dag_cbor.encode(value))


def test_fast_path_gives_up_on_what_it_does_not_handle() -> None:
    for value in (1.5, 2**53, -(2**53), b"bytes", {1: "int key"}, ("tuple",), "\ud800", {"a": [0.5]}):
        assert encoding._fast_encode(value) is None
    assert encoding._fast_encode({"a": [2**53 - 1, -(2**53 - 1), True, None, "x"]}) is not None


def test_general_path_errors_are_unchanged() -> None:
    with pytest.raises(DwnError) as e:
        dag_cbor_encode({"a": float("nan")})
    assert e.value.code == "DagCborInvalidNumber"
    with pytest.raises(DwnError) as e:
        dag_cbor_encode({"a": "\ud800"})
    assert e.value.code == "DagCborEncodeFailed"


def test_deep_nesting_falls_back_to_the_general_path() -> None:
    value: Any = "leaf"
    for _ in range(2000):
        value = [value]
    assert dag_cbor_encode(value) == encoding._exact_encode(value)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_keys, json_values, max_size=8), _keys, json_values)
def test_descriptor_encoding_gives_the_same_cids(descriptor: dict[str, Any], key: str, extra: Any) -> None:
    enc = DescriptorEncoding(descriptor)
    assert enc.cid == compute_cid(descriptor)
    assert enc.cid_with(key, extra) == compute_cid({**descriptor, key: extra})
    for encoded_data in (None, "", "ZGF0YQ"):
        message: dict[str, Any] = {"recordId": "r", "descriptor": descriptor, "authorization": {"k": [1, "v"]}}
        if encoded_data is not None:
            message["encodedData"] = encoded_data
        assert enc.message_cid(message) == message_cid(message)


def test_descriptor_encoding_of_another_descriptor_is_not_reused() -> None:
    enc = DescriptorEncoding({"a": 1})
    other = {"descriptor": {"a": 2}}
    assert enc.message_cid(other) == message_cid(other)


@given(st.binary(max_size=80))
def test_base32_is_lowercase_rfc4648_without_padding(data: bytes) -> None:
    expected = "b" + base64.b32encode(data).decode().lower().rstrip("=")
    assert base32_multibase(data) == expected


@given(st.binary(max_size=80))
def test_base64url_round_trip(data: bytes) -> None:
    text = b64url_encode(data)
    assert text == base64.urlsafe_b64encode(data).decode().rstrip("=")
    assert b64url_decode(text) == data


@pytest.mark.parametrize(
    "text",
    [
        "QQ=",  # padding
        "QQ==",
        "Q",  # a length no byte string has
        "QR",  # non-canonical trailing bits (2 chars)
        "QUF",  # non-canonical trailing bits (3 chars)
        "QU+B",  # not the url alphabet
        "QU/B",
        "QU B",
        "QUé",
        "QUFB\n",
    ],
)
def test_base64url_decode_refuses_non_canonical_text(text: str) -> None:
    with pytest.raises(DwnError) as e:
        b64url_decode(text)
    assert e.value.code == "Base64UrlInvalid"


@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/ ", max_size=12))
def test_base64url_decode_accepts_exactly_the_canonical_encodings(text: str) -> None:
    try:
        data = b64url_decode(text)
    except DwnError:
        canonical = False
        try:
            padded = text + "=" * (-len(text) % 4)
            canonical = b64url_encode(base64.urlsafe_b64decode(padded)) == text and "=" not in text
            canonical = canonical and "+" not in text and "/" not in text and " " not in text
        except ValueError:
            pass
        assert not canonical
    else:
        assert b64url_encode(data) == text


_JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=20,
)


@given(_JSON_VALUES)
@settings(max_examples=300)
def test_in_dag_cbor_order_is_the_order_a_value_comes_back_from_the_wire(value: Any) -> None:
    """A message authored here is stored in the key order it has after a trip over the wire
    (DAG-CBOR encoded, decoded), so replicas hold the same text; a value already in that order
    is returned as itself (facts kept about the object stay valid)."""
    ordered = encoding.in_dag_cbor_order(value)
    round_trip = dag_cbor.decode(dag_cbor.encode(value))
    assert ordered == value
    assert encoding.json_compact(ordered) == encoding.json_compact(round_trip)
    assert encoding.in_dag_cbor_order(ordered) is ordered


def test_in_dag_cbor_order_sorts_shorter_keys_first_and_leaves_non_json_maps_alone() -> None:
    message = {"recordId": "r", "descriptor": {"method": "Write", "interface": "Records"}, "authorization": {}}
    assert list(encoding.in_dag_cbor_order(message)) == ["recordId", "descriptor", "authorization"]
    assert list(encoding.in_dag_cbor_order(message)["descriptor"]) == ["method", "interface"]
    assert list(encoding.in_dag_cbor_order({"bb": 1, "a": 2, "ab": 3})) == ["a", "ab", "bb"]
    odd = {1: "x", "a": "y"}
    assert encoding.in_dag_cbor_order(odd) is odd


_JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6))


@given(st.recursive(_JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=5)), max_leaves=20))
@settings(max_examples=300)
def test_the_compact_encoders_write_what_json_dumps_writes(value: Any) -> None:
    """The C encoder built once writes json.dumps' text, and refuses what it refuses (NaN)."""
    for ensure_ascii, allow_nan, encode in ((False, False, json_compact),
                                            (True, True, compact_json_encoder(ensure_ascii=True, allow_nan=True))):
        try:
            expected = json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=allow_nan)
        except ValueError:
            with pytest.raises(ValueError):
                encode(value)
        else:
            assert encode(value) == expected
    assert json_compact("x\n\u00e9") == '"x\\n\u00e9"'
