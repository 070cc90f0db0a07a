"""What to tell a user whose install lacks an optional part (``pip install 'p2psync[pipeline]'``)."""

from __future__ import annotations

from typing import Final

__all__ = ["PIPELINE_MODULES", "missing_pipeline_module"]

#: Top-level modules the ``pipeline`` extra brings (pyproject.toml).
PIPELINE_MODULES: Final = frozenset({"pyspark", "pyarrow", "pandas", "matplotlib"})


def missing_pipeline_module(exc: BaseException) -> str | None:
    """The one-line advice when ``exc`` is the import of a pipeline-extra module failing."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name is None:
        return None
    top = exc.name.split(".", 1)[0]
    if top not in PIPELINE_MODULES:
        return None
    return f"the data pipeline is not installed (no module {top!r}): pip install 'p2psync[pipeline]'"
