"""A node's configuration: a TOML file, ``P2PSYNC_*`` environment variables and command-line
flags, in that order of increasing precedence, over built-in defaults (docs/operator.md).

Every setting has one *key* (``listen.port``), one environment variable (``P2PSYNC_PORT``)
and, for the common ones, one flag (``--port``). Each layer is parsed and checked on its own,
so an error names the layer and the key (``node.toml: listen.port: ...``,
``P2PSYNC_PORT: ...``, ``--port: ...``); an unknown key in the file is an error too (a typo
must not be silently ignored). A list given by a higher layer replaces the lower one's (no
merging: what you see in the highest layer is what runs).
"""

from __future__ import annotations

import enum
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from websockets.uri import parse_uri

from p2psync.blip.tls import FINGERPRINT_RE
from p2psync.dwn.errors import DwnError
from p2psync.peer.endpoint import is_loopback, plain_ws_refused
from p2psync.replication.scope import SyncScope
from p2psync.state.quota import (
    DEFAULT_PEER_BYTES,
    DEFAULT_PEER_MESSAGES,
    DEFAULT_PEER_WINDOW,
    Limit,
    QuotaPolicy,
)

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_ANTI_ENTROPY_INTERVAL",
    "DEFAULT_ANTI_ENTROPY_JITTER",
    "DEFAULT_ANTI_ENTROPY_MAX_INTERVAL",
    "DEFAULT_HOST",
    "DEFAULT_METRICS_HOST",
    "DEFAULT_PORT",
    "ENV_VARS",
    "INHERIT",
    "LOG_LEVELS",
    "MIN_ANTI_ENTROPY_INTERVAL",
    "ConfigError",
    "NodeConfig",
    "StaticPeer",
    "TenantConfig",
    "is_loopback",
    "load_config",
]

#: Loopback by default: serving a tenant's data to the network is a choice the user makes.
DEFAULT_HOST: Final = "127.0.0.1"
#: Couchbase Sync Gateway's public port, the home of the replication protocol we follow (and
#: the port of the BLIP examples in docs/blip.md); ``blip echo`` uses 4985 beside it.
DEFAULT_PORT: Final = 4984
#: Metrics are for the operator on this machine unless they choose otherwise.
DEFAULT_METRICS_HOST: Final = "127.0.0.1"
#: The environment variable naming the configuration file (``--config`` wins over it).
CONFIG_ENV: Final = "P2PSYNC_CONFIG"
#: Log levels the ``log_level`` key takes (Python's, lower case).
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
#: DNS-SD instance names are at most 63 octets of UTF-8 (RFC 6763 §4.1.1).
MAX_NAME_OCTETS: Final = 63
#: The periodic anti-entropy check of each link (p2psync/node/anti_entropy.py): the causal
#: scoped replication RFC asks for one "every 30-60 s, with backoff once converged"; 45 s with
#: a third of jitter either way is that range. Equal replicas double the interval up to 10
#: minutes: a converged pair costs one small exchange then, and a difference found (or a link
#: reconnecting) brings it back to the base at once.
DEFAULT_ANTI_ENTROPY_INTERVAL: Final = 45.0
DEFAULT_ANTI_ENTROPY_JITTER: Final = 1 / 3
DEFAULT_ANTI_ENTROPY_MAX_INTERVAL: Final = 600.0
#: Below this an anti-entropy check would mostly repeat the last one and load the peer with
#: connections; a configured interval must be at least this (seconds).
MIN_ANTI_ENTROPY_INTERVAL: Final = 1.0
#: How a quota setting says "no bound" (p2psync/state/quota.py; 0 means nothing at all).
UNLIMITED_TEXT: Final = "unlimited"
#: Units a size may be written in (``"512 MiB"``, ``"10 GB"``): SI and binary multiples.
SIZE_UNITS: Final = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
                     "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

Direction = Literal["pull", "push", "both"]
DIRECTIONS: Final = ("pull", "push", "both")


class ConfigError(Exception):
    """A configuration value is wrong: ``where`` (the file, ``environment`` or ``command line``),
    ``key`` (as that layer spells it) and what is wrong. ``str()`` is the one line to print."""

    code: Final = "ConfigInvalid"

    def __init__(self, where: str, key: str, detail: str) -> None:
        self.where = where
        self.key = key
        self.detail = detail
        super().__init__(f"{where}: {key}: {detail}" if key else f"{where}: {detail}")


