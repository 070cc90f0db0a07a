"""How fast is schema validation? Prints validations per second on one core.

Run from the repository root:  .venv/bin/python tests/bench/bench_schemas.py

Compares p2psync.dwn.schemas (rules compiled to Python source) with the general-purpose
``jsonschema`` library (Draft 2020-12, one cached validator per schema, same rules) on the
hand-written examples of tests/dwn/test_schemas.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jsonschema  # noqa: E402
from referencing import Registry  # noqa: E402
from referencing.jsonschema import DRAFT202012  # noqa: E402

from p2psync.dwn.schema_defs import DEFINITIONS  # noqa: E402
from p2psync.dwn.schemas import validate  # noqa: E402
from tests.dwn.test_schemas import (  # noqa: E402
    protocol_records_write,
    protocols_configure,
    records_query,
    records_write,
)

URN = "urn:p2psync:dwn:"
ROUNDS = 5  # best of, to step around scheduler noise


def as_uris(value: Any) -> Any:
    """Our rules name each other bare; jsonschema wants URIs."""
    if isinstance(value, dict):
        return {k: (URN + v if k == "$ref" else as_uris(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [as_uris(v) for v in value]
    return value


def jsonschema_validator(name: str) -> jsonschema.Draft202012Validator:
    registry: Registry[Any] = Registry().with_resources(
        (URN + n, DRAFT202012.create_resource(as_uris(s))) for n, s in DEFINITIONS.items()
    )
    return jsonschema.Draft202012Validator({"$ref": URN + name}, registry=registry)


def per_second(action: Callable[[], object], seconds: float = 0.4) -> float:
    """Best rate over ROUNDS runs of about ``seconds`` each."""
    count = 1
    while True:  # find a batch size that takes a measurable time
        start = time.perf_counter()
        for _ in range(count):
            action()
        if time.perf_counter() - start > seconds / 4:
            break
        count *= 2
    best = 0.0
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(count):
            action()
        best = max(best, count / (time.perf_counter() - start))
    return best


def main() -> None:
    cases = [
        ("RecordsWrite", "flat record", records_write()),
        ("RecordsWrite", "protocol record, 5 tags", protocol_records_write()),
        ("ProtocolsConfigure", "2 types, actions/tags/size", protocols_configure()),
        ("RecordsQuery", "filter with tags, pagination", records_query()),
    ]
    print(f"{'schema':<20} {'example':<30} {'ours/s':>10} {'us':>7} {'jsonschema/s':>13}")
    for name, label, message in cases:
        validate(name, message)
        checker = jsonschema_validator(name)
        assert checker.is_valid(message)
        ours = per_second(partial(validate, name, message))
        theirs = per_second(partial(checker.is_valid, message), seconds=0.2)
        print(f"{name:<20} {label:<30} {ours:>10,.0f} {1e6 / ours:>7.1f} {theirs:>13,.0f}")


if __name__ == "__main__":
    main()
