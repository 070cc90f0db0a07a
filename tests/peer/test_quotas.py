"""Quotas on what a node stores through replication (issue #15), over real connections.

A tenant's quota: a push that would take the tenant past it is refused with ``507
TenantQuotaExceeded`` and a pull of ours stops there; the store never holds more, and no
checkpoint passes a message that was refused. A pushing peer's budget: past it, ``429
PeerQuotaExceeded`` with ``retryAfter``, and the store holds what fit; the tenant's own
devices are not charged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from p2psync.dwn.store import Store
from p2psync.errors import QuotaExceeded, describe, retry_after
from p2psync.peer.peer import Peer
from p2psync.replication.checkpoint import Direction, LinkState
from p2psync.replication.observer import NoObserver
from p2psync.state.ledger import Ledger
from p2psync.state.quota import UNLIMITED, Limit, QuotaPolicy, Quotas
from tests.peer.support import Clock, new_store, seeded, served, write_notes

ALICE = seeded("quota-alice")
MALLORY = seeded("quota-mallory")


class Counting(NoObserver):
    def __init__(self) -> None:
        self.refused: list[tuple[str, str]] = []

    def quota_refused(self, kind: str, tenant: str) -> None:
        self.refused.append((kind, tenant))


def frontier(ledger: Ledger, direction: Direction) -> tuple[int | None, int | None, int]:
    """The link's (contiguous applied, received, unapplied count) positions in ``direction``."""
    [link] = ledger.links()
    checkpoint, _ = ledger.get_checkpoint(link.key, direction)
    applied, received = checkpoint.contiguous_applied_token, checkpoint.received_token
    return (None if applied is None else applied.position, None if received is None else received.position,
            len(checkpoint.unapplied_tokens))


def held(store: Store) -> int:
    return len(store.messages.cids(ALICE.did))


def covers_only_what_is_held(ledger: Ledger, direction: Direction, source: Store, receiver: Store) -> None:
    """No checkpoint passes a message the receiver does not hold: every entry of the source's
    log up to the frontier is there, and nothing is left received and unapplied."""
    applied, _, unapplied = frontier(ledger, direction)
    assert unapplied == 0
    have = set(receiver.messages.cids(ALICE.did))
    assert all(cid in have for _, cid in source.events.read(ALICE.did, after=-1, limit=applied or 0))


async def test_a_push_over_the_tenant_quota_is_refused_and_nothing_past_it_is_stored(tmp_path: Path) -> None:
    node_store, laptop = new_store(tmp_path, "node"), new_store(tmp_path, "laptop")
    write_notes(laptop, ALICE, 12, clock=Clock())
    node = Peer(node_store, ALICE, stores={ALICE.did}, quotas=QuotaPolicy(tenant=Limit(5, None)))
    node.metrics = observer = Counting()
    pusher = Peer(laptop, ALICE)
    async with served(node) as url:
        with pytest.raises(QuotaExceeded) as refused:
            await pusher.sync(url, tenant=ALICE.did, direction="push")
        assert (refused.value.code, refused.value.name) == (507, "TenantQuotaExceeded")
        assert held(node_store) == 5 and node_store.usage(ALICE.did)[0] == 5
        # The pusher's checkpoint stays before the first message the node did not take.
        assert frontier(pusher.ledger, Direction.PUSH) == (5, 5, 0)
        assert pusher.ledger.links()[0].last_error == "507 TenantQuotaExceeded"
        # Again: refused at once, with the node's own words, and still nothing more stored.
        with pytest.raises(QuotaExceeded) as again:
            await pusher.sync(url, tenant=ALICE.did, direction="push")
        assert "its quota here is 5 messages" in again.value.detail
        assert held(node_store) == 5
        # (The first round ended before it saved its copy on the node: this one rewound to the
        # start, §4.4, and was refused before it recorded anything.)
        _, received, unapplied = frontier(pusher.ledger, Direction.PUSH)
        assert (received or 0) <= 5 and unapplied == 0
    assert observer.refused and set(observer.refused) == {("tenant", ALICE.did)}
    line = describe(again.value, url)
    assert line is not None and line.startswith(f"{url} refused: 507 TenantQuotaExceeded")


