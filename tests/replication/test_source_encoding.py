"""The source's `rev` and `revs` bodies, put together from each message's own encoding, are
byte for byte the deterministic encoding of the same value (replication-profiles.md §1.2, §8.4)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from p2psync.dwn.encoding import compute_cid
from p2psync.dwn.progress import ProgressToken
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.source import encode_message_entry, encode_revs_body, message_entry
from p2psync.replication.wire import INLINE_DATA_MAX, encode_body

# JSON values as messages hold them, with what sends the general encoder its own way: floats
# (integral and not), integers past 2**53, non-ASCII text.
_scalars = (
    st.none() | st.booleans() | st.integers(-(2**64) + 1, 2**64 - 1) | st.text(max_size=30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1.0, -0.0, 2.0**60])
)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                           max_size=5), max_leaves=20)
_messages = st.dictionaries(st.text(max_size=12), _json, max_size=6)
# Lengths on each side of CBOR's head widths, and of the inline limit.
_data = st.none() | st.sampled_from([0, 1, 23, 24, 255, 256, 65535, 65536, INLINE_DATA_MAX, INLINE_DATA_MAX + 1]).map(
    lambda n: bytes(range(256)) * (n // 256) + bytes(n % 256))
_sizes = st.none() | st.sampled_from([0, 23, 24, 2**16, 2**32, 2**53 - 1, 2**53, 2**60, -1])


def _token(position: int, message: Any) -> ProgressToken:
    return ProgressToken("stream", "epoch", position, compute_cid({"m": repr(message)}))


@settings(max_examples=200, deadline=None)
@given(_messages, _data, _sizes)
def test_a_rev_body_is_the_encoding_of_its_message_entry(message: dict[str, Any], data: bytes | None,
                                                         size: int | None) -> None:
    entry = ReplicationEntry(message, data, "unused")
    assert encode_message_entry(entry, size=size) == encode_body(message_entry(entry, size=size))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_messages, _data, st.integers(0, 2**64)), min_size=1, max_size=12))
def test_a_revs_body_is_the_encoding_of_its_entries(members: list[tuple[dict[str, Any], bytes | None, int]]) -> None:
    encoded, expected = [], []
    for message, data, position in members:
        entry, token = ReplicationEntry(message, data, "unused"), _token(position, message)
        encoded.append(encode_message_entry(entry, token=token))
        expected.append({**message_entry(entry), "position": str(position), "messageCid": token.message_cid})
    assert encode_revs_body(encoded) == encode_body({"revs": expected})
