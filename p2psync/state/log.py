"""The store side of progress tokens: replay bounds, gap checks and token reads over a
store's event log (replication-state.md). The token and gap types are pure and live in
:mod:`p2psync.replication.tokens`."""

from __future__ import annotations

from p2psync.dwn.store import Store
from p2psync.replication.tokens import (
    NO_COMPACTION,
    ProgressGap,
    ProgressGapError,
    ProgressToken,
    ReplayBounds,
    gap_for,
)

__all__ = ["check_token", "read_tokens", "replay_bounds"]


# --------------------------------------------------------------------------- store adapters
#
# The engine's EventLog has no "bounds" call yet (the RFC's Gate A asks for one: oldest and
# latest per tenant stream), so the two figures it lacks are read from its tables directly.
# Read-only; replace with EventLog methods when the store grows them.


def replay_bounds(store: Store, tenant: str, floor: int = NO_COMPACTION) -> ReplayBounds | None:
    """The replay bounds of ``tenant``'s log, or None when this store has no log for it.

    Never creates the tenant: a remote asking about a tenant we do not hold must not make us
    allocate a stream for it.
    """
    tid = store.tenant_id(tenant, create=False)
    if tid is None:
        return None
    stream_id, epoch = store.events.stream(tenant)
    next_position = int(store.scalar("SELECT next_position FROM tenants WHERE id=?", (tid,)))
    first = store.events.read(tenant, after=-1, limit=1)
    last = store.conn.execute(
        "SELECT position, cid FROM events WHERE tenant=? ORDER BY position DESC LIMIT 1", (tid,)
    ).fetchone()
    return ReplayBounds(
        stream_id=stream_id,
        epoch=epoch,
        next_position=next_position,
        oldest=ProgressToken(stream_id, epoch, first[0][0], first[0][1]) if first else None,
        latest=None if last is None else ProgressToken(stream_id, epoch, int(last[0]), str(last[1])),
        floor=floor,
    )


def _cid_at(store: Store, tenant: str, position: int) -> str | None:
    entries = store.events.read(tenant, after=position - 1, limit=1)
    return entries[0][1] if entries and entries[0][0] == position else None


def check_token(store: Store, tenant: str, token: ProgressToken, floor: int = NO_COMPACTION) -> ProgressGap | None:
    """Whether ``token`` (a consumer's ``since``) can be served from ``tenant``'s log here.

    None: replay every entry after ``token.position``. A ``ProgressGap`` otherwise; a tenant
    this store holds no log for answers ``stream_mismatch`` with no available tokens.
    ``floor`` is the log's compaction horizon (``NO_COMPACTION``: we never compact yet).
    """
    bounds = replay_bounds(store, tenant, floor)
    if bounds is None:
        return ProgressGap(token, None, None, "stream_mismatch")
    same_domain = token.domain == (bounds.stream_id, bounds.epoch)
    cid = _cid_at(store, tenant, token.position) if same_domain and token.position < bounds.next_position else None
    return gap_for(token, bounds, cid)


def read_tokens(
    store: Store, tenant: str, since: ProgressToken | None, limit: int | None = None
) -> list[ProgressToken]:
    """The source side of a pull: tokens of the entries after ``since`` (all when None).

    Raises ``ProgressGapError`` (410) when ``since`` cannot be served.
    """
    if since is not None:
        gap = check_token(store, tenant, since)
        if gap is not None:
            raise ProgressGapError(gap)
    if store.tenant_id(tenant, create=False) is None:
        return []
    stream_id, epoch = store.events.stream(tenant)
    after = since.position if since is not None else -1
    return [ProgressToken(stream_id, epoch, p, c) for p, c in store.events.read(tenant, after=after, limit=limit)]
