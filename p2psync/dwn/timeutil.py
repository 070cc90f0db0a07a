"""DWN timestamps, with the reference DWN's rules.

dwn-sdk-js 0.5.2 (``src/utils/time.ts``) writes timestamps as UTC ISO-8601 strings with
exactly six fractional digits and ``Z`` (``2024-05-01T12:34:56.123456Z``), truncating, via
``Temporal.Instant.toString({smallestUnit: 'microseconds'})`` of ``@js-temporal/polyfill``
0.4.4.

Two checks guard incoming timestamps, in this order:

* the message JSON schemas (``$defs/date-time``) require the exact shape above, see
  :func:`is_dwn_date_time`;
* ``Time.validateTimestamp`` accepts whatever ``Temporal.Instant.from`` parses, a much
  wider ISO-8601/RFC 9557 grammar (offsets, basic format, a space for ``T``, ``,`` decimal
  marks, bracketed annotations, six-digit signed years, a leap second clamped to :59, ...),
  and refuses everything else with ``TimestampInvalid`` (400). :func:`validate_timestamp`
  reproduces that grammar and its range checks.

The reference orders timestamps by comparing the strings (``a < b`` on JS strings, UTF-16
code units), never by parsed instant; :func:`compare_timestamps` does the same.
"""

from __future__ import annotations

import functools
import re
import time
from datetime import UTC, datetime
from typing import Final

from p2psync.dwn.errors import DwnError

#: Error code of a timestamp that ``Temporal.Instant.from`` refuses.
TIMESTAMP_INVALID: Final = "TimestampInvalid"

_NS_PER_SECOND: Final = 1_000_000_000
_NS_PER_DAY: Final = 86_400 * _NS_PER_SECOND
#: Temporal.Instant's range: 10^8 days either side of the epoch (ECMA-262 time values).
MAX_EPOCH_NS: Final = 100_000_000 * _NS_PER_DAY
MIN_EPOCH_NS: Final = -MAX_EPOCH_NS

# --- the Temporal ISO-8601 grammar (polyfill 0.4.4, lib/regex.ts), rebuilt piece by piece.
# JS semantics to keep: `\d` is ASCII only, `\s` is JS's whitespace set, the whole pattern is
# case-insensitive for ASCII letters only (no `u` flag), `$` means end of input.
_JS_SPACE: Final = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_SIGN: Final = "[+\u2212-]"  # U+2212 MINUS SIGN counts as '-'
_FRACTION: Final = r"[.,]([0-9]{1,9})"
_YEAR: Final = rf"({_SIGN}[0-9]{{6}}|[0-9]{{4}})"
_MONTH: Final = "(0[1-9]|1[0-2])"
_DAY: Final = "(0[1-9]|[12][0-9]|3[01])"
_DATE: Final = rf"{_YEAR}(?:-{_MONTH}-{_DAY}|{_MONTH}{_DAY})"
# Extended (hh:mm:ss) or basic (hhmmss) time; minutes and seconds optional in both.
_TIME: Final = (
    rf"([0-9]{{2}})(?::([0-9]{{2}})(?::([0-9]{{2}})(?:{_FRACTION})?)?"
    rf"|([0-9]{{2}})(?:([0-9]{{2}})(?:{_FRACTION})?)?)?"
)
_OFFSET: Final = (
    rf"({_SIGN})([01][0-9]|2[0-3])"
    rf"(?::?([0-5][0-9])(?::?([0-5][0-9])(?:{_FRACTION})?)?)?"
)
_OFFSET_NO_CAPTURE: Final = (
    rf"{_SIGN}[0-2][0-9](?::?[0-5][0-9](?::?[0-5][0-9](?:[.,][0-9]{{1,9}})?)?)?"
)
# A time zone name in brackets is only checked for shape; Instant.from ignores it.
_TZ_PART: Final = (
    r"\.[-A-Za-z_]|\.\.[-A-Za-z._]{1,12}|\.[-A-Za-z_][-A-Za-z._]{0,12}"
    r"|[A-Za-z_][-A-Za-z._]{0,13}"
)
_TZ_NAME: Final = "|".join(
    (
        rf"(?:{_TZ_PART})(?:/(?:{_TZ_PART}))*",
        r"Etc/GMT(?:0|[-+][0-9]{1,2})",
        r"GMT[-+]?0",
        "EST5EDT",
        "CST6CDT",
        "MST7MDT",
        "PST8PDT",
        _OFFSET_NO_CAPTURE,
    )
)
_ANNOTATION_SHAPE: Final = r"\[!?[a-z_][a-z0-9_-]*=[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*\]"
_ISO_DATE_TIME: Final = re.compile(
    rf"{_DATE}"
    rf"(?:(?:T|[{_JS_SPACE}]+){_TIME}(?:([zZ])|(?:{_OFFSET})?)?)?"
    rf"(?:\[!?(?:{_TZ_NAME})\])?"
    rf"((?:{_ANNOTATION_SHAPE})*)\Z",
    re.IGNORECASE | re.ASCII,
)
# The polyfill re-scans the annotations with a case-SENSITIVE pattern; an annotation whose
# key has capitals passes the first match but is then skipped, even when marked critical.
_ANNOTATION: Final = re.compile(r"\[(!)?([a-z_][a-z0-9_-]*)=([A-Za-z0-9]+(?:-[A-Za-z0-9]+)*)\]")

