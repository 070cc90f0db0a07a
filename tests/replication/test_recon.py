"""The reconcile exchange (p2psync/replication/recon.py) and its coding (riblt.py), sans-I/O.

Random sets and differences must come out exact; collisions forced with tiny ids must be caught
(a retry with a fresh salt ends exact); truncated and hostile symbol streams are refused with a
code; the golden vectors of protocol/examples/recon-vectors.json hold.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2psync.replication.lthash import lthash_digest
from p2psync.replication.recon import (
    MAX_OPENING_SYMBOLS,
    MAX_REPLY_SYMBOLS,
    MAX_SYMBOL_INDEX,
    MemorySet,
    Reconciliation,
    ReconResult,
    answer,
    pack_symbols,
    unpack_symbols,
)
from p2psync.replication.riblt import Coder, Decoder, Sketch, Symbols, _apply, next_index, symbol_indexes
from p2psync.replication.wire import PeerError, decode_body, encode_body

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "examples" / "recon-vectors.json"


def cid(i: int, tag: str = "") -> str:
    return f"bafyreitest{tag}{i:08d}"


def view(cids: list[str], coder: Coder | None = None, size: int = 512) -> MemorySet:
    return MemorySet(coder or Coder(), cids, size, lthash_digest(cids))


def reconcile(mine: MemorySet, theirs: MemorySet) -> tuple[ReconResult, int]:
    """Run the exchange through CBOR bodies; (result, bytes of bodies)."""
    recon = Reconciliation(mine)
    request: dict[str, Any] | None = recon.opening()
    sent = 0
    while request is not None:
        raw = encode_body(request)
        reply = encode_body(answer(decode_body(raw), lambda _c: theirs))
        sent += len(raw) + len(reply)
        request = recon.receive(decode_body(reply))
    assert recon.result is not None
    return recon.result, sent


def split(n_common: int, n_mine: int, n_theirs: int) -> tuple[list[str], list[str], list[str]]:
    common = [cid(i) for i in range(n_common)]
    return common, [cid(i, "a") for i in range(n_mine)], [cid(i, "b") for i in range(n_theirs)]


@settings(max_examples=60, deadline=None)
@given(n_common=st.integers(0, 300), n_mine=st.integers(0, 80), n_theirs=st.integers(0, 80))
def test_random_differences_are_exact(n_common: int, n_mine: int, n_theirs: int) -> None:
    common, a, b = split(n_common, n_mine, n_theirs)
    coder = Coder()
    result, _ = reconcile(view(common + a), view(common + b))
    assert result.equal == (not a and not b)
    assert sorted(result.local_only) == sorted(coder.key(c).id for c in a)
    assert sorted(result.remote_only) == sorted(coder.key(c).id for c in b)
    assert result.remote_count == len(common) + len(b)
    assert result.round_trips <= 3


def test_equal_sets_cost_one_round_trip() -> None:
    common, _, _ = split(1000, 0, 0)
    result, sent = reconcile(view(common), view(list(reversed(common))))
    assert result.equal and result.round_trips == 1
    assert sent < 64


def test_one_difference_is_decoded_by_the_responder_from_the_opening() -> None:
    common, a, b = split(5000, 1, 0)
    result, _ = reconcile(view(common + a), view(common))
    assert result.round_trips == 1 and len(result.local_only) == 1 and result.estimate is None
    result, _ = reconcile(view(common), view(common + a))
    assert result.round_trips == 1 and len(result.remote_only) == 1


def test_a_difference_past_the_sketch_is_computed_from_the_keys() -> None:
    common, a, b = split(100, 400, 400)
    result, _ = reconcile(view(common + a, size=64), view(common + b, size=64))
    assert len(result.local_only) == 400 and len(result.remote_only) == 400


def test_the_maintained_sketch_equals_one_built_from_scratch() -> None:
    coder, rng = Coder(), random.Random(7)
    live: set[str] = set()
    sketch = Sketch(coder, 256)
    for step in range(600):
        c = cid(rng.randrange(200))
        if c in live:
            live.remove(c)
            sketch.add(coder.key(c), -1)
        else:
            live.add(c)
            sketch.add(coder.key(c))
        if step % 150 == 0:
            fresh = Sketch(coder, 256)
            fresh.add_cids(sorted(live))
            assert fresh.symbols == sketch.symbols
            assert fresh.estimator.lanes() == sketch.estimator.lanes()


def _walk_into(key_id: int, limit: int, start: int = 0) -> Symbols:
    """The symbols [start, limit) of a set holding one key, through the sketch's fast walk."""
    sym = Symbols.empty(start, limit - start)
    _apply(sym, key_id, 1, 1)
    return sym


