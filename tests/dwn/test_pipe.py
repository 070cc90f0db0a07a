"""The interop pipe: one reply per line, coded errors for malformed input, never a crash."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import b64url_encode, message_cid
from p2psync.dwn.pipe import run_pipe
from p2psync.dwn.records import ALL_RECORDS_FILTER, create_records_query, create_records_read
from p2psync.dwn.records_write import RecordsWrite


def _run(tmp_path: Path, lines: list[str]) -> list[dict[str, object]]:
    out = io.StringIO()
    assert run_pipe(str(tmp_path / "pipe.db"), io.StringIO("".join(line + "\n" for line in lines)), out) == 0
    return [json.loads(x) for x in out.getvalue().splitlines()]


def test_malformed_lines_get_400_and_the_pipe_continues(tmp_path: Path, alice: Identity) -> None:
    w = RecordsWrite.create(signer=alice, data=b"ok", data_format="text/plain")
    good = json.dumps({"op": "process", "tenant": alice.did, "message": w.message, "data": b64url_encode(b"ok")})
    lines = [
        "{not json",
        "[1, 2]",
        "",
        json.dumps({"op": "explode", "tenant": alice.did, "message": {}}),
        json.dumps({"op": "process", "tenant": 7, "message": w.message}),
        json.dumps({"op": "process", "tenant": alice.did, "message": w.message, "data": "a=="}),
        json.dumps({"op": "process", "tenant": alice.did, "message": "nope"}),
        json.dumps({"op": "process", "tenant": alice.did, "message": {"descriptor": {"interface": "Records"}}}),
        good,
    ]
    replies = _run(tmp_path, lines)
    assert len(replies) == len(lines)
    assert [r["status"]["code"] for r in replies[:-1]] == [400] * (len(lines) - 1)  # type: ignore[index]
    assert replies[-1]["status"]["code"] == 202  # type: ignore[index]
    assert replies[-1]["cid"] == message_cid(w.message)


def test_query_and_read_replies(tmp_path: Path, alice: Identity) -> None:
    data = b"x" * 40_000
    w = RecordsWrite.create(signer=alice, data=data, data_format="application/octet-stream")
    lines = [
        json.dumps({"op": "process", "tenant": alice.did, "message": w.message, "data": b64url_encode(data)}),
        json.dumps({"op": "query", "tenant": alice.did,
                    "message": create_records_query(signer=alice, filter=ALL_RECORDS_FILTER)}),
        json.dumps({"op": "process", "tenant": alice.did,
                    "message": create_records_read(signer=alice, filter={"recordId": w.record_id})}),
    ]
    write, query, read = _run(tmp_path, lines)
    assert write["status"]["code"] == 202  # type: ignore[index]
    assert query["entries"] == [{"recordId": w.record_id, "cid": message_cid(w.message)}]
    import hashlib

    assert read["data_sha256"] == hashlib.sha256(data).hexdigest()


def test_pipe_as_a_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "p2psync", "dwn", "pipe", "--store", str(tmp_path / "p.db")],
        input="garbage\n", capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0
    reply = json.loads(proc.stdout)
    assert reply["status"]["code"] == 400 and reply["cid"] is None
