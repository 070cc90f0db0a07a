"""The closure loop: admit one replicated message together with everything it depends on.

A *closure* is a root message plus the dependencies that must be applied before it can be:
protocol definitions, initial writes, parents and ancestors, grants, role records, record data.
:class:`ClosureAdmitter` is the bounded fetch-and-retry loop of the wire-surface seed, written
sans-I/O: it asks for work (:class:`ApplyRequest`, :class:`FetchRequest`) and is told the
answers, so the same class runs

- a pull, where the applier is the local engine and the fetcher asks the remote, and
- a push, where the applier is the remote receiver and the fetcher answers the receiver's
  refs from the pusher's own store.

:meth:`ClosureAdmitter.admit` drives it with an async :class:`Applier` and
:class:`DependencyFetcher`. The loop, per pass:

1. apply every pending entry, in order;
2. ``Applied`` / ``Duplicate`` / ``Superseded`` admit the entry; ``Invalid`` fails the closure;
   ``Deferred`` defers it; ``Incomplete`` with a ``terminal`` ref fails it;
3. fetch every missing ref not fetched before in this closure — one request per pass, answers
   cached per ref, and only answers that really answer the ref are kept (a ``messageCid`` ref
   takes exactly that message; ``RecordData`` only bytes whose dataCid matches);
4. re-queue each incomplete entry behind its dependencies.

It stops when nothing is pending (admitted), when a pass makes no progress (nothing new
admitted, nothing new fetched: another pass would do exactly the same — deferred), or after
:data:`MAX_ADMISSION_PASSES` passes (deferred, never failed).

A closure that ends without a dependency it needs carries the strict-closure RFC's failure
code (:data:`CLOSURE_FAILURE_CODES`: ``ClosureParentChainMissing`` for an unanswered
``Parent`` ref, ...), the dependency and the entry that needed it, so a sink can say which
hard dependency is missing, keep the root's token unapplied and move its link to
``repairing``. A dependency the source withholds is ``ClosureDependencyForbidden``; an answer
more than :data:`MAX_CLOSURE_DEPTH` dependency hops from the root is ``ClosureDepthExceeded``.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, Protocol, TypeAlias

import cbor2

from p2psync.dwn.datacid import data_cid as compute_data_cid
from p2psync.dwn.encoding import cid_of_bytes, dag_cbor_encode, message_cid
from p2psync.dwn.permissions import GRANT_PATH, PERMISSIONS_PROTOCOL_URI, REVOCATION_PATH
from p2psync.dwn.replication_types import (
    Ancestor,
    CrossProtocolRef,
    DependencyRef,
    Grant,
    InitialWrite,
    KeyDelivery,
    Parent,
    RecordData,
    ReplicationApplyResult,
    Role,
)
from p2psync.dwn.replication_types import Protocol as ProtocolRef

__all__ = [
    "CLOSURE_DEPTH_EXCEEDED",
    "CLOSURE_FAILURE_CODES",
    "CLOSURE_FORBIDDEN",
    "KEY_DELIVERY_PATH",
    "KEY_DELIVERY_PROTOCOLS",
    "MAX_ADMISSION_PASSES",
    "MAX_ANSWERS_PER_REF",
    "MAX_CLOSURE_DEPTH",
    "MAX_CLOSURE_ENTRIES",
    "Applier",
    "ApplyRequest",
    "ClosureAdmitter",
    "ClosureOutcome",
    "ClosureProtocolError",
    "DependencyFetcher",
    "FetchRequest",
    "ReplicationEntry",
    "StoredEntry",
    "Withheld",
    "answers_ref",
    "closure_failure_code",
    "closure_operation_code",
    "describe_refs",
    "fetch_key",
]

#: Passes before a closure is deferred: the seed's ``MAX_ADMISSION_PASSES`` (and its push
#: side's ``MAX_PUSH_ADMISSION_PASSES``). A well-formed closure needs a handful, because one
#: ``Incomplete`` names a whole missing ancestry at once.
MAX_ADMISSION_PASSES: Final = 128

#: Answers kept per ref. The largest legitimate answer is small: a record's initial write and
#: its newest write (2), a protocol's newest configure (1), the role records of one recipient
#: at one path (one per context). 64 is ours; it bounds what a hostile fetcher can make us hold.
MAX_ANSWERS_PER_REF: Final = 64

#: Distinct messages one closure may hold (root, dependencies, theirs...). A deep protocol
#: (0.5.2 allows 10 levels) with roles and grants stays far below; ours, like the one above.
MAX_CLOSURE_ENTRIES: Final = 4096

#: Dependency hops from a root to the deepest answer a closure takes (the RFC's default bound).
#: A 0.5.2 protocol nests at most 10 levels, so a well-formed closure stays far below.
MAX_CLOSURE_DEPTH: Final = 32

#: The strict-closure RFC's failure code for a dependency, by the type of the ref that asked
#: for it. ``Role`` and ``RecordData`` are ours (the RFC lists role records under authorization
#: closure without a code of their own, and record data is not an operation).
CLOSURE_FAILURE_CODES: Final[dict[str, str]] = {
    "Protocol": "ClosureProtocolMetadataMissing",
    "InitialWrite": "ClosureInitialWriteMissing",
    "Parent": "ClosureParentChainMissing",
    "Ancestor": "ClosureContextChainMissing",
    "Role": "ClosureRoleRecordMissing",
    "Grant": "ClosureGrantMissing",
    "KeyDelivery": "ClosureEncryptionDependencyMissing",
    "CrossProtocolRef": "ClosureCrossProtocolReferenceMissing",
    "RecordData": "ClosureRecordDataMissing",
}
#: A dependency the source holds and will not let this reader have (``withheld``).
CLOSURE_FORBIDDEN: Final = "ClosureDependencyForbidden"
#: An answer more than :data:`MAX_CLOSURE_DEPTH` hops from the root.
CLOSURE_DEPTH_EXCEEDED: Final = "ClosureDepthExceeded"

#: Protocols whose ``contextKey`` records deliver the keys of an encrypted context (the newer
#: reference's key-delivery protocol, under its current and its earlier URI).
KEY_DELIVERY_PROTOCOLS: Final = (
    "https://enbox.org/protocols/key-delivery",
    "https://identity.foundation/protocols/key-delivery",
)
KEY_DELIVERY_PATH: Final = "contextKey"

Message = dict[str, Any]


class ClosureProtocolError(RuntimeError):
    """The admitter was fed an answer it did not ask for (a bug in the driver)."""


def closure_failure_code(ref: DependencyRef) -> str:
    """The RFC failure code of a dependency that could not be had."""
    return CLOSURE_FAILURE_CODES.get(ref.type, "ClosureDependencyMissing")


def closure_operation_code(message: Any) -> str | None:
    """The failure code of a *closure operation* a scoped source listed (one outside the intent
    scope, listed because in-scope state depends on it: a protocol's configure, a grant or its
    revocation, a role record) whose own closure could not be completed: what the replica then
    lacks is that operation, so its class names the failure (a revocation that cannot be
    admitted is ``ClosureGrantRevocationMissing``, whatever it was itself missing). None for
    a message of no such class (and for a RecordsDelete, whose class its message alone does
    not tell: its own dependency's code stands)."""
    descriptor = message.get("descriptor") if isinstance(message, dict) else None
    if not isinstance(descriptor, dict):
        return None
    if _is(descriptor, "Protocols", "Configure"):
        return CLOSURE_FAILURE_CODES["Protocol"]
    if not _is(descriptor, "Records", "Write"):
        return None
    if descriptor.get("protocol") == PERMISSIONS_PROTOCOL_URI:
        path = descriptor.get("protocolPath")
        if path == REVOCATION_PATH:
            return "ClosureGrantRevocationMissing"
        return CLOSURE_FAILURE_CODES["Grant"] if path == GRANT_PATH else None
    return CLOSURE_FAILURE_CODES["Role"]  # a record of the protocol outside the intent: a role record


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class ReplicationEntry:
    """One message to apply, with its record data when it has any (for a RecordsWrite)."""

    message: Message
    data: bytes | None = None
    cid: str = field(default="", compare=False)
    #: the CID of ``data``, when whoever made the entry hashed that very object (a sink
    #: checking it against the descriptor): the apply takes it instead of hashing again
    data_cid: str | None = field(default=None, compare=False)
    #: the message's DAG-CBOR when already at hand (a stored message's wire form, store.py):
    #: what the `message` member of a MessageEntry is, byte for byte
    encoded: bytes | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.cid:
            return
        message = self.message
        if self.encoded is None and type(message) is dict and "encodedData" not in message:
            # The CID is the hash of the message's DAG-CBOR: keep those bytes, the store keeps
            # them as the message's wire form (store.py, schema 8).
            try:
                encoded = dag_cbor_encode(message)
            except Exception:  # not a message: _safe_cid names it
                pass
            else:
                object.__setattr__(self, "encoded", encoded)
                object.__setattr__(self, "cid", cid_of_bytes(encoded))
                return
        object.__setattr__(self, "cid", _safe_cid(message))

    def with_data(self, data: bytes, data_cid: str | None = None) -> ReplicationEntry:
        """This entry with ``data`` (and its CID when the caller hashed it: never another's)."""
        return replace(self, data=data, data_cid=data_cid)

    @property
    def record_id(self) -> str | None:
        """The message's ``recordId`` (a RecordsWrite's), else None."""
        record_id = self.message.get("recordId") if isinstance(self.message, dict) else None
        return record_id if isinstance(record_id, str) else None


class StoredEntry(ReplicationEntry):
    """A RecordsWrite read from a store in its wire form: ``encoded`` is the message's DAG-CBOR,
    decoded into :attr:`message` only when something reads it. A source that sends the tenant's
    whole log to its owner never does: it sends ``encoded`` as stored (issue #17)."""

    def __init__(self, encoded: bytes, data: bytes | None, cid: str, record_id: str | None) -> None:
        # Not the dataclass's __init__: ``message`` is computed, the rest as given.
        object.__setattr__(self, "encoded", encoded)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "cid", cid)
        object.__setattr__(self, "data_cid", None)
        object.__setattr__(self, "_record_id", record_id)

    @property
    def message(self) -> Message:
        decoded: Message | None = self.__dict__.get("_message")
        if decoded is None:
            decoded = cbor2.loads(self.__dict__["encoded"])
            object.__setattr__(self, "_message", decoded)
        return decoded

    @property
    def record_id(self) -> str | None:
        record_id: str | None = self.__dict__["_record_id"]
        return record_id

    def with_data(self, data: bytes, data_cid: str | None = None) -> ReplicationEntry:
        assert self.encoded is not None
        entry = StoredEntry(self.encoded, data, self.cid, self.record_id)
        object.__setattr__(entry, "data_cid", data_cid)
        return entry