# --------------------------------------------------------------------------- the settings


class _Inherit(enum.Enum):
    INHERIT = "inherit"


#: A tenant's quota setting that is not given: the ``quota.tenant_*`` default applies.
INHERIT: Final = _Inherit.INHERIT
Amount = int | None  # a quota: a number, or None for no bound


@dataclass(frozen=True)
class TenantConfig:
    """One tenant the node syncs: its DID (None: the node's own), direction and scopes, and
    its own storage quota (:data:`INHERIT`: the ``quota.tenant_*`` default; None: no bound)."""

    did: str | None = None
    direction: Direction = "both"
    scopes: tuple[SyncScope, ...] = field(default_factory=lambda: (SyncScope.global_scope(),))
    quota_messages: Amount | Literal[_Inherit.INHERIT] = INHERIT
    quota_bytes: Amount | Literal[_Inherit.INHERIT] = INHERIT


@dataclass(frozen=True)
class StaticPeer:
    """A peer the node always dials: its ``wss://`` (or ``ws://``) URL, the tenants to sync with
    it (None: every configured tenant) and the fingerprint its TLS certificate must have (None:
    any; the hello proof still binds the connection)."""

    url: str
    tenants: tuple[str, ...] | None = None
    pin: str | None = None


@dataclass(frozen=True)
class NodeConfig:
    """Everything ``p2psync serve`` runs with (see docs/operator.md for each key)."""

    data_dir: Path | None = None  # None: $P2PSYNC_HOME or the platform's user data directory
    store: Path | None = None  # None: <data_dir>/store.db
    name: str | None = None  # advertised instance name; None: the host name
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tls: bool | None = None  # None: TLS unless the node listens on loopback only
    insecure: bool = False  # allow plain ws:// beyond loopback (serving and dialing)
    discovery: bool | None = None  # None: on unless the node listens on loopback only
    interfaces: tuple[str, ...] | None = None  # None: the listen address (all when 0.0.0.0)
    private: bool = False
    auto: bool = False
    metrics_port: int | None = None  # None: no metrics endpoint
    metrics_host: str = DEFAULT_METRICS_HOST
    log_level: str = "warning"
    tenants: tuple[TenantConfig, ...] = ()  # empty: the node's own DID, globally, both ways
    peers: tuple[StaticPeer, ...] = ()
    anti_entropy: bool = True  # a periodic check per link (p2psync/node/anti_entropy.py)
    anti_entropy_interval: float = DEFAULT_ANTI_ENTROPY_INTERVAL  # seconds, the base interval
    anti_entropy_jitter: float = DEFAULT_ANTI_ENTROPY_JITTER  # a fraction of the interval, either way
    anti_entropy_max_interval: float = DEFAULT_ANTI_ENTROPY_MAX_INTERVAL  # seconds, while equal
    # What replication may store (p2psync/state/quota.py; None: no bound). Each stored tenant,
    # unless its [[tenant]] says otherwise: unbounded, since the node stores only tenants its
    # operator named and a guessed cap would stop a real one mid-way. A pushing peer that may
    # not read the tenant: a budget per window.
    quota_tenant_messages: Amount = None
    quota_tenant_bytes: Amount = None
    quota_peer_messages: Amount = DEFAULT_PEER_MESSAGES
    quota_peer_bytes: Amount = DEFAULT_PEER_BYTES
    quota_peer_window: float = DEFAULT_PEER_WINDOW  # seconds

    def check(self) -> None:
        """Checks between settings (each one is checked on its own as it is parsed); raises
        :class:`ConfigError` naming the key."""
        if not self.tls_enabled and not is_loopback(self.host) and not self.insecure:
            raise ConfigError("configuration", "listen.tls",
                              f"plain ws:// on {self.host} would let anyone on the network read the sync; "
                              "leave TLS on, or set listen.insecure (--insecure) to allow it")
        for i, peer in enumerate(self.peers):
            refused = plain_ws_refused(peer.url)
            if refused is not None and not self.insecure:
                raise ConfigError("configuration", f"peer[{i}].url", refused)
            if peer.pin is not None and not peer.url.startswith("wss://"):
                raise ConfigError("configuration", f"peer[{i}].pin", "a certificate pin needs a wss:// URL")
        if self.anti_entropy_max_interval < self.anti_entropy_interval:
            raise ConfigError("configuration", "anti_entropy.max_interval",
                              f"must be at least anti_entropy.interval ({self.anti_entropy_interval:g}), "
                              f"not {self.anti_entropy_max_interval:g}")

    def quota_policy(self, tenants: tuple[TenantConfig, ...]) -> QuotaPolicy:
        """The store's quotas for ``tenants`` (as :meth:`tenants_for` resolves them)."""
        default = Limit(self.quota_tenant_messages, self.quota_tenant_bytes)
        own = {
            t.did: Limit(default.messages if t.quota_messages is INHERIT else t.quota_messages,
                         default.bytes if t.quota_bytes is INHERIT else t.quota_bytes)
            for t in tenants
            if t.did is not None and (t.quota_messages is not INHERIT or t.quota_bytes is not INHERIT)
        }
        return QuotaPolicy(tenant=default, tenants=own, peer=Limit(self.quota_peer_messages, self.quota_peer_bytes),
                           window=self.quota_peer_window)

    @property
    def tls_enabled(self) -> bool:
        """TLS as configured, else on unless listening on loopback (where nobody else reads)."""
        return self.tls if self.tls is not None else not is_loopback(self.host)

    @property
    def discovery_enabled(self) -> bool:
        """Discovery as configured, else on unless listening on loopback: advertising an address
        nobody else can reach would only mislead peers (and keeps plain ``serve`` as quiet as
        it always was)."""
        return self.discovery if self.discovery is not None else not is_loopback(self.host)

    def discovery_interfaces(self) -> list[str] | None:
        """Addresses zeroconf binds to: configured ones, else the listen address (None: all)."""
        if self.interfaces is not None:
            return list(self.interfaces)
        if self.host in ("0.0.0.0", "::", ""):
            return None
        return [self.host]

    def tenants_for(self, own_did: str) -> tuple[TenantConfig, ...]:
        """The tenants with DIDs filled in (the node's own for ``did`` None, and for an empty
        list); raises :class:`ConfigError` for a static peer naming a tenant not synced."""
        tenants = self.tenants or (TenantConfig(),)
        resolved = tuple(replace(t, did=t.did or own_did) for t in tenants)
        seen: set[str] = set()
        for tenant in resolved:
            assert tenant.did is not None
            if tenant.did in seen:
                raise ConfigError("configuration", "tenant", f"{tenant.did} is listed twice")
            seen.add(tenant.did)
        for i, peer in enumerate(self.peers):
            for did in peer.tenants or ():
                if did not in seen:
                    raise ConfigError("configuration", f"peer[{i}].tenants",
                                      f"{did} is not one of the node's tenants")
        return resolved


