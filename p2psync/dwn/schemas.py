"""JSON-schema validation of DWN messages and payloads, with the reference DWN's verdicts.

:func:`validate` answers exactly as dwn-sdk-js 0.5.2's ``validateJsonSchema`` does: the same
inputs pass, and a failing input gets the same error code. The reference stops at its first
error and names the code after it (an additional property, an unevaluated property, or any
other failure), so this module reproduces the order in which the reference's validator
(AJV 8, precompiled, first error only) visits keywords:

1. ``type`` first when it cannot be folded into a later group (several types, or one type
   with no keyword of that type's group below);
2. keywords that apply to any value: ``$ref``, ``const``, ``enum``, ``not``, ``anyOf``,
   ``oneOf``, ``allOf``;
3. per-type groups in the order number, string, array, object; a single folded ``type``
   is reported when the value is not of that type. Object keywords run as
   ``maxProperties``, ``minProperties``, ``required``, ``additionalProperties``, dependencies
   (``dependentRequired`` then ``dependentSchemas``), ``properties`` (in schema order),
   ``patternProperties`` (pattern by pattern, members in ECMAScript key order), and last
   ``unevaluatedProperties``.

Inside ``anyOf``/``oneOf`` every failing alternative leaves its own first error behind, so
when no alternative fits the reported error is the *first alternative's* first error.

The rules themselves live in :mod:`p2psync.dwn.schema_defs`. At import they are compiled
into Python source, one function per named rule with its sub-rules written inline, and
loaded with ``exec``: a typical RecordsWrite then costs about 13 microseconds on one core
here, where the general-purpose ``jsonschema`` library takes milliseconds
(``tests/bench/bench_schemas.py`` measures both).

Values are JSON values as :func:`json.loads` returns them. Their ECMAScript meaning is what
counts: ``True`` is not a number, ``1.0`` and ``1`` are the same number, an integer too large
for a double (it would parse as ``Infinity``) is not a number, and neither is NaN.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from p2psync.dwn.errors import DwnError
from p2psync.dwn.schema_defs import DEFINITIONS, EXPORTED_NAMES, Schema

__all__ = [
    "ADDITIONAL_PROPERTY_NOT_ALLOWED",
    "SCHEMA_NAMES",
    "SCHEMA_NOT_FOUND",
    "SCHEMA_VALIDATION_FAILED",
    "UNEVALUATED_PROPERTY_NOT_ALLOWED",
    "SchemaCompileError",
    "validate",
]

# Error codes: the reference's DwnErrorCode names.
ADDITIONAL_PROPERTY_NOT_ALLOWED: Final = "SchemaValidatorAdditionalPropertyNotAllowed"
UNEVALUATED_PROPERTY_NOT_ALLOWED: Final = "SchemaValidatorUnevaluatedPropertyNotAllowed"
SCHEMA_VALIDATION_FAILED: Final = "SchemaValidatorFailure"
SCHEMA_NOT_FOUND: Final = "SchemaValidatorSchemaNotFound"

# The reference answers a malformed message with 400.
_BAD_REQUEST: Final = 400

# ECMAScript numbers are doubles: an integer literal at or beyond this magnitude parses as
# Infinity, which the reference's validator does not accept as a number (strictNumbers).
_DOUBLE_OVERFLOW: Final = 2**1024 - 2**970

# ECMAScript lists "array index" keys (canonical integers below 2**32 - 1) before all other
# keys of an object, whatever their insertion order.
_MAX_ARRAY_INDEX: Final = 2**32 - 2


# The reference looks evaluated members up in a plain ECMAScript object, so a member named
# like one that every object inherits (`constructor`, `toString`, ...) counts as evaluated and
# passes `unevaluatedProperties: false`. Observed with dwn-sdk-js 0.5.2 on Node 20.
_OBJECT_PROTOTYPE_MEMBERS: Final = frozenset({
    "constructor", "__defineGetter__", "__defineSetter__", "hasOwnProperty",
    "__lookupGetter__", "__lookupSetter__", "isPrototypeOf", "propertyIsEnumerable",
    "toString", "valueOf", "__proto__", "toLocaleString",
})


class SchemaCompileError(Exception):
    """A rule in schema_defs uses something this compiler does not reproduce faithfully."""


class _Fault:
    """The first error found: which rule failed, where, and why."""

    __slots__ = ("keyword", "path", "message", "member")

    def __init__(
        self,
        keyword: str,
        message: str,
        path: tuple[str | int, ...] = (),
        member: str | None = None,
    ) -> None:
        self.keyword = keyword
        self.message = message
        self.path = path
        self.member = member


Check = Callable[[Any], "_Fault | None"]


# Marks a member that is not there (a JSON null is a present member).
_ABSENT: Final = object()


# --- ECMAScript value semantics -------------------------------------------------------------


def _is_number(value: object) -> bool:
    """An ECMAScript finite number (the generated code inlines the same test)."""
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is int:  # not bool, which is an int subclass
        return -_DOUBLE_OVERFLOW < value < _DOUBLE_OVERFLOW
    return False


def _js_equal(a: object, b: object) -> bool:
    """Deep equality as ECMAScript JSON values compare (so ``True != 1``)."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if _is_number(a) or _is_number(b):
        return _is_number(a) and _is_number(b) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_js_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_js_equal(a[k], b[k]) for k in a)
    return False


