"""Outbound HTTP for SOAP calls: keep-alive connection pools, proxies and the CA bundle.

``OutboundEnvironment`` reads ``http_proxy``/``https_proxy``/``all_proxy``/``no_proxy`` (any
case) and ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` once, when the client is made, and keeps
the ``no_proxy`` decision per scheme and host.  ``~/.netrc`` is never consulted, so no
credentials from it reach consumers or publishers.

``OutboundConnections`` posts to a :class:`~wsnmom.core.outbound_policy.Destination` (an
address the outbound policy checked) through urllib3.  A direct connection goes to the
destination's checked IP address, never to a fresh lookup of its name; the name is kept in
the ``Host`` header, TLS SNI and the certificate check, and connections are pooled per
address, port and name.  Through a proxy the URL (rebuilt from what the policy checked)
goes to the proxy, which connects by name: the proxy is then the point that controls
egress.  One pool manager serves direct connections and one proxy manager each proxy URL
(``https`` targets are tunnelled with CONNECT; a proxy URL's user and password become
``Proxy-Authorization``; ``socks*`` proxies need PySocks, as with requests).  TLS
certificates are checked against the CA bundle from the environment, or certifi's bundle,
the one requests used.

Why not requests: its per-call machinery (preparing the request, merging session
settings, hooks, cookies, building the response) cost ~520 µs of CPU per POST here, against
~250 µs for the same POST through urllib3 (pinned CPU, local consumer); a push delivery of one
message is mostly that POST (docs/performance.md, F14).
"""

from __future__ import annotations

import base64
import os
import ssl
import threading
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import certifi
import urllib3
from urllib3.exceptions import HTTPError, NewConnectionError
from wsnmom.core.outbound_policy import Destination

#: failures of an outbound call: connection, TLS, timeout, protocol, proxy
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (HTTPError, OSError, ValueError)


def is_timeout(exc: BaseException) -> bool:
    """Whether a transport failure is a timeout (connecting or waiting for the answer), as
    opposed to a fast failure such as a refused or reset connection."""
    if isinstance(exc, NewConnectionError):  # urllib3 2 derives it from ConnectTimeoutError
        return False
    return isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError)


class OutboundEnvironment:
    """Proxy and CA-bundle settings of the environment, read once."""

    #: per-host no_proxy decisions kept at most (then they are worked out again)
    MAX_HOSTS = 4096

    def __init__(self, proxies: Mapping[str, str], ca_bundle: str | None) -> None:
        self.proxies = {k: v for k, v in proxies.items() if k != "no"}
        self.no_proxy = proxies.get("no")
        self.ca_bundle = ca_bundle
        self._by_host: dict[tuple[str, str], dict[str, str]] = {}

    @classmethod
    def from_environ(cls) -> OutboundEnvironment:
        """The settings in the process environment now."""
        env = os.environ
        bundle = env.get("REQUESTS_CA_BUNDLE") or env.get("CURL_CA_BUNDLE") or None
        return cls(urllib.request.getproxies(), bundle)

    def proxies_for(self, url: str) -> dict[str, str]:
        """The proxies that apply to ``url`` (empty: connect directly)."""
        if not self.proxies:
            return self.proxies
        parts = urlsplit(url)
        key = (parts.scheme, parts.netloc)
        found = self._by_host.get(key)
        if found is None:
            # requests' no_proxy rules, imported only once a proxy is configured: a
            # gateway start without one does not import requests
            from requests.utils import should_bypass_proxies

            bypass = should_bypass_proxies(url, no_proxy=self.no_proxy)
            found = {} if bypass else self.proxies
            if len(self._by_host) >= self.MAX_HOSTS:
                self._by_host.clear()
            self._by_host[key] = found
        return found

    def proxy_for(self, url: str) -> str | None:
        """The proxy URL to use for ``url``, or None to connect directly."""
        proxies = self.proxies_for(url)
        if not proxies:
            return None
        proxy = proxies.get(urlsplit(url).scheme.lower()) or proxies.get("all")
        if not proxy:
            return None
        return proxy if "://" in proxy else "http://" + proxy


def ca_bundle(environment: OutboundEnvironment) -> str:
    """The CA certificates outbound HTTPS trusts: the environment's bundle (a file or a
    directory), else certifi's."""
    return environment.ca_bundle or certifi.where()


