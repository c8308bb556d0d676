"""What the shell client's commands share: the broker and namespace options, topic
arguments, output formats and error reporting."""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import click
from lxml import etree

from wsnmom.client import DEFAULT_BROKER
from wsnmom.core import addresses
from wsnmom.core.addresses import BROKER_PATH, ResourceKind
from wsnmom.core.model import SoapVersion
from wsnmom.topic_mapping.dialects import CONCRETE, FULL, ONVIF_CONCRETE_SET, SIMPLE, XPATH

if TYPE_CHECKING:
    from wsnmom.client import Credentials, Notification, TopicExpression, WsnClient

# The client (requests, the SOAP codec) is imported by the functions that use it, not
# here: every command's module imports this one, and ``wsnmom --help`` should not pay for
# it (docs/performance.md, "Process start").

F = TypeVar("F", bound=Callable[..., Any])

#: short names accepted by ``--dialect``
DIALECTS = {
    "simple": SIMPLE,
    "concrete": CONCRETE,
    "full": FULL,
    "xpath": XPATH,
    "concreteset": ONVIF_CONCRETE_SET,
}
FORMATS = ("line", "json", "xml")


_CREDENTIALS = "wsnmom.credentials"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta.setdefault(_CREDENTIALS, {})[param.name] = value
    return value


def credential_options(func: F) -> F:
    """``--user``, ``--password``, ``--token`` and ``--wsse`` (kept in the click context,
    read by :func:`credentials`)."""
    for option in (
        click.option(
            "--cert",
            type=click.Path(exists=True, dir_okay=False),
            expose_value=False,
            callback=_remember,
            help="Client certificate (PEM with its key) for a broker that requires mutual TLS.",
        ),
        click.option(
            "--cacert",
            type=click.Path(exists=True),
            expose_value=False,
            callback=_remember,
            help="CA certificates (file or directory) to trust for an HTTPS broker.",
        ),
        click.option(
            "--wsse",
            type=click.Choice(["digest", "text"]),
            expose_value=False,
            callback=_remember,
            help="Send --user/--password as a WS-Security UsernameToken (PasswordDigest or "
            "PasswordText) instead of HTTP Basic.",
        ),
        click.option(
            "--token",
            envvar="WSN_TOKEN",
            metavar="TOKEN",
            expose_value=False,
            callback=_remember,
            help="Bearer token (also $WSN_TOKEN).",
        ),
        click.option(
            "--password",
            envvar="WSN_PASSWORD",
            metavar="PASSWORD",
            expose_value=False,
            callback=_remember,
            help="Password of --user (also $WSN_PASSWORD; asked for when missing).",
        ),
        click.option(
            "--user",
            envvar="WSN_USER",
            metavar="NAME",
            expose_value=False,
            callback=_remember,
            help="User name for HTTP Basic (or --wsse) authentication (also $WSN_USER).",
        ),
    ):
        func = option(func)
    return func


def credentials() -> Credentials | None:
    """The credentials given on the command line, if any (asks for a missing password)."""
    from wsnmom.client import Credentials

    ctx = click.get_current_context(silent=True)
    given: dict[str, Any] = ctx.meta.get(_CREDENTIALS, {}) if ctx is not None else {}
    user, password, token, wsse = (given.get(k) for k in ("user", "password", "token", "wsse"))
    if token:
        if user:
            raise click.UsageError("give --token or --user, not both")
        return Credentials(token=token)
    if user:
        if password is None:
            password = click.prompt(f"Password for {user}", hide_input=True, err=True)
        return Credentials(user, password, wsse=wsse)
    if wsse:
        raise click.UsageError("--wsse needs --user")
    return None


def tls_options() -> dict[str, Any]:
    """``verify`` and ``cert`` for the client from ``--cacert`` and ``--cert``."""
    ctx = click.get_current_context(silent=True)
    given: dict[str, Any] = ctx.meta.get(_CREDENTIALS, {}) if ctx is not None else {}
    return {"verify": given.get("cacert"), "cert": given.get("cert")}