# The shape the DWN JSON schemas demand (json-schemas/definitions.json `date-time`).
_DWN_DATE_TIME: Final = re.compile(
    r"[0-9]{4}-[0-1][0-9]-[0-3][0-9]T(?:[0-2][0-9]:[0-5][0-9]:[0-5][0-9]|23:59:60)"
    r"\.[0-9]{6}Z\Z"
)

# A subset of the schema's shape that Temporal.Instant.from certainly accepts: a 4-digit year
# (0000-9999, far inside Instant's range), a day that every month has (01-28), hours 00-23,
# minutes and seconds 00-59, Z. Most timestamps are in this form; the rest are parsed.
_SURELY_VALID: Final = re.compile(
    r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"\.[0-9]{6}Z\Z"
)

_DAYS_IN_MONTH: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in_month(year: int, month: int) -> int:
    return 29 if month == 2 and _is_leap(year) else _DAYS_IN_MONTH[month - 1]


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year)."""
    # Shift the year to start in March so the leap day is the last day of the year.
    y = year - (1 if month <= 2 else 0)
    era = y // 400
    year_of_era = y - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """Inverse of :func:`_days_from_civil`."""
    z = days + 719_468
    era = z // 146_097
    day_of_era = z - era * 146_097
    year_of_era = (
        day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return year_of_era + era * 400 + (1 if month <= 2 else 0), month, day


def _fraction_ns(digits: str | None) -> int:
    """Nanoseconds of a 1–9 digit decimal fraction of a second."""
    return int(digits.ljust(9, "0")) if digits else 0


def _invalid(timestamp: str) -> DwnError:
    return DwnError(TIMESTAMP_INVALID, f"Invalid timestamp: {timestamp}")


def parse_timestamp(timestamp: str) -> int:
    """Return the instant ``timestamp`` names, in nanoseconds since the Unix epoch.

    Accepts exactly what ``Temporal.Instant.from`` accepts; raises
    ``DwnError(TimestampInvalid)`` otherwise.
    """
    match = _ISO_DATE_TIME.match(timestamp)
    if match is None:
        raise _invalid(timestamp)
    (
        year_s, month_a, day_a, month_b, day_b,
        hour_s, minute_a, second_a, fraction_a, minute_b, second_b, fraction_b,
        zulu, off_sign, off_hour, off_minute, off_second, off_fraction,
        annotations,
    ) = match.groups()  # fmt: skip
    if year_s in ("-000000", "\u2212000000"):  # ISO 8601 has no negative zero year
        raise _invalid(timestamp)
    if zulu is None and off_sign is None:  # an Instant needs Z or a UTC offset
        raise _invalid(timestamp)
    for critical, key, _value in _ANNOTATION.findall(annotations):
        if critical and key != "u-ca":
            raise _invalid(timestamp)

    year = int(year_s.replace("\u2212", "-"))
    month = int(month_a or month_b)
    day = int(day_a or day_b)
    hour = int(hour_s)
    minute = int(minute_a or minute_b or 0)
    second = int(second_a or second_b or 0)
    if second == 60:  # a leap second is read as the last second of the minute
        second = 59
    if day > _days_in_month(year, month) or hour > 23 or minute > 59 or second > 59:
        raise _invalid(timestamp)
    offset_ns = 0
    if zulu is None:
        offset_ns = (
            (int(off_hour) * 60 + int(off_minute or 0)) * 60 + int(off_second or 0)
        ) * _NS_PER_SECOND + _fraction_ns(off_fraction)
        if off_sign != "+":
            offset_ns = -offset_ns

    epoch_ns = (
        _days_from_civil(year, month, day) * _NS_PER_DAY
        + (hour * 3600 + minute * 60 + second) * _NS_PER_SECOND
        + _fraction_ns(fraction_a or fraction_b)
        - offset_ns
    )
    if not MIN_EPOCH_NS <= epoch_ns <= MAX_EPOCH_NS:
        raise _invalid(timestamp)
    return epoch_ns


@functools.lru_cache(maxsize=8192)
def validate_timestamp(timestamp: str) -> None:
    """Refuse (``TimestampInvalid``, 400) what the reference's ``validateTimestamp`` refuses.

    Cached: a write's dateCreated and messageTimestamp are usually one string, and refusals
    (exceptions) are not cached.
    """
    if _SURELY_VALID.match(timestamp) is not None:
        return  # the form the reference writes, with values every month has: no need to parse
    parse_timestamp(timestamp)


def is_dwn_date_time(timestamp: str) -> bool:
    """True when ``timestamp`` has the shape the DWN JSON schemas require.

    ASCII digits only: the reference's validator (ajv) reads ``\\d`` as ``[0-9]``, which
    Python's ``re`` does not for ``str`` patterns.
    """
    return _DWN_DATE_TIME.match(timestamp) is not None


def format_epoch_ns(epoch_ns: int) -> str:
    """Format an instant as the reference does: UTC, microseconds (truncated), ``Z``."""
    if not MIN_EPOCH_NS <= epoch_ns <= MAX_EPOCH_NS:
        raise DwnError(TIMESTAMP_INVALID, f"Instant outside of supported range: {epoch_ns}")
    days, ns_of_day = divmod(epoch_ns, _NS_PER_DAY)  # floor: truncation toward the past
    year, month, day = _civil_from_days(days)
    micros_of_day = ns_of_day // 1000
    seconds_of_day, micros = divmod(micros_of_day, 1_000_000)
    hour, rest = divmod(seconds_of_day, 3600)
    minute, second = divmod(rest, 60)
    # Temporal writes years outside 0..9999 with a sign and six digits.
    year_s = f"{year:04d}" if 0 <= year <= 9999 else f"{'-' if year < 0 else '+'}{abs(year):06d}"
    return f"{year_s}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}.{micros:06d}Z"


def now_timestamp() -> str:
    """The current time as a DWN timestamp, like ``Time.getCurrentTimestamp()``."""
    return format_epoch_ns(time.time_ns())


def timestamp_from_datetime(moment: datetime) -> str:
    """Format an aware ``datetime`` as a DWN timestamp (converted to UTC)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("timestamp_from_datetime needs an aware datetime")
    utc = moment.astimezone(UTC)
    return (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T"
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}.{utc.microsecond:06d}Z"
    )