def _exact_walk(key_id: int, limit: int, start: int = 0) -> list[int]:
    return [j - start for j in symbol_indexes(key_id, limit) if j >= start]


_LCG_INVERSE = pow(6364136223846793005, -1, 1 << 64)


def _key_whose_first_step_sees(r: int) -> int:
    """The key id whose PRNG state after one step is ``r`` (the LCG inverted)."""
    return ((r - 1442695040888963407) * _LCG_INVERSE) % (1 << 64)


def test_the_sketchs_fast_walk_is_the_exact_index_sequence() -> None:
    # _apply takes a floating-point shortcut of next_index: on random keys, and on keys whose
    # first step lands exactly on, or a hair either side of, a ceiling's boundary
    # ((r+1)·m² = 9·2⁶⁴ for y = m), it must reach exactly the symbols symbol_indexes gives.
    rng = random.Random(11)
    keys = [rng.randrange(1 << 64) for _ in range(300)] + [0, 1, (1 << 64) - 1]
    for m in [*range(3, 200), *rng.sample(range(200, 1 << 17), 150)]:
        boundary = (9 << 64) // (m * m) - 1
        keys += [_key_whose_first_step_sees(r) for r in range(boundary - 2, boundary + 3) if 0 <= r < 1 << 64]
    for key_id in keys:
        for limit, start in ((1 << 15, 0), (40_000, 30_000)):
            sym = _walk_into(key_id, limit, start)
            assert [j for j, c in enumerate(sym.counts) if c] == _exact_walk(key_id, limit, start)


def test_the_index_sequence_is_exact_integer_arithmetic() -> None:
    # next_index is the smallest k > i with (2i+3)^2 * 2^64 <= (2k+3)^2 * (r+1).
    rng = random.Random(3)
    for _ in range(2000):
        i, r = rng.randrange(1 << 20), rng.randrange(1 << 64)
        k = next_index(i, r)
        t = ((2 * i + 3) ** 2) << 64
        assert k > i and (2 * k + 3) ** 2 * (r + 1) >= t
        assert k == i + 1 or (2 * k + 1) ** 2 * (r + 1) < t
    # Symbol 0 holds every key; about 2/(k+1.5) of keys reach symbol k.
    hits = sum(1 for key_id in range(20_000) for j in symbol_indexes(key_id * 7919, 41) if j == 40)
    assert 0.03 < hits / 20_000 < 0.07


# --- collisions -----------------------------------------------------------------------------


def salted_until_equal(mine: list[str], theirs: list[str], width: int) -> tuple[set[str], set[str], int]:
    """What a repair does: reconcile, exchange what each id names, re-check; a round that finds
    nothing new (a collision hid it) or fails retries with a fresh salt."""
    a, b = set(mine), set(theirs)
    rng = random.Random(width)
    salt = bytes(16)
    for attempt in range(1, 40):
        coder = Coder(width, salt)
        try:
            result, _ = reconcile(view(sorted(a), coder), view(sorted(b), coder))
        except PeerError as exc:
            assert exc.name == "ReconcileFailed"
            salt = rng.randbytes(16)
            continue
        if result.equal:
            return a, b, attempt
        by_id_b = {}
        for c in b:
            by_id_b.setdefault(coder.key(c).id, []).append(c)
        by_id_a = {}
        for c in a:
            by_id_a.setdefault(coder.key(c).id, []).append(c)
        new_a = {c for i in result.remote_only for c in by_id_b.get(i, [])} - a
        new_b = {c for i in result.local_only for c in by_id_a.get(i, [])} - b
        if not new_a and not new_b:
            salt = rng.randbytes(16)
        a |= new_a
        b |= new_b
    raise AssertionError("no convergence")


