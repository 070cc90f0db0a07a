"""ProtocolsConfigure and ProtocolsQuery messages, and the validation of protocol definitions.

Behaviour follows dwn-sdk-js 0.5.2 (``interfaces/protocols-configure.ts``,
``interfaces/protocols-query.ts``). The JSON schema of a message is checked by the engine before
a handler parses it; what is checked here is what the reference checks *after* its schema:
normalized URLs, the structure of the rule sets (roles, ``$actions``, ``$size``, ``$tags``),
the signature structure and the timestamp — in the reference's order, so that a message with
several faults is refused with the same code.

``$tags`` schemas: the reference hands each tag's schema to AJV (draft 2020-12, default options).
At configure time it only checks the schema against the 2020-12 meta-schema
(``ajv.validateSchema``); compiling happens on every write to that protocol path, in strict mode,
and can fail there (see :func:`compile_tags_validator`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from referencing.exceptions import Unresolvable

from p2psync.dwn import schemas, urls
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import json_compact
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import GenericMessage, Message, validate_signature_structure
from p2psync.dwn.js_values import UNDEFINED, js_get, js_strict_equal, js_to_string, js_truthy
from p2psync.dwn.records import create_authorization
from p2psync.dwn.timeutil import now_timestamp, validate_timestamp

__all__ = [
    "MAX_RECORD_NESTING_DEPTH",
    "ProtocolAction",
    "ProtocolActor",
    "ProtocolsConfigure",
    "ProtocolsQuery",
    "TagsSchemaCompileError",
    "TagsValidator",
    "compile_tags_validator",
    "fetch_all_role_paths",
    "js_keys",
    "js_pattern_to_python",
    "normalize_definition",
    "validate_protocol_definition",
    "validate_tag_schema",
]

PROTOCOLS: Final = "Protocols"
CONFIGURE: Final = "Configure"
QUERY: Final = "Query"

#: Deepest protocol path a definition may declare: the reference refuses a rule set whose
#: path splits into more than 10 segments (``fetchAllRolePathsRecursively``).
MAX_RECORD_NESTING_DEPTH: Final = 10


class ProtocolAction:
    """The ``can`` values of an action rule (the reference's ``ProtocolAction`` enum)."""

    CO_DELETE: Final = "co-delete"
    CO_PRUNE: Final = "co-prune"
    CO_UPDATE: Final = "co-update"
    CREATE: Final = "create"
    DELETE: Final = "delete"
    PRUNE: Final = "prune"
    QUERY: Final = "query"
    READ: Final = "read"
    SUBSCRIBE: Final = "subscribe"
    UPDATE: Final = "update"


class ProtocolActor:
    """The ``who`` values of an action rule (the reference's ``ProtocolActor`` enum)."""

    ANYONE: Final = "anyone"
    AUTHOR: Final = "author"
    RECIPIENT: Final = "recipient"


# A role granting any of these must grant all of them (a role member who can read one record
# must be able to find it too).
_READ_ACTIONS: Final = (ProtocolAction.READ, ProtocolAction.QUERY, ProtocolAction.SUBSCRIBE)
# What a rule for "the recipient of this very record" may allow: the record exists before its
# recipient can act, so only acting on an existing record makes sense.
_RECIPIENT_SELF_ACTIONS: Final = (
    ProtocolAction.CO_UPDATE,
    ProtocolAction.CO_DELETE,
    ProtocolAction.CO_PRUNE,
)
# Members of `$tags` that configure the tag rules rather than describe one tag.
_TAGS_SETTINGS: Final = ("$allowUndefinedTags", "$requiredTags")

# Largest array index JS orders first in `for...in` / `Object.keys` (2**32 - 2).
_MAX_ARRAY_INDEX: Final = 2**32 - 2


# --------------------------------------------------------------------------- JS object order


def _is_array_index(key: str) -> bool:
    if not key.isdigit() or not key.isascii() or (len(key) > 1 and key[0] == "0"):
        return False
    return int(key) <= _MAX_ARRAY_INDEX


def js_keys(obj: Mapping[str, Any]) -> list[str]:
    """Keys in the order JS enumerates an object's own properties.

    Integer-like keys come first in ascending order, then the others in insertion order. The
    order decides which fault of a definition is reported first.
    """
    indices = sorted((k for k in obj if _is_array_index(k)), key=int)
    return indices + [k for k in obj if not _is_array_index(k)]


# --------------------------------------------------------------------------- $tags schemas

# One validator of schemas against the draft 2020-12 meta-schema. No format checker: AJV's
# `validateSchema` does not check formats either (`$id: "::::"` passes there).
_META_VALIDATOR: Final = Draft202012Validator(Draft202012Validator.META_SCHEMA)


def validate_tag_schema(schema: Any) -> str | None:
    """What ``ajv.validateSchema`` finds wrong with one tag's schema; ``None`` when valid."""
    error = next(iter(_META_VALIDATOR.iter_errors(schema)), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


# Keywords AJV 8.12 knows in its draft 2020-12 flavour with default options (its
# `RULES.keywords`); anything else fails compilation in strict mode.
_AJV_KNOWN_KEYWORDS: Final = frozenset(
    {
        "$async", "$comment", "$defs", "$dynamicAnchor", "$dynamicRef", "$id", "$recursiveAnchor",
        "$recursiveRef", "$ref", "$schema", "$vocabulary", "additionalProperties", "allOf", "anyOf",
        "const", "contains", "contentEncoding", "contentMediaType", "contentSchema", "default",
        "definitions", "dependencies", "dependentRequired", "dependentSchemas", "deprecated",
        "description", "else", "enum", "examples", "exclusiveMaximum", "exclusiveMinimum", "format",
        "id", "if", "items", "maxContains", "maxItems", "maxLength", "maxProperties", "maximum",
        "minContains", "minItems", "minLength", "minProperties", "minimum", "multipleOf", "not",
        "nullable", "oneOf", "pattern", "patternProperties", "prefixItems", "properties",
        "propertyNames", "readOnly", "required", "then", "title", "type", "unevaluatedItems",
        "unevaluatedProperties", "uniqueItems", "writeOnly",
    }
)
# Keywords whose value is one subschema, a list of them, or a map of them.
_SUBSCHEMA_ONE: Final = (
    "additionalProperties", "contains", "contentSchema", "else", "if", "items", "not",
    "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties",
)
_SUBSCHEMA_LIST: Final = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAP: Final = ("dependentSchemas", "patternProperties", "properties")


class TagsSchemaCompileError(Exception):
    """AJV would throw while compiling the tags schema (a plain ``Error`` in the reference)."""


def _resolve_pointer(root: Any, ref: str) -> bool:
    """Whether a same-document ``$ref`` (``#`` or ``#/a/b``) points at something in ``root``."""
    if ref == "#":
        return True
    if not ref.startswith("#/"):
        return False
    node = root
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def _strict_mode_problem(node: Any, root: Any, path: str) -> str | None:
    """The first AJV strict-mode compile failure in ``node`` (a subschema), if any."""
    if not isinstance(node, dict):
        return None
    for key in js_keys(node):
        if key not in _AJV_KNOWN_KEYWORDS:
            return f'strict mode: unknown keyword: "{key}"'
    if node.get("enum") == []:
        return "enum must have non-empty array"
    if "format" in node:
        # No format is registered in the reference's AJV (no ajv-formats), and unknown
        # formats are fatal in strict mode.
        return f'unknown format "{node["format"]}" ignored in schema at path "#{path}"'
    if "pattern" in node:
        try:
            js_pattern_to_python(node["pattern"])
        except ValueError as exc:
            return f"Invalid regular expression: /{node['pattern']}/u: {exc}"
        except NotImplementedError:
            pass  # valid JS we cannot evaluate: the value check is skipped (see below)
    if "contains" not in node:
        for key in ("minContains", "maxContains"):
            if key in node:
                return f'strict mode: "{key}" without "contains" is ignored'
    elif node.get("minContains") == 0 and "maxContains" not in node:
        return 'strict mode: "minContains" == 0 without "maxContains": "contains" keyword ignored'
    if "if" in node and "then" not in node and "else" not in node:
        return 'strict mode: "if" without "then" and "else" is ignored'
    for key in ("then", "else"):
        if key in node and "if" not in node:
            return f'strict mode: "{key}" without "if" is ignored'
    ref = node.get("$ref")
    if isinstance(ref, str) and not _resolve_pointer(root, ref):
        # Only same-document pointers are resolvable without registered schemas.
        return f"can't resolve reference {ref} from id #"
    for key in _SUBSCHEMA_ONE:
        if key in node:
            problem = _strict_mode_problem(node[key], root, f"{path}/{key}")
            if problem:
                return problem
    for key in _SUBSCHEMA_LIST:
        for i, sub in enumerate(node.get(key) or []):
            problem = _strict_mode_problem(sub, root, f"{path}/{key}/{i}")
            if problem:
                return problem
    for key in _SUBSCHEMA_MAP:
        members = node.get(key)
        if isinstance(members, dict):
            for name in js_keys(members):
                problem = _strict_mode_problem(members[name], root, f"{path}/{key}/{name}")
                if problem:
                    return problem
    return None


# JS regular expression (`u` flag) to Python `re`: JS-only escapes are rewritten, Python-only
# syntax is refused, since AJV compiles `pattern` as `new RegExp(pattern, "u")`.
_JS_CLASS_ESCAPES: Final = {
    "d": "0-9",
    "w": "A-Za-z0-9_",
    # ECMAScript WhiteSpace and LineTerminator (Python's `\\s` differs: it has U+001C-U+001F
    # and lacks U+FEFF).
    "s": "\\t\\n\\v\\f\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff",
}
_JS_SYNTAX_CHARS: Final = frozenset("^$\\.*+?()[]{}|/")


def _translate_escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """Translate the escape starting at ``pattern[i] == '\\\\'``; return (python, next index)."""
    if i + 1 >= len(pattern):
        raise ValueError("\\ at end of pattern")
    c = pattern[i + 1]
    if c in _JS_CLASS_ESCAPES:
        body = _JS_CLASS_ESCAPES[c]
        return (body if in_class else f"[{body}]"), i + 2
    if c in "DWS":
        if in_class:
            # valid JS, but a negated set cannot be spliced into a Python class
            raise NotImplementedError("negated class escape inside a class")
        return f"[^{_JS_CLASS_ESCAPES[c.lower()]}]", i + 2
    if c in "fnrtv" or (c in "bB" and not in_class):
        return "\\" + c, i + 2
    if c == "b":  # backspace inside a class
        return "\\x08", i + 2
    if c == "0" and not (i + 2 < len(pattern) and pattern[i + 2].isdigit()):
        return "\\x00", i + 2
    if c.isdigit() and not in_class:
        return "\\" + c, i + 2  # a backreference; Python checks the group exists
    if c == "c" and i + 2 < len(pattern) and pattern[i + 2].isascii() and pattern[i + 2].isalpha():
        return f"\\x{ord(pattern[i + 2]) % 32:02x}", i + 3
    if c == "x" and re.fullmatch(r"[0-9A-Fa-f]{2}", pattern[i + 2 : i + 4]):
        return "\\x" + pattern[i + 2 : i + 4], i + 4
    if c == "u":
        if re.fullmatch(r"[0-9A-Fa-f]{4}", pattern[i + 2 : i + 6]):
            return f"\\U{int(pattern[i + 2 : i + 6], 16):08x}", i + 6
        m = re.compile(r"\{([0-9A-Fa-f]+)\}").match(pattern, i + 2)
        if m and int(m.group(1), 16) <= 0x10FFFF:
            return f"\\U{int(m.group(1), 16):08x}", m.end()
        raise ValueError("Invalid Unicode escape")
    if c == "-" and in_class:
        return "\\-", i + 2
    if c in _JS_SYNTAX_CHARS:
        return "\\" + c, i + 2
    if c == "k" and not in_class:
        m = re.compile(r"<([A-Za-z_$][A-Za-z0-9_$]*)>").match(pattern, i + 2)
        if m is None:
            raise ValueError("Invalid named reference")
        return f"(?P={m.group(1)})", m.end()
    # \p{...} is valid in JS but Python's `re` has no Unicode properties.
    if c in "pP" and pattern.startswith("{", i + 2):
        raise NotImplementedError("Unicode property escapes are not supported")
    raise ValueError("Invalid escape")


def js_pattern_to_python(pattern: str) -> str:
    """A Python ``re`` pattern matching what JS ``new RegExp(pattern, "u")`` matches.

    Raises ``ValueError`` where the JS constructor throws (unbalanced brackets, lone quantifier
    brackets, escapes ``u`` mode refuses), and ``NotImplementedError`` for valid JS this
    translation does not cover (Unicode property escapes, ``\\D``/``\\W``/``\\S`` inside a class).
    ``\\b`` keeps Python's Unicode word boundary (JS uses ASCII word characters).
    """
    if not isinstance(pattern, str):
        raise ValueError("pattern is not a string")
    out: list[str] = []
    i = 0
    in_class = False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            piece, i = _translate_escape(pattern, i, in_class)
            out.append(piece)
            continue
        if in_class:
            if c == "]":
                in_class = False
            elif c in "[&~|":
                # literal in a JS class; Python reserves these for future set operations
                out.append("\\" + c)
                i += 1
                continue
            out.append(c)
            i += 1
            continue
        if c == "[":
            negated = pattern.startswith("^", i + 1)
            start = i + 2 if negated else i + 1
            if pattern.startswith("]", start):
                # JS `[]` matches nothing and `[^]` anything; Python has no empty class.
                out.append("[\\s\\S]" if negated else "(?!)")
                i = start + 1
                continue
            in_class = True
            out.append("[^" if negated else "[")
            i = start
            continue
        if c in "]}":
            raise ValueError("Lone quantifier brackets")
        if c == "{":
            m = re.compile(r"\{(\d+)(,(\d*))?\}").match(pattern, i)
            if m is None:
                raise ValueError("Lone quantifier brackets")
            if m.group(3) and int(m.group(3)) < int(m.group(1)):
                raise ValueError("numbers out of order in {} quantifier")
            out.append(m.group(0))
            i = m.end()
            continue
        if c == "(" and pattern.startswith("(?", i):
            m = re.compile(r"\(\?(?:[:=!]|<[=!])").match(pattern, i)
            if m is not None:
                out.append(m.group(0))
                i = m.end()
                continue
            m = re.compile(r"\(\?<([A-Za-z_$][A-Za-z0-9_$]*)>").match(pattern, i)
            if m is None:
                raise ValueError("Invalid group")
            out.append(f"(?P<{m.group(1)}>")
            i = m.end()
            continue
        if c == ".":
            out.append("[^\\n\\r\\u2028\\u2029]")  # every JS line terminator, not only LF
            i += 1
            continue
        if c == "$":
            out.append("\\Z")  # JS `$` (no m flag) is the end of input, not before a newline
            i += 1
            continue
        out.append(c)
        i += 1
    if in_class:
        raise ValueError("Unterminated character class")
    translated = "".join(out)
    try:
        re.compile(translated)
    except re.error as exc:
        if "look-behind" in str(exc):
            # JS allows variable-width look-behind; Python's `re` does not.
            raise NotImplementedError(str(exc)) from None
        raise ValueError(str(exc)) from None
    return translated


def _js_pattern_keyword(
    validator: Any, pattern: Any, instance: Any, schema: Any
) -> Iterator[Any]:
    """``pattern`` with JS semantics (AJV tests ``new RegExp(pattern, "u").test(value)``)."""
    if not isinstance(instance, str):
        return
    compiled = _cached_pattern(pattern)
    # A JS feature we cannot translate (Unicode property escapes): accept rather than refuse
    # what the reference may accept; the tag keeps its other checks.
    if compiled is not None and compiled.search(instance) is None:
        yield ValidationError(f'must match pattern "{pattern}"')


@functools.lru_cache(maxsize=256)
def _cached_pattern(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(js_pattern_to_python(pattern))
    except NotImplementedError:
        return None


def _make_tags_validator_class() -> Any:
    return validators.extend(Draft202012Validator, {"pattern": _js_pattern_keyword})


_TagsValidatorClass: Final = _make_tags_validator_class()

#: A compiled tags check: the error texts for a ``tags`` value (empty when it conforms).
TagsValidator = Callable[[Any], list[str]]


def compile_tags_validator(tags_rule: dict[str, Any]) -> TagsValidator:
    """Compile a rule set's ``$tags`` into a check of a write's ``tags``, as the reference does.

    The reference builds ``{type: "object", properties, required: $requiredTags ?? [],
    additionalProperties: $allowUndefinedTags ?? false}`` and compiles it with AJV. Raises
    :class:`TagsSchemaCompileError` where that compilation throws.
    """
    return _compile_tags_validator(json_compact(tags_rule))


@functools.lru_cache(maxsize=256)
def _compile_tags_validator(tags_rule_json: str) -> TagsValidator:
    tags_rule = json.loads(tags_rule_json)
    properties = {k: v for k, v in tags_rule.items() if k not in _TAGS_SETTINGS}
    allow_undefined = tags_rule.get("$allowUndefinedTags")
    schema = {
        "type": "object",
        "properties": properties,
        "required": tags_rule.get("$requiredTags") or [],
        "additionalProperties": allow_undefined if js_truthy(allow_undefined) else False,
    }
    # AJV validates the whole schema against the meta-schema when compiling (e.g. duplicate
    # `$requiredTags` fail here, though each tag schema passed at configure time).
    meta_problem = validate_tag_schema(schema)
    if meta_problem is not None:
        raise TagsSchemaCompileError(f"schema is invalid: {meta_problem}")
    problem = _strict_mode_problem(schema, schema, "")
    if problem is not None:
        raise TagsSchemaCompileError(problem)
    try:
        validator = _TagsValidatorClass(schema)
    except SchemaError as exc:  # pragma: no cover - the meta check above refuses these first
        raise TagsSchemaCompileError(str(exc)) from None

    def check(tags: Any) -> list[str]:
        try:
            return [_ajv_like_error(e) for e in validator.iter_errors(tags)]
        except Unresolvable as exc:
            raise TagsSchemaCompileError(f"can't resolve reference: {exc}") from None

    return check


def _ajv_like_error(error: Any) -> str:
    where = "".join(f"/{p}" for p in error.absolute_path)
    return f"{where} {error.message}" if where else error.message


# --------------------------------------------------------------------------- definitions


def fetch_all_role_paths(
    rule_set_path: str, rule_set: dict[str, Any], roles: list[str]
) -> list[str]:
    """Protocol paths of every ``$role`` rule set, as the reference collects them.

    The reference does not descend into a role rule set, and checks the nesting depth on the
    way down (before any other structure check).
    """
    if len(rule_set_path.split("/")) > MAX_RECORD_NESTING_DEPTH:
        raise DwnError(
            "ProtocolsConfigureRecordNestingDepthExceeded",
            "Record nesting depth exceeded 10 levels.",
        )
    for record_type in js_keys(rule_set):
        if record_type.startswith("$"):
            continue
        child = rule_set[record_type]
        child_path = record_type if rule_set_path == "" else f"{rule_set_path}/{record_type}"
        if js_truthy(js_get(child, "$role")):
            roles.append(child_path)
        else:
            fetch_all_role_paths(child_path, child, roles)
    return roles


def _rule_json(rule: Any) -> str:
    try:
        return json_compact(rule)
    except (TypeError, ValueError):
        return str(rule)


def _validate_action_rules(rule_set: dict[str, Any], path: str, roles: list[str]) -> None:
    rules = rule_set.get("$actions") or []
    for i, rule in enumerate(rules):
        role = js_get(rule, "role")
        who = js_get(rule, "who")
        of = js_get(rule, "of")
        can = js_get(rule, "can")
        can_list = can if isinstance(can, list) else []
        if role is not UNDEFINED:
            if not (isinstance(role, str) and role in roles):
                raise DwnError(
                    "ProtocolsConfigureRoleDoesNotExistAtGivenPath",
                    f"Role in action {_rule_json(rule)} for rule set {path} does not exist.",
                )
            granted = [a in can_list for a in _READ_ACTIONS]
            if any(granted) and not all(granted):
                raise DwnError(
                    "ProtocolsConfigureRoleReadActionMissing",
                    f"Role in action {_rule_json(rule)} for rule set {path} must contain all "
                    f"read actions ({', '.join(_READ_ACTIONS)}).",
                )
        if js_strict_equal(who, ProtocolActor.ANYONE) and js_truthy(of):
            raise DwnError(
                "ProtocolsConfigureInvalidActionOfNotAllowed",
                f"'of' is not allowed at rule set protocol path ({path})",
            )
        if (
            js_strict_equal(who, ProtocolActor.RECIPIENT)
            and of is UNDEFINED
            and any(a not in _RECIPIENT_SELF_ACTIONS for a in can_list)
        ):
            raise DwnError(
                "ProtocolsConfigureInvalidRecipientOfAction",
                "Rules for `recipient` without `of` property must have `can` containing "
                "only `co-update`, `co-delete`, and `co-prune`.",
            )
        if js_strict_equal(who, ProtocolActor.AUTHOR) and not js_truthy(of):
            raise DwnError(
                "ProtocolsConfigureInvalidActionMissingOf",
                "'of' is required when 'author' is specified as 'who'",
            )
        if can is not UNDEFINED:
            for action, code in (
                (ProtocolAction.UPDATE, "ProtocolsConfigureInvalidActionUpdateWithoutCreate"),
                (ProtocolAction.DELETE, "ProtocolsConfigureInvalidActionDeleteWithoutCreate"),
            ):
                if action in can_list and ProtocolAction.CREATE not in can_list:
                    raise DwnError(
                        code,
                        f"Action rule {_rule_json(rule)} contains '{action}' action but missing "
                        "the required 'create' action.",
                    )
        # One rule per actor (who + of) and one per role within a rule set.
        for other in rules[i + 1 :]:
            if who is not UNDEFINED:
                if js_strict_equal(who, js_get(other, "who")) and js_strict_equal(
                    of, js_get(other, "of")
                ):
                    raise DwnError(
                        "ProtocolsConfigureDuplicateActorInRuleSet",
                        f"More than one action rule per actor {js_to_string(who)} of "
                        f"{js_to_string(of)} not allowed within a rule set: {_rule_json(rule)}",
                    )
            elif js_strict_equal(role, js_get(other, "role")):
                raise DwnError(
                    "ProtocolsConfigureDuplicateRoleInRuleSet",
                    f"More than one action rule per role {js_to_string(role)} not allowed within "
                    f"a rule set: {_rule_json(rule)}",
                )


def _validate_rule_set(
    rule_set: dict[str, Any], path: str, record_types: list[str], roles: list[str]
) -> None:
    size = rule_set.get("$size")
    if size is not None:
        minimum = size.get("min", 0)
        maximum = size.get("max")
        if maximum is not None and maximum < minimum:
            raise DwnError(
                "ProtocolsConfigureInvalidSize",
                f"Invalid size range found: max limit {maximum} less than min limit {minimum} "
                f"at protocol path '{path}'",
            )
    tags = rule_set.get("$tags")
    if js_truthy(tags) and isinstance(tags, dict):
        for tag in js_keys(tags):
            if tag in _TAGS_SETTINGS:
                continue
            problem = validate_tag_schema(tags[tag])
            if problem is not None:
                raise DwnError(
                    "ProtocolsConfigureInvalidTagSchema",
                    f"tags schema validation error: {path}/$tags/{tag} {problem}",
                )
    _validate_action_rules(rule_set, path, roles)
    for record_type in js_keys(rule_set):
        if record_type.startswith("$"):
            continue
        if record_type not in record_types:
            raise DwnError(
                "ProtocolsConfigureInvalidRuleSetRecordType",
                f"Rule set {record_type} is not declared as an allowed type in the protocol "
                "definition.",
            )
        child_path = record_type if path == "" else f"{path}/{record_type}"
        _validate_rule_set(rule_set[record_type], child_path, record_types, roles)


def validate_protocol_definition(definition: dict[str, Any]) -> None:
    """The checks of a protocol definition beyond its JSON schema (400 ``DwnError``).

    In the reference's order: the protocol URL is normalized, every type's schema URL is
    normalized, nesting is at most :data:`MAX_RECORD_NESTING_DEPTH` deep, then each rule set
    from the root down (``$size``, ``$tags``, ``$actions``, then its children's types).
    """
    urls.validate_protocol_url_normalized(definition["protocol"])
    types = definition["types"]
    for type_name in js_keys(types):
        schema = types[type_name].get("schema")
        if schema is not None:
            urls.validate_schema_url_normalized(schema)
    structure = definition["structure"]
    roles = fetch_all_role_paths("", structure, [])
    _validate_rule_set(structure, "", list(types), roles)


def normalize_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """The definition with its protocol and schema URLs normalized (what ``create`` signs)."""
    types = {
        name: (
            {**t, "schema": urls.normalize_schema_url(t["schema"])} if "schema" in t else dict(t)
        )
        for name, t in definition["types"].items()
    }
    return {
        **definition,
        "protocol": urls.normalize_protocol_url(definition["protocol"]),
        "types": types,
    }


# --------------------------------------------------------------------------- messages


class ProtocolsConfigure(GenericMessage):
    """A parsed ProtocolsConfigure: a protocol definition installed in a tenant's DWN."""

    __slots__ = ()

    @property
    def definition(self) -> dict[str, Any]:
        return self.message["descriptor"]["definition"]  # type: ignore[no-any-return]

    @classmethod
    def parse(cls, message: Message) -> ProtocolsConfigure:
        """Integrity checks of the reference's ``ProtocolsConfigure.parse`` (400s), after the
        engine's schema check."""
        descriptor = message["descriptor"]
        validate_protocol_definition(descriptor["definition"])
        validate_signature_structure(message["authorization"]["signature"], descriptor)
        validate_timestamp(descriptor["messageTimestamp"])
        return cls(message)

    @classmethod
    def create(
        cls,
        *,
        definition: dict[str, Any],
        signer: Identity,
        message_timestamp: str | None = None,
        permission_grant_id: str | None = None,
        delegated_grant: Message | None = None,
    ) -> ProtocolsConfigure:
        """Author and sign a ProtocolsConfigure (URLs normalized, as the reference's
        ``create`` does)."""
        descriptor: dict[str, Any] = {
            "interface": PROTOCOLS,
            "method": CONFIGURE,
            "messageTimestamp": message_timestamp or now_timestamp(),
            "definition": normalize_definition(definition),
        }
        authorization = create_authorization(
            descriptor,
            signer,
            delegated_grant=delegated_grant,
            permission_grant_id=permission_grant_id,
        )
        message = {"descriptor": descriptor, "authorization": authorization}
        schemas.validate("ProtocolsConfigure", message)
        validate_protocol_definition(descriptor["definition"])
        return cls(message)

    def construct_indexes(self) -> dict[str, Any]:
        """Index keys: the descriptor less the definition, plus author, protocol, published."""
        indexes = {k: v for k, v in self.message["descriptor"].items() if k != "definition"}
        indexes["author"] = self.author
        indexes["protocol"] = self.definition["protocol"]
        indexes["published"] = self.definition["published"]
        return indexes


class ProtocolsQuery(GenericMessage):
    """A parsed ProtocolsQuery: a request for the protocol definitions a DWN holds."""

    __slots__ = ()

    @classmethod
    def parse(cls, message: Message) -> ProtocolsQuery:
        """Integrity checks of the reference's ``ProtocolsQuery.parse`` (400s)."""
        descriptor = message["descriptor"]
        if "authorization" in message:
            validate_signature_structure(message["authorization"]["signature"], descriptor)
        if "filter" in descriptor:
            protocol = descriptor["filter"].get("protocol")
            if not isinstance(protocol, str):
                # The reference normalizes `undefined` into "http://undefined", which differs.
                raise DwnError(
                    urls.URL_PROTOCOL_NOT_NORMALIZED, f"Protocol URI {protocol} must be normalized."
                )
            urls.validate_protocol_url_normalized(protocol)
        validate_timestamp(descriptor["messageTimestamp"])
        return cls(message)

    @classmethod
    def create(
        cls,
        *,
        signer: Identity | None = None,
        filter: dict[str, Any] | None = None,  # noqa: A002 - the reference's option name
        message_timestamp: str | None = None,
        permission_grant_id: str | None = None,
    ) -> ProtocolsQuery:
        """Author a ProtocolsQuery, signed when ``signer`` is given (unsigned queries are
        answered with published protocols only)."""
        descriptor: dict[str, Any] = {
            "interface": PROTOCOLS,
            "method": QUERY,
            "messageTimestamp": message_timestamp or now_timestamp(),
        }
        if filter:
            descriptor["filter"] = {
                **filter,
                "protocol": urls.normalize_protocol_url(filter["protocol"]),
            }
        message: Message = {"descriptor": descriptor}
        if signer is not None:
            message["authorization"] = create_authorization(
                descriptor, signer, permission_grant_id=permission_grant_id
            )
        schemas.validate("ProtocolsQuery", message)
        return cls(message)