async def test_a_peer_over_its_budget_gets_429_and_the_store_holds_only_what_fit(tmp_path: Path) -> None:
    """Mallory carries Alice's messages but may not read Alice's tenant on the node: her pushes
    are charged to her DID. Alice's own laptop is not charged."""
    node_store, carried, laptop = (new_store(tmp_path, n) for n in ("node", "mallory", "laptop"))
    write_notes(carried, ALICE, 10, clock=Clock(), prefix="carried")
    write_notes(laptop, ALICE, 6, clock=Clock("2031-01-01T00:00:00.000000Z"), prefix="own")
    policy = QuotaPolicy(peer=Limit(4, None), window=3600)
    node = Peer(node_store, ALICE, stores={ALICE.did}, quotas=policy)
    node.metrics = observer = Counting()
    async with served(node) as url:
        with pytest.raises(QuotaExceeded) as refused:
            await Peer(carried, MALLORY).sync(url, tenant=ALICE.did, direction="push")
        assert (refused.value.code, refused.value.name) == (429, "PeerQuotaExceeded")
        after = retry_after(refused.value)
        assert after is not None and 3500 < after <= 3600
        assert held(node_store) == 4
        assert node.quotas is not None and node.quotas.spent(MALLORY.did)[1].messages == 4
        # The tenant's own device pushes past any peer budget.
        summary = await Peer(laptop, ALICE).sync(url, tenant=ALICE.did, direction="push")
        assert summary.push is not None and summary.push.revs_applied == 6
        assert held(node_store) == 10 and node.quotas.spent(ALICE.did)[1].messages == 0
    assert ("peer", ALICE.did) in observer.refused and ("tenant", ALICE.did) not in observer.refused
    # A restart does not renew the budget: it is kept in the store.
    restarted = Peer(node_store, ALICE, stores={ALICE.did}, quotas=policy)
    async with served(restarted) as url:
        with pytest.raises(QuotaExceeded) as still:
            await Peer(carried, MALLORY).sync(url, tenant=ALICE.did, direction="push")
    assert still.value.name == "PeerQuotaExceeded" and held(node_store) == 10


async def test_a_pull_never_exceeds_the_tenant_quota(tmp_path: Path) -> None:
    source, node_store = new_store(tmp_path, "source"), new_store(tmp_path, "node")
    write_notes(source, ALICE, 9, clock=Clock(), sizes={4: 3000})
    cost = Quotas(source, QuotaPolicy()).usage(ALICE.did).bytes // 9
    limit = Limit(None, 4 * cost)  # room for a few notes, by bytes
    node = Peer(node_store, ALICE, quotas=QuotaPolicy(tenant=limit))
    node.metrics = observer = Counting()
    async with served(Peer(source, ALICE)) as url:
        for _ in range(4):
            with pytest.raises(QuotaExceeded) as refused:
                await node.sync(url, tenant=ALICE.did, direction="pull")
            assert refused.value.local and refused.value.name == "TenantQuotaExceeded"
            assert node_store.usage(ALICE.did)[1] <= 4 * cost
            covers_only_what_is_held(node.ledger, Direction.PULL, source, node_store)
    assert 0 < held(node_store) < 9
    assert observer.refused and {kind for kind, _ in observer.refused} == {"tenant"}
    line = describe(refused.value, url)
    assert line is not None and line.startswith(f"stopped taking messages from {url}: 507 TenantQuotaExceeded")
    # Raised, the quota lets the pull finish.
    raised = Peer(node_store, ALICE, quotas=QuotaPolicy(tenant=Limit(100, None)))
    async with served(Peer(source, ALICE)) as url:
        await raised.sync(url, tenant=ALICE.did, direction="pull")
    assert held(node_store) == 9 and frontier(raised.ledger, Direction.PULL)[2] == 0