# --------------------------------------------------------------------------- value parsers
#
# Each takes the raw value (a TOML value, or text from the environment or a flag) and returns
# the setting or raises ValueError with what is wrong; the caller adds where and which key.


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, not {value!r}")
    return value.strip()


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    raise ValueError(f"must be true or false, not {value!r}")


def _port(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if type(value) is not int or not 0 <= value <= 65535:
        raise ValueError(f"must be a TCP port 0-65535 (0: any free port), not {value!r}")
    return value


def _host(value: Any) -> str:
    text = _text(value)
    if any(c.isspace() for c in text) or "/" in text:
        raise ValueError(f"must be an IP address or a host name, not {value!r}")
    return text.strip("[]")


def _address(value: Any) -> str:
    text = _text(value)
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"must be an IP address, not {value!r}") from None


def _name(value: Any) -> str:
    text = _text(value)
    if len(text.encode()) > MAX_NAME_OCTETS:
        raise ValueError(f"must be at most {MAX_NAME_OCTETS} bytes (a DNS-SD instance name)")
    if any(ord(c) < 0x20 or c in ".\x7f" for c in text):
        # p2psync.discovery refuses these too: tools split service names on dots.
        raise ValueError(f"must not contain a dot or a control character, not {value!r}")
    return text


def _level(value: Any) -> str:
    text = _text(value).lower()
    if text not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}, not {value!r}")
    return text


def _did(value: Any) -> str:
    text = _text(value)
    if not text.startswith("did:"):
        raise ValueError(f"{value!r} is not a DID")
    return text


