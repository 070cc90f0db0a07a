"""``python -m p2psync.conformance``: run scenario files through pipes.

    python -m p2psync.conformance run --a "node interop/harness.mjs" \\
        --b "python -m p2psync dwn pipe" interop/scenarios/*.json
    python -m p2psync.conformance run --a "python -m p2psync dwn pipe" interop/scenarios

With ``--b`` the two pipes are compared step by step (and A's codes checked against each
step's ``expect``); without it only the expectations are checked (``--strict``: every
recorded field, not just the code). Prints one line per scenario, the mismatches of failing
ones, and ``N scenarios, M steps, K mismatches``. Exit status 1 when anything mismatched.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from p2psync.conformance.authored import write_scenarios
from p2psync.conformance.runner import (
    DEFAULT_REPLY_TIMEOUT,
    ScenarioReport,
    run_scenario,
    run_scenario_single,
)
from p2psync.conformance.scenario import ScenarioFormatError, load_scenario, scenario_files

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m p2psync.conformance", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios through one or two pipes")
    run.add_argument(
        "--a",
        required=True,
        metavar="CMD",
        help="pipe A command (the reference side when comparing)",
    )
    run.add_argument(
        "--b", metavar="CMD", help="pipe B command; omit to check A against the expectations only"
    )
    run.add_argument(
        "--strict",
        action="store_true",
        help="check every recorded expectation field, not just codes",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_REPLY_TIMEOUT,
        help="seconds per reply (default %(default)s)",
    )
    run.add_argument(
        "--jobs", "-j", type=int, default=1, help="scenarios run concurrently (default 1)"
    )
    run.add_argument(
        "--workdir",
        help="where pipe stores go (default: a temporary directory, removed afterwards)",
    )
    run.add_argument(
        "--keep", action="store_true", help="keep the work directory (stores and pipe stderr logs)"
    )
    run.add_argument(
        "--all-mismatches",
        action="store_true",
        help="print every mismatch, not the first 10 per scenario",
    )
    run.add_argument("scenarios", nargs="+", help="scenario files or directories of them")
    author = sub.add_parser("author", help="write the scenarios p2psync itself authors (reverse direction)")
    author.add_argument("--out", default="interop/scenarios", help="directory (default %(default)s)")
    return parser


def _run_one(path: Path, args: argparse.Namespace, workdir: Path) -> ScenarioReport:
    scenario = load_scenario(path)
    a = shlex.split(args.a)
    if args.b:
        return run_scenario(
            scenario, a, shlex.split(args.b), workdir, timeout=args.timeout, strict=args.strict
        )
    return run_scenario_single(scenario, a, workdir, timeout=args.timeout, strict=args.strict)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "author":
        for path in write_scenarios(Path(args.out)):
            print(f"wrote {path}")
        return EXIT_OK
    files = scenario_files(args.scenarios)
    if not files:
        print("no scenario files given", file=sys.stderr)
        return EXIT_USAGE
    for f in files:
        # validate everything before starting any process: a typo fails fast
        try:
            load_scenario(f)
        except (OSError, ScenarioFormatError) as exc:
            print(f"bad scenario: {exc}", file=sys.stderr)
            return EXIT_USAGE

    workdir = (
        Path(args.workdir)
        if args.workdir
        else Path(tempfile.mkdtemp(prefix="p2psync-conformance-"))
    )
    total_steps = 0
    total_mismatches = 0
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(_run_one, f, args, workdir) for f in files]
            for future in futures:
                report = future.result()
                total_steps += report.steps
                total_mismatches += len(report.mismatches)
                print(report.format(limit=None if args.all_mismatches else 10), flush=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"{len(files)} scenarios, {total_steps} steps, {total_mismatches} mismatches")
    if args.keep or args.workdir:
        print(f"stores and pipe logs kept in {workdir}")
    return EXIT_MISMATCH if total_mismatches else EXIT_OK
