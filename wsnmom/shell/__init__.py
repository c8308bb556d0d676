"""The shell client: ``wsnmom notify``, ``subscribe``, ``pull``, ``subscriptions`` and
``check``, built on :mod:`wsnmom.client` (they work against any WS-N broker; ``subscriptions
list`` needs a wsnmom gateway)."""

from __future__ import annotations

import click

from .check import check_command
from .publish import notify_command
from .receive import pull_command, subscribe_command
from .subscriptions import subscriptions

__all__ = ["install"]


def install(group: click.Group) -> None:
    """Add the shell client's commands to the ``wsnmom`` command group."""
    for command in (notify_command, subscribe_command, pull_command, subscriptions, check_command):
        group.add_command(command)
