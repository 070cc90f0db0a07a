"""The interop scenario format: loading, validation, and turning steps into pipe requests.

A scenario file (``interop/scenarios/*.json``, format ``p2psync-interop-scenario/1``) holds a
name, a description, the personas (DIDs only) and ordered steps. Each step is one request to
a pipe plus what the reference answered. ``interop/README.md`` documents the format.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCENARIO_FORMAT = "p2psync-interop-scenario/1"

# Ops a scenario step may carry (the pipe protocol's request ops).
STEP_OPS = frozenset({"process", "query"})

# One SHA-256 digest: the block of the dataGen generator.
_DATAGEN_BLOCK = 32

# A generous ceiling for a generated data stream (the largest scenario uses 1 MiB); it keeps
# a typo in a hand-edited file from allocating gigabytes.
MAX_DATAGEN_SIZE = 64 * 1024 * 1024


class ScenarioFormatError(ValueError):
    """A scenario file does not follow the format."""


def expand_data_gen(size: int, seed: int) -> bytes:
    """Bytes of a ``{"dataGen": {"size": N, "seed": S}}`` spec.

    The first ``size`` bytes of SHA-256(f"{S}:0") || SHA-256(f"{S}:1") || ..., seed and
    counter in decimal ASCII (``interop/lib/datagen.mjs`` is the same function in Node).
    """
    if size < 0 or seed < 0:
        raise ScenarioFormatError(f"dataGen size and seed must be non-negative: {size}, {seed}")
    if size > MAX_DATAGEN_SIZE:
        raise ScenarioFormatError(f"dataGen size {size} exceeds {MAX_DATAGEN_SIZE}")
    blocks = (size + _DATAGEN_BLOCK - 1) // _DATAGEN_BLOCK
    out = b"".join(hashlib.sha256(f"{seed}:{i}".encode("ascii")).digest() for i in range(blocks))
    return out[:size]


def b64url_encode(data: bytes) -> str:
    """base64url without padding, as the pipe protocol carries data."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Inverse of :func:`b64url_encode` (padding optional)."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Expectation:
    """What the reference answered to a step. Only ``code`` is required."""

    code: int
    cid: str | None = None
    data_sha256: str | None = None
    entries: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True)
class Step:
    """One request of a scenario.

    ``raw`` (when set) is a line sent verbatim instead of a request built from the fields, for
    steps that test how a pipe copes with malformed input.
    """

    index: int
    op: str
    tenant: str | None
    message: Any
    data: bytes | None
    expect: Expectation | None
    note: str | None
    raw: str | None = None

    @property
    def is_query(self) -> bool:
        """Whether the reply carries query entries to compare."""
        return self.raw is None and self.op == "query"

    def request_line(self) -> bytes:
        """The JSON line (with its newline) to send to a pipe."""
        if self.raw is not None:
            return self.raw.encode("utf-8") + b"\n"
        request: dict[str, Any] = {"op": self.op, "tenant": self.tenant, "message": self.message}
        if self.data is not None:
            request["data"] = b64url_encode(self.data)
        return (
            json.dumps(request, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"
        )

    def label(self) -> str:
        """``step N (note)`` for reports."""
        return f"step {self.index}" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Scenario:
    """A loaded scenario."""

    name: str
    description: str
    personas: Mapping[str, Mapping[str, Any]]
    steps: tuple[Step, ...]
    tags: tuple[str, ...] = ()
    path: Path | None = None
    reference: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def _parse_expect(raw: Any, where: str) -> Expectation | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("code"), int):
        raise ScenarioFormatError(f"{where}: expect must be an object with an integer code")
    entries = raw.get("entries")
    if entries is not None:
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ScenarioFormatError(f"{where}: expect.entries must be a list of objects")
        entries = tuple(entries)
    cid = raw.get("cid")
    sha = raw.get("data_sha256")
    if cid is not None and not isinstance(cid, str):
        raise ScenarioFormatError(f"{where}: expect.cid must be a string")
    if sha is not None and not isinstance(sha, str):
        raise ScenarioFormatError(f"{where}: expect.data_sha256 must be a string")
    return Expectation(code=raw["code"], cid=cid, data_sha256=sha, entries=entries)


