"""JavaScript's value rules, as the reference's checks depend on them.

The reference is JavaScript: ``===``, ``undefined`` versus ``null``, string coercion and
truthiness decide its checks. Values that reach those checks are JSON a peer sent us, not
always schema-checked (a delegated grant's data never is), so "what would JS do with this"
decides whether a message is accepted. This module is the lowest layer of those checks:
it depends on nothing but :mod:`p2psync.dwn.errors`.
"""

from __future__ import annotations

import math
from typing import Any, Final

from p2psync.dwn.errors import DwnError

__all__ = [
    "JS_TYPE_ERROR",
    "THROWN_STATUS",
    "UNDEFINED",
    "js_error",
    "js_get",
    "js_strict_equal",
    "js_to_primitive_string",
    "js_to_string",
    "js_truthy",
]

#: Code of the errors the reference raises as a plain JS ``TypeError`` (reading a property of
#: ``null``/``undefined``). They carry no DwnError code there; handlers treat them as any
#: other failure at that point.
JS_TYPE_ERROR: Final = "TypeError"

#: Status of an error the reference throws instead of answering (its handler does not catch
#: it, so ``processMessage`` rejects; the interop harness reports that as 500). A handler that
#: does catch it answers with its own status, as the reference's does.
THROWN_STATUS: Final = 500


def js_error(code: str, detail: str) -> DwnError:
    """An error that is a plain JavaScript exception in the reference (status 500)."""
    return DwnError(code, detail, THROWN_STATUS)


class _Undefined:
    """JavaScript's ``undefined``: a property that is absent, as opposed to JSON ``null``."""

    _instance: _Undefined | None = None

    def __new__(cls) -> _Undefined:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNDEFINED"

    def __bool__(self) -> bool:
        return False


#: The value of an absent property (JSON ``null`` is Python ``None``).
UNDEFINED: Final = _Undefined()


def js_get(value: Any, key: str) -> Any:
    """``value[key]`` as JS reads it from a JSON value: :data:`UNDEFINED` when absent.

    Reading any property of ``null``/``undefined`` is a TypeError in JS; of a string, number,
    boolean or array it is ``undefined`` for the plain names used here.
    """
    if value is None or value is UNDEFINED:
        what = "null" if value is None else "undefined"
        raise js_error(JS_TYPE_ERROR, f"Cannot read properties of {what} (reading '{key}')")
    if isinstance(value, dict):
        return value.get(key, UNDEFINED)
    return UNDEFINED


def js_strict_equal(a: Any, b: Any) -> bool:
    """JS ``a === b`` for JSON values (objects and arrays are equal only to themselves)."""
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return a is b
    if a is UNDEFINED or b is UNDEFINED or a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return bool(a == b)
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return False


def js_truthy(value: Any) -> bool:
    """JS truthiness: objects and arrays are truthy even when empty; ``NaN`` is not."""
    if isinstance(value, dict | list):
        return True
    if isinstance(value, float) and math.isnan(value):
        return False
    return bool(value)


def js_to_string(value: Any) -> str:
    """``String(value)`` for a JSON value.

    Arrays join their items with ``,`` (``null`` items as empty); objects are
    ``[object Object]``.
    """
    if value is UNDEFINED:
        return "undefined"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _js_number_to_string(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ",".join("" if v is None or v is UNDEFINED else js_to_string(v) for v in value)
    return "[object Object]"


def _js_number_to_string(number: int | float) -> str:
    if isinstance(number, float):
        if math.isnan(number):
            return "NaN"
        if math.isinf(number):
            return "Infinity" if number > 0 else "-Infinity"
        if number.is_integer() and abs(number) < 1e21:
            return str(int(number))
        # Shortest round-trip digits, as both languages pick; only the exponent form differs.
        text = repr(number)
        if "e" in text:
            mantissa, exponent = text.split("e")
            sign = "-" if exponent.startswith("-") else "+"
            return f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0') or '0'}"
        return text
    if abs(number) < 10**21:
        return str(number)
    return _js_number_to_string(float(number))


def js_to_primitive_string(value: Any) -> str | None:
    """The string JS compares ``value`` as in ``<``/``>=`` against a string, else ``None``.

    Strings, arrays and objects compare as strings; ``undefined``, ``null``, booleans and
    numbers turn the comparison numeric, and a DWN timestamp is ``NaN`` as a number, so every
    such comparison is false (``None`` here).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return js_to_string(value)
    return None
