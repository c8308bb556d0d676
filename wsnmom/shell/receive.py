"""``wsnmom subscribe`` and ``wsnmom pull``: receive notifications in the shell.

``subscribe --print`` runs a consumer endpoint on this machine (or, with ``--pull``, a pull
point at the broker), subscribes it and prints each notification as it arrives, renewing
the subscription before it expires, until Ctrl-C (or ``--count`` / ``--wait``); then it
unsubscribes (and destroys the pull point).  Without ``--print`` it subscribes the
``--consumer`` address given and prints the subscription's address.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING

import click
import isodate

from wsnmom.core.addresses import ResourceKind

from .common import (
    LiveCount,
    broker_options,
    dialect_option,
    format_option,
    make_client,
    progress,
    progress_done,
    render,
    reporting,
    resource_address,
    topic_expression,
)

if TYPE_CHECKING:
    from wsnmom.client import Notification, NotificationConsumer, PullPoint, Subscription, WsnClient

#: how often a pull point is read while following it
DEFAULT_INTERVAL = 1.0


def _duration(value: str) -> timedelta:
    try:
        parsed = isodate.parse_duration(value)
    except (isodate.ISO8601Error, ValueError):
        try:
            parsed = timedelta(seconds=float(value))
        except ValueError:
            raise click.BadParameter(f"{value!r} is neither seconds nor an xsd:duration") from None
    if not isinstance(parsed, timedelta) or parsed <= timedelta(0):
        raise click.BadParameter(f"{value!r} is not a positive duration")
    return parsed


def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


class _Limits:
    """``--count`` and ``--wait``: when to stop printing."""

    def __init__(self, count: int | None, timeout: float | None) -> None:
        self.count = count
        self.deadline = time.monotonic() + timeout if timeout is not None else None
        self.received = 0

    def done(self) -> bool:
        if self.count is not None and self.received >= self.count:
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def wait(self, at_most: float) -> float:
        if self.deadline is None:
            return at_most
        return max(0.0, min(at_most, self.deadline - time.monotonic()))


def _print(
    notifications: Iterator[Notification], fmt: str, limits: _Limits, live: LiveCount
) -> None:
    for n in notifications:
        click.echo(render(n, fmt))
        limits.received += 1
        live.add()
        if limits.done():
            return


def _renew_if_due(sub: Subscription, lifetime: timedelta, due: list[float]) -> None:
    if time.monotonic() >= due[0]:
        sub.renew(lifetime)
        due[0] = time.monotonic() + lifetime.total_seconds() / 2


@click.command("subscribe")
@click.argument("topic", required=False)
@click.option("--print", "print_", is_flag=True, help="Receive here and print notifications.")
@click.option("--pull", is_flag=True, help="With --print: receive through a pull point.")
@click.option("--consumer", metavar="URL", help="Without --print: the consumer to subscribe.")
@click.option("--message-content", metavar="XPATH", help="Filter on the payload (XPath 1.0).")
@click.option("--raw", is_flag=True, help="Ask for raw delivery (UseRaw).")
@click.option(
    "--lifetime",
    default="PT5M",
    show_default=True,
    help="Initial termination time (xsd:duration or seconds); --print renews at half of it.",
)
@click.option(
    "--listen",
    default="127.0.0.1:0",
    show_default=True,
    metavar="HOST:PORT",
    help="Where the --print consumer listens (port 0: any free port).",
)
@click.option("--advertise", metavar="URL", help="Consumer address to give the broker.")
@click.option("-C", "--count", type=click.IntRange(min=1), help="Exit after COUNT.")
@click.option("-W", "--wait", type=float, metavar="SECONDS", help="Exit after SECONDS.")
@click.option(
    "--interval", type=float, default=DEFAULT_INTERVAL, show_default=True, help="Pull period."
)
@format_option
@dialect_option
@broker_options
def subscribe_command(
    topic: str | None,
    print_: bool,
    pull: bool,
    consumer: str | None,
    message_content: str | None,
    raw: bool,
    lifetime: str,
    listen: str,
    advertise: str | None,
    count: int | None,
    wait: float | None,
    interval: float,
    fmt: str,
    dialect: str | None,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Subscribe to TOPIC (every topic when omitted).

    \b
    wsnmom subscribe --ns t=urn:example --print 't:sensors//*'
    wsnmom subscribe --print --pull '{urn:example}alarms'
    wsnmom subscribe --consumer http://host:9000/in '{urn:example}alarms'
    """
    from wsnmom.client import NotificationConsumer

    life = _duration(lifetime)
    if pull and not print_:
        raise click.UsageError("--pull needs --print")
    if not print_ and consumer is None:
        raise click.UsageError("give --consumer URL, or --print to receive here")
    if print_ and consumer is not None:
        raise click.UsageError("--consumer and --print exclude each other")
    with reporting(), make_client(broker, ns_pairs, soap11, timeout) as client:
        expr = topic_expression(topic, dialect, client.namespaces)

        def subscribe(target: object) -> Subscription:
            return client.subscribe(
                target,
                expr,
                message_content=message_content,
                use_raw=raw,
                initial_termination_time=life,
            )

        if not print_:
            sub = subscribe(consumer)
            click.echo(sub.address)
            ends = sub.termination_time.isoformat() if sub.termination_time else "never"
            click.echo(f"subscribed {consumer} (id {sub.id}, ends {ends})", err=True)
            return
        _stop_on_sigterm()
        limits = _Limits(count, wait)
        live = LiveCount()
        if pull:
            _print_pulled(client, subscribe, life, limits, fmt, interval, live)
        else:
            host, _, port = listen.rpartition(":")
            if not host or not port.isdigit():
                raise click.BadParameter(f"{listen!r} is not HOST:PORT", param_hint="--listen")
            if host.strip("[]") in ("0.0.0.0", "::") and advertise is None:
                raise click.UsageError(
                    f"listening on {host} (every interface): give --advertise URL, the "
                    "address the broker reaches this consumer at"
                )
            with NotificationConsumer(host, int(port), advertised_address=advertise) as inbox:
                _print_pushed(inbox, subscribe, life, limits, fmt, live)
        live.close()
        click.echo(f"received {limits.received} notification(s)", err=True)


