"""Read authorization over replication (§5): reader decisions and per-message decisions.

Real SQLite stores, real Ed25519 signatures, grants and revocations processed by our engine.
The per-message decision is checked against the engine itself: for every stored message, the
``MessagesRead`` the grantee would send under its read grant, answered 200 or not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn import permissions as perms
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.messages_interface import create_messages_read
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_delete
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import add_seconds
from p2psync.replication.scope import SyncScope
from p2psync.state.authz import ReadAuthorizer, ReaderDecision, sync_grant_messages
from tests.replication.support import CHAT, ChatWorld, chat_world, process_all, seeded

OTHER = "https://p2psync.example/protocols/other"
OTHER_DEFINITION: dict[str, Any] = {
    "protocol": OTHER,
    "published": True,
    "types": {"item": {}},
    "structure": {"item": {}},
}
#: The authorizer's "now": a month after every message of the world (which starts 2030-05-01).
NOW = "2030-06-01T00:00:00.000000Z"


class FixedClock:
    """The authorizer's clock: stays where a test puts it."""

    def __init__(self, now: str = NOW) -> None:
        self.now = now

    def __call__(self) -> str:
        return self.now


@dataclass
class Env:
    store: Store
    dwn: Dwn
    world: ChatWorld
    node: Identity  # the replica the tenant delegates sync to
    clock: FixedClock
    authz: ReadAuthorizer

    @property
    def alice(self) -> Identity:
        return self.world.alice

    def tick(self) -> str:
        return self.world.clock.tick()

    def process(self, tenant: Identity, message: dict[str, Any], data: bytes | None = None) -> None:
        reply = self.dwn.process_message(tenant.did, message, data)
        assert reply.code in (202, 204), reply.detail

    def grant_sync(
        self,
        *,
        protocol: str | None = None,
        expires: str | None = None,
        methods: tuple[str, ...] = ("Read", "Query"),
        tenant: Identity | None = None,
        grantee: Identity | None = None,
    ) -> dict[str, str]:
        """Process a delegated sync grant (only ``methods`` of it); method -> grant id."""
        tenant = tenant or self.alice
        ids: dict[str, str] = {}
        pairs = sync_grant_messages(
            tenant, (grantee or self.node).did, protocol=protocol, expires=expires, date_granted=self.tick()
        )
        for message, data in pairs:
            method = json.loads(data)["scope"]["method"]
            if method in methods:
                self.process(tenant, message, data)
                ids[method] = message["recordId"]
        return ids

    def revoke(self, grant_id: str, when: str | None = None) -> None:
        stored, _ = self.store.messages.query(self.alice.did, [{"recordId": grant_id, "isLatestBaseState": True}])
        grant = PermissionGrant.parse(stored[0])
        write, data = perms.create_revocation(signer=self.alice, grant=grant, date_revoked=when or self.tick())
        self.process(self.alice, write.message, data)

    def engine_reads(self, grant_id: str, cid: str, when: str | None = None) -> bool:
        """Whether our engine answers 200 to the node's MessagesRead of ``cid`` under the grant."""
        read = create_messages_read(
            signer=self.node, message_cid=cid, permission_grant_id=grant_id, message_timestamp=when or self.clock.now
        )
        return self.dwn.process_message(self.alice.did, read).code == 200

    def stored(self) -> dict[str, dict[str, Any]]:
        tenant = self.alice.did
        return {cid: self.store.messages.get(tenant, cid) or {} for cid in self.store.messages.cids(tenant)}


