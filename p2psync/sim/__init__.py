"""A seeded multi-peer simulator of replication on the sans-I/O protocol (docs/simulator.md).

N peers, each a real SQLite store of one tenant, connected in a line, star, ring or mesh; on
each connection two :class:`~p2psync.replication.protocol.ReplicationProtocol` objects with
the messages in flight between them, delivered in an order the seed picks. Writers act on the
devices, links drop, peers are partitioned, crash (losing their open group commit) and
restart, consumers go slow; then everything heals, rounds run until nothing moves, and the
invariants are checked. No event loop, socket, clock or thread: a seed replays exactly.
"""

from p2psync.sim.check import CLASSES, Finding
from p2psync.sim.simulation import FAULTS, SeedResult, SimConfig, Simulation, run_seed

__all__ = ["CLASSES", "FAULTS", "Finding", "SeedResult", "SimConfig", "Simulation", "run_seed"]
