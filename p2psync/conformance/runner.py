"""Runs scenarios through one or two pipes and reports every disagreement.

Two pipes: every step goes to both (A then B, then both replies are read, so the two
processes work concurrently); replies are compared field by field and A's code is checked
against the step's ``expect``. One pipe: only the expectations are checked.

A pipe that dies or stops answering is reported once (kind ``pipe``) and dropped; the run
continues with the other pipe so its expectations are still checked.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2psync.conformance.compare import check_expectation, compare_replies
from p2psync.conformance.pipe import PipeError, PipeProcess
from p2psync.conformance.scenario import Scenario, Step, load_scenario

# Seconds a pipe may take to answer one request. The reference needs ~10 ms a message and
# ~1 s to start; 1 MiB of data takes well under a second. Generous, yet a hang ends the run.
DEFAULT_REPLY_TIMEOUT = 60.0

# Seconds a pipe gets to exit after its stdin closes before it is killed (the reference
# closes its LevelDB stores, ~50 ms); a pipe that already failed gets less.
_PIPE_EXIT_GRACE = 10.0
_FAILED_PIPE_GRACE = 1.0

# How many characters of each reply a mismatch report quotes.
_REPLY_EXCERPT = 600

KIND_COMPARE = "compare"
KIND_EXPECT = "expect"
KIND_PIPE = "pipe"


@dataclass
class Mismatch:
    """One disagreement at one step.

    ``kind``: ``compare`` (A and B replied differently), ``expect`` (a reply differs from
    the step's recorded expectation; ``side`` says whose), or ``pipe`` (a pipe failed).
    """

    step: int
    note: str | None
    kind: str
    side: str
    differences: list[str]
    reply_a: Mapping[str, Any] | None = None
    reply_b: Mapping[str, Any] | None = None

    def format(self) -> str:
        """A multi-line, human-readable description."""
        label = f"step {self.step}" + (f" ({self.note})" if self.note else "")
        lines = [f"{label}: {self.kind} [{self.side}]: " + "; ".join(self.differences)]
        for side, reply in (("A", self.reply_a), ("B", self.reply_b)):
            if reply is not None:
                text = json.dumps(reply, separators=(",", ":"))
                if len(text) > _REPLY_EXCERPT:
                    text = text[:_REPLY_EXCERPT] + "..."
                lines.append(f"    {side}: {text}")
        return "\n".join(lines)


@dataclass
class ScenarioReport:
    """The outcome of running one scenario."""

    name: str
    steps: int
    compared_steps: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    elapsed: float = 0.0
    path: Path | None = None

    @property
    def ok(self) -> bool:
        """True when nothing disagreed."""
        return not self.mismatches

    def of_kind(self, kind: str) -> list[Mismatch]:
        """The mismatches of one kind (``compare``, ``expect``, ``pipe``)."""
        return [m for m in self.mismatches if m.kind == kind]

    def on_side(self, side: str) -> list[Mismatch]:
        """The mismatches that concern pipe ``side`` ("A" or "B"; comparisons concern both)."""
        return [m for m in self.mismatches if m.side in (side, "A/B")]

    def summary(self) -> str:
        """One line: verdict, name, counts, time."""
        verdict = "PASS" if self.ok else "FAIL"
        return (
            f"{verdict} {self.name}: {self.steps} steps, {len(self.mismatches)} mismatches"
            f" ({self.elapsed:.1f} s)"
        )

    def format(self, limit: int | None = 10) -> str:
        """Summary plus the first ``limit`` mismatches (all when None)."""
        lines = [self.summary()]
        shown = self.mismatches if limit is None else self.mismatches[:limit]
        lines.extend("  " + m.format().replace("\n", "\n  ") for m in shown)
        if limit is not None and len(self.mismatches) > limit:
            lines.append(f"  ... {len(self.mismatches) - limit} more")
        return "\n".join(lines)


class _Side:
    """A pipe under test plus whether it is still usable."""

    def __init__(self, label: str, argv: Sequence[str], workdir: Path, scenario: str) -> None:
        self.label = label
        self.pipe: PipeProcess | None = None
        self.error: str | None = None
        home = Path(tempfile.mkdtemp(prefix=f"{scenario}-{label}-", dir=workdir))
        try:
            # the store path does not exist yet: a new store, whatever its on-disk form
            self.pipe = PipeProcess(argv, store=home / "store", stderr_path=home / "stderr.log")
        except PipeError as exc:
            self.error = str(exc)

    @property
    def alive(self) -> bool:
        return self.pipe is not None and self.error is None

    def close(self) -> None:
        if self.pipe is not None:
            # a pipe that already failed may be hung: do not wait long before killing it
            self.pipe.close(timeout=_FAILED_PIPE_GRACE if self.error else _PIPE_EXIT_GRACE)


def _as_scenario(scenario: Scenario | str | Path) -> Scenario:
    return scenario if isinstance(scenario, Scenario) else load_scenario(scenario)


def _run(
    scenario: Scenario,
    argvs: Sequence[Sequence[str]],
    workdir: Path,
    timeout: float,
    strict: bool,
) -> ScenarioReport:
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    report = ScenarioReport(name=scenario.name, steps=len(scenario.steps), path=scenario.path)
    sides = [
        _Side(label, argv, workdir, scenario.name) for label, argv in zip("AB", argvs, strict=False)
    ]
    for side in sides:
        if side.error is not None:
            report.mismatches.append(Mismatch(0, None, KIND_PIPE, side.label, [side.error]))
    try:
        for step in scenario.steps:
            replies = _exchange(step, sides, timeout, report)
            if not any(s.alive for s in sides):
                break
            _judge(step, sides, replies, strict, report)
    finally:
        for side in sides:
            side.close()
    report.elapsed = time.monotonic() - started
    return report


def _exchange(
    step: Step, sides: list[_Side], timeout: float, report: ScenarioReport
) -> dict[str, dict[str, Any]]:
    """Sends the step to every live pipe, then collects the replies."""
    line = step.request_line()
    live = [s for s in sides if s.alive]
    sent: list[_Side] = []
    for side in live:
        assert side.pipe is not None
        try:
            side.pipe.send(line, timeout)
            sent.append(side)
        except PipeError as exc:
            _kill_side(side, step, str(exc), report)
    replies: dict[str, dict[str, Any]] = {}
    for side in sent:
        assert side.pipe is not None
        try:
            replies[side.label] = side.pipe.receive(timeout)
        except PipeError as exc:
            _kill_side(side, step, str(exc), report)
    return replies


def _kill_side(side: _Side, step: Step, error: str, report: ScenarioReport) -> None:
    side.error = error
    report.mismatches.append(
        Mismatch(step.index, step.note, KIND_PIPE, side.label, [f"pipe dropped: {error}"])
    )


def _judge(
    step: Step,
    sides: list[_Side],
    replies: Mapping[str, Mapping[str, Any]],
    strict: bool,
    report: ScenarioReport,
) -> None:
    a, b = replies.get("A"), replies.get("B")
    if len(sides) == 2 and a is not None and b is not None:
        report.compared_steps += 1
        diffs = compare_replies(a, b, is_query=step.is_query)
        if diffs:
            report.mismatches.append(
                Mismatch(step.index, step.note, KIND_COMPARE, "A/B", diffs, a, b)
            )
    # The expectation is checked against A, the side that is meant to be the reference.
    if step.expect is not None and a is not None:
        diffs = check_expectation(step.expect, a, is_query=step.is_query, strict=strict)
        if diffs:
            report.mismatches.append(
                Mismatch(step.index, step.note, KIND_EXPECT, "A", diffs, a, None)
            )


def run_scenario(
    scenario: Scenario | str | Path,
    pipe_a_argv: Sequence[str],
    pipe_b_argv: Sequence[str],
    workdir: str | Path,
    *,
    timeout: float = DEFAULT_REPLY_TIMEOUT,
    strict: bool = False,
) -> ScenarioReport:
    """Runs ``scenario`` through two fresh pipes and compares them step by step.

    Each pipe command gets a fresh store under ``workdir`` (``--store PATH`` is appended, or
    ``{store}`` in the command is replaced). Per step, status code, ``cid``,
    ``data_sha256`` and, for queries, the entries are compared; A's reply is also checked
    against the step's ``expect`` (its code; with ``strict`` every recorded field).
    """
    return _run(_as_scenario(scenario), [pipe_a_argv, pipe_b_argv], Path(workdir), timeout, strict)


def run_scenario_single(
    scenario: Scenario | str | Path,
    pipe_argv: Sequence[str],
    workdir: str | Path,
    *,
    timeout: float = DEFAULT_REPLY_TIMEOUT,
    strict: bool = False,
) -> ScenarioReport:
    """Runs ``scenario`` through one fresh pipe and checks each step's ``expect``.

    Only the codes are checked unless ``strict``; then the recorded ``cid``,
    ``data_sha256`` and entries must match too.
    """
    return _run(_as_scenario(scenario), [pipe_argv], Path(workdir), timeout, strict)
