"""Replies of the engine, shaped like the reference's (status code, detail, entries, data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p2psync.dwn.errors import DwnError
from p2psync.dwn.store import Store


@dataclass
class Reply:
    """What processing one message answers: a status, and for reads and queries their result."""

    code: int
    detail: str
    entries: list[dict[str, Any]] | None = None  # query results (the stored messages)
    entry: dict[str, Any] | None = None  # RecordsRead result: recordsWrite, initialWrite, …
    cursor: dict[str, Any] | None = None
    data: bytes | None = None  # RecordsRead data

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 300


def reply_from_error(err: Exception, code: int) -> Reply:
    """The reference's ``messageReplyFromError``: the error message becomes the detail."""
    if isinstance(err, DwnError):
        return Reply(code, str(err))
    # A structural fault the reference meets as a JavaScript TypeError.
    return Reply(code, f"TypeError: {type(err).__name__}: {err}")


@dataclass
class HandlerContext:
    """What a method handler may touch."""

    store: Store