def _print_pushed(
    inbox: NotificationConsumer,
    subscribe: Callable[[object], Subscription],
    life: timedelta,
    limits: _Limits,
    fmt: str,
    live: LiveCount,
) -> None:
    sub = subscribe(inbox)
    click.echo(f"listening at {inbox.address} (subscription {sub.address})", err=True)
    due = [time.monotonic() + life.total_seconds() / 2]
    try:
        while not limits.done():
            _renew_if_due(sub, life, due)
            _print(inbox.notifications(timeout=limits.wait(0.5)), fmt, limits, live)
    except KeyboardInterrupt:
        pass
    finally:
        _end(sub.unsubscribe, "unsubscribed")


def _print_pulled(
    client: WsnClient,
    subscribe: Callable[[object], Subscription],
    life: timedelta,
    limits: _Limits,
    fmt: str,
    interval: float,
    live: LiveCount,
) -> None:
    pp = client.create_pull_point()
    try:
        sub = subscribe(pp)
    except BaseException:
        _end(pp.destroy, "destroyed the pull point")
        raise
    click.echo(f"pulling from {pp.address} (subscription {sub.address})", err=True)
    due = [time.monotonic() + life.total_seconds() / 2]
    try:
        while not limits.done():
            _renew_if_due(sub, life, due)
            left = None if limits.count is None else limits.count - limits.received
            got = pp.get_messages(left)
            _print(iter(got), fmt, limits, live)
            if not got and not limits.done():
                time.sleep(limits.wait(interval))
    except KeyboardInterrupt:
        pass
    finally:
        _end(sub.unsubscribe, "unsubscribed")
        _end(pp.destroy, "destroyed the pull point")


def _end(action: Callable[[], None], done: str) -> None:
    from wsnmom.client import ClientError

    try:
        action()
    except (ClientError, KeyboardInterrupt) as exc:
        click.echo(f"could not clean up ({exc})", err=True)
    else:
        click.echo(done, err=True)


@click.command("pull")
@click.argument("pull_point", metavar="ADDRESS|ID")
@click.option(
    "-n",
    "--max",
    "maximum",
    type=click.IntRange(min=1),
    help="At most this many (default: every notification waiting).",
)
@click.option("--follow", is_flag=True, help="Keep pulling until Ctrl-C.")
@click.option(
    "--interval", type=float, default=DEFAULT_INTERVAL, show_default=True, help="Pull period."
)
@click.option("--destroy", is_flag=True, help="Destroy the pull point afterwards.")
@format_option
@broker_options
def pull_command(
    pull_point: str,
    maximum: int | None,
    follow: bool,
    interval: float,
    destroy: bool,
    fmt: str,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Take the notifications waiting in a pull point (GetMessages) and print them: all of
    them (in as many GetMessages as the broker needs, with progress on stderr), at most
    --max, or with --follow those that keep arriving until Ctrl-C."""
    address = resource_address(broker, ResourceKind.PULL_POINT, pull_point)
    total = 0
    batches = 0
    started = time.monotonic()
    live = LiveCount() if follow else LiveCount(enabled=False)
    with reporting(), make_client(broker, ns_pairs, soap11, timeout) as client:
        pp: PullPoint = client.pull_point(address)
        if follow:
            _stop_on_sigterm()
        try:
            while maximum is None or total < maximum:
                got = pp.get_messages(None if maximum is None else maximum - total)
                for n in got:
                    click.echo(render(n, fmt))
                total += len(got)
                live.add(len(got))
                if got:
                    batches += 1
                    if batches > 1 and not follow:
                        progress(f"pulled {total} notification(s)")
                elif follow:
                    time.sleep(interval)
                else:
                    break  # drained
        except KeyboardInterrupt:
            pass
        live.close()
        if batches > 1 and not follow:
            progress_done()
        elapsed = time.monotonic() - started
        click.echo(f"{total} notification(s) in {elapsed:.2f}s", err=True)
        if destroy:
            pp.destroy()
            click.echo("destroyed the pull point", err=True)
