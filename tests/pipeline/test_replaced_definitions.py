"""A protocol definition a newer one replaced is exported and planned like any lacking message.

Records written while it was in force are judged by it, so a replica that lacks it must pull
it (protocol/replication-apply.md, *Superseded definitions travel*): the export lists it (the
log does), and the plan does not call it superseded where the target holds a newer one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import add_seconds
from p2psync.pipeline.export import export_store
from p2psync.pipeline.reconcile import read_plan_summary, read_repair_items, reconcile
from tests.replication.support import seeded

ALICE = seeded("pipeline-replaced-alice")
CHAT = "https://p2psync.example/protocols/pipeline-replaced"


def _configure(version: int) -> dict[str, Any]:
    definition = {"protocol": CHAT, "published": True, "types": {f"v{n}": {} for n in range(version + 1)},
                  "structure": {"v0": {}}}
    return ProtocolsConfigure.create(definition=definition, signer=ALICE,
                                     message_timestamp=add_seconds("2030-01-01T00:00:00.000000Z", version)).message


def test_a_replaced_definition_is_exported_and_planned(tmp_path: Path, spark: SparkSession) -> None:
    first, second = _configure(1), _configure(2)
    both, newer = Dwn(Store(tmp_path / "r1.db")), Dwn(Store(tmp_path / "r2.db"))
    for message in (first, second):
        assert both.process_message(ALICE.did, message).code == 202
    assert newer.process_message(ALICE.did, second).code == 202
    both.close()
    newer.close()
    exports = [tmp_path / "r1-export", tmp_path / "r2-export"]
    for rid, out in zip(("r1", "r2"), exports, strict=True):
        export_store(tmp_path / f"{rid}.db", out, replica_id=rid)
    listed = {r["message_cid"] for r in pq.read_table(str(exports[0] / "messages")).to_pylist()}
    assert listed == {message_cid(first), message_cid(second)}  # the replaced one too
    in_force = [r["message_cid"] for r in pq.read_table(str(exports[0] / "protocols")).to_pylist()]
    assert in_force == [message_cid(second)]

    reconcile(spark, exports, tmp_path / "plan")
    assert [i.message_cid for i in read_repair_items(tmp_path / "plan", "r2")] == [message_cid(first)]
    assert read_repair_items(tmp_path / "plan", "r1") == []
    assert read_plan_summary(tmp_path / "plan")["supersededMessages"] == 0
