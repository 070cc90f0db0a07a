"""Protocol/schema URL normalization: fixed cases and a differential run against Node."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2psync.dwn.errors import DwnError
from p2psync.dwn.urls import (
    normalize_protocol_url,
    normalize_schema_url,
    validate_protocol_url_normalized,
    validate_schema_url_normalized,
)
from tests.dwn.oracle_utils import needs_reference, run_oracle

# (input, normalized form) as the reference computes them.
NORMALIZED = [
    ("example.com", "http://example.com"),  # no scheme: http:// is prefixed
    ("example.com/protocol/", "http://example.com/protocol"),
    ("https://example.com/", "https://example.com"),  # one trailing slash goes
    ("https://example.com/a//", "https://example.com/a/"),  # ... only one
    ("HTTPS://Example.COM/Path", "https://example.com/Path"),  # scheme, host lowered
    ("https://example.com:443/a", "https://example.com/a"),  # default port dropped
    ("https://example.com/a?x=1#frag", "https://example.com/a"),  # query, fragment dropped
    ("https://example.com/a/./b/../c", "https://example.com/a/c"),
    ("https://例え.jp/", "https://xn--r8jz45g.jp"),  # IDNA
    ("did:web:example.com", "did:web:example.com"),  # non-special: left as is
    ("foo://BAR/", "foo://BAR"),  # non-special host keeps its case
    ("a:/b", "http://a/b"),  # 'scheme:' then '/' alone is not taken for a scheme
    ("localhost:3000/x", "localhost:3000/x"),  # ... but 'localhost:' is one!
]


@pytest.mark.parametrize(("url", "expected"), NORMALIZED)
def test_normalize(url: str, expected: str) -> None:
    assert normalize_protocol_url(url) == expected
    assert normalize_schema_url(url) == expected


@pytest.mark.parametrize("url", ["", "  x.com ", "https://ex ample.com", "http://[::1"])
def test_unparseable_urls_are_refused_with_the_reference_code(url: str) -> None:
    for normalize in (normalize_protocol_url, normalize_schema_url):
        with pytest.raises(DwnError) as refused:
            normalize(url)
        assert refused.value.code == "UrlProtocolNotNormalizable"
        assert refused.value.status == 400


def test_validation_accepts_normalized_and_refuses_others() -> None:
    validate_protocol_url_normalized("https://example.com/protocol")
    validate_schema_url_normalized("https://example.com/schema")
    with pytest.raises(DwnError) as refused:
        validate_protocol_url_normalized("https://example.com/protocol/")
    assert (refused.value.code, refused.value.status) == ("UrlProtocolNotNormalized", 400)
    with pytest.raises(DwnError) as refused:
        validate_schema_url_normalized("example.com/schema")
    assert (refused.value.code, refused.value.status) == ("UrlSchemaNotNormalized", 400)
    # Unparseable input is "not normalized", not "not normalizable", as in the reference.
    with pytest.raises(DwnError) as refused:
        validate_schema_url_normalized("")
    assert refused.value.code == "UrlSchemaNotNormalized"


@given(st.text())
def test_any_text_is_either_normalized_or_refused_with_a_dwn_error(url: str) -> None:
    try:
        normalized = normalize_protocol_url(url)
    except DwnError as refused:
        assert refused.code == "UrlProtocolNotNormalizable"
        return
    assert normalized.isascii()  # the WHATWG serializer percent-encodes everything else
    try:
        validate_protocol_url_normalized(url)
    except DwnError as refused:
        assert refused.code == "UrlProtocolNotNormalized"
        assert url != normalized


# fmt: off
DIFFERENTIAL_INPUTS = [
    # plain and prefixed
    "https://example.com", "https://example.com/", "https://example.com/path",
    "https://example.com/path/", "https://example.com/path//", "example.com",
    "example.com/path", "http://example.com", "HTTP://EXAMPLE.COM", "hTTp://a",
    "protocol", "my-protocol/v1", "localhost:3000", "localhost:3000/a",
    "example.com:8080/path", "git+ssh://git@github.com:org/repo.git",
    # ports
    "https://example.com:443", "http://example.com:80", "https://example.com:8443/",
    "https://example.com:0", "https://example.com:65535", "https://example.com:65536",
    "https://example.com:/", "ws://example.com:80/", "wss://example.com:443/x",
    "ftp://example.com:21/",
    # query and fragment
    "https://example.com?x=1", "https://example.com/a?x=1#frag", "https://example.com#",
    "https://example.com/?", "https://example.com/a?", "https://example.com/a#",
    "https://example.com/a/?#", "https://example.com/a/#x", "did:web:x?service=a#k",
    # paths
    "https://example.com/a/./b/../c", "http://a/b/c/../../../..", "http://a/%2e%2E/b",
    "http://a/.%2e/b", "https://example.com/%7Efoo", "https://example.com/~foo",
    "https://example.com/a b", "https://example.com/a%20b", "https://example.com/ä",
    "https://example.com/a;b=c", "https://example.com//", "https://example.com/\u0000",
    "http://example.com/ü?ü#ü", "https:\\\\example.com\\a\\b", "http://example.com\\a",
    "http://exa\tmple.com/a\nb", " https://example.com", "https://example.com ",
    "\thttps://example.com\n",
    # hosts
    "https://Example.COM/Path", "https://例え.jp", "https://xn--r8jz45g.jp",
    "https://EXAMPLE.com.", "https://xn--a.com", "https://ab--cd.com", "https://ß.de",
    "https://faß.de", "https://Ｅｘａｍｐｌｅ.com", "https://😀.com", "https://xn--ls8h.la",
    "https://ex ample.com", "https://exa%41mple.com", "https://ex%2fample.com",
    "https://%/", "https://a%25b", "https://exa\u0000mple.com", "https://a..b",
    "https://user:pass@example.com/p", "https://@example.com", "https://user@/",
    # IP addresses
    "https://127.0.0.1", "https://0x7f.1", "https://2130706433/", "https://[::1]",
    "https://[0:0:0:0:0:0:0:1]/x", "https://[::ffff:1.2.3.4]", "https://1.2.3.4.5",
    "https://999.1.1.1", "https://0300.0250.1.1", "http://[::1", "foo://[::1]/",
    "foo://[1::1:1]",
    # schemes and odd prefixes
    "https:example.com", "https:/example.com", "https:///example.com", "http:///",
    "http:", "http:/", "http://", "a:", "a:/", "a://", "a:///b", ":", "::", "",
    " ", "/", "//", "///", "//example.com", "/path", "?q", "#f", "c:\\windows",
    # non-special schemes
    "did:web:example.com", "did:example:123", "did:web:example.com%3A8443",
    "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK", "urn:uuid:6e8bc430-9c3a",
    "mailto:User@Example.com", "tag:example.com,2024:proto", "foo://Bar.COM/Baz/",
    "foo://bar.com", "foo:bar", "foo:bar/", "foo:/bar", "foo://", "foo://bar/%7e",
    "sc://ñ", "sc://%/", "non-special://host:0/", "foo:bar ?x", "foo:bar  #x",
    "javascript:alert(1)", "data:text/plain,hi", "blob:https://example.com/uuid",
    "file:///etc/passwd", "file://host/share/", "file:c:/x", "file://LOCALHOST/x",
    # real DWN values
    "https://identity.foundation/dwn/json-schemas/defs.json",
    "https://schema.org/SocialMediaPosting", "http://free-for-all-protocol.xyz",
    "https://areweweb5yet.com/protocols/social", "https://example.com/protocol/v1.0",
    # strings JS sees differently from Python
    "\ud800x.com", "https://example.com/\udfff", "\ud83d\ude00.com",
]
# fmt: on


@needs_reference
def test_differential_against_the_reference() -> None:
    answers = run_oracle("url", DIFFERENTIAL_INPUTS)
    assert len(DIFFERENTIAL_INPUTS) >= 100
    mismatches = []
    for url, answer in zip(DIFFERENTIAL_INPUTS, answers, strict=True):
        if _our_answer(url) != _their_answer(answer):
            mismatches.append((url, _our_answer(url), _their_answer(answer)))
    assert mismatches == []


_Answer = tuple[str | None, str | None, object, str, str]


def _their_answer(answer: dict[str, object]) -> _Answer:
    """The oracle's answer for one URL, in the shape of :func:`_our_answer`."""
    normalized, error = answer["normalized"], answer["normalizeError"]
    protocol_check, schema_check = answer["protocolCheck"], answer["schemaCheck"]
    assert normalized is None or isinstance(normalized, str)
    assert error is None or isinstance(error, str)
    assert isinstance(protocol_check, str) and isinstance(schema_check, str)
    return normalized, error, answer["schemaNormalized"], protocol_check, schema_check