def broker_options(func: F) -> F:
    """``--broker``, ``--ns``, ``--soap11``, ``--timeout`` and the credential options."""
    func = credential_options(func)
    func = click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=30.0,
        show_default=True,
        help="Seconds to wait for each answer.",
    )(func)
    func = click.option("--soap11", is_flag=True, help="Speak SOAP 1.1 (default 1.2).")(func)
    func = click.option(
        "--ns",
        "ns_pairs",
        multiple=True,
        metavar="PREFIX=URI",
        help="Namespace of a topic prefix (repeatable). Topics may also be written {URI}path.",
    )(func)
    func = click.option(
        "--broker",
        envvar="WSNMOM_BROKER",
        default=DEFAULT_BROKER,
        show_default=True,
        metavar="URL",
        callback=_http_url,
        help="The broker's NotificationBroker endpoint (also $WSNMOM_BROKER).",
    )(func)
    return func


def _http_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``value`` when it is an http(s) URL with a host (a usage error otherwise)."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - a port that is no number raises ValueError
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not an http(s) URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter(f"{value!r} is not an http(s) URL")
    return value


def make_client(broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float) -> WsnClient:
    """A client for the common options."""
    from wsnmom.client import WsnClient

    return WsnClient(
        broker,
        namespaces=namespaces(ns_pairs),
        soap_version=SoapVersion.SOAP11 if soap11 else SoapVersion.SOAP12,
        timeout=timeout,
        credentials=credentials(),
        **tls_options(),
    )


def namespaces(pairs: tuple[str, ...]) -> dict[str, str]:
    """``PREFIX=URI`` pairs as a mapping (a usage error for anything else)."""
    out: dict[str, str] = {}
    for pair in pairs:
        prefix, sep, uri = pair.partition("=")
        if not sep or not prefix or not uri:
            raise click.BadParameter(f"{pair!r} is not PREFIX=URI", param_hint="--ns")
        out[prefix] = uri
    return out


def dialect_option(func: F) -> F:
    """``--dialect``."""
    return click.option(
        "--dialect",
        metavar="NAME|URI",
        help="Topic expression dialect: simple, concrete, full, xpath, concreteset or a URI "
        "(default: chosen from the expression).",
    )(func)


def topic_expression(
    text: str | None, dialect: str | None, ns: Mapping[str, str]
) -> TopicExpression | None:
    """A TOPIC argument as an expression (None stays None)."""
    from wsnmom.client import TopicExpression

    if text is None:
        return None
    uri = DIALECTS.get(dialect.lower(), dialect) if dialect else None
    return TopicExpression.parse(text, ns, uri)