def _safe_cid(message: Any) -> str:
    # An entry from a hostile source may not even be a message; it still needs an identity,
    # and the engine will refuse it as Invalid.
    try:
        return message_cid(message)
    except Exception:
        return f"uncomputable:{id(message)}"


# --------------------------------------------------------------------------- requests and outcome


@dataclass(frozen=True)
class ApplyRequest:
    """Apply ``entry`` (replicated apply) and answer with its result."""

    entry: ReplicationEntry


@dataclass(frozen=True)
class FetchRequest:
    """Fetch these refs and answer with one list of entries per ref, in order."""

    refs: tuple[DependencyRef, ...]


ClosureStatus: TypeAlias = Literal["admitted", "deferred", "failed"]


@dataclass(frozen=True)
class ClosureOutcome:
    """How a closure ended.

    ``admitted``: the root and everything it needed are in the receiving store.
    ``deferred``: not now (a transient condition, an unreachable dependency, the budget).
    ``failed``: the root (or a dependency it needs) is invalid, or a dependency is terminal.

    ``code`` is the strict-closure failure code when a hard dependency could not be had
    (unanswered, terminal, withheld, or too deep), with ``dependency`` the first such ref (in
    the order the engine named them) and ``needed_by`` the CID of the entry that needed it.
    """

    status: ClosureStatus
    root_cid: str
    passes: int
    detail: str | None = None
    failure: Literal["invalid", "terminal"] | None = None
    applied: tuple[str, ...] = ()  # CIDs that made new state (result Applied), in order
    admitted: tuple[str, ...] = ()  # CIDs admitted (Applied, Duplicate or Superseded), in order
    fetch_requests: int = 0
    refs_fetched: int = 0
    entries_fetched: int = 0
    code: str | None = None
    dependency: DependencyRef | None = None
    needed_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "admitted"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "rootCid": self.root_cid, "passes": self.passes}
        if self.detail is not None:
            out["detail"] = self.detail
        if self.failure is not None:
            out["failure"] = self.failure
        if self.code is not None:
            out["code"] = self.code
        if self.dependency is not None:
            out["dependency"] = self.dependency.to_json()
        if self.needed_by is not None:
            out["neededBy"] = self.needed_by
        out["applied"] = list(self.applied)
        out["admitted"] = list(self.admitted)
        return out


