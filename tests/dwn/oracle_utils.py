"""Run ``interop/oracle_utils.mjs`` (the reference DWN's answers) from the tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, TypeVar

import pytest

INTEROP_DIR = Path(__file__).resolve().parents[2] / "interop"
NODE_MODULES = INTEROP_DIR / "node_modules"
ORACLE_TIMEOUT_SECONDS = 300  # the 50 MiB dataCid takes ~2 s; this only catches a hang

_Test = TypeVar("_Test")

_skip_without_reference = pytest.mark.skipif(
    not NODE_MODULES.is_dir(),
    reason="interop/node_modules missing: run `make test` (npm ci in interop/) first",
)


def needs_reference(test: _Test) -> _Test:
    """Mark a test that asks the reference DWN through Node (``interop``), and skip it when
    the reference is not installed.
    """
    marked: _Test = pytest.mark.interop(_skip_without_reference(test))  # type: ignore[assignment]
    return marked


def run_oracle(mode: str, request: Any) -> Any:
    """Send ``request`` as JSON to the oracle in ``mode`` and return its JSON answer."""
    done = subprocess.run(
        ["node", "oracle_utils.mjs", mode],
        cwd=INTEROP_DIR,
        input=json.dumps(request).encode("ascii"),  # lone surrogates travel as \\udxxx
        capture_output=True,
        timeout=ORACLE_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"oracle {mode} failed: {done.stderr.decode(errors='replace')}")
    return json.loads(done.stdout)


def run_ed25519_oracle(mode: str, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reference's Ed25519 verdicts (``interop/ed25519_oracle.mjs``), one per request, in
    one Node process.
    """
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run(
        ["node", "ed25519_oracle.mjs", mode],
        cwd=INTEROP_DIR,
        input=lines.encode("ascii"),
        capture_output=True,
        timeout=ORACLE_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"ed25519 oracle {mode} failed: {done.stderr.decode(errors='replace')}")
    answers = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert len(answers) == len(requests), "the oracle must answer every request"
    return answers
