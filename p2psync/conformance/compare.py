"""Comparison of pipe replies: pure functions, no I/O.

Replies are compared on what is deterministic across implementations: the status code, the
message CID, the sha256 of returned data, and for queries the entries (recordId, cid,
initialWriteCid, in order). Status details are free text (the reference sometimes returns
raw library messages) and are never compared.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from p2psync.conformance.scenario import Expectation

# The fields of a query entry that are compared, in report order.
ENTRY_FIELDS = ("recordId", "cid", "initialWriteCid")


def reply_code(reply: Mapping[str, Any]) -> int | None:
    """``status.code`` of a reply, or None when the reply has no integer code."""
    status = reply.get("status")
    if isinstance(status, Mapping):
        code = status.get("code")
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    return None


def normalized_entries(raw: Any) -> list[dict[str, Any]] | None:
    """The compared fields of each entry; a missing entry list counts as empty.

    Returns None when ``entries`` is present but not a list of objects.
    """
    if raw is None:
        return []
    if not isinstance(raw, list):
        return None
    out: list[dict[str, Any]] = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            return None
        out.append({k: entry.get(k) for k in ENTRY_FIELDS})
    return out


def _short(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _entries_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> str:
    head = f"{len(a)} vs {len(b)} entries" if len(a) != len(b) else f"{len(a)} entries each"
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            fields = [
                f"{k} {_short(x.get(k))} vs {_short(y.get(k))}"
                for k in ENTRY_FIELDS
                if x.get(k) != y.get(k)
            ]
            return f"{head}; first difference at entry {i}: " + ", ".join(fields)
    return head + "; one list is a prefix of the other"


def compare_replies(a: Mapping[str, Any], b: Mapping[str, Any], *, is_query: bool) -> list[str]:
    """Differences between two replies to the same request (empty when they agree)."""
    diffs: list[str] = []
    code_a, code_b = reply_code(a), reply_code(b)
    if code_a is None or code_b is None:
        diffs.append(
            f"malformed reply: status.code A={_short(a.get('status'))} B={_short(b.get('status'))}"
        )
    elif code_a != code_b:
        diffs.append(f"code: A={code_a} B={code_b}")
    if a.get("cid") != b.get("cid"):
        diffs.append(f"cid: A={_short(a.get('cid'))} B={_short(b.get('cid'))}")
    if a.get("data_sha256") != b.get("data_sha256"):
        diffs.append(
            f"data_sha256: A={_short(a.get('data_sha256'))} B={_short(b.get('data_sha256'))}"
        )
    if is_query:
        ea, eb = normalized_entries(a.get("entries")), normalized_entries(b.get("entries"))
        if ea is None or eb is None:
            diffs.append("entries: not a list of objects on " + ("A" if ea is None else "B"))
        elif ea != eb:
            diffs.append("entries: " + _entries_difference(ea, eb))
    return diffs


def check_expectation(
    expect: Expectation, reply: Mapping[str, Any], *, is_query: bool, strict: bool = False
) -> list[str]:
    """Differences between a reply and a step's recorded expectation.

    Only the code is checked unless ``strict``; then every recorded field (cid, data_sha256,
    entries) must match as well.
    """
    diffs: list[str] = []
    code = reply_code(reply)
    if code != expect.code:
        diffs.append(f"expected code {expect.code}, got {code}")
    if not strict:
        return diffs
    if expect.cid is not None and reply.get("cid") != expect.cid:
        diffs.append(f"expected cid {expect.cid}, got {_short(reply.get('cid'))}")
    got_sha = reply.get("data_sha256")
    if got_sha != expect.data_sha256:
        diffs.append(f"expected data_sha256 {_short(expect.data_sha256)}, got {_short(got_sha)}")
    if is_query and expect.entries is not None:
        want = normalized_entries(list(expect.entries))
        got = normalized_entries(reply.get("entries"))
        if got is None:
            diffs.append("entries: not a list of objects")
        elif want != got:
            assert want is not None
            diffs.append("entries (expected vs got): " + _entries_difference(want, got))
    return diffs