@pytest.mark.parametrize("way", ["pull", "push"])
async def test_a_message_the_listing_let_through_is_refused_exactly_and_the_checkpoint_stays_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """The exact check before each apply is the last gate: here the listing's estimate lets
    every item through (as a local write racing the listing would), and the apply that would
    pass the quota is refused; nothing after it is taken."""
    monkeypatch.setattr(Quotas, "fit", lambda self, tenant, payer, sizes: (len(sizes), None))
    holder, receiver = new_store(tmp_path, "holder"), new_store(tmp_path, "receiver")
    write_notes(holder, ALICE, 8, clock=Clock())
    quotas = QuotaPolicy(tenant=Limit(3, None))
    if way == "pull":
        passive, active = Peer(holder, ALICE), Peer(receiver, ALICE, quotas=quotas)
    else:
        passive, active = Peer(receiver, ALICE, quotas=quotas), Peer(holder, ALICE)
    direction = Direction.PULL if way == "pull" else Direction.PUSH
    async with served(passive) as url:
        with pytest.raises(QuotaExceeded):
            await active.sync(url, tenant=ALICE.did, direction=way)  # type: ignore[arg-type]
    assert held(receiver) == 3 and receiver.usage(ALICE.did)[0] == 3
    applied, received, unapplied = frontier(active.ledger, direction)
    assert applied == 3  # never past the refused fourth
    assert received is not None and received - applied == unapplied  # at most the refused ones, unapplied


async def test_a_continuous_pull_ends_when_the_quota_is_reached_after_catching_up(tmp_path: Path) -> None:
    source, node_store = new_store(tmp_path, "source"), new_store(tmp_path, "node")
    clock = Clock()
    write_notes(source, ALICE, 2, clock=clock)
    node = Peer(node_store, ALICE, quotas=QuotaPolicy(tenant=Limit(4, None)))

    async def write_once_live() -> None:
        while not node.ledger.links() or node.ledger.links()[0].state != LinkState.LIVE:
            await trio.sleep(0.01)
        write_notes(source, ALICE, 5, clock=clock, prefix="later")

    async with served(Peer(source, ALICE)) as url, trio.open_nursery() as nursery:
        nursery.start_soon(write_once_live)
        with pytest.raises(QuotaExceeded) as refused:
            await node.sync(url, tenant=ALICE.did, direction="pull", continuous=True)
    assert refused.value.name == "TenantQuotaExceeded"
    assert held(node_store) == 4 and frontier(node.ledger, Direction.PULL)[:2] == (4, 4)


async def test_no_quotas_bound_nothing(tmp_path: Path) -> None:
    """A policy with nothing bounded reads and writes nothing for quotas."""
    node_store, laptop = new_store(tmp_path, "node"), new_store(tmp_path, "laptop")
    write_notes(laptop, ALICE, 4, clock=Clock())
    node = Peer(node_store, ALICE, quotas=QuotaPolicy(tenant=UNLIMITED, peer=UNLIMITED))
    async with served(node) as url:
        await Peer(laptop, MALLORY).sync(url, tenant=ALICE.did, direction="push")
    assert held(node_store) == 4
    assert node_store.conn.execute("SELECT count(*) FROM peer_push_budget").fetchone() == (0,)


async def test_a_take_by_reconciliation_stops_at_the_tenant_quota(tmp_path: Path) -> None:
    """Anti-entropy hands over what the node lacks (a take): only what fits is fetched; the
    rest is reported, and a take of which nothing fits is refused whole."""
    node_store, laptop = new_store(tmp_path, "node"), new_store(tmp_path, "laptop")
    clock = Clock()
    write_notes(laptop, ALICE, 2, clock=clock)
    node = Peer(node_store, ALICE, stores={ALICE.did}, quotas=QuotaPolicy(tenant=Limit(5, None)))
    async with served(node) as url:
        await Peer(laptop, ALICE).sync(url, tenant=ALICE.did, direction="push")
        write_notes(laptop, ALICE, 6, clock=clock, prefix="more")
        first = await Peer(laptop, ALICE).reconcile(url, tenant=ALICE.did, repair=True, direction="push")
        assert first.pushed == {"Applied": 3, "TenantQuotaExceeded": 3}
        assert held(node_store) == 5
        second = await Peer(laptop, ALICE).reconcile(url, tenant=ALICE.did, repair=True, direction="push")
        assert second.pushed == {"TenantQuotaExceeded": 3} and held(node_store) == 5
