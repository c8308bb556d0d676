"""Upstream subscriptions: relay remote NotificationProducers into the middleware.

Each upstream (``[[upstream]]`` in the configuration, or ``wsnmom upstream add`` at run
time, kept in the store) names a remote NotificationProducer or broker, a topic expression
and the credentials to use there.  :class:`UpstreamRelay` holds one subscription at each
(push mode: the producer sends Notify to the gateway), with a consumer address of the
gateway's own, ``<base>/wsn/upstream/<name>.<key>``, where ``<key>`` is new and random for
every subscription made.  Each Notify received there is published into the middleware as
if a publisher had sent it to the broker (same checks, same loop marker: a notification
that went through this gateway before is dropped, ``core.loops``), keeping the producer's
topic and prefixes; with ``namespace`` set, the topic's prefix is bound to that namespace
instead of the producer's.  In pull mode (``mode = "pull"``) the consumer is a pull point
the gateway creates at the producer, emptied with GetMessages on every pass.  In ONVIF pull
mode (``mode = "onvif-pull"``, ``url`` a device's event service) the subscription is an
ONVIF pull-point subscription (CreatePullPointSubscription), emptied with PullMessages
(``Timeout`` zero) on every pass and renewed with WS-N's Renew.

Lifetime, on a background thread (one pass a second and on every change):

* subscribe when there is no subscription (asking for ``lifetime``);
* renew when a third of the lifetime is left, and at least every ``check_interval``,
  which is how a producer that restarted and forgot the subscription is noticed;
* a fault to Renew (the producer no longer knows the subscription) or an expired
  subscription: subscribe again; an unreachable producer: retry with exponential backoff
  up to ``max_backoff`` (the subscription is kept, it may still be alive);
* a Notify to the key of an earlier subscription is refused (ResourceUnknownFault): an old
  subscription the producer still holds delivers nothing twice;
* with several instances on one store only the cluster leader holds the subscriptions;
  the others report ``standby``.  The leader records the consumer key of each
  subscription it makes in the store (any instance behind the public URL takes its
  Notify) under the leadership epoch its pass began with (``Coordination.epoch``): a
  leader deposed while its Subscribe was in flight (stopped, its lock's connection
  ended, another instance leading) has that write refused, and unsubscribes what it
  made; else its key would replace the new leader's, and every instance but the new
  leader would refuse the new subscription's Notify.

What a push producer sent while nobody was subscribed (the producer restarted, or the
gateway was down) is lost: docs/federation.md.

What the relay knows of one upstream, and how it is shown: :mod:`wsnmom.upstream_held`;
what a notification from an upstream becomes before it is published:
:mod:`wsnmom.upstream_messages`.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from wsnmom.core import errors, metrics
from wsnmom.core.addresses import upstream_address
from wsnmom.core.config import (
    ConfigError,
    UpstreamSettings,
    check_upstreams,
    upstream_from_json,
    upstream_to_json,
)
from wsnmom.core.coordination import SINGLE_EPOCH
from wsnmom.core.model import InboundNotification
from wsnmom.core.periodic import PeriodicTask
from wsnmom.core.ports import BrokerPort
from wsnmom.core.store import Deposed, Store
from wsnmom.upstream_held import PULL_BATCH, HeldUpstream, dialect_uri
from wsnmom.upstream_messages import from_pull_point, renamespace

if TYPE_CHECKING:
    from wsnmom.client import PullPoint, Subscription, WsnClient

# The WS-N client (and requests under it) is imported by the methods that talk to a
# producer: a gateway without upstreams never needs it, and every start would pay for it
# (docs/performance.md, "Process start").

__all__ = ["UpstreamRelay"]

log = logging.getLogger(__name__)

#: the first wait after a failure (seconds); it doubles up to ``max_backoff``
FIRST_BACKOFF = 1.0
#: seconds one call to a producer may take
CALL_TIMEOUT = 10.0
#: listen addresses that are no address a producer can send to
WILDCARDS = frozenset({"0.0.0.0", "::"})
#: pull mode: GetMessages (or PullMessages) of ``PULL_BATCH`` per pass
PULL_ROUNDS = 10
#: ONVIF pull mode: PullMessages' Timeout (answer at once: the pass must not wait)
PULL_TIMEOUT = timedelta(0)


class UpstreamRelay:
    """Holds the gateway's subscriptions at its upstreams and relays what they send."""

    def __init__(
        self,
        upstreams: Sequence[UpstreamSettings],
        store: Store,
        service: BrokerPort,
        base_url: str,
        *,
        epoch: Callable[[], int | None] = lambda: SINGLE_EPOCH,
        interval: float = 1.0,
    ) -> None:
        self._store = store
        self._service = service
        self._base_url = base_url.rstrip("/")
        #: the leadership epoch this instance holds, None when it does not lead
        self._leadership = epoch
        self._lock = threading.RLock()
        self._held: dict[str, HeldUpstream] = {u.name: HeldUpstream(u, "config") for u in upstreams}
        self._keys: dict[str, HeldUpstream] = {}
        self._warned: set[str] = set()
        self._task = PeriodicTask(
            self.reconcile,
            name="wsnmom-upstreams",
            interval=interval,
            join_timeout=CALL_TIMEOUT + 5,
            min_spacing=0.05,
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Load the upstreams added at run time and start the background thread."""
        self._sync()
        for held in self._held.values():
            held.gauge()
        host = urlsplit(self._base_url).hostname or ""
        if host in WILDCARDS and any(h.spec.mode == "push" for h in self._held.values()):
            log.warning(
                "upstreams in push mode deliver to %s/wsn/upstream/..., which no producer "
                "can reach: set public_url to an address of this gateway they can reach",
                self._base_url,
            )
        self._task.start()

    def _sync(self) -> None:
        """Follow the store's upstreams (added or removed here or on another instance)."""
        stored: dict[str, UpstreamSettings] = {}
        for data in self._store.list_upstreams():
            try:
                spec = upstream_from_json(data)
            except ConfigError as exc:
                log.error("stored upstream %r is unusable, ignored: %s", data.get("name"), exc)
                continue
            stored[spec.name] = spec
        gone: list[HeldUpstream] = []
        with self._lock:
            for name, spec in stored.items():
                if name not in self._held:
                    self._held[name] = HeldUpstream(spec, "store")
                elif self._held[name].source == "config" and name not in self._warned:
                    self._warned.add(name)
                    log.warning("upstream %r is configured and stored: the file wins", name)
            for name, held in list(self._held.items()):
                if held.source == "store" and name not in stored:
                    gone.append(self._held.pop(name))
        for held in gone:
            with held.lock:
                self._release(held, "removed")
            with contextlib.suppress(KeyError):
                metrics.UPSTREAM_UP.remove(held.spec.name)

    def stop(self) -> None:
        """Stop the thread and end every subscription held (best effort)."""
        self._task.stop()
        with self._lock:
            held = list(self._held.values())
        for h in held:
            with h.lock:
                self._release(h, "stopped")

    # -- operators -------------------------------------------------------------------------
    def add(self, spec: UpstreamSettings) -> None:
        """Add an upstream at run time (kept in the store); :raises ConfigError: the name
        is taken."""
        check_upstreams([spec], "upstream")
        with self._lock:
            if spec.name in self._held:
                raise ConfigError(f"there is an upstream {spec.name!r} already")
            self._store.put_upstream(spec.name, upstream_to_json(spec))
            held = self._held[spec.name] = HeldUpstream(spec, "store")
        held.gauge()
        log.info("upstream %s added (%s)", spec.name, spec.url)
        self._task.wake()

    def remove(self, name: str) -> None:
        """Remove an upstream added at run time and end its subscription.

        :raises errors.ResourceUnknown: no such upstream
        :raises ConfigError: it is in the configuration file (remove it there)"""
        with self._lock:
            held = self._held.get(name)
            if held is None:
                raise errors.ResourceUnknown(f"no upstream {name!r}")
            if held.source == "config":
                raise ConfigError(
                    f"upstream {name!r} is in the configuration file: remove it there"
                )
            del self._held[name]
            self._store.delete_upstream(name)
        with held.lock:
            self._release(held, "removed")
        with contextlib.suppress(KeyError):
            metrics.UPSTREAM_UP.remove(name)
        log.info("upstream %s removed", name)

    def states(self) -> list[dict[str, Any]]:
        """What ``/admin``, the admin API and ``wsnmom upstream list`` show, by name."""
        with self._lock:
            held = sorted(self._held.values(), key=lambda h: h.spec.name)
        return [h.state_json() for h in held]

    # -- inbound ---------------------------------------------------------------------------
    def receive(self, key: str, messages: Sequence[InboundNotification]) -> None:
        """A Notify posted to ``/wsn/upstream/<key>``: publish it into the middleware.

        :raises errors.ResourceUnknown: the key is not the current one of any upstream
        (an old subscription, or a guess)"""
        name = key.split(".", 1)[0]
        with self._lock:
            held = self._keys.get(key)
            known = self._held.get(name)
        if held is None and known is not None and self._store.get_meta(_key_meta(name)) == key:
            held = known  # the subscription another instance (the leader) holds
        if held is None:
            if known is not None:
                with self._lock:
                    known.refused += len(messages)
            raise errors.ResourceUnknown("no upstream subscription delivers here (any more)")
        self._publish(held, messages)

    def _publish(self, held: HeldUpstream, messages: Sequence[InboundNotification]) -> None:
        namespace = held.spec.namespace
        if namespace is not None:
            messages = [renamespace(m, namespace) for m in messages]
        self._service.notify(messages)
        with self._lock:  # request threads of several producers' Notify at once
            held.relayed += len(messages)
            held.last_notify = datetime.now(UTC)
        metrics.UPSTREAM_RELAYED.labels(upstream=held.spec.name).inc(len(messages))

    # -- the background pass ---------------------------------------------------------------
    def wake(self) -> None:
        """Look at every upstream soon."""
        self._task.wake()

    def reconcile(self) -> None:
        """One pass: subscribe, renew, resubscribe or release each upstream as needed."""
        try:
            self._sync()
        except Exception:
            log.warning("could not read the stored upstreams", exc_info=True)
        epoch = self._leadership()
        with self._lock:
            held = list(self._held.values())
        for h in held:
            with h.lock:
                if epoch is None:
                    self._release(h, "standby")
                else:
                    self._keep(h, epoch)
                h.gauge()

    def _keep(self, h: HeldUpstream, epoch: int) -> None:
        now = time.monotonic()
        if now < h.next_try:
            return
        expired = h.expires is not None and h.expires <= datetime.now(UTC)
        if h.subscription is not None and expired:
            self._forget(h, "the subscription expired")
        if h.subscription is None:
            self._subscribe(h, epoch)
            return
        lifetime = h.spec.lifetime.total_seconds()
        left = (h.expires - datetime.now(UTC)).total_seconds() if h.expires else lifetime
        check = h.spec.check_interval.total_seconds()
        if left <= lifetime / 3 or now - h.last_renew >= check:
            self._renew(h, epoch)
        if h.subscription is not None and h.spec.mode != "push":
            self._pull(h)

    def _pull(self, h: HeldUpstream) -> None:
        """Pull modes: take what the pull point holds and publish it (at most
        ``PULL_ROUNDS`` GetMessages or PullMessages of ``PULL_BATCH`` per pass)."""
        from wsnmom.client import ClientError, SoapFault
        from wsnmom.client.onvif import OnvifPullSubscription, max_message_limit

        sub, pull_point = h.subscription, h.pull_point
        op = "GetMessages" if pull_point is not None else "PullMessages"
        for _ in range(PULL_ROUNDS):
            try:
                if pull_point is not None:
                    taken = pull_point.get_messages(PULL_BATCH)
                elif isinstance(sub, OnvifPullSubscription):
                    taken = sub.pull_messages(PULL_TIMEOUT, h.pull_limit)
                else:
                    return
            except SoapFault as exc:  # the producer no longer has the pull point
                most = max_message_limit(exc)
                if pull_point is None and most is not None and 0 < most < h.pull_limit:
                    log.info("upstream %s: PullMessages takes %d at most", h.spec.name, most)
                    h.pull_limit = most  # the device's maximum: ask for that from now on
                    continue
                log.warning("upstream %s: %s refused (%s)", h.spec.name, op, exc)
                self._release(h, "retrying")
                h.error = f"{op} refused: {exc}"
                return
            except (ClientError, OSError) as exc:
                self._failed(h, f"{op} failed: {exc}")
                return
            if taken:
                self._publish(h, [from_pull_point(n) for n in taken])
            if len(taken) < (h.pull_limit if pull_point is None else PULL_BATCH):
                return

    def _client(self, spec: UpstreamSettings) -> WsnClient:
        from wsnmom.client import WsnClient

        return WsnClient(
            spec.url,
            namespaces=spec.namespaces,
            timeout=CALL_TIMEOUT,
            user=spec.user,
            password=spec.password,
            token=spec.token,
            wsse=spec.wsse,
        )

    def _subscribe(self, h: HeldUpstream, epoch: int) -> None:
        from wsnmom.client import ClientError, TopicExpression
        from wsnmom.client.onvif import OnvifEvents

        spec = h.spec
        key = f"{spec.name}.{secrets.token_urlsafe(12)}"
        topic = (
            TopicExpression.parse(spec.topic, spec.namespaces, dialect_uri(spec.dialect))
            if spec.topic
            else None
        )
        h.state = "subscribing"
        with self._lock:
            self._keys[key] = h  # the first Notify may come before the answer
        client = self._client(spec)
        pull_point: PullPoint | None = None
        sub: Subscription
        try:
            if spec.mode == "onvif-pull":
                sub = OnvifEvents(client).create_pull_point_subscription(
                    topic,
                    message_content=spec.message_content,
                    message_content_namespaces=spec.message_content_namespaces,
                    initial_termination_time=spec.lifetime,
                )
            else:
                if spec.mode == "pull":
                    pull_point = client.create_pull_point()
                sub = client.subscribe(
                    pull_point if pull_point is not None else upstream_address(self._base_url, key),
                    topic,
                    message_content=spec.message_content,
                    message_content_namespaces=spec.message_content_namespaces,
                    initial_termination_time=spec.lifetime,
                )
        except (ClientError, OSError, ValueError) as exc:
            with self._lock:
                self._keys.pop(key, None)
            if pull_point is not None:
                _end(pull_point, spec.name)
            client.close()
            metrics.UPSTREAM_SUBSCRIBES.labels(upstream=spec.name, outcome="failed").inc()
            self._failed(h, f"Subscribe failed: {exc}")
            return
        with self._lock:
            if h.key is not None:
                self._keys.pop(h.key, None)
        h.key, h.subscription, h.pull_point = key, sub, pull_point
        try:  # any instance behind the public URL may receive its Notify
            self._store.set_meta(_key_meta(spec.name), key, epoch=epoch)
        except Deposed:
            log.warning(
                "upstream %s: this instance no longer leads (epoch %d): the key of the "
                "subscription it just made is not recorded; unsubscribing %s",
                spec.name,
                epoch,
                sub.address,
            )
            self._release(h, "standby")
            return
        except Exception:
            log.warning("upstream %s: could not record the key in the store", spec.name)
        h.expires = sub.termination_time or _after(spec.lifetime)
        h.last_renew = time.monotonic()
        h.subscribes += 1
        h.state, h.error, h.backoff, h.next_try = "subscribed", None, 0.0, 0.0
        metrics.UPSTREAM_SUBSCRIBES.labels(upstream=spec.name, outcome="ok").inc()
        log.info("upstream %s: subscribed at %s (%s)", spec.name, spec.url, sub.address)

    def _renew(self, h: HeldUpstream, epoch: int) -> None:
        from wsnmom.client import ClientError, SoapFault

        assert h.subscription is not None
        try:
            granted = h.subscription.renew(h.spec.lifetime)
        except SoapFault as exc:  # the producer answered: it no longer has it
            log.warning("upstream %s: Renew refused (%s); subscribing again", h.spec.name, exc)
            h.subscription.client.close()
            self._forget(h, f"Renew refused: {exc}")
            self._subscribe(h, epoch)
            return
        except (ClientError, OSError) as exc:  # unreachable: keep it, try again later
            self._failed(h, f"Renew failed: {exc}")
            return
        h.expires = granted or _after(h.spec.lifetime)
        h.last_renew = time.monotonic()
        h.renews += 1
        h.state, h.error, h.backoff, h.next_try = "subscribed", None, 0.0, 0.0

    def _failed(self, h: HeldUpstream, why: str) -> None:
        h.backoff = min(max(FIRST_BACKOFF, h.backoff * 2), h.spec.max_backoff.total_seconds())
        h.next_try = time.monotonic() + h.backoff
        h.state, h.error = "retrying", why
        log.warning("upstream %s: %s; next attempt in %.0f s", h.spec.name, why, h.backoff)

    def _forget(self, h: HeldUpstream, why: str | None) -> None:
        """Drop the subscription (the producer no longer has it): its key stops working."""
        with self._lock:
            if h.key is not None:
                self._keys.pop(h.key, None)
        h.subscription, h.key, h.expires, h.error = None, None, None, why
        h.pull_point = None

    def _release(self, h: HeldUpstream, state: str) -> None:
        """Unsubscribe (best effort) and hold nothing."""
        sub, pull_point = h.subscription, h.pull_point
        self._forget(h, None if state != "standby" else h.error)
        h.state = state
        for resource in (sub, pull_point):
            if resource is not None:
                _end(resource, h.spec.name)
        if sub is not None:
            sub.client.close()


def _end(resource: Subscription | PullPoint, name: str) -> None:
    """Unsubscribe, or destroy a pull point (best effort)."""
    from wsnmom.client import ClientError, PullPoint

    try:
        if isinstance(resource, PullPoint):
            resource.destroy()
        else:
            resource.unsubscribe()
    except (ClientError, OSError) as exc:
        log.info("upstream %s: ending %s failed (%s)", name, resource.address, exc)


def _key_meta(name: str) -> str:
    """The store's meta key holding the current consumer key of upstream ``name``."""
    return f"upstream.{name}.key"


def _after(lifetime: timedelta) -> datetime:
    return datetime.now(UTC) + lifetime
