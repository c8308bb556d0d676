"""The one outbound-address policy: which consumer and publisher addresses the broker may
call, and the exact network address a call connects to.

Consumer and demand-publisher addresses come from strangers, so every one is checked
against the ``[outbound]`` settings when it is accepted (Subscribe, RegisterPublisher with
Demand) and again before every call (push delivery, demand subscribe/pause/resume/
unsubscribe).  Both use :meth:`OutboundPolicy.check`, which returns a :class:`Destination`:
the addresses it checked.  The outbound HTTP client connects to those addresses and to no
other (the host name still goes in the ``Host`` header and in TLS SNI and certificate
verification), so a name that resolves differently a moment later (DNS rebinding) cannot
steer a call to an address the policy never saw.

What ``check`` does, in order:

1. parse the URL strictly (a malformed URL, port or host is refused with the reason);
2. the scheme must be one of ``outbound.schemes``;
3. the host is normalised: IPv6 literals (zone ids kept), every numeric IPv4 form a
   resolver or browser would accept (``2852039166``, ``0xa9fea9fe``, ``0251.0376.0251.0376``,
   ``127.1``: a host whose last label is a number *is* an IPv4 address or is refused),
   internationalised names to IDNA; a host with any other character is refused;
4. name rules before any lookup: ``deny`` patterns, ``localhost`` and ``*.localhost`` are
   loopback (RFC 6761);
5. a name is resolved with the policy's resolver (``getaddrinfo`` unless injected);
6. every address is checked, IPv6 forms that carry an IPv4 address (IPv4-mapped
   ``::ffff:a.b.c.d``, IPv4-compatible, NAT64 ``64:ff9b::/96``, 6to4, Teredo) by that IPv4
   address too: unspecified, multicast, broadcast and reserved addresses are refused
   always; loopback unless ``allow_loopback``; link-local (and IPv6 site-local) unless
   ``allow_link_local``; the cloud metadata addresses (:data:`CLOUD_METADATA`) unless
   ``allow_cloud_metadata``; private networks (:data:`PRIVATE`) unless ``allow_private``;
   CIDR entries of ``deny`` refuse, of ``allow`` admit (with a
   non-empty ``allow`` list, a host is admitted by a name pattern or when every address is
   in an allowed network);
7. extra rules (:class:`AddressRule`, see :meth:`OutboundPolicy.add_rule`) see the checked
   destination, path included, and may refuse it: this is where rules that need more than
   the settings go (``core.loops.SelfAddressRule`` refuses the gateway's own endpoints).
   They run on every check, after the cache.

A checked destination is reused for ``outbound.resolve_cache`` seconds (numeric hosts for
as long as the process runs); a refusal is never cached.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from typing import Protocol
from urllib.parse import SplitResult, urlsplit

from wsnmom.core.address_ranges import CLOUD_METADATA, PRIVATE
from wsnmom.core.config import OutboundSettings

__all__ = [
    "CLOUD_METADATA",
    "PRIVATE",
    "AddressRefused",
    "AddressRule",
    "Destination",
    "IPAddress",
    "OutboundPolicy",
    "Resolver",
    "normalise_host",
    "system_resolver",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: ``resolver(host, port)``: the addresses of ``host`` (text, in the order to try them).
#: Raises ``OSError`` when the name cannot be resolved (``socket.gaierror`` with
#: ``EAI_NONAME``/``EAI_NODATA`` means the name does not exist).
Resolver = Callable[[str, int], Sequence[str]]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_HEX_NUMBER = re.compile(r"^0[xX][0-9a-fA-F]*$")
#: the host and port of a URL's authority (after any user info): a bracketed IPv6
#: address or a host without brackets, colons, backslashes or blanks, then ``:port``
_HOST_PORT = re.compile(r"(?:\[(?P<ip6>[^\[\]]*)\]|[^\[\]:@\\\s]*)(?::[^:\[\]@]*)?")
_NAT64 = (
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("64:ff9b:1::/48"),
)
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
#: checked destinations kept at most (then the cache starts over)
_CACHE_SIZE = 4096
_NOT_FOUND = {getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, n)}


class AddressRefused(Exception):
    """``address`` may not be called; ``reason`` says why.

    ``temporary`` is True when the refusal may go away by itself (the name could not be
    resolved just now); a refusal by the rules is never temporary.
    """

    def __init__(self, address: str, reason: str, *, temporary: bool = False) -> None:
        super().__init__(f"{address!r} refused: {reason}")
        self.address = address
        self.reason = reason
        self.temporary = temporary


@dataclass(frozen=True, slots=True)
class Destination:
    """A checked outbound address: connect to ``addresses`` (only), speak to ``host``."""

    #: lower-case URL scheme
    scheme: str
    #: the host as the policy saw it: a lower-case ASCII (IDNA) name without a trailing
    #: dot, or the canonical text of an IP address
    host: str
    port: int
    #: every address of ``host``, checked; connect to the first (IPv4-mapped IPv6
    #: addresses given as IPv4)
    addresses: tuple[IPAddress, ...]
    #: True when the URL named an IP address rather than a host name
    literal: bool
    #: the ``Host`` header: the URL's host (normalised) and port as written
    host_header: str
    #: path and query of the request (at least ``/``)
    target: str

    @property
    def connect_host(self) -> str:
        """The address to connect to (text, no brackets)."""
        return str(self.addresses[0])

    @property
    def server_hostname(self) -> str | None:
        """The name for TLS SNI and certificate checks (None for an IP address)."""
        return None if self.literal else self.host

    @property
    def url(self) -> str:
        """The URL rebuilt from what was checked (no user info, no fragment)."""
        return f"{self.scheme}://{self.host_header}{self.target}"


class AddressRule(Protocol):
    """An extra check after the settings' rules: the reason to refuse ``destination``,
    or None.  Rules must be fast and thread-safe; they run on request and delivery
    threads."""

    def __call__(self, destination: Destination) -> str | None: ...


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``getaddrinfo`` gives for ``host`` (TCP), in its order, once each."""
    seen: list[str] = []
    for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        addr = str(info[4][0])
        if addr not in seen:
            seen.append(addr)
    return seen


