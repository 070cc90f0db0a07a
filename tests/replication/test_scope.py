"""Sync scopes: canonical form, scopeId determinism (checked against an independent DAG-CBOR
encoder), strict parsing, and matching on real signed messages and the indexes a real store
keeps for them."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import dag_cbor
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import compute_cid, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_delete
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.replication.scope import MAX_PREFIXES, ListingFacts, SyncScope, SyncScopeInvalid, SyncScopeUndecidable

CHAT = "https://example.com/chat"
CTX = compute_cid({"n": 1})  # a well-formed recordId

# The examples of protocol/replication-state.md: changing canonicalization changes these.
GOLDEN = [
    (SyncScope.global_scope(), "bafyreihm25thlqpejyxt6axt4sfbp7cpnm5wlrkkpwdpmbdr2jgjzms3ra"),
    (SyncScope.for_protocol(CHAT), "bafyreiceic3nmrg6fwekyetf3yenryswziqq4ln6hfkrqk5vexfpqreuxa"),
    (SyncScope.subset(CHAT, ["thread/chat", "thread"]), "bafyreiapjldznmtlwi2ra4klkxucw757couotjzwli7ged6virbrc55ksa"),
    (SyncScope.subset(CHAT, ["thread"], [CTX]), "bafyreidmncfnmctqiftlnduxnr453nxbi53hcziemjeebxrh43lrkud7dm"),
]


def independent_scope_id(wire: dict[str, Any]) -> str:
    """CIDv1(dag-cbor, sha2-256) in base32, built with the pure-Python dag_cbor encoder."""
    digest = hashlib.sha256(dag_cbor.encode(wire)).digest()
    raw = bytes([0x01, 0x71, 0x12, 0x20]) + digest
    return "b" + base64.b32encode(raw).decode().lower().rstrip("=")


@pytest.mark.parametrize(("scope", "scope_id"), GOLDEN)
def test_golden_scope_ids(scope: SyncScope, scope_id: str) -> None:
    assert scope.scope_id == scope_id
    assert independent_scope_id(scope.to_wire()) == scope_id


def test_canonical_form() -> None:
    scope = SyncScope("subset", "Example.com/chat/", ("thread/chat", "b", "thread", "b", "a/x", "a0"))
    assert scope.to_wire() == {
        "kind": "subset",
        "protocol": "http://example.com/chat",  # normalized as the reference DWN normalizes
        "protocolPathPrefixes": ["a/x", "a0", "b", "thread"],  # sorted, deduplicated, covered dropped
    }
    assert SyncScope.from_wire(scope.to_wire()) == scope
    assert SyncScope.from_wire(scope.to_wire()).scope_id == scope.scope_id


def test_absent_and_empty_prefix_lists_are_the_same_scope() -> None:
    absent = SyncScope.from_wire({"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": ["thread"]})
    empty = SyncScope.from_wire(
        {"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": ["thread"], "contextIdPrefixes": []}
    )
    assert absent == empty and absent.scope_id == empty.scope_id
    assert "contextIdPrefixes" not in empty.to_wire()


def test_a_subset_without_prefixes_is_the_protocol_scope() -> None:
    scope = SyncScope.from_wire({"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": []})
    assert scope.kind == "protocol"
    assert scope.scope_id == SyncScope.for_protocol(CHAT).scope_id


prefix = st.lists(st.sampled_from(["a", "b", "c", "a/b", "a/b/c", "b/a", "ab"]), max_size=8)


@given(paths=prefix, order=st.randoms())
def test_scope_id_ignores_order_and_duplicates(paths: list[str], order: Any) -> None:
    shuffled = list(paths) + list(paths)
    order.shuffle(shuffled)
    a = SyncScope.subset(CHAT, paths)
    b = SyncScope.subset(CHAT, shuffled)
    assert a.scope_id == b.scope_id
    assert SyncScope.from_wire(a.to_wire()) == a  # canonical form is a fixed point


def test_distinct_selections_have_distinct_ids() -> None:
    ids = {
        SyncScope.global_scope().scope_id,
        SyncScope.for_protocol(CHAT).scope_id,
        SyncScope.for_protocol(CHAT + "2").scope_id,
        SyncScope.subset(CHAT, ["thread"]).scope_id,
        SyncScope.subset(CHAT, ["threads"]).scope_id,
        SyncScope.subset(CHAT, [], [CTX]).scope_id,
        SyncScope.subset(CHAT, ["thread"], [CTX]).scope_id,
    }
    assert len(ids) == 7


@pytest.mark.parametrize(
    "wire",
    [
        {"kind": "everything"},
        {"kind": "global", "protocol": CHAT},
        {"kind": "global", "protocolPathPrefixes": ["a"]},
        {"kind": "protocol"},
        {"kind": "protocol", "protocol": 7},
        {"kind": "protocol", "protocol": CHAT, "protocolPathPrefixes": ["a"]},
        {"kind": "subset", "protocolPathPrefixes": ["a"]},
        {"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": "thread"},
        {"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": [""]},
        {"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": ["/thread"]},
        {"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": ["thread/"]},
        {"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": ["a//b"]},
        {"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": [1]},
        {"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": None},
        {"kind": "subset", "protocol": CHAT, "contextIdPrefixes": ["bafy-not-a-cid"]},
        {"kind": "subset", "protocol": CHAT, "contextIdPrefixes": [CTX[:-3]]},  # a prefix inside a CID
        {"kind": "subset", "protocol": CHAT, "protocolPathPrefixes": [f"p{i}" for i in range(MAX_PREFIXES + 1)]},
        {"kind": "protocol", "protocol": "http://[::1"},  # not a URL
        {"kind": "protocol", "protocol": CHAT, "filter": {}},
        {"kind": "protocol", "protocol": None},
        "global",
    ],
)
def test_invalid_scopes_are_refused(wire: Any) -> None:
    with pytest.raises(SyncScopeInvalid) as info:
        SyncScope.from_wire(wire)
    assert info.value.code == "SyncScopeInvalid" and info.value.status == 400


# --------------------------------------------------------------------------- matching (indexes)


def idx(protocol: str | None = CHAT, path: str | None = None, context: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"interface": "Records", "method": "Write"}
    for key, value in (("protocol", protocol), ("protocolPath", path), ("contextId", context)):
        if value is not None:
            out[key] = value
    return out


C1, C2, C3 = (compute_cid({"r": i}) for i in range(3))


@pytest.mark.parametrize(
    ("scope", "indexes", "expected"),
    [
        (SyncScope.global_scope(), {}, True),
        (SyncScope.global_scope(), idx(None), True),
        (SyncScope.for_protocol(CHAT), idx(), True),
        (SyncScope.for_protocol(CHAT), idx("https://example.com/other"), False),
        (SyncScope.for_protocol(CHAT), idx(None), False),
        (SyncScope.subset(CHAT, ["thread"]), idx(path="thread"), True),
        (SyncScope.subset(CHAT, ["thread"]), idx(path="thread/chat"), True),
        (SyncScope.subset(CHAT, ["thread"]), idx(path="threads"), False),  # whole segments only
        (SyncScope.subset(CHAT, ["thread/chat"]), idx(path="thread"), False),
        (SyncScope.subset(CHAT, ["thread"]), idx(), False),  # no protocolPath: not in a path subset
        (SyncScope.subset(CHAT, ["thread"]), idx("https://example.com/other", "thread"), False),
        (SyncScope.subset(CHAT, [], [C1]), idx(path="x", context=f"{C1}/{C2}"), True),
        (SyncScope.subset(CHAT, [], [C1]), idx(path="x", context=C1), True),
        (SyncScope.subset(CHAT, [], [f"{C1}/{C2}"]), idx(path="x", context=C1), False),
        (SyncScope.subset(CHAT, [], [C1]), idx(path="x", context=f"{C3}/{C1}"), False),
        # both axes given: a message must satisfy both
        (SyncScope.subset(CHAT, ["thread"], [C1]), idx(path="thread/chat", context=f"{C1}/{C2}"), True),
        (SyncScope.subset(CHAT, ["thread"], [C1]), idx(path="note", context=f"{C1}/{C2}"), False),
        (SyncScope.subset(CHAT, ["thread"], [C1]), idx(path="thread", context=C2), False),
        (SyncScope.subset(CHAT, ["a", "thread"]), idx(path="thread/x"), True),  # any prefix of a list
    ],
)
def test_matches_indexes(scope: SyncScope, indexes: dict[str, Any], expected: bool) -> None:
    assert scope.matches(indexes) is expected


# --------------------------------------------------------------------------- matching (real messages)

DEFINITION: dict[str, Any] = {
    "protocol": CHAT,
    "published": True,
    "types": {"thread": {}, "chat": {}, "note": {}},
    "structure": {
        "thread": {"chat": {}},
        "note": {},
    },
}


def seeded(name: str) -> Identity:
    return Identity.from_private_bytes(name.encode().ljust(32, b"\0")[:32], "key")


def test_matches_real_messages_and_their_stored_indexes(tmp_path: Path) -> None:
    alice = seeded("alice")
    tenant = alice.did
    stamps = iter(f"2030-01-01T00:00:{s:02d}.000000Z" for s in range(1, 60))
    configure = ProtocolsConfigure.create(definition=DEFINITION, signer=alice, message_timestamp=next(stamps))

    def write(path: str | None, parent: str | None = None) -> dict[str, Any]:
        now = next(stamps)
        return RecordsWrite.create(
            signer=alice, data=b"x", protocol=CHAT if path else None, protocol_path=path,
            parent_context_id=parent, message_timestamp=now, date_created=now,
        ).message

    thread = write("thread")
    chat = write("thread/chat", thread["contextId"])
    note = write("note")
    plain = write(None)  # not in any protocol
    delete = create_records_delete(record_id=note["recordId"], signer=alice, message_timestamp=next(stamps))
    messages = {"configure": configure.message, "thread": thread, "chat": chat, "note": note, "plain": plain,
                "delete": delete}

    dwn = Dwn(Store(tmp_path / "s.db"))
    for name, message in messages.items():
        reply = dwn.process_message(tenant, message, b"x" if name in ("thread", "chat", "note", "plain") else None)
        assert reply.code in (202, 204), (name, reply.code, reply.detail)

    scopes = {
        "global": SyncScope.global_scope(),
        "protocol": SyncScope.for_protocol(CHAT),
        "threads": SyncScope.subset(CHAT, ["thread"]),
        "this-thread": SyncScope.subset(CHAT, [], [thread["contextId"]]),
    }
    expected = {
        "global": {"configure", "thread", "chat", "note", "plain", "delete"},
        "protocol": {"configure", "thread", "chat", "note", "delete"},
        "threads": {"thread", "chat"},
        "this-thread": {"thread", "chat"},
    }
    store = dwn.store
    present = {name for name, m in messages.items() if store.messages.has(tenant, message_cid(m))}
    assert present >= {"configure", "thread", "chat", "plain", "delete"}
    for scope_name, scope in scopes.items():
        by_indexes = {
            name for name in present
            if scope.matches(store.messages.get_indexes(tenant, message_cid(messages[name])) or {})
        }
        assert by_indexes == expected[scope_name] & present, scope_name
        # The message alone gives the same answer, except a RecordsDelete (only its indexes say).
        for name, message in messages.items():
            if name == "delete" and scope.kind != "global":
                with pytest.raises(SyncScopeUndecidable):
                    scope.matches(message)
            else:
                assert scope.matches(message) is (name in expected[scope_name]), (scope_name, name)
    dwn.close()


# -- the effective listing rule ------------------------------------------------------------------

PERMISSIONS = "https://tbd.website/dwn/permissions"
CTX2 = compute_cid({"n": 2})


def _facts(method: str, protocol: str | None, path: str | None = None, context: str | None = None,
           interface: str = "Records") -> ListingFacts:
    return ListingFacts(interface, method, protocol, path, context)


@pytest.mark.parametrize(("scope", "facts", "roles", "listed"), [
    # intent
    (SyncScope.subset(CHAT, ["thread/chat"]), _facts("Write", CHAT, "thread/chat", f"{CTX}/{CTX2}"), (), True),
    (SyncScope.subset(CHAT, ["thread/chat"]), _facts("Write", CHAT, "thread", CTX), (), False),
    # 1. every configure of the protocol, not another's
    (SyncScope.subset(CHAT, ["thread"]), _facts("Configure", CHAT, interface="Protocols"), (), True),
    (SyncScope.subset(CHAT, ["thread"]), _facts("Configure", "https://example.com/x", interface="Protocols"), (),
     False),
    # 2. every permission record, in protocol and subset scopes
    (SyncScope.for_protocol(CHAT), _facts("Write", PERMISSIONS, "grant", CTX), (), True),
    (SyncScope.subset(CHAT, ["thread"]), _facts("Write", PERMISSIONS, "grant/revocation", f"{CTX}/{CTX2}"), (),
     True),
    (SyncScope.subset(CHAT, ["thread"]), _facts("Delete", PERMISSIONS, "grant", CTX), (), True),
    (SyncScope.subset(CHAT, ["thread"]), _facts("Write", PERMISSIONS, "grant", CTX), (), True),
    # (another protocol's too: a read citing its grant falls back to what anyone may see)
    (SyncScope.subset(CHAT, ["thread"]), _facts("Write", PERMISSIONS, "request", CTX), (), True),
    # 3. records and deletes at a role path (subset only: a protocol scope has them anyway)
    (SyncScope.subset(CHAT, ["thread/chat"]), _facts("Write", CHAT, "friend", CTX), ("friend",), True),
    (SyncScope.subset(CHAT, ["thread/chat"]), _facts("Delete", CHAT, "thread/member", f"{CTX}/{CTX2}"),
     ("friend", "thread/member"), True),
    (SyncScope.subset(CHAT, ["thread/chat"]), _facts("Write", CHAT, "friend", CTX), (), False),
    # 4. deletes of possible ancestors: a proper path prefix, within the context prefixes
    (SyncScope.subset(CHAT, ["thread/chat"]), _facts("Delete", CHAT, "thread", CTX), (), True),
    (SyncScope.subset(CHAT, ["thread/chat"]), _facts("Write", CHAT, "thread", CTX), (), False),
    (SyncScope.subset(CHAT, ["thread/chat"]), _facts("Delete", CHAT, "post", CTX), (), False),
    (SyncScope.subset(CHAT, ["thread/chat"]), _facts("Delete", CHAT, "thread/other", CTX), (), False),
    (SyncScope.subset(CHAT, (), [f"{CTX}/{CTX2}"]), _facts("Delete", CHAT, "thread", CTX), (), True),
    (SyncScope.subset(CHAT, (), [f"{CTX}/{CTX2}"]), _facts("Delete", CHAT, "thread", CTX2), (), False),
    (SyncScope.subset(CHAT, ["thread/chat"], [CTX]), _facts("Delete", CHAT, "thread", CTX2), (), False),
    (SyncScope.subset(CHAT, ["thread/chat"], [CTX]), _facts("Delete", CHAT, "thread", CTX), (), True),
    # the whole tenant lists everything
    (SyncScope.global_scope(), _facts("Write", None), (), True),
])
def test_the_effective_listing_rule(scope: SyncScope, facts: ListingFacts, roles: tuple[str, ...],
                                    listed: bool) -> None:
    assert scope.lists(facts, roles) is listed


def test_listing_facts_of_a_message_and_of_indexes_agree(tmp_path: Path) -> None:
    alice = Identity.from_private_bytes(b"\x07" * 32)
    dwn = Dwn(Store(tmp_path / "s.db"))
    definition = {"protocol": CHAT, "published": True, "types": {"thread": {}}, "structure": {"thread": {}}}
    configure = ProtocolsConfigure.create(definition=definition, signer=alice).message
    assert dwn.process_message(alice.did, configure).code == 202
    write = RecordsWrite.create(signer=alice, data=b"x", protocol=CHAT, protocol_path="thread",
                                tags={"protocol": "https://example.com/tagged"}).message
    assert dwn.process_message(alice.did, write, b"x").code == 202
    for message in (configure, write):
        indexes = dwn.store.messages.get_indexes(alice.did, message_cid(message))
        assert indexes is not None
        assert ListingFacts.of(message) == ListingFacts.of(indexes)
    dwn.close()