def _is_array_index(key: str) -> bool:
    return (
        key.isascii()
        and key.isdigit()
        and (len(key) == 1 or key[0] != "0")
        and int(key) <= _MAX_ARRAY_INDEX
    )


def _js_keys(obj: dict[str, Any]) -> Iterable[str]:
    """The keys of ``obj`` in the order ECMAScript enumerates them."""
    for key in obj:
        if key[:1].isdigit():
            break
    else:
        return obj
    indices = sorted((int(k), k) for k in obj if _is_array_index(k))
    return [k for _, k in indices] + [k for k in obj if not _is_array_index(k)]


def _pointer(path: Sequence[str | int]) -> str:
    """A JSON Pointer to the failing value, as the reference prints instance paths."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _type_fault(types: Sequence[str]) -> _Fault:
    return _Fault("type", "expected " + " or ".join(types))


# --- the compiler ---------------------------------------------------------------------------
#
# Each named definition becomes one generated Python function that returns the first fault or
# None; the checks of its sub-schemas are written inline, in the reference's keyword order, so
# a message costs a handful of calls instead of one call per keyword. An alternative of
# anyOf/oneOf/not becomes a function of its own because its failure must not end the caller.

_ANY_VALUE_KEYWORDS: Final = ("$ref", "const", "enum", "not", "anyOf", "oneOf", "allOf")
_GROUP_KEYWORDS: Final[dict[str, tuple[str, ...]]] = {
    "number": ("minimum",),
    "string": ("pattern",),
    "array": ("maxItems", "minItems", "items"),
    "object": (
        "maxProperties", "minProperties", "required", "additionalProperties",
        "dependentRequired", "dependentSchemas", "properties", "patternProperties",
    ),
}
_GROUP_ORDER: Final = ("number", "string", "array", "object")
_ANNOTATIONS: Final = frozenset({"$comment", "description"})
_KNOWN_KEYWORDS: Final = frozenset(
    {"type", "unevaluatedProperties", *_ANY_VALUE_KEYWORDS, *_ANNOTATIONS}.union(
        *_GROUP_KEYWORDS.values()
    )
)

# Source expressions testing a local variable `{v}` for each JSON type.
_TYPE_EXPRESSIONS: Final = {
    "object": "isinstance({v}, dict)",
    "array": "isinstance({v}, list)",
    "string": "isinstance({v}, str)",
    "boolean": "({v} is True or {v} is False)",
    # Finite doubles only: `x - x` is NaN for infinities and NaN; huge ints are Infinity in
    # ECMAScript. `type(...) is` keeps bool (an int subclass) out.
    "number": "(type({v}) is float and {v} - {v} == 0.0 or type({v}) is int"
    " and -_DOUBLE_OVERFLOW < {v} < _DOUBLE_OVERFLOW)",
    "null": "{v} is None",
}


def _at(fault: _Fault, path: tuple[str | int, ...]) -> _Fault:
    """``fault`` seen from ``len(path)`` levels further out."""
    return _Fault(fault.keyword, fault.message, (*path, *fault.path), fault.member)


def _first_extra(
    obj: dict[str, Any],
    known: frozenset[str],
    matchers: tuple[Callable[[str], object], ...],
    keyword: str,
    path: tuple[str | int, ...],
) -> _Fault:
    """The fault for the first member (in ECMAScript order) that is neither known nor matched."""
    for key in _js_keys(obj):
        if key not in known and not any(match(key) for match in matchers):
            return _Fault(keyword, "member not allowed", path, key)
    raise AssertionError("called without an extra member")


# Keywords that hold further schemas; a rule without any of them is a leaf.
_NESTING_KEYWORDS: Final = frozenset({
    "$ref", "not", "anyOf", "oneOf", "allOf", "items", "properties", "patternProperties",
    "additionalProperties", "dependentSchemas",
})


def _is_leaf(schema: Schema) -> bool:
    """A rule with no sub-rules (DateTime, Did, ...): cheaper written in place than called."""
    return not schema.keys() & _NESTING_KEYWORDS


class _Local(str):
    """A path segment known only at run time: the name of the generated loop variable."""


# Where a value sits below the function's argument: member names and indices, or _Local.
_Path = tuple["str | int | _Local", ...]


def _path_source(path: _Path) -> str:
    parts = [p if isinstance(p, _Local) else repr(p) for p in path]
    return "(" + "".join(part + ", " for part in parts) + ")"


class _Function:
    """Source lines of one generated function, with fresh local names."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines = [f"def {name}(v):"]
        self._counter = 0

    def local(self, stem: str) -> str:
        self._counter += 1
        return f"{stem}{self._counter}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * (depth + 1) + line)


