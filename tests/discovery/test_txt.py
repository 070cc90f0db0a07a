"""The TXT record format (protocol/discovery.md), the advert and peer values, without a network."""

from __future__ import annotations

import hashlib

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from p2psync.discovery import (
    SERVICE_TYPE,
    Advert,
    Discovery,
    DiscoveryError,
    PeerGone,
    PeerSeen,
    decode_txt,
    default_instance_name,
    encode_txt,
    tenant_hash,
)
from p2psync.discovery.service import SUBSCRIBER_BUFFER
from p2psync.discovery.txt import MAX_TXT_BYTES, MAX_TXT_STRING, split_strings

DID_A = "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"
SID = "0f9c5f0e-3c1a-4e8e-9a55-1b2f5d3c7a10"
SALT = "00112233445566778899aabbccddeeff"
TENANTS = ("did:key:z6MkjchhfUsD6mmvni8mCdXHw216Xrm9bQe2mBH1P5RDjVJG", "did:web:example.com")

# DIDs as DID Core §3.1 spells them.
dids = st.from_regex(r"did:[a-z0-9]{1,8}:[A-Za-z0-9._%:-]{0,50}[A-Za-z0-9._%-]", fullmatch=True)


def test_spec_example_bytes() -> None:
    """The worked example of protocol/discovery.md §4, byte for byte."""
    rdata = encode_txt(did=DID_A, sid=SID, version=1, capabilities=("pull", "push", "continuous"),
                       tenants=TENANTS, salt=SALT)
    assert split_strings(rdata) == [
        b"txtvers=1",
        b"pv=1",
        b"did=" + DID_A.encode(),
        b"sid=" + SID.encode(),
        b"caps=pull,push,continuous",
        b"salt=" + SALT.encode(),
        b"h0=" + (tenant_hash(SALT, TENANTS[0]) + tenant_hash(SALT, TENANTS[1])).encode(),
    ]
    expected = hashlib.sha256(bytes.fromhex(SALT) + b"did:web:example.com").hexdigest()[:16]
    assert tenant_hash(SALT, TENANTS[1]) == expected
    assert tenant_hash(SALT, TENANTS[0]) == "202b533755774ed6"
    assert tenant_hash(SALT, TENANTS[1]) == "300d345a9ae03f28"
    clear = encode_txt(did=DID_A, sid=SID, version=1, capabilities=("pull",), tenants=TENANTS)
    assert split_strings(clear)[4:] == [b"caps=pull", b"t0=" + TENANTS[0].encode(), b"t1=" + TENANTS[1].encode()]


@given(
    tenants=st.lists(dids, max_size=12, unique=True),
    private=st.booleans(),
    caps=st.lists(st.sampled_from(["pull", "push", "continuous", "x-1"]), unique=True),
    fingerprint=st.one_of(st.none(), st.text("ABCxyz019_-", min_size=43, max_size=43)),
)
def test_round_trip(tenants: list[str], private: bool, caps: list[str], fingerprint: str | None) -> None:
    salt = SALT if private else None
    try:
        rdata = encode_txt(did=DID_A, sid=SID, version=1, capabilities=caps, tenants=tenants, salt=salt,
                           fingerprint=fingerprint)
    except DiscoveryError as exc:
        assert exc.code == "AdvertTooLarge"
        return
    assert len(rdata) <= MAX_TXT_BYTES
    assert all(len(s) <= MAX_TXT_STRING for s in split_strings(rdata))
    record = decode_txt(rdata)
    assert (record.did, record.sid, record.version, record.capabilities) == (DID_A, SID, "1", tuple(caps))
    assert record.fingerprint == fingerprint
    if private:
        assert record.salt == SALT and record.tenants == tuple(tenant_hash(SALT, t) for t in tenants)
        assert not set(record.tenants) & set(tenants)
    else:
        assert record.salt is None and record.tenants == tuple(tenants)


@given(st.binary(max_size=600))
def test_decoding_junk_raises_only_txt_invalid(rdata: bytes) -> None:
    try:
        decode_txt(rdata)
    except DiscoveryError as exc:
        assert exc.code == "TxtInvalid"


@given(st.lists(st.binary(max_size=80), max_size=12))
def test_decoding_junk_strings_raises_only_txt_invalid(strings: list[bytes]) -> None:
    prefix = [b"txtvers=1", b"pv=1", b"did=" + DID_A.encode(), b"sid=" + SID.encode(), b"caps=pull"]
    rdata = b"".join(bytes([len(s)]) + s for s in prefix + strings)
    try:
        record = decode_txt(rdata)
    except DiscoveryError as exc:
        assert exc.code == "TxtInvalid"
    else:
        assert record.did == DID_A


def txt(*strings: bytes) -> bytes:
    return b"".join(bytes([len(s)]) + s for s in strings)


BASE = (b"txtvers=1", b"pv=1", b"did=" + DID_A.encode(), b"sid=" + SID.encode(), b"caps=pull")


@pytest.mark.parametrize(
    ("rdata", "why"),
    [
        (txt(b"txtvers=2", *BASE[1:]), "txtvers"),
        (txt(*BASE[:4]), "missing caps"),
        (txt(*BASE, b"t0=" + TENANTS[0].encode(), b"t2=" + TENANTS[1].encode()), "without gaps"),
        (txt(*BASE, b"salt=" + SALT.encode(), b"t0=" + TENANTS[0].encode()), "either clear or private"),
        (txt(*BASE, b"h0=00112233"), "without a salt"),
        (txt(*BASE, b"salt=" + SALT.encode(), b"h0=0011223344556677aa"), "16-hex-digit"),
        (txt(*BASE, b"t0=alice"), "not a DID"),
        (txt(*BASE, b"tls=abc"), "not a certificate fingerprint"),
        (b"\x09txtvers=1\x40pv", "runs past the end"),
    ],
)
def test_invalid_records(rdata: bytes, why: str) -> None:
    with pytest.raises(DiscoveryError, match=why) as info:
        decode_txt(rdata)
    assert info.value.code == "TxtInvalid"


