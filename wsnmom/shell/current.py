"""``wsnmom current TOPIC``: the last notification published on a topic
(GetCurrentMessage), printed as ``subscribe --print`` prints one."""

from __future__ import annotations

import click

from .common import (
    broker_options,
    dialect_option,
    format_option,
    make_client,
    render,
    reporting,
    topic_expression,
)

__all__ = ["current_command"]


@click.command("current")
@click.argument("topic")
@format_option
@dialect_option
@broker_options
def current_command(
    topic: str,
    fmt: str,
    dialect: str | None,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Print the last notification published on TOPIC (GetCurrentMessage; a concrete
    topic). Exits 1 when there is none (NoCurrentMessageOnTopicFault)."""
    with reporting(), make_client(broker, ns_pairs, soap11, timeout) as client:
        expression = topic_expression(topic, dialect, client.namespaces)
        assert expression is not None
        click.echo(render(client.get_current_message(expression), fmt))
