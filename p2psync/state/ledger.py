"""The replication ledger: links, their directional checkpoints and their states, in SQLite.

A *link* is one replication relation ``(tenant, remote peer DID, scopeId)``. The ledger keeps,
per link, the pull and push ``DirectionCheckpoint`` documents and the link's state
(``initial``, ``live``, ``degraded_poll``, ``repairing``, ``paused``) with its failure count
and times. It is the consumer-owned durable state of the causal scoped replication RFC, and
the store behind ``getCheckpoint``/``setCheckpoint`` (Couchbase's MVCC checkpoints).

Guarantees:

- **Atomic**: every call is one SQLite transaction (``BEGIN IMMEDIATE``, so two writers
  serialize instead of failing on a stale snapshot); a crash leaves the old state whole.
- **Monotonic**: a checkpoint's ``receivedToken`` and ``contiguousAppliedToken`` never move
  backwards and never change domain (``CheckpointRegression``); the only way back is
  ``reset_checkpoint``, allowed while the link is ``repairing`` and logged.
- **Compare-and-set**: each checkpoint document has a revision ``rev`` =
  ``"<generation>-<32 hex>"``: the generation counts commits of the document from 1, the hex
  is the first 128 bits of sha256 over the document's DAG-CBOR bytes. ``set_checkpoint``
  commits only when given the stored ``rev`` (None for a document not yet written), else
  ``CheckpointRevConflict`` (409). The hash half means a rev still names one body even if a
  restored backup replays generation numbers.
- **Durable before return**: a call returns after COMMIT. With WAL and
  ``synchronous=NORMAL`` (the store's setting) a commit survives a process crash; use
  ``synchronous="FULL"`` to survive power loss too. Share the store's connection
  (``Ledger.for_store``) so a checkpoint can never be durable while the messages it covers
  are not: in one WAL file, commits become durable in order.

State changes are events: each is a row of ``ledger_transitions`` (``transitions()``), a log
record on the ``p2psync.state.ledger`` logger with the RFC's log fields, and a call to
every listener (``add_listener``) after the commit. Checkpoint commits are events too
(``CheckpointCommitted``), for metrics; they are not logged as rows.

Schema: tables ``ledger_*`` only, versioned by ``ledger_meta.schema_version`` (the store owns
``PRAGMA user_version``); forward migrations in ``_MIGRATIONS``.

Sans-I/O apart from SQLite: no clock is read except through the injected ``clock``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, TypeAlias

import apsw

from p2psync import errors
from p2psync.dwn.encoding import dag_cbor_encode, json_compact
from p2psync.dwn.errors import DwnError
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import datetime_from_timestamp, timestamp_from_datetime
from p2psync.replication.checkpoint import (
    CheckpointInvalid,
    CheckpointPendingOverflow,
    Direction,
    DirectionCheckpoint,
    LinkState,
)
from p2psync.replication.scope import SyncScope
from p2psync.replication.tokens import ProgressToken
from p2psync.replication.window import Step

__all__ = [
    "ALLOWED_TRANSITIONS",
    "RETRY_BASE_DELAY",
    "RETRY_MAX_DELAY",
    "SCHEMA_VERSION",
    "CheckpointCommitted",
    "CheckpointRegression",
    "CheckpointResetRefused",
    "CheckpointRevConflict",
    "CheckpointRevInvalid",
    "CheckpointUpdate",
    "Direction",
    "Ledger",
    "LedgerEvent",
    "LedgerSchemaTooNew",
    "Link",
    "LinkKey",
    "LinkNotFound",
    "LinkState",
    "LinkTransition",
    "LinkTransitionInvalid",
    "Step",
    "checkpoint_rev",
    "retry_delay",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 1
_SCHEMA_KEY: Final = "schema_version"

# Reconnect backoff: doubling from 1 s, capped at 5 minutes (ours: long enough not to spin on
# a peer that is away for the night, short enough that a returning laptop syncs soon).
RETRY_BASE_DELAY: Final = timedelta(seconds=1)
RETRY_MAX_DELAY: Final = timedelta(minutes=5)

# Ours: a DID is short; this bounds what a peer's hello can make us store per link.
MAX_DID_CHARS: Final = 2048


#: Allowed state changes. Every running state can fail into ``repairing`` or be ``paused``;
#: ``live`` is reached only from a state that has just caught up (initial, degraded_poll,
#: repairing); a paused link resumes through ``initial`` (it must catch up before it is live).
ALLOWED_TRANSITIONS: Final[Mapping[LinkState, frozenset[LinkState]]] = {
    LinkState.INITIAL: frozenset({LinkState.LIVE, LinkState.DEGRADED_POLL, LinkState.REPAIRING, LinkState.PAUSED}),
    LinkState.LIVE: frozenset({LinkState.DEGRADED_POLL, LinkState.REPAIRING, LinkState.PAUSED}),
    LinkState.DEGRADED_POLL: frozenset({LinkState.LIVE, LinkState.REPAIRING, LinkState.PAUSED}),
    LinkState.REPAIRING: frozenset({LinkState.LIVE, LinkState.DEGRADED_POLL, LinkState.PAUSED}),
    LinkState.PAUSED: frozenset({LinkState.INITIAL}),
}

_REV_RE: Final = re.compile(r"[1-9][0-9]{0,17}-[0-9a-f]{32}")


# --------------------------------------------------------------------------- errors


class LedgerSchemaTooNew(DwnError):
    def __init__(self, detail: str) -> None:
        super().__init__("LedgerSchemaTooNew", detail, 500)


class LinkNotFound(DwnError):
    def __init__(self, key: LinkKey) -> None:
        super().__init__("LinkNotFound", f"no link {key}", 404)


class LinkTransitionInvalid(DwnError):
    def __init__(self, key: LinkKey, current: LinkState, to: LinkState) -> None:
        super().__init__("LinkTransitionInvalid", f"link {key} cannot go from {current} to {to}", 409)
        self.current = current
        self.to = to


class CheckpointRevInvalid(DwnError):
    def __init__(self, rev: object) -> None:
        super().__init__("CheckpointRevInvalid", f"{rev!r} is not a checkpoint rev", 400)


class CheckpointRevConflict(errors.CheckpointRevConflict):
    """The rev given is not the stored one: re-read (``get_checkpoint``) and retry. The same
    409 refusal as a stale ``setCheckpoint`` (one class for every checkpoint rev conflict)."""

    status: ClassVar[int] = 409  # as a DwnError's would read

    def __init__(self, given: str | None, current: str | None) -> None:
        super().__init__(current, f"rev {given} is stale; the checkpoint is at {current}")


class CheckpointRegression(DwnError):
    """The new document would move a token backwards or into another domain."""

    def __init__(self, detail: str) -> None:
        super().__init__("CheckpointRegression", detail, 409)


class CheckpointResetRefused(DwnError):
    def __init__(self, key: LinkKey, state: LinkState) -> None:
        super().__init__("CheckpointResetRefused", f"link {key} is {state}; reset only while repairing", 409)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class LinkKey:
    """A link's identity: ``(tenant DID, remote peer DID, scopeId)``."""

    tenant: str
    remote: str
    scope_id: str

    def __str__(self) -> str:
        return f"{self.tenant} <-> {self.remote} [{self.scope_id}]"


