"""Record bodies per message in a mesh, in the deterministic simulator (issue #17).

    .venv/bin/python tests/bench/bench_mesh.py [--peers 4] [--writes 1000] [--seed 0]

Three figures, each over every message written (bodies: members of `rev` and `revs` requests,
plus entries carried by `getDependencies` answers):

- ``mesh``: ``--writes`` records written on p0, then every link of a full mesh (each pair
  once, both directions on one connection) runs its round at once, so each peer hears of a
  message from several others while it is still in flight. Ideal: peers - 1 per message.
- ``mesh, every node lists every other``: the same with two connections per pair (each end
  opens one), as a node does when each lists the other.
- ``returning device``: p0..p(n-2) already hold everything; the last peer comes back and
  every link to it (both ends opening, as above) runs at once. Ideal: 1 received per message.

The simulator delivers in a seeded random order with no faults here, so a figure replays
exactly for a seed; it counts what crosses, not time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.replication.effects import Output, SendReply, SendRequest  # noqa: E402
from p2psync.replication.wire import decode_map  # noqa: E402
from p2psync.sim.network import Connection, Endpoint, Link  # noqa: E402
from p2psync.sim.simulation import SimConfig, Simulation  # noqa: E402


class CountingSimulation(Simulation):
    """A simulation that counts the record bodies each peer receives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bodies: Counter[str] = Counter()  # receiving peer's name -> bodies

    def _output(self, conn: Connection, side: int, end: Endpoint, out: Output) -> None:
        if conn.alive and end.generation == end.peer.generation:
            receiver = conn.ends[1 - side].peer.name
            if isinstance(out, SendRequest) and out.profile == "rev":
                self.bodies[receiver] += 1
            elif isinstance(out, SendRequest) and out.profile == "revs":
                self.bodies[receiver] += len(decode_map(out.body)["revs"])
            elif isinstance(out, SendReply) and b"answers" in out.body[:16]:  # a getDependencies answer
                answers = decode_map(out.body).get("answers")
                if isinstance(answers, list):
                    self.bodies[receiver] += sum(len(a.get("entries", [])) for a in answers if isinstance(a, dict))
        super()._output(conn, side, end, out)


def _links(n: int, pairs: list[tuple[int, int]], both_ends: bool) -> list[Link]:
    links: list[Link] = []
    for a, b in pairs:
        links.append(Link(len(links), a, b))
        if both_ends:
            links.append(Link(len(links), b, a))
    return links


def _simulation(peers: int, seed: int, root: Path, name: str) -> CountingSimulation:
    workdir = root / name
    workdir.mkdir()
    sim = CountingSimulation(seed, SimConfig(peers=peers, steps=0, topology="mesh", ops="basic"), workdir)
    for peer in sim.peers:
        peer.offers_revs = True  # the batched path between p2psync peers
    return sim


def _write(sim: Simulation, count: int) -> None:
    peer = sim.peers[0]
    for _ in range(count):
        sim.writer.act(peer, sim.clock.step)
    sim.commit(peer)


def _all_at_once(sim: Simulation) -> None:
    for link in sim.links:
        sim.connect(link)
    sim.settle()
    assert sim._drain(), "the round did not drain"
    assert sim.quiesce(), "no quiescence"


def _held(sim: Simulation) -> int:
    return len(sim.peers[0].held())  # the messages every peer ends up holding (p0 wrote them all)


def mesh(peers: int, writes: int, seed: int, root: Path, both_ends: bool) -> float:
    sim = _simulation(peers, seed, root, f"mesh-{both_ends}")
    pairs = [(i, j) for i in range(peers) for j in range(i + 1, peers)]
    sim.links = _links(peers, pairs, both_ends)
    _write(sim, writes)
    _all_at_once(sim)
    messages = _held(sim)
    result = sim.finish(True)
    assert result.ok, result.findings[:3]
    return sum(sim.bodies.values()) / messages


def returning(peers: int, writes: int, seed: int, root: Path) -> float:
    sim = _simulation(peers, seed, root, "returning")
    last = peers - 1
    pairs = [(i, j) for i in range(peers) for j in range(i + 1, peers)]
    sim.links = _links(peers, [p for p in pairs if last not in p], True)
    _write(sim, writes)
    _all_at_once(sim)
    sim.bodies.clear()
    sim.links = _links(peers, [p for p in pairs if last in p], True)
    _all_at_once(sim)
    messages = _held(sim)
    received = sim.bodies[sim.peers[last].name]
    result = sim.finish(True)
    assert result.ok, result.findings[:3]
    return received / messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--writes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ideal = args.peers - 1
        print(f"{args.peers} peers, {args.writes} writes on p0, seed {args.seed}")
        print(f"mesh, one connection per pair:     {mesh(args.peers, args.writes, args.seed, root, False):.2f}"
              f" bodies sent per message (ideal {ideal})")
        print(f"mesh, every node lists every other: {mesh(args.peers, args.writes, args.seed, root, True):.2f}"
              f" bodies sent per message (ideal {ideal})")
        print(f"returning device:                   {returning(args.peers, args.writes, args.seed, root):.2f}"
              " bodies received per message (ideal 1)")


if __name__ == "__main__":
    main()