def _parse_step(index: int, raw: Any, where: str) -> Step:
    if not isinstance(raw, dict):
        raise ScenarioFormatError(f"{where}: a step must be an object")
    expect = _parse_expect(raw.get("expect"), where)
    note = raw.get("note")
    if note is not None and not isinstance(note, str):
        raise ScenarioFormatError(f"{where}: note must be a string")
    if "raw" in raw:
        if not isinstance(raw["raw"], str) or "\n" in raw["raw"]:
            raise ScenarioFormatError(f"{where}: raw must be a one-line string")
        return Step(index, "raw", None, None, None, expect, note, raw=raw["raw"])

    op = raw.get("op")
    if op not in STEP_OPS:
        raise ScenarioFormatError(f"{where}: op must be one of {sorted(STEP_OPS)}, got {op!r}")
    tenant = raw.get("tenant")
    if not isinstance(tenant, str):
        raise ScenarioFormatError(f"{where}: tenant must be a string")
    if "message" not in raw:
        raise ScenarioFormatError(f"{where}: message is missing")
    if "data" in raw and "dataGen" in raw:
        raise ScenarioFormatError(f"{where}: data and dataGen are mutually exclusive")
    data: bytes | None = None
    if "data" in raw:
        if not isinstance(raw["data"], str):
            raise ScenarioFormatError(f"{where}: data must be a base64url string")
        try:
            data = b64url_decode(raw["data"])
        except ValueError as exc:
            raise ScenarioFormatError(f"{where}: data is not base64url: {exc}") from None
    elif "dataGen" in raw:
        spec = raw["dataGen"]
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("size"), int)
            or not isinstance(spec.get("seed"), int)
        ):
            raise ScenarioFormatError(f"{where}: dataGen must be {{size: int, seed: int}}")
        data = expand_data_gen(spec["size"], spec["seed"])
    return Step(index, op, tenant, raw["message"], data, expect, note)


def parse_scenario(doc: Any, path: Path | None = None) -> Scenario:
    """Validates a decoded scenario document and returns the :class:`Scenario`."""
    where = str(path) if path is not None else "scenario"
    if not isinstance(doc, dict):
        raise ScenarioFormatError(f"{where}: a scenario must be a JSON object")
    if doc.get("format") != SCENARIO_FORMAT:
        raise ScenarioFormatError(f"{where}: format must be {SCENARIO_FORMAT!r}")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ScenarioFormatError(f"{where}: name must be a non-empty string")
    steps_raw = doc.get("steps")
    if not isinstance(steps_raw, list):
        raise ScenarioFormatError(f"{where}: steps must be a list")
    personas = doc.get("personas", {})
    if not isinstance(personas, dict):
        raise ScenarioFormatError(f"{where}: personas must be an object")
    steps = tuple(_parse_step(i, s, f"{where}: step {i}") for i, s in enumerate(steps_raw))
    known = {"format", "name", "description", "personas", "steps", "tags", "reference"}
    return Scenario(
        name=name,
        description=str(doc.get("description", "")),
        personas=personas,
        steps=steps,
        tags=tuple(str(t) for t in doc.get("tags", [])),
        path=path,
        reference=doc.get("reference"),
        extra={k: v for k, v in doc.items() if k not in known},
    )


def load_scenario(path: str | Path) -> Scenario:
    """Reads and validates one scenario file."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ScenarioFormatError(f"{p}: not JSON: {exc}") from None
    return parse_scenario(doc, p)


def scenario_files(paths: list[str | Path]) -> list[Path]:
    """Expands directories into their ``*.json`` files (sorted); files pass through."""
    out: list[Path] = []
    for item in paths:
        p = Path(item)
        if p.is_dir():
            out.extend(sorted(p.glob("*.json")))
        else:
            out.append(p)
    return out