@dataclass(frozen=True, slots=True)
class Link:
    """A link's row: scope, state, failure bookkeeping (checkpoints are read separately)."""

    key: LinkKey
    scope: SyncScope
    state: LinkState
    failure_count: int
    last_success_at: datetime | None
    last_failure_at: datetime | None
    next_retry_at: datetime | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class LinkTransition:
    """One state change (``kind="state"``), checkpoint reset or rewind (``checkpoint_reset``, ``checkpoint_rewind``)."""

    id: int
    key: LinkKey
    at: datetime
    kind: Literal["state", "checkpoint_reset", "checkpoint_rewind"]
    state_from: LinkState
    state_to: LinkState
    reason: str
    direction: Direction | None
    token: ProgressToken | None
    contiguous_token: ProgressToken | None
    error_code: str | None

    def log_fields(self) -> dict[str, Any]:
        """The RFC's log fields (tenantDid, remoteEndpoint, scopeId, direction, stateFrom, ...)."""
        return {
            "tenantDid": self.key.tenant,
            "remoteEndpoint": self.key.remote,
            "scopeId": self.key.scope_id,
            "direction": None if self.direction is None else str(self.direction),
            "stateFrom": str(self.state_from),
            "stateTo": str(self.state_to),
            "token": None if self.token is None else self.token.to_wire(),
            "contiguousToken": None if self.contiguous_token is None else self.contiguous_token.to_wire(),
            "errorCode": self.error_code,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class CheckpointCommitted:
    """A checkpoint document was committed with a new rev."""

    key: LinkKey
    direction: Direction
    rev: str
    checkpoint: DirectionCheckpoint


LedgerEvent: TypeAlias = LinkTransition | CheckpointCommitted
Listener: TypeAlias = Callable[[LedgerEvent], None]
#: One step of the mark-applied algorithm: ``("received" | "applied", token)``.


@dataclass(frozen=True, slots=True)
class CheckpointUpdate:
    """What a ``record_*`` call left: the checkpoint, its rev, the link state, and whether
    the pending list overflowed (then the link was moved to ``repairing``)."""

    checkpoint: DirectionCheckpoint
    rev: str | None
    state: LinkState
    overflowed: bool


def retry_delay(failures: int) -> timedelta:
    """Backoff after ``failures`` consecutive failures: 1 s, 2 s, 4 s, ... up to 5 minutes."""
    if failures <= 0:
        return timedelta(0)
    return min(RETRY_MAX_DELAY, RETRY_BASE_DELAY * (1 << min(failures - 1, 20)))


def checkpoint_rev(generation: int, checkpoint: DirectionCheckpoint) -> str:
    """``"<generation>-<first 32 hex of sha256(DAG-CBOR(document))>"``."""
    digest = hashlib.sha256(dag_cbor_encode(checkpoint.to_wire())).hexdigest()[:32]
    return f"{generation}-{digest}"


def _check_forward(old: DirectionCheckpoint, new: DirectionCheckpoint) -> None:
    """Refuse a document that moves ``old``'s tokens backwards or to another domain."""
    if old.is_empty:
        return
    if new.domain != old.domain:
        raise CheckpointRegression(
            f"the checkpoint is in stream {old.domain}; a new domain needs reset_checkpoint during repair"
        )
    for name in ("received_token", "contiguous_applied_token"):
        before: ProgressToken | None = getattr(old, name)
        after: ProgressToken | None = getattr(new, name)
        if before is not None and (after is None or after < before):
            raise CheckpointRegression(f"{name} would move back from {before!r} to {after!r}")


def _did(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.startswith("did:") or len(value) > MAX_DID_CHARS:
        raise DwnError("LedgerInvalidDid", f"{name} must be a DID (did:...), got {value!r}", 400)
    return value


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime_from_timestamp(value)


def _token_json(token: ProgressToken | None) -> str | None:
    return None if token is None else json_compact(token.to_wire())


def _transition_of(r: Sequence[Any]) -> LinkTransition:
    """A ``ledger_transitions`` row joined with its link's key (the columns ``transitions`` reads)."""
    return LinkTransition(
        int(r[0]), LinkKey(r[1], r[2], r[3]), datetime_from_timestamp(r[4]), r[5], LinkState(r[6]),
        LinkState(r[7]), r[8], None if r[9] is None else Direction(r[9]), _token_of(r[10]), _token_of(r[11]), r[12],
    )


def _token_of(text: str | None) -> ProgressToken | None:
    return None if text is None else ProgressToken.from_wire(json.loads(text))


_MIGRATIONS: Final[dict[int, str]] = {
    1: """
    CREATE TABLE ledger_links(
        id INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        remote TEXT NOT NULL,            -- the remote peer's DID
        scope_id TEXT NOT NULL,
        scope TEXT NOT NULL,             -- canonical SyncScope (JSON)
        state TEXT NOT NULL,
        failure_count INTEGER NOT NULL DEFAULT 0,
        last_success_at TEXT,
        last_failure_at TEXT,
        next_retry_at TEXT,
        last_error TEXT,
        created_at TEXT NOT NULL
    );
    CREATE UNIQUE INDEX ledger_links_key ON ledger_links(tenant, remote, scope_id);
    CREATE TABLE ledger_checkpoints(
        link INTEGER NOT NULL REFERENCES ledger_links(id),
        direction TEXT NOT NULL CHECK (direction IN ('pull', 'push')),
        generation INTEGER NOT NULL,
        rev TEXT NOT NULL,
        body TEXT NOT NULL,              -- DirectionCheckpoint wire form (JSON)
        updated_at TEXT NOT NULL,
        PRIMARY KEY(link, direction)
    );
    CREATE TABLE ledger_transitions(
        id INTEGER PRIMARY KEY,
        link INTEGER NOT NULL REFERENCES ledger_links(id),
        at TEXT NOT NULL,
        kind TEXT NOT NULL,              -- 'state' | 'checkpoint_reset' | 'checkpoint_rewind'
        state_from TEXT NOT NULL,
        state_to TEXT NOT NULL,
        reason TEXT NOT NULL,
        direction TEXT,
        token TEXT,                      -- receivedToken of `direction` at the time (JSON)
        contiguous_token TEXT,           -- contiguousAppliedToken of `direction` (JSON)
        error_code TEXT
    );
    CREATE INDEX ledger_transitions_link ON ledger_transitions(link, id);
    """,
}

_LINK_COLUMNS: Final = (
    "id, tenant, remote, scope_id, scope, state, failure_count, last_success_at, last_failure_at,"
    " next_retry_at, last_error"
)


def _utc_now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- the ledger


class Ledger:
    """Links, checkpoints and states in SQLite (see the module docstring for guarantees).

    ``Ledger(path)`` opens (creating) its own database file; ``Ledger(connection)`` or
    ``Ledger.for_store(store)`` shares an open apsw connection — the recommended setup, one
    file and one writer per store. A ``Ledger`` is not for concurrent use from several
    threads; give each thread its own (each opens its own connection to the file).
    """

    def __init__(
        self,
        target: str | Path | apsw.Connection,
        *,
        clock: Callable[[], datetime] = _utc_now,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
    ) -> None:
        if isinstance(target, apsw.Connection):
            self.conn = target
            self._owns_connection = False
        else:
            if synchronous not in ("NORMAL", "FULL"):
                raise ValueError("synchronous must be NORMAL or FULL")
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = apsw.Connection(str(path))
            self._owns_connection = True
            self.conn.set_busy_timeout(5000)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute(f"PRAGMA synchronous={synchronous}")
            self.conn.execute("PRAGMA foreign_keys=ON")
        self._clock = clock
        self._listeners: list[Listener] = []
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    @classmethod
    def for_store(cls, store: Store, *, clock: Callable[[], datetime] = _utc_now) -> Ledger:
        """A ledger in the store's own file, on its connection (commits ordered with the data)."""
        return cls(store.conn, clock=clock)

    def close(self) -> None:
        """Close the connection if this ledger opened it (a shared one stays open)."""
        if self._owns_connection:
            self.conn.close()

    # -- plumbing --------------------------------------------------------------------------

    def _migrate(self) -> None:
        with self._write():
            self.conn.execute("CREATE TABLE IF NOT EXISTS ledger_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = self.conn.execute("SELECT value FROM ledger_meta WHERE key=?", (_SCHEMA_KEY,)).fetchone()
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise LedgerSchemaTooNew(f"the ledger has schema {version}; this p2psync knows up to {SCHEMA_VERSION}")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                self.conn.execute(_MIGRATIONS[target])
                self.conn.execute(
                    "INSERT INTO ledger_meta(key, value) VALUES(?, ?)"
                    " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (_SCHEMA_KEY, str(target)),
                )

    @contextmanager
    def _write(self) -> Iterator[list[LedgerEvent]]:
        """One write transaction; yields a list of events fired to listeners once it commits.

        Inside a transaction the caller opened on a shared connection, the writes join it (a
        savepoint) and the events fire when this part is done; the caller's COMMIT is theirs.
        """
        events: list[LedgerEvent] = []
        if self.conn.in_transaction:
            with self.conn:
                yield events
        else:
            # IMMEDIATE takes the write lock up front: a second writer waits for the first to
            # commit and then reads its result, so compare-and-set sees the latest rev.
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield events
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:  # also when COMMIT itself failed
                    self.conn.execute("ROLLBACK")
                raise
        self._fire(events)

    def _fire(self, events: Sequence[LedgerEvent]) -> None:
        for event in events:
            if isinstance(event, LinkTransition):
                logger.info("link %s: %s -> %s (%s)", event.key, event.state_from, event.state_to, event.reason,
                            extra={"p2psync": event.log_fields()})
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception:
                    # A listener is an observer: its failure must not undo a committed change.
                    logger.exception("ledger listener %r failed on %r", listener, event)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with every event after it commits; returns a function that removes it."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def _now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError("the ledger clock must return aware datetimes")
        return now

    def _link_row(self, key: LinkKey) -> tuple[Any, ...]:
        row = self.conn.execute(
            f"SELECT {_LINK_COLUMNS} FROM ledger_links WHERE tenant=? AND remote=? AND scope_id=?",
            (key.tenant, key.remote, key.scope_id),
        ).fetchone()
        if row is None:
            raise LinkNotFound(key)
        return tuple(row)

    @staticmethod
    def _link_of(row: Sequence[Any]) -> Link:
        return Link(
            key=LinkKey(row[1], row[2], row[3]),
            scope=SyncScope.from_wire(json.loads(row[4])),
            state=LinkState(row[5]),
            failure_count=int(row[6]),
            last_success_at=_time(row[7]),
            last_failure_at=_time(row[8]),
            next_retry_at=_time(row[9]),
            last_error=row[10],
        )

    def _load(self, link_id: int, direction: Direction) -> tuple[DirectionCheckpoint, int, str | None]:
        row = self.conn.execute(
            "SELECT generation, rev, body FROM ledger_checkpoints WHERE link=? AND direction=?",
            (link_id, str(direction)),
        ).fetchone()
        if row is None:
            return DirectionCheckpoint(), 0, None
        return DirectionCheckpoint.from_wire(json.loads(row[2])), int(row[0]), str(row[1])

    def _store(
        self,
        events: list[LedgerEvent],
        key: LinkKey,
        link_id: int,
        direction: Direction,
        generation: int,
        checkpoint: DirectionCheckpoint,
    ) -> str:
        rev = checkpoint_rev(generation + 1, checkpoint)
        self.conn.execute(
            "INSERT INTO ledger_checkpoints(link, direction, generation, rev, body, updated_at) VALUES(?,?,?,?,?,?)"
            " ON CONFLICT(link, direction) DO UPDATE SET generation=excluded.generation, rev=excluded.rev,"
            " body=excluded.body, updated_at=excluded.updated_at",
            (link_id, str(direction), generation + 1, rev, json_compact(checkpoint.to_wire()),
             timestamp_from_datetime(self._now())),
        )
        events.append(CheckpointCommitted(key, direction, rev, checkpoint))
        return rev

    def _log(
        self,
        events: list[LedgerEvent],
        key: LinkKey,
        link_id: int,
        kind: Literal["state", "checkpoint_reset", "checkpoint_rewind"],
        state_from: LinkState,
        state_to: LinkState,
        reason: str,
        direction: Direction | None,
        error_code: str | None,
    ) -> None:
        token = contiguous = None
        if direction is not None:
            checkpoint, _, _ = self._load(link_id, direction)
            token, contiguous = checkpoint.received_token, checkpoint.contiguous_applied_token
        at = self._now()
        self.conn.execute(
            "INSERT INTO ledger_transitions(link, at, kind, state_from, state_to, reason, direction, token,"
            " contiguous_token, error_code) VALUES(?,?,?,?,?,?,?,?,?,?)",
            (link_id, timestamp_from_datetime(at), kind, str(state_from), str(state_to), reason,
             None if direction is None else str(direction), _token_json(token), _token_json(contiguous), error_code),
        )
        events.append(LinkTransition(
            self.conn.last_insert_rowid(), key, at.astimezone(UTC), kind,
            state_from, state_to, reason, direction, token, contiguous, error_code,
        ))

    def _set_state(
        self,
        events: list[LedgerEvent],
        row: Sequence[Any],
        to: LinkState,
        reason: str,
        direction: Direction | None,
        error_code: str | None,
    ) -> None:
        key = LinkKey(row[1], row[2], row[3])
        current = LinkState(row[5])
        if to == current:
            return
        if to not in ALLOWED_TRANSITIONS[current]:
            raise LinkTransitionInvalid(key, current, to)
        self.conn.execute("UPDATE ledger_links SET state=? WHERE id=?", (str(to), row[0]))
        self._log(events, key, int(row[0]), "state", current, to, reason, direction, error_code)

    # -- links -----------------------------------------------------------------------------

    def open_link(self, tenant: str, remote: str, scope: SyncScope) -> Link:
        """The link ``(tenant, remote, scope.scope_id)``, created in state ``initial`` if new."""
        key = LinkKey(_did(tenant, "tenant"), _did(remote, "remote"), scope.scope_id)
        with self._write():
            try:
                return self._link_of(self._link_row(key))
            except LinkNotFound:
                pass
            self.conn.execute(
                "INSERT INTO ledger_links(tenant, remote, scope_id, scope, state, created_at) VALUES(?,?,?,?,?,?)",
                (tenant, remote, scope.scope_id, json_compact(scope.to_wire()), str(LinkState.INITIAL),
                 timestamp_from_datetime(self._now())),
            )
            return self._link_of(self._link_row(key))

    def link(self, key: LinkKey) -> Link:
        """The stored link (``LinkNotFound`` when there is none)."""
        return self._link_of(self._link_row(key))

    def links(self, tenant: str | None = None, remote: str | None = None) -> list[Link]:
        """All links, or those of one tenant and/or remote, in creation order."""
        sql = f"SELECT {_LINK_COLUMNS} FROM ledger_links WHERE (?1 IS NULL OR tenant=?1) AND (?2 IS NULL OR remote=?2)"
        return [self._link_of(r) for r in self.conn.execute(sql + " ORDER BY id", (tenant, remote))]

    def transition(
        self,
        key: LinkKey,
        to: LinkState,
        *,
        reason: str,
        direction: Direction | None = None,
        error_code: str | None = None,
    ) -> Link:
        """Move the link to state ``to`` (``LinkTransitionInvalid`` when not allowed).

        Moving to the current state is a no-op (no row, no event): callers that see the same
        trouble twice need not check first.
        """
        with self._write() as events:
            self._set_state(events, self._link_row(key), LinkState(to), reason, direction, error_code)
            return self.link(key)

    def record_failure(self, key: LinkKey, error_code: str, *, retry_at: datetime | None = None) -> Link:
        """Count a failure: bump ``failureCount``, stamp ``lastFailureAt``, schedule ``nextRetryAt``.

        ``retry_at`` overrides the ``retry_delay`` backoff (e.g. a caller adding jitter).
        """
        now = self._now()
        with self._write():
            row = self._link_row(key)
            failures = int(row[6]) + 1
            when = retry_at if retry_at is not None else now + retry_delay(failures)
            self.conn.execute(
                "UPDATE ledger_links SET failure_count=?, last_failure_at=?, next_retry_at=?, last_error=? WHERE id=?",
                (failures, timestamp_from_datetime(now), timestamp_from_datetime(when), error_code, row[0]),
            )
            return self.link(key)

    def record_success(self, key: LinkKey) -> Link:
        """A successful sync round: reset the failure count, stamp ``lastSuccessAt``."""
        with self._write():
            row = self._link_row(key)
            self.conn.execute(
                "UPDATE ledger_links SET failure_count=0, last_success_at=?, next_retry_at=NULL, last_error=NULL"
                " WHERE id=?",
                (timestamp_from_datetime(self._now()), row[0]),
            )
            return self.link(key)

    def transitions(self, key: LinkKey | None = None, after: int = 0, limit: int | None = None) -> list[LinkTransition]:
        """Logged state changes and resets, oldest first, with ids above ``after``."""
        sql = (
            "SELECT t.id, l.tenant, l.remote, l.scope_id, t.at, t.kind, t.state_from, t.state_to, t.reason,"
            " t.direction, t.token, t.contiguous_token, t.error_code"
            " FROM ledger_transitions t JOIN ledger_links l ON l.id = t.link WHERE t.id > ?"
        )
        args: list[Any] = [after]
        if key is not None:
            sql += " AND l.tenant=? AND l.remote=? AND l.scope_id=?"
            args += [key.tenant, key.remote, key.scope_id]
        sql += " ORDER BY t.id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [_transition_of(r) for r in self.conn.execute(sql, args)]

    def last_entered(self, key: LinkKey, state: LinkState) -> LinkTransition | None:
        """The latest logged change of ``key`` into ``state`` (why it is there: its reason,
        error code and direction), or None when it never entered it. One indexed row, however
        long the link's history."""
        row = self._link_row(key)
        found = self.conn.execute(
            "SELECT t.id, l.tenant, l.remote, l.scope_id, t.at, t.kind, t.state_from, t.state_to, t.reason,"
            " t.direction, t.token, t.contiguous_token, t.error_code"
            " FROM ledger_transitions t JOIN ledger_links l ON l.id = t.link"
            " WHERE t.link=? AND t.kind='state' AND t.state_to=? ORDER BY t.id DESC LIMIT 1",
            (row[0], str(LinkState(state))),
        ).fetchone()
        return None if found is None else _transition_of(found)

    # -- checkpoints -----------------------------------------------------------------------

    def get_checkpoint(self, key: LinkKey, direction: Direction) -> tuple[DirectionCheckpoint, str | None]:
        """The stored document and its rev; an empty document and None when never written."""
        row = self._link_row(key)
        checkpoint, _, rev = self._load(int(row[0]), Direction(direction))
        return checkpoint, rev

    def set_checkpoint(
        self,
        key: LinkKey,
        direction: Direction,
        body: DirectionCheckpoint | Mapping[str, Any],
        rev: str | None,
    ) -> str:
        """Compare-and-set one checkpoint document; returns the new rev after COMMIT.

        ``rev`` must be the stored rev (None when no document exists yet), else
        ``CheckpointRevConflict`` (409, carrying the current rev). The new document must not
        move ``receivedToken`` or ``contiguousAppliedToken`` back or change domain
        (``CheckpointRegression``, 409). ``body`` may be the wire object (parsed strictly).
        """
        if rev is not None and (not isinstance(rev, str) or _REV_RE.fullmatch(rev) is None):
            raise CheckpointRevInvalid(rev)
        checkpoint = body if isinstance(body, DirectionCheckpoint) else DirectionCheckpoint.from_wire(body)
        direction = Direction(direction)
        with self._write() as events:
            row = self._link_row(key)
            current, generation, current_rev = self._load(int(row[0]), direction)
            if rev != current_rev:
                raise CheckpointRevConflict(rev, current_rev)
            _check_forward(current, checkpoint)
            return self._store(events, key, int(row[0]), direction, generation, checkpoint)

    def reset_checkpoint(self, key: LinkKey, direction: Direction, rev: str | None, *, reason: str) -> str:
        """Empty one checkpoint document (compare-and-set on ``rev``); only while ``repairing``.

        The one way a checkpoint goes back: after a gap, repair restarts the direction in the
        source's new domain. Logged as a ``checkpoint_reset`` transition row.
        """
        if rev is not None and (not isinstance(rev, str) or _REV_RE.fullmatch(rev) is None):
            raise CheckpointRevInvalid(rev)
        direction = Direction(direction)
        with self._write() as events:
            row = self._link_row(key)
            state = LinkState(row[5])
            if state != LinkState.REPAIRING:
                raise CheckpointResetRefused(key, state)
            _, generation, current_rev = self._load(int(row[0]), direction)
            if rev != current_rev:
                raise CheckpointRevConflict(rev, current_rev)
            self._log(events, key, int(row[0]), "checkpoint_reset", state, state, reason, direction, None)
            return self._store(events, key, int(row[0]), direction, generation, DirectionCheckpoint())

    def rewind_checkpoint(
        self, key: LinkKey, direction: Direction, to: ProgressToken | None, *, reason: str
    ) -> tuple[DirectionCheckpoint, str]:
        """Move one direction back to the safe point ``to`` (None: the start), in any state.

        replication-profiles.md §4.4: when the local frontier and the passive's copy disagree,
        the direction restarts from the lower point. ``to`` must be at or below the current
        frontier, in its domain (anything else is ``CheckpointRegression``'s opposite and is
        refused as ``CheckpointInvalid``). Logged as a ``checkpoint_rewind`` row; a rewind to
        where the document already stands changes nothing.
        """
        direction = Direction(direction)
        with self._write() as events:
            row = self._link_row(key)
            link_id = int(row[0])
            current, generation, rev = self._load(link_id, direction)
            frontier = current.contiguous_applied_token
            if to is not None and (frontier is None or not to.same_domain(frontier) or to > frontier):
                raise CheckpointInvalid("a rewind goes to a token at or below the frontier, in its domain")
            target = DirectionCheckpoint() if to is None else DirectionCheckpoint(to, to)
            if target == current:
                return current, rev or ""
            state = LinkState(row[5])
            self._log(events, key, link_id, "checkpoint_rewind", state, state, reason, direction, None)
            return target, self._store(events, key, link_id, direction, generation, target)

    def record_received(self, key: LinkKey, direction: Direction, token: ProgressToken) -> CheckpointUpdate:
        """``DirectionCheckpoint.received`` on the stored document, committed."""
        return self.record(key, direction, [("received", token)])

    def record_applied(self, key: LinkKey, direction: Direction, token: ProgressToken) -> CheckpointUpdate:
        """``DirectionCheckpoint.applied`` on the stored document, committed."""
        return self.record(key, direction, [("applied", token)])

    def record(self, key: LinkKey, direction: Direction, steps: Iterable[Step]) -> CheckpointUpdate:
        """Run mark-applied steps on the stored document in one transaction.

        A pending overflow moves the link to ``repairing`` in the same transaction. When a
        step overflows the unapplied list, the steps before it commit with the move to
        ``repairing`` and ``CheckpointPendingOverflow`` is raised after the commit. Any other
        error (domain mismatch, fork, a token never received) rolls the whole batch back.
        A batch that changes nothing writes nothing and keeps the rev.
        """
        direction = Direction(direction)
        refused: CheckpointPendingOverflow | None = None
        with self._write() as events:
            row = self._link_row(key)
            link_id = int(row[0])
            before, generation, rev = self._load(link_id, direction)
            checkpoint, overflowed = before, False
            todo = list(steps)
            i, n = 0, len(todo)
            while i < n:
                kind, token = todo[i]
                i += 1
                if kind == "received":
                    # A settled token: both steps at once where that is simple (the window
                    # hands the pair as one token object).
                    if i < n and todo[i][1] is token and todo[i][0] == "applied":
                        settled = checkpoint.settled(token)
                        if settled is not None:
                            checkpoint = settled
                            i += 1
                            continue
                    try:
                        checkpoint = checkpoint.received(token)
                    except CheckpointPendingOverflow as exc:
                        refused = exc
                        break
                elif kind == "applied":
                    checkpoint, over = checkpoint.applied(token)
                    overflowed = overflowed or over
                else:
                    raise ValueError(f"unknown step {kind!r}")
            if checkpoint != before:
                rev = self._store(events, key, link_id, direction, generation, checkpoint)
            state = LinkState(row[5])
            if (overflowed or refused is not None) and LinkState.REPAIRING in ALLOWED_TRANSITIONS[state]:
                self._set_state(events, row, LinkState.REPAIRING, "pending_overflow", direction,
                                "CheckpointPendingOverflow")
                state = LinkState.REPAIRING
        if refused is not None:
            raise refused
        return CheckpointUpdate(checkpoint, rev, state, overflowed)

    # -- the RFC's link view ---------------------------------------------------------------

    def link_state(self, key: LinkKey) -> dict[str, Any]:
        """The RFC's ``ReplicationLinkState`` object (plus ``nextRetryAt``, ``lastError``, revs)."""
        link = self.link(key)
        pull, pull_rev = self.get_checkpoint(key, Direction.PULL)
        push, push_rev = self.get_checkpoint(key, Direction.PUSH)
        out: dict[str, Any] = {
            "tenantDid": key.tenant,
            "remoteEndpoint": key.remote,
            "scopeId": key.scope_id,
            "scope": link.scope.to_wire(),
            "pull": pull.to_wire(),
            "push": push.to_wire(),
            "state": str(link.state),
            "failureCount": link.failure_count,
        }
        for member, value in (
            ("lastSuccessAt", link.last_success_at),
            ("lastFailureAt", link.last_failure_at),
            ("nextRetryAt", link.next_retry_at),
        ):
            if value is not None:
                out[member] = timestamp_from_datetime(value)
        if link.last_error is not None:
            out["lastError"] = link.last_error
        if pull_rev is not None:
            out["pullRev"] = pull_rev
        if push_rev is not None:
            out["pushRev"] = push_rev
        return out