Request: TypeAlias = ApplyRequest | FetchRequest | ClosureOutcome


class Applier(Protocol):
    """Applies one replicated message to the receiving store (local engine or remote peer)."""

    async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult: ...


class DependencyFetcher(Protocol):
    """Answers dependency refs with messages (from a remote, or from the pusher's store)."""

    async def fetch(self, tenant: str, refs: Sequence[DependencyRef]) -> Sequence[Sequence[ReplicationEntry]]: ...


class Withheld(tuple[ReplicationEntry, ...]):
    """A fetcher's answer for a ref the source holds but will not let this reader have
    (replication-profiles.md §10 ``withheld``). Left without an answer, a ref like that ends
    the closure as terminal (``ClosureDependencyForbidden``), not as a retry-later deferral:
    asking again will not change the source's mind."""

    __slots__ = ()


@dataclass(frozen=True)
class _Failure:
    reason: str


# --------------------------------------------------------------------------- ref matching


def fetch_key(ref: DependencyRef) -> tuple[str, ...]:
    """What a ref is fetched by: refs that fetch the same thing share one fetch per closure."""
    if ref.message_cid is not None:
        return ("cid", ref.message_cid)
    if isinstance(ref, InitialWrite | Parent | Ancestor):
        # The same fetch answers all three: the record's initial write and its newest write.
        return ("record", ref.record_id)
    if isinstance(ref, Grant):
        return ("record", ref.permission_grant_id)
    return ref.key()


