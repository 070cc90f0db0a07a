"""A protocol definition replaced by a newer one stays in the replication log.

The reference prunes an older ProtocolsConfigure from its store and its event log. But the
records written while it was in force are judged by it, so a replica that never received it
admits a different set than one that did (found by the simulator: `p2psync sim --peers 3
--steps 100 --seed 94 --topology mesh --faults heavy --scopes mixed`). p2psync keeps the
entry, lists it to peers from the archive, and hides it from MessagesQuery, which answers as
the reference's log does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from p2psync.dwn import messages_interface as msg
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure, ProtocolsQuery
from p2psync.dwn.replication_types import Applied, Superseded
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import add_seconds
from p2psync.state.local import LocalStoreFetcher, reconcile

CHAT = "https://example.com/chat"
EPOCH = "2030-01-01T00:00:00.000000Z"


def _at(second: int) -> str:
    return add_seconds(EPOCH, second)


def _definition(version: int) -> dict[str, Any]:
    types: dict[str, Any] = {"thread": {}, **{f"v{n}": {} for n in range(version)}}
    return {"protocol": CHAT, "published": True, "types": types, "structure": {"thread": {}}}


def _configure(alice: Identity, version: int, second: int) -> dict[str, Any]:
    return ProtocolsConfigure.create(definition=_definition(version), signer=alice,
                                     message_timestamp=_at(second)).message


def _logged(dwn: Dwn, tenant: str) -> list[str]:
    return [cid for _, cid in dwn.store.events.read(tenant)]


def _queried(dwn: Dwn, alice: Identity) -> tuple[list[str], list[str]]:
    """(MessagesQuery's CIDs, ProtocolsQuery's CIDs) as the tenant asks."""
    messages = dwn.process_message(alice.did, msg.create_messages_query(signer=alice, message_timestamp=_at(99)))
    protocols = dwn.process_message(alice.did, ProtocolsQuery.create(signer=alice, message_timestamp=_at(99)).message)
    assert messages.code == 200 and protocols.code == 200, (messages.detail, protocols.detail)
    return ([e["cid"] for e in messages.entries or []],
            [message_cid(e) for e in protocols.entries or []])


def test_a_replaced_definition_stays_listed_to_replicas_and_not_to_queries(tmp_path: Path, alice: Identity) -> None:
    dwn = Dwn(Store(tmp_path / "a.db"))
    first, second = _configure(alice, 1, 1), _configure(alice, 2, 2)
    for message in (first, second):
        assert dwn.process_message(alice.did, message).code == 202
    c1, c2 = message_cid(first), message_cid(second)

    assert _logged(dwn, alice.did) == [c1, c2]  # the replaced one keeps its position
    assert _queried(dwn, alice) == ([c2], [c2])  # as the reference answers
    assert not dwn.store.messages.has(alice.did, c1)

    fetcher = LocalStoreFetcher(dwn.store)
    page = fetcher.log_page(alice.did, 0, 10)
    assert [cid for _, cid, _ in page] == [c1, c2]
    listed = fetcher.listed_entry(alice.did, c1, page[0][2])
    assert listed is not None and listed[0].message == first and listed[1] is None
    by_cid = fetcher.entry_by_cid(alice.did, c1)
    assert by_cid is not None and by_cid.message == first
    dwn.close()


def test_a_definition_that_arrives_after_its_successor_is_archived_and_relayed(
    tmp_path: Path, alice: Identity
) -> None:
    first, second = _configure(alice, 1, 1), _configure(alice, 2, 2)
    c1, c2 = message_cid(first), message_cid(second)
    relay = Dwn(Store(tmp_path / "relay.db"))
    assert isinstance(relay.apply_replicated_message(alice.did, second), Applied)
    # Older than what is in force here: processed at its place, then replaced again.
    assert isinstance(relay.apply_replicated_message(alice.did, first), Superseded)
    assert relay.history.holds(alice.did, c1)
    assert _logged(relay, alice.did) == [c2, c1]  # listed, so the next replica gets it too
    assert _queried(relay, alice) == ([c2], [c2])

    # The next replica in a line receives both from the relay alone.
    last = Dwn(Store(tmp_path / "last.db"))
    trio.run(reconcile, relay.store, last, alice.did)
    assert last.history.holds(alice.did, c1) and last.history.holds(alice.did, c2)
    assert sorted(_logged(last, alice.did)) == sorted([c1, c2])
    assert _queried(last, alice) == ([c2], [c2])
    relay.close()
    last.close()


def test_a_store_whose_log_dropped_replaced_definitions_lists_them_again_when_opened(
    tmp_path: Path, alice: Identity
) -> None:
    path = tmp_path / "old.db"
    dwn = Dwn(Store(path))
    first, second = _configure(alice, 1, 1), _configure(alice, 2, 2)
    for message in (first, second):
        assert dwn.process_message(alice.did, message).code == 202
    c1, c2 = message_cid(first), message_cid(second)
    # What a p2psync before this change left: the replaced definition's entry gone.
    dwn.store.events.delete_events_by_cid(alice.did, [c1])
    assert _logged(dwn, alice.did) == [c2]
    dwn.close()

    reopened = Dwn(Store(path))
    assert _logged(reopened, alice.did) == [c2, c1]  # a new position: pullers past c2 get it
    assert reopened.history.list_superseded_definitions() == 0  # once
    assert _queried(reopened, alice) == ([c2], [c2])
    reopened.close()
