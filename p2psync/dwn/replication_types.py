"""What a replicated apply answers: ``ReplicationApplyResult``, ``DependencyRef`` and ``ProgressToken``.

These are the contract between the engine (which decides) and every transport and closure
loop (which carry the answer and act on it), as ``dwn-replication-apply-wire-surface`` lays it
out. Each type has one JSON shape (``to_json`` / ``*_from_json``), documented with examples in
``protocol/replication-apply.md``; the same objects travel in the interop pipe and, later, on
the wire. Parsing is strict about what it needs and ignores members it does not know, so a
newer peer can add optional members without breaking an older one.

Result kinds (``kind``): ``Applied`` (``ancestryOnly``, ``position``), ``Duplicate``,
``Superseded``, ``Incomplete`` (``missing``: refs), ``Invalid`` (``reason``), ``Deferred``
(``reason``: ``tenant-inactive`` | ``resolver-unavailable`` | ``storage``).

Dependency kinds (``type``): ``Protocol``, ``InitialWrite``, ``Parent``, ``Ancestor``, ``Role``,
``Grant``, ``KeyDelivery``, ``CrossProtocolRef``, ``RecordData``; each may carry ``messageCid``
(fetch exactly that message) and ``terminal`` (known to be unreachable: do not try).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal, TypeAlias, cast

from p2psync.dwn.progress import ProgressToken, ProgressTokenInvalid

__all__ = [
    "DEFERRED_REASONS",
    "Ancestor",
    "Applied",
    "CrossProtocolRef",
    "Deferred",
    "DeferredReason",
    "DependencyRef",
    "Duplicate",
    "Grant",
    "Incomplete",
    "InitialWrite",
    "Invalid",
    "KeyDelivery",
    "Parent",
    "ProgressToken",
    "Protocol",
    "RecordData",
    "ReplicationApplyResult",
    "ReplicationWireError",
    "Role",
    "Superseded",
    "ref_from_json",
    "token_from_json",
    "result_from_json",
    "telemetry_status",
]

DeferredReason: TypeAlias = Literal["tenant-inactive", "resolver-unavailable", "storage"]

#: The three transient reasons the seed names for ``Deferred``.
DEFERRED_REASONS: Final[frozenset[str]] = frozenset({"tenant-inactive", "resolver-unavailable", "storage"})

# A closure loop never needs more refs than a context chain is deep plus a few; 0.5.2 limits a
# protocol structure to 10 levels. A parser refuses absurd lists so a peer cannot make us
# allocate without bound (1024 is generous and ours, not the seed's).
MAX_MISSING_REFS: Final = 1024

# Longest ``reason`` we keep from a peer's Invalid result; details are a line or two.
MAX_REASON_CHARS: Final = 4096


# Positions of 128-bit backends (ULIDs) need 39 decimal digits; 40 admits them and bounds the parse.
MAX_POSITION_DIGITS: Final = 40
_DECIMAL: Final = re.compile(rf"0|[1-9][0-9]{{0,{MAX_POSITION_DIGITS - 1}}}")


class ReplicationWireError(ValueError):
    """A result, ref or token received from elsewhere does not have the documented shape."""

    code = "ReplicationApplyResultInvalid"


# --------------------------------------------------------------------------- progress token


def token_from_json(obj: Any) -> ProgressToken:
    """Parse a progress token received from elsewhere; :class:`ReplicationWireError` if malformed."""
    try:
        return ProgressToken.from_wire(obj)
    except ProgressTokenInvalid as exc:
        raise ReplicationWireError(exc.detail) from exc


# --------------------------------------------------------------------------- dependency refs


@dataclass(frozen=True, kw_only=True)
class _Ref:
    """Members every dependency ref carries."""

    type: ClassVar[str]
    # Field names in JSON order after ``type``: (attribute, JSON member, required).
    _fields: ClassVar[tuple[tuple[str, str, bool], ...]]

    message_cid: str | None = None
    terminal: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        for attr, member, _ in self._fields:
            value = getattr(self, attr)
            if value is not None:
                out[member] = value
        if self.message_cid is not None:
            out["messageCid"] = self.message_cid
        if self.terminal:
            out["terminal"] = True
        return out

    def key(self) -> tuple[str, ...]:
        """A stable identity of what the ref asks for (``terminal`` aside)."""
        values = tuple("" if getattr(self, a) is None else str(getattr(self, a)) for a, _, _ in self._fields)
        return (self.type, *values, self.message_cid or "")


@dataclass(frozen=True, kw_only=True)
class Protocol(_Ref):
    """The protocol's definition (its newest ProtocolsConfigure) is not here."""

    type: ClassVar[str] = "Protocol"
    _fields = (("protocol", "protocol", True),)
    protocol: str


