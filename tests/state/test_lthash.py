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

from p2psync.replication.lthash import EMPTY_STATE, Element, ElementSum, LtHash, element, lthash_digest

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


@settings(max_examples=60)
@given(st.lists(cids, max_size=8), st.lists(st.tuples(cids, st.booleans()), max_size=20))
def test_a_summed_batch_is_the_elements_one_by_one(before: list[str], batch: list[tuple[str, bool]]) -> None:
    """ElementSum (a fold's batch) applied to two hashes, against add/remove one at a time:
    removals of CIDs never added included (the state is a multiset's)."""
    one_by_one, summed = LtHash(), LtHash()
    one_by_one.update(before)
    summed.update(before)
    s = ElementSum()
    for cid, added in batch:
        (one_by_one.add if added else one_by_one.remove)(cid)
        (s.add if added else s.remove)(cid)
    summed.add_sum(s)
    assert summed == one_by_one and summed.state() == one_by_one.state()
    assert s.added == sum(added for _, added in batch) and s.removed == len(batch) - s.added


def test_a_full_summed_batch_of_the_worst_elements_never_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    """CAPACITY elements in one sum, on a hash one operation short of its reduction: every lane
    0xFFFF added and every lane 0 removed (2^16 into each slot). Each lane must come out exact."""
    from p2psync.replication import lthash

    ones, zeros = b"\xff" * 2048, bytes(2048)
    monkeypatch.setattr(lthash, "element", lambda cid: ones if cid == "ones" else zeros)
    h = LtHash()
    for _ in range(lthash._OPS_BEFORE_REDUCE - 1):
        h.add_element(Element(0, 0))
    s = ElementSum()
    removed = 0
    while not s.full:
        if s.added % 3 == 0 and removed < s.added:
            s.remove("zeros")
            removed += 1
        else:
            s.add("ones")
    assert s.added + s.removed == ElementSum.CAPACITY
    h.add_sum(s)
    h.add_sum(s)  # twice: the second must reduce first
    assert h.state() == ((2 * s.added * 0xFFFF) % 65536).to_bytes(2, "little") * 1024
    s.add("ones")
    with pytest.raises(ValueError):
        s.lanes()
