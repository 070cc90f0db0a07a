"""Sync scopes: what part of a tenant's data one replication link carries, and its ``scopeId``.

A ``SyncScope`` is the RFC's *intent scope* (``{kind, protocol?, protocolPathPrefixes?,
contextIdPrefixes?}``). It is kept in one canonical form, so two scopes that select the same
messages have one ``scopeId``, and the ledger keys a link's checkpoints by it:

- ``global``: every message of the tenant; no other member may be given;
- ``protocol``: messages whose ``protocol`` is the (normalized) protocol URL; no prefixes;
- ``subset``: a protocol plus prefixes: ``protocolPathPrefixes`` (any may match) and
  ``contextIdPrefixes`` (any may match); when both are given a message must satisfy both.

Canonical form: the protocol URL normalized as the reference DWN normalizes it; each prefix
list deduplicated, stripped of prefixes another one already covers, sorted by code point
(= UTF-8 byte order); an absent list and an empty list both mean "no constraint on that
axis" (as an empty filter list does in the reference's queries) and the canonical form omits
it; a ``subset`` left with no prefix at all selects the whole protocol, so it *is* the
``protocol`` scope and canonicalizes to it.

Prefixes are strict (no globs) and match whole segments: ``thread`` matches the protocol
paths ``thread`` and ``thread/reply``, not ``threads``; a contextId prefix is one or more
whole recordIds joined by ``/``. Raw string prefixes would let ``thread`` select ``threads``
and a contextId prefix end inside a CID, neither of which anyone means.

``scopeId`` = the CIDv1 (dag-cbor, sha2-256, base32 ``bafyrei…``) of the canonical wire
object: sha256 over its DAG-CBOR bytes, in the same self-describing text as message CIDs, so
any implementation with a DAG-CBOR encoder recomputes it. Examples in
``protocol/replication-state.md``.

``matches`` tests intent only. ``lists`` is the *effective listing rule*: what a source lists
for the scope, intent plus the closure a sink cannot discover by itself (it asks for what
the engine needs to *apply* a message; these it needs to *answer* in-scope reads as the full
replica does, and to stay correct as the source changes):

1. every ProtocolsConfigure of the protocol (a re-configure reaches a path subset);
2. every message of the permissions protocol (``https://tbd.website/dwn/permissions``:
   requests, grants, revocations, deletes of them, and a configure of that URL should a tenant
   have stored one, which the engine never reads): a grantee's read is judged with the grants and
   revocations (a grant of no protocol covers every one, and a read that cites another
   protocol's grant falls back to what anyone may see, which needs that grant too), and a
   MessagesQuery filtered on the protocol lists the tagged requests;
3. ``subset``: records of the protocol at a ``$role`` path of its stored definition, and
   deletes of them (a reader's role);
4. ``subset``: RecordsDeletes of records that can be ancestors of in-scope records: the
   record's protocolPath is a proper segment prefix of a path prefix (any path when there
   are none) and its contextId a segment prefix of a context prefix (any when there are
   none): a prune there purges in-scope records.

The rule reads :class:`ListingFacts`, all of which a store keeps for the message, and the
role paths; the rest of the closure (ancestors, the roles and grants a writer used) the sink
asks for by reference when the engine refuses for want of them.

Rule 3 reads the role paths when it lists, so a re-configure that makes an existing path a
role relists nothing written there before. A subset sink closes that gap itself: for each
configure of its protocol that is listed to it, it asks the source for every record at the
role paths (:class:`RoleRecordsRef`, a `getDependencies` ref, paged by recordId).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal, TypeAlias, cast

from p2psync.dwn.encoding import compute_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.permissions import PERMISSIONS_PROTOCOL_URI
from p2psync.dwn.replication_types import ReplicationWireError
from p2psync.dwn.urls import normalize_protocol_url
from p2psync.replication.tokens import is_message_cid

__all__ = [
    "MAX_PREFIXES",
    "MAX_PREFIX_CHARS",
    "SCOPE_KINDS",
    "ListingFacts",
    "RoleRecordsRef",
    "ScopeKind",
    "SyncScope",
    "SyncScopeInvalid",
    "SyncScopeUndecidable",
]

ScopeKind: TypeAlias = Literal["global", "protocol", "subset"]
SCOPE_KINDS: Final[tuple[ScopeKind, ...]] = ("global", "protocol", "subset")

# Ours: a scope is written by a person or an app, and every message of a link is matched
# against every prefix; 100 of each is far more than a real selection needs.
MAX_PREFIXES: Final = 100
# Ours: a contextId of 0.5.2's deepest protocol structure (10 levels) is 10 CIDs of 59
# characters plus separators, under 600; 2,048 leaves room without letting a peer send megabytes.
MAX_PREFIX_CHARS: Final = 2048

_WIRE_MEMBERS: Final = frozenset({"kind", "protocol", "protocolPathPrefixes", "contextIdPrefixes"})

# The engine's interface/method names of the messages whose protocol lives elsewhere.
_RECORDS = "Records"
_PROTOCOLS = "Protocols"


class SyncScopeInvalid(DwnError):
    """A scope is malformed or self-contradictory."""

    def __init__(self, detail: str) -> None:
        super().__init__("SyncScopeInvalid", detail, 400)


class SyncScopeUndecidable(DwnError):
    """The object alone does not say whether it is in scope (a RecordsDelete message names
    only its record; its protocol is in its index entries)."""

    def __init__(self, detail: str) -> None:
        super().__init__("SyncScopeUndecidable", detail, 400)


def _segment_prefix(prefix: str, value: str) -> bool:
    """``prefix`` equals ``value`` or is a leading run of its ``/``-separated segments."""
    return value == prefix or (value.startswith(prefix) and value[len(prefix)] == "/")


def _canonical_prefixes(
    values: Any, member: str, check_segment: Callable[[str, str], None] | None = None
) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise SyncScopeInvalid(f"{member} must be a list of strings")
    items = list(values)
    if len(items) > MAX_PREFIXES:
        raise SyncScopeInvalid(f"{member} has more than {MAX_PREFIXES} entries")
    for item in items:
        if not isinstance(item, str):
            raise SyncScopeInvalid(f"{member} must be a list of strings")
        if not item or len(item) > MAX_PREFIX_CHARS:
            raise SyncScopeInvalid(f"each of {member} must be 1 to {MAX_PREFIX_CHARS} characters")
        segments = item.split("/")
        if any(not s for s in segments):
            raise SyncScopeInvalid(f"{member} entry {item!r} has an empty segment (leading, trailing or double '/')")
        if check_segment is not None:
            for s in segments:
                check_segment(item, s)
    # Sorted, a covering prefix comes before everything it covers ("a" < "a/b" < "a0").
    kept: list[str] = []
    for item in sorted(set(items)):
        if not any(_segment_prefix(k, item) for k in kept):
            kept.append(item)
    return tuple(kept)


def _record_id_segment(item: str, segment: str) -> None:
    if not is_message_cid(segment):
        raise SyncScopeInvalid(f"contextIdPrefixes entry {item!r}: {segment!r} is not a recordId (CID)")


@dataclass(frozen=True, slots=True)
class SyncScope:
    """A canonical intent scope. Construction canonicalizes and validates (``SyncScopeInvalid``).

    ``SyncScope("subset", "example.com/p", ("b", "a", "a/x"))`` becomes
    ``SyncScope("subset", "http://example.com/p", ("a", "b"), ())``.
    """

    kind: ScopeKind
    protocol: str | None = None
    protocol_path_prefixes: tuple[str, ...] = ()
    context_id_prefixes: tuple[str, ...] = ()
    scope_id: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in SCOPE_KINDS:
            raise SyncScopeInvalid(f"kind must be one of {', '.join(SCOPE_KINDS)}")
        paths = _canonical_prefixes(self.protocol_path_prefixes, "protocolPathPrefixes")
        contexts = _canonical_prefixes(self.context_id_prefixes, "contextIdPrefixes", _record_id_segment)
        protocol = self.protocol
        kind = self.kind
        if kind == "global":
            if protocol is not None or paths or contexts:
                raise SyncScopeInvalid("a global scope has no protocol and no prefixes")
        else:
            if not isinstance(protocol, str):
                raise SyncScopeInvalid(f"a {kind} scope requires a protocol (string)")
            try:
                protocol = normalize_protocol_url(protocol)
            except DwnError as exc:
                raise SyncScopeInvalid(f"protocol {self.protocol!r} cannot be normalized: {exc.detail}") from None
            if kind == "protocol" and (paths or contexts):
                raise SyncScopeInvalid("a protocol scope has no prefixes; use kind subset")
            if kind == "subset" and not paths and not contexts:
                kind = "protocol"  # selects the whole protocol: the same scope, one id
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "protocol", protocol)
        object.__setattr__(self, "protocol_path_prefixes", paths)
        object.__setattr__(self, "context_id_prefixes", contexts)
        object.__setattr__(self, "scope_id", compute_cid(self.to_wire()))

    # -- constructors ----------------------------------------------------------------------

    @classmethod
    def global_scope(cls) -> SyncScope:
        """Every message of the tenant."""
        return cls("global")

    @classmethod
    def for_protocol(cls, protocol: str) -> SyncScope:
        """Every message of one protocol."""
        return cls("protocol", protocol)

    @classmethod
    def subset(
        cls, protocol: str, protocol_path_prefixes: Iterable[str] = (), context_id_prefixes: Iterable[str] = ()
    ) -> SyncScope:
        """Part of one protocol, by protocolPath and/or contextId prefixes."""
        return cls("subset", protocol, tuple(protocol_path_prefixes), tuple(context_id_prefixes))

    # -- wire ------------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The canonical JSON/CBOR object (members absent, never null or empty)."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.protocol is not None:
            out["protocol"] = self.protocol
        if self.protocol_path_prefixes:
            out["protocolPathPrefixes"] = list(self.protocol_path_prefixes)
        if self.context_id_prefixes:
            out["contextIdPrefixes"] = list(self.context_id_prefixes)
        return out

    @classmethod
    def from_wire(cls, obj: Any) -> SyncScope:
        """Parse a scope object strictly and canonicalize it (unknown members are refused)."""
        if not isinstance(obj, Mapping):
            raise SyncScopeInvalid("a scope is an object")
        unknown = sorted(str(k) for k in set(obj) - _WIRE_MEMBERS)
        if unknown:
            raise SyncScopeInvalid(f"unknown scope members: {', '.join(unknown)}")
        kind = obj.get("kind")
        if kind not in SCOPE_KINDS:
            raise SyncScopeInvalid(f"kind must be one of {', '.join(SCOPE_KINDS)}")
        for member in ("protocolPathPrefixes", "contextIdPrefixes"):
            if member in obj and not isinstance(obj[member], list):
                raise SyncScopeInvalid(f"{member} must be a list of strings")
        # An explicit null is not "absent": JSON and CBOR writers that emit null are refused,
        # so one meaning never has two spellings.
        for member in ("protocol", "protocolPathPrefixes", "contextIdPrefixes"):
            if member in obj and obj[member] is None:
                raise SyncScopeInvalid(f"{member} must be absent rather than null")
        return cls(
            cast(ScopeKind, kind),
            obj.get("protocol"),
            tuple(obj.get("protocolPathPrefixes", ())),
            tuple(obj.get("contextIdPrefixes", ())),
        )

    # -- matching --------------------------------------------------------------------------

    def matches(self, indexes_or_message: Mapping[str, Any]) -> bool:
        """Whether a message is in this (intent) scope.

        Takes either the index key-values the store and event log keep for a message (any
        stored message can be decided from them) or the message itself (one with a
        ``descriptor``). A RecordsDelete message alone names no protocol: it raises
        ``SyncScopeUndecidable`` for a non-global scope; pass its indexes instead.
        """
        if self.kind == "global":
            return True
        protocol, protocol_path, context_id = _facts(indexes_or_message)
        if protocol != self.protocol:
            return False
        if self.kind == "protocol":
            return True
        if self.protocol_path_prefixes and not (
            isinstance(protocol_path, str)
            and any(_segment_prefix(p, protocol_path) for p in self.protocol_path_prefixes)
        ):
            return False
        return not self.context_id_prefixes or (
            isinstance(context_id, str) and any(_segment_prefix(p, context_id) for p in self.context_id_prefixes)
        )

    def lists(self, facts: ListingFacts, role_paths: Collection[str] = ()) -> bool:
        """Whether a source lists a message for this scope: the effective listing rule (the
        module doc; protocol/replication-state.md states it for other implementations).

        ``role_paths`` are the ``$role`` paths of the newest stored definition of the scope's
        protocol (read only for a ``subset``).
        """
        if self.kind == "global":
            return True
        if facts.protocol == PERMISSIONS_PROTOCOL_URI:
            # Every permission request, grant and revocation (and delete of one): those of the
            # protocol and of none decide what a grantee may read of it, and a read that cites
            # another protocol's grant is answered by falling back to what anyone may see,
            # which needs that grant here too. The permissions protocol whole, so the scope's
            # set is two protocols' stored sets (anti-entropy.md §1): a configure of its URL too.
            # Whole also when it is the scope's own protocol: a subset of it would leave out
            # the revocations that end the grants it holds.
            return True
        if facts.protocol != self.protocol:
            return False
        if self.kind == "protocol":
            return True
        if facts.interface == _PROTOCOLS:
            return facts.method == "Configure"
        if facts.interface != _RECORDS:
            return False
        path, context = facts.protocol_path, facts.context_id
        if path is None:
            return False
        if path in role_paths:
            return True
        if self._intent(path, context):
            return True
        if facts.method != "Delete":
            return False
        # A delete of a record that can be an ancestor of in-scope records.
        paths, contexts = self.protocol_path_prefixes, self.context_id_prefixes
        if paths and not any(p != path and _segment_prefix(path, p) for p in paths):
            return False
        return not contexts or (context is not None and any(_segment_prefix(context, c) for c in contexts))

    def _intent(self, path: str, context: str | None) -> bool:
        """A subset's intent test on a record of its protocol."""
        if self.protocol_path_prefixes and not any(_segment_prefix(p, path) for p in self.protocol_path_prefixes):
            return False
        return not self.context_id_prefixes or (
            context is not None and any(_segment_prefix(p, context) for p in self.context_id_prefixes)
        )


