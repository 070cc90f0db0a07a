"""LtHash16 (p2psync/replication/lthash.py): the spec's vectors, and the properties a set
digest needs — order independence, removal inverts addition, equal sets give equal digests."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2psync.replication.lthash import EMPTY_STATE, Element, LtHash, element, lthash_digest

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "examples" / "lthash-vectors.json"

cids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz234567", min_size=1, max_size=60).map(lambda s: "b" + s)


def by_hand(adds: Sequence[str], removes: Sequence[str] = ()) -> bytes:
    """The spec written out with hashlib alone: lane sums mod 2^16, then SHA-256."""
    lanes = [0] * 1024
    for sign, group in ((1, adds), (-1, removes)):
        for cid in group:
            e = hashlib.shake_256(b"p2psync-lthash-v1\x00" + cid.encode("ascii")).digest(2048)
            lanes = [(a + sign * int.from_bytes(e[2 * i:2 * i + 2], "little")) % 65536 for i, a in enumerate(lanes)]
    return b"".join(lane.to_bytes(2, "little") for lane in lanes)


def test_the_published_vectors() -> None:
    doc = json.loads(VECTORS.read_text())
    assert bytes.fromhex(doc["domain_hex"]) == b"p2psync-lthash-v1\x00"
    for e in doc["elements"]:
        assert element(e["cid"])[:16].hex() == e["head"]
    names = [v["name"] for v in doc["vectors"]]
    assert names[:3] == ["empty set", "one CID", "three CIDs"]
    for v in doc["vectors"]:
        h = LtHash()
        h.update(v["adds"], v["removes"])
        assert h.state()[:16].hex() == v["state_head"], v["name"]
        assert h.hexdigest() == v["digest"], v["name"]
        state = by_hand(v["adds"], v["removes"])
        assert state == h.state(), v["name"]
        assert hashlib.sha256(state).hexdigest() == v["digest"], v["name"]
    assert doc["vectors"][0]["digest"] == hashlib.sha256(bytes(2048)).hexdigest()
    # removing the second of three leaves the set of the first and third
    three, less = doc["vectors"][2], doc["vectors"][4]
    assert lthash_digest([three["adds"][0], three["adds"][2]]).hex() == less["digest"]


@given(st.lists(cids, max_size=12, unique=True), st.randoms(use_true_random=False))
def test_order_does_not_matter(items: list[str], rnd: random.Random) -> None:
    shuffled = items[:]
    rnd.shuffle(shuffled)
    assert lthash_digest(items) == lthash_digest(shuffled)
    assert LtHash().digest() == lthash_digest([]) == hashlib.sha256(EMPTY_STATE).digest()


@settings(max_examples=50)
@given(st.lists(cids, max_size=6, unique=True), st.lists(cids, max_size=6, unique=True))
def test_incremental_is_the_spec(adds: list[str], removes: list[str]) -> None:
    h = LtHash()
    h.update(adds, removes)
    assert h.state() == by_hand(adds, removes)


@given(st.lists(cids, max_size=10, unique=True), cids)
def test_remove_inverts_add(items: list[str], extra: str) -> None:
    h = LtHash()
    h.update(items)
    before = h.copy()
    h.add(extra)
    assert (h == before) is False
    h.remove(extra)
    assert h == before and h.digest() == before.digest()
    h.update(removes=items)
    assert h.is_empty() and h.state() == EMPTY_STATE


@given(st.sets(cids, max_size=8), st.sets(cids, max_size=8))
def test_equal_sets_equal_digests(a: set[str], b: set[str]) -> None:
    assert (lthash_digest(a) == lthash_digest(b)) == (a == b)


def test_state_round_trip_and_copy() -> None:
    h = LtHash()
    h.update(["bafy1", "bafy2"])
    again = LtHash.from_state(h.state())
    assert again == h and again.digest() == h.digest()
    copy = h.copy()
    copy.add("bafy3")
    assert copy != h and h.digest() == lthash_digest(["bafy1", "bafy2"])
    with pytest.raises(ValueError):
        LtHash.from_state(b"\x00" * 10)


def test_lazy_reduction_never_carries_between_lanes() -> None:
    """Past the reduction interval with the worst elements: every lane 0xFFFF added, every lane
    0 removed (which adds 2^16 to each slot). Each lane must be the sum mod 2^16 exactly."""
    worst = Element.of("x")
    worst.even = worst.odd = int.from_bytes(b"\xff\xff\x00\x00" * 512, "little")
    zero = Element(0, 0)
    h = LtHash()
    n = 0x10000 + 7
    for i in range(n):
        h.add_element(worst)
        if i % 5 == 0:
            h.remove_element(zero)
    assert h.state() == ((n * 0xFFFF) % 65536).to_bytes(2, "little") * 1024
