"""The simulator's command line: ``p2psync sim`` (and ``python -m p2psync.sim``).

    --peers N --seeds K [--seed-start S]       K seeds from S (default 0)
    --seed S [--trace]                         one seed, every event printed with --trace
    --topology line|star|ring|mesh|random      default random (a random connected graph)
    --steps N                                  steps of writers and faults before healing
    --ops full|basic                           the full mix (default), or creates and updates only
    --faults normal|heavy                      heavy: ten times the crashes, drops, partitions
    --scopes global|mixed                      mixed: some peers reached only through scoped links

A failing seed prints its findings and the command that replays it. The last line is always
``sim: K seeds, C converged, D diverged, L lost, S stuck``; the exit status is 0 only when
D, L and S are all 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from p2psync.sim.simulation import FAULT_MIXES, SCOPE_MIXES, SeedResult, SimConfig, run_seed
from p2psync.sim.world import TOPOLOGIES
from p2psync.sim.writers import OPS

__all__ = ["add_arguments", "main", "parser", "run", "summary_line"]

DESCRIPTION = "Seeded multi-peer replication simulator."


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="p2psync sim", description=DESCRIPTION)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``p2psync sim`` (the CLI's subcommand and ``python -m p2psync.sim``)."""
    p.add_argument("--peers", type=int, default=4, help="peers (devices of one tenant), 2 to 6")
    p.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    p.add_argument("--seed-start", type=int, default=0, help="the first seed")
    p.add_argument("--seed", type=int, default=None, help="run this one seed")
    p.add_argument("--trace", action="store_true", help="print every event (with --seed)")
    p.add_argument("--topology", choices=TOPOLOGIES, default="random")
    p.add_argument("--steps", type=int, default=SimConfig.steps, help="steps of writers and faults")
    p.add_argument("--ops", choices=OPS, default="full", help="full: every op; basic: creates, updates")
    p.add_argument("--faults", choices=FAULT_MIXES, default="normal",
                   help="heavy: crashes, drops and partitions ten times as often")
    p.add_argument("--scopes", choices=SCOPE_MIXES, default="global",
                   help="mixed: some peers sync only a protocol or subset scope of the chat protocol")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")


def summary_line(results: Sequence[SeedResult]) -> str:
    count = {cls: sum(1 for r in results if r.outcome == cls) for cls in ("converged", "diverged", "lost", "stuck")}
    return (f"sim: {len(results)} seeds, {count['converged']} converged, {count['diverged']} diverged,"
            f" {count['lost']} lost, {count['stuck']} stuck")


def report(result: SeedResult, out: TextIO) -> None:
    """A failing seed: its findings (the first few) and its replay command."""
    extra = " (replicas also differ from canonical)" if result.canonical_divergence else ""
    print(f"seed {result.seed}: {result.outcome}{extra}", file=out)
    for finding in result.findings[:6]:
        print(f"  {finding}", file=out)
    if len(result.findings) > 6:
        print(f"  … {len(result.findings) - 6} more", file=out)
    print(f"  replay: {result.config.replay(result.seed)}", file=out)


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the seeds ``args`` name; 0 when every one converged, 1 otherwise, 2 for bad options."""
    out = sys.stdout
    if not 2 <= args.peers <= 6:
        print("p2psync sim: --peers must be 2 to 6", file=sys.stderr)
        return 2
    if args.trace and args.seed is None:
        print("p2psync sim: --trace needs --seed S", file=sys.stderr)
        return 2
    config = SimConfig(peers=args.peers, steps=args.steps, topology=args.topology, ops=args.ops, faults=args.faults,
                       scopes=args.scopes)
    seeds = [args.seed] if args.seed is not None else list(range(args.seed_start, args.seed_start + args.seeds))
    results: list[SeedResult] = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix=f"p2psync-sim-{seed}-") as tmp:
            on_event = (lambda line: print(line, file=out)) if args.trace else None
            result = run_seed(seed, config, Path(tmp), on_event)
        results.append(result)
        if not result.ok and not args.quiet:
            report(result, out)
            out.flush()
    print(summary_line(results), file=out)
    return 0 if all(r.ok for r in results) else 1
