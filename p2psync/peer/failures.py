"""One line for a failed sync, whoever reports it: ``p2psync sync`` and ``repair`` print it, the
node logs it and shows it in ``peers``/``status``.

Below the node and the CLI so that both use it without the node importing the CLI. (It will
join the error tree, p2psync/errors.py, when that lands.)
"""

from __future__ import annotations

import os

import trio

from p2psync import blip
from p2psync.dwn.errors import DwnError
from p2psync.replication.protocol import HelloFailed
from p2psync.replication.wire import PeerError

__all__ = ["describe_failure", "leaf_exception"]


def leaf_exception(exc: BaseException) -> BaseException:
    """The one meaningful exception inside (possibly nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)] or list(exc.exceptions)
        exc = inner[0]
    return exc


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


def describe_failure(exc: BaseException, url: str) -> str | None:
    """The one line for a sync failure, or None when ``exc`` is not one we explain."""
    exc = leaf_exception(exc)
    if isinstance(exc, PeerError) and exc.name == "ConnectionLost":
        # Raised on our side when the connection drops mid-round (the peer stopped, the
        # network went away): nothing refused us, so do not say "refused".
        return f"lost the connection to {url}: {exc.detail}"
    if isinstance(exc, PeerError):
        text = f"{url} refused: {exc.code} {exc.name}"
        return f"{text}: {exc.detail}" if exc.detail else text
    if isinstance(exc, HelloFailed):
        return f"hello with {url} failed: {exc}"
    if isinstance(exc, blip.BlipError):
        return f"{url} answered an error: {exc}"
    if isinstance(exc, blip.ConnectionClosed):
        return f"the connection to {url} closed: {exc.reason}"
    if isinstance(exc, trio.TooSlowError):
        return f"{url} did not answer in time"
    if isinstance(exc, OSError):
        return f"cannot connect to {url}: {_os_reason(exc)}"
    if isinstance(exc, DwnError):
        return str(exc)
    return None
