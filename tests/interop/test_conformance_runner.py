"""The conformance runner's own logic: scenario parsing, the data generator, reply
comparison, and pipes that disagree, die, hang or write garbage (with a fake pipe script,
so none of this needs Node)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from p2psync.conformance import (
    ScenarioFormatError,
    expand_data_gen,
    parse_scenario,
    run_scenario,
    run_scenario_single,
)
from p2psync.conformance.cli import main as cli_main
from p2psync.conformance.compare import check_expectation, compare_replies
from p2psync.conformance.pipe import pipe_command
from p2psync.conformance.scenario import SCENARIO_FORMAT, Expectation, b64url_encode

FAKE_PIPE = Path(__file__).with_name("fake_pipe.py")


def fake(*options: str) -> list[str]:
    return [sys.executable, str(FAKE_PIPE), *options]


def scenario_doc(steps: list[dict[str, Any]], name: str = "synthetic") -> dict[str, Any]:
    return {
        "format": SCENARIO_FORMAT,
        "name": name,
        "description": "made up for a runner test",
        "personas": {"alice": {"did": "did:key:z6MkAlice", "method": "did:key"}},
        "steps": steps,
    }


def step(op: str = "process", code: int = 202, **extra: Any) -> dict[str, Any]:
    message = {"descriptor": {"interface": "Records", "method": "Write", "n": extra.pop("n", 0)}}
    return {
        "op": op,
        "tenant": "did:key:z6MkAlice",
        "message": message,
        "expect": {"code": code},
        **extra,
    }


# --------------------------------------------------------------------------- data generator


def test_data_gen_is_counter_mode_sha256() -> None:
    assert expand_data_gen(0, 9) == b""
    first = hashlib.sha256(b"5:0").digest()
    second = hashlib.sha256(b"5:1").digest()
    assert expand_data_gen(32, 5) == first
    assert expand_data_gen(33, 5) == first + second[:1]
    assert len(expand_data_gen(262_145, 1)) == 262_145
    assert expand_data_gen(100, 1) != expand_data_gen(100, 2)


def test_data_gen_refuses_absurd_specs() -> None:
    with pytest.raises(ScenarioFormatError):
        expand_data_gen(-1, 0)
    with pytest.raises(ScenarioFormatError):
        expand_data_gen(10**12, 0)


# --------------------------------------------------------------------------- scenario format


def test_parse_builds_requests_with_data() -> None:
    doc = scenario_doc(
        [
            step(data=b64url_encode(b"hello")),
            step(n=1, dataGen={"size": 40, "seed": 3}),
            step(n=2),
            {"raw": "not json", "expect": {"code": 400}, "note": "junk"},
        ]
    )
    sc = parse_scenario(doc)
    assert [s.data for s in sc.steps[:3]] == [b"hello", expand_data_gen(40, 3), None]
    line0 = json.loads(sc.steps[0].request_line())
    assert line0["data"] == "aGVsbG8" and line0["op"] == "process"
    assert "data" not in json.loads(sc.steps[2].request_line())
    assert sc.steps[3].request_line() == b"not json\n"
    assert sc.steps[3].label() == "step 3 (junk)"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(format="other/1"),
        lambda d: d.update(steps={}),
        lambda d: d["steps"][0].update(op="apply"),
        lambda d: d["steps"][0].update(data="aGk", dataGen={"size": 1, "seed": 1}),
        lambda d: d["steps"][0].update(expect={"code": "202"}),
        lambda d: d["steps"][0].pop("tenant"),
        lambda d: d["steps"][0].update(dataGen={"size": 1}),
        lambda d: d["steps"].append({"raw": "two\nlines"}),
    ],
)
def test_parse_rejects_malformed_scenarios(mutate: Any) -> None:
    doc = scenario_doc([step()])
    mutate(doc)
    with pytest.raises(ScenarioFormatError):
        parse_scenario(doc)


# --------------------------------------------------------------------------- comparison


def reply(code: int = 202, **fields: Any) -> dict[str, Any]:
    return {"cid": "bafy1", "status": {"code": code, "detail": "whatever"}, **fields}


def test_identical_replies_agree_and_details_are_ignored() -> None:
    a = reply()
    b = reply()
    b["status"]["detail"] = "a completely different text"
    assert compare_replies(a, b, is_query=False) == []


def test_each_compared_field_is_reported() -> None:
    diffs = compare_replies(reply(202), reply(400), is_query=False)
    assert diffs == ["code: A=202 B=400"]
    assert compare_replies(reply(), reply(cid="bafy2"), is_query=False)[0].startswith("cid:")
    diffs = compare_replies(reply(data_sha256="aa"), reply(), is_query=False)
    assert diffs and diffs[0].startswith("data_sha256:")
    assert compare_replies({"status": {}}, reply(), is_query=False)[0].startswith("malformed")


def test_entries_are_compared_in_order_for_queries_only() -> None:
    e1 = {"recordId": "r1", "cid": "c1"}
    e2 = {"recordId": "r2", "cid": "c2", "initialWriteCid": "i2"}
    a = reply(200, entries=[e1, e2])
    b = reply(200, entries=[e2, e1])
    diffs = compare_replies(a, b, is_query=True)
    assert len(diffs) == 1 and "first difference at entry 0" in diffs[0]
    assert compare_replies(a, b, is_query=False) == []
    assert compare_replies(reply(200, entries=[]), reply(200), is_query=True) == []
    shorter = compare_replies(a, reply(200, entries=[e1]), is_query=True)
    assert "2 vs 1 entries" in shorter[0]
    # an extra field inside an entry is not compared; a differing initialWriteCid is
    assert (
        compare_replies(
            reply(200, entries=[{**e1, "x": 1}]), reply(200, entries=[e1]), is_query=True
        )
        == []
    )
    diff_iw = compare_replies(
        reply(200, entries=[e2]),
        reply(200, entries=[{**e2, "initialWriteCid": "i9"}]),
        is_query=True,
    )
    assert "initialWriteCid" in diff_iw[0]


def test_expectation_checks_code_unless_strict() -> None:
    expect = Expectation(
        code=200, cid="bafy1", data_sha256="ff", entries=({"recordId": "r", "cid": "c"},)
    )
    got = reply(200, entries=[])
    assert check_expectation(expect, got, is_query=True) == []
    strict = check_expectation(expect, got, is_query=True, strict=True)
    assert any("data_sha256" in d for d in strict) and any("entries" in d for d in strict)
    assert check_expectation(expect, reply(401), is_query=True) == ["expected code 200, got 401"]


def test_pipe_command_places_the_store() -> None:
    store = Path("/tmp/x/store")
    assert pipe_command(["p", "dwn", "pipe"], store) == [
        "p",
        "dwn",
        "pipe",
        "--store",
        "/tmp/x/store",
    ]
    assert pipe_command(["p", "--db={store}"], store) == ["p", "--db=/tmp/x/store"]


# --------------------------------------------------------------------------- real processes


def test_two_agreeing_pipes_have_no_mismatch(tmp_path: Path) -> None:
    sc = parse_scenario(scenario_doc([step(n=i) for i in range(5)] + [step("query", 202, n=9)]))
    report = run_scenario(sc, fake("--entries", "2"), fake("--entries", "2"), tmp_path)
    assert report.ok, report.format()
    assert report.compared_steps == 6


def test_different_codes_are_reported_per_step(tmp_path: Path) -> None:
    sc = parse_scenario(scenario_doc([step(n=i, note=f"write {i}") for i in range(3)]))
    report = run_scenario(sc, fake(), fake("--code", "400"), tmp_path)
    compares = report.of_kind("compare")
    assert [m.step for m in compares] == [0, 1, 2]
    assert compares[1].note == "write 1"
    assert compares[0].differences == ["code: A=202 B=400"]
    assert report.of_kind("expect") == []  # A answered what the scenario expects
    text = report.format()
    assert "FAIL synthetic" in text and "step 1 (write 1): compare [A/B]: code: A=202 B=400" in text


def test_different_entries_are_reported(tmp_path: Path) -> None:
    sc = parse_scenario(scenario_doc([step("query", 202)]))
    report = run_scenario(sc, fake("--entries", "2"), fake("--entries", "3"), tmp_path)
    assert len(report.of_kind("compare")) == 1
    assert "2 vs 3 entries" in report.of_kind("compare")[0].differences[0]


def test_expectations_are_checked_against_pipe_a(tmp_path: Path) -> None:
    sc = parse_scenario(scenario_doc([step(code=202), step(code=409, n=1)]))
    report = run_scenario_single(sc, fake(), tmp_path)
    assert [(m.step, m.kind) for m in report.mismatches] == [(1, "expect")]
    assert report.mismatches[0].differences == ["expected code 409, got 202"]


def test_a_dying_pipe_is_reported_once_and_the_other_keeps_going(tmp_path: Path) -> None:
    sc = parse_scenario(scenario_doc([step(n=i, code=400) for i in range(4)]))
    report = run_scenario(
        sc, fake("--code", "400"), fake("--code", "400", "--die-after", "1"), tmp_path
    )
    pipe_errors = report.of_kind("pipe")
    assert len(pipe_errors) == 1 and pipe_errors[0].side == "B" and pipe_errors[0].step == 1
    assert "dying on purpose" in pipe_errors[0].differences[0]
    assert report.compared_steps == 1
    assert report.of_kind("expect") == []  # A was still checked for all 4 steps, and met them


def test_a_hung_pipe_times_out(tmp_path: Path) -> None:
    sc = parse_scenario(scenario_doc([step(n=i) for i in range(3)]))
    report = run_scenario(sc, fake(), fake("--hang-after", "1"), tmp_path, timeout=1.0)
    [error] = report.of_kind("pipe")
    assert error.step == 1 and "no reply within" in error.differences[0]


def test_garbage_and_missing_commands_are_pipe_errors(tmp_path: Path) -> None:
    sc = parse_scenario(scenario_doc([step(n=i) for i in range(2)]))
    report = run_scenario(sc, fake(), fake("--garbage-after", "0"), tmp_path)
    assert "not JSON" in report.of_kind("pipe")[0].differences[0]
    missing = run_scenario_single(sc, [str(tmp_path / "no-such-pipe")], tmp_path)
    assert missing.of_kind("pipe") and "cannot start" in missing.of_kind("pipe")[0].differences[0]


def test_each_pipe_gets_a_fresh_store(tmp_path: Path) -> None:
    sc = parse_scenario(scenario_doc([step()]))
    stores: list[str] = []
    for _ in range(2):
        report = run_scenario(sc, fake("--code", "1"), fake("--code", "2"), tmp_path)
        [mismatch] = report.of_kind("compare")
        for r in (mismatch.reply_a, mismatch.reply_b):
            assert r is not None
            stores.append(str(r["status"]["detail"]).removeprefix("store="))
    assert len(stores) == 4 and len(set(stores)) == 4
    assert all(not Path(s).exists() for s in stores)  # new paths, never pre-created


# --------------------------------------------------------------------------- command line


def write_scenario(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_cli_summary_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = write_scenario(tmp_path / "one.json", scenario_doc([step(), step(n=1)], name="one"))
    two = write_scenario(tmp_path / "two.json", scenario_doc([step(n=2)], name="two"))
    a = " ".join([sys.executable, str(FAKE_PIPE)])
    assert cli_main(["run", "--a", a, "--b", a, "-j", "2", str(one), str(two)]) == 0
    out = capsys.readouterr().out
    assert "PASS one" in out and out.strip().endswith("2 scenarios, 3 steps, 0 mismatches")

    assert cli_main(["run", "--a", a, "--b", a + " --code 500", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    # every step disagrees on the code, and A (202) meets the expectations
    assert lines[-1] == "2 scenarios, 3 steps, 3 mismatches"

    assert cli_main(["run", "--a", a + " --code 409", str(one)]) == 1
    assert capsys.readouterr().out.strip().endswith("1 scenarios, 2 steps, 2 mismatches")

    bad = tmp_path / "bad" / "bad.json"
    bad.parent.mkdir()
    bad.write_text("{}")
    assert cli_main(["run", "--a", a, str(bad)]) == 2
    assert "bad scenario" in capsys.readouterr().err
