"""Writes protocol/examples/replication/14-revs.json (replication-profiles.md §8.4).

    .venv/bin/python tests/peer/make_revs_example.py

Two of alice's notes (deterministic identity, fixed timestamps, so the signatures and CIDs
are the same on every run) in one `revs`, the second with its data damaged in transit, and
the sink's reply: the first applied, the second refused on its own. The reply is computed by
p2psync's sink rules (`check_data`, `error_result`) and engine on a fresh store;
tests/peer/test_examples.py checks the file against the code.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from p2psync.replication.closure import ReplicationEntry  # noqa: E402
from p2psync.replication.sink import check_data, error_result  # noqa: E402
from p2psync.replication.source import message_entry  # noqa: E402
from p2psync.replication.wire import PeerError, decode_body, encode_body  # noqa: E402
from tests.replication.support import Clock, seeded  # noqa: E402

OUT = ROOT / "protocol" / "examples" / "replication" / "14-revs.json"
#: the positions of the two notes in the source's log (after a `changes` that listed them)
POSITIONS = (7, 8)


def notes() -> list[ReplicationEntry]:
    alice, clock = seeded("alice"), Clock()
    out = []
    for i in range(2):
        now = clock.tick()
        data = f"note {i} in a batch".encode()
        write = RecordsWrite.create(signer=alice, data=data, schema="https://p2psync.example/note",
                                    data_format="text/plain", message_timestamp=now, date_created=now)
        out.append(ReplicationEntry(write.message, data))
    return out


def revs_body(entries: list[ReplicationEntry]) -> dict[str, Any]:
    """The request body as a source sends it, the second entry's data damaged."""
    members = []
    for position, entry in zip(POSITIONS, entries, strict=True):
        member = message_entry(entry)
        member["position"], member["messageCid"] = str(position), entry.cid
        members.append(member)
    damaged = bytearray(members[1]["data"])
    damaged[0] ^= 0x20
    members[1]["data"] = bytes(damaged)
    return {"revs": members}


def results_for(body: dict[str, Any]) -> list[Any]:
    """The sink's answer, per entry, applied to a fresh store."""
    alice = seeded("alice")
    results: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "sink.db")
        dwn = Dwn(store)
        for member in body["revs"]:
            try:
                check_data(member["message"], member["dataSize"], member["data"])
            except PeerError as exc:
                results.append(error_result(exc))
                continue
            with store.transaction():
                result = dwn.apply_replicated_message(alice.did, member["message"], member["data"])
            results.append(result.to_json())
        store.close()
    return results


def dag_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"/": {"bytes": base64.b64encode(value).decode().rstrip("=")}}
    if isinstance(value, dict):
        return {k: dag_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [dag_json(v) for v in value]
    return value


def described(frm: str, kind: str, number: int, properties: dict[str, str], value: Any, note: str) -> dict[str, Any]:
    encoded = encode_body(value)
    assert decode_body(encoded) == value
    out: dict[str, Any] = {"from": frm, "type": kind, "number": number, "properties": properties,
                           "body": dag_json(value), "bodyLength": len(encoded),
                           "bodySha256": hashlib.sha256(encoded).hexdigest()}
    if len(encoded) <= 2048:
        out["bodyCborHex"] = encoded.hex()
    out["note"] = note
    return out


def example() -> dict[str, Any]:
    body = revs_body(notes())
    results = results_for(body)
    return {
        "description": "B (source) sends two notes in one revs; A applies the first and refuses the second on its "
                       "own (its data does not hash to dataCid). Both peers offered the revs capability in hello.",
        "messages": [
            described("B", "MSG", 5, {"Profile": "revs", "collection": "0"}, body,
                      "RevEntries: MessageEntry members plus position and messageCid; not compressed"),
            described("A", "RPY", 5, {}, {"results": results},
                      "one result per entry, sent once the first entry's apply is committed"),
        ],
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(example(), indent=1) + "\n")
    print(f"wrote {OUT}")
