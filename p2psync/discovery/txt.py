"""The DNS-SD TXT record of a p2psync node (``protocol/discovery.md``), as bytes in and out.

Sans-I/O: :func:`encode_txt` turns what a node publishes into the TXT RDATA, :func:`decode_txt`
turns a received RDATA into a :class:`TxtRecord` or raises :class:`DiscoveryError` (code
``TxtInvalid``); nothing here touches a socket, a clock or zeroconf.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from p2psync.blip.tls import FINGERPRINT_RE

__all__ = [
    "HASHES_PER_STRING",
    "MAX_TXT_BYTES",
    "MAX_TXT_STRING",
    "SALT_BYTES",
    "TENANT_HASH_BYTES",
    "TXT_VERSION",
    "DiscoveryError",
    "TxtRecord",
    "decode_txt",
    "encode_txt",
    "tenant_hash",
]

#: The TXT format version, published as ``txtvers`` (RFC 6763 §6.7 suggests this key, first).
TXT_VERSION: Final = 1
#: One TXT string is a length byte and at most 255 bytes of ``key=value`` (RFC 6763 §6.1).
MAX_TXT_STRING: Final = 255
#: The whole TXT RDATA we publish or accept. RFC 6763 §6.2: above 1300 bytes a record no longer
#: fits one Ethernet frame with the other records of an answer, and Wi-Fi multicast loses fragments.
MAX_TXT_BYTES: Final = 1300
#: Private mode: a fresh random salt per advert, and the first bytes of sha256(salt ‖ tenant DID).
#: 16 salt bytes make a salt repeat between adverts negligible; 8 hash bytes give a false match
#: about once in 2**64 checks, which is what membership needs (the hello proves the rest).
SALT_BYTES: Final = 16
TENANT_HASH_BYTES: Final = 8
#: Hashes packed into one ``h<N>`` string: 15 x 16 hex digits + ``h<N>=`` fits 255 bytes.
HASHES_PER_STRING: Final = 15
#: A store id: UUIDs in practice; letters, digits and ``._:-`` up to 64 characters in the spec.
MAX_SID_CHARS: Final = 64
#: Capability tokens: short lowercase words (``pull``, ``push``, ``continuous``).
_CAPABILITY = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_SID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_SID_CHARS}}}")
#: DID syntax (W3C DID Core §3.1): ``did:<method>:<method-specific-id>``, idchars and ``%``-escapes.
_DID = re.compile(r"did:[a-z0-9]+:[A-Za-z0-9._%:-]*[A-Za-z0-9._%-]")
_HEX_HASH_CHARS: Final = 2 * TENANT_HASH_BYTES
#: Keys are at most nine characters (RFC 6763 §6.4), so ``t``/``h`` indices have at most 8 digits.
_INDEXED = re.compile(r"([th])(0|[1-9][0-9]{0,7})")



class DiscoveryError(Exception):
    """Discovery refused or failed: ``code`` names what (``AdvertInvalid``, ``AdvertTooLarge``,
    ``TxtInvalid``, ``BindFailed``, ``RegisterFailed``, ``AlreadyRunning``, ``NotRunning``, ``NoAddress``),
    ``detail`` says why."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{code}: {detail}")


@dataclass(frozen=True)
class TxtRecord:
    """What a TXT record says. ``tenants`` are DIDs, or hex hashes when ``salt`` is set."""

    did: str
    sid: str
    version: str
    capabilities: tuple[str, ...]
    tenants: tuple[str, ...]
    salt: str | None = None
    fingerprint: str | None = None

    @property
    def hashed(self) -> bool:
        return self.salt is not None


def tenant_hash(salt: str, tenant: str) -> str:
    """Private mode's membership token: hex of the first 8 bytes of sha256(salt bytes ‖ UTF-8 DID).

    ``salt`` is the advert's ``salt`` value (hex).
    """
    digest = hashlib.sha256(bytes.fromhex(salt) + tenant.encode("utf-8")).digest()
    return digest[:TENANT_HASH_BYTES].hex()


def _check_did(what: str, did: str) -> None:
    if not _DID.fullmatch(did):
        raise DiscoveryError("AdvertInvalid", f"{what} is not a DID: {did!r}")