def verifying_context(environment: OutboundEnvironment) -> ssl.SSLContext:
    """A TLS client context checking certificates against :func:`ca_bundle` (the one
    rule for every outbound HTTPS of the gateway)."""
    bundle = ca_bundle(environment)
    if os.path.isdir(bundle):
        return ssl.create_default_context(capath=bundle)
    return ssl.create_default_context(cafile=bundle)


class OutboundConnections:
    """Pooled keep-alive connections for outbound POSTs (thread-safe)."""

    def __init__(self, environment: OutboundEnvironment, *, pool_size: int = 32) -> None:
        self.environment = environment
        bundle = ca_bundle(environment)
        where = "ca_cert_dir" if os.path.isdir(bundle) else "ca_certs"
        #: keyword arguments of every pool: size, TLS verification, no retries
        self.pool_options: dict[str, Any] = {
            "num_pools": pool_size,
            "maxsize": pool_size,
            "retries": False,
            "cert_reqs": "CERT_REQUIRED",
            where: bundle,
        }
        self._direct = urllib3.PoolManager(**self.pool_options)
        self._proxied: dict[str, urllib3.PoolManager] = {}
        self._lock = threading.Lock()

    def post(
        self,
        destination: Destination,
        body: bytes,
        headers: Mapping[str, str],
        *,
        connect_timeout: float,
        read_timeout: float,
    ) -> tuple[int, bytes, str | None]:
        """POST ``body`` to ``destination`` without following redirects; (status, response
        body, its ``Retry-After`` header or None).  Raises one of :data:`TRANSPORT_ERRORS`
        when no answer arrives."""
        timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        url = destination.url
        proxy = self.environment.proxy_for(url)
        if proxy is not None:
            response = self._proxy_manager_for(proxy).urlopen(
                "POST",
                url,
                body=body,
                headers=headers,
                timeout=timeout,
                redirect=False,
                retries=False,
            )
            return response.status, response.data, response.headers.get("Retry-After")
        pool = self._direct.connection_from_host(
            destination.connect_host,
            destination.port,
            destination.scheme,
            pool_kwargs=self._tls_names(destination),
        )
        response = pool.urlopen(
            "POST",
            destination.target,
            body=body,
            headers={**headers, "Host": destination.host_header},
            timeout=timeout,
            redirect=False,
            retries=False,
            assert_same_host=False,
        )
        return response.status, response.data, response.headers.get("Retry-After")

    @staticmethod
    def _tls_names(destination: Destination) -> dict[str, Any] | None:
        """Pool options that make TLS use the destination's name (SNI and the certificate
        check) while the connection goes to its checked address."""
        name = destination.server_hostname
        if destination.scheme != "https" or name is None:
            return None
        return {"server_hostname": name, "assert_hostname": name}

    def close(self) -> None:
        """Close every pooled connection."""
        with self._lock:
            managers = [self._direct, *self._proxied.values()]
        for manager in managers:
            manager.clear()

    def _proxy_manager_for(self, proxy: str) -> urllib3.PoolManager:
        manager = self._proxied.get(proxy)
        if manager is None:
            with self._lock:
                manager = self._proxied.get(proxy)
                if manager is None:
                    manager = self._proxied[proxy] = self._proxy_manager(proxy)
        return manager

    def _proxy_manager(self, proxy: str) -> urllib3.PoolManager:
        parts = urlsplit(proxy)
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else ""
        if parts.scheme.lower().startswith("socks"):
            try:
                from urllib3.contrib.socks import SOCKSProxyManager
            except ImportError:
                raise HTTPError(f"proxy {proxy}: SOCKS needs PySocks installed") from None
            return SOCKSProxyManager(proxy, username=user, password=password, **self.pool_options)
        proxy_headers = {}
        if user:
            token = base64.b64encode(f"{user}:{password}".encode("latin-1")).decode("ascii")
            proxy_headers["Proxy-Authorization"] = "Basic " + token
        return urllib3.ProxyManager(proxy, proxy_headers=proxy_headers, **self.pool_options)


__all__ = [
    "TRANSPORT_ERRORS",
    "OutboundConnections",
    "OutboundEnvironment",
    "ca_bundle",
    "is_timeout",
    "verifying_context",
]
