"""Writes protocol/examples/replication/15-roleRecords.json (replication-profiles.md §10.2).

    .venv/bin/python tests/peer/make_role_records_example.py

Alice's club: version 1 keeps a `member` list that is no role; carol, dave and bob are made
members (bob's membership is deleted again); version 2 makes `member` a `$role`. A subset sink
that is listed version 2 asks the source for the role records, and the source answers in two
pages. The identities and timestamps are deterministic, so every CID and signature is the same
on every run; the answers are computed by p2psync's source (LocalStoreFetcher.role_records,
message_entry) with room for 2 entries an answer, for brevity (p2psync's is 64).
tests/peer/test_examples.py checks the file against the code.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.protocols import ProtocolsConfigure, fetch_all_role_paths  # noqa: E402
from p2psync.dwn.records import create_records_delete  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from p2psync.replication.scope import RoleRecordsRef  # noqa: E402
from p2psync.replication.source import message_entry  # noqa: E402
from p2psync.state.local import LocalStoreFetcher  # noqa: E402
from tests.peer.make_revs_example import described  # noqa: E402
from tests.replication.support import Clock, seeded  # noqa: E402

OUT = ROOT / "protocol" / "examples" / "replication" / "15-roleRecords.json"
CLUB = "https://p2psync.example/club"
#: entries an answer in this example (p2psync's limit is MAX_ENTRIES_PER_REF, 64)
PAGE = 2


def club(version: int) -> dict[str, Any]:
    member: dict[str, Any] = {"$role": True} if version == 2 else {}
    return {"protocol": CLUB, "published": False,
            "types": {"member": {"dataFormats": ["text/plain"]}}, "structure": {"member": member}}


def pages() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each request body the sink sends and the source's reply body, computed on a fresh store."""
    alice, clock = seeded("alice"), Clock()
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "source.db")
        dwn = Dwn(store)

        def process(message: dict[str, Any], data: bytes | None = None) -> None:
            reply = dwn.process_message(alice.did, message, data)
            assert reply.code == 202, reply.detail

        process(ProtocolsConfigure.create(definition=club(1), signer=alice, message_timestamp=clock.tick()).message)
        for name in ("carol", "dave", "bob"):
            ts = clock.tick()
            data = f"{name} is a member".encode()
            write = RecordsWrite.create(signer=alice, data=data, data_format="text/plain", protocol=CLUB,
                                        protocol_path="member", recipient=seeded(name).did, message_timestamp=ts,
                                        date_created=ts)
            process(write.message, data)
        process(create_records_delete(record_id=write.record_id, signer=alice, message_timestamp=clock.tick()))
        configure = ProtocolsConfigure.create(definition=club(2), signer=alice, message_timestamp=clock.tick())
        process(configure.message)

        fetcher = LocalStoreFetcher(store)
        paths = fetch_all_role_paths("", club(2)["structure"], [])
        ref: RoleRecordsRef | None = RoleRecordsRef(CLUB)
        while ref is not None:
            entries, following = fetcher.role_records(alice.did, CLUB, paths, ref.after, PAGE)
            answer: dict[str, Any] = {"entries": [message_entry(e) for e in entries]}
            if following is not None:
                answer["next"] = following
            out.append(({"refs": [ref.to_json()]}, {"answers": [answer]}))
            ref = None if following is None else RoleRecordsRef(CLUB, following)
        dwn.close()
    return out


def example() -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for number, (request, reply) in enumerate(pages(), start=9):
        later = "after" in request["refs"][0]
        messages.append(described("A", "MSG", number, {"Profile": "getDependencies", "collection": "0"}, request,
                                  "the next page: after is the previous answer's next" if later else
                                  "A was listed B's configure of version 2 and applied it; before its token "
                                  "settles, A asks for the records at its role paths"))
        last = "next" not in reply["answers"][0]
        messages.append(described("B", "RPY", number, {}, reply,
                                  "the last page: no next" if last else
                                  "whole records in recordId order, at most the answer limit (2 here, 64 in "
                                  "p2psync), and next to continue after; a deleted record comes with its delete"))
    return {
        "description": "A subset sink asks for the role records of a protocol whose re-configure made an existing "
                       "path a $role path (replication-profiles.md §10.2). Both peers offered roleRecords in hello.",
        "messages": messages,
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(example(), indent=1) + "\n")
    print(f"wrote {OUT}")
