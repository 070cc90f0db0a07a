"""A store's message digest: does this replica hold exactly the same messages as that one?

``store_digest(store)`` gives, per tenant that holds at least one message,
``{"messages": <count>, "digest": <64 lowercase hex>}`` where ``digest`` is

    sha256( cid_1 "\\n" cid_2 "\\n" ... cid_n "\\n" )

over the tenant's message CIDs (the canonical base32 strings, ASCII) **sorted in ascending
byte order**, each followed by one line feed. It is what

    printf '%s\\n' $CIDS | LC_ALL=C sort | sha256sum

prints, so any implementation (or a shell) can compute it identically.

Why sorted-then-hash: it is order-independent (the store's insertion or event-log order never
enters) and exactly as collision-resistant as sha256, because a CID never contains a line
feed, so the line list is an injective encoding of the set. The alternatives are weaker:
XOR of per-CID hashes cancels pairs and is linear (collisions by Gaussian elimination), and
a sum of hashes mod 2^256 (AdHash) falls to generalized-birthday attacks unless the modulus
is far larger. Sorting costs O(n log n) and holds the CIDs in memory (~60 bytes each; 6 MB
for 100,000 messages), which is fine for a command a person runs to compare replicas.

Only message CIDs count: record data is bound to its message by the ``dataCid`` the message
signs, and the event log's positions are local to each store, so neither belongs in a
comparison of replicas.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from p2psync.dwn.store import Store

__all__ = ["cids_digest", "store_digest"]


def cids_digest(cids: Iterable[str]) -> str:
    """sha256 (hex) of the CIDs sorted in byte order, each followed by ``"\\n"``."""
    h = hashlib.sha256()
    # Sorting the encoded bytes makes the order the byte order whatever the string type's
    # collation; for ASCII CIDs it equals Python's str order and SQLite's BINARY collation.
    for cid in sorted(c.encode("ascii") for c in cids):
        h.update(cid)
        h.update(b"\n")
    return h.hexdigest()


def store_digest(store: Store, tenant: str | None = None) -> dict[str, dict[str, Any]]:
    """``{tenant DID: {"messages": count, "digest": hex}}`` for every tenant with messages.

    Tenants come in DID order, so two replicas' printed digests compare with ``diff``. With
    ``tenant``, only that tenant (an empty dict when it holds no messages).
    """
    tenants = sorted(store.tenants()) if tenant is None else [tenant]
    out: dict[str, dict[str, Any]] = {}
    for did in tenants:
        cids = store.messages.cids(did)
        if cids:
            out[did] = {"messages": len(cids), "digest": cids_digest(cids)}
    return out