def _url(value: Any) -> str:
    text = _text(value)
    try:
        uri = parse_uri(text)
    except Exception as exc:  # InvalidURI, or ValueError for a bad port
        raise ValueError(f"{text} is not a wss:// or ws:// URL ({exc})") from None
    del uri
    return text


def _fingerprint(value: Any) -> str:
    text = _text(value)
    if not FINGERPRINT_RE.fullmatch(text):
        raise ValueError(f"{text!r} is not a certificate fingerprint (43 base64url characters, "
                         "as `p2psync tls show` prints)")
    return text


def _number(value: Any) -> float:
    """An int or float (TOML's), or decimal text (environment, flags)."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"must be a number, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"must be a number, not {value!r}")
    return float(value)


def _interval(value: Any) -> float:
    seconds = _number(value)
    if seconds < MIN_ANTI_ENTROPY_INTERVAL:
        raise ValueError(f"must be at least {MIN_ANTI_ENTROPY_INTERVAL:g} second(s), not {value!r}")
    return seconds


def _jitter(value: Any) -> float:
    fraction = _number(value)
    if not 0 <= fraction < 1:
        raise ValueError(f"must be a fraction from 0 to below 1 (0.33: a third either way), not {value!r}")
    return fraction


def _messages(value: Any) -> Amount:
    """A number of messages (0 or more), or ``"unlimited"`` (None)."""
    if isinstance(value, str):
        text = value.strip().lower().replace("_", "")
        if text == UNLIMITED_TEXT:
            return None
        if text.isdigit():
            value = int(text)
    if type(value) is not int or value < 0:
        raise ValueError(f'must be a whole number of messages (0 or more) or "{UNLIMITED_TEXT}", not {value!r}')
    return value


def _bytes(value: Any) -> Amount:
    """A size in bytes: an integer, text with a unit (``"512 MiB"``, ``"10 GB"``), or
    ``"unlimited"`` (None)."""
    if isinstance(value, str):
        text = value.strip().lower().replace("_", "")
        if text == UNLIMITED_TEXT:
            return None
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text)
        if match is None or match.group(2) not in SIZE_UNITS:
            raise ValueError(f'must be a size in bytes (1000000, "512 MiB", "10 GB") or "{UNLIMITED_TEXT}", '
                             f"not {value!r}")
        value = int(float(match.group(1)) * SIZE_UNITS[match.group(2)])
    if type(value) is not int or value < 0:
        raise ValueError(f'must be a size in bytes (1000000, "512 MiB", "10 GB") or "{UNLIMITED_TEXT}", not {value!r}')
    return value


def _window(value: Any) -> float:
    seconds = _number(value)
    if seconds < 1:
        raise ValueError(f"must be at least 1 second, not {value!r}")
    return seconds


def _list(item: Callable[[Any], Any]) -> Callable[[Any], tuple[Any, ...]]:
    """A list of ``item``: a TOML array, or comma/space-separated text (environment, flags)."""

    def parse(value: Any) -> tuple[Any, ...]:
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, list | tuple):
            raise ValueError(f"must be a list, not {value!r}")
        return tuple(item(v) for v in value)

    return parse


def _path(value: Any) -> Path:
    return Path(_text(value)).expanduser()


def _direction(value: Any) -> Direction:
    text = _text(value)
    if text not in DIRECTIONS:
        raise ValueError(f"must be pull, push or both, not {value!r}")
    return text  # type: ignore[return-value]  # checked just above


#: A scope table's keys, and the wire (camelCase) spelling someone may copy from
#: protocol/replication-state.md, named in the refusal.
_SCOPE_KEYS: Final = {"protocol": "protocol", "protocol_path_prefixes": "protocolPathPrefixes",
                      "context_id_prefixes": "contextIdPrefixes"}


def _scope(value: Any) -> SyncScope:
    """``"global"``, a protocol URL, or ``{protocol, protocol_path_prefixes, context_id_prefixes}``
    (docs/scopes.md), canonicalized: a table without prefixes is the protocol scope."""
    try:
        if value == "global":
            return SyncScope.global_scope()
        if isinstance(value, str):
            return SyncScope.for_protocol(_text(value))
        if isinstance(value, dict):
            extra = sorted(set(value) - set(_SCOPE_KEYS))
            if extra:
                wire = {v: k for k, v in _SCOPE_KEYS.items()}
                hint = f" (write {wire[extra[0]]})" if extra[0] in wire else ""
                raise ValueError(f"unknown key {extra[0]!r} in a scope{hint}")
            if "protocol" not in value:
                raise ValueError("a scope table needs protocol (prefixes select part of one protocol)")
            paths = _list(_text)(value.get("protocol_path_prefixes", []))
            contexts = _list(_text)(value.get("context_id_prefixes", []))
            return SyncScope.subset(_text(value["protocol"]), paths, contexts)
    except DwnError as exc:
        raise ValueError(f"{exc.code}: {exc.detail}" if exc.detail else str(exc)) from None
    raise ValueError(f"a scope is \"global\", a protocol URL or a table with protocol, not {value!r}")


def _scopes(where: str, key: str, value: Any) -> tuple[SyncScope, ...]:
    """A tenant's ``scopes``: a refusal names the entry (``tenant[0].scopes[1]``)."""
    if isinstance(value, str):  # as every list setting: comma/space-separated text
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, list):
        raise ConfigError(where, key, f"must be a list, not {value!r}")
    scopes = tuple(_check(where, f"{key}[{j}]", _scope, v) for j, v in enumerate(value))
    if not scopes:
        raise ConfigError(where, key, "must name at least one scope")
    seen: dict[str, int] = {}
    for j, scope in enumerate(scopes):
        if scope.scope_id in seen:
            raise ConfigError(where, f"{key}[{j}]", f"the same scope as {key}[{seen[scope.scope_id]}] "
                              f"(scopeId {scope.scope_id})")
        seen[scope.scope_id] = j
    return scopes


