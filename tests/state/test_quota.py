"""The store's quotas (p2psync/state/quota.py, issue #15): what a message costs, what a listing
takes, the exact check before an apply, and a pusher's budget per window kept in the store."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import Store
from p2psync.errors import QuotaExceeded
from p2psync.state.quota import MESSAGE_ALLOWANCE, UNLIMITED, Limit, QuotaPolicy, Quotas, Usage
from tests.replication.support import chat_world

STRANGER = "did:key:z6MkStranger"


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_message_costs_what_the_store_then_holds(tmp_path: Path) -> None:
    """The estimate before an apply is the growth the apply makes: the message as archived plus
    its data, nothing for one already held."""
    w = chat_world()
    dwn = Dwn(Store(tmp_path / "s.db"))
    quotas = Quotas(dwn.store, QuotaPolicy(tenant=Limit(10_000, 10**9)))
    for step in w.ordered():
        cost = quotas.cost(w.tenant, step.message, step.entry.cid, step.data)
        before = quotas.usage(w.tenant)
        assert dwn.apply_replicated_message(w.tenant, step.message, step.data).kind == "Applied"
        assert quotas.usage(w.tenant) - before == cost and cost.messages == 1
        assert quotas.cost(w.tenant, step.message, step.entry.cid, step.data) == Usage(0, 0)


def test_a_listing_takes_what_fits_with_an_allowance_per_message(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    tenant = "did:key:z6MkTenant"
    quotas = Quotas(store, QuotaPolicy(tenant=Limit(3, None)))
    assert quotas.fit(tenant, None, [None] * 5)[0] == 3
    n, refusal = quotas.fit(tenant, None, [10, 20, 30, 40])
    assert n == 3 and isinstance(refusal, QuotaExceeded)
    assert (refusal.code, refusal.name, refusal.local) == (507, "TenantQuotaExceeded", True)
    assert tenant in refusal.detail and "3 messages" in refusal.detail
    by_bytes = Quotas(store, QuotaPolicy(tenant=Limit(None, 2 * MESSAGE_ALLOWANCE + 100)))
    assert by_bytes.fit(tenant, None, [50, 50, 0])[0] == 2  # 2 x (50 + allowance) fit, a third does not
    assert by_bytes.fit(tenant, None, [101])[0] == 1 and by_bytes.fit(tenant, None, [10**6])[0] == 0
    # Nothing bounded: everything fits, nothing is read.
    assert Quotas(store, QuotaPolicy(peer=UNLIMITED)).fit(tenant, STRANGER, [10**12] * 4) == (4, None)
    assert Quotas(store, QuotaPolicy()).fit(tenant, None, [10**12]) == (1, None)  # nobody charged


def test_the_check_refuses_one_byte_past_the_quota(tmp_path: Path) -> None:
    w = chat_world()
    dwn = Dwn(Store(tmp_path / "s.db"))
    first, second = w.ordered()[:2]
    cost1 = Quotas(dwn.store, QuotaPolicy()).cost(w.tenant, first.message, first.entry.cid, first.data)
    cost2 = Quotas(dwn.store, QuotaPolicy()).cost(w.tenant, second.message, second.entry.cid, second.data)
    exact = Quotas(dwn.store, QuotaPolicy(tenant=Limit(None, cost1.bytes + cost2.bytes)))
    exact.check(w.tenant, None, cost1)
    dwn.apply_replicated_message(w.tenant, first.message, first.data)
    exact.check(w.tenant, None, cost2)  # exactly at the quota: taken
    short = Quotas(dwn.store, QuotaPolicy(tenant=Limit(None, cost1.bytes + cost2.bytes - 1)))
    with pytest.raises(QuotaExceeded) as refused:
        short.check(w.tenant, None, cost2)
    assert refused.value.name == "TenantQuotaExceeded"
    short.check(w.tenant, None, Usage(0, 0))  # a message already held costs nothing: never refused
    by_count = Quotas(dwn.store, QuotaPolicy(tenant=Limit(1, None), tenants={"did:key:z6MkOther": UNLIMITED}))
    with pytest.raises(QuotaExceeded):
        by_count.check(w.tenant, None, cost2)
    by_count.check("did:key:z6MkOther", None, Usage(5, 10**9))  # its own (unbounded) quota


def test_a_pushers_budget_is_charged_kept_across_a_restart_and_renewed_with_the_window(tmp_path: Path) -> None:
    w = chat_world()
    path = tmp_path / "s.db"
    dwn = Dwn(Store(path))
    clock = Clock()
    policy = QuotaPolicy(peer=Limit(2, None), window=3600)
    quotas = Quotas(dwn.store, policy, clock=clock)
    steps = w.ordered()
    for step in steps[:2]:
        before = quotas.usage(w.tenant)
        dwn.apply_replicated_message(w.tenant, step.message, step.data)
        quotas.admitted(w.tenant, STRANGER, before)
    start, spent = quotas.spent(STRANGER)
    assert start == clock.now and spent.messages == 2 and spent.bytes == quotas.usage(w.tenant).bytes
    quotas.check(w.tenant, None, Usage(1, 1))  # this node's own pulls are nobody's
    quotas.check(w.tenant, "did:key:z6MkSomeoneElse", Usage(1, 1))
    clock.now += 600
    dwn.close()
    restarted = Quotas(Dwn(Store(path)).store, policy, clock=clock)  # the window outlives the process
    with pytest.raises(QuotaExceeded) as spent_up:
        restarted.check(w.tenant, STRANGER, Usage(1, 1))
    refusal = spent_up.value
    assert (refusal.code, refusal.name, refusal.retry_after) == (429, "PeerQuotaExceeded", 3000)
    assert refusal.body["retryAfter"] == 3000 and STRANGER in refusal.detail
    assert restarted.fit(w.tenant, STRANGER, [None])[0] == 0
    clock.now += 3000
    restarted.check(w.tenant, STRANGER, Usage(2, 10**6))  # a new window
    clock.now -= 10**6  # the clock set back before the window began: a new window from now
    assert restarted.spent(STRANGER) == (clock.now, Usage())


def test_old_windows_are_forgotten(tmp_path: Path) -> None:
    w = chat_world()
    dwn = Dwn(Store(tmp_path / "s.db"))
    clock = Clock()
    quotas = Quotas(dwn.store, QuotaPolicy(peer=Limit(100, None), window=60), clock=clock)
    for i, step in enumerate(w.ordered()[:3]):
        before = quotas.usage(w.tenant)
        dwn.apply_replicated_message(w.tenant, step.message, step.data)
        quotas.admitted(w.tenant, f"did:key:z6MkStranger{i}", before)
        clock.now += 61
    # Each stranger's window was over when the next one pushed: only the last is kept.
    rows = dwn.store.conn.execute("SELECT peer FROM peer_push_budget ORDER BY peer").fetchall()
    assert rows == [("did:key:z6MkStranger2",)]


def test_a_refusal_is_logged_once_per_episode(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = chat_world()
    dwn = Dwn(Store(tmp_path / "s.db"))
    quotas = Quotas(dwn.store, QuotaPolicy(tenant=Limit(1, None)))
    first, second, third = w.ordered()[:3]
    with caplog.at_level(logging.WARNING, logger="p2psync.quota"):
        before = quotas.usage(w.tenant)
        dwn.apply_replicated_message(w.tenant, first.message, first.data)
        quotas.admitted(w.tenant, None, before)
        for _ in range(3):
            assert quotas.fit(w.tenant, None, [None])[0] == 0
            with pytest.raises(QuotaExceeded):
                quotas.check(w.tenant, None, Usage(1, 10))
    lines = [r.getMessage() for r in caplog.records if r.name == "p2psync.quota"]
    assert len(lines) == 1 and "would pass its quota" in lines[0] and w.tenant in lines[0]