def answers_ref(ref: DependencyRef, entry: ReplicationEntry) -> bool:
    """Whether ``entry`` is something ``ref`` asked for (anything else is dropped unapplied)."""
    message = entry.message
    descriptor = message.get("descriptor") if isinstance(message, dict) else None
    if not isinstance(descriptor, dict):
        return False
    if ref.message_cid is not None:
        return entry.cid == ref.message_cid
    if isinstance(ref, ProtocolRef):
        definition = descriptor.get("definition")
        return (
            _is(descriptor, "Protocols", "Configure")
            and isinstance(definition, dict)
            and definition.get("protocol") == ref.protocol
        )
    if not _is(descriptor, "Records", "Write"):
        return False
    record_id = message.get("recordId")
    if isinstance(ref, InitialWrite | Parent | Ancestor):
        return record_id == ref.record_id
    if isinstance(ref, Grant):
        return record_id == ref.permission_grant_id
    if isinstance(ref, CrossProtocolRef):
        return record_id == ref.record_id and descriptor.get("protocol") == ref.protocol
    if isinstance(ref, Role):
        context = message.get("contextId")
        in_context = ref.context_prefix is None or (
            isinstance(context, str) and (context == ref.context_prefix or context.startswith(ref.context_prefix + "/"))
        )
        return (
            descriptor.get("protocol") == ref.protocol
            and descriptor.get("protocolPath") == ref.protocol_path
            and descriptor.get("recipient") == ref.recipient
            and in_context
        )
    if isinstance(ref, KeyDelivery):
        tags = descriptor.get("tags")
        return (
            descriptor.get("protocol") in KEY_DELIVERY_PROTOCOLS
            and descriptor.get("protocolPath") == KEY_DELIVERY_PATH
            and isinstance(tags, dict)
            and tags.get("protocol") == ref.protocol
            and tags.get("contextId") == ref.context_id
        )
    if isinstance(ref, RecordData):
        return (
            record_id == ref.record_id
            and descriptor.get("dataCid") == ref.data_cid
            and isinstance(entry.data, bytes)
            and len(entry.data) == descriptor.get("dataSize")
            and compute_data_cid(entry.data) == ref.data_cid
        )
    return False