@dataclass(frozen=True, slots=True)
class ListingFacts:
    """What the effective listing rule (:meth:`SyncScope.lists`) reads of one stored message:
    those of the message's indexes (a RecordsDelete's are its record's; a ProtocolsConfigure's
    protocol is its definition's)."""

    interface: str | None
    method: str | None
    protocol: str | None
    protocol_path: str | None = None
    context_id: str | None = None

    @classmethod
    def of(cls, indexes_or_message: Mapping[str, Any]) -> ListingFacts:
        """The facts of a message (not a RecordsDelete: it names no protocol) or of the index
        key-values stored for it."""
        descriptor = indexes_or_message.get("descriptor")
        source = descriptor if isinstance(descriptor, Mapping) else indexes_or_message
        protocol, protocol_path, context_id = _facts(indexes_or_message)
        return cls(_str(source.get("interface")), _str(source.get("method")), _str(protocol), _str(protocol_path),
                   _str(context_id))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _facts(obj: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(protocol, protocolPath, contextId) of indexes or of a message."""
    descriptor = obj.get("descriptor")
    if not isinstance(descriptor, Mapping):
        return obj.get("protocol"), obj.get("protocolPath"), obj.get("contextId")
    interface = descriptor.get("interface")
    method = descriptor.get("method")
    if interface == _PROTOCOLS and method == "Configure":
        definition = descriptor.get("definition")
        protocol = definition.get("protocol") if isinstance(definition, Mapping) else None
        return protocol, None, None
    if interface == _RECORDS and method == "Delete":
        raise SyncScopeUndecidable("a RecordsDelete message names no protocol; match its indexes")
    return descriptor.get("protocol"), descriptor.get("protocolPath"), obj.get("contextId")


@dataclass(frozen=True, slots=True)
class RoleRecordsRef:
    """A `getDependencies` ref (replication-profiles.md §10.2): the records of ``protocol`` at
    the ``$role`` paths of the source's newest definition of it, whose recordId sorts after
    ``after`` (a page's continuation). Not a dependency an engine names: a subset sink asks it
    when a configure of its protocol is listed, since rule 3 of :meth:`SyncScope.lists` never
    relists what was written at a path before a re-configure made it a role."""

    protocol: str
    after: str | None = None

    TYPE: ClassVar[str] = "RoleRecords"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE, "protocol": self.protocol}
        if self.after is not None:
            out["after"] = self.after
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RoleRecordsRef:
        """Parse one (``type`` already read); :class:`ReplicationWireError` when malformed."""
        protocol, after = obj.get("protocol"), obj.get("after")
        if not isinstance(protocol, str) or not 0 < len(protocol) <= MAX_PREFIX_CHARS:
            raise ReplicationWireError("RoleRecords ref: protocol must be a protocol URL")
        if after is not None and not (isinstance(after, str) and is_message_cid(after)):
            raise ReplicationWireError("RoleRecords ref: after must be a recordId")
        return cls(protocol, after)