def _populate(env: Env) -> None:
    """Beside the chat story: a second protocol, a record without one, and permission records
    about each protocol (grants, a request, a revocation) that are not the node's."""
    alice, carol = env.alice, env.world.carol
    process_all(env.dwn, alice.did, env.world.ordered())
    env.process(
        alice,
        ProtocolsConfigure.create(definition=OTHER_DEFINITION, signer=alice, message_timestamp=env.tick()).message,
    )
    for protocol, path in ((OTHER, "item"), (None, None)):
        now = env.tick()
        options: dict[str, Any] = {"protocol": protocol, "protocol_path": path} if protocol else {}
        write = RecordsWrite.create(signer=alice, data=b"x", message_timestamp=now, date_created=now, **options)
        env.process(alice, write.message, b"x")
    grant_ids = {}
    for protocol in (CHAT, OTHER):
        granted = env.tick()
        write, data = perms.create_grant(
            signer=alice,
            granted_to=carol.did,
            date_granted=granted,
            date_expires=add_seconds(granted, 10**7),
            scope={"interface": "Records", "method": "Write", "protocol": protocol},
        )
        env.process(alice, write.message, data)
        grant_ids[protocol] = write.message["recordId"]
    for protocol in (CHAT, OTHER):
        env.revoke(grant_ids[protocol])
    # A grant tagged with CHAT whose scope names no protocol: the engine accepts it (tags are
    # checked only against a scoped protocol), and a MessagesRead scoped to CHAT goes by the
    # scope, not the tag.
    granted = env.tick()
    unscoped = json.dumps(
        {"dateExpires": add_seconds(granted, 10**7), "scope": {"interface": "Messages", "method": "Subscribe"}}
    ).encode()
    tagged = RecordsWrite.create(
        signer=alice,
        recipient=carol.did,
        data=unscoped,
        data_format="application/json",
        protocol=perms.PERMISSIONS_PROTOCOL_URI,
        protocol_path=perms.GRANT_PATH,
        tags={"protocol": CHAT},
        message_timestamp=granted,
        date_created=granted,
    )
    env.process(alice, tagged.message, unscoped)
    request, data = perms.create_request(
        signer=carol,
        scope={"interface": "Records", "method": "Read", "protocol": CHAT},
        delegated=False,
        date_requested=env.tick(),
    )
    env.process(alice, request.message, data)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    store = Store(tmp_path / "source.sqlite")
    clock = FixedClock()
    e = Env(store, Dwn(store), chat_world(), seeded("node"), clock, ReadAuthorizer(store, clock=clock))
    _populate(e)
    yield e
    store.close()


def travelling(message: dict[str, Any]) -> dict[str, Any]:
    """A stored message as the feed sends it: its inline data taken out."""
    return {k: v for k, v in message.items() if k != "encodedData"}


def assert_matches_engine(env: Env, decision: ReaderDecision, when: str | None = None) -> dict[bool, int]:
    """may_read (stored and travelling form) equals the engine's answer for every stored
    message; returns how many messages each answer got."""
    assert decision.allowed
    read_grant = decision.grant_ids[0]
    counts = {True: 0, False: 0}
    for cid, message in env.stored().items():
        engine = env.engine_reads(read_grant, cid, when)
        ours = env.authz.may_read(env.alice.did, decision, message)
        ours_travelling = env.authz.may_read(env.alice.did, decision, travelling(message))
        assert (ours, ours_travelling) == (engine, engine), (cid, message["descriptor"])
        counts[engine] += 1
    return counts


GLOBAL = SyncScope.global_scope()


# --------------------------------------------------------------------------- reader decisions


def test_the_tenant_reads_everything(env: Env) -> None:
    alice = env.alice.did
    decision = env.authz.reader(alice, alice, GLOBAL)
    assert (decision.allowed, decision.grant_ids, decision.reason) == (True, (), "")
    assert all(env.authz.may_read(alice, decision, m) for m in env.stored().values())
    assert env.authz.still_valid(alice, decision)
    # a decision is about one tenant
    assert not env.authz.may_read(env.world.bob.did, decision, next(iter(env.stored().values())))


def test_a_stranger_is_refused(env: Env) -> None:
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    assert not decision.allowed
    assert "Messages/Read" in decision.reason and env.node.did in decision.reason
    assert decision.grant_ids == ()
    assert not env.authz.may_read(env.alice.did, decision, next(iter(env.stored().values())))
    assert not env.authz.still_valid(env.alice.did, decision)


