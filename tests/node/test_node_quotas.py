"""A node runs with the quotas of its configuration (issue #15): a link that pushes past a
tenant's quota is refused with the code, says why in its status, and the refusals are counted
in ``sync_quota_refused_total``."""

from __future__ import annotations

from pathlib import Path

import trio

from p2psync.node.config import TenantConfig
from tests.node.support import free_port, make_node, metric_samples, scrape, until
from tests.peer.support import Clock, seeded, write_notes

ALICE = seeded("alice-node-quota")


async def test_a_link_pushing_past_a_tenant_quota_is_refused_and_counted(tmp_path: Path) -> None:
    port = free_port()
    full = make_node(tmp_path, "full", ALICE, port=port, metrics=True, tenants=(TenantConfig(quota_messages=3),))
    laptop = make_node(tmp_path, "laptop", ALICE, peers=[f"ws://127.0.0.1:{port}/_p2psync"])
    write_notes(laptop.store, ALICE, 6, clock=Clock())
    async with trio.open_nursery() as nursery:
        await nursery.start(full.run)
        await nursery.start(laptop.run)
        await until(lambda: any("507 TenantQuotaExceeded" in (link.last_error or "")
                                for link in laptop.links.values()))
        assert full.metrics_url is not None
        _, body = await scrape(full.metrics_url)
        full.stop()
        laptop.stop()
    assert full.store.messages.count(ALICE.did) == 3
    refused = {s["kind"]: v for s, v in metric_samples(body)["sync_quota_refused_total"]}
    assert refused["tenant"] >= 1 and refused["peer"] == 0  # the tenant's own device pays no budget