def _string(key: str, value: str) -> bytes:
    raw = f"{key}={value}".encode()
    if len(raw) > MAX_TXT_STRING:
        raise DiscoveryError(
            "AdvertTooLarge",
            f"TXT string {key}= is {len(raw)} bytes; a TXT string holds at most {MAX_TXT_STRING} (RFC 6763 §6.1)",
        )
    return raw


def encode_txt(
    *,
    did: str,
    sid: str,
    version: int | str,
    capabilities: Sequence[str],
    tenants: Iterable[str],
    salt: str | None = None,
    fingerprint: str | None = None,
) -> bytes:
    """The TXT RDATA for an advert: length-prefixed ``key=value`` strings in the spec's order.

    With ``salt`` (hex of :data:`SALT_BYTES` bytes) tenants are published as hashes, otherwise in
    clear; ``fingerprint`` is the TLS certificate's (a ``wss://`` node). Raises
    ``DiscoveryError("AdvertInvalid")`` for a value the format cannot carry and
    ``DiscoveryError("AdvertTooLarge")`` past :data:`MAX_TXT_BYTES`.
    """
    _check_did("did", did)
    if not _SID.fullmatch(sid):
        raise DiscoveryError("AdvertInvalid", f"sid must be 1-{MAX_SID_CHARS} of [A-Za-z0-9._:-]: {sid!r}")
    if not str(version).isdigit():
        raise DiscoveryError("AdvertInvalid", f"version must be an unsigned integer: {version!r}")
    for cap in capabilities:
        if not _CAPABILITY.fullmatch(cap):
            raise DiscoveryError("AdvertInvalid", f"capability {cap!r} is not a short lowercase word")
    unique = list(dict.fromkeys(tenants))  # keep the caller's order, drop repeats
    for tenant in unique:
        _check_did("tenant", tenant)
    strings = [
        _string("txtvers", str(TXT_VERSION)),
        _string("pv", str(version)),
        _string("did", did),
        _string("sid", sid),
        _string("caps", ",".join(capabilities)),
    ]
    if fingerprint is not None:
        if not FINGERPRINT_RE.fullmatch(fingerprint):
            raise DiscoveryError("AdvertInvalid", f"fingerprint must be 43 base64url characters: {fingerprint!r}")
        strings.append(_string("tls", fingerprint))
    if salt is None:
        strings += [_string(f"t{i}", tenant) for i, tenant in enumerate(unique)]
    else:
        if len(salt) != 2 * SALT_BYTES or not _is_hex(salt):
            raise DiscoveryError("AdvertInvalid", f"salt must be {2 * SALT_BYTES} lowercase hex digits")
        hashes = [tenant_hash(salt, tenant) for tenant in unique]
        strings.append(_string("salt", salt))
        for i in range(0, len(hashes), HASHES_PER_STRING):
            strings.append(_string(f"h{i // HASHES_PER_STRING}", "".join(hashes[i : i + HASHES_PER_STRING])))
    rdata = b"".join(bytes([len(s)]) + s for s in strings)
    if len(rdata) > MAX_TXT_BYTES:
        per = "16 bytes a tenant" if salt is not None else "its DID's length + 4 bytes a tenant"
        raise DiscoveryError(
            "AdvertTooLarge",
            f"{len(unique)} tenants make a {len(rdata)}-byte TXT record, more than the {MAX_TXT_BYTES} bytes "
            f"DNS-SD recommends (RFC 6763 §6.2; {per}); advertise fewer tenants"
            + ("" if salt is not None else " or use private mode (16 bytes a tenant)"),
        )
    return rdata


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def split_strings(rdata: bytes) -> list[bytes]:
    """The character-strings of a TXT RDATA (RFC 1035 §3.3.14); raises ``TxtInvalid`` if truncated."""
    out: list[bytes] = []
    i = 0
    while i < len(rdata):
        size = rdata[i]
        end = i + 1 + size
        if end > len(rdata):
            raise DiscoveryError("TxtInvalid", "a TXT string runs past the end of the record")
        out.append(rdata[i + 1 : end])
        i = end
    return out


