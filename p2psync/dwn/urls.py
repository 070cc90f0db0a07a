"""Normalization of protocol and schema URLs, with the reference DWN's results.

dwn-sdk-js 0.5.2 (``src/utils/url.ts``) normalizes a URL like this:

1. if the string does not look like ``scheme:`` followed by something other than a slash
   (optionally after ``//``), it is prefixed with ``http://`` — so ``example.com/p`` becomes
   ``http://example.com/p`` while ``did:web:x`` and ``https://x`` are left alone;
2. the result is parsed with the WHATWG ``URL`` class (lower-cases and IDNA-encodes special
   hosts, drops default ports, resolves ``.``/``..`` segments, percent-encodes, ...);
3. the query and the fragment are removed;
4. one trailing ``/`` of the serialization is removed (``https://x/`` -> ``https://x``).

A message must carry the normalized form: ``validate_*_url_normalized`` refuses anything
else with ``UrlProtocolNotNormalized`` / ``UrlSchemaNotNormalized`` (400).

Step 2 needs a complete WHATWG URL parser. Node 20 implements ``URL`` with the Ada library
(2.9.2), so we use Ada's Python binding for that step, pinned to the release that bundles
the same Ada (``ada-url==1.15.3``; later Ada versions follow later URL-standard changes,
e.g. about punycode labels and spaces before a removed query), and do the rest ourselves.
"""

from __future__ import annotations

import functools
import re
from typing import Final

from ada_url import URL

from p2psync.dwn.errors import DwnError

#: Code for a URL the WHATWG parser refuses, even after ``http://`` prefixing. The
#: reference raises it from both normalizers (it has no schema-specific variant).
URL_NOT_NORMALIZABLE: Final = "UrlProtocolNotNormalizable"
#: Code for a ``protocol`` that is not in normalized form.
URL_PROTOCOL_NOT_NORMALIZED: Final = "UrlProtocolNotNormalized"
#: Code for a ``schema`` that is not in normalized form.
URL_SCHEMA_NOT_NORMALIZED: Final = "UrlSchemaNotNormalized"

# "Already has a scheme": something without ':' , a ':', an optional '//', then a character
# that is not '/'. Only a prefix match is needed; the reference's trailing `.*` can match
# nothing, so it adds no condition.
_HAS_SCHEME: Final = re.compile(r"[^:]+:(?://)?[^/]")


def _as_js_string(value: str) -> str:
    """Return ``value`` as the ``URL`` constructor sees it after USVString conversion.

    A JS string is UTF-16: a surrogate pair is one character and a lone surrogate becomes
    U+FFFD. Python strings may hold either (from ``json.loads`` of ``"\\ud800"``), and Ada
    needs valid UTF-8, so map them the same way first.
    """
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "replace")
    return value


def _normalize(url: str) -> str:
    full_url = url if _HAS_SCHEME.match(url) else f"http://{url}"
    try:
        parsed = URL(_as_js_string(full_url))
        # Setting both to '' removes the '?' and '#' entirely, as the reference does.
        parsed.search = ""
        parsed.hash = ""
        href = parsed.href
    except ValueError:
        raise DwnError(URL_NOT_NORMALIZABLE, "Could not normalize protocol URI") from None
    return href[:-1] if href.endswith("/") else href


def normalize_protocol_url(url: str) -> str:
    """Return the normalized form of a protocol URL.

    Raises ``DwnError(UrlProtocolNotNormalizable)`` when the URL cannot be parsed.
    """
    return _normalize(url)


def normalize_schema_url(url: str) -> str:
    """Return the normalized form of a schema URL (the same rule as for protocols).

    Raises ``DwnError(UrlProtocolNotNormalizable)`` — the reference's code — when the URL
    cannot be parsed.
    """
    return _normalize(url)


@functools.lru_cache(maxsize=4096)
def _is_normalized(url: str) -> bool:
    # Pure in its string argument, and the same few protocol and schema URLs recur in every
    # message of a protocol: a parse costs ~7 us here, a cache hit ~0.1 us.
    try:
        return _normalize(url) == url
    except DwnError:
        return False


def validate_protocol_url_normalized(url: str) -> None:
    """Refuse a protocol URL that differs from its normalized form (400)."""
    if not _is_normalized(url):
        raise DwnError(URL_PROTOCOL_NOT_NORMALIZED, f"Protocol URI {url} must be normalized.")


def validate_schema_url_normalized(url: str) -> None:
    """Refuse a schema URL that differs from its normalized form (400)."""
    if not _is_normalized(url):
        raise DwnError(URL_SCHEMA_NOT_NORMALIZED, f"Schema URI {url} must be normalized.")
