"""Conformance kit: run interop scenarios through pipes and compare their replies.

A *pipe* is any process that speaks the p2psync pipe protocol (one JSON request per stdin
line, one JSON reply per stdout line; see ``interop/README.md``). The reference DWN has
one (``node interop/harness.mjs``), so does our engine (``python -m p2psync dwn pipe``),
and any other implementation can plug its own in.

Command line: ``python -m p2psync.conformance run --a CMD [--b CMD] FILES...``.
"""

from p2psync.conformance.compare import check_expectation, compare_replies
from p2psync.conformance.pipe import PipeError, PipeProcess
from p2psync.conformance.runner import (
    DEFAULT_REPLY_TIMEOUT,
    Mismatch,
    ScenarioReport,
    run_scenario,
    run_scenario_single,
)
from p2psync.conformance.scenario import (
    SCENARIO_FORMAT,
    Expectation,
    Scenario,
    ScenarioFormatError,
    Step,
    expand_data_gen,
    load_scenario,
    parse_scenario,
    scenario_files,
)

__all__ = [
    "DEFAULT_REPLY_TIMEOUT",
    "SCENARIO_FORMAT",
    "Expectation",
    "Mismatch",
    "PipeError",
    "PipeProcess",
    "Scenario",
    "ScenarioFormatError",
    "ScenarioReport",
    "Step",
    "check_expectation",
    "compare_replies",
    "expand_data_gen",
    "load_scenario",
    "parse_scenario",
    "run_scenario",
    "run_scenario_single",
    "scenario_files",
]
