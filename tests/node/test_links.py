"""The link planner's rules, one by one (p2psync/node/links.py)."""

from __future__ import annotations

from p2psync.node.config import StaticPeer, TenantConfig
from p2psync.node.discovery_api import AUTO_CAPABILITY
from p2psync.node.links import link_state, plan_links, state_text
from p2psync.replication.scope import SyncScope
from tests.node.fakes import FakePeerSeen

ALICE, BOB, CAROL = "did:key:alice", "did:key:bob", "did:key:carol"
NOTES = SyncScope.for_protocol("https://example.org/notes")
MINE = "5" * 8


def seen(sid: str, tenants: set[str], *, auto: bool = True, port: int = 4984) -> FakePeerSeen:
    return FakePeerSeen(f"node-{sid}", ALICE, sid, ("10.0.0.2",), port, frozenset(tenants),
                        capabilities=(AUTO_CAPABILITY,) if auto else ())


TENANTS = (TenantConfig(ALICE, "both", (SyncScope.global_scope(), NOTES)), TenantConfig(BOB, "pull"))


def test_static_peers_are_always_dialed_for_their_tenants_and_scopes() -> None:
    peers = [StaticPeer("ws://a:1/"), StaticPeer("ws://b:1/", (BOB,))]
    plan = plan_links(TENANTS, peers, [], own_sid=MINE, auto=False)
    assert sorted((s.url, s.tenant, s.scope.kind, s.direction) for s in plan.values()) == [
        ("ws://a:1/", ALICE, "global", "both"), ("ws://a:1/", ALICE, "protocol", "both"),
        ("ws://a:1/", BOB, "global", "pull"), ("ws://b:1/", BOB, "global", "pull"),
    ]
    assert {s.origin for s in plan.values()} == {"static"}


def test_discovered_peers_need_auto_and_a_shared_tenant() -> None:
    larger = seen("9" * 8, {ALICE, CAROL})
    assert plan_links(TENANTS, [], [larger], own_sid=MINE, auto=False) == {}
    plan = plan_links(TENANTS, [], [larger], own_sid=MINE, auto=True)
    # ALICE is shared (two scopes -> two links), BOB is not advertised, CAROL is not ours.
    assert sorted((s.remote, s.tenant, s.scope.kind) for s in plan.values()) == [
        ("sid:99999999", ALICE, "global"), ("sid:99999999", ALICE, "protocol"),
    ]
    assert {s.url for s in plan.values()} == {"ws://10.0.0.2:4984/_p2psync"}


def test_only_the_smaller_store_id_dials_unless_the_other_never_dials() -> None:
    smaller = seen("1" * 8, {ALICE})
    assert plan_links(TENANTS, [], [smaller], own_sid=MINE, auto=True) == {}
    smaller_without_auto = seen("1" * 8, {ALICE}, auto=False)
    assert len(plan_links(TENANTS, [], [smaller_without_auto], own_sid=MINE, auto=True)) == 2
    # The two sides agree: exactly one of them plans the links.
    a, b = seen("1" * 8, {ALICE}), seen("9" * 8, {ALICE})
    from_a = plan_links(TENANTS, [], [b], own_sid=a.sid, auto=True)
    from_b = plan_links(TENANTS, [], [a], own_sid=b.sid, auto=True)
    assert len(from_a) == 2 and from_b == {}


def test_never_ourselves_nor_a_node_already_linked() -> None:
    me = seen(MINE, {ALICE})
    assert plan_links(TENANTS, [], [me], own_sid=MINE, auto=True) == {}
    larger = seen("9" * 8, {ALICE})
    # Reached by a static URL already (its hello named this store id): not dialed twice.
    plan = plan_links(TENANTS, [StaticPeer("ws://b:1/")], [larger], own_sid=MINE, auto=True,
                      static_sids={larger.sid})
    assert {s.origin for s in plan.values()} == {"static"}
    # It dials us for the global scope already: only the protocol scope is ours to dial.
    plan = plan_links(TENANTS, [], [larger], own_sid=MINE, auto=True,
                      dialing_us={larger.sid: {(ALICE, SyncScope.global_scope().scope_id)}})
    assert [s.scope for s in plan.values()] == [NOTES]


def test_one_link_per_remote_tenant_and_scope() -> None:
    larger = seen("9" * 8, {ALICE})
    plan = plan_links(TENANTS, [StaticPeer("ws://a:1/")], [larger, larger], own_sid=MINE, auto=True)
    keys = [s.key for s in plan.values()]
    assert len(keys) == len(set(keys)) == 5  # 3 static (2 ALICE scopes + BOB) + 2 discovered
    for key, spec in plan.items():
        assert key == (spec.remote, spec.tenant, spec.scope.scope_id)


def test_private_adverts_match_by_hash() -> None:
    from tests.node.fakes import _hashed

    private = FakePeerSeen("p", ALICE, "9" * 8, ("10.0.0.3",), 4984, frozenset({_hashed("salt", ALICE)}),
                           tenants_hashed=True, salt="salt", capabilities=(AUTO_CAPABILITY,))
    plan = plan_links(TENANTS, [], [private], own_sid=MINE, auto=True)
    assert {s.tenant for s in plan.values()} == {ALICE}


def test_a_link_is_live_only_while_connected_and_caught_up() -> None:
    def state(**given: bool) -> str:
        facts = {"running": True, "connected": True, "caught_up": True, "repairing": False, "waiting": False,
                 "silent": False}
        return link_state(**{**facts, **given})

    assert state() == "live"
    assert state(caught_up=False) == "catching-up"
    assert state(repairing=True) == "repairing"
    assert state(silent=True) == "unresponsive"  # a peer that vanished without closing
    assert state(connected=False) == "connecting"
    assert state(connected=False, waiting=True) == "backoff"
    assert state(running=False) == "idle"  # whatever the ledger's last round said


def test_state_text_says_failures_and_the_next_attempt() -> None:
    assert state_text("live", 0, None) == "live"
    assert state_text("connecting", 1, None) == "connecting (1 failure(s))"
    assert state_text("backoff", 4, 11.6) == "backoff (4 failure(s), next attempt in 12 s)"
