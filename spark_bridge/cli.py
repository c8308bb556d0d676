"""``wsnmom spark-buffer`` and ``wsnmom spark-tap``: the bridge's long-running and set-up
commands.  Importing this module imports neither pyspark nor the middleware clients."""

from __future__ import annotations

import json
import logging
import signal
import sys
from typing import Any

import click

__all__ = ["install"]


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE", param_hint=what)
        out[key] = rest
    return out


def _selection(topic: str | None, dialect: str | None, namespace: tuple[str, ...]) -> Any:
    from .selection import Selection, SelectionError

    selection = Selection(topic=topic, dialect=dialect, namespaces=_pairs(namespace, "--namespace"))
    try:
        selection.compile()
    except SelectionError as exc:
        raise click.BadParameter(str(exc), param_hint="--topic") from exc
    return selection


@click.command("spark-buffer")
@click.option(
    "--mqtt",
    "url",
    required=True,
    help="MQTT broker URL: mqtt://[user:pass@]host:1883 (mqtts:// for TLS); the MQTT "
    "adapter's options may follow as query arguments (?topic_prefix=wsn).",
)
@click.option(
    "--log",
    "log_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The notification log file to append to (created if missing).",
)
@click.option(
    "--client-id",
    required=True,
    help="MQTT client id: names the persistent session; use the same one on every start.",
)
@click.option(
    "--topic", default=None, help="WS-Topics expression of what to buffer (default: every topic)."
)
@click.option(
    "--dialect",
    default=None,
    help="Dialect of --topic: simple, concrete, full, xpath or a dialect URI.",
)
@click.option(
    "--namespace",
    "-n",
    multiple=True,
    metavar="PREFIX=URI",
    help="Namespace prefix used in --topic (repeatable).",
)
@click.option(
    "--root",
    multiple=True,
    metavar="URI=ROOT",
    help="MQTT topic prefix of a topic namespace: the gateway's MQTT adapter option "
    "namespaces (repeatable).",
)
@click.option(
    "--topic-prefix",
    default=None,
    help="The gateway's MQTT adapter option topic_prefix (levels in front of every topic).",
)
@click.option("--name", default=None, help="Stream name of the log (default: the file name).")
@click.option(
    "--session-expiry",
    default=7 * 24 * 3600,
    show_default=True,
    help="Seconds the broker keeps the session while the buffer is down.",
)
@click.option("--protocol", type=click.Choice(["5", "3.1.1"]), default="5", show_default=True)
@click.option(
    "--keep",
    "keep_seconds",
    type=float,
    default=None,
    help="Delete log records older than this many seconds.",
)
@click.option(
    "--ca-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="CA bundle for mqtts://.",
)
@click.option("--log-level", default="INFO", show_default=True)
def spark_buffer(
    url: str,
    log_path: str,
    client_id: str,
    topic: str | None,
    dialect: str | None,
    namespace: tuple[str, ...],
    root: tuple[str, ...],
    topic_prefix: str | None,
    name: str | None,
    session_expiry: int,
    protocol: str,
    keep_seconds: float | None,
    ca_file: str | None,
    log_level: str,
) -> None:
    """Buffer MQTT notifications in a log that Spark reads with ``wsn_log``.

    Holds a persistent session (QoS 1) and acknowledges each message only after it is
    stored, so nothing published while Spark is not running is lost.  Topics and metadata
    are read as the gateway's MQTT adapter reads them: give it the same namespaces
    (--root) and topic prefix.
    """
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from wsnmom.core.adapter import AdapterError

    from .buffer import BufferSettings, MqttBuffer

    settings = BufferSettings(
        url=url,
        log_path=log_path,
        client_id=client_id,
        selection=_selection(topic, dialect, namespace),
        roots=_pairs(root, "--root"),
        topic_prefix=topic_prefix,
        name=name,
        session_expiry=session_expiry,
        protocol=protocol,
        keep_seconds=keep_seconds,
        ca_file=ca_file,
    )
    try:
        buffer = MqttBuffer(settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    click.echo(
        f"buffering {settings.selection.describe()} from {url} into {log_path} "
        f"(MQTT filters {buffer.filters})",
        err=True,
    )
    try:
        buffer.run()
    except AdapterError as exc:
        raise click.ClickException(str(exc)) from exc
    except (KeyboardInterrupt, SystemExit):
        pass
    click.echo(
        f"stopped: {buffer.appended} appended, {buffer.duplicates} duplicate(s) skipped", err=True
    )


@click.command("spark-tap")
@click.option("--rabbitmq", "url", required=True, help="AMQP URL of the gateway's RabbitMQ.")
@click.option("--topic", default=None, help="WS-Topics expression (default: every topic).")
@click.option("--dialect", default=None)
@click.option("--namespace", "-n", multiple=True, metavar="PREFIX=URI")
@click.option(
    "--exchange",
    multiple=True,
    metavar="URI=EXCHANGE",
    help="The adapter's exchanges option (repeatable).",
)
@click.option(
    "--queue",
    default=None,
    help="Name of the tap's stream queue (default: derived from its bindings).",
)
@click.option("--max-age", default=None, help="Retention, e.g. 7D or 12h (x-max-age).")
@click.option("--max-length-bytes", type=int, default=None)
def spark_tap(
    url: str,
    topic: str | None,
    dialect: str | None,
    namespace: tuple[str, ...],
    exchange: tuple[str, ...],
    queue: str | None,
    max_age: str | None,
    max_length_bytes: int | None,
) -> None:
    """Declare the RabbitMQ stream queue a ``wsn_rabbitmq`` source reads, so that it
    collects from now on; prints its name."""
    from .rabbitmq_tap import ensure_tap

    selection = _selection(topic, dialect, namespace)
    options: dict[str, str] = {"url": url, **selection.to_options()}
    exchanges = _pairs(exchange, "--exchange")
    if exchanges:
        options["exchanges"] = json.dumps(exchanges)
    if queue:
        options["queue"] = queue
    if max_age:
        options["maxAge"] = max_age
    if max_length_bytes:
        options["maxLengthBytes"] = str(max_length_bytes)
    click.echo(ensure_tap(options))


def install(cli: click.Group) -> None:
    """Add the bridge's commands to the ``wsnmom`` command group."""
    cli.add_command(spark_buffer)
    cli.add_command(spark_tap)
