"""The interop pipe: one reply per line, coded errors for malformed input, never a crash; requests
that share a commit answer as they would alone, and no reply leaves before its commit."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import b64url_encode, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.pipe import PIPE_BATCH_MAX, PipeSession, _handle_batch, parse_json_line, run_pipe
from p2psync.dwn.records import ALL_RECORDS_FILTER, create_records_query, create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store


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


@pytest.mark.parametrize("line", ['{"a": 9007199254740993, "b": [1, -2.5]}', "\ufeff{}", "{not json", "", "[1] x"])
def test_a_line_parses_as_json_loads_with_javascript_integers(line: str) -> None:
    def js_int(text: str) -> int | float:
        value = int(text)
        return value if abs(value) <= 2**53 - 1 else float(value)

    try:
        expected: object = json.loads(line, parse_int=js_int)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: object = parse_json_line(line)
    except ValueError as exc:
        got = str(exc)
    assert got == expected and type(got) is type(expected)


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


def test_the_pipe_process_starts_without_the_rest_of_the_cli(tmp_path: Path) -> None:
    """``python -m p2psync dwn pipe --store FILE`` imports the engine, not every command
    (issue #17); its replies are the CLI's."""
    for argv in (["--store", str(tmp_path / "p.db")], [f"--store={tmp_path / 'q.db'}"]):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "p2psync", "dwn", "pipe", *argv],
            input="garbage\n", capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode == 0
        assert json.loads(proc.stdout)["status"]["code"] == 400
        imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
        assert "p2psync.dwn.pipe" in imported
        assert not {m for m in imported if m == "p2psync.cli" or m.startswith("p2psync.cli.")}


def test_only_a_plain_pipe_command_skips_the_cli() -> None:
    from p2psync.__main__ import _pipe_store

    assert _pipe_store(["dwn", "pipe", "--store", "s.db"]) == "s.db"
    assert _pipe_store(["dwn", "pipe", "--store=s.db"]) == "s.db"
    # help, usage errors and anything else go through the whole CLI's parser
    for argv in (["dwn", "pipe"], ["dwn", "pipe", "--store"], ["dwn", "pipe", "--help"],
                 ["dwn", "pipe", "--store", "-h"], ["dwn", "pipe", "--store", "s.db", "x"],
                 ["--home", "h", "dwn", "pipe", "--store", "s.db"], ["dwn", "--store", "s.db"]):
        assert _pipe_store(argv) is None


def _write_lines(alice: Identity, n: int) -> list[str]:
    lines = []
    for i in range(n):
        data = f"record {i}".encode()
        w = RecordsWrite.create(signer=alice, data=data, data_format="text/plain")
        lines.append(json.dumps({"op": "process", "tenant": alice.did, "message": w.message,
                                 "data": b64url_encode(data)}))
    return lines


def test_a_batch_answers_as_its_requests_one_by_one(tmp_path: Path, alice: Identity) -> None:
    writes = _write_lines(alice, 5)
    query = json.dumps({"op": "query", "tenant": alice.did,
                        "message": create_records_query(signer=alice, filter=ALL_RECORDS_FILTER)})
    # A repeat (409), a refusal in the middle (its savepoint only), a query seeing the writes before it.
    lines = [*writes[:3], writes[1], "{not json", writes[3], query, writes[4], query]
    one_by_one = PipeSession(Dwn(Store(tmp_path / "alone.db")))
    alone = [one_by_one.handle_line(line) for line in lines]
    one_by_one.dwn.close()
    batched = PipeSession(Dwn(Store(tmp_path / "batched.db")))
    commits: list[int] = []
    batched.dwn.store.conn.set_commit_hook(lambda: commits.append(1) or False)
    together = _handle_batch(batched, lines)
    batched.dwn.close()
    assert together == alone
    assert [r["status"]["code"] for r in together] == [202, 202, 202, 409, 400, 202, 200, 202, 200]
    assert len(together[8]["entries"]) == 5
    assert len(commits) == 1


def test_a_batch_that_cannot_lock_the_store_runs_its_requests_alone(tmp_path: Path, alice: Identity) -> None:
    lines = _write_lines(alice, 3)
    session = PipeSession(Dwn(Store(tmp_path / "s.db", busy_timeout=0.05)))
    other = apsw.Connection(str(tmp_path / "s.db"))
    other.execute("BEGIN IMMEDIATE")
    busy = _handle_batch(session, lines)
    assert [r["status"]["code"] for r in busy] == [503] * 3
    other.execute("ROLLBACK")
    assert [r["status"]["code"] for r in _handle_batch(session, lines)] == [202] * 3
    session.dwn.close()


class _CheckingOut(io.StringIO):
    """Output that checks, at each write, that every message replied to is committed."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def write(self, text: str) -> int:
        n = super().write(text)
        replied = self.getvalue().count('"code":202')
        reader = apsw.Connection(str(self.path))
        (committed,) = reader.execute("SELECT count(*) FROM archive").fetchone()
        reader.close()
        assert committed == replied
        return n


def test_replies_leave_after_their_commit(tmp_path: Path, alice: Identity) -> None:
    lines = _write_lines(alice, PIPE_BATCH_MAX + 50)  # more than one batch
    out = _CheckingOut(tmp_path / "pipe.db")
    assert run_pipe(str(tmp_path / "pipe.db"), io.StringIO("".join(x + "\n" for x in lines)), out) == 0
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r["status"]["code"] for r in replies] == [202] * len(lines)


def test_a_failing_input_ends_the_pipe_after_the_replies_before_it(tmp_path: Path, alice: Identity) -> None:
    good = _write_lines(alice, 2)

    def lines() -> Iterator[str]:
        yield from (x + "\n" for x in good)
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    out = io.StringIO()
    with pytest.raises(UnicodeDecodeError):
        run_pipe(str(tmp_path / "pipe.db"), lines(), out)  # type: ignore[arg-type]
    assert [json.loads(x)["status"]["code"] for x in out.getvalue().splitlines()] == [202, 202]


def test_the_pipe_stores_what_the_engine_alone_stores(tmp_path: Path, alice: Identity) -> None:
    # The pipe hands the engine its request's base64url text for encodedData (memo.data_text)
    # instead of encoding the data again: the rows must be the engine's own, byte for byte.
    lines = _write_lines(alice, 3)
    _run(tmp_path, lines)
    alone = Dwn(Store(tmp_path / "alone.db"))
    for line in lines:
        request = json.loads(line)
        data = base64.urlsafe_b64decode(request["data"] + "=" * (-len(request["data"]) % 4))
        assert alone.process_message(alice.did, request["message"], data).code == 202

    def rows(store: Store) -> list[tuple[object, ...]]:
        return store.conn.execute("SELECT cid, body, indexes, wire FROM messages ORDER BY cid").fetchall()

    piped = Store(tmp_path / "pipe.db")
    assert rows(piped) == rows(alone.store)
    assert all(json.loads(body)["encodedData"] == json.loads(line)["data"]
               for (_, body, _, _), line in zip(rows(piped), sorted(lines, key=lambda x: message_cid(
                   json.loads(x)["message"])), strict=True))
    piped.close()
    alone.close()
