"""The RabbitMQ adapter's options and connection parameters.

:class:`RabbitMQOptions` declares every option once (docs/adapters/rabbitmq.md lists them,
tested against this declaration); :func:`split_url` separates the wsnmom options in a
URL's query from pika's own arguments, and :func:`connection_parameters` builds the
``pika.URLParameters`` both kinds of connection use (heartbeat, TLS, connection name).

The options are documented in the adapter's module docstring (``adapter``) and in
docs/adapters/rabbitmq.md.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika
from wsnmom.core.adapter_options import AdapterOptionError, did_you_mean, option, parse_options
from wsnmom.core.config_values import convert

#: the options ``wsnmom serve`` sets when several instances share the store (the adapter's
#: ``cluster_options``; docs/scale-out.md): pull points read by ``basic.get``, so that any
#: instance answers for them; quorum queues; a 3 s heartbeat, so that the broker sees a
#: stopped instance's connection dead (after 2 to 3 heartbeats) before a 10 s lease
#: expires and makes its successor's consumer the active one
CLUSTER_OPTIONS: Mapping[str, Any] = {"pull": "get", "queue_type": "quorum", "heartbeat": 3}
#: the wsnmom options that may be given as query arguments of the URL
URL_OPTIONS = ("prefetch", "queue_type", "instance", "pull")
#: the query arguments ``pika.URLParameters`` reads (it has a setter for each)
PIKA_URL_ARGUMENTS = tuple(
    name.removeprefix("_set_url_")
    for name in dir(pika.URLParameters)
    if name.startswith("_set_url_")
)
_TLS_KEYS = ("ca_file", "cert_file", "key_file", "verify", "server_hostname")


def _tls(value: Any) -> dict[str, Any] | None:
    """The ``tls`` table, its keys checked and ``verify`` read by the one boolean rule."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a table of {', '.join(_TLS_KEYS)}")
    for key in value:
        if key not in _TLS_KEYS:
            raise ValueError(f"unknown key {key!r}{did_you_mean(str(key), _TLS_KEYS)}")
    tls = dict(value)
    if "verify" in tls:
        tls["verify"] = convert(tls["verify"], bool)
    return tls


@dataclass(frozen=True, slots=True)
class RabbitMQOptions:
    """The adapter's options, declared once (see the module docstring; docs/adapters/
    rabbitmq.md lists them, tested against this declaration)."""

    exchanges: Mapping[str, str] = option(
        default_factory=dict, doc="namespace URI -> exchange name"
    )
    all_exchange: str = option(
        "wsnmom.all", doc="catch-all exchange; the tap exchanges are named after it"
    )
    queue_prefix: str = option("wsnmom.sub.", doc="prefix of subscription queue names")
    queue_type: Literal["classic", "quorum"] = option(
        "classic", doc="`classic` or `quorum` (`quorum` in cluster mode)"
    )
    queue_arguments: Mapping[str, Any] | None = option(
        None, doc="extra arguments for every subscription queue"
    )
    single_active_consumer: bool | None = option(
        None,
        doc="`x-single-active-consumer` on push subscription queues (default: in cluster mode)",
    )
    prefetch: int = option(64, minimum=1, doc="prefetch for consumers when core gives none")
    heartbeat: int = option(
        30, minimum=0, doc="AMQP heartbeat, seconds (0 disables; 3 in cluster mode)"
    )
    tls: Mapping[str, Any] | None = option(
        None,
        parse=_tls,
        doc="`ca_file`, `cert_file`, `key_file`, `verify` (true), `server_hostname`",
    )
    instance: str | None = option(None, doc="name of this instance's tap queue (random)")
    current_message: bool = option(True, doc="run the current-message tap")
    current_tap_max_length: int = option(10000, minimum=0, doc="tap queue length")
    current_tap_expires: float = option(
        3600.0, minimum=0, doc="seconds an unused tap queue survives"
    )
    current_cache_size: int = option(100000, minimum=0, doc="routing keys remembered")
    current_peers: bool = option(True, doc="copy gateway publishes to the other instances' taps")
    report_unrouted: bool = option(
        True, doc="publish `mandatory`: a message no queue takes is reported as unrouted"
    )
    consumers_per_connection: int = option(
        1000, minimum=1, doc="subscriptions per consuming connection"
    )
    declare_channels: int = option(
        4, minimum=1, doc="channels per consuming connection that declare queues at once"
    )
    fail_on_nack: bool = option(False, doc="raise on `basic.nack` instead of `routed=None`")
    prime_queues: bool = option(True, doc="prime new classic subscription queues")
    operation_timeout: float = option(10.0, doc="seconds for declarations and other broker calls")
    reconnect_max_delay: float = option(5.0, doc="longest reconnect backoff, seconds")
    #: how pull points are read: "buffer" (consumed with prefetch into core's pull
    #: buffer) or "get" (``basic.get`` per GetMessages)
    pull: Literal["buffer", "get"] = option(
        "buffer", doc="how pull points are read: `buffer` or `get` (`basic.get`)"
    )

    @classmethod
    def parse(
        cls, options: Mapping[str, Any], query: Iterable[tuple[str, str]] = ()
    ) -> RabbitMQOptions:
        """Build from the URL's query arguments and the options mapping (configuration).

        :raises AdapterOptionError: an unknown option or an unusable value."""
        return parse_options(cls, adapter="RabbitMQ", query=query, options=options)


def split_url(url: str) -> tuple[str, list[tuple[str, str]]]:
    """The URL pika should see (amqp/amqps) and the wsnmom options in its query."""
    parts = urlsplit(url)
    scheme = "amqp" if parts.scheme == "rabbitmq" else parts.scheme
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = [(k, v) for k, v in query if k in URL_OPTIONS]
    theirs = [(k, v) for k, v in query if k not in URL_OPTIONS]
    for key, value in theirs:
        if key not in PIKA_URL_ARGUMENTS:
            raise AdapterOptionError(
                f"unknown RabbitMQ URL argument ?{key}={value}"
                f"{did_you_mean(key, (*URL_OPTIONS, *PIKA_URL_ARGUMENTS))}"
            )
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(theirs), "")), ours


def connection_parameters(url: str, opts: RabbitMQOptions, name: str) -> pika.URLParameters:
    """pika's parameters for ``url`` (as :func:`split_url` gave it) with the options'
    heartbeat and TLS, and ``name`` as the connection name the broker shows."""
    params = pika.URLParameters(url)
    if "heartbeat" not in urlsplit(url).query:
        params.heartbeat = opts.heartbeat
    params.client_properties = {"connection_name": f"wsnmom {name}"}
    if opts.tls is not None:
        params.ssl_options = _ssl_options(params.host, opts.tls)
    elif url.startswith("amqps") and "ssl_options" not in urlsplit(url).query:
        params.ssl_options = _ssl_options(params.host, {})
    return params


def _ssl_options(host: str, tls: Mapping[str, Any]) -> pika.SSLOptions:
    context = ssl.create_default_context(cafile=tls.get("ca_file"))
    if tls.get("cert_file"):
        context.load_cert_chain(tls["cert_file"], tls.get("key_file"))
    if not tls.get("verify", True):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return pika.SSLOptions(context, tls.get("server_hostname") or host)


def safe_url(params: pika.URLParameters) -> str:
    """The broker's address for messages: no credentials."""
    p = params
    return f"{'amqps' if p.ssl_options else 'amqp'}://{p.host}:{p.port}/{p.virtual_host}"
