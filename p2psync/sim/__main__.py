"""``python -m p2psync.sim``: see :mod:`p2psync.sim.cli`."""

from p2psync.sim.cli import main

raise SystemExit(main())
