"""Differential test: our schema validator against the reference DWN's, input by input.

The reference (dwn-sdk-js 0.5.2, through ``interop/schema_oracle.mjs``) authors a corpus of
valid messages and payloads with its own builders; we derive mutants from them (members
dropped, added, retyped, reordered, strings bent, arrays stretched, two faults at once),
add hand-picked edge cases where ECMAScript and Python disagree, and ask both validators.
Every verdict and error code must be the same.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from p2psync.dwn.errors import DwnError
from p2psync.dwn.schemas import SCHEMA_NAMES, validate
from tests.dwn.test_schemas import INVALID, VALID

INTEROP_DIR = Path(__file__).resolve().parents[2] / "interop"
ORACLE = "schema_oracle.mjs"
ORACLE_TIMEOUT_SECONDS = 120  # a run takes a few seconds; this only catches a hang
SEED = 20240501
MUTANTS_PER_ITEM = 60  # single faults sampled per corpus item
DOUBLE_FAULTS_PER_ITEM = 25  # two faults at once: which one is reported first matters

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(
        not (INTEROP_DIR / "node_modules").is_dir() or shutil.which("node") is None,
        reason="interop/node_modules or node missing: run `npm ci` in interop/ first",
    ),
]

Json = Any
Path_ = tuple[str | int, ...]


def run_oracle(*args: str, stdin: str = "") -> str:
    done = subprocess.run(
        ["node", ORACLE, *args],
        cwd=INTEROP_DIR,
        input=stdin.encode("ascii"),
        capture_output=True,
        timeout=ORACLE_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"{ORACLE} {args} failed: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode("utf-8")


def reference_codes(requests: list[tuple[str, Json]]) -> list[str | None]:
    # ensure_ascii keeps lone surrogates intact on the way to Node (\udxxx escapes).
    lines = "".join(
        json.dumps({"schema": s, "payload": p}, allow_nan=False) + "\n" for s, p in requests
    )
    # Split on "\n" only: a detail may quote U+2028, which str.splitlines() would split on.
    output = run_oracle("validate", stdin=lines)
    answers = [json.loads(line) for line in output.split("\n") if line]
    assert len(answers) == len(requests)
    return [a["code"] for a in answers]


def our_code(schema: str, payload: Json) -> str | None:
    try:
        validate(schema, payload)
    except DwnError as error:
        assert error.status == 400
        return error.code
    return None


@pytest.fixture(scope="module")
def corpus() -> list[tuple[str, Json]]:
    items = [json.loads(line) for line in run_oracle("corpus").split("\n") if line]
    return [(item["schema"], item["payload"]) for item in items]


# --- mutations ------------------------------------------------------------------------------

# Values a member may be replaced by: every JSON type, and strings near the patterns' edges.
REPLACEMENTS: list[Json] = [
    None, True, False, 0, 1, -1, 1.5, -0.0, 2**53 + 1, 10**400, "", "x", "\n", [], {}, [1],
    ["a"], {"a": 1}, "did:example:abc", "did:example:abc\n", "2024-01-01T00:00:00.000000Z",
    "2024-01-01T00:00:00.000000Z\n", "2024-01-01T00:00:00Z", "٢٠٢٤-01-01T00:00:00.000000Z",
    "abc/def", "abc\n", "a\u2028", {"gt": 1}, {"startsWith": "a"},
    [{"who": "anyone", "can": ["read"]}], {"$role": True},
]
EXTRA_KEYS = ["extra", "1", "$x", "a\n", "__proto__", "constructor"]


def paths(value: Json, prefix: Path_ = ()) -> Iterator[Path_]:
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


def get(value: Json, path: Path_) -> Json:
    for step in path:
        value = value[step]
    return value


def rebuild(value: Json, path: Path_, change: Any) -> Json:
    """A copy of ``value`` where the container/value at ``path`` is replaced by
    ``change(old)``; only the containers along the path are copied."""
    if not path:
        return change(value)
    head, rest = path[0], path[1:]
    copied: Json = dict(value) if isinstance(value, dict) else list(value)
    copied[head] = rebuild(value[head], rest, change)
    return copied


def mutants_at(value: Json, path: Path_, rng: random.Random) -> list[Json]:
    target = get(value, path)
    out: list[Json] = []
    if path:
        parent_path, last = path[:-1], path[-1]

        def drop(parent: Json) -> Json:
            if isinstance(parent, dict):
                return {k: v for k, v in parent.items() if k != last}
            return [v for i, v in enumerate(parent) if i != last]

        out.append(rebuild(value, parent_path, drop))
    for replacement in rng.sample(REPLACEMENTS, 5):
        out.append(rebuild(value, path, lambda _old, r=replacement: r))
    if isinstance(target, dict):
        for key in rng.sample(EXTRA_KEYS, 2):
            extra: Json = rng.choice([{}, 1, "s", None])
            out.append(rebuild(value, path, lambda old, k=key, e=extra: {**old, k: e}))
        items = list(target.items())
        rng.shuffle(items)
        out.append(rebuild(value, path, lambda _old, i=items: dict(i)))
    if isinstance(target, str):
        for bent in (target + "\n", target.upper(), " " + target, target[:-1]):
            out.append(rebuild(value, path, lambda _old, b=bent: b))
    if isinstance(target, list) and target:
        out.append(rebuild(value, path, lambda old: [*old, old[0]]))
        out.append(rebuild(value, path, lambda old: old + old[:1] * 11))
    return out


def single_faults(value: Json, rng: random.Random, count: int) -> list[Json]:
    every = [m for p in paths(value) for m in mutants_at(value, p, rng)]
    return rng.sample(every, min(count, len(every)))


def double_faults(value: Json, rng: random.Random, count: int) -> list[Json]:
    all_paths = list(paths(value))
    out = []
    for _ in range(count):
        first = rng.choice(mutants_at(value, rng.choice(all_paths), rng))
        out.append(rng.choice(mutants_at(first, rng.choice(list(paths(first))), rng)))
    return out


# --- hand-picked edge cases -----------------------------------------------------------------


def edge_cases(corpus: list[tuple[str, Json]]) -> list[tuple[str, Json]]:
    """Inputs where the two languages' value or regex semantics part ways."""
    write = next(p for s, p in corpus if s == "RecordsWrite")
    rich = next(p for s, p in corpus if s == "ProtocolDefinition")
    thread = rich["structure"]["thread"]
    cases: list[tuple[str, Json]] = []

    def with_descriptor(**members: Json) -> Json:
        return {**write, "descriptor": {**write["descriptor"], **members}}

    size: Json
    for size in (1.0, 0, -0.0, 1e308, 10**400, -(10**400), 2**1023, True, "1", None):
        cases.append(("RecordsWrite", with_descriptor(dataSize=size)))
    for stamp in ("2024-01-01T00:00:00.000000Z\n", "2024-01-01T00:00:00.000000Z ",
                  "\n2024-01-01T00:00:00.000000Z", "2024-01-01T23:59:60.000000Z",
                  "2024-01-01T00:00:00.000000z", "２０２４-01-01T00:00:00.000000Z"):
        cases.append(("RecordsWrite", with_descriptor(messageTimestamp=stamp)))
    for did in ("did:a:b", "did:a::b", "did:a:b:", "did:a:%4", "did:a:%41", "did:a:b;x=1/p?q#f",
                "did:a:b#f\n", "did:a:b/\n", "did:A:b", "did:a:" + "a" * 200 + "!", "did:a:b\n"):
        cases.append(("RecordsWrite", with_descriptor(recipient=did)))
    for published in (1, 0, "true", None):
        cases.append(("RecordsWrite", with_descriptor(published=published)))
    cases.append(("RecordsWrite", with_descriptor(tags={str(i): i for i in range(11)})))
    cases.append(("RecordsWrite", with_descriptor(tags={"a": [], "b": [1, "x"], "c": {}})))
    cases.append(("RecordsWrite", {**write, "contextId": "abc\n"}))
    # Members named like Object.prototype's pass the reference's unevaluatedProperties check.
    for name in ("constructor", "toString", "__proto__", "valueOf", "hasOwnProperty",
                 "prototype", "__count__", "length"):
        cases.append(("RecordsWrite", {**write, name: 1}))
        cases.append(("RecordsWriteDataEncoded", {**write, "encodedData": "", name: {}}))
        cases.append(("RecordsWrite", with_descriptor(**{name: 1})))
    cases.append(("RecordsWrite", {**write, "extra": 1, "descriptor": {**write["descriptor"],
                                                                        "extra": 1}}))

    # Integer-like keys come first in ECMAScript objects: the first error moves with them.
    bad_additional = {"$unknown": True}
    bad_type = {"$size": "big"}
    for keys in (("b", "1"), ("1", "b"), ("4294967295", "4294967294"), ("01", "2"),
                 ("10", "9")):
        structure = {keys[0]: bad_additional, keys[1]: bad_type}
        cases.append(("ProtocolDefinition", {**rich, "structure": structure}))
        types = {keys[0]: {"extra": 1}, keys[1]: {"schema": 5}}
        cases.append(("ProtocolDefinition", {**rich, "types": types}))
    # Keys with line terminators fall outside `.*$` in ECMAScript but not in Python's `$`.
    for key in ("a\n", "\n", "a\r", "a\u2028", "$requiredTags\n", "$x", "ok"):
        cases.append(("ProtocolRuleSet", {**thread, key: {}}))
        cases.append(("ProtocolRuleSet", {**thread, "$tags": {key: {"type": "bogus"}}}))
    tag_rule: Json
    for tag_rule in ({"type": "array", "items": {"type": "string", "other": 1}},
                     {"type": "string", "minLength\n": 1}, {"enum\n": []}, {"uniqueItems": 1}):
        cases.append(("ProtocolRuleSet", {**thread, "$tags": {"t": tag_rule}}))
    action: Json
    for action in ({"who": "anyone", "can": ["read"], "role": "x"},
                   {"who": "anyone", "can": ["read"], "extra": 1},
                   {"role": "x", "can": ["read"], "extra": 1},
                   {"role": "x", "who": "anyone", "can": ["read"]}, {}, [], "x"):
        cases.append(("ProtocolRuleSet", {**thread, "$actions": [action]}))
    for size in ({"min": -0.0}, {"min": -1}, {"max": 0.5, "x": 1}, {"min": True}):
        cases.append(("ProtocolRuleSet", {**thread, "$size": size}))

    # Permission scopes: the first alternative decides the reported error.
    for scope in ({"interface": "Messages", "method": "Query", "contextId": "x"},
                  {"interface": "Records", "method": "Write", "extra": 1},
                  {"interface": "Records", "method": "Nope"}, {"interface": "Records"}, {}):
        cases.append(("PermissionGrantData",
                      {"dateExpires": "2024-01-01T00:00:00.000000Z", "scope": scope}))
    for jwk in ({"kty": "EC", "crv": "x", "x": "y", "d": "z"}, {"crv": "x", "x": "y"},
                {"kty": "RSA", "n": "a", "e": "b", "oth": 1}, {"kty": "oct", "k": "a"},
                {"kty": "OKP", "crv": "Ed25519", "x": "a", "k": "b"}, {"kty": "EC"}):
        cases.append(("PublicJwk", jwk))
        cases.append(("GeneralJwk", jwk))
    filt: Json
    for filt in ({"published": False, "datePublished": {"from": "2024-01-01T00:00:00.000000Z"}},
                 {"datePublished": {"from": "2024-01-01T00:00:00.000000Z"}},
                 {"published": False, "datePublished": {}, "dateCreated": {"x": 1}},
                 {"tags": {"a": {"gt": 1, "gte": 2}}}, {"tags": {"a": {"gt": "a", "x": 1}}},
                 {"author": []}, {"author": ["did:a:b", "nope"]}):
        cases.append(("RecordsFilter", filt))
    cases.append(("AuthorizationOwner", {"ownerSignature": {}}))
    cases.append(("AuthorizationOwner", {"ownerSignature": {}, "extra": 1}))
    cases.append(("RecordsDelete", json.loads('{"__proto__": {}, "descriptor": {}}')))
    cases.append(("PaginationCursor", {"messageCid": "c", "value": True}))
    cases.append(("Authorization", {"signature": {"signatures": []}}))
    cases.append(("GeneralJws", {"payload": "abc\n"}))

    # Non-objects, and names the reference does not export.
    for name in sorted(SCHEMA_NAMES):
        value: Json
        for value in (None, [], "x", 1, True):
            cases.append((name, value))
    for name in ("Base64Url", "DateTime", "Did", "PermissionScope", "toString", "constructor",
                 "__proto__", "recordswrite", "RecordsWrite ", ""):
        cases.append((name, {}))
    return cases


