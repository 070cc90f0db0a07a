"""Issue #17: a body crosses once per receiver; a declined message is never lost."""

from __future__ import annotations

from pathlib import Path

from p2psync.replication.inflight import InFlightClaims
from p2psync.sim.network import Link
from tests.bench.bench_mesh import CountingSimulation, _links, _simulation, _write


def test_claims_decline_others_and_tell_waiters() -> None:
    claims = InFlightClaims()
    a, b = object(), object()
    assert claims.claim("t", ["x", "y"], a) == set()
    assert claims.claim("t", ["x", "z"], b) == {"x"}
    told: list[bool] = []
    claims.wait("t", "x", told.append)
    claims.release("t", ["x"], b, held=True)  # not b's: ignored
    assert told == []
    claims.release("t", ["x"], a, held=True)
    assert told == [True]
    claims.wait("t", "y", told.append)
    claims.release("t", ["y"], a, held=False)
    assert told == [True, False]
    claims.wait("t", "gone", told.append)  # nobody receives it: not held
    assert told == [True, False, False]


def _mesh(tmp_path: Path, writes: int) -> CountingSimulation:
    sim = _simulation(4, 0, tmp_path, "mesh")
    sim.links = _links(4, [(i, j) for i in range(4) for j in range(i + 1, 4)], True)
    _write(sim, writes)
    return sim


def test_each_body_crosses_once_per_receiver_when_every_node_lists_every_other(tmp_path: Path) -> None:
    sim = _mesh(tmp_path, 100)
    for link in sim.links:
        sim.connect(link)
    sim.settle()
    assert sim._drain()
    assert sim.quiesce()
    messages = len(sim.peers[0].held())  # what each of the 3 receivers must end up holding
    result = sim.finish(True)
    assert result.ok, result.findings[:3]
    # Two connections per pair: without the claims each body crossed about twice per receiver.
    assert sum(sim.bodies.values()) <= 3.3 * messages, sim.bodies


def test_a_link_that_fails_mid_transfer_loses_nothing(tmp_path: Path) -> None:
    sim = _mesh(tmp_path, 30)
    for link in sim.links:
        sim.connect(link)
    sim.settle()
    # Deliver until some sink waits on another link's claim, then drop the claiming link.
    dropped: Link | None = None
    for _ in range(20_000):
        conns = [c for c in sim._alive() if c.in_flight]
        if not conns:
            break
        conn = conns[0]
        sim._deliver(conn, conn.in_flight.pop(0))
        sim.settle()
        for peer in sim.peers:
            for (_, cid), owner in list(peer.in_flight._owner.items()):
                if not peer.in_flight._waiting.get((sim.tenant, cid)):
                    continue
                for c in sim._alive():
                    if any(owner in end.proto.sinks.values() for end in c.ends):
                        dropped = c.link
                        sim._close(c, "dropped", failed=True)
                        sim.settle()
                        break
                if dropped:
                    break
            if dropped:
                break
        if dropped:
            break
    assert dropped is not None, "no sink ever waited on another link"
    assert sim._drain()
    assert sim.quiesce()
    held = [p.held() for p in sim.peers]
    assert all(h == held[0] for h in held)
    result = sim.finish(True)
    assert result.ok, result.findings[:3]  # converged: nothing lost
