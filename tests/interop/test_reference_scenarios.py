"""The committed interop scenarios against the reference DWN and against our engine.

1. Every scenario run through the reference harness alone meets every recorded expectation
   (codes, CIDs, data hashes, query entries): the files and the harness agree.
2. Every scenario run through our engine's pipe and the reference side by side: no mismatch.
3. Two reference harnesses side by side agree (the comparison is not vacuous: see
   test_conformance_runner.py for the disagreeing cases).

Scenarios run in a small thread pool (each in its own pipe processes), started for all the
selected tests at once, so the whole set takes about a minute per pass.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from p2psync.conformance import (
    ScenarioReport,
    expand_data_gen,
    load_scenario,
    run_scenario,
    run_scenario_single,
    scenario_files,
)

REPO = Path(__file__).resolve().parents[2]
INTEROP = REPO / "interop"
SCENARIO_DIR = INTEROP / "scenarios"
REFERENCE_PACKAGE = INTEROP / "node_modules" / "@tbd54566975" / "dwn-sdk-js"
HARNESS = ["node", str(INTEROP / "harness.mjs")]
ENGINE = [sys.executable, "-m", "p2psync", "dwn", "pipe"]
SCENARIOS = scenario_files([SCENARIO_DIR])

# Pipes wait on each other a good part of the time (one request at a time), so a pool a bit
# larger than the core count keeps the machine busy.
WORKERS = (os.cpu_count() or 2) + 1

# The committed set must stay small enough for the repository (see interop/README.md).
MAX_SCENARIO_BYTES = 3 * 1024 * 1024

needs_reference = pytest.mark.skipif(
    not REFERENCE_PACKAGE.is_dir() or shutil.which("node") is None,
    reason="the reference DWN is not installed: run `make test` (or `cd interop && npm ci`)",
)


class ScenarioBatch:
    """Runs scenarios on a thread pool; each test waits for its own scenario's report."""

    def __init__(self, run: Callable[[Path, Path], ScenarioReport], workdir: Path) -> None:
        self._run = run
        self._workdir = workdir
        self._pool = ThreadPoolExecutor(max_workers=WORKERS)
        self._futures: dict[Path, Future[ScenarioReport]] = {}

    def prefetch(self, paths: list[Path]) -> None:
        for path in paths:
            if path not in self._futures:
                self._futures[path] = self._pool.submit(self._run, path, self._workdir)

    def report(self, path: Path) -> ScenarioReport:
        self.prefetch([path])
        return self._futures[path].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _selected(request: pytest.FixtureRequest, test_name: str) -> list[Path]:
    """Scenario paths of the selected parametrizations of ``test_name`` (honours -k)."""
    paths: list[Path] = []
    for item in request.session.items:
        if getattr(item, "originalname", None) == test_name:
            callspec = getattr(item, "callspec", None)
            if callspec is not None and "scenario_path" in callspec.params:
                paths.append(callspec.params["scenario_path"])
    return paths


@pytest.fixture(scope="session")
def reference_alone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ScenarioBatch]:
    batch = ScenarioBatch(
        lambda path, workdir: run_scenario_single(path, HARNESS, workdir, strict=True),
        tmp_path_factory.mktemp("reference-alone"),
    )
    batch.prefetch(_selected(request, "test_reference_meets_recorded_expectations"))
    yield batch
    batch.close()


@pytest.fixture(scope="session")
def engine_vs_reference(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ScenarioBatch]:
    # the reference is pipe A: its replies are also checked against the recorded expectations
    batch = ScenarioBatch(
        lambda path, workdir: run_scenario(path, HARNESS, ENGINE, workdir, strict=True),
        tmp_path_factory.mktemp("engine-vs-reference"),
    )
    batch.prefetch(_selected(request, "test_engine_matches_reference"))
    yield batch
    batch.close()


# --------------------------------------------------------------------------- the committed files


def test_committed_scenarios_are_well_formed() -> None:
    assert len(SCENARIOS) >= 30, "the committed scenario set is missing"
    total_bytes = sum(p.stat().st_size for p in SCENARIOS)
    assert total_bytes < MAX_SCENARIO_BYTES, f"scenarios take {total_bytes} bytes"
    names: set[str] = set()
    methods: set[str] = set()
    steps = 0
    for path in SCENARIOS:
        sc = load_scenario(path)
        assert sc.name == path.stem, f"{path}: name and file name differ"
        assert sc.name not in names
        names.add(sc.name)
        assert sc.description and sc.steps
        for st in sc.steps:
            assert st.expect is not None, f"{path}: {st.label()} has no expect"
            assert st.note, f"{path}: step {st.index} has no note"
        methods.update(str(p.get("method")) for p in sc.personas.values())
        steps += len(sc.steps)
    assert {"did:key", "did:jwk"} <= methods
    assert steps >= 500


@pytest.mark.interop
@needs_reference
def test_node_data_generator_matches_python() -> None:
    script = (
        "import { expandDataGen } from './lib/datagen.mjs';"
        "import { createHash } from 'node:crypto';"
        "for (const [size, seed] of [[0, 1], [31, 2], [33, 3], [262145, 4]]) {"
        "  const b = expandDataGen({ size, seed });"
        "  console.log(createHash('sha256').update(b).digest('hex'));"
        "}"
    )
    out = subprocess.run(
        ["node", "--input-type=module", "-e", script],
        cwd=INTEROP,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    expected = [
        hashlib.sha256(expand_data_gen(size, seed)).hexdigest()
        for size, seed in [(0, 1), (31, 2), (33, 3), (262_145, 4)]
    ]
    assert out == expected


# --------------------------------------------------------------------------- the reference alone


@pytest.mark.interop
@needs_reference
@pytest.mark.parametrize("scenario_path", SCENARIOS, ids=lambda p: p.stem)
def test_reference_meets_recorded_expectations(
    scenario_path: Path, reference_alone: ScenarioBatch
) -> None:
    report = reference_alone.report(scenario_path)
    assert report.ok, report.format(limit=None)


@pytest.mark.interop
@needs_reference
def test_two_reference_pipes_agree(tmp_path: Path) -> None:
    path = SCENARIO_DIR / "records-query-pagination.json"
    report = run_scenario(path, HARNESS, HARNESS, tmp_path, strict=True)
    assert report.ok, report.format(limit=None)
    assert report.compared_steps == report.steps


@pytest.mark.interop
@needs_reference
def test_reference_against_a_wrong_pipe_mismatches(tmp_path: Path) -> None:
    fake = [sys.executable, str(Path(__file__).with_name("fake_pipe.py")), "--code", "202"]
    path = SCENARIO_DIR / "records-delete.json"
    report = run_scenario(path, HARNESS, fake, tmp_path)
    scenario = load_scenario(path)
    code_differs = {
        m.step
        for m in report.of_kind("compare")
        if any(d.startswith("code:") for d in m.differences)
    }
    # the fake says 202 to everything: exactly the steps the reference answers otherwise differ
    not_202 = {s.index for s in scenario.steps if s.expect is not None and s.expect.code != 202}
    assert not_202 and code_differs == not_202
    assert report.of_kind("expect") == []


# --------------------------------------------------------------------------- our engine


@pytest.mark.interop
@needs_reference
@pytest.mark.parametrize("scenario_path", SCENARIOS, ids=lambda p: p.stem)
def test_engine_matches_reference(scenario_path: Path, engine_vs_reference: ScenarioBatch) -> None:
    report = engine_vs_reference.report(scenario_path)
    assert report.ok, report.format(limit=None)
