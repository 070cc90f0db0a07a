"""The one error tree (p2psync.errors): its branches, the retry table, the one-line
descriptions, and a Refusal's round trip through a BLIP ERR reply."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from p2psync import blip, errors
from p2psync.blip import BlipError, ConnectionClosed, ProtocolError
from p2psync.dwn.errors import DwnError, bad_request
from p2psync.dwn.store import Store
from p2psync.errors import (
    RETRY_RULES,
    CheckpointRevConflict,
    Disconnected,
    Disposition,
    ErrorReply,
    HandshakeFailed,
    InputRejected,
    LocalFailure,
    LocalMisuse,
    P2PSyncError,
    QuotaExceeded,
    Refusal,
    describe,
    disposition,
    error_name,
    is_retryable,
    retry_after,
)
from p2psync.node.node import NodeError
from p2psync.peer.session import from_blip, to_blip
from p2psync.replication.effects import ConnectionLost
from p2psync.replication.wire import ERROR_DOMAIN, PeerError, refuse
from p2psync.state.committer import StoreUnavailable
from p2psync.state.copies import CheckpointCopies, CopyRevConflict

URL = "ws://10.77.0.1:4984/_p2psync"

# -- the tree ---------------------------------------------------------------------------------


def test_errors_py_is_the_bottom_layer() -> None:
    """It imports nothing from p2psync, so every layer may hang its errors below it."""
    tree = ast.parse(Path(errors.__file__).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m.split(".")[0] == "p2psync"]


@pytest.mark.parametrize(
    ("exc", "branch"),
    [
        (LocalMisuse("collection index out of range"), LocalMisuse),
        (PeerError(403, "SyncNotAuthorized", "no grant"), Refusal),
        (CheckpointRevConflict("2-ab"), Refusal),
        (ConnectionLost("closed"), Refusal),
        (DwnError("RecordsWriteDataCidMismatch", "dataCid differs", 400), InputRejected),
        (bad_request("SyncScopeInvalid"), InputRejected),
        (BlipError("BLIP", 404, "no handler"), ErrorReply),
        (ConnectionClosed("peer went away", close_code=1006, close_text=""), Disconnected),
        (Disconnected("stream ended"), Disconnected),
        (HandshakeFailed("bad proof"), HandshakeFailed),
        (StoreUnavailable("the commit failed: disk I/O error"), LocalFailure),
        (NodeError("ListenFailed", "cannot listen on 127.0.0.1:4984: Address already in use"), LocalFailure),
        (ProtocolError("bad varint"), P2PSyncError),
    ],
)
def test_every_error_hangs_in_one_branch(exc: P2PSyncError, branch: type[P2PSyncError]) -> None:
    assert isinstance(exc, branch)
    branches = (LocalMisuse, Refusal, InputRejected, ErrorReply, Disconnected, HandshakeFailed, LocalFailure)
    assert [b for b in branches if isinstance(exc, b)] == ([] if branch is P2PSyncError else [branch])


def test_the_peer_layers_names_are_the_trees_classes() -> None:
    assert PeerError is Refusal
    assert CopyRevConflict is CheckpointRevConflict
    # A raw ERR and a DWN refusal are refusals in meaning, not in shape (their `code` differs):
    # `except PeerError` keeps catching only what the peer layer has read.
    assert not issubclass(BlipError, Refusal) and not issubclass(DwnError, Refusal)


def test_existing_constructors_and_attributes_are_unchanged() -> None:
    dwn = DwnError("RecordsWriteDataCidMismatch", "dataCid differs", 400)
    assert (dwn.code, dwn.detail, dwn.status, dwn.message) == (
        "RecordsWriteDataCidMismatch", "dataCid differs", 400, "RecordsWriteDataCidMismatch: dataCid differs")
    err = BlipError("P2PSync", 403, "x")
    assert (err.domain, err.code, err.message, str(err)) == ("P2PSync", 403, "x", "P2PSync 403: x")
    assert err == BlipError("P2PSync", 403, "x") and hash(err) == hash(BlipError("P2PSync", 403, "x"))
    closed = ConnectionClosed("gone", close_code=1008, close_text="P2PSync 401 HelloTimeout")
    assert (closed.reason, closed.close_code, closed.close_text, str(closed)) == (
        "gone", 1008, "P2PSync 401 HelloTimeout", "gone")
    assert ConnectionClosed().reason == "connection closed"
    refusal = PeerError(503, "Busy")
    assert (refusal.code, refusal.name, refusal.detail, refusal.body, str(refusal)) == (
        503, "Busy", "", {"code": "Busy", "detail": ""}, "P2PSync 503 Busy")
    assert str(PeerError(403, "SyncNotAuthorized", "no grant")) == "P2PSync 403 SyncNotAuthorized: no grant"


def test_mapped_errors_read_as_refusals() -> None:
    assert errors.as_refusal(DwnError("CheckpointInvalid", "bad token", 400)).__dict__ == Refusal(
        400, "CheckpointInvalid", "bad token").__dict__
    read = errors.as_refusal(StoreUnavailable("the commit failed: disk full"))
    assert read is not None and (read.code, read.name, read.detail) == (503, "StoreUnavailable",
                                                                     "the commit failed: disk full")
    refusal = PeerError(404, "CollectionNotFound")
    assert errors.as_refusal(refusal) is refusal
    assert errors.as_refusal(ConnectionClosed()) is None and errors.as_refusal(ValueError()) is None
    assert errors.as_refusal(BlipError("BLIP", 501, "handler failed")) is None  # the peer reads those


# -- one form of the checkpoint rev conflict ----------------------------------------------------


def test_a_rev_conflict_carries_the_current_rev() -> None:
    conflict = CheckpointRevConflict("3-0123")
    assert (conflict.code, conflict.name, conflict.current) == (409, "CheckpointRevConflict", "3-0123")
    assert conflict.body == {"code": "CheckpointRevConflict", "detail": "rev is not the stored one", "rev": "3-0123"}
    assert "rev" not in CheckpointRevConflict(None).body  # nothing stored yet


def test_the_store_raises_the_refusal_the_peer_answers_with(tmp_path: Path) -> None:
    copies = CheckpointCopies(Store(tmp_path / "s.db"))
    rev = copies.set("did:key:z6Mkpeer", "cp", {"pull": {}, "push": {}}, None)
    with pytest.raises(PeerError) as caught:
        copies.set("did:key:z6Mkpeer", "cp", {"pull": {}, "push": {}}, "1-stale")
    assert isinstance(caught.value, CheckpointRevConflict) and caught.value.current == rev
    # The very refusal the passive's setCheckpoint answers with (p2psync.state.service).
    with pytest.raises(PeerError) as answered:
        refuse(409, "CheckpointRevConflict", "rev is not the stored one", rev=rev)
    assert caught.value.body == answered.value.body
    assert to_blip(caught.value) == to_blip(answered.value)


# -- BLIP ERR round trip (p2psync.peer.session's to_blip and from_blip) ---------------------------


def test_a_refusal_is_written_as_the_13_body() -> None:
    err = to_blip(CheckpointRevConflict("2-ab", "stale"))
    assert (err.domain, err.code) == (ERROR_DOMAIN, 409)
    assert err.message == '{"code":"CheckpointRevConflict","detail":"stale","rev":"2-ab"}'


def _read(err: BlipError) -> Refusal:
    """What the peer reads, as the class its name has."""
    read = from_blip(err)
    return Refusal.read(read.code, read.name, read.detail, read.body)


def test_a_rev_conflict_is_read_back_as_its_class() -> None:
    read = _read(to_blip(CheckpointRevConflict("2-ab", "stale")))
    assert isinstance(read, CheckpointRevConflict) and read.current == "2-ab" and read.detail == "stale"
    odd = Refusal.read(409, "CheckpointRevConflict", "stale", {"code": "CheckpointRevConflict", "rev": 7})
    assert isinstance(odd, CheckpointRevConflict) and odd.current is None
    assert type(Refusal.read(409, "FeedActive", "busy")) is Refusal


def test_an_unreadable_body_still_reads_as_a_refusal() -> None:
    read = _read(BlipError(ERROR_DOMAIN, 400, "not json"))
    assert (read.code, read.name, read.detail, read.body) == (400, "Unknown", "not json",
                                                             {"code": "Unknown", "detail": "not json"})


def test_a_blip_domain_error_reads_as_blip_code() -> None:
    read = _read(BlipError("BLIP", 404, "no handler for getCollections"))
    assert (read.code, read.name, read.detail) == (404, "BLIP404", "no handler for getCollections")


_names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), min_size=1, max_size=24)


@given(code=st.integers(100, 599), name=_names, detail=st.text(max_size=40),
       extra=st.dictionaries(st.sampled_from(["rev", "retryAfter", "versions"]),
                             st.one_of(st.integers(0, 2**31), st.text(max_size=10)), max_size=2))
def test_every_refusal_round_trips_through_an_err(code: int, name: str, detail: str, extra: dict[str, object]) -> None:
    sent = Refusal.read(code, name, detail, {"code": name, "detail": detail, **extra})
    read = _read(to_blip(sent))
    assert type(read) is type(sent)
    assert (read.code, read.name, read.detail, read.body) == (sent.code, sent.name, sent.detail, sent.body)
    assert to_blip(read) == to_blip(sent)


async def test_a_refusal_crosses_a_real_connection() -> None:
    """A handler answers with the ERR of a refusal; the requester reads the same refusal back."""

    async def set_checkpoint(request: blip.Request) -> blip.Reply:
        raise to_blip(CheckpointRevConflict("5-feed"))

    async with blip.memory_pair(handlers_b={"setCheckpoint": set_checkpoint}) as (a, _):
        with pytest.raises(BlipError) as caught:
            await a.request("setCheckpoint", {}, b"")
    read = _read(caught.value)
    assert isinstance(read, CheckpointRevConflict) and read.current == "5-feed"


# -- the retry table ---------------------------------------------------------------------------


def _old_retryable(exc: BaseException) -> bool:
    """p2psync.peer.peer._retryable before the table, as the oracle of the same decisions."""
    if isinstance(exc, blip.ConnectionClosed | OSError):
        return True
    if isinstance(exc, PeerError):
        return exc.code in (409, 424, 503) and exc.name not in ("RoleMismatch", "FeedActive") or exc.code == 410
    return False


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (CheckpointRevConflict("1-a"), Disposition.RETRY),
        (PeerError(409, "ChangesUnsolicited"), Disposition.RETRY),
        (PeerError(409, "RoleMismatch"), Disposition.TERMINAL),
        (PeerError(409, "FeedActive"), Disposition.TERMINAL),
        (PeerError(410, "ProgressGap"), Disposition.RETRY),
        (PeerError(424, "AttachmentUnavailable"), Disposition.RETRY),
        (PeerError(503, "Busy"), Disposition.RETRY),
        (PeerError(503, "ConnectionLost", "closed"), Disposition.RETRY),
        (ConnectionLost("closed"), Disposition.RETRY),
        (PeerError(400, "BodyInvalid"), Disposition.TERMINAL),
        (PeerError(401, "HelloRequired"), Disposition.TERMINAL),
        (PeerError(403, "SyncNotAuthorized"), Disposition.TERMINAL),
        (PeerError(404, "CollectionNotFound"), Disposition.TERMINAL),
        (PeerError(413, "TooManyRefs"), Disposition.TERMINAL),
        (PeerError(501, "BLIP501", "handler failed"), Disposition.TERMINAL),
        (ConnectionClosed("gone"), Disposition.RETRY),
        (ConnectionRefusedError(111, "Connection refused"), Disposition.RETRY),
        (HandshakeFailed("bad proof"), Disposition.TERMINAL),
        (DwnError("SyncScopeInvalid", "no"), Disposition.TERMINAL),
        (StoreUnavailable("the commit failed"), Disposition.TERMINAL),
        (LocalMisuse("bug"), Disposition.TERMINAL),
        (trio.TooSlowError(), Disposition.TERMINAL),
        (ValueError("anything else"), Disposition.TERMINAL),
    ],
)
def test_the_retry_table(exc: BaseException, expected: Disposition) -> None:
    assert disposition(exc) is expected
    assert is_retryable(exc) is (expected is Disposition.RETRY) is _old_retryable(exc)


@given(code=st.sampled_from([400, 401, 403, 404, 409, 410, 413, 424, 500, 501, 503]) | st.integers(100, 599),
       name=st.sampled_from(["RoleMismatch", "FeedActive", "CheckpointRevConflict", "ProgressGap", "Busy",
                             "HelloRepeated", "Stalled"]) | _names)
def test_the_table_decides_as_peer_py_did(code: int, name: str) -> None:
    exc = PeerError(code, name)
    assert is_retryable(exc) is _old_retryable(exc)


def test_every_rule_says_why_and_is_reachable() -> None:
    for i, rule in enumerate(RETRY_RULES):
        assert rule.why
        probe = PeerError(rule.code or 409, rule.name or "Probe")
        assert next(r for r in RETRY_RULES if r.matches(probe)) is rule, f"row {i} is shadowed"


def test_a_spent_peer_budget_is_retried_after_its_window_and_a_full_tenant_is_not() -> None:
    """429 PeerQuotaExceeded renews with the window (its retryAfter); 507 TenantQuotaExceeded
    stays until the receiving node's operator raises the quota (issue #15)."""
    spent = QuotaExceeded(*QuotaExceeded.PEER, "budget spent", retry_after=1200)
    full = QuotaExceeded(*QuotaExceeded.TENANT, "tenant is full")
    assert is_retryable(spent) and disposition(full) is Disposition.TERMINAL
    assert retry_after(spent) == 1200 and retry_after(full) is None
    assert retry_after(PeerError(503, "Busy", "", {"code": "Busy", "detail": "", "retryAfter": 5})) == 5
    assert retry_after(ConnectionClosed()) is None
    assert (spent.kind, full.kind) == ("peer", "tenant")
    # Another 429 (not ours) keeps the table's default.
    assert not is_retryable(PeerError(429, "TooManyRequests"))