def decode_txt(rdata: bytes) -> TxtRecord:
    """Read a p2psync TXT record; ``DiscoveryError("TxtInvalid")`` when it is not one we can use.

    Keys are case-insensitive and the first occurrence of a key wins (RFC 6763 §6.4); unknown keys
    and strings without ``=`` are ignored, so later versions may add keys.
    """
    if len(rdata) > MAX_TXT_BYTES * 8:  # far past anything we publish; do not parse megabytes
        raise DiscoveryError("TxtInvalid", f"TXT record of {len(rdata)} bytes")
    pairs: dict[str, str] = {}
    for raw in split_strings(rdata):
        key_raw, eq, value_raw = raw.partition(b"=")
        if not eq or not key_raw:
            continue
        try:
            key, value = key_raw.decode("ascii").lower(), value_raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DiscoveryError("TxtInvalid", "a TXT key is not ASCII or a value is not UTF-8") from None
        pairs.setdefault(key, value)
    if pairs.get("txtvers") != str(TXT_VERSION):
        raise DiscoveryError("TxtInvalid", f"txtvers {pairs.get('txtvers')!r} is not {TXT_VERSION}")
    missing = [k for k in ("pv", "did", "sid", "caps") if k not in pairs]
    if missing:
        raise DiscoveryError("TxtInvalid", f"missing {', '.join(missing)}")
    did, sid, version = pairs["did"], pairs["sid"], pairs["pv"]
    try:
        _check_did("did", did)
    except DiscoveryError as exc:
        raise DiscoveryError("TxtInvalid", exc.detail) from None
    if not _SID.fullmatch(sid):
        raise DiscoveryError("TxtInvalid", f"sid {sid!r}")
    if not version.isascii() or not version.isdigit():
        raise DiscoveryError("TxtInvalid", f"pv {version!r}")
    capabilities = tuple(c for c in pairs["caps"].split(",") if c)
    if not all(_CAPABILITY.fullmatch(c) for c in capabilities):
        raise DiscoveryError("TxtInvalid", f"caps {pairs['caps']!r}")
    fingerprint = pairs.get("tls")
    if fingerprint is not None and not FINGERPRINT_RE.fullmatch(fingerprint):
        raise DiscoveryError("TxtInvalid", f"tls {fingerprint!r} is not a certificate fingerprint")
    clear = _indexed(pairs, "t")
    hashed = _indexed(pairs, "h")
    salt = pairs.get("salt")
    if salt is None:
        if hashed:
            raise DiscoveryError("TxtInvalid", "h<N> keys without a salt")
        for tenant in clear:
            try:
                _check_did("tenant", tenant)
            except DiscoveryError as exc:
                raise DiscoveryError("TxtInvalid", exc.detail) from None
        return TxtRecord(did, sid, version, capabilities, tuple(clear), fingerprint=fingerprint)
    if clear:
        raise DiscoveryError("TxtInvalid", "both t<N> and salt: a record is either clear or private")
    if len(salt) != 2 * SALT_BYTES or not _is_hex(salt):
        raise DiscoveryError("TxtInvalid", f"salt {salt!r}")
    hashes: list[str] = []
    for packed in hashed:
        if not packed or len(packed) % _HEX_HASH_CHARS or not _is_hex(packed):
            raise DiscoveryError("TxtInvalid", "an h<N> value is not a run of 16-hex-digit hashes")
        hashes += [packed[i : i + _HEX_HASH_CHARS] for i in range(0, len(packed), _HEX_HASH_CHARS)]
    return TxtRecord(did, sid, version, capabilities, tuple(hashes), salt, fingerprint)


def _indexed(pairs: dict[str, str], letter: str) -> list[str]:
    """Values of ``<letter>0``, ``<letter>1``, ... which must be consecutive from 0."""
    found: dict[int, str] = {}
    for key, value in pairs.items():
        match = _INDEXED.fullmatch(key)
        if match is not None and match.group(1) == letter:
            found[int(match.group(2))] = value
    if sorted(found) != list(range(len(found))):
        raise DiscoveryError("TxtInvalid", f"{letter}<N> keys are not numbered 0, 1, 2, ... without gaps")
    return [found[i] for i in range(len(found))]