def format_option(func: F) -> F:
    """``--format``."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="line",
        show_default=True,
        help="line: TOPIC PAYLOAD on one line; json: one JSON object per line; "
        "xml: the payload, indented.",
    )(func)


def render(notification: Notification, fmt: str) -> str:
    """One notification as printed by ``subscribe --print`` and ``pull``."""
    from wsnmom.client.model import tidy_xml

    topic = str(notification.topic) if notification.topic is not None else "-"
    if notification.is_native and notification.payload.get("encoding") != "base64":
        text = notification.data.decode("utf-8")
    else:
        text = tidy_xml(notification.payload).decode("utf-8")
    if fmt == "json":
        producer = notification.producer_reference
        expression = notification.topic
        concrete = _concrete(expression) if expression is not None else None
        return json.dumps(
            {
                "message_id": notification.message_id,
                "timestamp": notification.published,
                "topic": topic if expression is not None else None,
                "namespace": concrete[0] if concrete else None,
                "path": concrete[1] if concrete else None,
                "dialect": expression.effective_dialect if expression else None,
                "payload": text,
                "content_type": notification.content_type,
                "producer": producer.address if producer is not None else None,
                "subscription": notification.subscription_address,
                "headers": notification.app_headers,
                "soap_headers": {
                    etree.QName(h).text: (h.text or "").strip() or tidy_xml(h).decode("utf-8")
                    for h in notification.headers
                },
                "raw": notification.raw,
            },
            ensure_ascii=False,
        )
    if fmt == "xml":
        if notification.is_native:
            return text
        pretty = etree.tostring(
            etree.fromstring(tidy_xml(notification.payload)), pretty_print=True, encoding="unicode"
        )
        return pretty.rstrip("\n")
    return f"{topic} {' '.join(text.split()) if not notification.is_native else text}"


def _concrete(expression: TopicExpression) -> tuple[str, str] | None:
    """(namespace URI, path) of a topic that names one concrete topic, else None."""
    text = str(expression)
    if not text.startswith("{") or "}" not in text:
        return None
    namespace, _, path = text[1:].partition("}")
    if any(c in path for c in "*|"):
        return None
    return namespace, path


def progress(message: str) -> None:
    """A progress line on stderr (rewritten in place on a terminal)."""
    if sys.stderr.isatty():
        click.echo(f"\r{message}", err=True, nl=False)
    else:
        click.echo(message, err=True)


def progress_done() -> None:
    """End a progress line."""
    if sys.stderr.isatty():
        click.echo("", err=True)


class LiveCount:
    """``received N notification(s)`` on stderr while notifications are printed to a file
    or a pipe: nobody would see them arrive otherwise.  Rewritten in place at most every
    ``every`` seconds, and only when stderr is a terminal and stdout is not (on a terminal
    the notifications themselves show the progress; a script wants no progress lines)."""

    def __init__(
        self,
        *,
        enabled: bool | None = None,
        every: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if enabled is None:
            enabled = sys.stderr.isatty() and not sys.stdout.isatty()
        self.enabled = enabled
        self.every = every
        self.count = 0
        self._clock = clock
        self._shown = -1
        self._last = float("-inf")

    def add(self, n: int = 1) -> None:
        """Count ``n`` more; redraw when it is time."""
        self.count += n
        now = self._clock()
        if self.enabled and now - self._last >= self.every:
            self._draw()
            self._last = now

    def _draw(self) -> None:
        click.echo(f"\rreceived {self.count} notification(s)", err=True, nl=False)
        self._shown = self.count

    def close(self) -> None:
        """Show the final count and end the line (when anything was drawn)."""
        if self.enabled and self._shown >= 0:
            if self._shown != self.count:
                self._draw()
            click.echo("", err=True)


@contextmanager
def reporting() -> Iterator[None]:
    """Turn client errors into one-line messages and exit status 1."""
    from wsnmom.client import AuthenticationFailed, ClientError, TransportError, WsnFault

    try:
        yield
    except AuthenticationFailed as exc:
        raise click.ClickException(
            "the broker wants credentials, or refused the ones given (not authenticated): "
            "give --user and --password, or --token"
        ) from exc
    except WsnFault as exc:
        raise click.ClickException(f"the broker refused: {exc}") from exc
    except TransportError as exc:
        raise click.ClickException(str(exc)) from exc
    except ClientError as exc:
        raise click.ClickException(f"SOAP fault: {exc}") from exc
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def reported(func: F) -> F:
    """Decorator form of :func:`reporting`."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with reporting():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def base_url(broker: str) -> str:
    """The gateway's base URL from its broker endpoint (``.../wsn/broker`` removed)."""
    url = broker.split("?", 1)[0].rstrip("/")
    if url.endswith(BROKER_PATH):
        return url[: -len(BROKER_PATH)]
    return url


def resource_address(broker: str, kind: ResourceKind, id_or_address: str) -> str:
    """A resource address from an id (``.../wsn/<kind>/<id>`` at the broker) or itself."""
    if "://" in id_or_address:
        return id_or_address
    return addresses.resource_address(base_url(broker), kind, id_or_address)
