"""The golden exchanges of replication-profiles.md §14 (protocol/examples/replication/*.json)
are what this implementation encodes and accepts: another team tests against these files, so
they must not drift from the code."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from p2psync.replication.hello import Hello, HelloProofInvalid, verify_proof
from p2psync.replication.wire import decode_body, encode_body

EXAMPLES = Path(__file__).resolve().parents[2] / "protocol" / "examples" / "replication"
FILES = sorted(EXAMPLES.glob("*.json"))


def from_dag_json(value: Any) -> Any:
    """DAG-JSON as §14.1 writes it: byte strings are ``{"/": {"bytes": <base64, no padding>}}``."""
    if isinstance(value, dict):
        inner = value.get("/")
        if len(value) == 1 and isinstance(inner, dict) and set(inner) == {"bytes"}:
            text = inner["bytes"]
            return base64.b64decode(text + "=" * (-len(text) % 4))
        return {k: from_dag_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_dag_json(v) for v in value]
    return value


def load(path: Path) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(path.read_text())["messages"]
    return messages


def test_there_are_examples_for_every_step_of_the_flow() -> None:
    assert len(FILES) >= 13
    profiles = {m["properties"].get("Profile") for f in FILES for m in load(f)}
    # getCheckpoint has no example yet (its shape is setCheckpoint's reply, §4.3).
    for profile in ("hello", "getCollections", "setCheckpoint", "subChanges", "changes",
                    "proposeChanges", "rev", "norev", "getAttachment", "getDependencies", "proveAttachment"):
        assert profile in profiles, profile


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_every_body_is_our_deterministic_encoding(path: Path) -> None:
    checked = 0
    for message in load(path):
        assert isinstance(message["from"], str) and message["type"] in ("MSG", "RPY", "ERR")
        assert isinstance(message["number"], int) and isinstance(message["properties"], dict)
        if "body" not in message:
            continue
        value = from_dag_json(message["body"])
        encoded = encode_body(value)
        assert len(encoded) == message["bodyLength"]
        assert hashlib.sha256(encoded).hexdigest() == message["bodySha256"]
        if "bodyCborHex" in message:
            assert encoded.hex() == message["bodyCborHex"]
            assert decode_body(bytes.fromhex(message["bodyCborHex"])) == value
        checked += 1
    assert checked > 0


def test_the_hello_proofs_verify_and_bind_both_nonces() -> None:
    messages = load(EXAMPLES / "01-hello.json")
    hellos = {m["from"]: Hello.from_wire(from_dag_json(m["body"])) for m in messages if m["type"] == "MSG"}
    proofs = {m["from"]: from_dag_json(m["body"])["proof"] for m in messages if m["type"] == "RPY"}
    # B's reply proves B's DID over A's nonce (and the reverse).
    verify_proof(proofs["B"], hellos["A"], hellos["B"])
    verify_proof(proofs["A"], hellos["B"], hellos["A"])
    with pytest.raises(HelloProofInvalid):
        verify_proof(proofs["A"], hellos["A"], hellos["B"])  # a proof is for one direction only


def test_the_revs_example_is_what_the_sink_answers() -> None:
    """§8.4: each RevEntry is judged on its own; the damaged one is refused, the other applied."""
    from tests.peer.make_revs_example import results_for

    request, reply = load(EXAMPLES / "14-revs.json")
    assert request["properties"]["Profile"] == "revs" and reply["type"] == "RPY"
    body = from_dag_json(request["body"])
    assert [m["position"] for m in body["revs"]] == ["7", "8"]
    recorded = from_dag_json(reply["body"])["results"]
    again = results_for(body)
    # The apply's position names the fresh store's stream: compare what does not depend on it.
    assert [r.get("kind") for r in again] == [r.get("kind") for r in recorded] == ["Applied", None]
    assert again[1] == recorded[1] == {"status": 424, "error": {"code": "AttachmentInvalid",
                                                               "detail": "data does not hash to dataCid"}}


def test_the_source_encodes_every_rev_and_revs_example_byte_for_byte() -> None:
    """The source assembles `rev` and `revs` bodies from each message's own encoding
    (encode_message_entry): the bytes must be those of the examples, member order included."""
    from p2psync.dwn.progress import ProgressToken
    from p2psync.replication.closure import ReplicationEntry
    from p2psync.replication.source import encode_message_entry, encode_revs_body

    def entry_of(member: dict[str, Any]) -> ReplicationEntry:
        return ReplicationEntry(member["message"], member.get("data"))

    checked = 0
    for path in FILES:
        for message in load(path):
            profile = message["properties"].get("Profile")
            if message["type"] != "MSG" or profile not in ("rev", "revs"):
                continue
            body = from_dag_json(message["body"])
            if profile == "rev":
                size = None if "data" in body else body.get("dataSize")
                encoded = encode_message_entry(entry_of(body), size=size)
            else:
                token = ProgressToken("s", "e", 0, body["revs"][0]["messageCid"])
                encoded = encode_revs_body([
                    encode_message_entry(entry_of(m), token=ProgressToken.of_own_log(
                        token, int(m["position"]), m["messageCid"]))
                    for m in body["revs"]
                ])
            assert hashlib.sha256(encoded).hexdigest() == message["bodySha256"], (path.name, message["number"])
            checked += 1
    assert checked >= 5


def test_the_role_records_example_is_what_the_source_answers() -> None:
    """§10.2: the pages of a RoleRecords ref, as p2psync's source answers them on a store
    built the same way (deterministic keys and clock: every body is the same, byte for byte)."""
    from tests.peer.make_role_records_example import example

    recorded = load(EXAMPLES / "15-roleRecords.json")
    again = example()["messages"]
    assert [(m["number"], m["bodySha256"]) for m in again] == [(m["number"], m["bodySha256"]) for m in recorded]
    bodies = [from_dag_json(m["body"]) for m in recorded]
    answers = [b["answers"][0] for b in bodies if "answers" in b]
    assert [a.get("next") for a in answers[:-1]] == [b["refs"][0]["after"] for b in bodies[2::2]]
    assert "next" not in answers[-1] and len(answers) >= 2