def test_a_grantee_with_both_grants_reads_everything(env: Env) -> None:
    ids = env.grant_sync()
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    assert decision.allowed, decision.reason
    assert decision.grant_ids == (ids["Read"], ids["Query"])
    assert env.authz.still_valid(env.alice.did, decision)
    counts = assert_matches_engine(env, decision)
    assert counts == {True: len(env.stored()), False: 0}


@pytest.mark.parametrize("held, missing", [(("Read",), "Query"), (("Query",), "Read")])
def test_one_grant_of_the_pair_is_not_enough(env: Env, held: tuple[str, ...], missing: str) -> None:
    env.grant_sync(methods=held)
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    assert not decision.allowed
    assert f"Messages/{missing}" in decision.reason


def test_an_expired_grant_is_refused_and_expiry_ends_a_decision(env: Env) -> None:
    granted = env.world.clock.now
    env.grant_sync(expires=add_seconds(granted, 60))
    refused = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    assert not refused.allowed and "GrantAuthorizationGrantExpired" in refused.reason

    ids = env.grant_sync(expires=add_seconds(NOW, 3600))
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    assert decision.allowed and decision.grant_ids == (ids["Read"], ids["Query"])
    assert decision.recheck_at == add_seconds(NOW, 3600)
    message = next(iter(env.stored().values()))
    assert env.authz.may_read(env.alice.did, decision, message)
    env.clock.now = add_seconds(NOW, 3600)  # the grant's dateExpires: no longer active
    assert not env.authz.may_read(env.alice.did, decision, message)
    assert not env.authz.still_valid(env.alice.did, decision)
    assert "GrantAuthorizationGrantExpired" in decision.invalid_reason


def test_a_grant_not_yet_active_is_refused(env: Env) -> None:
    env.clock.now = "2030-04-01T00:00:00.000000Z"  # before the world's first message
    env.grant_sync()
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    assert not decision.allowed and "GrantAuthorizationGrantNotYetActive" in decision.reason


def test_revocation_refuses_and_ends_an_open_decision(env: Env) -> None:
    ids = env.grant_sync()
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    message = next(iter(env.stored().values()))
    assert env.authz.may_read(env.alice.did, decision, message)
    env.revoke(ids["Read"])
    # the store changed: the next per-message decision re-checks, before any still_valid
    assert not env.authz.may_read(env.alice.did, decision, message)
    assert not env.authz.still_valid(env.alice.did, decision)
    assert "GrantAuthorizationGrantRevoked" in decision.invalid_reason
    assert not env.engine_reads(ids["Read"], next(iter(env.stored())))
    again = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    assert not again.allowed and "GrantAuthorizationGrantRevoked" in again.reason


def test_revoking_the_query_grant_ends_the_decision_too(env: Env) -> None:
    ids = env.grant_sync()
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    env.revoke(ids["Query"])
    assert not env.authz.still_valid(env.alice.did, decision)
    assert f"Messages/Query grant {ids['Query']}" in decision.invalid_reason


def test_a_future_dated_revocation_counts_from_its_timestamp(env: Env) -> None:
    ids = env.grant_sync()
    revoked_at = add_seconds(NOW, 600)
    env.revoke(ids["Read"], when=revoked_at)
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    assert decision.allowed and decision.recheck_at == revoked_at
    assert_matches_engine(env, decision)  # at NOW the engine still reads: so do we
    env.clock.now = revoked_at
    cid, message = next(iter(env.stored().items()))
    assert not env.engine_reads(ids["Read"], cid, revoked_at)
    assert not env.authz.may_read(env.alice.did, decision, message)
    assert not env.authz.still_valid(env.alice.did, decision)


def test_a_revocation_written_by_another_connection_is_noticed(env: Env) -> None:
    ids = env.grant_sync()
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    message = next(iter(env.stored().values()))
    assert env.authz.may_read(env.alice.did, decision, message)
    # e.g. `p2psync grant ...` run in another process against the same store file
    other = Store(env.store.path)
    try:
        stored, _ = other.messages.query(env.alice.did, [{"recordId": ids["Read"], "isLatestBaseState": True}])
        write, data = perms.create_revocation(
            signer=env.alice, grant=PermissionGrant.parse(stored[0]), date_revoked=env.tick()
        )
        assert Dwn(other).process_message(env.alice.did, write.message, data).code == 202
    finally:
        other.close()
    assert not env.authz.may_read(env.alice.did, decision, message)
    assert not env.authz.still_valid(env.alice.did, decision)