# --------------------------------------------------------------------------- the keys


@dataclass(frozen=True)
class _Key:
    field: str  # NodeConfig attribute
    parse: Callable[[Any], Any]
    env: str | None  # environment variable, if any


#: Scalar and list keys by their dotted name in the file (tables ``tenant`` and ``peer`` aside).
KEYS: Final[dict[str, _Key]] = {
    "data_dir": _Key("data_dir", _path, "P2PSYNC_HOME"),
    "store": _Key("store", _path, "P2PSYNC_STORE"),
    "name": _Key("name", _name, "P2PSYNC_NAME"),
    "log_level": _Key("log_level", _level, "P2PSYNC_LOG_LEVEL"),
    "listen.host": _Key("host", _host, "P2PSYNC_HOST"),
    "listen.port": _Key("port", _port, "P2PSYNC_PORT"),
    "listen.tls": _Key("tls", _bool, "P2PSYNC_TLS"),
    "listen.insecure": _Key("insecure", _bool, "P2PSYNC_INSECURE"),
    "discovery.enabled": _Key("discovery", _bool, "P2PSYNC_DISCOVERY"),
    "discovery.interfaces": _Key("interfaces", _list(_address), "P2PSYNC_INTERFACES"),
    "discovery.private": _Key("private", _bool, "P2PSYNC_PRIVATE"),
    "discovery.auto": _Key("auto", _bool, "P2PSYNC_AUTO"),
    "metrics.port": _Key("metrics_port", _port, "P2PSYNC_METRICS_PORT"),
    "metrics.host": _Key("metrics_host", _host, "P2PSYNC_METRICS_HOST"),
    "anti_entropy.enabled": _Key("anti_entropy", _bool, "P2PSYNC_ANTI_ENTROPY"),
    "anti_entropy.interval": _Key("anti_entropy_interval", _interval, "P2PSYNC_ANTI_ENTROPY_INTERVAL"),
    "anti_entropy.jitter": _Key("anti_entropy_jitter", _jitter, "P2PSYNC_ANTI_ENTROPY_JITTER"),
    "anti_entropy.max_interval": _Key("anti_entropy_max_interval", _interval, "P2PSYNC_ANTI_ENTROPY_MAX_INTERVAL"),
    "quota.tenant_messages": _Key("quota_tenant_messages", _messages, "P2PSYNC_QUOTA_TENANT_MESSAGES"),
    "quota.tenant_bytes": _Key("quota_tenant_bytes", _bytes, "P2PSYNC_QUOTA_TENANT_BYTES"),
    "quota.peer_messages": _Key("quota_peer_messages", _messages, "P2PSYNC_QUOTA_PEER_MESSAGES"),
    "quota.peer_bytes": _Key("quota_peer_bytes", _bytes, "P2PSYNC_QUOTA_PEER_BYTES"),
    "quota.peer_window": _Key("quota_peer_window", _window, "P2PSYNC_QUOTA_PEER_WINDOW"),
}
#: Environment variables of the two lists: whitespace- or comma-separated.
PEERS_ENV: Final = "P2PSYNC_PEERS"
TENANTS_ENV: Final = "P2PSYNC_TENANTS"
#: Every environment variable a node reads, for the docs and ``--help``.
ENV_VARS: Final = (CONFIG_ENV, *(k.env for k in KEYS.values() if k.env), PEERS_ENV, TENANTS_ENV)

