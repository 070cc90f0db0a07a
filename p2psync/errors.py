"""The one error tree of p2psync, and the two decisions every failure needs.

The bottom layer: it imports nothing from p2psync, and every other layer's errors hang below
:class:`P2PSyncError`::

    P2PSyncError
    ├── LocalMisuse                 our own caller broke an API's contract: a bug
    ├── Refusal(code, name, detail, body)
    │   │                           the peer or the input said no, as §13 names it
    │   │                           (p2psync.replication.wire.PeerError is this class)
    │   ├── CheckpointRevConflict(current)
    │   │                           setCheckpoint with a stale rev (p2psync.state.copies'
    │   │                           CopyRevConflict is this class)
    │   ├── QuotaExceeded(retry_after, local)
    │   │                           507 TenantQuotaExceeded, 429 PeerQuotaExceeded: a quota
    │   │                           of the receiving node (p2psync.state.quota)
    │   └── p2psync.replication.effects.ConnectionLost(detail)
    │                               503: the connection ended while an operation waited
    ├── InputRejected               input that broke a rule, named by a string code with an
    │   │                           HTTP-like status; as_refusal() reads it as a Refusal
    │   └── p2psync.dwn.errors.DwnError(code, detail, status)
    ├── ErrorReply                  an ERR reply as it came off the wire, not yet read (the
    │   │                           peer reads one with p2psync.peer.session.from_blip, and
    │   │                           writes a Refusal as one with to_blip)
    │   └── p2psync.blip.BlipError(domain, code, message)
    ├── Disconnected(reason)        the transport ended before the work did
    │   └── p2psync.blip.ConnectionClosed(reason, close_code=, close_text=)
    ├── HandshakeFailed             our side of hello failed; the connection is closed
    └── LocalFailure                our own side failed (the store, a port): neither the
        │                           peer's doing nor a bug
        ├── p2psync.state.committer.StoreUnavailable   (as_refusal(): 503 StoreUnavailable)
        └── p2psync.node.node.NodeError
    (p2psync.blip.ProtocolError hangs from the root: the peer broke BLIP; the transport
    closes the connection and its requests see ConnectionClosed.)

:func:`disposition` (:func:`is_retryable`) decides whether a failed round is worth another
round, from :data:`RETRY_RULES`, and :func:`retry_after` how long a refusal asks to wait;
:func:`describe` gives the one line a user sees.
:meth:`Refusal.read` makes a refusal read from the wire the class its name has.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import trio

__all__ = [
    "P2PSYNC_DOMAIN",
    "RETRY_RULES",
    "CheckpointRevConflict",
    "Disconnected",
    "Disposition",
    "ErrorReply",
    "HandshakeFailed",
    "InputRejected",
    "LocalFailure",
    "LocalMisuse",
    "P2PSyncError",
    "QuotaExceeded",
    "Refusal",
    "RetryRule",
    "as_refusal",
    "describe",
    "disposition",
    "error_name",
    "is_retryable",
    "leaf",
    "retry_after",
]

#: The error domain of the replication profiles' refusals (replication-profiles.md §13).
P2PSYNC_DOMAIN: Final = "P2PSync"


class P2PSyncError(Exception):
    """The root of every error p2psync raises on purpose (see the module doc for the tree)."""

    def as_refusal(self) -> Refusal | None:
        """This error as a §13 refusal (to answer a peer with, or to decide on); None when it
        is not one (a bug, a lost connection)."""
        return None


class LocalMisuse(P2PSyncError):
    """Our own caller broke an API's contract (a bug in p2psync): never retried, and not
    explained to a user in one line: the traceback is what a bug report needs."""


class Refusal(P2PSyncError):
    """A refusal by the peer or by the input: ``code`` is the HTTP-like status, ``name`` the §13
    name (``CheckpointRevConflict``), ``detail`` one line, ``body`` the ERR body (§13: ``code``,
    ``detail`` and members per error). A refusal read from a ``BLIP``-domain ERR is named
    ``BLIP<code>``."""

    def __init__(self, code: int, name: str, detail: str = "", body: dict[str, Any] | None = None) -> None:
        self.code = code
        self.name = name
        self.detail = detail
        self.body = body or {"code": name, "detail": detail}
        super().__init__(f"P2PSync {code} {name}: {detail}" if detail else f"P2PSync {code} {name}")

    def as_refusal(self) -> Refusal:
        return self

    @classmethod
    def read(cls, code: int, name: str, detail: str = "", body: dict[str, Any] | None = None) -> Refusal:
        """The refusal an ERR reply says (its code and its body's members), as the class its
        name has: ``409 CheckpointRevConflict`` is a :class:`CheckpointRevConflict`, with the
        body's ``rev`` as ``current``; any other, a plain :class:`Refusal`."""
        known = _KNOWN.get((code, name))
        if known is None:
            return Refusal(code, name, detail, body)
        return known._read(code, name, detail, body or {"code": name, "detail": detail})

    @classmethod
    def _read(cls, code: int, name: str, detail: str, body: dict[str, Any]) -> Refusal:
        return Refusal(code, name, detail, body)


class CheckpointRevConflict(Refusal):
    """``409 CheckpointRevConflict`` (§4.3): a ``setCheckpoint`` rev that is not the stored one.
    ``current`` is the stored rev (None: nothing stored); the body carries it as ``rev``."""

    CODE: ClassVar[int] = 409
    NAME: ClassVar[str] = "CheckpointRevConflict"

    def __init__(self, current: str | None, detail: str = "rev is not the stored one", *,
                 body: dict[str, Any] | None = None) -> None:
        self.current = current
        if body is None:
            body = {"code": self.NAME, "detail": detail, **({} if current is None else {"rev": current})}
        super().__init__(self.CODE, self.NAME, detail, body)

    @classmethod
    def _read(cls, code: int, name: str, detail: str, body: dict[str, Any]) -> Refusal:
        rev = body.get("rev")
        return cls(rev if isinstance(rev, str) else None, detail, body=body)


class QuotaExceeded(Refusal):
    """A quota of the receiving node is spent (issue #15; replication-profiles.md §13):

    - ``507 TenantQuotaExceeded``: the tenant holds as many messages or bytes as the node
      stores for it; nothing more is taken until the quota is raised (not retried);
    - ``429 PeerQuotaExceeded``: the pushing peer's DID has spent its budget for the current
      window; ``retry_after`` (the body's ``retryAfter``, whole seconds) says when it renews.

    ``local``: raised by our own store (a pull of ours that reached our quota), not read from
    a peer's answer; :func:`describe` says so instead of "refused".
    """

    TENANT: ClassVar[tuple[int, str]] = (507, "TenantQuotaExceeded")
    PEER: ClassVar[tuple[int, str]] = (429, "PeerQuotaExceeded")

    def __init__(self, code: int, name: str, detail: str = "", *, retry_after: int | None = None,
                 local: bool = False, body: dict[str, Any] | None = None) -> None:
        self.retry_after = retry_after
        self.local = local
        if body is None:
            body = {"code": name, "detail": detail, **({} if retry_after is None else {"retryAfter": retry_after})}
        super().__init__(code, name, detail, body)

    @property
    def kind(self) -> str:
        """``tenant`` or ``peer`` (the metrics' label)."""
        return "peer" if (self.code, self.name) == self.PEER else "tenant"

    @classmethod
    def _read(cls, code: int, name: str, detail: str, body: dict[str, Any]) -> Refusal:
        after = body.get("retryAfter")
        return cls(code, name, detail, retry_after=after if type(after) is int and after >= 0 else None, body=body)


#: Refusals read from the wire as their own class, by (code, name).
_KNOWN: Final[dict[tuple[int, str], type[Refusal]]] = {
    (CheckpointRevConflict.CODE, CheckpointRevConflict.NAME): CheckpointRevConflict,
    QuotaExceeded.TENANT: QuotaExceeded,
    QuotaExceeded.PEER: QuotaExceeded,
}


class InputRejected(P2PSyncError):
    """Input that broke a rule: ``code`` is a string name (``RecordsWriteDataCidMismatch``),
    ``status`` the HTTP-like reply code, ``detail`` what was wrong (the DWN engine's
    :class:`~p2psync.dwn.errors.DwnError`). Not a :class:`Refusal` because ``code`` means
    the name here; :meth:`as_refusal` maps it."""

    code: str
    detail: str
    status: int

    def as_refusal(self) -> Refusal:
        return Refusal(self.status, self.code, self.detail)


class ErrorReply(P2PSyncError):
    """An ERR reply as it came off the wire (:class:`~p2psync.blip.BlipError`), or one a handler
    raises to answer with. The peer layer reads each one it receives as a :class:`Refusal`
    (p2psync.peer.session.from_blip) before anyone decides on it."""


class Disconnected(P2PSyncError):
    """The transport ended before the work did; ``reason`` says why in one line. (Inside the
    replication protocol an operation that was waiting sees this as the 503 refusal
    ``ConnectionLost``.)"""

    def __init__(self, reason: str = "connection lost") -> None:
        self.reason = reason
        super().__init__(reason)


class HandshakeFailed(P2PSyncError):
    """Our side of ``hello`` failed (a bad proof, a timeout, a refused hello); the connection is
    closed (close reasons ``HelloProofInvalid``, ``HelloTimeout``)."""


class LocalFailure(P2PSyncError):
    """Our own side failed (the store's commit, a port we cannot listen on): not the peer's
    doing and not a bug; ``str()`` is the one line."""


# --------------------------------------------------------------------------- retry


class Disposition(enum.Enum):
    """What a failed round calls for."""

    RETRY = "retry"  # another round, after the link's backoff
    TERMINAL = "terminal"  # another round fails the same way until something changes


@dataclass(frozen=True, slots=True)
class RetryRule:
    """One row of :data:`RETRY_RULES`: ``code`` and ``name`` (None: any) and the decision."""

    code: int | None
    name: str | None
    disposition: Disposition
    why: str

    def matches(self, refusal: Refusal) -> bool:
        return (self.code is None or self.code == refusal.code) and (self.name is None or self.name == refusal.name)


_RETRY, _TERMINAL = Disposition.RETRY, Disposition.TERMINAL

#: The decision for a refusal: the first row that matches; none matches: terminal (400, 401,
#: 403, 404, 413, 507 and BLIP errors: the sender is wrong, or a grant, a policy or a quota must
#: change first).
#: The rows are the decisions p2psync.peer.peer made before this table: §13's retry column,
#: except that a 409 other than RoleMismatch and FeedActive is retried (§13: only
#: CheckpointRevConflict) and BLIP 501 is not (§13: with backoff).
RETRY_RULES: Final[tuple[RetryRule, ...]] = (
    RetryRule(410, None, _RETRY, "ProgressGap: the next round starts the pull over (§11)"),
    RetryRule(None, "RoleMismatch", _TERMINAL, "a bug in one of the peers: the same request fails again"),
    RetryRule(None, "FeedActive", _TERMINAL, "the collection already has a feed on that connection"),
    RetryRule(409, None, _RETRY, "CheckpointRevConflict: re-read the rev and save again; the other "
                                 "connection-state conflicts (ChangesUnsolicited, RevUnsolicited, "
                                 "HelloRepeated) start clean on a new connection"),
    RetryRule(424, None, _RETRY, "an attachment failed its check or could not be fetched: after backoff"),
    RetryRule(*QuotaExceeded.PEER, _RETRY, "the pusher's budget for the window is spent: after retryAfter"),
    RetryRule(503, None, _RETRY, "not now (Busy, StoreUnavailable, Stalled, ConnectionLost)"),
)


def disposition(exc: BaseException) -> Disposition:
    """Retry or give up after ``exc`` ended a round (inside groups: :func:`leaf`). A lost
    connection and an OS error are retried; a :class:`Refusal` by :data:`RETRY_RULES`;
    anything else is terminal (a raw ERR reply is decided once the peer has read it as a
    Refusal, rejected input as ``disposition(exc.as_refusal())``)."""
    exc = leaf(exc)
    if isinstance(exc, Disconnected | OSError):
        return Disposition.RETRY
    if isinstance(exc, Refusal):
        for rule in RETRY_RULES:
            if rule.matches(exc):
                return rule.disposition
    return Disposition.TERMINAL


def is_retryable(exc: BaseException) -> bool:
    """``disposition(exc) is Disposition.RETRY``."""
    return disposition(exc) is Disposition.RETRY


def retry_after(exc: BaseException) -> int | None:
    """The seconds a refusal asks the sender to wait before trying again (its body's
    ``retryAfter``, §13), or None when it names none (inside groups: :func:`leaf`)."""
    exc = leaf(exc)
    if not isinstance(exc, Refusal):
        return None
    after = exc.body.get("retryAfter")
    return after if type(after) is int and after >= 0 else None


# --------------------------------------------------------------------------- one line


def leaf(exc: BaseException) -> BaseException:
    """The one meaningful exception inside (possibly nested) exception groups: the first that
    is not a cancellation (a group of nothing else gives its first)."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)] or list(exc.exceptions)
        exc = inner[0]
    return exc


def error_name(exc: BaseException) -> str:
    """A failure's short name, as the ledger keeps it: ``403 SyncNotAuthorized`` for a refusal,
    the class name otherwise."""
    if isinstance(exc, Refusal):
        return f"{exc.code} {exc.name}"
    return type(exc).__name__


def describe(exc: BaseException, url: str) -> str | None:
    """The one line a user sees for a failure of work with the peer at ``url`` (inside groups:
    :func:`leaf`), or None when ``exc`` is not one we explain (a bug: show its traceback)."""
    exc = leaf(exc)
    if isinstance(exc, QuotaExceeded) and exc.local:
        # Our own store stopped taking the tenant's messages: the peer refused nothing.
        return f"stopped taking messages from {url}: {exc.code} {exc.name}: {exc.detail}"
    if isinstance(exc, Refusal) and exc.name == "ConnectionLost":
        # Raised on our side when the connection drops mid-round (the peer stopped, the
        # network went away): nothing refused us, so do not say "refused".
        return f"lost the connection to {url}: {exc.detail}"
    if isinstance(exc, Refusal):
        text = f"{url} refused: {exc.code} {exc.name}"
        return f"{text}: {exc.detail}" if exc.detail else text
    if isinstance(exc, HandshakeFailed):
        return f"hello with {url} failed: {exc}"
    if isinstance(exc, ErrorReply):
        return f"{url} answered an error: {exc}"
    if isinstance(exc, Disconnected):
        return f"the connection to {url} closed: {exc.reason}"
    if isinstance(exc, trio.TooSlowError):
        return f"{url} did not answer in time"
    if isinstance(exc, OSError):
        return f"cannot connect to {url}: {_os_reason(exc)}"
    if isinstance(exc, InputRejected | LocalFailure):
        return str(exc)
    return None


def _os_reason(exc: OSError) -> str:
    """'Connection refused' rather than trio's 'all attempts to connect to … failed'."""
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        for inner in cause.exceptions:
            if isinstance(inner, OSError) and inner.errno is not None:
                # trio's strerror repeats the address ("Error connecting to ('h', p): …"),
                # which the URL already gives; the OS's own words are enough.
                return os.strerror(inner.errno)
            if isinstance(inner, OSError) and inner.strerror:
                return inner.strerror
    return exc.strerror or str(exc)


def as_refusal(exc: BaseException) -> Refusal | None:
    """``exc`` as a §13 refusal (:meth:`P2PSyncError.as_refusal`), or None: the mapping for the
    errors that are refusals in meaning but not in shape (DwnError, StoreUnavailable)."""
    return exc.as_refusal() if isinstance(exc, P2PSyncError) else None
