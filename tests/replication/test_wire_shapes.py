"""JSON shapes of results, refs and tokens: round trips, refusals, and the documented examples."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2psync.dwn.encoding import cid_from_digest
from p2psync.dwn.replication_types import (
    Ancestor,
    Applied,
    CrossProtocolRef,
    Deferred,
    DependencyRef,
    Duplicate,
    Grant,
    Incomplete,
    InitialWrite,
    Invalid,
    KeyDelivery,
    Parent,
    ProgressToken,
    Protocol,
    RecordData,
    ReplicationApplyResult,
    ReplicationWireError,
    Role,
    Superseded,
    ref_from_json,
    result_from_json,
    token_from_json,
)

DOC = Path(__file__).resolve().parents[2] / "protocol" / "replication-apply.md"

text = st.text(min_size=1, max_size=20)
maybe = st.none() | text
common = {"message_cid": maybe, "terminal": st.booleans()}

refs: st.SearchStrategy[DependencyRef] = st.one_of(
    st.builds(Protocol, protocol=text, **common),
    st.builds(InitialWrite, record_id=text, protocol=maybe, **common),
    st.builds(Parent, record_id=text, protocol=text, **common),
    st.builds(Ancestor, record_id=text, protocol=maybe, **common),
    st.builds(Role, protocol=text, protocol_path=text, recipient=text, context_prefix=maybe, **common),
    st.builds(Grant, permission_grant_id=text, **common),
    st.builds(KeyDelivery, protocol=text, context_id=text, **common),
    st.builds(CrossProtocolRef, protocol=text, record_id=text, **common),
    st.builds(RecordData, record_id=text, data_cid=text, protocol=maybe, **common),
)
ids = st.text(min_size=1, max_size=40)
cids = st.binary(min_size=32, max_size=32).map(lambda d: cid_from_digest(0x71, d))
tokens = st.builds(ProgressToken, stream_id=ids, epoch=ids, position=st.integers(0, 10**30), message_cid=cids)
results: st.SearchStrategy[ReplicationApplyResult] = st.one_of(
    st.builds(Applied, ancestry_only=st.booleans(), position=st.none() | tokens),
    st.just(Duplicate()),
    st.just(Superseded()),
    st.builds(Incomplete, missing=st.lists(refs, min_size=1, max_size=5).map(tuple)),
    st.builds(Invalid, reason=st.text(max_size=50)),
    st.sampled_from([Deferred("tenant-inactive"), Deferred("resolver-unavailable"), Deferred("storage")]),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=20,
)


@given(results)
def test_results_round_trip_through_json(result: ReplicationApplyResult) -> None:
    wire = json.loads(json.dumps(result.to_json()))
    assert result_from_json(wire) == result


@given(refs)
def test_refs_round_trip_through_json(ref: DependencyRef) -> None:
    wire = json.loads(json.dumps(ref.to_json()))
    assert ref_from_json(wire) == ref
    assert wire["type"] == ref.type


@given(json_values)
def test_parsers_refuse_anything_else_with_one_error(value: Any) -> None:
    for parse in (result_from_json, ref_from_json, token_from_json):
        with contextlib.suppress(ReplicationWireError):
            parse(value)


@given(
    st.sampled_from(["Applied", "Incomplete", "Invalid", "Deferred"]),
    st.dictionaries(st.sampled_from(["missing", "reason", "ancestryOnly", "position"]), json_values),
)
def test_result_members_of_the_wrong_type_are_refused(kind: str, members: dict[str, Any]) -> None:
    try:
        result = result_from_json({"kind": kind, **members})
    except ReplicationWireError:
        return
    assert result.to_json()["kind"] == kind


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "Applied", "ancestryOnly": "yes"},
        {"kind": "Applied", "position": {"streamId": "s", "epoch": "e", "position": 3, "messageCid": "c"}},
        {"kind": "Applied", "position": {"streamId": "s", "epoch": "e", "position": "-3", "messageCid": "c"}},
        {"kind": "Incomplete", "missing": []},
        {"kind": "Incomplete", "missing": [{"type": "Protocol"}]},
        {"kind": "Incomplete", "missing": [{"type": "Protocol", "protocol": ""}]},
        {"kind": "Incomplete", "missing": [{"type": "Wormhole", "protocol": "p"}]},
        {"kind": "Incomplete", "missing": [{"type": "Grant", "permissionGrantId": "g", "terminal": "true"}]},
        {"kind": "Incomplete", "missing": [{"type": "Role", "protocol": "p", "protocolPath": "a", "recipient": 7}]},
        {"kind": "Incomplete", "missing": [{"type": "Protocol", "protocol": "p"}] * 1025},
        {"kind": "Invalid"},
        {"kind": "Deferred", "reason": "bored"},
        {"kind": "Maybe"},
        ["Applied"],
    ],
)
def test_malformed_results_are_refused(bad: Any) -> None:
    with pytest.raises(ReplicationWireError):
        result_from_json(bad)


def test_unknown_members_are_ignored() -> None:
    assert result_from_json({"kind": "Duplicate", "since": "later"}) == Duplicate()
    assert ref_from_json({"type": "Grant", "permissionGrantId": "g", "hint": 1}) == Grant(permission_grant_id="g")


def test_long_reasons_are_cut() -> None:
    result = result_from_json({"kind": "Invalid", "reason": "x" * 10_000})
    assert isinstance(result, Invalid) and len(result.reason) == 4096


def _doc_examples() -> list[dict[str, Any]]:
    blocks = re.findall(r"```json\n(.*?)\n```", DOC.read_text(encoding="utf-8"), flags=re.S)
    return [json.loads(b) for b in blocks]


def test_every_documented_example_parses_and_renders_back() -> None:
    examples = _doc_examples()
    kinds = {e["kind"] for e in examples if "kind" in e}
    types = {e["type"] for e in examples if "type" in e}
    assert kinds == {"Applied", "Duplicate", "Superseded", "Incomplete", "Invalid", "Deferred"}
    assert types == {
        "Protocol",
        "InitialWrite",
        "Parent",
        "Ancestor",
        "Role",
        "Grant",
        "KeyDelivery",
        "CrossProtocolRef",
        "RecordData",
    }
    for example in examples:
        if "kind" in example:
            assert result_from_json(example).to_json() == example
        else:
            assert ref_from_json(example).to_json() == example
