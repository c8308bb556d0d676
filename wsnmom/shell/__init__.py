"""The shell client: ``wsnmom notify``, ``subscribe``, ``pull``, ``current``,
``subscriptions``, ``check``, built on :mod:`wsnmom.client` (they work against any WS-N
broker), and the listings of a wsnmom gateway's admin API (``subscriptions list|purge``,
``pull-points``, ``registrations``, ``topics list``, ``dead-letters``, ``cluster
status``, ``upstream``) and its peeks (``subscriptions|pull-points|dead-letters
peek``: :mod:`.peek`)."""

from __future__ import annotations

import click

from .check import check_command
from .cluster import cluster
from .current import current_command
from .dead_letters import dead_letters
from .listings import pull_points, registrations, topics_list_command
from .peek import dead_letters_peek, pull_points_peek, subscriptions_peek
from .publish import notify_command
from .receive import pull_command, subscribe_command
from .subscriptions import subscriptions
from .upstreams import upstream

__all__ = ["install"]


def install(group: click.Group) -> None:
    """Add the shell client's commands to the ``wsnmom`` command group."""
    subscriptions.add_command(subscriptions_peek)
    pull_points.add_command(pull_points_peek)
    dead_letters.add_command(dead_letters_peek)
    for command in (
        notify_command,
        subscribe_command,
        pull_command,
        current_command,
        subscriptions,
        pull_points,
        registrations,
        dead_letters,
        cluster,
        upstream,
        check_command,
    ):
        group.add_command(command)
    topics = group.commands.get("topics")  # the topic-mapping tools' group, when installed
    if isinstance(topics, click.Group):
        topics.add_command(topics_list_command)
    else:
        group.add_command(click.Group("topics", commands=[topics_list_command]))