def _is(descriptor: dict[str, Any], interface: str, method: str) -> bool:
    return descriptor.get("interface") == interface and descriptor.get("method") == method


def describe_refs(refs: Sequence[DependencyRef]) -> str:
    """A short human description of refs for outcome details and logs."""
    parts = []
    for ref in refs:
        members = ref.to_json()
        members.pop("type")
        inner = ", ".join(f"{k}={v}" for k, v in members.items())
        parts.append(f"{ref.type}({inner})")
    return "; ".join(parts)


# --------------------------------------------------------------------------- the loop


class ClosureAdmitter:
    """The closure of one root, as a state machine: read :attr:`request`, answer it.

    ``receive_apply`` answers an :class:`ApplyRequest`, ``receive_fetch`` a
    :class:`FetchRequest`; ``apply_failed`` / ``fetch_failed`` report that the applier or the
    fetcher could not answer (the closure is then deferred). When :attr:`request` is a
    :class:`ClosureOutcome`, the closure is over.
    """

    def __init__(
        self,
        tenant: str,
        root: ReplicationEntry,
        *,
        max_passes: int = MAX_ADMISSION_PASSES,
        max_entries: int = MAX_CLOSURE_ENTRIES,
        max_answers_per_ref: int = MAX_ANSWERS_PER_REF,
        max_depth: int = MAX_CLOSURE_DEPTH,
    ) -> None:
        self.tenant = tenant
        self.root = root
        self.max_depth = max_depth
        self.max_passes = max_passes
        self.max_entries = max_entries
        self.max_answers_per_ref = max_answers_per_ref
        self.passes = 0
        self._applied: list[str] = []
        self._admitted: dict[str, str] = {}
        self._fetch_requests = 0
        self._refs_fetched = 0
        self._entries_fetched = 0
        self._machine = self._run()
        self._request: Request = next(self._machine)

    @property
    def request(self) -> Request:
        """What the admitter needs next, or its outcome when it is done."""
        return self._request

    @property
    def outcome(self) -> ClosureOutcome | None:
        return self._request if isinstance(self._request, ClosureOutcome) else None

    def receive_apply(self, result: ReplicationApplyResult) -> Request:
        """The result of the pending :class:`ApplyRequest`."""
        if not isinstance(self._request, ApplyRequest):
            raise ClosureProtocolError(f"an apply result was given while the request is {self._request!r}")
        return self._send(result)

    def receive_fetch(self, answers: Sequence[Sequence[ReplicationEntry]]) -> Request:
        """The answers to the pending :class:`FetchRequest`, one sequence per ref."""
        if not isinstance(self._request, FetchRequest):
            raise ClosureProtocolError(f"fetch answers were given while the request is {self._request!r}")
        return self._send(answers)

    def apply_failed(self, reason: str) -> Request:
        """The applier could not answer (a transport failure, a crash): defer the closure."""
        if not isinstance(self._request, ApplyRequest):
            raise ClosureProtocolError(f"an apply failure was given while the request is {self._request!r}")
        return self._send(_Failure(f"apply failed: {reason}"))

    def fetch_failed(self, reason: str) -> Request:
        """The fetcher could not answer: defer the closure."""
        if not isinstance(self._request, FetchRequest):
            raise ClosureProtocolError(f"a fetch failure was given while the request is {self._request!r}")
        return self._send(_Failure(f"fetch failed: {reason}"))

    async def admit(self, applier: Applier, fetcher: DependencyFetcher) -> ClosureOutcome:
        """Run the closure to its end with ``applier`` and ``fetcher``."""
        request = self._request
        while not isinstance(request, ClosureOutcome):
            if isinstance(request, ApplyRequest):
                try:
                    result = await applier.apply(self.tenant, request.entry)
                except Exception as exc:  # the peer or transport failed: not the message's fault
                    request = self.apply_failed(f"{type(exc).__name__}: {exc}")
                    continue
                request = self.receive_apply(result)
            else:
                try:
                    answers = await fetcher.fetch(self.tenant, request.refs)
                except Exception as exc:
                    request = self.fetch_failed(f"{type(exc).__name__}: {exc}")
                    continue
                request = self.receive_fetch(answers)
        return request

    # -- internals -----------------------------------------------------------------------

    def _send(self, value: Any) -> Request:
        try:
            self._request = self._machine.send(value)
        except StopIteration as stop:  # pragma: no cover - _run always ends with an outcome
            raise ClosureProtocolError("the closure loop ended without an outcome") from stop
        if isinstance(self._request, ClosureOutcome):
            # The suspended loop and this admitter refer to each other; closing the loop frees
            # its entries (their data: 10 MiB records) now rather than at the next cyclic GC.
            self._machine.close()
        return self._request

    def _code_of(self, ref: DependencyRef) -> str:
        """The failure code of ``ref`` as the root sees it: a record of the root's own context
        chain is its parent (``ClosureParentChainMissing``) or a further ancestor
        (``ClosureContextChainMissing``), whichever entry of the closure asked for it."""
        if isinstance(ref, InitialWrite | Parent | Ancestor):
            message = self.root.message if isinstance(self.root.message, dict) else {}
            descriptor = message.get("descriptor")
            parent = descriptor.get("parentId") if isinstance(descriptor, dict) else None
            context = message.get("contextId")
            chain = context.split("/")[:-1] if isinstance(context, str) else []
            if ref.record_id == parent:
                return CLOSURE_FAILURE_CODES["Parent"]
            if ref.record_id in chain:
                return CLOSURE_FAILURE_CODES["Ancestor"]
        return closure_failure_code(ref)

    def _outcome(
        self, status: ClosureStatus, detail: str | None = None, failure: Literal["invalid", "terminal"] | None = None,
        *, missing: tuple[str, DependencyRef, str] | None = None,
    ) -> ClosureOutcome:
        """The closure's end; ``missing``: (code, dependency, CID of the entry that needed it)."""
        code, dependency, needed_by = missing if missing is not None else (None, None, None)
        return ClosureOutcome(
            status=status,
            root_cid=self.root.cid,
            passes=self.passes,
            detail=detail,
            failure=failure,
            applied=tuple(self._applied),
            admitted=tuple(self._admitted),
            fetch_requests=self._fetch_requests,
            refs_fetched=self._refs_fetched,
            entries_fetched=self._entries_fetched,
            code=code,
            dependency=dependency,
            needed_by=needed_by,
        )

    def _run(self) -> Generator[Request, Any, None]:
        """The loop of the module docstring, one pass an iteration, yielding until its outcome."""
        fetched = _FetchedRefs(known={self.root.cid})
        pending: list[ReplicationEntry] = [self.root]
        while True:
            if self.passes >= self.max_passes:
                yield self._outcome("deferred", f"pass budget of {self.max_passes} exhausted")
                return
            self.passes += 1
            applied = yield from self._apply_pass(pending)
            if isinstance(applied, ClosureOutcome):
                yield applied
                return
            incomplete, admitted_new = applied
            if not incomplete:
                yield self._outcome("admitted")
                return
            fetched_new = yield from self._fetch_missing(incomplete, fetched)
            if isinstance(fetched_new, ClosureOutcome):
                yield fetched_new
                return
            requeued = self._requeue(incomplete, fetched)
            if isinstance(requeued, ClosureOutcome):
                yield requeued
                return
            pending = requeued
            if not (admitted_new or fetched_new):
                stuck, refs = incomplete[0]
                code = self._code_of(refs[0]) if refs else "ClosureDependencyMissing"
                yield self._outcome("deferred", f"{code}: {stuck.cid}: no progress: {describe_refs(refs)}",
                                    missing=(code, refs[0], stuck.cid) if refs else None)
                return

    def _apply_pass(
        self, pending: Sequence[ReplicationEntry]
    ) -> Generator[Request, Any, tuple[list[_Incomplete], bool] | ClosureOutcome]:
        """Step 1-2: apply every pending entry, in order, and sort out what each result means.

        Returns the entries that are missing dependencies and whether this pass admitted a
        message not admitted before, or the outcome that ends the closure.
        """
        admitted_new = False
        incomplete: list[_Incomplete] = []
        for entry in pending:
            result = yield ApplyRequest(entry)
            if isinstance(result, _Failure):
                return self._outcome("deferred", result.reason)
            verdict = self._classify(entry, result)
            if isinstance(verdict, ClosureOutcome):
                return verdict
            if verdict is _Admission.NEWLY:
                admitted_new = True
            elif verdict is not _Admission.BEFORE:
                incomplete.append((entry, verdict))
        return incomplete, admitted_new

    def _classify(self, entry: ReplicationEntry, result: Any) -> ClosureOutcome | _Admission | _MissingRefs:
        """What one apply result means for the closure.

        An admission (``Applied`` / ``Duplicate`` / ``Superseded``) is recorded here; an
        ``Incomplete`` gives its missing refs; anything that ends the closure gives its outcome.
        ``result`` is whatever the driver answered: it is read by its ``kind``, and a kind the
        loop does not know defers the closure.
        """
        kind = result.kind
        if kind in ("Applied", "Duplicate", "Superseded"):
            newly = entry.cid not in self._admitted
            if newly:
                self._admitted[entry.cid] = kind
            if kind == "Applied" and entry.cid not in self._applied:
                self._applied.append(entry.cid)
            return _Admission.NEWLY if newly else _Admission.BEFORE
        if kind == "Deferred":
            return self._outcome("deferred", f"{entry.cid}: {result.reason}")
        if kind == "Invalid":
            return self._outcome("failed", f"{entry.cid}: {result.reason}", "invalid")
        if kind == "Incomplete":
            terminal = [ref for ref in result.missing if ref.terminal]
            if terminal:
                code = self._code_of(terminal[0])
                return self._outcome("failed", f"{code}: {entry.cid}: unreachable {describe_refs(terminal)}",
                                     "terminal", missing=(code, terminal[0], entry.cid))
            missing: _MissingRefs = result.missing
            return missing
        # A result the loop does not know: not ours to guess.
        return self._outcome("deferred", f"{entry.cid}: unknown result kind {kind!r}")

    def _fetch_missing(
        self, incomplete: Sequence[_Incomplete], fetched: _FetchedRefs
    ) -> Generator[Request, Any, bool | ClosureOutcome]:
        """Step 3: one fetch of every missing ref not fetched before in this closure.

        Returns whether the answers held anything new (a retry may then succeed), or the
        outcome that ends the closure.
        """
        wanted: dict[tuple[str, ...], DependencyRef] = {}
        for _, missing in incomplete:
            for ref in missing:
                key = fetch_key(ref)
                if key not in fetched.cache and key not in wanted:
                    wanted[key] = ref
        if not wanted:
            return False
        refs = tuple(wanted.values())
        self._fetch_requests += 1
        self._refs_fetched += len(refs)
        answers = yield FetchRequest(refs)
        if isinstance(answers, _Failure):
            return self._outcome("deferred", answers.reason)
        if not isinstance(answers, Sequence) or len(answers) != len(refs):
            count = len(answers) if isinstance(answers, Sequence) else "no"
            return self._outcome("deferred", f"fetcher answered {count} lists for {len(refs)} refs")
        answered = False
        for (key, ref), got in zip(wanted.items(), answers, strict=True):
            if self._keep_answers(key, ref, got, fetched):
                # New answers (a new message, or data for one) may let a retry succeed;
                # refs are fetched once per closure, so this is finite.
                answered = True
        if len(fetched.known) > self.max_entries:
            return self._outcome("deferred", f"closure exceeds {self.max_entries} messages")
        return answered

    def _keep_answers(self, key: tuple[str, ...], ref: DependencyRef, got: Any, fetched: _FetchedRefs) -> bool:
        """Cache what really answers ``ref`` (at most :attr:`max_answers_per_ref`); True if any."""
        candidates = got if isinstance(got, Sequence) else ()
        accepted = tuple(e for e in candidates if isinstance(e, ReplicationEntry) and answers_ref(ref, e))
        accepted = accepted[: self.max_answers_per_ref]
        fetched.cache[key] = accepted
        if isinstance(got, Withheld) and not accepted:
            fetched.forbidden.add(key)
        self._entries_fetched += len(accepted)
        fetched.known.update(e.cid for e in accepted)
        return bool(accepted)

    def _requeue(
        self, incomplete: Sequence[_Incomplete], fetched: _FetchedRefs
    ) -> list[ReplicationEntry] | ClosureOutcome:
        """Step 4: the next pass's entries, each incomplete one behind the answers it needs.

        An entry none of whose refs got an answer ends the closure: failed when the source
        withheld one of them, deferred otherwise.
        """
        retry: list[ReplicationEntry] = []
        for entry, missing in incomplete:
            answers_for_entry: list[ReplicationEntry] = []
            for ref in missing:
                answers_for_entry.extend(fetched.cache[fetch_key(ref)])
            if not answers_for_entry:
                refused = [ref for ref in missing if fetch_key(ref) in fetched.forbidden]
                if refused:
                    detail = f"{CLOSURE_FORBIDDEN}: {entry.cid}: withheld {describe_refs(refused)}"
                    return self._outcome("failed", detail, "terminal",
                                         missing=(CLOSURE_FORBIDDEN, refused[0], entry.cid))
                first = missing[0] if missing else None
                code = self._code_of(first) if first is not None else "ClosureDependencyMissing"
                return self._outcome("deferred", f"{code}: {entry.cid}: unresolved {describe_refs(missing)}",
                                     missing=(code, first, entry.cid) if first is not None else None)
            depth = fetched.depth.get(entry.cid, 0) + 1
            for answer in answers_for_entry:
                if answer.cid not in fetched.depth:
                    fetched.depth[answer.cid] = depth
            if depth > self.max_depth:
                detail = f"{CLOSURE_DEPTH_EXCEEDED}: {entry.cid}: a dependency {depth} hops from the root"
                return self._outcome("failed", detail, "terminal",
                                     missing=(CLOSURE_DEPTH_EXCEEDED, missing[0], entry.cid))
            retry.extend(e for e in answers_for_entry if e.cid not in self._admitted)
            retry.append(_with_fetched_data(entry, missing, fetched.cache))
        return _dedupe(retry)


