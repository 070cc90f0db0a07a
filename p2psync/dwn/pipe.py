"""The interop pipe: one JSON request per input line, exactly one JSON reply per output line.

Both our engine and the reference DWN's harness (``interop/harness.mjs``) speak it, so one
scenario can be fed to both and the answers compared. The format is in
``protocol/interop-pipe.md``. A malformed line gets a 400 reply; the pipe never dies on input.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from typing import IO, Any

from p2psync.dwn import memo
from p2psync.dwn.encoding import b64url_decode, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.replicated import apply_replicated_message_json
from p2psync.dwn.reply import Reply
from p2psync.dwn.store import Store

_JS_MAX_SAFE_INTEGER = 2**53 - 1


def _parse_int(text: str) -> int | float:
    # JSON.parse turns integers beyond 2**53 into doubles; do the same so CIDs agree.
    value = int(text)
    return value if abs(value) <= _JS_MAX_SAFE_INTEGER else float(value)


def parse_json_line(line: str) -> Any:
    """Parse a JSON value with JavaScript's number semantics."""
    return json.loads(line, parse_int=_parse_int)


def _safe_cid(message: Any) -> str | None:
    if not isinstance(message, dict):
        return None
    try:
        return message_cid(message)
    except (DwnError, TypeError, ValueError):
        return None


def _entry_summary(entry: dict[str, Any]) -> dict[str, Any]:
    if set(entry) == {"cid"}:  # a MessagesQuery entry is already the logged message's CID
        return {"cid": entry["cid"]}
    stored = {k: v for k, v in entry.items() if k not in ("encodedData", "initialWrite")}
    out: dict[str, Any] = {}
    if "recordId" in entry:
        out["recordId"] = entry["recordId"]
    out["cid"] = message_cid(stored)
    if "initialWrite" in entry:
        out["initialWriteCid"] = message_cid(entry["initialWrite"])
    return out


def _status(code: int, detail: str) -> dict[str, Any]:
    return {"code": code, "detail": detail}


Applier = Callable[[str, Any, bytes | None], dict[str, Any]]


class PipeSession:
    """Answers pipe requests against one engine; ``apply`` is served when an applier is given."""

    def __init__(self, dwn: Dwn, apply: Applier | None = None) -> None:
        self.dwn = dwn
        self.apply = apply

    def handle_line(self, line: str) -> dict[str, Any]:
        try:
            request = parse_json_line(line)
        except ValueError as exc:
            return {"cid": None, "status": _status(400, f"PipeRequestInvalid: not JSON: {exc}")}
        if not isinstance(request, dict):
            return {"cid": None, "status": _status(400, "PipeRequestInvalid: a request is a JSON object")}
        message = request.get("message")
        # The engine derives the same CID again: keep it for the length of this request.
        with memo.processing(message):
            return self._handle(request, message)

    def _handle(self, request: dict[str, Any], message: Any) -> dict[str, Any]:
        cid = _safe_cid(message)
        op, tenant = request.get("op"), request.get("tenant")
        if op not in ("process", "query", "apply"):
            return {"cid": cid, "status": _status(400, f"PipeRequestInvalid: unknown op {op!r}")}
        if not isinstance(tenant, str):
            return {"cid": cid, "status": _status(400, "PipeRequestInvalid: tenant must be a DID string")}
        data: bytes | None = None
        if "data" in request:
            try:
                data = b64url_decode(request["data"])
            except DwnError as exc:
                return {"cid": cid, "status": _status(400, f"PipeRequestInvalid: data: {exc}")}
        if op == "apply":
            if self.apply is None:
                return {"cid": cid, "status": _status(400, "PipeRequestInvalid: apply is not supported")}
            return {"cid": cid, "result": self.apply(tenant, message, data)}
        reply = self.dwn.process_message(tenant, message, data)
        return self._render(op, cid, reply)

    @staticmethod
    def _render(op: str, cid: str | None, reply: Reply) -> dict[str, Any]:
        out: dict[str, Any] = {"cid": cid, "status": _status(reply.code, reply.detail)}
        if reply.data is not None:
            out["data_sha256"] = hashlib.sha256(reply.data).hexdigest()
        if op == "query":
            out["entries"] = [_entry_summary(e) for e in reply.entries or []]
        return out


def run_pipe(store_path: str, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> int:
    """Serve the pipe over stdin/stdout until end of input."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    dwn = Dwn(Store(store_path))
    session = PipeSession(dwn, _replicated_apply(dwn))
    try:
        for line in stdin:
            try:
                reply = session.handle_line(line)
            except Exception as exc:  # the pipe never dies on input
                reply = {"cid": None, "status": _status(500, f"InternalError: {type(exc).__name__}: {exc}")}
            stdout.write(json.dumps(reply, separators=(",", ":")) + "\n")
            stdout.flush()
    finally:
        dwn.close()
    return 0


def _replicated_apply(dwn: Dwn) -> Applier:
    return lambda tenant, message, data: apply_replicated_message_json(dwn, tenant, message, data)