# --------------------------------------------------------------------------------------------
# host normalisation
# --------------------------------------------------------------------------------------------
def _ipv4_number(part: str) -> int | None:
    """One part of a numeric IPv4 host: decimal, ``0x`` hex or ``0`` octal; None if not."""
    if _HEX_NUMBER.match(part):
        return int(part[2:] or "0", 16)
    if not part.isascii() or not part.isdigit():
        return None
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8) if all(c in "01234567" for c in part) else None
    return int(part)


def _ends_in_number(labels: list[str]) -> bool:
    last = labels[-1]
    return bool(last) and ((last.isascii() and last.isdigit()) or bool(_HEX_NUMBER.match(last)))


def _parse_ipv4(labels: list[str]) -> ipaddress.IPv4Address | None:
    """The IPv4 address of a host in any of the forms ``inet_aton`` accepts (1-4 parts,
    each decimal, hex or octal; the last fills the remaining bytes), or None."""
    if not 1 <= len(labels) <= 4:
        return None
    numbers = [_ipv4_number(p) for p in labels]
    if any(n is None for n in numbers):
        return None
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        return None
    value = values[-1]
    for i, n in enumerate(values[:-1]):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def normalise_host(host: str) -> tuple[str, IPAddress | None]:
    """``(host, address)``: a literal address and its canonical text, or a lower-case
    ASCII name (no trailing dot) and None.  Raises ValueError with the reason for a host
    that is neither."""
    if not host:
        raise ValueError("no host")
    if ":" in host:  # urlsplit only gives a colon for a bracketed IPv6 literal
        text, _, zone = host.partition("%")
        try:
            ip6 = ipaddress.IPv6Address(text)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
        if zone:
            zone = zone[2:] if zone.startswith("25") else zone  # "%25" in a URL is "%"
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", zone):
                raise ValueError(f"bad IPv6 zone in {host!r}")
            ip6 = ipaddress.IPv6Address(f"{text}%{zone}")
        mapped = ip6.ipv4_mapped
        return (str(mapped), mapped) if mapped is not None else (str(ip6), ip6)
    name = host.lower()
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(f"{host!r} is not a valid internationalised host name") from None
    labels = name.split(".")
    if len(labels) > 1 and labels[-1] == "":
        labels.pop()  # the root label of a fully qualified name
    if _ends_in_number(labels):
        ip4 = _parse_ipv4(labels)
        if ip4 is None:
            raise ValueError(f"{host!r} ends in a number but is not an IPv4 address")
        return str(ip4), ip4
    if len(".".join(labels)) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{host!r} is not a valid host name")
    return ".".join(labels), None


