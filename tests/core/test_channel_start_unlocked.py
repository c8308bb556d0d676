"""A delivery channel starts (a middleware round trip: a RabbitMQ consumer's start) without
the registry lock, so other registry users go on meanwhile (issue 23); and a subscription
destroyed, or a channel closed, while it starts is not left consuming.

The round trip is played by a handle whose next start waits until the test lets it go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from wsnmom.core.model import SubscriptionState
from wsnmom.core.service import BrokerService

from tests.support.threads import in_thread

from .conftest import RecordingOutbound, note, simple, sub_req

VICTIM = "http://127.0.0.1:9/victim"
CONTROL = "http://127.0.0.1:9/control"
OTHER = "http://127.0.0.1:9/other"


class SlowStart:
    """Wraps a subscription handle: its next start waits for ``release``; whether the
    real handle is consuming at the end is ``consuming``."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.entered = threading.Event()
        self.release = threading.Event()
        self.consuming = False
        self._block = True

    def start(self, on_message: Callable[..., Any], prefetch: int) -> None:
        if self._block:
            self._block = False
            self.entered.set()
            assert self.release.wait(30)
        self.real.start(on_message, prefetch=prefetch)
        self.consuming = True

    def stop(self) -> None:
        self.real.stop()
        self.consuming = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def slow_start(service: BrokerService, sub_id: str) -> SlowStart:
    channel = service.engine.channel(sub_id)
    assert channel is not None
    wrapper = SlowStart(channel.handle)
    channel.handle = wrapper  # type: ignore[assignment]
    return wrapper


def paused(service: BrokerService) -> str:
    sub = service.subscribe(sub_req(VICTIM, topic=simple("t:a")))
    service.pause(sub.id)
    return sub.id


def test_other_registry_users_go_on_while_a_resume_starts_a_channel(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    sub_id = paused(service)
    handle = slow_start(service, sub_id)
    resuming, resumed = in_thread(lambda: service.resume(sub_id))
    try:
        assert handle.entered.wait(10)
        # while the start waits for the middleware: a Subscribe (it indexes the new
        # subscription under the registry lock) and a Pause of another subscription
        # answer (before: both waited for the start)
        other, made = in_thread(lambda: service.subscribe(sub_req(OTHER, topic=simple("t:a"))).id)
        other.join(10)
        assert made and isinstance(made[0], str), made
        pausing, done = in_thread(lambda: service.pause(str(made[0])))
        pausing.join(10)
        assert done == [None]
        assert resuming.is_alive()  # the start under way all along
    finally:
        handle.release.set()
    resuming.join(10)
    assert resumed == [None]
    assert service.get_subscription(sub_id).state is SubscriptionState.ACTIVE
    service.notify([note("<m>after</m>", simple("t:a"))])
    assert [d.message.payload for d in outbound.wait_messages(VICTIM, 1)] == [b"<m>after</m>"]


def test_a_subscription_destroyed_while_its_channel_starts_is_not_left_delivering(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    sub_id = paused(service)
    service.subscribe(sub_req(CONTROL, topic=simple("t:a")))
    handle = slow_start(service, sub_id)
    resuming, _ = in_thread(lambda: service.resume(sub_id))
    try:
        assert handle.entered.wait(10)
        unsubscribing, unsubscribed = in_thread(lambda: service.unsubscribe(sub_id))
        # the Unsubscribe either waits for the start or (before) stopped the handle
        # before the start went on; let the start go either way
        unsubscribing.join(1)
    finally:
        handle.release.set()
    unsubscribing.join(10)
    resuming.join(10)
    assert unsubscribed == [None]
    assert not handle.consuming  # before: started after it was stopped
    assert service.engine.channel(sub_id) is None
    assert service.store.get_subscription(sub_id) is None
    service.notify([note("<m>after</m>", simple("t:a"))])
    outbound.wait_messages(CONTROL, 1)  # the sentinel
    assert outbound.payloads_to(VICTIM) == []


def test_a_channel_closed_while_it_starts_ends_stopped(service: BrokerService) -> None:
    """The cluster's thread closes a channel (its shard lost) with no subscription lock:
    the close waits for a start under way, then stops the handle it started."""
    sub_id = paused(service)
    channel = service.engine.channel(sub_id)
    assert channel is not None
    handle = slow_start(service, sub_id)
    starting, started = in_thread(channel.start)
    try:
        assert handle.entered.wait(10)
        closing, closed = in_thread(lambda: service.engine.close_channel(sub_id))
        closing.join(1)
    finally:
        handle.release.set()
    closing.join(10)
    starting.join(10)
    assert started == [None] and closed == [None]
    assert not handle.consuming
    assert not channel.active