def test_decoding_follows_dns_sd_key_rules() -> None:
    """Keys are case-insensitive, the first occurrence wins, unknown keys are skipped (RFC 6763 §6.4)."""
    record = decode_txt(txt(*BASE[:4], b"CAPS=push", b"caps=pull", b"future=1", b"flag", b"T0=" + TENANTS[1].encode()))
    assert record.capabilities == ("push",) and record.tenants == (TENANTS[1],)


def test_too_many_tenants_is_a_clear_error() -> None:
    many = [f"did:key:z6Mk{i:052d}" for i in range(40)]
    with pytest.raises(DiscoveryError) as info:
        encode_txt(did=DID_A, sid=SID, version=1, capabilities=(), tenants=many)
    assert info.value.code == "AdvertTooLarge" and "private mode" in info.value.detail
    # The same tenants fit as hashes, 15 to a string.
    record = decode_txt(encode_txt(did=DID_A, sid=SID, version=1, capabilities=(), tenants=many, salt=SALT))
    assert len(record.tenants) == 40
    with pytest.raises(DiscoveryError) as info:
        encode_txt(did=DID_A, sid=SID, version=1, capabilities=(), tenants=["did:web:" + "x" * 250])
    assert info.value.code == "AdvertTooLarge" and "255" in info.value.detail
    # Discovery refuses at construction, before touching the network.
    with pytest.raises(DiscoveryError, match="AdvertTooLarge"):
        Discovery(Advert(DID_A, SID, 4000, tenants=tuple(many)), interfaces=["10.77.0.1"])


def test_advert_checks() -> None:
    for bad in ({"port": 0}, {"ttl": 0}, {"name": "a.b"}, {"name": "x" * 64}, {"addresses": ("nowhere",)}):
        with pytest.raises(DiscoveryError) as info:
            Advert(**{"did": DID_A, "sid": SID, "port": 4000, **bad})  # type: ignore[arg-type]
        assert info.value.code == "AdvertInvalid"
    with pytest.raises(DiscoveryError, match="AdvertInvalid"):
        Discovery(Advert("alice", SID, 4000))
    with pytest.raises(DiscoveryError, match="AdvertInvalid"):
        Discovery(Advert(DID_A, "not a sid!", 4000))
    for bad_interface in ("eth0", "0.0.0.0", "::"):
        with pytest.raises(DiscoveryError, match="BindFailed"):
            Discovery(None, interfaces=[bad_interface])


def test_default_instance_name() -> None:
    assert default_instance_name(SID, "laptop.example.org") == "laptop-0f9c5f0e"
    long = default_instance_name(SID, "é" * 40)
    assert long.endswith("-0f9c5f0e") and len(long.encode()) <= 63
    assert Advert(DID_A, SID, 4000).instance == default_instance_name(SID)
    assert Advert(DID_A, SID, 4000, name="Kitchen PC").instance == "Kitchen PC"


def peer(**changes: object) -> PeerSeen:
    values: dict[str, object] = {
        "name": "laptop-0f9c5f0e", "did": DID_A, "sid": SID, "addresses": ("10.77.0.2",), "port": 4000,
        "tenants": frozenset(TENANTS), "tenants_hashed": False, "salt": None, "version": "1",
        "capabilities": ("pull",), "last_seen": 1.0,
    }
    values.update(changes)
    return PeerSeen(**values)  # type: ignore[arg-type]


def test_peer_seen() -> None:
    clear = peer()
    assert clear.shares(TENANTS[0]) and not clear.shares(DID_A)
    hashed = peer(tenants=frozenset({tenant_hash(SALT, TENANTS[1])}), tenants_hashed=True, salt=SALT)
    assert hashed.shares(TENANTS[1]) and not hashed.shares(TENANTS[0])
    assert clear.url() == "ws://10.77.0.2:4000/_p2psync"
    assert peer(addresses=("fd00::2",)).url() == "ws://[fd00::2]:4000/_p2psync"
    assert peer(fingerprint="F" * 43).url() == "wss://10.77.0.2:4000/_p2psync"  # the advert names a certificate
    with pytest.raises(DiscoveryError, match="NoAddress"):
        peer(addresses=()).url()
    assert peer(last_seen=2.0) == clear  # a refresh is not a change
    assert SERVICE_TYPE == "_p2psync._tcp.local."


async def test_a_subscriber_that_falls_behind_is_dropped_not_waited_for() -> None:
    discovery = Discovery(None, interfaces=["10.77.0.1"])
    slow, fast = discovery.subscribe(), discovery.subscribe()
    gone = PeerGone("n", DID_A, SID)
    for i in range(SUBSCRIBER_BUFFER + 1):
        discovery._emit(gone)
        if i < SUBSCRIBER_BUFFER:
            assert fast.receive_nowait() == gone
    received = [slow.receive_nowait() for _ in range(SUBSCRIBER_BUFFER)]
    assert received == [gone] * SUBSCRIBER_BUFFER
    with pytest.raises(trio.EndOfChannel):
        slow.receive_nowait()
    assert fast.receive_nowait() == gone  # the reader that kept up still gets everything