def _our_answer(url: str) -> _Answer:
    normalized: str | None = None
    error: str | None = None
    try:
        normalized = normalize_protocol_url(url)
    except DwnError as refused:
        error = refused.code
    schema_normalized: object
    try:
        schema_normalized = normalize_schema_url(url)
    except DwnError as refused:
        schema_normalized = {"error": refused.code}
    return (
        normalized,
        error,
        schema_normalized,
        _check(validate_protocol_url_normalized, url),
        _check(validate_schema_url_normalized, url),
    )


def _check(validate: object, url: str) -> str:
    assert callable(validate)
    try:
        validate(url)
    except DwnError as refused:
        return refused.code
    return "ok"


# fmt: off
_SCHEMES = ["", "http://", "https://", "HTTPS://", "ws://", "wss://", "ftp://", "file://",
            "foo://", "did:web:", "did:key:", "a:", "http:/", "http:", "//", "sc:", "urn:x:"]
_HOSTS = ["example.com", "EXAMPLE.com", "例え.jp", "xn--a", "xn--r8jz45g.jp", "127.0.0.1",
          "[::1]", "[::ffff:1.2.3.4]", "0x7f.1", "4294967296", "a b", "%41", "", "ß.de",
          "user@host", "u:p@host", "host:8080", "host:443", "host:80", "host:", "h.",
          "a\u00adb", "a\u200db", "-a-", "a..b", "😀", "\u0000", "ＡＢＣ", "localhost"]
_PATHS = ["", "/", "/a", "/a/", "//", "/./", "/../", "/%2e", "/%2E%2e/", "/ä", "/a b",
          "\\a", "/a/b/../c", "/~x", "/%7e", "/a;b", "/\t/", "/a//"]
_TAILS = ["", "?", "?x", "#", "#f", " ", "?x#f", " ?x", "  #y", "/", "\n", " "]
# fmt: on


def _random_urls(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        rng.choice(_SCHEMES) + rng.choice(_HOSTS) + rng.choice(_PATHS) + rng.choice(_TAILS)
        for _ in range(count)
    ]


@needs_reference
def test_random_differential_against_the_reference() -> None:
    urls = _random_urls(3000, seed=20240501)
    answers = run_oracle("url", urls)
    mismatches = []
    for url, answer in zip(urls, answers, strict=True):
        if _our_answer(url) != _their_answer(answer):
            mismatches.append((url, _our_answer(url), _their_answer(answer)))
    assert mismatches == []
