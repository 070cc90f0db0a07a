"""A record's long history does not make each of its updates slower: what an apply asks of a
record's archived rows is a seek down its index, not a read of every row it has. Measured in
SQLite virtual-machine steps, which do not depend on the machine or its load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw

from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.replication.closure import ReplicationEntry
from p2psync.replication.effects import ApplyBatch
from tests.replication.support import Clock, seeded
from tests.state.test_replicated_apply import _service

ALICE = seeded("history-alice")
PHONE = "11111111-1111-4111-8111-111111111111"


def _record(updates: int) -> list[ReplicationEntry]:
    clock = Clock()
    ts = clock.tick()
    first = RecordsWrite.create(signer=ALICE, data=b"v0", message_timestamp=ts, date_created=ts).message
    out, prev = [ReplicationEntry(first, b"v0")], first
    for i in range(updates):
        data = f"v{i + 1}".encode()
        prev = RecordsWrite.create_from(prev, signer=ALICE, data=data, message_timestamp=clock.tick()).message
        out.append(ReplicationEntry(prev, data))
    return out


def _steps_of_last_update(tmp_path: Path, history: int) -> int:
    """VM steps the queries of the record's archived rows take in the apply of its update
    number ``history`` + 1 (the record's rows looked up by record id, not by CID)."""
    store = Store(tmp_path / f"h{history}.db")
    service = _service(store)
    *before, last = _record(history + 1)
    for i in range(0, len(before), 50):
        _, error = service.run(ApplyBatch(ALICE.did, tuple(before[i : i + 50]), PHONE))
        assert error is None
    service.committer.flush()
    steps = 0

    def profile(event: dict[str, Any]) -> None:
        nonlocal steps
        sql = event["sql"].replace(" ", "")
        if sql.upper().startswith("SELECT") and "FROMarchive" in sql and "record_id=?" in sql:
            steps += event["stmt_status"]["SQLITE_STMTSTATUS_VM_STEP"]

    store.conn.trace_v2(apsw.SQLITE_TRACE_PROFILE, profile)
    done, error = service.run(ApplyBatch(ALICE.did, (last,), PHONE))
    store.conn.trace_v2(0, None)
    assert error is None and done[0][0].kind == "Applied"
    store.close()
    return steps


def test_an_update_of_a_long_record_costs_what_a_short_ones_does(tmp_path: Path) -> None:
    short, long = _steps_of_last_update(tmp_path, 5), _steps_of_last_update(tmp_path, 200)
    assert short > 0, "no query of the record's archived rows was seen"
    # Reading every row of the record would cost tens of steps per row: 200 rows, thousands.
    assert long <= short + 50, (short, long)