def test_deleting_the_grant_record_ends_the_decision(env: Env) -> None:
    ids = env.grant_sync()
    decision = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    delete = create_records_delete(record_id=ids["Read"], signer=env.alice, message_timestamp=env.tick())
    env.process(env.alice, delete)
    assert not env.authz.still_valid(env.alice.did, decision)
    assert "GrantAuthorizationGrantMissing" in decision.invalid_reason


def test_only_the_tenants_messages_grants_count(env: Env) -> None:
    bob = env.world.bob
    # Records grants (even for reading) are no sync grant
    for method in ("Read", "Query"):
        granted = env.tick()
        write, data = perms.create_grant(
            signer=env.alice,
            granted_to=env.node.did,
            date_granted=granted,
            date_expires=add_seconds(granted, 10**7),
            scope={"interface": "Records", "method": method, "protocol": CHAT},
        )
        env.process(env.alice, write.message, data)
    # a sync grant to someone else does not help the node
    env.grant_sync(grantee=env.world.carol)
    # nor does bob's sync grant, kept in bob's DWN in the same store
    env.grant_sync(tenant=bob)
    assert not env.authz.reader(env.alice.did, env.node.did, GLOBAL).allowed
    assert env.authz.reader(env.alice.did, env.world.carol.did, GLOBAL).allowed
    from_bob = env.authz.reader(bob.did, env.node.did, GLOBAL)
    assert from_bob.allowed
    # a decision answers for its own tenant only
    assert not env.authz.may_read(env.alice.did, from_bob, next(iter(env.stored().values())))


# --------------------------------------------------------------------------- protocol-scoped grants


def test_a_protocol_scoped_grant_reads_its_protocol_only(env: Env) -> None:
    ids = env.grant_sync(protocol=CHAT)
    refused = env.authz.reader(env.alice.did, env.node.did, GLOBAL)
    assert not refused.allowed and "global collection" in refused.reason
    other = env.authz.reader(env.alice.did, env.node.did, SyncScope.for_protocol(OTHER))
    assert not other.allowed and OTHER in other.reason

    for scope in (SyncScope.for_protocol(CHAT), SyncScope.subset(CHAT, ["thread"])):
        decision = env.authz.reader(env.alice.did, env.node.did, scope)
        assert decision.allowed and decision.grant_ids == (ids["Read"], ids["Query"])
        stored = env.stored().values()
        chat = [m for m in stored if m["descriptor"].get("protocol") == CHAT]
        elsewhere = [m for m in stored if m["descriptor"].get("protocol") == OTHER]
        assert chat and elsewhere
        assert all(env.authz.may_read(env.alice.did, decision, m) for m in chat)
        assert not any(env.authz.may_read(env.alice.did, decision, m) for m in elsewhere)


def test_per_message_decisions_equal_the_engines_messages_read(env: Env) -> None:
    env.grant_sync(protocol=CHAT)
    decision = env.authz.reader(env.alice.did, env.node.did, SyncScope.for_protocol(CHAT))
    counts = assert_matches_engine(env, decision)
    # CHAT's configure, its 5 records, a delete, and the permission records about CHAT (carol's
    # grant, its revocation, her request, the node's own 2 grants) pass; OTHER's configure and
    # record, the record without a protocol, OTHER's grant and revocation, and the grant only
    # tagged with CHAT do not
    assert counts == {True: 12, False: 6}

    env.grant_sync(protocol=OTHER)
    decision = env.authz.reader(env.alice.did, env.node.did, SyncScope.for_protocol(OTHER))
    counts = assert_matches_engine(env, decision)
    assert counts == {True: 6, False: 14}


