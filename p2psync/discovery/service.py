"""mDNS/DNS-SD advertising and browsing of p2psync nodes, bridged from zeroconf into trio.

Threads and who owns what:

* zeroconf runs its own asyncio loop in a thread it starts (``Zeroconf()``); its blocking calls
  (open, register, update, resolve, unregister, close) are made from trio worker threads through
  ``trio.to_thread.run_sync``, never from the trio thread.
* the ``ServiceBrowser`` calls us back in its own thread; the callback hands the event to trio with
  ``trio.from_thread.run_sync(..., trio_token=...)`` and touches nothing else.
* everything else -- the peers table, the subscribers, the resolver and liveness tasks -- lives in
  the trio thread, so it needs no locks.

A peer is gone when its goodbye arrives (the browser reports the service removed), or when its
SRV/address records have expired (their TTL) and a fresh query gets no answer within the resolve
timeout. zeroconf itself only expires the PTR record, which it holds for at least 1125 s whatever
TTL was sent, so the TTL check is ours: every ``check_every`` seconds each known name is resolved;
while its records are cached that costs nothing on the network, once they expire it is a query.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import ipaddress
import logging
import secrets
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import ifaddr  # a zeroconf dependency
import trio
import zeroconf
from zeroconf import InterfaceChoice, ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

from p2psync.discovery.model import SERVICE_TYPE, Advert, PeerGone, PeerSeen
from p2psync.discovery.txt import SALT_BYTES, DiscoveryError, decode_txt, encode_txt
from p2psync.replication.wire import PROFILE_VERSION

__all__ = [
    "CHECK_EVERY",
    "RESOLVE_TIMEOUT",
    "SHUTDOWN_TIMEOUT",
    "SUBSCRIBER_BUFFER",
    "Discovery",
    "DiscoveryEvent",
]

log = logging.getLogger("p2psync.discovery")

DiscoveryEvent = PeerSeen | PeerGone

#: How long one resolve waits for answers (seconds); zeroconf's own ``get_service_info`` uses 3 s,
#: which covers its first query, a retry and a slow Wi-Fi responder.
RESOLVE_TIMEOUT: Final = 3.0
#: How often each known name is checked (seconds). While a peer's records are cached the check
#: costs no traffic; with the default 120 s TTL a SIGKILLed peer is gone within about 140 s.
CHECK_EVERY: Final = 15.0
#: A name that stopped answering is retried with doubling delays up to this (seconds), until
#: its PTR record expires or the browser reports it again.
MAX_RECHECK: Final = 300.0
#: Resolves running at once (worker threads); a LAN has a handful of p2psync nodes.
RESOLVE_CONCURRENCY: Final = 4
#: Events a subscriber may fall behind before it is dropped (its channel ends): discovery never
#: waits for a slow reader.
SUBSCRIBER_BUFFER: Final = 64
#: Upper bound on shutdown (goodbye packets take ~250 ms, closing zeroconf ~100 ms), so that
#: cancelling ``run`` never hangs on a wedged zeroconf thread.
SHUTDOWN_TIMEOUT: Final = 5.0
#: Default TTL of the PTR and TXT records (RFC 6762 §10: 75 minutes for records not naming a host).
OTHER_TTL: Final = 4500

#: Linux socket options from <linux/in.h> and <linux/in6.h>, which Python's socket module lacks.
_IP_MULTICAST_ALL: Final = 49
_IPV6_MULTICAST_ALL: Final = 29

# Errors zeroconf raises for a bad name, a stopped instance or a closed loop; a peer's odd record
# must cost us that peer, never the node.
_ZEROCONF_ERRORS = (zeroconf.Error, ValueError, OSError, RuntimeError, AssertionError)


@dataclass
class _Tracked:
    """A service name the browser reported, while it is not removed."""

    name: str
    resolving: bool = False
    again: bool = False
    own: bool = False
    next_check: float = 0.0
    misses: int = 0
    bad_text: bytes | None = None


def _instance_label(service_name: str) -> str:
    suffix = "." + SERVICE_TYPE
    return service_name[: -len(suffix)] if service_name.lower().endswith(suffix) else service_name


def _devices_of(addresses: Sequence[str]) -> set[str]:
    """The names of the network devices that carry these IP addresses."""
    wanted = {ipaddress.ip_address(a) for a in addresses}
    found: set[str] = set()
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            raw = ip.ip if isinstance(ip.ip, str) else ip.ip[0]  # IPv6 comes as (address, flow, scope)
            if ipaddress.ip_address(str(raw).split("%")[0]) in wanted:
                found.add(str(adapter.name))
    return found


def _confine(zc: Zeroconf, interfaces: Sequence[str]) -> str | None:
    """Keep zeroconf's wildcard listen socket to the device of ``interfaces``; None when done,
    else why not.

    zeroconf joins the mDNS group only on the given interfaces, but its listen socket is bound to
    0.0.0.0:5353, and Linux also hands it mDNS that arrives on other interfaces whenever another
    program (avahi, a browser) joined the group there. zeroconf then answers those questions by
    unicast from the other interface's address -- measured, see docs/discovery.md.
    ``IP_MULTICAST_ALL`` = 0 alone still let 2 packets in 3 through on Linux 6.18;
    ``SO_BINDTODEVICE`` (unprivileged since Linux 5.7 on a socket not yet tied to a device)
    stops them all, but takes one device only. zeroconf does not expose the socket, hence the
    private attribute.
    """
    if sys.platform != "linux":
        return "only done on Linux"
    wrapped = getattr(zc.engine, "_listen_transport", None)
    sock: Any = getattr(wrapped, "sock", None)  # a socket.socket or asyncio's TransportSocket view of one
    if not hasattr(sock, "setsockopt") or not hasattr(sock, "family"):
        return "zeroconf's listen socket is not reachable"
    devices = _devices_of(interfaces)
    try:
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_MULTICAST_ALL, 0)
        sock.setsockopt(socket.IPPROTO_IP, _IP_MULTICAST_ALL, 0)
        if len(devices) != 1:
            return f"the addresses are on {len(devices)} devices ({', '.join(sorted(devices))}), not one"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, devices.pop().encode())
    except OSError as exc:
        return f"the kernel refused: {exc}"
    return None


def _host_addresses() -> list[str]:
    """Every non-loopback IPv4 address of the host (what zeroconf binds to by default), else 127.0.0.1."""
    found = [
        str(ip.ip)
        for adapter in ifaddr.get_adapters()
        for ip in adapter.ips
        if ip.is_IPv4 and not ipaddress.ip_address(str(ip.ip)).is_loopback
    ]
    return sorted(set(found)) or ["127.0.0.1"]


class Discovery:
    """Advertise this node (``advert``; None: browse only) and keep a table of the others.

    ``interfaces``: IP addresses to bind zeroconf to (None: zeroconf's default, every IPv4
    interface); on Linux, when they are on one device, receiving is also tied to that device (see
    :func:`_confine`). ``browse=False`` only advertises. ``check_every`` and ``resolve_timeout`` set the
    liveness check (seconds); tests shorten them together with a short ``Advert.ttl``.

    Use::

        discovery = Discovery(Advert(did, sid, port, tenants=(tenant,)))
        async with trio.open_nursery() as nursery:
            events = discovery.subscribe()
            await nursery.start(discovery.run)
            async for event in events: ...

    Raises :class:`DiscoveryError` at construction when the advert cannot be published
    (``AdvertInvalid``, ``AdvertTooLarge``) and from ``run`` when zeroconf cannot bind (``BindFailed``).
    """

    def __init__(
        self,
        advert: Advert | None,
        *,
        interfaces: Sequence[str] | None = None,
        browse: bool = True,
        check_every: float = CHECK_EVERY,
        resolve_timeout: float = RESOLVE_TIMEOUT,
    ) -> None:
        if check_every <= 0 or resolve_timeout <= 0:
            raise ValueError("check_every and resolve_timeout must be positive")
        self._interfaces = list(interfaces) if interfaces is not None else None
        for address in self._interfaces or ():
            try:
                unspecified = ipaddress.ip_address(address).is_unspecified
            except ValueError:
                raise DiscoveryError("BindFailed", f"{address!r} is not an IP address") from None
            if unspecified:
                raise DiscoveryError("BindFailed", f"{address} names no interface; pass interfaces=None for all")
        self._browse = browse
        self._check_every = check_every
        self._resolve_timeout = resolve_timeout
        self._advert = advert
        # Built now so that an advert we cannot publish fails here, not inside the task group.
        self._info = self._service_info(advert, None) if advert is not None else None
        self._registered = False
        self._state: Literal["new", "running", "done"] = "new"
        self._zc: Zeroconf | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._names: dict[str, _Tracked] = {}
        self._peers: dict[str, PeerSeen] = {}
        self._queued: set[str] = set()
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(RESOLVE_CONCURRENCY)
        self._subscribers: list[trio.MemorySendChannel[DiscoveryEvent]] = []

    # -- public ---------------------------------------------------------------------------------

    @property
    def name(self) -> str | None:
        """Our instance name as registered (zeroconf renames on a conflict), or None."""
        return _instance_label(self._info.name) if self._info is not None else None

    def peers(self) -> list[PeerSeen]:
        """The peers seen now, by instance name."""
        return sorted(self._peers.values(), key=lambda p: p.name)

    def subscribe(self) -> trio.MemoryReceiveChannel[DiscoveryEvent]:
        """Every change from now on: a :class:`PeerSeen` when a peer appears or its record changes,
        a :class:`PeerGone` when it leaves. The channel ends when ``run`` ends, or when the reader
        falls :data:`SUBSCRIBER_BUFFER` events behind (then read :meth:`peers` and subscribe again)."""
        send, receive = trio.open_memory_channel[DiscoveryEvent](SUBSCRIBER_BUFFER)
        if self._state == "done":
            send.close()
        else:
            self._subscribers.append(send)
        return receive

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, browse, and keep the table until cancelled; ``started()`` once registered and
        browsing. On the way out (cancellation included) sends the goodbye and closes zeroconf,
        bounded by :data:`SHUTDOWN_TIMEOUT`."""
        if self._state != "new":
            raise DiscoveryError("AlreadyRunning", "a Discovery runs once; make a new one")
        self._state = "running"
        self._token = trio.lowlevel.current_trio_token()
        browser: ServiceBrowser | None = None
        try:
            self._zc = await trio.to_thread.run_sync(self._open)
            if self._info is not None:
                await trio.to_thread.run_sync(self._register, self._zc, self._info)
            async with trio.open_nursery() as nursery:
                if self._browse:
                    make_browser = functools.partial(ServiceBrowser, self._zc, SERVICE_TYPE,
                                                     handlers=[self._on_browser])
                    browser = await trio.to_thread.run_sync(make_browser)
                    nursery.start_soon(self._resolver, nursery)
                    nursery.start_soon(self._liveness, nursery)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._state = "done"
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + SHUTDOWN_TIMEOUT
                await trio.to_thread.run_sync(self._shutdown, self._zc, browser, abandon_on_cancel=True)
            if scope.cancelled_caught:
                log.warning("zeroconf did not shut down within %s s; left its threads behind", SHUTDOWN_TIMEOUT)
            self._peers.clear()
            for send in self._subscribers:
                send.close()
            self._subscribers.clear()

    async def update(self, advert: Advert) -> None:
        """Publish a changed advert (tenants, capabilities, port, addresses, privacy) under the name
        already registered (``advert.name`` is not used); private adverts get a new salt."""
        if self._state != "running" or self._zc is None or self._info is None or not self._registered:
            raise DiscoveryError("NotRunning", "update() needs a running Discovery that advertises")
        info = self._service_info(advert, self._info.name)
        zc = self._zc
        await trio.to_thread.run_sync(zc.update_service, info)
        self._advert, self._info = advert, info

    # -- zeroconf side (worker threads) ---------------------------------------------------------

    def _service_info(self, advert: Advert, registered_name: str | None) -> ServiceInfo:
        # A fresh salt per advert: hashes cannot be matched across adverts or restarts.
        salt = secrets.token_hex(SALT_BYTES) if advert.private else None
        txt = encode_txt(did=advert.did, sid=advert.sid, version=PROFILE_VERSION,
                         capabilities=advert.capabilities, tenants=advert.tenants, salt=salt,
                         fingerprint=advert.fingerprint)
        if advert.addresses:
            addresses = list(advert.addresses)
        elif self._interfaces:
            addresses = list(self._interfaces)
        else:
            addresses = _host_addresses()
        # One host name per store, so nodes sharing a machine do not fight over an A record.
        server = f"p2psync-{hashlib.sha256(advert.sid.encode()).hexdigest()[:16]}.local."
        try:
            return ServiceInfo(
                SERVICE_TYPE,
                registered_name or f"{advert.instance}.{SERVICE_TYPE}",
                port=advert.port,
                properties=txt,
                server=server,
                host_ttl=advert.ttl,
                other_ttl=max(OTHER_TTL, advert.ttl),
                parsed_addresses=addresses,
            )
        except _ZEROCONF_ERRORS as exc:
            raise DiscoveryError("AdvertInvalid", f"zeroconf refused the advert: {exc!r}") from None

    def _open(self) -> Zeroconf:
        try:
            zc = Zeroconf(interfaces=self._interfaces if self._interfaces is not None else InterfaceChoice.All)
        except (OSError, ValueError) as exc:
            where = ", ".join(self._interfaces) if self._interfaces else "every interface"
            raise DiscoveryError("BindFailed", f"cannot open mDNS on {where}: {exc}") from None
        if self._interfaces is not None and (why := _confine(zc, self._interfaces)) is not None:
            log.info("could not keep mDNS to %s (%s): it may hear and answer other interfaces",
                     ", ".join(self._interfaces), why)
        return zc

    def _register(self, zc: Zeroconf, info: ServiceInfo) -> None:
        try:
            # Probing first (RFC 6762 §8.1); on a conflict zeroconf picks "<name> (2)" and so on.
            zc.register_service(info, allow_name_change=True)
        except _ZEROCONF_ERRORS as exc:
            raise DiscoveryError("RegisterFailed", f"could not register {info.name}: {exc!r}") from None
        self._registered = True

    def _shutdown(self, zc: Zeroconf | None, browser: ServiceBrowser | None) -> None:
        steps = []
        if browser is not None:
            steps.append(("stop browsing", browser.cancel))
        if zc is not None:
            if self._registered and self._info is not None:
                steps.append(("send goodbye", functools.partial(zc.unregister_service, self._info)))
            steps.append(("close zeroconf", zc.close))
        for what, step in steps:
            try:
                step()
            except _ZEROCONF_ERRORS as exc:
                log.warning("discovery shutdown: could not %s: %r", what, exc)

    def _lookup(self, name: str) -> ServiceInfo | None:
        """Resolve a service name; from the cache while its records are live, else by query."""
        zc = self._zc
        if zc is None:
            return None
        try:
            info = ServiceInfo(SERVICE_TYPE, name)
            found = info.request(zc, int(self._resolve_timeout * 1000))
        except _ZEROCONF_ERRORS as exc:
            log.debug("resolving %r failed: %r", name, exc)
            return None
        return info if found and info.port else None

    def _on_browser(self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        """The browser thread's callback: hand the event to trio and nothing else."""
        token = self._token
        if token is None:
            return
        # RunFinishedError: trio is gone, and so is anyone who cared about this event.
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(self._note, name, state_change, trio_token=token)

    # -- trio side -------------------------------------------------------------------------------

    def _note(self, name: str, state_change: ServiceStateChange) -> None:
        if self._state != "running":
            return
        key = name.lower()
        if state_change is ServiceStateChange.Removed:
            # Dropping the entry also voids any resolve in flight for it (they check identity).
            self._names.pop(key, None)
            self._queued.discard(key)
            self._forget(key, "goodbye")
            return
        self._names.setdefault(key, _Tracked(name))
        self._queued.add(key)
        self._wake.set()

    async def _resolver(self, nursery: trio.Nursery) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            queued, self._queued = self._queued, set()
            for key in queued:
                tracked = self._names.get(key)
                if tracked is None or tracked.own:
                    continue
                if tracked.resolving:
                    tracked.again = True  # resolve once more when the running one ends
                    continue
                tracked.resolving = True
                nursery.start_soon(self._resolve, key, tracked)

    async def _liveness(self, nursery: trio.Nursery) -> None:
        while True:
            await trio.sleep(self._check_every)
            now = trio.current_time()
            for key, tracked in list(self._names.items()):
                if tracked.own or tracked.resolving or tracked.next_check > now:
                    continue
                tracked.resolving = True
                nursery.start_soon(self._resolve, key, tracked)

    async def _resolve(self, key: str, tracked: _Tracked) -> None:
        try:
            while True:
                tracked.again = False
                info = await trio.to_thread.run_sync(self._lookup, tracked.name, abandon_on_cancel=True,
                                                     limiter=self._limiter)
                if self._names.get(key) is not tracked:
                    return  # removed meanwhile; a later add made a new entry
                self._apply(key, tracked, info)
                if not tracked.again:
                    return
        finally:
            tracked.resolving = False

    def _apply(self, key: str, tracked: _Tracked, info: ServiceInfo | None) -> None:
        now = trio.current_time()
        if info is None:
            tracked.misses += 1
            tracked.next_check = now + min(self._check_every * 2 ** min(tracked.misses, 16), MAX_RECHECK)
            self._forget(key, "expired")
            return
        text = info.text or b""
        try:
            record = decode_txt(text)
        except DiscoveryError as exc:
            if tracked.bad_text != text:
                log.info("ignoring %s: not a p2psync advert we can read (%s)", info.name, exc)
                tracked.bad_text = text
            tracked.next_check = now + MAX_RECHECK
            self._forget(key, "invalid")
            return
        if self._advert is not None and record.sid == self._advert.sid:
            log.debug("ignoring our own advert %s", info.name)
            tracked.own = True
            return
        tracked.misses, tracked.bad_text = 0, None
        tracked.next_check = now + self._check_every
        peer = PeerSeen(
            name=_instance_label(info.name),
            did=record.did,
            sid=record.sid,
            addresses=tuple(info.parsed_scoped_addresses()),
            port=int(info.port or 0),
            tenants=frozenset(record.tenants),
            tenants_hashed=record.hashed,
            salt=record.salt,
            version=record.version,
            capabilities=record.capabilities,
            last_seen=time.time(),
            fingerprint=record.fingerprint,
        )
        previous = self._peers.get(key)
        self._peers[key] = peer
        if previous != peer:  # last_seen is not compared: a refresh alone is not news
            self._emit(peer)

    def _forget(self, key: str, reason: Literal["goodbye", "expired", "invalid"]) -> None:
        peer = self._peers.pop(key, None)
        if peer is not None:
            self._emit(PeerGone(peer.name, peer.did, peer.sid, reason))

    def _emit(self, event: DiscoveryEvent) -> None:
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                log.warning("a discovery subscriber fell %d events behind; dropping it", SUBSCRIBER_BUFFER)
                send.close()
                self._subscribers.remove(send)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(send)
