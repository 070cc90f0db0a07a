"""``demo``, ``sim``, and the tools for testing other implementations: ``dwn pipe`` and ``blip echo``."""

from __future__ import annotations

import argparse

from p2psync.blip.echo import main as echo_main
from p2psync.demo import run_demo
from p2psync.dwn.pipe import run_pipe
from p2psync.sim import cli as sim_cli

__all__ = ["cmd_blip_echo", "cmd_demo", "cmd_dwn_pipe", "cmd_sim"]


def cmd_dwn_pipe(args: argparse.Namespace) -> int:
    return run_pipe(args.store)


def cmd_sim(args: argparse.Namespace) -> int:
    return sim_cli.run(args)


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo()


def cmd_blip_echo(args: argparse.Namespace) -> int:
    return int(echo_main(host=args.host, port=args.port, app_id=args.app_id) or 0)
