"""DWN timestamps: format, validation (differential against Temporal), order, offsets."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2psync.dwn.errors import DwnError
from p2psync.dwn.timeutil import (
    MAX_EPOCH_NS,
    MIN_EPOCH_NS,
    add_seconds,
    compare_timestamps,
    datetime_from_timestamp,
    format_epoch_ns,
    is_at_or_after,
    is_before,
    is_dwn_date_time,
    now_timestamp,
    offset_from_now,
    parse_timestamp,
    timestamp_from_datetime,
    validate_timestamp,
)
from tests.dwn.oracle_utils import needs_reference, run_oracle


def test_now_has_the_reference_shape() -> None:
    stamp = now_timestamp()
    assert is_dwn_date_time(stamp)
    validate_timestamp(stamp)
    moment = datetime_from_timestamp(stamp)
    assert abs(datetime.now(UTC) - moment) < timedelta(minutes=5)


def test_timestamp_from_datetime_converts_to_utc() -> None:
    paris = timezone(timedelta(hours=2))
    moment = datetime(2024, 5, 1, 14, 34, 56, 123456, tzinfo=paris)
    assert timestamp_from_datetime(moment) == "2024-05-01T12:34:56.123456Z"
    assert timestamp_from_datetime(datetime(2024, 5, 1, tzinfo=UTC)) == (
        "2024-05-01T00:00:00.000000Z"
    )
    with pytest.raises(ValueError):
        timestamp_from_datetime(datetime(2024, 5, 1))  # naive: which zone?


@pytest.mark.parametrize(
    "stamp",
    [
        "2024-05-01T12:34:56.123456Z",
        "2024-05-01T12:34:56Z",  # fewer digits: Temporal accepts, the JSON schema does not
        "2024-05-01T12:34:56.123456789Z",
        "2024-05-01T14:34:56+02:00",
        "2024-05-01 12:34Z",
        "20240501T123456Z",
        "2024-05-01t12:34:56z",
        "2024-05-01T23:59:60Z",  # leap second, read as :59
        "2024-02-29T00:00Z",
        "+002024-05-01T00:00Z",
        "2024-05-01T12:34:56Z[Europe/Paris]",
        "2024-05-01T12:34:56Z[u-ca=japanese]",
    ],
)
def test_accepts_what_temporal_accepts(stamp: str) -> None:
    validate_timestamp(stamp)


@pytest.mark.parametrize(
    "stamp",
    [
        "",
        "2024-05-01",  # no time: an Instant needs an offset
        "2024-05-01T12:34:56",  # no offset
        "2024-05-01T12:34:56.1234567890Z",  # ten fraction digits
        "2023-02-29T00:00Z",
        "2024-13-01T00:00Z",
        "2024-05-01T24:00Z",
        "2024-05-01T12:60Z",
        "2024-05-01T12:34:61Z",
        "-000000-01-01T00:00Z",
        "+275760-09-13T00:00:00.000000001Z",  # just past Temporal's range
        "2024-05-01T12:34:56Z[!foo=bar]",  # unknown critical annotation
        "2024-05-01T12:34:56Z\n",  # `$` in JS does not skip a final newline
        "２０２４-05-01T12:34:56Z",  # fullwidth digits are not `\d` in JS
        "2024-05-01T12:34:56+24:00",
    ],
)
def test_refuses_what_temporal_refuses(stamp: str) -> None:
    with pytest.raises(DwnError) as refused:
        validate_timestamp(stamp)
    assert (refused.value.code, refused.value.status) == ("TimestampInvalid", 400)


def test_schema_shape_is_stricter_than_temporal() -> None:
    assert is_dwn_date_time("2024-05-01T12:34:56.123456Z")
    assert is_dwn_date_time("2024-05-01T23:59:60.000000Z")
    assert not is_dwn_date_time("2024-05-01T12:34:56Z")
    assert not is_dwn_date_time("2024-05-01T12:34:56.123456+00:00")
    assert not is_dwn_date_time("٢٠٢٤-05-01T12:34:56.123456Z")  # Arabic-Indic digits


def test_order_is_by_string_like_the_reference() -> None:
    earlier, later = "2024-05-01T12:34:56.123456Z", "2024-05-01T12:34:56.123457Z"
    assert compare_timestamps(earlier, later) == -1
    assert compare_timestamps(later, earlier) == 1
    assert compare_timestamps(later, later) == 0
    assert is_before(earlier, later) and not is_before(later, later)
    assert is_at_or_after(later, later) and not is_at_or_after(earlier, later)
    # The same instant written with an offset sorts by its text, as in the reference.
    assert compare_timestamps("2024-05-01T14:00:00+02:00", "2024-05-01T13:00:00Z") == 1
    # JS orders by UTF-16 code unit: U+FF61 sorts after U+1F600 (a surrogate pair).
    assert compare_timestamps("\uff61", "\U0001f600") == 1


def test_add_seconds_and_offsets() -> None:
    assert add_seconds("2024-05-01T12:34:56.123456Z", 3600) == "2024-05-01T13:34:56.123456Z"
    assert add_seconds("2024-12-31T23:59:59.999999Z", 1) == "2025-01-01T00:00:00.999999Z"
    assert add_seconds("2024-05-01T12:34:56.123456Z", -86_400) == ("2024-04-30T12:34:56.123456Z")
    assert add_seconds("2024-05-01T14:00+02:00", 0) == "2024-05-01T12:00:00.000000Z"
    with pytest.raises(TypeError):
        add_seconds("2024-05-01T12:34:56.123456Z", 1.5)  # type: ignore[arg-type]
    with pytest.raises(DwnError):
        add_seconds("2024-05-01", 1)
    ahead = offset_from_now(60)
    assert is_before(now_timestamp(), ahead)


def test_range_edges_format_like_temporal() -> None:
    assert format_epoch_ns(MAX_EPOCH_NS) == "+275760-09-13T00:00:00.000000Z"
    assert format_epoch_ns(MIN_EPOCH_NS) == "-271821-04-20T00:00:00.000000Z"
    assert format_epoch_ns(-1) == "1969-12-31T23:59:59.999999Z"  # truncation is a floor
    with pytest.raises(DwnError):
        format_epoch_ns(MAX_EPOCH_NS + 1)


@given(st.datetimes(timezones=st.just(UTC)))
def test_datetimes_round_trip(moment: datetime) -> None:
    stamp = timestamp_from_datetime(moment)
    assert is_dwn_date_time(stamp)
    assert datetime_from_timestamp(stamp) == moment
    assert format_epoch_ns(parse_timestamp(stamp)) == stamp


@given(st.datetimes(timezones=st.just(UTC)), st.datetimes(timezones=st.just(UTC)))
def test_string_order_is_time_order_for_canonical_stamps(a: datetime, b: datetime) -> None:
    sign = (a > b) - (a < b)
    assert compare_timestamps(timestamp_from_datetime(a), timestamp_from_datetime(b)) == sign


@given(st.text())
def test_any_text_is_accepted_or_refused_with_a_dwn_error(text: str) -> None:
    try:
        parse_timestamp(text)
    except DwnError as refused:
        assert refused.code == "TimestampInvalid"


# fmt: off
DIFFERENTIAL_INPUTS = [
    # the canonical form and its neighbours
    "2024-05-01T12:34:56.123456Z", "2024-05-01T12:34:56.12345Z", "2024-05-01T12:34:56.1Z",
    "2024-05-01T12:34:56.123456789Z", "2024-05-01T12:34:56.1234567891Z",
    "2024-05-01T12:34:56,123456Z", "2024-05-01T12:34:56.Z", "2024-05-01T12:34:56Z",
    "2024-05-01T12:34Z", "2024-05-01T12Z", "2024-05-01TZ", "2024-05-01Z", "2024-05-01",
    "2024-05-01T12:34:56", "2024-05-01T12:34:56.123456z", "2024-05-01t12:34:56Z",
    "2024-05-01 12:34:56Z", "2024-05-01  12:34:56Z", "2024-05-01\t12:34:56Z",
    "2024-05-01\u00a012:34:56Z", "2024-05-01\u200912:34:56Z", "2024-05-01\ufeff12:34:56Z",
    "2024-05-01\u180e12:34:56Z", "2024-05-01\x1c12:34:56Z", "2024-05-01\u008512:34:56Z",
    " 2024-05-01T12:34:56Z", "2024-05-01T12:34:56Z ", "2024-05-01T12:34:56Z\n",
    # basic format and mixtures
    "20240501T123456Z", "20240501T123456.5Z", "20240501T1234Z", "2024-05-01T123456Z",
    "20240501T12:34:56Z", "2024-0501T12:34Z", "202405-01T12:34Z", "20240501T12345Z",
    # calendar edges
    "2024-02-29T00:00Z", "2023-02-29T00:00Z", "1900-02-29T00:00Z", "2000-02-29T00:00Z",
    "2024-04-31T00:00Z", "2024-00-01T00:00Z", "2024-01-00T00:00Z", "2024-13-01T00:00Z",
    "2024-12-32T00:00Z", "0000-01-01T00:00Z", "9999-12-31T23:59:59.999999999Z",
    # time edges
    "2024-05-01T23:59:60Z", "2024-05-01T23:59:60.999999Z", "2024-05-01T12:00:60Z",
    "2024-05-01T12:34:61Z", "2024-05-01T24:00Z", "2024-05-01T24:00:00Z", "2024-05-01T12:60Z",
    "2024-05-01T29:00:00.000000Z", "2024-05-01T00:00:00.000000Z",
    # offsets
    "2024-05-01T12:34:56+00:00", "2024-05-01T12:34:56-00:00", "2024-05-01T12:34:56+02:00",
    "2024-05-01T12:34:56+0200", "2024-05-01T12:34:56+02", "2024-05-01T12:34:56\u221202:00",
    "2024-05-01T12:34:56+23:59", "2024-05-01T12:34:56+24:00", "2024-05-01T12:34:56+02:60",
    "2024-05-01T12:34:56+02:30:15", "2024-05-01T12:34:56+02:30:15.123456789",
    "2024-05-01T12:34:56+02:30:15.1234567891", "2024-05-01T12:34:56+02:3015",
    "2024-05-01T12:34:56+0230:15", "2024-05-01T12:34:56+2", "2024-05-01T12:34:56Z+02:00",
    "2024-05-01T12:34:56+02:00Z", "2024-05-01T12:34:56.123-05:00",
    # years
    "+002024-05-01T00:00Z", "-002024-05-01T00:00Z", "\u2212002024-05-01T00:00Z",
    "-000000-01-01T00:00Z", "+000000-01-01T00:00Z", "+275760-09-13T00:00Z",
    "+275760-09-13T00:00:00.000000001Z", "+275760-09-13T00:00:00.000000001+00:01",
    "-271821-04-20T00:00Z", "-271821-04-19T23:59:59.999999999Z",
    "-271821-04-19T23:59:59.999999999-00:01", "+999999-01-01T00:00Z", "12024-05-01T00:00Z",
    "024-05-01T00:00Z",
    # annotations and time zone names
    "2024-05-01T12:34:56Z[UTC]", "2024-05-01T12:34:56Z[!UTC]", "2024-05-01T12:34:56[UTC]",
    "2024-05-01T12:34:56Z[Europe/Paris]", "2024-05-01T12:34:56Z[Nowhere/Land]",
    "2024-05-01T12:34:56Z[+01:00]", "2024-05-01T12:34:56Z[Etc/GMT+5]",
    "2024-05-01T12:34:56Z[EST5EDT]", "2024-05-01T12:34:56Z[est5edt]",
    "2024-05-01T12:34:56Z[u-ca=iso8601]", "2024-05-01T12:34:56Z[!u-ca=japanese]",
    "2024-05-01T12:34:56Z[foo=bar]", "2024-05-01T12:34:56Z[!foo=bar]",
    "2024-05-01T12:34:56Z[!FOO=bar]", "2024-05-01T12:34:56Z[!U-CA=x]",
    "2024-05-01T12:34:56Z[UTC][u-ca=iso8601][foo=bar-baz]", "2024-05-01T12:34:56Z[]",
    "2024-05-01T12:34:56Z[u-ca=]", "2024-05-01T12:34:56Z[UTC", "2024-05-01T12:34:56Z[a/b/c]",
    "2024-05-01T12:34:56Z[.]", "2024-05-01T12:34:56Z[..]", "2024-05-01T12:34:56Z[...]",
    "2024-05-01T12:34:56Z[abcdefghijklmn]", "2024-05-01T12:34:56Z[abcdefghijklmno]",
    # not digits in JS's sense
    "２０２４-05-01T12:34:56Z", "٢٠٢٤-05-01T12:34:56Z", "2024-05-01T12:34:56.１Z",
    "", " ", "Z", "now", "2024", "1714566896", "2024-05-01T12:34:56\ud800Z",
]
# fmt: on


def _our_answer(stamp: str) -> tuple[str, str | None, str | None]:
    try:
        epoch_ns = parse_timestamp(stamp)
    except DwnError as refused:
        return refused.code, None, None
    return "ok", str(epoch_ns), format_epoch_ns(epoch_ns)


def _assert_same_as_reference(stamps: list[str]) -> None:
    answers = run_oracle("time", stamps)
    mismatches = []
    for stamp, answer in zip(stamps, answers, strict=True):
        theirs = (answer["check"], answer["epochNs"], answer["canonical"])
        if _our_answer(stamp) != theirs:
            mismatches.append((stamp, _our_answer(stamp), theirs))
    assert mismatches == []


@needs_reference
def test_differential_against_the_reference() -> None:
    assert len(DIFFERENTIAL_INPUTS) >= 100
    _assert_same_as_reference(DIFFERENTIAL_INPUTS)


# fmt: off
_DATES = ["2024-05-01", "20240501", "2024-02-30", "+002024-05-01", "-000001-12-31",
          "+275760-09-13", "-271821-04-19", "2024-13-01", "1970-01-01", "2024-5-01"]
_SEPARATORS = ["T", "t", " ", "", "  ", "\u3000", "_"]
_TIMES = ["12:34:56.123456", "12:34:56", "12:34", "12", "123456", "1234", "23:59:60",
          "24:00", "12:34:56,5", "12:34:56.1234567890", "00:00:00.000000001", "1:2:3", ""]
_OFFSETS = ["Z", "z", "+02:00", "-0530", "+23", "\u221200:01", "+24:00", "", "+02:00:00.5",
            "-00:00", "Zz"]
_SUFFIXES = ["", "[UTC]", "[!u-ca=iso8601]", "[!x=y]", "[Europe/Paris][u-ca=gregory]", "[",
             "[+01:00]", "\n"]
# fmt: on


def _random_stamps(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        rng.choice(_DATES)
        + rng.choice(_SEPARATORS)
        + rng.choice(_TIMES)
        + rng.choice(_OFFSETS)
        + rng.choice(_SUFFIXES)
        for _ in range(count)
    ]


@needs_reference
def test_random_differential_against_the_reference() -> None:
    _assert_same_as_reference(_random_stamps(3000, seed=7))


@needs_reference
def test_add_seconds_matches_create_offset_timestamp() -> None:
    cases: list[tuple[str, int]] = [
        ("2024-05-01T12:34:56.123456Z", 0),
        ("2024-05-01T12:34:56.123456Z", 3600),
        ("2024-05-01T12:34:56.123456Z", -3600),
        ("2024-02-28T23:59:59.999999Z", 86_400),
        ("2024-05-01T12:34:56.123456789Z", 1),
        ("1969-12-31T23:59:59.9999999Z", 0),
        ("1960-01-01T00:00:00.0000005Z", -1),
        ("2024-05-01T14:34:56+02:00", 10),
        ("9999-12-31T23:59:59.999999Z", 1),
        ("2024-05-01T12:34:56.123456Z", 10 * 365 * 86_400),
        ("+275760-09-12T00:00Z", 86_400),
    ]
    answers = run_oracle("time-offset", cases)
    assert [add_seconds(stamp, seconds) for stamp, seconds in cases] == answers