def _forms(ip: IPAddress) -> list[IPAddress]:
    """The addresses to judge for ``ip``: for an IPv4-mapped, IPv4-compatible or NAT64
    address the IPv4 address it stands for (the IPv6 form only wraps it); for 6to4 and
    Teredo addresses the address itself and the IPv4 addresses it tunnels to."""
    if isinstance(ip, ipaddress.IPv4Address):
        return [ip]
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if any(ip in net for net in _NAT64) or (ip in _COMPATIBLE and int(ip) > 1):
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]  # ::a.b.c.d, not :: or ::1
    forms: list[IPAddress] = [ip]
    if ip.sixtofour is not None:
        forms.append(ip.sixtofour)
    if ip.teredo is not None:
        forms.extend(ip.teredo)
    return forms


# --------------------------------------------------------------------------------------------
# the policy
# --------------------------------------------------------------------------------------------
class OutboundPolicy:
    """Checks outbound addresses against ``[outbound]`` settings (see module docstring).

    Thread-safe.  ``resolver`` replaces ``getaddrinfo`` (tests use one that never touches
    the network); ``rules`` are extra checks, also addable later with :meth:`add_rule`.
    """

    def __init__(
        self,
        settings: OutboundSettings | None = None,
        *,
        resolver: Resolver | None = None,
        rules: Iterable[AddressRule] = (),
    ) -> None:
        s = settings if settings is not None else OutboundSettings()
        self.settings = s
        self.resolver: Resolver = resolver or system_resolver
        self.schemes = frozenset(x.lower() for x in s.schemes)
        self._deny_names, self._deny_nets = _split_rules(s.deny)
        self._allow_names, self._allow_nets = _split_rules(s.allow)
        self._rules: list[AddressRule] = list(rules)
        self._ttl = float(s.resolve_cache)
        self._cache: dict[tuple[str, str], tuple[float, Destination]] = {}
        self._lock = threading.Lock()

    def add_rule(self, rule: AddressRule) -> None:
        """Add an extra check; it applies to every later ``check``."""
        with self._lock:
            self._rules = [*self._rules, rule]  # a new list: checks iterate without the lock

    def refusal(self, address: str) -> str | None:
        """Why ``address`` may not be called, or None when it may."""
        try:
            self.check(address)
        except AddressRefused as exc:
            return exc.reason
        return None

    def check(self, address: str) -> Destination:
        """The checked destination of ``address``; raises :class:`AddressRefused`."""
        parts = _split(address)
        key = (parts.scheme, parts.netloc)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        hit = self._cache.get(key)
        if hit is not None and hit[0] >= time.monotonic():
            origin = hit[1]
        else:
            origin = self._check_origin(address, parts)
            expires = float("inf") if origin.literal else time.monotonic() + self._ttl
            if self._ttl > 0 or origin.literal:
                with self._lock:
                    if len(self._cache) >= _CACHE_SIZE:
                        self._cache.clear()
                    self._cache[key] = (expires, origin)
        destination = replace(origin, target=target)
        for rule in self._rules:
            reason = rule(destination)
            if reason is not None:
                raise AddressRefused(address, reason)
        return destination

    # -- the steps -------------------------------------------------------------------------
    def _check_origin(self, address: str, parts: SplitResult) -> Destination:
        def refuse(reason: str, *, temporary: bool = False) -> AddressRefused:
            return AddressRefused(address, reason, temporary=temporary)

        scheme = parts.scheme.lower()
        if scheme not in self.schemes:
            allowed = ", ".join(sorted(self.schemes))
            raise refuse(
                f"URL scheme {parts.scheme!r} is not allowed (outbound.schemes: {allowed})"
            )
        try:
            port = parts.port
        except ValueError as exc:
            raise refuse(f"bad port: {exc}") from None
        if port == 0:
            raise refuse("port 0 cannot be called")
        if port is None:
            port = _DEFAULT_PORTS.get(scheme)
            if port is None:
                raise refuse(f"URL scheme {scheme!r} needs an explicit port")
        raw_host = parts.hostname or ""
        try:
            host, literal = normalise_host(raw_host)
        except ValueError as exc:
            raise refuse(str(exc)) from None
        host_header = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            host_header += f":{parts.port}"

        if literal is None:
            if any(fnmatch(host, p) for p in self._deny_names):
                raise refuse(f"host {host} is on the deny list")
            if (host == "localhost" or host.endswith(".localhost")) and not (
                self.settings.allow_loopback
            ):
                raise refuse(f"{host} is a loopback name (outbound.allow_loopback is false)")
            addresses = self._resolve(host, port, refuse)
        else:
            addresses = (literal,)
        for ip in addresses:
            reason = self._address_refusal(host if literal is None else raw_host, ip)
            if reason is not None:
                raise refuse(reason)
        if (self._allow_names or self._allow_nets) and not self._allowed(host, addresses):
            raise refuse(f"{host} is not on the allow list (outbound.allow)")
        destination = Destination(
            scheme=scheme,
            host=host,
            port=port,
            addresses=addresses,
            literal=literal is not None,
            host_header=host_header,
            target="/",
        )
        return destination

    def _resolve(
        self, host: str, port: int, refuse: Callable[..., AddressRefused]
    ) -> tuple[IPAddress, ...]:
        try:
            found = list(self.resolver(host, port))
        except OSError as exc:
            if isinstance(exc, socket.gaierror) and exc.errno in _NOT_FOUND:
                raise refuse(f"host name {host} does not resolve ({exc.strerror})") from None
            raise refuse(f"cannot resolve {host} now: {exc}", temporary=True) from None
        addresses: list[IPAddress] = []
        for text in found:
            try:
                _, ip = normalise_host(str(text))
            except ValueError:
                ip = None
            if ip is None:
                raise refuse(f"{host} resolved to {text!r}, which is not an IP address")
            if ip not in addresses:
                addresses.append(ip)
        if not addresses:
            raise refuse(f"host name {host} has no addresses")
        return tuple(addresses)

    def _address_refusal(self, host: str, ip: IPAddress) -> str | None:
        s = self.settings
        shown = host if host == str(ip) else f"{host} ({ip})"
        for form in _forms(ip):
            what = "" if form == ip else f" (it reaches {form})"
            if form.is_unspecified or (
                isinstance(form, ipaddress.IPv4Address) and form in _THIS_NETWORK
            ):
                return f"{shown} is not a destination address{what}"
            if form.is_multicast:
                return f"{shown} is a multicast address{what}"
            if form.is_loopback:
                if not s.allow_loopback:
                    return f"{shown} is a loopback address{what} (outbound.allow_loopback is false)"
                continue
            link_local = form.is_link_local or getattr(form, "is_site_local", False)
            if link_local and not s.allow_link_local:
                return f"{shown} is a link-local address{what} (outbound.allow_link_local is false)"
            if not s.allow_cloud_metadata and any(_in(form, net) for net in CLOUD_METADATA):
                return (
                    f"{shown} is a cloud instance metadata address{what} "
                    "(outbound.allow_cloud_metadata is false)"
                )
            if link_local:
                continue
            if form.is_reserved:
                return f"{shown} is a reserved address{what}"
            if not s.allow_private and any(_in(form, net) for net in PRIVATE):
                return f"{shown} is a private address{what} (outbound.allow_private is false)"
            if any(_in(form, net) for net in self._deny_nets):
                return f"{shown} is on the deny list{what}"
        return None

    def _allowed(self, host: str, addresses: Sequence[IPAddress]) -> bool:
        if any(fnmatch(host, p) for p in self._allow_names):
            return True
        return all(
            any(_in(form, net) for form in _forms(ip) for net in self._allow_nets)
            for ip in addresses
        )