_TABLES: Final = frozenset(k.split(".")[0] for k in KEYS if "." in k)
_TENANT_KEYS: Final = frozenset({"did", "direction", "scopes", "quota_messages", "quota_bytes"})
_PEER_KEYS: Final = frozenset({"url", "tenants", "pin"})


#: Parsers of values that a file gives as TOML numbers or booleans, and what each expects.
_NOT_TEXT: Final[dict[Callable[[Any], Any], str]] = {
    _port: "an integer", _bool: "true or false", _interval: "a number", _jitter: "a number",
    _window: "a number",
}


def _typed(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """In a file, numbers and booleans are TOML's own: ``port = "80"`` is a mistake to report
    (text is for the environment and flags, where everything is text)."""
    kind = _NOT_TEXT.get(parse)
    if kind is not None:

        def strict(value: Any) -> Any:
            if isinstance(value, str):
                raise ValueError(f"must be {kind} (without quotes), not {value!r}")
            return parse(value)

        return strict
    if parse is _messages:

        def count(value: Any) -> Any:
            # A count is a TOML integer; the only text it takes is "unlimited".
            if isinstance(value, str) and value.strip().lower() != UNLIMITED_TEXT:
                raise ValueError(f'must be an integer (without quotes) or "{UNLIMITED_TEXT}", not {value!r}')
            return parse(value)

        return count
    return parse


def _check(where: str, key: str, parse: Callable[[Any], Any], value: Any) -> Any:
    try:
        return parse(value)
    except ValueError as exc:
        raise ConfigError(where, key, str(exc)) from None


# --------------------------------------------------------------------------- the layers


def _from_file(path: Path) -> dict[str, Any]:
    """The file's settings as NodeConfig field -> value."""
    where = str(path)
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(where, "", f"cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(where, "", f"not valid TOML: {exc}") from None
    out: dict[str, Any] = {}
    for top, value in doc.items():
        if top in _TABLES:
            if not isinstance(value, dict):
                raise ConfigError(where, top, "must be a table ([" + top + "])")
            for sub, inner in value.items():
                dotted = f"{top}.{sub}"
                if dotted not in KEYS:
                    raise ConfigError(where, dotted, "unknown key")
                out[KEYS[dotted].field] = _check(where, dotted, _typed(KEYS[dotted].parse), inner)
        elif top == "tenant":
            out["tenants"] = _tenants(where, value)
        elif top == "peer":
            out["peers"] = _peers(where, value)
        elif top in KEYS:
            out[KEYS[top].field] = _check(where, top, _typed(KEYS[top].parse), value)
        else:
            raise ConfigError(where, top, "unknown key")
    # Relative paths in a file are relative to the file, not to wherever the node was started.
    for name in ("data_dir", "store"):
        if name in out and not out[name].is_absolute():
            out[name] = path.parent / out[name]
    return out


def _tables(where: str, key: str, value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(where, key, f"must be an array of tables ([[{key}]])")
    return value


def _tenants(where: str, value: Any) -> tuple[TenantConfig, ...]:
    out = []
    for i, table in enumerate(_tables(where, "tenant", value)):
        for name in table:
            if name not in _TENANT_KEYS:
                raise ConfigError(where, f"tenant[{i}].{name}", "unknown key")
        did = _check(where, f"tenant[{i}].did", _did, table["did"]) if "did" in table else None
        direction = _check(where, f"tenant[{i}].direction", _direction, table.get("direction", "both"))
        scopes = _scopes(where, f"tenant[{i}].scopes", table.get("scopes", ["global"]))
        messages = (_check(where, f"tenant[{i}].quota_messages", _typed(_messages), table["quota_messages"])
                    if "quota_messages" in table else INHERIT)
        size = (_check(where, f"tenant[{i}].quota_bytes", _bytes, table["quota_bytes"])
                if "quota_bytes" in table else INHERIT)
        out.append(TenantConfig(did, direction, scopes, messages, size))
    return tuple(out)


def _peers(where: str, value: Any) -> tuple[StaticPeer, ...]:
    out = []
    for i, table in enumerate(_tables(where, "peer", value)):
        for name in table:
            if name not in _PEER_KEYS:
                raise ConfigError(where, f"peer[{i}].{name}", "unknown key")
        if "url" not in table:
            raise ConfigError(where, f"peer[{i}].url", "is required")
        url = _check(where, f"peer[{i}].url", _url, table["url"])
        tenants = _check(where, f"peer[{i}].tenants", _list(_did), table["tenants"]) if "tenants" in table else None
        pin = _check(where, f"peer[{i}].pin", _fingerprint, table["pin"]) if "pin" in table else None
        out.append(StaticPeer(url, tenants, pin))
    _no_duplicate_urls(where, "peer", out)
    return tuple(out)


def _no_duplicate_urls(where: str, key: str, peers: list[StaticPeer]) -> None:
    urls = [p.url for p in peers]
    for url in urls:
        if urls.count(url) > 1:
            raise ConfigError(where, key, f"{url} is listed twice")


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in KEYS.values():
        if spec.env is not None and env.get(spec.env, "").strip():
            out[spec.field] = _check("environment", spec.env, spec.parse, env[spec.env])
    if env.get(PEERS_ENV, "").strip():
        urls = _check("environment", PEERS_ENV, _list(_url), env[PEERS_ENV])
        peers = [StaticPeer(u) for u in urls]
        _no_duplicate_urls("environment", PEERS_ENV, peers)
        out["peers"] = tuple(peers)
    if env.get(TENANTS_ENV, "").strip():
        dids = _check("environment", TENANTS_ENV, _list(_did), env[TENANTS_ENV])
        out["tenants"] = tuple(TenantConfig(d) for d in dids)
    return out


#: Flags of ``p2psync serve`` by NodeConfig field (the parser of each is the key's).
FLAGS: Final[dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "data_dir": ("--home", _path),
    "store": ("--store", _path),
    "name": ("--name", _name),
    "log_level": ("--log-level", _level),
    "host": ("--host", _host),
    "port": ("--port", _port),
    "tls": ("--tls", _bool),
    "insecure": ("--insecure", _bool),
    "discovery": ("--discovery", _bool),
    "interfaces": ("--interface", _list(_address)),
    "private": ("--private", _bool),
    "auto": ("--auto", _bool),
    "metrics_port": ("--metrics-port", _port),
    "metrics_host": ("--metrics-host", _host),
    "peers": ("--peer", _list(_url)),
}


def _from_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Flags given (None values are flags not given) as NodeConfig field -> value."""
    out: dict[str, Any] = {}
    for name, value in flags.items():
        if value is None:
            continue
        if name not in FLAGS:
            raise ConfigError("command line", name, "not a node setting")
        flag, parse = FLAGS[name]
        parsed = _check("command line", flag, parse, value)
        if name == "peers":
            peers = [StaticPeer(u) for u in parsed]
            _no_duplicate_urls("command line", flag, peers)
            parsed = tuple(peers)
        out[name] = parsed
    return out


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> NodeConfig:
    """The node's configuration: defaults, then the file (``path``, else ``$P2PSYNC_CONFIG``,
    else none), then ``env`` (default ``os.environ``), then ``flags`` (NodeConfig field ->
    value, None for a flag not given). Raises :class:`ConfigError`."""
    env = os.environ if env is None else env
    if path is None and env.get(CONFIG_ENV, "").strip():
        path = env[CONFIG_ENV].strip()
    values: dict[str, Any] = {}
    if path is not None:
        values.update(_from_file(Path(path).expanduser()))
    values.update(_from_env(env))
    values.update(_from_flags(flags or {}))
    config = NodeConfig(**values)
    config.check()
    return config