class _Generator:
    """Writes Python source for the rules of schema_defs and loads it."""

    def __init__(self, definitions: Mapping[str, Schema]) -> None:
        self._definitions = definitions
        self._constants: dict[str, object] = {}
        self._functions: list[_Function] = []
        self._branch_count = 0
        self.source = ""  # the generated module text, kept for debugging

    # -- bookkeeping --

    def const(self, value: object) -> str:
        name = f"_k{len(self._constants)}"
        self._constants[name] = value
        return name

    @staticmethod
    def function_name(definition: str) -> str:
        return "_rule_" + re.sub(r"\W", "_", definition)

    def build(self) -> dict[str, Check]:
        for name, schema in self._definitions.items():
            fn = _Function(self.function_name(name))
            self._functions.append(fn)
            self.node(fn, schema, "v", (), 0)
            fn.emit(0, "return None")
        # The source is made only from our own fixed rule dicts, never from input data.
        source = "\n\n".join("\n".join(fn.lines) for fn in self._functions) + "\n"
        namespace: dict[str, Any] = {
            "_Fault": _Fault, "_at": _at, "_first_extra": _first_extra,
            "_DOUBLE_OVERFLOW": _DOUBLE_OVERFLOW, "_js_keys": _js_keys, "_js_equal": _js_equal,
            "_ABSENT": _ABSENT, **self._constants,
        }
        exec(compile(source, "<p2psync.dwn.schemas generated>", "exec"), namespace)
        self.source = source
        return {name: namespace[self.function_name(name)] for name in self._definitions}

    def branch(self, schema: Schema) -> str:
        """A function for an alternative whose failure must not end the caller."""
        self._branch_count += 1
        fn = _Function(f"_alt{self._branch_count}")
        self._functions.append(fn)
        self.node(fn, schema, "v", (), 0)
        fn.emit(0, "return None")
        return fn.name

    def fail(self, fn: _Function, depth: int, fault: _Fault, path: _Path) -> None:
        """Emit a return of ``fault`` located at ``path``."""
        if any(isinstance(p, _Local) for p in path):
            fn.emit(depth, f"return _at({self.const(fault)}, {_path_source(path)})")
        else:
            located = _Fault(fault.keyword, fault.message, path, fault.member)
            fn.emit(depth, f"return {self.const(located)}")

    @staticmethod
    def relocate(path: _Path, fault_var: str) -> str:
        return f"_at({fault_var}, {_path_source(path)})" if path else fault_var

    # -- schemas --

    def node(
        self, fn: _Function, schema: Schema, v: str, path: _Path, depth: int
    ) -> None:
        """Emit the checks of ``schema`` on the local variable ``v``."""
        unknown = schema.keys() - _KNOWN_KEYWORDS
        if unknown:
            raise SchemaCompileError(f"unsupported keywords {sorted(unknown)}")
        types = self._types(schema)
        folded = types[0] if len(types) == 1 and self._has_group_rules(schema, types[0]) else None

        if types and folded is None:
            test = " or ".join(_TYPE_EXPRESSIONS[t].format(v=v) for t in types)
            fn.emit(depth, f"if not ({test}):")
            self.fail(fn, depth + 1, _type_fault(types), path)

        # After a failed-or-passed up-front check of a single type the value's type is known.
        known = types[0] if len(types) == 1 and folded is None else None
        for keyword in _ANY_VALUE_KEYWORDS:
            if keyword in schema:
                self.any_value(fn, keyword, schema[keyword], v, path, depth, known)

        for group in _GROUP_ORDER:
            has_rules = self._has_group_rules(schema, group) or (
                group == "object" and "unevaluatedProperties" in schema
            )
            if not has_rules and folded != group:
                continue
            test = _TYPE_EXPRESSIONS[group].format(v=v)
            if not has_rules:
                fn.emit(depth, f"if not {test}:")
                self.fail(fn, depth + 1, _type_fault([group]), path)
                continue
            fn.emit(depth, f"if {test}:")
            getattr(self, f"{group}_group")(fn, schema, v, path, depth + 1)
            if folded == group:
                fn.emit(depth, "else:")
                self.fail(fn, depth + 1, _type_fault([group]), path)

    @staticmethod
    def _types(schema: Schema) -> list[str]:
        declared = schema.get("type")
        types = [declared] if isinstance(declared, str) else list(declared or [])
        for t in types:
            if t not in _TYPE_EXPRESSIONS:
                raise SchemaCompileError(f"unsupported type {t!r}")
        return types

    @staticmethod
    def _has_group_rules(schema: Schema, group: str) -> bool:
        return any(k in schema for k in _GROUP_KEYWORDS.get(group, ()))

    def any_value(
        self, fn: _Function, keyword: str, arg: Any, v: str, path: _Path, depth: int,
        known_type: str | None,
    ) -> None:
        if keyword == "$ref":
            if arg not in self._definitions:
                raise SchemaCompileError(f"$ref to unknown definition {arg!r}")
            target = self._definitions[arg]
            if _is_leaf(target):
                # Small self-contained rules (DateTime, Did, ...) are cheaper written in place.
                self.node(fn, target, v, path, depth)
                return
            f = fn.local("f")
            fn.emit(depth, f"{f} = {self.function_name(arg)}({v})")
            fn.emit(depth, f"if {f} is not None:")
            fn.emit(depth + 1, f"return {self.relocate(path, f)}")
        elif keyword in ("const", "enum"):
            values = [arg] if keyword == "const" else list(arg)
            fault = _Fault(keyword, "must be one of " + ", ".join(repr(x) for x in values))
            if all(isinstance(x, str) for x in values):
                # The isinstance guard also keeps unhashable values away from the set.
                guard = "" if known_type == "string" else f"isinstance({v}, str) and "
                test = f"{guard}{v} in {self.const(frozenset(values))}"
            else:
                test = f"any(_js_equal({v}, x) for x in {self.const(tuple(values))})"
            fn.emit(depth, f"if not ({test}):")
            self.fail(fn, depth + 1, fault, path)
        elif keyword == "not":
            alt = self.branch(arg)
            fn.emit(depth, f"if {alt}({v}) is None:")
            self.fail(fn, depth + 1, _Fault("not", "must not match the excluded form"), path)
        elif keyword == "allOf":
            # allOf is not an alternative: its parts run in place, one after another.
            for part in arg:
                self.node(fn, part, v, path, depth)
        elif keyword == "anyOf":
            alts = [self.alternative(fn, b, v) for b in arg]
            f = fn.local("f")
            fn.emit(depth, f"{f} = {alts[0]}")
            rest = "".join(f" and {alt} is not None" for alt in alts[1:])
            fn.emit(depth, f"if {f} is not None{rest}:")
            fn.emit(depth + 1, f"return {self.relocate(path, f)}")
        else:  # oneOf
            # The reference stops at the second fitting alternative; errors left by
            # alternatives that failed before it come first.
            alts = [self.alternative(fn, b, v) for b in arg]
            f, g, matched = fn.local("f"), fn.local("g"), fn.local("m")
            ambiguous = self.const(_Fault("oneOf", "matches more than one alternative"))
            fn.emit(depth, f"{f} = None")
            fn.emit(depth, f"{matched} = False")
            for alt in alts:
                fn.emit(depth, f"{g} = {alt}")
                fn.emit(depth, f"if {g} is None:")
                fn.emit(depth + 1, f"if {matched}:")
                fn.emit(depth + 2, f"return {self.relocate(path, f'({f} or {ambiguous})')}")
                fn.emit(depth + 1, f"{matched} = True")
                fn.emit(depth, f"elif {f} is None:")
                fn.emit(depth + 1, f"{f} = {g}")
            fn.emit(depth, f"if not {matched}:")
            fn.emit(depth + 1, f"return {self.relocate(path, f)}")

    def alternative(self, fn: _Function, schema: Schema, v: str) -> str:
        """An expression giving the first fault of ``schema`` on ``v``, or None.

        When the alternative demands one type and nothing is checked before its type, a value
        of another type fails it with that type's fault: test the type here instead of calling.
        """
        target = schema
        while target.keys() - _ANNOTATIONS == {"$ref"}:
            target = self._definitions[target["$ref"]]
        types = self._types(target)
        if len(types) != 1 or any(k in target for k in _ANY_VALUE_KEYWORDS):
            return f"{self.branch(schema)}({v})"
        test = _TYPE_EXPRESSIONS[types[0]].format(v=v)
        fault = self.const(_type_fault(types))
        if not target.keys() - _ANNOTATIONS - {"type"}:
            return f"(None if {test} else {fault})"
        return f"({self.branch(schema)}({v}) if {test} else {fault})"

    def number_group(
        self, fn: _Function, schema: Schema, v: str, path: _Path, depth: int
    ) -> None:
        limit = schema["minimum"]
        fn.emit(depth, f"if {v} < {limit!r}:")
        self.fail(fn, depth + 1, _Fault("minimum", f"must be at least {limit}"), path)

    def string_group(
        self, fn: _Function, schema: Schema, v: str, path: _Path, depth: int
    ) -> None:
        search = self.const(re.compile(schema["pattern"]).search)
        fn.emit(depth, f"if not {search}({v}):")
        self.fail(fn, depth + 1, _Fault("pattern", "does not have the required form"), path)

    def array_group(
        self, fn: _Function, schema: Schema, v: str, path: _Path, depth: int
    ) -> None:
        if "maxItems" in schema:
            n = schema["maxItems"]
            fn.emit(depth, f"if len({v}) > {n}:")
            self.fail(fn, depth + 1, _Fault("maxItems", f"must have at most {n} items"), path)
        if "minItems" in schema:
            n = schema["minItems"]
            fn.emit(depth, f"if len({v}) < {n}:")
            self.fail(fn, depth + 1, _Fault("minItems", f"must have at least {n} items"), path)
        items = schema.get("items")
        if items and items.keys() - _ANNOTATIONS:
            i, item = _Local(fn.local("i")), fn.local("x")
            fn.emit(depth, f"for {i}, {item} in enumerate({v}):")
            self.node(fn, items, item, (*path, i), depth + 1)
        else:
            fn.emit(depth, "pass")

    def object_group(
        self, fn: _Function, schema: Schema, o: str, path: _Path, depth: int
    ) -> None:
        fn.emit(depth, "pass")
        for keyword, relation in (("maxProperties", ">"), ("minProperties", "<")):
            if keyword in schema:
                n = schema[keyword]
                word = "most" if relation == ">" else "least"
                fn.emit(depth, f"if len({o}) {relation} {n}:")
                self.fail(fn, depth + 1, _Fault(keyword, f"must have at {word} {n} members"),
                          path)
        for name in schema.get("required", ()):
            fn.emit(depth, f"if {name!r} not in {o}:")
            self.fail(fn, depth + 1, _Fault("required", f"must have member '{name}'"), path)

        declared: dict[str, Schema] = schema.get("properties", {})
        known = self.const(frozenset(declared))
        patterns = [
            (self.const(re.compile(p).search), sub)
            for p, sub in schema.get("patternProperties", {}).items()
        ]
        matchers = self.const(tuple(self._constants[m] for m, _ in patterns))
        located = _path_source(path)
        additional = schema.get("additionalProperties", True)
        if additional is False:
            extra = (f"_first_extra({o}, {known}, {matchers}, 'additionalProperties', "
                     f"{located})")
            # Fast path: every member declared by name.
            fn.emit(depth, f"if not {o}.keys() <= {known}:")
            if not patterns:
                fn.emit(depth + 1, f"return {extra}")
            else:
                k = fn.local("k")
                matched = " or ".join(f"{m}({k})" for m, _ in patterns)
                fn.emit(depth + 1, f"for {k} in {o}:")
                fn.emit(depth + 2, f"if {k} not in {known} and not ({matched}):")
                fn.emit(depth + 3, f"return {extra}")
        elif additional is not True:
            k = _Local(fn.local("k"))
            fn.emit(depth, f"for {k} in _js_keys({o}):")
            matched = "".join(f" or {m}({k})" for m, _ in patterns)
            fn.emit(depth + 1, f"if {k} in {known}{matched}:")
            fn.emit(depth + 2, "continue")
            x = fn.local("x")
            fn.emit(depth + 1, f"{x} = {o}[{k}]")
            self.node(fn, additional, x, (*path, k), depth + 1)

        for name, needs in schema.get("dependentRequired", {}).items():
            for other in needs:
                fn.emit(depth, f"if {name!r} in {o} and {other!r} not in {o}:")
                self.fail(fn, depth + 1, _Fault(
                    "dependentRequired", f"must have member '{other}' when '{name}' is set"
                ), path)
        for name, sub in schema.get("dependentSchemas", {}).items():
            fn.emit(depth, f"if {name!r} in {o}:")
            fn.emit(depth + 1, "pass")
            self.node(fn, sub, o, path, depth + 1)

        for name, sub in declared.items():
            if not sub.keys() - _ANNOTATIONS:
                continue
            x = fn.local("x")
            fn.emit(depth, f"{x} = {o}.get({name!r}, _ABSENT)")
            fn.emit(depth, f"if {x} is not _ABSENT:")
            fn.emit(depth + 1, "pass")
            self.node(fn, sub, x, (*path, name), depth + 1)

        for search, sub in patterns:
            if not sub.keys() - _ANNOTATIONS:
                continue
            k, x = _Local(fn.local("k")), fn.local("x")
            fn.emit(depth, f"for {k} in _js_keys({o}):")
            fn.emit(depth + 1, f"if {search}({k}):")
            fn.emit(depth + 2, f"{x} = {o}[{k}]")
            self.node(fn, sub, x, (*path, k), depth + 2)

        if schema.get("unevaluatedProperties", True) is not True:
            if schema["unevaluatedProperties"] is not False:
                raise SchemaCompileError("unevaluatedProperties must be false or absent")
            allowed = self.const(self._evaluated_names(schema) | _OBJECT_PROTOTYPE_MEMBERS)
            fn.emit(depth, f"if not {o}.keys() <= {allowed}:")
            fn.emit(depth + 1, f"return _first_extra({o}, {allowed}, (), "
                    f"'unevaluatedProperties', {located})")

    def _evaluated_names(self, schema: Schema) -> frozenset[str]:
        """Members that count as evaluated wherever this schema passes.

        The reference tracks this at run time; our rules only need the static case (names
        from ``properties`` reached through ``$ref`` and ``allOf``), and alternatives may only
        repeat names already covered, so the answer does not depend on which passed.
        """
        if "additionalProperties" in schema or "patternProperties" in schema:
            raise SchemaCompileError("unevaluatedProperties next to open-ended members")
        if "dependentSchemas" in schema:
            raise SchemaCompileError("unevaluatedProperties next to dependentSchemas")
        names = set(schema.get("properties", {}))
        if "$ref" in schema:
            names |= self._evaluated_names(self._definitions[schema["$ref"]])
        for part in schema.get("allOf", ()):
            names |= self._evaluated_names(part)
        for keyword in ("anyOf", "oneOf"):
            for alternative in schema.get(keyword, ()):
                if not self._evaluated_names(alternative) <= names:
                    raise SchemaCompileError("alternatives that evaluate different members")
        return frozenset(names)