def test_an_unscoped_grant_is_preferred_over_a_scoped_one(env: Env) -> None:
    env.grant_sync(protocol=CHAT)
    unscoped = env.grant_sync()
    decision = env.authz.reader(env.alice.did, env.node.did, SyncScope.for_protocol(CHAT))
    assert decision.grant_ids == (unscoped["Read"], unscoped["Query"])
    counts = assert_matches_engine(env, decision)
    assert counts[False] == 0


def test_the_store_changing_under_an_open_decision_keeps_it_exact(env: Env) -> None:
    env.grant_sync(protocol=CHAT)
    decision = env.authz.reader(env.alice.did, env.node.did, SyncScope.for_protocol(CHAT))
    assert_matches_engine(env, decision)
    # new messages of both protocols, and a delete whose record must be looked up afresh
    now = env.tick()
    write = RecordsWrite.create(
        signer=env.alice, data=b"late", protocol=OTHER, protocol_path="item", message_timestamp=now, date_created=now
    )
    env.process(env.alice, write.message, b"late")
    delete = create_records_delete(record_id=write.message["recordId"], signer=env.alice, message_timestamp=env.tick())
    env.process(env.alice, delete)
    env.world.write("late-thread", env.world.bob, "thread", b"late thread")
    late = env.world.steps["late-thread"]
    env.process(env.alice, late.message, late.data)
    assert not env.authz.may_read(env.alice.did, decision, delete)
    assert env.authz.may_read(env.alice.did, decision, late.message)
    assert_matches_engine(env, decision)


# --------------------------------------------------------------------------- authoring


def test_sync_grant_messages_shape(env: Env) -> None:
    granted = "2030-05-02T03:04:05.678901Z"
    pairs = sync_grant_messages(env.alice, env.node.did, protocol=CHAT, date_granted=granted)
    assert len(pairs) == 2
    scopes = []
    for message, data in pairs:
        descriptor = message["descriptor"]
        assert descriptor["protocol"] == perms.PERMISSIONS_PROTOCOL_URI
        assert descriptor["protocolPath"] == perms.GRANT_PATH
        assert descriptor["recipient"] == env.node.did
        assert descriptor["dateCreated"] == descriptor["messageTimestamp"] == granted
        assert descriptor["tags"] == {"protocol": CHAT}
        body = json.loads(data)
        assert body["dateExpires"] == "2031-05-02T03:04:05.678901Z"
        scopes.append(body["scope"])
        env.process(env.alice, message, data)
    assert scopes == [
        {"interface": "Messages", "method": "Read", "protocol": CHAT},
        {"interface": "Messages", "method": "Query", "protocol": CHAT},
    ]
    unscoped = sync_grant_messages(env.alice, env.node.did, date_granted=granted, expires="2030-06-01T00:00:00.000000Z")
    for message, data in unscoped:
        assert "tags" not in message["descriptor"]
        assert "protocol" not in json.loads(data)["scope"]
        assert json.loads(data)["dateExpires"] == "2030-06-01T00:00:00.000000Z"


def test_sync_grant_expiry_defaults_and_checks(env: Env) -> None:
    leap = sync_grant_messages(env.alice, env.node.did, date_granted="2032-02-29T12:00:00.000000Z")
    assert json.loads(leap[0][1])["dateExpires"] == "2033-02-28T12:00:00.000000Z"
    with pytest.raises(DwnError) as excinfo:
        sync_grant_messages(
            env.alice, env.node.did, date_granted="2030-05-02T00:00:00.000000Z", expires="2030-05-02T00:00:00.000000Z"
        )
    assert excinfo.value.code == "SyncGrantExpiryInvalid"
    fresh = sync_grant_messages(env.alice, env.node.did)  # now, for a year
    created = fresh[0][0]["descriptor"]["dateCreated"]
    assert json.loads(fresh[0][1])["dateExpires"][4:] == created[4:]
    assert int(json.loads(fresh[0][1])["dateExpires"][:4]) == int(created[:4]) + 1
