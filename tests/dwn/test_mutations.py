"""Bad input never damages the store.

Valid messages are mutated at random (properties dropped, added, retyped, characters flipped)
and fed to one store; a second store never sees them. Whatever the mutated message gets
back, it must be a coded reply, and afterwards both stores must answer queries identically
(unless the mutation happened to leave a valid message, which is then applied to both).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records import ALL_RECORDS_FILTER, create_records_delete, create_records_query
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store

OWNER = Identity.generate("key")
OTHER = Identity.generate("jwk")


def _fixture_messages() -> tuple[list[tuple[dict[str, Any], bytes | None]], list[tuple[dict[str, Any], bytes | None]]]:
    """(base messages applied to both stores, candidate messages to mutate)."""
    base: list[tuple[dict[str, Any], bytes | None]] = []
    w1 = RecordsWrite.create(signer=OWNER, data=b"one", data_format="text/plain", published=True)
    w2 = RecordsWrite.create(signer=OWNER, data=b"two" * 20_000, data_format="application/octet-stream")
    base += [(w1.message, b"one"), (w2.message, b"two" * 20_000)]
    candidates: list[tuple[dict[str, Any], bytes | None]] = [
        (RecordsWrite.create(signer=OWNER, data=b"three", data_format="text/plain").message, b"three"),
        (RecordsWrite.create_from(w1.message, signer=OWNER, data=b"one v2").message, b"one v2"),
        (create_records_delete(record_id=w2.record_id, signer=OWNER), None),
        (RecordsWrite.create(signer=OTHER, data=b"foreign", data_format="text/plain").message, b"foreign"),
    ]
    return base, candidates


BASE, CANDIDATES = _fixture_messages()

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=12),
                      st.floats(allow_nan=False, allow_infinity=False))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                             st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                          max_leaves=6)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], bytes | None]:
    message, data = copy.deepcopy(draw(st.sampled_from(CANDIDATES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(message) if p]
        if not paths:  # an earlier mutation emptied the message
            break
        path = draw(st.sampled_from(paths))
        parent: Any = message
        for step in path[:-1]:
            parent = parent[step]
        key = path[-1]
        action = draw(st.sampled_from(["drop", "replace", "flip", "add"]))
        if action == "drop" and isinstance(parent, dict):
            del parent[key]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(json_value)
        elif action == "flip" and isinstance(parent[key], str) and parent[key]:
            s = parent[key]
            i = draw(st.integers(0, len(s) - 1))
            parent[key] = s[:i] + draw(st.sampled_from("aZ0_-=/ é")) + s[i + 1:]
        else:
            parent[key] = draw(json_value)
    if data is not None and draw(st.booleans()):
        data = data + b"!"
    return message, data


def _view(dwn: Dwn) -> dict[str, Any]:
    """Everything a client could observe about the owner's records."""
    reply = dwn.process_message(OWNER.did, create_records_query(signer=OWNER, filter=ALL_RECORDS_FILTER))
    assert reply.code == 200, reply.detail
    entries = sorted(json.dumps(e, sort_keys=True) for e in reply.entries or [])
    return {
        "code": reply.code,
        "entries": entries,
        "cids": sorted(dwn.store.messages.cids(OWNER.did)),
        "events": [c for _, c in dwn.store.events.read(OWNER.did)],
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(mutated(), min_size=1, max_size=4))
def test_mutated_messages_never_damage_the_store(
    tmp_path_factory: Any, batch: list[tuple[dict[str, Any], bytes | None]]
) -> None:
    root = Path(tmp_path_factory.mktemp("mut"))
    seen, clean = Dwn(Store(root / "seen.db")), Dwn(Store(root / "clean.db"))
    try:
        for message, data in BASE:
            assert seen.process_message(OWNER.did, message, data).code == 202
            assert clean.process_message(OWNER.did, message, data).code == 202
        for message, data in batch:
            reply = seen.process_message(OWNER.did, message, data)
            assert isinstance(reply.code, int) and reply.detail, "every reply carries a code and a reason"
            assert reply.code != 500, f"internal error on mutated input: {reply.detail}"
            if reply.ok:
                # The mutation left a valid message (e.g. an added value that changed nothing
                # signed); then the clean store must accept it too, identically.
                assert clean.process_message(OWNER.did, message, data).code == reply.code
        assert _view(seen) == _view(clean)
    finally:
        seen.close()
        clean.close()


def test_candidates_are_valid_before_mutation(tmp_path: Path) -> None:
    """Guards the property test: unmutated candidates are accepted, so refusals come from mutations."""
    dwn = Dwn(Store(tmp_path / "s.db"))
    for message, data in BASE:
        assert dwn.process_message(OWNER.did, message, data).code == 202
    codes = [dwn.process_message(OWNER.did, m, d).code for m, d in CANDIDATES]
    assert codes == [202, 202, 202, 401]  # the last is a foreign author: refused by design
    assert message_cid(CANDIDATES[0][0]) in dwn.store.messages.cids(OWNER.did)
    dwn.close()
