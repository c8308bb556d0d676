"""Delivery loops between gateways: the hop marker and what a gateway does with it.

A subscription whose consumer is another broker forwards notifications there; two
gateways that subscribe to each other (or a longer ring) would forward every notification
round and round.  Each gateway has an id (``loops.gateway_id``, or a random one per start)
and each notification carries the ids of the gateways that published it so far, oldest
first (its *via* list):

* a Notify accepted by the broker endpoint is stamped: its via list (from the request's
  ``wsnmom:Hops`` header, empty without one) plus this gateway's id;
* the via list travels with the message through the middleware (header ``wsnmom-via``)
  and out with every push delivery, as the ``wsnmom:Hops`` SOAP header block (one
  ``wsnmom:Via`` per NotificationMessage, in order; see docs/security.md);
* a notification whose via list already holds this gateway's id has been here: it is
  dropped (the Notify is still answered 202, so the sender's delivery succeeds and the
  loop ends), counted (``wsnmom_notifications_rejected_total{reason="loop"}``) and logged;
  one whose list is ``loops.max_hops`` long is dropped the same way (``reason="hops"``),
  which bounds chains of gateways that do not all mark.

A bridge in both directions (A subscribed to B and B to A) therefore delivers each
notification once to each side.  Notify to a pull point is neither stamped nor checked:
a pull point does not forward.

The addresses of the gateway itself are refused as consumers and publishers at
Subscribe/RegisterPublisher time (:class:`SelfAddressRule`, a rule of the outbound
policy), so a loop through one gateway never starts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import posixpath
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from wsnmom.core import metrics
from wsnmom.core.codec import GATEWAY_ID
from wsnmom.core.interfaces import interface_addresses
from wsnmom.core.outbound_policy import (
    Destination,
    IPAddress,
    Resolver,
    normalise_host,
    system_resolver,
)

__all__ = ["LoopGuard", "SelfAddressRule", "new_gateway_id"]

log = logging.getLogger(__name__)


def new_gateway_id() -> str:
    """A random gateway id (for one run of the gateway)."""
    return "gw-" + uuid.uuid4().hex[:16]


class LoopGuard:
    """Stamps inbound notifications with this gateway's id and drops those that looped."""

    #: seconds between two summaries of dropped notifications in the log
    REPORT_INTERVAL = 60.0

    def __init__(self, gateway_id: str, max_hops: int) -> None:
        if not GATEWAY_ID.match(gateway_id):
            raise ValueError(f"gateway id {gateway_id!r}: 1-64 of A-Z a-z 0-9 . _ : -")
        self.gateway_id = gateway_id
        self.max_hops = max_hops
        self._lock = threading.Lock()
        self._dropped: dict[str, int] = {}
        self._reported = 0.0

    def stamp(self, via: tuple[str, ...]) -> tuple[str, ...] | None:
        """The via list of a notification accepted here, or None to drop it (it looped or
        went through ``max_hops`` gateways already)."""
        if not via:
            return (self.gateway_id,)
        if self.gateway_id in via:
            self._drop("loop", via)
            return None
        if len(via) >= self.max_hops:
            self._drop("hops", via)
            return None
        return (*via, self.gateway_id)

    def _drop(self, reason: str, via: Sequence[str]) -> None:
        metrics.NOTIFICATIONS_REJECTED.labels(reason=reason).inc()
        now = time.monotonic()
        with self._lock:
            self._dropped[reason] = self._dropped.get(reason, 0) + 1
            if now - self._reported < self.REPORT_INTERVAL:
                return
            counts, self._dropped, self._reported = self._dropped, {}, now
        log.warning(
            "dropped notifications that came back to this gateway (%s): %s; last path %s",
            self.gateway_id,
            ", ".join(
                f"{n} {'looped' if r == 'loop' else f'past loops.max_hops={self.max_hops}'}"
                for r, n in sorted(counts.items())
            ),
            " > ".join(via),
        )


# ------------------------------------------------------------------------------ addresses
@dataclass(frozen=True, slots=True)
class _Endpoint:
    """One way of reaching the gateway: by name or by address, on a port, under a path."""

    port: int
    prefix: str
    host: str | None = None
    addresses: frozenset[IPAddress] = frozenset()
    #: any local address (the gateway listens on all of them)
    anywhere: bool = False


