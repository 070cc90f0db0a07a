"""``p2psync demo``: the main job on its embedded default.

In a private temporary directory: create an identity and a store, install a protocol, write
records (one larger than the 30,000-byte inline limit, so it goes to the data store), read
them back, and show what was stored and what was verified.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

NOTES_PROTOCOL: dict[str, Any] = {
    "protocol": "https://p2psync.example/protocols/notes",
    "published": True,
    "types": {
        "note": {"schema": "https://p2psync.example/schemas/note", "dataFormats": ["text/plain"]},
        "attachment": {"dataFormats": ["application/octet-stream"]},
    },
    "structure": {
        "note": {
            "$actions": [{"who": "anyone", "can": ["read"]}],
            "attachment": {"$size": {"max": 1_048_576}},
        }
    },
}


def run_demo(out: Any = None) -> int:
    from p2psync.dwn import jws
    from p2psync.dwn.datacid import data_cid
    from p2psync.dwn.did import Identity
    from p2psync.dwn.encoding import message_cid
    from p2psync.dwn.engine import Dwn
    from p2psync.dwn.protocols import ProtocolsConfigure
    from p2psync.dwn.records import create_records_query, create_records_read
    from p2psync.dwn.records_write import RecordsWrite
    from p2psync.dwn.store import Store

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="p2psync-demo-") as tmp:
        identity = Identity.generate("key")
        store_path = Path(tmp) / "store.db"
        dwn = Dwn(Store(store_path))
        tenant = identity.did
        say("p2psync demo — a local DWN on SQLite, verified like the reference DWN")
        say(f"  identity   {tenant}")
        say(f"  store      {store_path}")

        configure = ProtocolsConfigure.create(definition=NOTES_PROTOCOL, signer=identity).message
        reply = dwn.process_message(tenant, configure)
        say(f"  protocol   {NOTES_PROTOCOL['protocol']} -> {reply.code} {reply.detail}")
        if reply.code != 202:
            return 1

        proto = NOTES_PROTOCOL["protocol"]
        payloads: list[tuple[str, bytes, dict[str, Any]]] = [
            ("note", b"Meet at the field station at 09:00.", {}),
            ("note", "Offline-first: sync when peers meet. ✓".encode(), {}),
        ]
        writes: list[tuple[str, RecordsWrite, bytes]] = []
        for path, data, _ in payloads:
            w = RecordsWrite.create(signer=identity, data=data, data_format="text/plain",
                                    schema=NOTES_PROTOCOL["types"]["note"]["schema"],
                                    protocol=proto, protocol_path=path)
            writes.append((path, w, data))
        big = os.urandom(200_000)  # above the 30,000-byte inline limit: lands in the data store
        parent = writes[0][1]
        w = RecordsWrite.create(signer=identity, data=big, protocol=proto, protocol_path="note/attachment",
                                parent_context_id=parent.message["contextId"])
        writes.append(("note/attachment", w, big))

        say()
        say(f"  {'record':<24} {'path':<16} {'bytes':>8}  {'stored':<10} status")
        for path, w, data in writes:
            reply = dwn.process_message(tenant, w.message, data)
            where = "inline" if len(data) <= 30_000 else "data store"
            say(f"  {w.record_id[:22]}… {path:<16} {len(data):>8}  {where:<10} {reply.code} {reply.detail}")
            if reply.code != 202:
                return 1

        say()
        say("  reading back and verifying")
        ok = True
        for _path, w, data in writes:
            read = create_records_read(signer=identity, filter={"recordId": w.record_id})
            reply = dwn.process_message(tenant, read)
            got = reply.data or b""
            stored = (reply.entry or {}).get("recordsWrite", {})
            checks = {
                "data sha256": hashlib.sha256(got).digest() == hashlib.sha256(data).digest(),
                "dataCid": data_cid(got) == stored.get("descriptor", {}).get("dataCid"),
                "message CID": message_cid(stored) == message_cid(w.message),
                "signature": jws.verify(stored["authorization"]["signature"]) == [tenant] if stored else False,
            }
            ok = ok and reply.code == 200 and all(checks.values())
            marks = "  ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checks.items())
            say(f"  {w.record_id[:22]}… {reply.code}  {marks}")

        query = create_records_query(signer=identity, filter={"protocol": proto})
        reply = dwn.process_message(tenant, query)
        say()
        say(f"  query protocol={proto}: {len(reply.entries or [])} record(s)")
        say(f"  event log: {dwn.store.events.count(tenant)} entries, "
            f"messages stored: {dwn.store.messages.count(tenant)}")
        dwn.close()
    say(f"  {'all verified' if ok else 'VERIFICATION FAILED'} in {time.perf_counter() - started:.2f} s")
    return 0 if ok else 1
