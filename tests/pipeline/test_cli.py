"""The pipeline commands through their own parser (p2psync/cli adds them with ``register``)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from p2psync.cli import CliError
from p2psync.cli.pipeline import EXIT_VIOLATIONS, register
from p2psync.pipeline.reconcile import read_repair_items
from tests.pipeline.worlds import build_replica, delete_messages, reconcile_story

BASE = ["protocol", "thread", "participant", "chat", "reaction", "note"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p2psync")
    parser.add_argument("--home")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def run(*argv: str) -> int:
    args = _parser().parse_args(list(argv))
    return int(args.fn(args))


def test_export_reconcile_audit_fanout(tmp_path: Path, spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    # Spark in local mode listens on loopback only
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1" == spark.conf.get("spark.driver.host")
    story, world = reconcile_story()
    build_replica(tmp_path / "a.db", story, BASE).close()
    build_replica(tmp_path / "b.db", story, [n for n in BASE if n != "reaction"]).close()
    delete_messages(tmp_path / "b.db", world.tenant, [story.cid("participant")])  # chat loses its role record

    assert run("export", "--store", str(tmp_path / "a.db"), "--out", str(tmp_path / "ea"), "--replica-id", "a",
               "--quiet") == 0
    assert run("export", "--store", str(tmp_path / "b.db"), "--out", str(tmp_path / "eb"), "--quiet") == 0
    out = capsys.readouterr().out
    assert "exported 6 messages (1 protocol definitions) of 1 tenant(s) from replica a" in out
    b_id = json.loads((tmp_path / "eb" / "manifest.json").read_text())["replicaId"]
    assert len(b_id) == 36  # the store's storeId (a UUID) when no --replica-id is given

    exports = [str(tmp_path / "ea"), str(tmp_path / "eb")]
    assert run("pipeline", "reconcile", *exports, "--out", str(tmp_path / "plan"), "--quiet",
               "--master", "local[2]") == 0
    out = capsys.readouterr().out
    assert "2 missing message(s) to pull" in out
    missing = {i.message_cid for i in read_repair_items(tmp_path / "plan", b_id)}
    assert missing == {story.cid("reaction"), story.cid("participant")}

    assert run("pipeline", "audit", *exports, "--out", str(tmp_path / "audit"), "--quiet") == EXIT_VIOLATIONS
    out = capsys.readouterr().out
    assert "1 violation(s)" in out and f"{b_id}: 3 records messages; role 1" in out

    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({world.alice.did: "https://a.example", world.carol.did: "https://c.example"}))
    batch = tmp_path / "batch.txt"
    batch.write_text(f"# the chat only\n{story.cid('chat')}\n")
    assert run("pipeline", "fanout", *exports, "--endpoints", str(endpoints), "--messages", str(batch),
               "--out", str(tmp_path / "fan"), "--quiet", "--no-plot") == 0
    report = json.loads((tmp_path / "fan" / "report.json").read_text())
    assert report["messages"] == 1 and report["batch"] == {"requested": 1, "notFound": []}
    assert report["strategies"]["direct"]["crossNetworkMessages"] == 1  # carol's provider


def test_failures_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="StoreNotFound"):
        run("export", "--store", str(tmp_path / "none.db"), "--out", str(tmp_path / "x"))
    build_replica(tmp_path / "a.db", reconcile_story()[0], ["protocol"]).close()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("mine")
    with pytest.raises(CliError, match="ExportExists"):
        run("export", "--store", str(tmp_path / "a.db"), "--out", str(tmp_path / "busy"), "--overwrite")
    with pytest.raises(CliError, match="ExportNotFound"):
        run("pipeline", "reconcile", str(tmp_path / "busy"), "--out", str(tmp_path / "plan"))
    # inputs and --out are checked before Spark starts
    assert run("export", "--store", str(tmp_path / "a.db"), "--out", str(tmp_path / "e"), "--quiet") == 0
    with pytest.raises(CliError, match="PlanExists"):
        run("pipeline", "reconcile", str(tmp_path / "e"), "--out", str(tmp_path / "busy"))
    with pytest.raises(CliError, match="EndpointMapNotFound"):
        run("pipeline", "fanout", str(tmp_path / "e"), "--endpoints", str(tmp_path / "no.json"),
            "--out", str(tmp_path / "f"))
    with pytest.raises(CliError, match="SparkConfInvalid"):
        run("pipeline", "audit", str(tmp_path / "e"), "--out", str(tmp_path / "o"), "--conf", "novalue")