class SelfAddressRule:
    """An outbound-policy rule refusing the gateway's own SOAP endpoints.

    The endpoints are ``public_url`` (host as written, its port, its path + ``/wsn/``) and
    each listen address (``host``:``port``, path ``/wsn/``): a destination on the same
    port whose path starts with the SOAP prefix is refused when its host is the public
    host, or one of its addresses is a listen address.  A gateway listening on every
    address (``0.0.0.0``, ``::``) counts every loopback address, every address of its
    network interfaces (as they are when it starts) and every address its own host name
    resolves to.  Other loopback destinations (consumers on this machine) are
    not affected.
    """

    def __init__(
        self,
        public_url: str,
        listen_host: str,
        listen_port: int,
        *,
        resolver: Resolver = system_resolver,
        local_addresses: Iterable[str] | None = None,
    ) -> None:
        """``resolver`` resolves the listen host and, for a wildcard listen address, this
        machine's name (unless ``local_addresses`` gives its addresses)."""
        endpoints: list[_Endpoint] = []
        public = urlsplit(public_url)
        prefix = public.path.rstrip("/") + "/wsn/"
        port = public.port or (443 if public.scheme == "https" else 80)
        try:
            host, ip = normalise_host(public.hostname or "")
        except ValueError:
            host, ip = "", None
        if host:
            public_addresses: set[IPAddress | None] = {ip}
            if ip is None:  # other names of the same address reach the gateway too
                with contextlib.suppress(OSError):
                    public_addresses = {_ip(str(a)) for a in resolver(host, port)}
            endpoints.append(
                _Endpoint(
                    port,
                    prefix,
                    host=host,
                    addresses=frozenset(a for a in public_addresses if a is not None),
                )
            )
        bare = listen_host.strip().strip("[]")
        if bare in ("", "0.0.0.0", "::"):
            extra = local_addresses if local_addresses is not None else _local_addresses(resolver)
            addresses = {_ip(a) for a in extra} - {None}
            endpoints.append(
                _Endpoint(
                    listen_port,
                    "/wsn/",
                    addresses=frozenset(a for a in addresses if a is not None),
                    anywhere=True,
                )
            )
        else:
            listen = {_ip(bare)}
            if None in listen:  # a name: its addresses
                try:
                    listen = {_ip(str(a)) for a in resolver(bare, listen_port)}
                except OSError:
                    listen = set()
            listen.discard(None)
            endpoints.append(
                _Endpoint(
                    listen_port,
                    "/wsn/",
                    host=bare.lower(),
                    addresses=frozenset(a for a in listen if a is not None),
                )
            )
        self.endpoints = tuple(endpoints)

    def __call__(self, destination: Destination) -> str | None:
        path = _route_path(destination.target.split("?", 1)[0])  # "//x" is a path here
        for endpoint in self.endpoints:
            if destination.port != endpoint.port or not path.startswith(endpoint.prefix):
                continue
            if endpoint.host is not None and destination.host == endpoint.host:
                return self._refusal(destination)
            for address in destination.addresses:
                if address in endpoint.addresses or (endpoint.anywhere and address.is_loopback):
                    return self._refusal(destination)
        return None

    @staticmethod
    def _refusal(destination: Destination) -> str:
        return (
            f"{destination.url} is this gateway's own endpoint: notifications sent there "
            "would come back to this gateway and loop"
        )


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def _local_addresses(resolver: Resolver) -> list[str]:
    """This host's own addresses: every interface's (``core.interfaces``) and what its
    name resolves to (loopback is matched separately)."""
    found = interface_addresses()
    with contextlib.suppress(OSError):
        found.update(str(a) for a in resolver(socket.gethostname(), 0))
    return sorted(found)


def _route_path(path: str) -> str:
    """The path the gateway's router would see: percent-decoded, repeated slashes merged,
    dot segments resolved (so ``//wsn/./broker`` and ``/%77sn/broker`` count)."""
    decoded = unquote(path or "/")
    merged = re.sub(r"/{2,}", "/", decoded)
    normal = posixpath.normpath(merged)
    return normal + "/" if merged.endswith("/") and not normal.endswith("/") else normal