# --- public API -----------------------------------------------------------------------------


def _compile_exported() -> dict[str, Check]:
    compiled = _Generator(DEFINITIONS).build()
    return {name: compiled[name] for name in EXPORTED_NAMES}


_CHECKS: Final = _compile_exported()

SCHEMA_NAMES: Final = frozenset(_CHECKS)
"""The schema names :func:`validate` knows (the reference's exported validator names)."""


def _refusal(schema_name: str, fault: _Fault) -> DwnError:
    where = _pointer(fault.path) or schema_name
    if fault.keyword == "additionalProperties":
        return DwnError(
            ADDITIONAL_PROPERTY_NOT_ALLOWED,
            f"{where}: member '{fault.member}' is not allowed here",
            _BAD_REQUEST,
        )
    if fault.keyword == "unevaluatedProperties":
        return DwnError(
            UNEVALUATED_PROPERTY_NOT_ALLOWED,
            f"{where}: member '{fault.member}' is not a known member",
            _BAD_REQUEST,
        )
    return DwnError(SCHEMA_VALIDATION_FAILED, f"{where}: {fault.message}", _BAD_REQUEST)


def validate(schema_name: str, payload: object) -> None:
    """Raise DwnError (status 400) when payload does not satisfy the named schema.

    ``schema_name`` is one of :data:`SCHEMA_NAMES` (for a message, its descriptor's
    interface followed by its method, e.g. ``"RecordsWrite"``); any other name raises
    ``SchemaValidatorSchemaNotFound``. ``payload`` is a JSON value (dicts, lists, str,
    int, float, bool, None).
    """
    check = _CHECKS.get(schema_name)
    if check is None:
        raise DwnError(SCHEMA_NOT_FOUND, f"schema for {schema_name} not found.", _BAD_REQUEST)
    try:
        fault = check(payload)
    except RecursionError:
        # Only a pathologically nested protocol structure gets here; refuse it as malformed.
        raise DwnError(
            SCHEMA_VALIDATION_FAILED, f"{schema_name}: nested too deeply to validate",
            _BAD_REQUEST,
        ) from None
    if fault is not None:
        raise _refusal(schema_name, fault)
