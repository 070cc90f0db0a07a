"""Progress tokens and gaps: wire strictness, domain-bound order, and the source's gap decision
against real SQLite stores (including a restore from a backup)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2psync.dwn.encoding import base32_multibase, cid_from_digest, compute_cid, parse_cid, raw_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.store import Store
from p2psync.replication.tokens import (
    MAX_POSITION_DIGITS,
    ProgressGap,
    ProgressGapError,
    ProgressGapInvalid,
    ProgressToken,
    ProgressTokenDomainMismatch,
    ProgressTokenForked,
    ProgressTokenInvalid,
    ReplayBounds,
    gap_for,
    is_message_cid,
)
from p2psync.state.log import check_token, read_tokens, replay_bounds  # noqa: E402

TENANT = "did:key:z6MkTenant"


def cid(n: int) -> str:
    return compute_cid({"n": n})


def tok(position: int, stream: str = "s", epoch: str = "e", n: int | None = None) -> ProgressToken:
    return ProgressToken(stream, epoch, position, cid(position if n is None else n))


GOOD: dict[str, Any] = {"streamId": "s", "epoch": "e", "position": "42", "messageCid": cid(42)}


# --------------------------------------------------------------------------- wire


positions = st.integers(min_value=0, max_value=10**MAX_POSITION_DIGITS - 1)
ids = st.text(min_size=1, max_size=40)


@given(stream=ids, epoch=ids, position=positions, n=st.integers(0, 1000))
def test_wire_round_trip_json_and_cbor(stream: str, epoch: str, position: int, n: int) -> None:
    token = ProgressToken(stream, epoch, position, cid(n))
    wire = token.to_wire()
    assert wire["position"] == str(position)
    assert ProgressToken.from_wire(json.loads(json.dumps(wire))) == token
    assert ProgressToken.from_wire(cbor2.loads(cbor2.dumps(wire))) == token


@pytest.mark.parametrize(
    "change",
    [
        {"position": 42},  # a number, not a decimal string
        {"position": "042"},  # leading zero: not the exact token the source sent
        {"position": "00"},
        {"position": "-1"},
        {"position": "+1"},
        {"position": " 1"},
        {"position": "1 "},
        {"position": "1.0"},
        {"position": "1e3"},
        {"position": ""},
        {"position": "\u0661"},  # ARABIC-INDIC DIGIT ONE: str.isdigit() says yes
        {"position": "9" * (MAX_POSITION_DIGITS + 1)},
        {"position": None},
        {"streamId": ""},
        {"streamId": 7},
        {"epoch": None},
        {"epoch": "x" * 257},
        {"messageCid": "not-a-cid"},
        {"messageCid": 5},
        {"extra": "member"},
    ],
)
def test_from_wire_refuses_malformed(change: dict[str, Any]) -> None:
    with pytest.raises(ProgressTokenInvalid) as info:
        ProgressToken.from_wire({**GOOD, **change})
    assert info.value.code == "ProgressTokenInvalid" and info.value.status == 400


@pytest.mark.parametrize("member", sorted(GOOD))
def test_from_wire_refuses_missing_member(member: str) -> None:
    with pytest.raises(ProgressTokenInvalid, match=member):
        ProgressToken.from_wire({k: v for k, v in GOOD.items() if k != member})


@pytest.mark.parametrize("value", [None, [], "token", 42])
def test_from_wire_refuses_non_objects(value: Any) -> None:
    with pytest.raises(ProgressTokenInvalid):
        ProgressToken.from_wire(value)


def test_zero_is_a_canonical_position() -> None:
    assert ProgressToken.from_wire({**GOOD, "position": "0"}).position == 0


def test_constructor_validates_too() -> None:
    with pytest.raises(ProgressTokenInvalid):
        ProgressToken("s", "e", -1, cid(1))
    with pytest.raises(ProgressTokenInvalid):
        ProgressToken("s", "e", True, cid(1))  # a bool is not a position
    with pytest.raises(ProgressTokenInvalid):
        ProgressToken("s", "e", 1, "bafy-nope")


def test_coerce_accepts_tokens_wire_objects_and_lookalikes() -> None:
    @dataclass(frozen=True)
    class EngineToken:  # the shape of p2psync.dwn.replication_types.ProgressToken
        stream_id: str
        epoch: str
        position: int
        message_cid: str

    token = tok(7)
    assert ProgressToken.coerce(token) is token
    assert ProgressToken.coerce(token.to_wire()) == token
    assert ProgressToken.coerce(EngineToken("s", "e", 7, cid(7))) == token
    with pytest.raises(ProgressTokenInvalid):
        ProgressToken.coerce(object())


def decodes_as_message_cid(text: str) -> bool:
    """The slow, obvious check: decodes as a dag-cbor CIDv1 and re-encodes to the same text."""
    try:
        codec, digest = parse_cid(text)
    except DwnError:
        return False
    return codec == 0x71 and cid_from_digest(codec, digest) == text


@given(digest=st.binary(min_size=32, max_size=32))
def test_every_message_cid_is_accepted(digest: bytes) -> None:
    assert is_message_cid(cid_from_digest(0x71, digest))


@given(digest=st.binary(min_size=32, max_size=32), at=st.integers(0, 58), char=st.sampled_from("abhiyz2347A0=-"))
def test_message_cid_check_agrees_with_decoding(digest: bytes, at: int, char: str) -> None:
    real = cid_from_digest(0x71, digest)
    mutated = real[:at] + char + real[at + 1 :]
    assert is_message_cid(mutated) == decodes_as_message_cid(mutated)


def test_other_cids_are_not_message_cids() -> None:
    assert not is_message_cid(raw_cid(b"data"))  # a dataCid (raw codec)
    assert not is_message_cid(base32_multibase(bytes([0x01, 0x70, 0x12, 0x20]) + bytes(32)))  # dag-pb
    assert not is_message_cid(cid(1)[:-1])


# --------------------------------------------------------------------------- order


def test_positions_compare_numerically_not_lexicographically() -> None:
    assert tok(9) < tok(10)
    assert tok(10**39) > tok(10**39 - 1)
    assert "9" > "10"  # what a string comparison would have said
    assert tok(5).compare(tok(5)) == 0 and tok(5) <= tok(5) and tok(5) >= tok(5)


@given(a=positions, b=positions)
def test_order_is_the_integer_order(a: int, b: int) -> None:
    ta, tb = tok(a, n=a % 1000), tok(b, n=b % 1000)
    assert (ta < tb) == (a < b)
    assert (ta > tb) == (a > b)


@pytest.mark.parametrize("other", [tok(5, stream="other"), tok(5, epoch="new")])
def test_tokens_of_different_domains_do_not_compare(other: ProgressToken) -> None:
    ops: list[Callable[[], object]] = [
        lambda: tok(4) < other,
        lambda: tok(4) <= other,
        lambda: tok(4) > other,
        lambda: tok(4) >= other,
        lambda: tok(4).compare(other),
    ]
    for op in ops:
        with pytest.raises(ProgressTokenDomainMismatch):
            op()
    assert tok(5) != other  # equality is defined (just false)


def test_same_position_different_message_is_a_fork() -> None:
    with pytest.raises(ProgressTokenForked) as info:
        tok(5).compare(tok(5, n=6))
    assert info.value.status == 409


# --------------------------------------------------------------------------- gap (pure)


BOUNDS = ReplayBounds("s", "e", next_position=11, oldest=tok(3), latest=tok(10))


@pytest.mark.parametrize(
    ("token", "cid_at", "reason"),
    [
        (tok(5), cid(5), None),
        (tok(5), None, None),  # the entry at 5 was pruned: still resumable
        (tok(2), None, None),  # before the oldest entry, but nothing was compacted
        (tok(10), cid(10), None),
        (tok(5, stream="x"), None, "stream_mismatch"),
        (tok(5, stream="x", epoch="y"), None, "stream_mismatch"),
        (tok(5, epoch="old"), None, "epoch_mismatch"),
        (tok(11), None, "epoch_mismatch"),  # never issued here: the log went back in time
        (tok(5), cid(99), "epoch_mismatch"),  # position 5 names another message now
    ],
)
def test_gap_for(token: ProgressToken, cid_at: str | None, reason: str | None) -> None:
    gap = gap_for(token, BOUNDS, cid_at)
    if reason is None:
        assert gap is None
    else:
        assert gap is not None and gap.reason == reason
        assert gap.requested == token and gap.oldest_available == tok(3) and gap.latest_available == tok(10)


def test_gap_for_compaction_floor() -> None:
    compacted = ReplayBounds("s", "e", next_position=11, oldest=tok(6), latest=tok(10), floor=5)
    gap = gap_for(tok(4), compacted)
    assert gap is not None and gap.reason == "token_too_old"
    assert gap_for(tok(5), compacted) is None  # everything after 5 is still there


def test_gap_wire_round_trip_and_reply() -> None:
    gap = ProgressGap(tok(5, epoch="old"), tok(3), tok(10), "epoch_mismatch")
    wire = gap.to_wire()
    assert wire["code"] == "ProgressGap" and wire["reason"] == "epoch_mismatch"
    assert ProgressGap.from_wire(cbor2.loads(cbor2.dumps(wire))) == gap
    assert gap.to_reply()["status"] == {"code": 410, "detail": "Progress token gap"}
    empty_log = ProgressGap(tok(5), None, None, "stream_mismatch")
    assert "oldestAvailable" not in empty_log.to_wire()
    assert ProgressGap.from_wire(empty_log.to_wire()) == empty_log


@pytest.mark.parametrize(
    "change",
    [
        {"code": "Other"},
        {"reason": "tired"},
        {"requested": None},
        {"latestAvailable": None},  # one of the pair without the other
        {"extra": 1},
    ],
)
def test_gap_from_wire_refuses_malformed(change: dict[str, Any]) -> None:
    wire = {**ProgressGap(tok(5), tok(3), tok(10), "token_too_old").to_wire(), **change}
    wire = {k: v for k, v in wire.items() if v is not None}
    with pytest.raises((ProgressGapInvalid, ProgressTokenInvalid)):
        ProgressGap.from_wire(wire)


# --------------------------------------------------------------------------- gap (store)


def fill(store: Store, count: int, first: int = 0) -> list[str]:
    cids = [cid(first + i) for i in range(count)]
    with store.transaction():
        for c in cids:
            store.events.append(TENANT, c, {"interface": "Records"})
    return cids


def token_at(store: Store, position: int) -> ProgressToken:
    stream, epoch = store.events.stream(TENANT)
    entries = store.events.read(TENANT, after=position - 1, limit=1)
    assert entries and entries[0][0] == position
    return ProgressToken(stream, epoch, position, entries[0][1])


def test_check_token_against_a_real_log(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.db")
    fill(store, 5)
    assert check_token(store, TENANT, token_at(store, 3)) is None
    bounds = replay_bounds(store, TENANT)
    assert bounds is not None and bounds.oldest == token_at(store, 1) and bounds.latest == token_at(store, 5)
    assert [t.position for t in read_tokens(store, TENANT, token_at(store, 3))] == [4, 5]
    assert [t.position for t in read_tokens(store, TENANT, None, limit=2)] == [1, 2]

    other = Store(tmp_path / "b.db")
    fill(other, 5)
    foreign = token_at(other, 3)  # same tenant, same position, another store's stream
    gap = check_token(store, TENANT, foreign)
    assert gap is not None and gap.reason == "stream_mismatch"
    assert gap.latest_available == token_at(store, 5)  # in *our* domain: the consumer learns it
    with pytest.raises(ProgressGapError) as info:
        read_tokens(store, TENANT, foreign)
    assert info.value.status == 410 and info.value.gap == gap
    store.close()
    other.close()


def test_pruned_entries_do_not_make_a_token_too_old(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.db")
    cids = fill(store, 5)
    early = token_at(store, 2)
    with store.transaction():
        store.events.delete_events_by_cid(TENANT, cids[:3])  # the engine pruned 1..3
    assert check_token(store, TENANT, early) is None
    gap = check_token(store, TENANT, early, floor=3)  # had they been compacted instead
    assert gap is not None and gap.reason == "token_too_old" and gap.oldest_available == token_at(store, 4)
    store.close()


def test_unknown_tenant_is_a_stream_mismatch_and_creates_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.db")
    gap = check_token(store, "did:key:z6MkNobody", tok(1))
    assert gap is not None and gap.reason == "stream_mismatch" and gap.oldest_available is None
    assert store.tenants() == []
    store.close()


def test_restore_from_backup_is_detected(tmp_path: Path) -> None:
    """A store restored from a backup keeps its streamId and epoch; a consumer's token from
    after the backup must not be served (it would skip the new writes at reused positions)."""
    live = Store(tmp_path / "live.db")
    fill(live, 3)
    backup_path = tmp_path / "backup.db"
    backup = apsw.Connection(str(backup_path))
    with backup.backup("main", live.conn, "main") as b:
        b.step()
    backup.close()
    fill(live, 3, first=100)
    ahead = token_at(live, 5)  # the consumer pulled up to here
    live.close()

    restored = Store(backup_path)
    gap = check_token(restored, TENANT, ahead)
    assert gap is not None and gap.reason == "epoch_mismatch"  # never issued by this log
    fill(restored, 3, first=200)  # new writes reuse positions 4..6 for other messages
    gap = check_token(restored, TENANT, ahead)
    assert gap is not None and gap.reason == "epoch_mismatch"  # position 5 names another message
    assert check_token(restored, TENANT, token_at(restored, 2)) is None  # before the backup: fine
    restored.close()