@dataclass(frozen=True, kw_only=True)
class InitialWrite(_Ref):
    """The record's initial write is not here (an update, or a delete, arrived first)."""

    type: ClassVar[str] = "InitialWrite"
    _fields = (("record_id", "recordId", True), ("protocol", "protocol", False))
    record_id: str
    protocol: str | None = None


@dataclass(frozen=True, kw_only=True)
class Parent(_Ref):
    """The record's parent (its live state) is not here."""

    type: ClassVar[str] = "Parent"
    _fields = (("record_id", "recordId", True), ("protocol", "protocol", True))
    record_id: str
    protocol: str


@dataclass(frozen=True, kw_only=True)
class Ancestor(_Ref):
    """A record further up the context chain is not here."""

    type: ClassVar[str] = "Ancestor"
    _fields = (("record_id", "recordId", True), ("protocol", "protocol", False))
    record_id: str
    protocol: str | None = None


@dataclass(frozen=True, kw_only=True)
class Role(_Ref):
    """The role record the author invokes (``protocolRole``) is not here."""

    type: ClassVar[str] = "Role"
    _fields = (
        ("protocol", "protocol", True),
        ("protocol_path", "protocolPath", True),
        ("recipient", "recipient", True),
        ("context_prefix", "contextPrefix", False),
    )
    protocol: str
    protocol_path: str
    recipient: str
    context_prefix: str | None = None


@dataclass(frozen=True, kw_only=True)
class Grant(_Ref):
    """The permission grant the message invokes (``permissionGrantId``) is not here."""

    type: ClassVar[str] = "Grant"
    _fields = (("permission_grant_id", "permissionGrantId", True),)
    permission_grant_id: str


@dataclass(frozen=True, kw_only=True)
class KeyDelivery(_Ref):
    """The context-key record of an encrypted context is not here (a newer engine's ref)."""

    type: ClassVar[str] = "KeyDelivery"
    _fields = (("protocol", "protocol", True), ("context_id", "contextId", True))
    protocol: str
    context_id: str


@dataclass(frozen=True, kw_only=True)
class CrossProtocolRef(_Ref):
    """A record of another protocol that this one references is not here (a newer engine's ref)."""

    type: ClassVar[str] = "CrossProtocolRef"
    _fields = (("protocol", "protocol", True), ("record_id", "recordId", True))
    protocol: str
    record_id: str


@dataclass(frozen=True, kw_only=True)
class RecordData(_Ref):
    """The record's data (by ``dataCid``) is not here, and the message did not bring it."""

    type: ClassVar[str] = "RecordData"
    _fields = (("record_id", "recordId", True), ("data_cid", "dataCid", True), ("protocol", "protocol", False))
    record_id: str
    data_cid: str
    protocol: str | None = None


DependencyRef: TypeAlias = (
    Protocol | InitialWrite | Parent | Ancestor | Role | Grant | KeyDelivery | CrossProtocolRef | RecordData
)

_REF_TYPES: Final[dict[str, type[_Ref]]] = {
    cls.type: cls
    for cls in (Protocol, InitialWrite, Parent, Ancestor, Role, Grant, KeyDelivery, CrossProtocolRef, RecordData)
}


def ref_from_json(obj: Any) -> DependencyRef:
    """Parse one dependency ref; :class:`ReplicationWireError` when it is malformed or unknown."""
    if not isinstance(obj, dict):
        raise ReplicationWireError("a dependency ref is a JSON object")
    ref_type = obj.get("type")
    cls = _REF_TYPES.get(ref_type) if isinstance(ref_type, str) else None
    if cls is None:
        raise ReplicationWireError(f"unknown dependency ref type {ref_type!r}")
    kwargs: dict[str, Any] = {}
    for attr, member, required in cls._fields:
        if required:
            kwargs[attr] = _required_str(obj, member, f"{ref_type} ref")
        else:
            kwargs[attr] = _optional_str(obj, member, f"{ref_type} ref")
    kwargs["message_cid"] = _optional_str(obj, "messageCid", f"{ref_type} ref")
    terminal = obj.get("terminal", False)
    if not isinstance(terminal, bool):
        raise ReplicationWireError(f"{ref_type} ref: terminal must be a boolean")
    kwargs["terminal"] = terminal
    return cls(**kwargs)  # type: ignore[return-value]


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Applied:
    """Accepted (handler 202; 204 sets ``ancestry_only``: stored for ancestry, not latest)."""

    kind: ClassVar[str] = "Applied"
    ancestry_only: bool = False
    position: ProgressToken | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.ancestry_only:
            out["ancestryOnly"] = True
        if self.position is not None:
            out["position"] = self.position.to_wire()
        return out


