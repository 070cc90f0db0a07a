"""A store's message digest: does this replica hold exactly the same messages as that one?

``store_digest(store)`` gives, per tenant that holds at least one message,
``{"messages": <count>, "digest": <64 lowercase hex>}`` where ``digest`` is the LtHash16
digest of the tenant's set of message CIDs (:mod:`p2psync.replication.lthash`: each CID's
2,048-byte SHAKE-256 element, summed lane-wise mod 2^16, then SHA-256 of the sum). It depends
only on the set — not on the order messages were stored in, nor on one stored and removed
again — so two replicas hold the same messages exactly when their digests are equal.

The digest is not computed here: the store keeps it up to date as messages are stored and
removed (:mod:`p2psync.state.setindex`), so answering costs a few reads however many messages
the store holds. ``protocol/examples/lthash-vectors.json`` lets another implementation check
its own computation; :func:`cids_digest` computes it from a list of CIDs.

Only message CIDs count: record data is bound to its message by the ``dataCid`` the message
signs, and the event log's positions are local to each store, so neither belongs in a
comparison of replicas.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from p2psync.dwn.store import Store
from p2psync.replication.lthash import lthash_digest
from p2psync.state.setindex import SetIndex

__all__ = ["cids_digest", "store_digest"]


def cids_digest(cids: Iterable[str]) -> str:
    """The digest (hex) of a set of CIDs computed from scratch: what :func:`store_digest`
    prints for a tenant holding exactly these messages."""
    return lthash_digest(cids).hex()


def store_digest(store: Store, tenant: str | None = None) -> dict[str, dict[str, Any]]:
    """``{tenant DID: {"messages": count, "digest": hex}}`` for every tenant with messages,
    from the maintained digests.

    Tenants come in DID order, so two replicas' printed digests compare with ``diff``. With
    ``tenant``, only that tenant (an empty dict when it holds no messages).
    """
    index = SetIndex(store)
    if tenant is None:
        found = index.digests()
    else:
        one = index.digest(tenant)
        found = {tenant: one} if one.count else {}
    return {did: {"messages": d.count, "digest": d.hex()} for did, d in found.items()}
