"""Typed errors of the DWN engine.

Every refusal carries a stable ``code`` (the reference DWN's error code where one exists) and
an HTTP-like ``status``; the reply detail starts with the code, as the reference's does.
In p2psync's one error tree (:mod:`p2psync.errors`) a ``DwnError`` is an ``InputRejected``:
``as_refusal()`` reads it as ``Refusal(status, code, detail)``.
"""

from __future__ import annotations

from p2psync.errors import InputRejected


class DwnError(InputRejected):
    """A message or request was refused. ``status`` is the reply code it maps to."""

    def __init__(self, code: str, detail: str = "", status: int = 400) -> None:
        self.code = code
        self.detail = detail
        self.status = status
        super().__init__(f"{code}: {detail}" if detail else code)

    @property
    def message(self) -> str:
        """The reply detail: the code first, then what was wrong."""
        return str(self)


def bad_request(code: str, detail: str = "") -> DwnError:
    return DwnError(code, detail, 400)


def unauthorized(code: str, detail: str = "") -> DwnError:
    return DwnError(code, detail, 401)
