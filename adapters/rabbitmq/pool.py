"""The pool of consuming connections and the subscriptions assigned to them.

One consuming connection to start with (``primary``, which also runs the current-message
tap); another one is opened whenever every open one carries ``consumers_per_connection``
subscriptions (lowered to fit the channel limit the broker negotiated: each subscription
uses up to two channels), so the number of subscriptions is not bounded by the channel
limit of one connection.  Each subscription stays on the connection it was given.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable

import pika
from wsnmom.core.adapter import AdapterUnavailable, SubscriptionSpec

from ._link import Link, describe
from .options import RabbitMQOptions
from .subscription import RabbitMQSubscription

log = logging.getLogger("wsnmom.adapters.rabbitmq")


class ConsumerPool:
    """Consuming connections (``links``, the first is ``primary``), the subscriptions
    of this process (``subs``, by name) and how many each connection carries."""

    def __init__(
        self,
        parameters: pika.URLParameters,
        opts: RabbitMQOptions,
        on_connected: Callable[[Link], Awaitable[None]],
        on_lost: Callable[[Link, BaseException | None], None],
    ) -> None:
        self.parameters = parameters
        self.opts = opts
        self._on_connected = on_connected
        self._on_lost = on_lost
        #: guards ``subs``, ``links`` and ``load``
        self.lock = threading.Lock()
        #: serialises opening further consuming connections
        self._pool_lock = threading.Lock()
        self.closed = False
        self.subs: dict[str, RabbitMQSubscription] = {}
        self.primary = self._link("consumer")
        self.links: list[Link] = [self.primary]
        #: subscriptions assigned to each consuming connection, by link name
        self.load: dict[str, int] = {self.primary.name: 0}

    def _link(self, name: str) -> Link:
        return Link(
            name,
            self.parameters,
            self._on_connected,
            self._on_lost,
            max_delay=self.opts.reconnect_max_delay,
            declare_channels=self.opts.declare_channels,
        )

    def snapshot(self) -> list[Link]:
        """The consuming connections open now."""
        with self.lock:
            return list(self.links)

    def all_up(self) -> bool:
        """Every consuming connection is connected."""
        return all(link.is_up for link in self.snapshot())

    def subscriptions_on(self, link: Link) -> list[RabbitMQSubscription]:
        """The live subscriptions assigned to ``link``."""
        with self.lock:
            return [s for s in self.subs.values() if not s.deleted and s.link is link]

    def find(self, name: str) -> RabbitMQSubscription | None:
        """The subscription called ``name`` in this process, if any."""
        with self.lock:
            return self.subs.get(name)

    def subscription(
        self,
        spec: SubscriptionSpec,
        make: Callable[[SubscriptionSpec, Link], RabbitMQSubscription],
    ) -> RabbitMQSubscription:
        """The live subscription called ``spec.name`` with ``spec`` as its spec, made by
        ``make`` on a connection with room for it when there is none."""
        with self.lock:
            sub = self.subs.get(spec.name)
            if sub is not None and not sub.deleted:
                sub.spec = spec
                return sub
        link = self.reserve()
        with self.lock:
            sub = self.subs.get(spec.name)
            if sub is not None and not sub.deleted:  # created concurrently
                self.load[link.name] -= 1
                sub.spec = spec
            else:
                sub = make(spec, link)
                self.subs[spec.name] = sub
        return sub

    def forget(self, sub: RabbitMQSubscription) -> None:
        """``sub`` was deleted: its connection has room again."""
        with self.lock:
            if self.subs.get(sub.name) is sub:
                del self.subs[sub.name]
                self.load[sub.link.name] -= 1

    def capacity(self) -> int:
        """Subscriptions per consuming connection: the option, lowered so that a
        subscription's two channels (consumer, puller) plus the declaration and tap
        channels fit the channel limit negotiated with the broker."""
        per = self.opts.consumers_per_connection
        conn = self.primary.connection
        channel_max = int(getattr(getattr(conn, "params", None), "channel_max", 0) or 0)
        if channel_max > 0:
            reserved = 2 + self.opts.declare_channels
            per = min(per, max(1, (channel_max - reserved) // 2))
        return per

    def reserve(self) -> Link:
        """A consuming connection with room for one more subscription (counted as taken);
        opens another connection when all are full."""
        per = self.capacity()
        with self._pool_lock:
            with self.lock:
                for link in self.links:
                    if self.load[link.name] < per:
                        self.load[link.name] += 1
                        return link
                name = f"consumer-{len(self.links)}"
            if self.closed:
                raise AdapterUnavailable("the RabbitMQ adapter is closed")
            link = self._link(name)
            if not link.start(self.opts.operation_timeout):
                error = link.last_error
                link.close()
                raise AdapterUnavailable(
                    f"cannot open another consuming connection: {describe(error)}"
                )
            log.info("opened consuming connection %s (%d subscriptions each)", name, per)
            with self.lock:
                self.links.append(link)
                self.load[name] = 1
            return link

    def close(self) -> None:
        """Close every consuming connection."""
        self.closed = True
        for link in self.snapshot():
            link.close()