#: The dependencies an ``Incomplete`` result names.
_MissingRefs: TypeAlias = tuple[DependencyRef, ...]
#: An entry the engine found incomplete, with the refs it is missing.
_Incomplete: TypeAlias = tuple[ReplicationEntry, _MissingRefs]


class _Admission(enum.Enum):
    """An apply result that admits its entry: for the first time in this closure, or again."""

    NEWLY = "admitted for the first time"
    BEFORE = "admitted before"


@dataclass
class _FetchedRefs:
    """What one closure has fetched so far: refs are fetched once per closure."""

    known: set[str]  # CIDs of the root and of every accepted answer (bounded by max_entries)
    cache: dict[tuple[str, ...], tuple[ReplicationEntry, ...]] = field(default_factory=dict)
    forbidden: set[tuple[str, ...]] = field(default_factory=set)  # refs the source withheld (see Withheld)
    depth: dict[str, int] = field(default_factory=dict)  # hops from the root to each answer, first seen


def _with_fetched_data(
    entry: ReplicationEntry,
    missing: Sequence[DependencyRef],
    cache: dict[tuple[str, ...], tuple[ReplicationEntry, ...]],
) -> ReplicationEntry:
    """An entry that lacked its record data, given the verified bytes a RecordData fetch got."""
    if entry.data is not None:
        return entry
    descriptor = entry.message.get("descriptor") if isinstance(entry.message, dict) else None
    if not isinstance(descriptor, dict):
        return entry
    for ref in missing:
        if isinstance(ref, RecordData) and descriptor.get("dataCid") == ref.data_cid:
            for answer in cache[fetch_key(ref)]:
                if answer.data is not None:  # answers_ref verified these bytes against dataCid
                    return entry.with_data(answer.data)
    return entry


def _dedupe(entries: list[ReplicationEntry]) -> list[ReplicationEntry]:
    """First occurrence of each CID, in order (dependencies stay ahead of what needs them)."""
    order: dict[str, ReplicationEntry] = {}
    for entry in entries:
        seen = order.get(entry.cid)
        if seen is None or seen.data is None and entry.data is not None:
            order[entry.cid] = entry
    return list(order.values())
