"""The ``wsnmom`` command line: one click group; each area adds its subcommands here."""

from __future__ import annotations

import click

from wsnmom import __version__


@click.group()
@click.version_option(__version__, prog_name="wsnmom")
def cli() -> None:
    """wsnmom: WS-Notification gateway for RabbitMQ, Kafka and MQTT."""


from wsnmom.topic_mapping.cli import topics  # noqa: E402

cli.add_command(topics)

from wsnmom.serve_command import serve  # noqa: E402

cli.add_command(serve)

from wsnmom.auth_command import auth  # noqa: E402

cli.add_command(auth)

from wsnmom.store_command import store  # noqa: E402

cli.add_command(store)

from wsnmom.shell import install as install_shell_commands  # noqa: E402

install_shell_commands(cli)  # notify, subscribe, pull, subscriptions, check

from wsnmom.spark_bridge.cli import install as install_spark_commands  # noqa: E402

install_spark_commands(cli)  # spark-buffer, spark-tap (their imports are lazy)

from wsnmom.core.plugin_cli import install as install_plugin_commands  # noqa: E402

install_plugin_commands(cli)  # adds `adapters`, `plugins` and plugins' own commands


def main() -> None:
    """Console-script entry point."""
    cli()