def _split(address: str) -> SplitResult:
    """The URL's parts, once its authority is known to be well formed (``urlsplit`` alone
    accepts ``[::1]]``, ``[v1.x]`` or a backslash, which other parsers read otherwise)."""
    try:
        parts = urlsplit(address.strip())
    except ValueError as exc:
        raise AddressRefused(address, f"not a URL: {exc}") from None
    if not parts.scheme or not parts.netloc:
        raise AddressRefused(address, "not an absolute URL with a host")
    if "\\" in parts.netloc or any(c.isspace() or ord(c) < 32 for c in parts.netloc):
        raise AddressRefused(address, "the host part has a backslash or a blank")
    match = _HOST_PORT.fullmatch(parts.netloc.rpartition("@")[2])
    if match is None:
        raise AddressRefused(address, "malformed host or port")
    if match.group("ip6") is not None and ":" not in match.group("ip6"):
        raise AddressRefused(address, "only an IPv6 address may be written in brackets")
    return parts


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _split_rules(entries: Iterable[str]) -> tuple[list[str], list[Network]]:
    """``allow``/``deny`` entries: (lower-case name patterns, networks)."""
    names: list[str] = []
    nets: list[Network] = []
    for entry in entries:
        text = entry.strip()
        try:
            nets.append(ipaddress.ip_network(text, strict=False))
            continue
        except ValueError:
            pass
        try:  # a single numeric address in any form (127.1, 0x7f000001)
            _, ip = normalise_host(text.strip("[]"))
        except ValueError:
            ip = None
        if ip is not None:
            nets.append(ipaddress.ip_network(ip.compressed.split("%")[0]))
        else:
            names.append(text.lower().rstrip("."))
    return names, nets


def _in(ip: IPAddress, net: Network) -> bool:
    return ip.version == net.version and ip in net
