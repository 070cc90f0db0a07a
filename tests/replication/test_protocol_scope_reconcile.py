"""A `protocol` scope reconciles the set its source lists, not only the protocol's messages.

A source lists a protocol scope its protocol's messages and every permission record (the
effective listing, replication-state.md rule 2): a grantee's read is judged with them. A
round that reconciles instead of replaying (a first round with a non-empty replica, a gap)
resumes after the source's log head, so what the reconciled set leaves out is never listed:
a grant left out would let bob read on the source and refuse him on the replica.

Real stores and signatures, two protocol objects pumped against each other, no sockets.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from p2psync.dwn import permissions
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_query, create_records_read
from p2psync.dwn.store import Store
from p2psync.replication.hello import REVS, ROLE_RECORDS, new_hello
from p2psync.replication.protocol import ReplicationProtocol
from p2psync.replication.scope import SyncScope
from p2psync.replication.stats import SyncStats
from p2psync.state.committer import GroupCommitter
from p2psync.state.copies import CheckpointCopies, store_id
from p2psync.state.ledger import Ledger
from p2psync.state.service import StoreService
from tests.replication.support import seeded
from tests.replication.test_protocol_pump import Side, Wire, run
from tests.replication.test_shuffle import _query_answers
from tests.replication.test_subset_sync import FORUM, Author, forum

Message = dict[str, Any]


def _side(path: Path, name: str, owner: Identity, *, active: bool) -> Side:
    """A peer of the tenant's own (it proves the tenant's DID: a reader of everything)."""
    store = Store(path)
    service = StoreService(store, dwn=Dwn(store), ledger=Ledger.for_store(store), copies=CheckpointCopies(store),
                           committer=GroupCommitter(store))
    mine = new_hello(owner.did, store_id(store), name, capabilities=(REVS, ROLE_RECORDS))
    return Side(name, store, service, ReplicationProtocol(identity=owner, mine=mine, active=active))


def test_a_reconciling_first_round_brings_the_grants_too(tmp_path: Path) -> None:
    alice, bob = seeded("ae-scope-alice"), seeded("ae-scope-bob")
    tenant = alice.did
    author = Author(Dwn(Store(tmp_path / "source.db")), alice)
    shared: list[tuple[Message, bytes | None]] = []
    process = author.dwn.process_message

    def noted(tenant: str, message: Message, data: bytes | None = None) -> Any:
        shared.append((message, data))
        return process(tenant, message, data)

    author.dwn.process_message = noted  # type: ignore[method-assign]
    author.process(ProtocolsConfigure.create(definition=forum(1), signer=alice,
                                             message_timestamp=author.clock.tick()).message)
    for _ in range(8):
        author.write("thread")
    author.dwn.process_message = process  # type: ignore[method-assign]
    thread = author.write("thread")
    grant, grant_data = permissions.create_grant(
        signer=alice, granted_to=bob.did, date_granted=author.clock.tick(),
        date_expires="2099-01-01T00:00:00.000000Z", scope={"interface": "Records", "method": "Read", "protocol": FORUM})
    author.process(grant.message, grant_data)
    other, other_data = permissions.create_grant(  # another protocol's: listed with every scope
        signer=alice, granted_to=bob.did, date_granted=author.clock.tick(),
        date_expires="2099-01-01T00:00:00.000000Z", scope={"interface": "Records", "method": "Query",
                                                            "protocol": "https://p2psync.example/elsewhere"})
    author.process(other.message, other_data)
    author.dwn.close()
    # The replica holds most of the protocol already (from another peer): the first round
    # between the two reconciles (3 of 12 differ) instead of replaying the source's log.
    replica_dwn = Dwn(Store(tmp_path / "replica.db"))
    for message, data in shared:
        assert replica_dwn.process_message(tenant, message, data).code == 202
    replica_dwn.close()

    source = _side(tmp_path / "source.db", "source", alice, active=False)
    replica = _side(tmp_path / "replica.db", "replica", alice, active=True)
    wire = Wire(source, replica, random.Random(31))
    source.proto.start_hello()
    run(wire, replica.proto.start_hello())
    totals: dict[str, SyncStats] = {}
    operation, _ = replica.proto.sync(tenant=tenant, scope=SyncScope.for_protocol(FORUM),
                                      local_store_id=store_id(replica.store), pull=True, push=False, batch=3,
                                      totals=totals)
    run(wire, operation)
    assert wire.closed == []
    assert totals["pull"].reconciled == 3  # the thread and both grants, by CID
    ts = author.clock.tick()
    reads = [(tenant, m) for m in (
        create_records_read(signer=bob, filter={"recordId": thread.record_id},
                            permission_grant_id=grant.record_id, message_timestamp=ts),
        create_records_query(signer=alice, filter={"protocol": permissions.PERMISSIONS_PROTOCOL_URI},
                             message_timestamp=ts),
    )]
    want = _query_answers(Dwn(source.store), reads)
    assert want[0][0] == 200 and len(want[1][1]) == 2
    assert _query_answers(Dwn(replica.store), reads) == want
    source.store.close()
    replica.store.close()