def datetime_from_timestamp(timestamp: str) -> datetime:
    """Parse a timestamp into an aware UTC ``datetime`` (sub-microseconds dropped).

    Raises ``DwnError(TimestampInvalid)`` for what the reference refuses, and for instants
    Python's ``datetime`` cannot hold (years outside 1..9999).
    """
    epoch_ns = parse_timestamp(timestamp)
    days, ns_of_day = divmod(epoch_ns, _NS_PER_DAY)
    year, month, day = _civil_from_days(days)
    if not 1 <= year <= 9999:
        raise _invalid(timestamp)
    seconds, micro = divmod(ns_of_day // 1000, 1_000_000)
    hour, rest = divmod(seconds, 3600)
    return datetime(year, month, day, hour, rest // 60, rest % 60, micro, tzinfo=UTC)


def add_seconds(timestamp: str, seconds: int) -> str:
    """The timestamp ``seconds`` later (earlier when negative), like
    ``Time.createOffsetTimestamp({seconds}, timestamp)``; used for grant expiry.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        # Temporal.Duration refuses fractional seconds; be as strict.
        raise TypeError("seconds must be an int")
    return format_epoch_ns(parse_timestamp(timestamp) + seconds * _NS_PER_SECOND)


def offset_from_now(seconds: int) -> str:
    """The timestamp ``seconds`` from now (``Time.createOffsetTimestamp({seconds})``)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise TypeError("seconds must be an int")
    return format_epoch_ns(time.time_ns() + seconds * _NS_PER_SECOND)


def compare_timestamps(a: str, b: str) -> int:
    """-1, 0 or 1 as the reference orders two timestamps: by string, not by instant."""
    if a.isascii() and b.isascii():
        return (a > b) - (a < b)
    # JS compares UTF-16 code units; big-endian UTF-16 bytes sort the same way.
    ka = a.encode("utf-16-be", "surrogatepass")
    kb = b.encode("utf-16-be", "surrogatepass")
    return (ka > kb) - (ka < kb)


def is_before(a: str, b: str) -> bool:
    """``a < b`` in the reference's order (e.g. a write older than a grant's ``dateGranted``)."""
    return compare_timestamps(a, b) < 0


def is_at_or_after(a: str, b: str) -> bool:
    """``a >= b`` in the reference's order (e.g. a message at or past ``dateExpires``)."""
    return compare_timestamps(a, b) >= 0
