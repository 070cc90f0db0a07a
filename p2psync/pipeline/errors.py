"""The one error type of the pipeline: a code a script can match and a line a user can act on."""

from __future__ import annotations


class PipelineError(Exception):
    """A pipeline job cannot run or its inputs are not what it needs.

    ``code`` is stable (``JavaMissing``, ``ExportNotFound``, ...); ``detail`` says what was
    wrong and, where there is one, what to do about it.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
