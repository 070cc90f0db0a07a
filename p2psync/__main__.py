"""``python -m p2psync``: the ``p2psync`` command.

``dwn pipe --store FILE`` alone starts without the rest of the CLI: a differential runner
starts one pipe per scenario, and importing every command (node, trio, the Spark jobs' glue)
cost ~0.4 s of CPU before the first line was read (issue #17). Any other form of it (help, a
usage error, ``--home`` in front) goes through :func:`p2psync.cli.main` as before.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def _pipe_store(argv: Sequence[str]) -> str | None:
    """The store of a plain ``dwn pipe --store FILE`` (what argparse would read), else None."""
    if list(argv[:2]) != ["dwn", "pipe"]:
        return None
    rest = list(argv[2:])
    if len(rest) == 2 and rest[0] == "--store" and not rest[1].startswith("-"):
        return rest[1]
    if len(rest) == 1 and rest[0].startswith("--store="):
        return rest[0].removeprefix("--store=")
    return None


def _configure_sqlite() -> None:
    """SQLite for a process whose one connection is used by one thread at a time: no memory
    statistics (each allocation took a mutex and counted; SQLite allocates several times a
    write, for the savepoints' journals) and no per-connection mutex (apsw itself refuses
    concurrent use of a connection). -1.6% instructions a write in the pipe (issue #17).
    Only before SQLite has a connection: otherwise it is left as it is."""
    import apsw

    try:
        apsw.shutdown()
        apsw.config(apsw.SQLITE_CONFIG_MEMSTATUS, 0)
        apsw.config(apsw.SQLITE_CONFIG_MULTITHREAD)
    except apsw.MisuseError:
        pass
    apsw.initialize()


def _run_pipe(store: str) -> int:
    """``p2psync dwn pipe`` with :func:`p2psync.cli.main`'s exit codes and one-line errors."""
    import apsw

    from p2psync.dwn.pipe import run_pipe

    _configure_sqlite()
    try:
        return run_pipe(store)
    except apsw.BusyError:
        from p2psync.cli import common

        print(f"p2psync: the store is busy: another process held its write lock for {common.CLI_BUSY_TIMEOUT:g} s; "
              "try again", file=sys.stderr)
        return common.EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1  # EXIT_FAILED


if __name__ == "__main__":
    store = _pipe_store(sys.argv[1:])
    if store is not None:
        raise SystemExit(_run_pipe(store))
    from p2psync.cli import main

    raise SystemExit(main())
