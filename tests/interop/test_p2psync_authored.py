"""The reverse direction: scenarios whose every message p2psync authored.

The committed files (`interop/scenarios/p2psync-authored-*.json`) run through the reference
and our engine with the rest of the scenarios (test_reference_scenarios.py). Here: they are
exactly what the current authoring code produces, so that check is about today's code.
"""

from __future__ import annotations

from pathlib import Path

from p2psync.conformance.authored import BUILDERS, write_scenarios

SCENARIOS = Path(__file__).resolve().parents[2] / "interop" / "scenarios"


def test_committed_authored_scenarios_are_current(tmp_path: Path) -> None:
    written = write_scenarios(tmp_path)
    assert len(written) == len(BUILDERS)
    for path in written:
        committed = SCENARIOS / path.name
        assert committed.exists(), f"{path.name} missing: run `python -m p2psync.conformance author`"
        assert committed.read_bytes() == path.read_bytes(), (
            f"{path.name} is stale: regenerate with `python -m p2psync.conformance author`"
        )
