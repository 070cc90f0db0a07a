"""Sans-I/O replication logic.

``closure`` admits one replicated message with its dependencies (:class:`ClosureAdmitter`);
``local`` runs it between two stores in one process. The apply result and dependency-ref
types are the engine's (``p2psync.dwn.replication_types``), re-exported here.
"""

from p2psync.dwn.replication_types import (
    Ancestor,
    Applied,
    CrossProtocolRef,
    Deferred,
    DependencyRef,
    Duplicate,
    Grant,
    Incomplete,
    InitialWrite,
    Invalid,
    KeyDelivery,
    Parent,
    Protocol,
    RecordData,
    ReplicationApplyResult,
    ReplicationWireError,
    Role,
    Superseded,
    ref_from_json,
    result_from_json,
    telemetry_status,
)
from p2psync.replication.closure import (
    MAX_ADMISSION_PASSES,
    Applier,
    ApplyRequest,
    ClosureAdmitter,
    ClosureOutcome,
    DependencyFetcher,
    FetchRequest,
    ReplicationEntry,
)

__all__ = [
    "MAX_ADMISSION_PASSES",
    "Ancestor",
    "Applied",
    "Applier",
    "ApplyRequest",
    "ClosureAdmitter",
    "ClosureOutcome",
    "CrossProtocolRef",
    "Deferred",
    "DependencyFetcher",
    "DependencyRef",
    "Duplicate",
    "FetchRequest",
    "Grant",
    "Incomplete",
    "InitialWrite",
    "Invalid",
    "KeyDelivery",
    "Parent",
    "Protocol",
    "RecordData",
    "ReplicationApplyResult",
    "ReplicationEntry",
    "ReplicationWireError",
    "Role",
    "Superseded",
    "ref_from_json",
    "result_from_json",
    "telemetry_status",
]
