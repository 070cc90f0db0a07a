"""The interop pipe: one JSON request per input line, exactly one JSON reply per output line.

Both our engine and the reference DWN's harness (``interop/harness.mjs``) speak it, so one
scenario can be fed to both and the answers compared. The format is in
``protocol/interop-pipe.md``. A malformed line gets a 400 reply; the pipe never dies on input.

A reply leaves once what its request changed is committed. Requests that are already waiting
when one is taken share a commit (:data:`PIPE_BATCH_MAX` at most), each still processed on its
own savepoint, in order: a commit cost about a third of a 1 KiB write here (issue #17). A
client that sends one request and waits for its reply still gets a commit of its own.
"""

from __future__ import annotations

import hashlib
import json
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, Final

import apsw

from p2psync.dwn import memo
from p2psync.dwn.encoding import b64url_decode, compact_json_encoder, in_dag_cbor_order, message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.replicated import apply_replicated_message_json
from p2psync.dwn.reply import Reply
from p2psync.dwn.store import Store

_JS_MAX_SAFE_INTEGER = 2**53 - 1

#: Requests that share one commit at most. A commit writes every page its writes dirtied, and
#: each index keyed by a random CID dirties about one page a write until a batch is as large as
#: the index has leaves. With an 8 MiB page cache (the store's :data:`~p2psync.dwn.store.CACHE_KIB`
#: is larger), 10,000 1 KiB writes in a row wrote 28.6 KiB a write to the WAL in 11.6 write
#: calls at 256, 39.4 KiB in 16.8 at 64 (issue #17); with the store's 16 MiB cache, 11.6
#: write calls a write at 256, 9.7 at 512, 8.5 at 1,024 (-6 µs system CPU a write at 512). A
#: full batch holds the store's write lock ~0.2 s, well under another writer's busy timeout
#: (p2psync/dwn/store.py); the node's committer keeps its own 256 (state/committer.py).
PIPE_BATCH_MAX: Final = 512

# Replies are written as json.dumps(reply, separators=(",", ":")) writes them; built once.
_encode_reply: Final = compact_json_encoder(ensure_ascii=True, allow_nan=True)


def _parse_int(text: str) -> int | float:
    # JSON.parse turns integers beyond 2**53 into doubles; do the same so CIDs agree.
    value = int(text)
    return value if abs(value) <= _JS_MAX_SAFE_INTEGER else float(value)


# Built once: json.loads with a parse_int makes a new decoder (and scanner) on every call.
_LINE_DECODER: Final = json.JSONDecoder(parse_int=_parse_int)


def parse_json_line(line: str) -> Any:
    """Parse a JSON value with JavaScript's number semantics."""
    if line.startswith("\ufeff"):  # what json.loads says of a str that starts with a BOM
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", line, 0)
    return _LINE_DECODER.decode(line)


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
        message = in_dag_cbor_order(request.get("message"))  # as the engine stores it (same object then)
        # The engine derives the same CID again: keep it for the length of this request.
        with memo.processing(message) as held:
            held.in_order = True  # the engine need not check the order again
            return self._handle(request, message, held)

    def _handle(self, request: dict[str, Any], message: Any, held: memo.MessageMemo) -> dict[str, Any]:
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
            held.data_text = (data, request["data"])  # the engine's encodedData is this text
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
        for batch in _waiting_lines(stdin, PIPE_BATCH_MAX):
            replies = _handle_batch(session, batch)
            stdout.write("".join(_encode_reply(reply) + "\n" for reply in replies))
            stdout.flush()
    finally:
        dwn.close()
    return 0


def _handle_line(session: PipeSession, line: str) -> dict[str, Any]:
    try:
        return session.handle_line(line)
    except Exception as exc:  # the pipe never dies on input
        return {"cid": None, "status": _status(500, f"InternalError: {type(exc).__name__}: {exc}")}


def _handle_batch(session: PipeSession, lines: list[str]) -> list[dict[str, Any]]:
    """The replies to ``lines``, all of them committed: one commit for the batch when it can.

    Each request runs exactly as it would alone: it sees what the ones before it did, and a
    refused one rolls back only its own savepoint. When the batch cannot have the store's
    write lock, or its commit fails, or SQLite ended its transaction under it (an I/O error
    rolls the whole transaction back), nothing of it was kept: the requests run again one
    commit each, so every reply is the one a request alone would get.
    """
    if len(lines) > 1:
        conn = session.dwn.store.conn
        try:
            with session.dwn.store.transaction():
                replies = []
                for line in lines:
                    replies.append(_handle_line(session, line))
                    if not conn.in_transaction:
                        raise _BatchLost
                return replies
        except (apsw.Error, _BatchLost):
            pass
    return [_handle_line(session, line) for line in lines]


class _BatchLost(Exception):
    """SQLite rolled a batch's transaction back while a request ran."""


_END: Final = object()


class _ReadFailed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _waiting_lines(lines: Iterable[str], limit: int) -> Iterator[list[str]]:
    """``lines`` in order, as lists: the next line, then the ones already read behind it.

    A thread reads ahead (at most ``2 * limit`` lines) so that the pipe can tell which
    requests are already waiting without blocking on its input. The hand-over is two C-level
    ``SimpleQueue``s, the lines and the reader's credits (one a line it may read ahead): a
    ``queue.Queue``'s Python-level locks and notifications cost ~3 µs of the two threads' CPU
    a line (issue #17).
    """
    ahead: queue.SimpleQueue[object] = queue.SimpleQueue()
    credits: queue.SimpleQueue[None] = queue.SimpleQueue()
    for _ in range(2 * limit):
        credits.put(None)

    def read() -> None:
        try:
            for line in lines:
                ahead.put(line)
                credits.get()
        except BaseException as exc:  # handed to the reader of the batches, raised there
            ahead.put(_ReadFailed(exc))
        else:
            ahead.put(_END)

    threading.Thread(target=read, name="pipe-stdin", daemon=True).start()
    while True:
        item = ahead.get()
        batch: list[str] = []
        while isinstance(item, str):
            batch.append(item)
            credits.put(None)
            if len(batch) == limit:
                break
            try:
                item = ahead.get_nowait()
            except queue.Empty:
                break
        if batch:
            yield batch
        if item is _END:
            return
        if isinstance(item, _ReadFailed):
            raise item.exc


def _replicated_apply(dwn: Dwn) -> Applier:
    return lambda tenant, message, data: apply_replicated_message_json(dwn, tenant, message, data)
