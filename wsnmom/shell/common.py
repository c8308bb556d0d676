"""What the shell client's commands share: the broker and namespace options, topic
arguments, output formats and error reporting."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from lxml import etree

from wsnmom.client import (
    CONCRETE,
    DEFAULT_BROKER,
    FULL,
    ONVIF_CONCRETE_SET,
    SIMPLE,
    XPATH,
    ClientError,
    Notification,
    TopicExpression,
    TransportError,
    WsnClient,
    WsnFault,
)
from wsnmom.client.model import tidy_xml
from wsnmom.core import addresses
from wsnmom.core.addresses import BROKER_PATH, ResourceKind
from wsnmom.core.model import SoapVersion

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


def broker_options(func: F) -> F:
    """``--broker``, ``--ns``, ``--soap11`` and ``--timeout``."""
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
        default=DEFAULT_BROKER,
        show_default=True,
        metavar="URL",
        help="The broker's NotificationBroker endpoint.",
    )(func)
    return func


def make_client(broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float) -> WsnClient:
    """A client for the common options."""
    return WsnClient(
        broker,
        namespaces=namespaces(ns_pairs),
        soap_version=SoapVersion.SOAP11 if soap11 else SoapVersion.SOAP12,
        timeout=timeout,
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
    topic = str(notification.topic) if notification.topic is not None else "-"
    if notification.is_native and notification.payload.get("encoding") != "base64":
        text = notification.data.decode("utf-8")
    else:
        text = tidy_xml(notification.payload).decode("utf-8")
    if fmt == "json":
        producer = notification.producer_reference
        return json.dumps(
            {
                "topic": topic if notification.topic is not None else None,
                "dialect": notification.topic.effective_dialect if notification.topic else None,
                "payload": text,
                "content_type": notification.content_type,
                "producer": producer.address if producer is not None else None,
                "subscription": notification.subscription_address,
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


@contextmanager
def reporting() -> Iterator[None]:
    """Turn client errors into one-line messages and exit status 1."""
    try:
        yield
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
