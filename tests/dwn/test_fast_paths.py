"""The engine's shortcuts give exactly what the general code gives: timestamps the fast check
accepts parse, the stored body spliced around inline data is the message's compact JSON, the
three CIDs a parsed RecordsWrite derives from one descriptor encoding are the plain ones, and
what one engine call remembers about its message (p2psync/dwn/memo.py) stays with that object,
that thread and that call."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2psync.dwn import jws, memo, timeutil
from p2psync.dwn.datacid import data_cid
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import DescriptorEncoding, compute_cid, json_compact, message_cid, message_json, raw_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.records_write import RecordsWrite, get_entry_id, is_initial_write
from p2psync.dwn.store import Store


@settings(max_examples=300, deadline=None)
@given(st.from_regex(timeutil._SURELY_VALID, fullmatch=True))
def test_timestamps_the_fast_check_accepts_parse(stamp: str) -> None:
    timeutil.parse_timestamp(stamp)  # raises if the fast check let through something invalid


@pytest.mark.parametrize(
    "stamp",
    [
        "2024-02-29T00:00:00.000000Z",  # a leap day: parsed, accepted
        "2023-02-29T00:00:00.000000Z",  # not a leap year: parsed, refused
        "2024-04-31T00:00:00.000000Z",
        "2024-05-01T23:59:60.000000Z",  # leap second: parsed, accepted
        "2024-05-01T24:00:00.000000Z",
        "0000-01-01T00:00:00.000000Z",
        "2024-13-01T00:00:00.000000Z",
        "2024-05-01T12:34:56.123456z",
        "2024-05-01T12:34:56.123456Z\n",
        "２０２４-05-01T12:34:56.123456Z",  # non-ASCII digits
    ],
)
def test_timestamps_outside_the_fast_form_get_the_full_parse(stamp: str) -> None:
    timeutil.validate_timestamp.cache_clear()
    try:
        timeutil.parse_timestamp(stamp)
        parsed_ok = True
    except DwnError:
        parsed_ok = False
    try:
        timeutil.validate_timestamp(stamp)
        validated_ok = True
    except DwnError as e:
        assert e.code == timeutil.TIMESTAMP_INVALID
        validated_ok = False
    assert validated_ok == parsed_ok


def test_stored_body_is_the_compact_json_of_the_stored_message(tmp_path: Path, alice: Identity) -> None:
    dwn = Dwn(Store(tmp_path / "s.db"))
    try:
        for size in (0, 1, 1024, 30_000):
            data = os.urandom(size)
            write = RecordsWrite.create(signer=alice, data=data, data_format="text/plain")
            assert dwn.process_message(alice.did, write.message, data).code == 202
            row = dwn.store.conn.execute(
                "SELECT body, cid FROM messages WHERE record_id=?", (write.message["recordId"],)
            ).fetchone()
            assert row is not None
            body, cid = row
            stored = json.loads(body)
            assert json_compact(stored) == body
            assert list(stored) == [*write.message, "encodedData"]
            assert {k: v for k, v in stored.items() if k != "encodedData"} == write.message
            # The reference keeps an empty encodedData inside the stored message's CID.
            assert cid == (message_cid(stored) if size == 0 else message_cid(write.message))
    finally:
        dwn.close()


def _descriptor(n: int) -> dict[str, Any]:
    d: dict[str, Any] = {f"k{i:02d}": i for i in range(n)}
    d["zzzzzzzzzzzzzzzz"] = "long key sorts last"
    d["a"] = [1, {"x": None}]
    return d


@pytest.mark.parametrize("n", [0, 20, 21, 22, 23, 30, 300])
def test_descriptor_encoding_across_map_head_sizes(n: int) -> None:
    # The member count goes past 23 (one-byte map head) and 255 (two-byte) with the extra key.
    d = _descriptor(n)
    enc = DescriptorEncoding(d)
    assert enc.cid == compute_cid(d)
    for key in ("author", "", "k05", "zzzzzzzzzzzzzzzzz"):
        assert enc.cid_with(key, "did:example:alice") == compute_cid({**d, key: "did:example:alice"})


def test_descriptor_encoding_with_a_float_uses_the_general_path() -> None:
    d = {"interface": "Records", "n": 1.5, "m": 2.0}
    enc = DescriptorEncoding(d)
    message = {"recordId": "x", "descriptor": d}
    assert enc.cid == compute_cid(d)
    assert enc.cid_with("author", "a") == compute_cid({**d, "author": "a"})
    assert enc.message_cid(message) == message_cid(message)


def test_parsed_write_derives_the_plain_cids(alice: Identity) -> None:
    write = RecordsWrite.create(
        signer=alice, data=b"hello", protocol="https://example.com/p", protocol_path="thing", schema="https://s"
    )
    message = write.message
    parsed = RecordsWrite.parse(message)
    assert parsed.entry_id == get_entry_id(alice.did, message["descriptor"]) == message["recordId"]
    assert parsed.cid == message_cid(message)
    assert parsed.is_initial_write
    # A message carrying its data inline: the CID leaves non-empty encodedData out.
    with_data = {**message, "encodedData": "aGVsbG8"}
    assert RecordsWrite.parse(with_data).cid == message_cid(message)


# --------------------------------------------------------------------------- memo


def test_memo_keeps_facts_for_that_message_object_only(alice: Identity) -> None:
    write = RecordsWrite.create(signer=alice, data=b"hello", data_format="text/plain")
    message = write.message
    twin = json.loads(json.dumps(message))  # equal, but another object
    cid = compute_cid(message)
    with memo.processing(message, "bafy-what-the-caller-computed"):
        # The caller's CID is trusted for this very object, and only for it.
        assert message_cid(message) == "bafy-what-the-caller-computed"
        assert message_cid(twin) == cid
        payload = jws.decode_payload(message["authorization"]["signature"])
        assert jws.decode_payload(message["authorization"]["signature"]) is payload
        assert jws.decode_payload(twin["authorization"]["signature"]) is not payload
        assert is_initial_write(message) and is_initial_write(twin)
        assert RecordsWrite.parse(message).entry_id == message["recordId"]
    # Outside the call nothing is kept: a changed message gets its own CID.
    changed = message
    changed["descriptor"] = {**message["descriptor"], "dataFormat": "text/html"}
    assert message_cid(changed) == compute_cid(changed)
    assert not is_initial_write(changed)


def test_memo_data_cid_is_per_bytes_object() -> None:
    first, second = b"a" * 100, b"b" * 100
    with memo.processing({}):
        assert data_cid(first) == data_cid(first) == raw_cid(first)
        assert data_cid(second) == raw_cid(second)
        assert data_cid(bytearray(first)) == raw_cid(first)


def test_memo_is_per_thread(alice: Identity) -> None:
    message = RecordsWrite.create(signer=alice, data=b"x", data_format="text/plain").message
    seen: list[str] = []
    with memo.processing(message, "bafy-only-on-this-thread"):
        thread = threading.Thread(target=lambda: seen.append(message_cid(message)))
        thread.start()
        thread.join()
        assert message_cid(message) == "bafy-only-on-this-thread"
    assert seen == [compute_cid(message)]


def test_memo_ends_with_the_call(alice: Identity) -> None:
    message = RecordsWrite.create(signer=alice, data=b"x", data_format="text/plain").message
    with memo.processing(message, "bafy-outer"):
        with memo.processing(message):  # the pipe, then the engine: one message, one memo
            assert message_cid(message) == "bafy-outer"
        assert memo.of(message) is not None
    assert memo.of(message) is None
    assert message_cid(message) == compute_cid(message)


def test_memo_writes_the_message_json_once(alice: Identity) -> None:
    message = RecordsWrite.create(signer=alice, data=b"x", data_format="text/plain").message
    with memo.processing(message):
        text = message_json(message)
        assert message_json(message) is text
        assert text == json_compact(message)
        # Its CID, computed first, leaves the descriptor's encoding for the parse to reuse.
        assert message_cid(message) == compute_cid(message)
        held = memo.of(message)
        assert held is not None and held.descriptor_encoding is not None
        assert RecordsWrite.parse(message)._descriptor_encoding is held.descriptor_encoding
    assert message_json(message) == text


def test_a_store_keeps_a_page_cache_for_its_random_key_indexes(tmp_path: Path) -> None:
    from p2psync.dwn.store import CACHE_KIB

    store = Store(tmp_path / "s.db")
    try:
        assert store.scalar("PRAGMA cache_size") == -CACHE_KIB  # KiB, not SQLite's 2 MiB default
    finally:
        store.close()