@pytest.mark.parametrize("width", [1, 2])
def test_forced_collisions_are_caught_and_a_fresh_salt_converges(width: int) -> None:
    common, a, b = split(300, 40, 40)
    got_a, got_b, attempts = salted_until_equal(common + a, common + b, width)
    assert got_a == got_b == set(common + a + b)
    assert attempts > 1  # with 1- or 2-byte ids the first try cannot have been clean


# --- hostile input ----------------------------------------------------------------------------


def responder() -> MemorySet:
    common, _, _ = split(200, 0, 0)
    return view(common)


@pytest.mark.parametrize(
    ("body", "code", "name"),
    [
        ({"h": b"x" * 15, "n": 1, "s": b""}, 400, "ReconcileInvalid"),
        ({"h": bytes(16), "n": -1, "s": b""}, 400, "ReconcileInvalid"),
        ({"h": bytes(16), "n": 3, "s": b"\x00" * 12}, 400, "ReconcileInvalid"),
        ({"h": bytes(16), "n": 3, "s": b"\x00" * 13 * (MAX_OPENING_SYMBOLS + 1)}, 413, "ReconcileTooLarge"),
        ({"w": [5, 5]}, 400, "ReconcileInvalid"),
        ({"w": [0, MAX_REPLY_SYMBOLS + 1]}, 413, "ReconcileTooLarge"),
        ({"w": [MAX_SYMBOL_INDEX, MAX_SYMBOL_INDEX + 1]}, 413, "ReconcileTooLarge"),
        ({"w": "0-9"}, 400, "ReconcileInvalid"),
        ({"w": [0, 4], "i": 9}, 400, "ReconcileInvalid"),
        ({"w": [0, 4], "t": b"short"}, 400, "ReconcileInvalid"),
    ],
)
def test_hostile_requests_are_refused_with_a_code(body: dict[str, Any], code: int, name: str) -> None:
    with pytest.raises(PeerError) as info:
        answer(body, lambda _c: responder())
    assert (info.value.code, info.value.name) == (code, name)


def test_truncated_and_mismatched_symbol_replies_are_refused() -> None:
    common, a, b = split(200, 30, 30)
    recon = Reconciliation(view(common + a))
    theirs = view(common + b)
    request = recon.opening()
    request = recon.receive(answer(request, lambda _c: theirs))
    assert request is not None and "w" in request
    full = answer(request, lambda _c: theirs)["s"]
    version = theirs.digest[:4]
    for bad in ({"s": full[:-1], "v": version}, {"s": full[:-13], "v": version},
                {"s": full + b"\x00" * 13, "v": version}, {"s": "text", "v": version}, {"s": full}):
        fresh = Reconciliation(view(common + a))
        fresh.receive(answer(fresh.opening(), lambda _c: theirs))
        with pytest.raises(PeerError) as info:
            fresh.receive(bad)
        assert info.value.name == "ReconcileInvalid"