def build_requests(corpus: list[tuple[str, Json]]) -> list[tuple[str, Json]]:
    rng = random.Random(SEED)
    requests: list[tuple[str, Json]] = []
    names = sorted(SCHEMA_NAMES)
    for schema, payload in corpus:
        requests.append((schema, payload))
        requests.extend((schema, m) for m in single_faults(payload, rng, MUTANTS_PER_ITEM))
        requests.extend((schema, m) for m in double_faults(payload, rng, DOUBLE_FAULTS_PER_ITEM))
        # Every payload under every other schema too: a cheap source of wrong shapes.
        requests.extend((name, payload) for name in names)
    requests.extend(edge_cases(corpus))
    return requests


def is_json(value: Json) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


# --- the tests ------------------------------------------------------------------------------


def test_reference_corpus_is_valid_for_both(corpus: list[tuple[str, Json]]) -> None:
    assert len(corpus) >= 100
    assert {s for s, _ in corpus} >= SCHEMA_NAMES - {"RecordsWriteUnidentified"}
    assert reference_codes(corpus) == [None] * len(corpus)
    assert [our_code(s, p) for s, p in corpus] == [None] * len(corpus)


def test_verdicts_and_codes_match_reference(corpus: list[tuple[str, Json]]) -> None:
    requests = build_requests(corpus)
    theirs = reference_codes(requests)
    mismatches = []
    for (schema, payload), expected in zip(requests, theirs, strict=True):
        ours = our_code(schema, payload)
        if ours != expected:
            mismatches.append(f"{schema}: ours={ours} reference={expected} "
                              f"payload={json.dumps(payload)[:400]}")
    assert not mismatches, f"{len(mismatches)} of {len(requests)} differ:\n" + "\n".join(
        mismatches[:20]
    )
    # The corpus must exercise every verdict, or the comparison proves little.
    seen = set(theirs)
    assert seen >= {
        None,
        "SchemaValidatorFailure",
        "SchemaValidatorAdditionalPropertyNotAllowed",
        "SchemaValidatorUnevaluatedPropertyNotAllowed",
        "SchemaValidatorSchemaNotFound",
    }
    assert len(requests) > 5000


def test_hand_written_expectations_match_reference() -> None:
    """The expectations written into test_schemas.py are the reference's own answers."""
    cases: list[tuple[str, Json, str | None]] = [(s, p, None) for s, p in VALID.items()]
    cases += [case for case in INVALID if is_json(case[1])]  # NaN cannot travel as JSON
    theirs = reference_codes([(schema, payload) for schema, payload, _ in cases])
    wrong = [
        f"{schema}: expected {expected}, reference says {got}: {json.dumps(payload)[:300]}"
        for (schema, payload, expected), got in zip(cases, theirs, strict=True)
        if got != expected
    ]
    assert not wrong, "\n".join(wrong)