def test_a_quota_refusal_is_read_back_with_its_retry_after() -> None:
    sent = QuotaExceeded(*QuotaExceeded.PEER, "budget spent", retry_after=77)
    assert sent.body == {"code": "PeerQuotaExceeded", "detail": "budget spent", "retryAfter": 77}
    read = _read(to_blip(sent))
    assert isinstance(read, QuotaExceeded) and read.retry_after == 77 and not read.local
    full = _read(to_blip(QuotaExceeded(*QuotaExceeded.TENANT, "full", local=True)))
    assert isinstance(full, QuotaExceeded) and full.retry_after is None and not full.local
    assert error_name(full) == "507 TenantQuotaExceeded"


def test_a_group_is_decided_by_its_meaningful_leaf() -> None:
    group = BaseExceptionGroup("round", [trio.Cancelled._create(), ConnectionClosed("gone")])
    assert errors.leaf(group).__class__ is ConnectionClosed and is_retryable(group)


# -- one line for a user -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (PeerError(403, "SyncNotAuthorized", "no grant"), f"{URL} refused: 403 SyncNotAuthorized: no grant"),
        (PeerError(503, "Busy"), f"{URL} refused: 503 Busy"),
        (CheckpointRevConflict("1-a", "the copy changed twice while saving"),
         f"{URL} refused: 409 CheckpointRevConflict: the copy changed twice while saving"),
        (PeerError(503, "ConnectionLost", "peer closed the stream"),
         f"lost the connection to {URL}: peer closed the stream"),
        (ConnectionLost("peer closed the stream"), f"lost the connection to {URL}: peer closed the stream"),
        (HandshakeFailed("HelloProofInvalid"), f"hello with {URL} failed: HelloProofInvalid"),
        (BlipError("BLIP", 404, "no handler"), f"{URL} answered an error: BLIP 404: no handler"),
        (ConnectionClosed("the peer closed the connection"),
         f"the connection to {URL} closed: the peer closed the connection"),
        (trio.TooSlowError(), f"{URL} did not answer in time"),
        (ConnectionRefusedError(111, "Connection refused"), f"cannot connect to {URL}: Connection refused"),
        (DwnError("SyncScopeInvalid", "protocol must be a URL"), "SyncScopeInvalid: protocol must be a URL"),
        (StoreUnavailable("the commit failed: disk full"), "the commit failed: disk full"),
        (QuotaExceeded(*QuotaExceeded.TENANT, "tenant did:key:z6Mka is at its quota"),
         f"{URL} refused: 507 TenantQuotaExceeded: tenant did:key:z6Mka is at its quota"),
        (QuotaExceeded(*QuotaExceeded.TENANT, "tenant did:key:z6Mka is at its quota", local=True),
         f"stopped taking messages from {URL}: 507 TenantQuotaExceeded: tenant did:key:z6Mka is at its quota"),
        (NodeError("ListenFailed", "cannot listen on 127.0.0.1:4984: Address in use"),
         "cannot listen on 127.0.0.1:4984: Address in use"),
    ],
)
def test_one_line_per_failure(exc: BaseException, line: str) -> None:
    assert describe(exc, URL) == line
    assert "\n" not in line


def test_a_bug_is_not_explained_away() -> None:
    """No one line for our own bugs (or anything unknown): the caller shows the traceback."""
    assert describe(LocalMisuse("index out of range"), URL) is None
    assert describe(KeyError("x"), URL) is None


def test_a_group_is_described_by_its_leaf() -> None:
    group = ExceptionGroup("round", [PeerError(403, "PushRefused", "no pushes")])
    assert describe(group, URL) == f"{URL} refused: 403 PushRefused: no pushes"


def test_the_ledger_keeps_short_names() -> None:
    assert error_name(PeerError(403, "SyncNotAuthorized", "x")) == "403 SyncNotAuthorized"
    assert error_name(CheckpointRevConflict(None)) == "409 CheckpointRevConflict"
    assert error_name(ConnectionClosed()) == "ConnectionClosed"