def test_a_set_that_changes_between_requests_is_caught() -> None:
    common, a, b = split(200, 30, 30)
    recon = Reconciliation(view(common + a))
    request = recon.receive(answer(recon.opening(), lambda _c: view(common + b)))
    assert request is not None
    with pytest.raises(PeerError) as info:
        recon.receive(answer(request, lambda _c: view(common + b + [cid(1, "late")])))
    assert (info.value.code, info.value.name) == (409, "ReconcileSetChanged")


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=13 * 40))
def test_garbage_symbols_never_raise_anything_but_a_refusal(raw: bytes) -> None:
    common, a, b = split(150, 20, 20)
    recon = Reconciliation(view(common + a))
    version = view(common + b).digest[:4]
    recon.receive(answer(recon.opening(), lambda _c: view(common + b)))
    try:
        while True:
            assert recon._asked is not None
            lo, hi = recon._asked
            size = (hi - lo) * 13
            chunk = (raw * (1 + size // max(1, len(raw))))[:size] if raw else bytes(size)
            if recon.receive({"s": chunk, "v": version}) is None or hi > 5000:
                break
    except PeerError as exc:
        assert exc.name in {"ReconcileInvalid", "ReconcileFailed"}


def test_a_garbage_stream_ends_with_reconcile_failed_not_a_hang() -> None:
    rng = random.Random(5)
    common, a, b = split(150, 20, 20)
    recon = Reconciliation(view(common + a))
    version = view(common + b).digest[:4]
    recon.receive(answer(recon.opening(), lambda _c: view(common + b)))
    with pytest.raises(PeerError) as info:
        for _ in range(200):
            assert recon._asked is not None
            lo, hi = recon._asked
            recon.receive({"s": rng.randbytes((hi - lo) * 13), "v": version})
    assert info.value.name == "ReconcileFailed"


def test_symbols_round_trip_through_their_packing() -> None:
    sketch = Sketch(Coder(), 64)
    sketch.add_cids(cid(i) for i in range(500))
    sym = sketch.range(3, 40)
    back = unpack_symbols(pack_symbols(sym, 8), 3, 8)
    assert back.ids == sym.ids and back.checks == sym.checks
    assert back.counts == [c & 0xFF for c in sym.counts]


def test_the_decoder_takes_counts_mod_256() -> None:
    coder = Coder()
    big = Sketch(coder, 32)
    big.add_cids(cid(i) for i in range(1000))
    other = big.copy()
    other.add(coder.key(cid(1, "x")))
    dec = Decoder(coder)
    wire = unpack_symbols(pack_symbols(other.range(0, 32), 8), 0, 8)
    mine = unpack_symbols(pack_symbols(big.range(0, 32), 8), 0, 8)
    dec.feed(wire, mine)
    assert dec.done and dec.remote_only == [coder.key(cid(1, "x")).id]
    assert isinstance(Symbols.empty(0, 1), Symbols)


# --- golden vectors ---------------------------------------------------------------------------


def test_golden_vectors() -> None:
    vectors = json.loads(VECTORS.read_text())
    for v in vectors["keys"]:
        key = Coder(v["width"], bytes.fromhex(v["salt"])).key(v["cid"])
        got = (f"{key.id:0{2 * v['width']}x}", f"{key.check:08x}", key.signs.hex())
        assert got == (v["id"], v["check"], v["signs"])
    for v in vectors["indexes"]:
        assert list(symbol_indexes(int(v["id"], 16), v["limit"])) == v["indexes"]
    for v in vectors["sketches"]:
        sketch = Sketch(Coder(), v["size"])
        sketch.add_cids(v["cids"])
        assert pack_symbols(sketch.range(0, v["size"]), 8).hex() == v["symbols"]
        assert bytes(b for lane in sketch.estimator.lanes() for b in lane.to_bytes(2, "big")).hex() == v["lanes"]
    for v in vectors["exchanges"]:
        mine, theirs = view(v["initiator"]), view(v["responder"])
        recon = Reconciliation(mine)
        request: dict[str, Any] | None = recon.opening()
        for step in v["messages"]:
            assert request is not None
            raw = encode_body(request)
            assert raw.hex() == step["request"]
            reply = encode_body(answer(decode_body(raw), lambda _c, side=theirs: side))
            assert reply.hex() == step["reply"]
            request = recon.receive(decode_body(reply))
        assert request is None