@dataclass(frozen=True)
class Duplicate:
    """The exact message is already stored; nothing changed (a missing log entry was repaired)."""

    kind: ClassVar[str] = "Duplicate"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True)
class Superseded:
    """A newer or conflicting state exists (409, or a write that lost to a delete)."""

    kind: ClassVar[str] = "Superseded"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True)
class Incomplete:
    """Well-formed, but something it depends on is not here: fetch ``missing``, then retry."""

    kind: ClassVar[str] = "Incomplete"
    missing: tuple[DependencyRef, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "missing": [ref.to_json() for ref in self.missing]}


@dataclass(frozen=True)
class Invalid:
    """Terminally refused: drop the message."""

    kind: ClassVar[str] = "Invalid"
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason}


@dataclass(frozen=True)
class Deferred:
    """Not applicable here now (transient): retry on a later sync."""

    kind: ClassVar[str] = "Deferred"
    reason: DeferredReason = "storage"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason}


ReplicationApplyResult: TypeAlias = Applied | Duplicate | Superseded | Incomplete | Invalid | Deferred

# The reverse mapping a server records for telemetry (the seed's apply-replicated-message
# handler): what handler status each kind stands for.
_TELEMETRY_STATUS: Final[dict[str, int]] = {
    "Applied": 202,
    "Duplicate": 409,
    "Superseded": 409,
    "Incomplete": 424,
    "Invalid": 400,
    "Deferred": 503,
}


def telemetry_status(result: ReplicationApplyResult) -> int:
    """The status code a result is recorded under: 202, 409, 424, 400 or 503."""
    return _TELEMETRY_STATUS[result.kind]


def result_from_json(obj: Any) -> ReplicationApplyResult:
    """Parse a result received from elsewhere; :class:`ReplicationWireError` when malformed."""
    if not isinstance(obj, dict):
        raise ReplicationWireError("a replication apply result is a JSON object")
    kind = obj.get("kind")
    if kind == "Applied":
        ancestry_only = obj.get("ancestryOnly", False)
        if not isinstance(ancestry_only, bool):
            raise ReplicationWireError("Applied: ancestryOnly must be a boolean")
        position = obj.get("position")
        return Applied(ancestry_only, None if position is None else token_from_json(position))
    if kind == "Duplicate":
        return Duplicate()
    if kind == "Superseded":
        return Superseded()
    if kind == "Incomplete":
        missing = obj.get("missing")
        if not isinstance(missing, list) or not missing:
            raise ReplicationWireError("Incomplete: missing must be a non-empty list of refs")
        if len(missing) > MAX_MISSING_REFS:
            raise ReplicationWireError(f"Incomplete: more than {MAX_MISSING_REFS} refs")
        return Incomplete(tuple(ref_from_json(r) for r in missing))
    if kind == "Invalid":
        reason = obj.get("reason")
        if not isinstance(reason, str):
            raise ReplicationWireError("Invalid: reason must be a string")
        return Invalid(reason[:MAX_REASON_CHARS])
    if kind == "Deferred":
        reason = obj.get("reason")
        if not isinstance(reason, str) or reason not in DEFERRED_REASONS:
            raise ReplicationWireError(f"Deferred: reason must be one of {sorted(DEFERRED_REASONS)}")
        return Deferred(cast(DeferredReason, reason))
    raise ReplicationWireError(f"unknown result kind {kind!r}")


# --------------------------------------------------------------------------- helpers


def _required_str(obj: dict[str, Any], member: str, what: str) -> str:
    value = obj.get(member)
    if not isinstance(value, str) or not value:
        raise ReplicationWireError(f"{what}: {member} must be a non-empty string")
    return value


def _optional_str(obj: dict[str, Any], member: str, what: str) -> str | None:
    value = obj.get(member)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ReplicationWireError(f"{what}: {member} must be a non-empty string when present")
    return value
