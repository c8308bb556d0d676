"""Per-subscription delivery policy (``core.delivery_policy``, the Subscribe extension
``wsnmom:DeliveryPolicy``) in core, on the real embedded adapter with a recording consumer
port: every invalid value is a SubscribeCreationFailed naming the child and its bound; the
choices are stored with the subscription; a channel follows the subscription's attempts,
backoff, timeout, Retry-After and final statuses.  The same through a running gateway on
every middleware: tests/e2e/test_delivery_policy.py.

The core gateway of these tests (``make_settings``): 3 attempts, 0.05 s first delay, 0.2 s
most, multiplier 2, 1 s timeout."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from wsnmom.core import errors
from wsnmom.core.backoff import Backoff
from wsnmom.core.config import ConfigError, DeliverySettings, RetrySettings, load_settings
from wsnmom.core.delivery_policy import DeliveryChoices, effective, parse, resolve
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.service import BrokerService
from wsnmom.core.unordered import UnorderedChannel

from tests.support.waiting import wait_until

from .conftest import Broker, RecordingOutbound, note, simple, sub_req

C = "http://127.0.0.1:9/consumer"

Children = tuple[tuple[str, str], ...]


def subscribe(service: BrokerService, *children: tuple[str, str], address: str = C) -> str:
    sub = service.subscribe(sub_req(address, topic=simple("t:a"), delivery_policy=children))
    return sub.id


def publish(service: BrokerService, text: str) -> None:
    service.notify([note(f"<m>{text}</m>", simple("t:a"))])


# --------------------------------------------------------------------------- invalid values
INVALID: list[tuple[Children, str]] = [
    ((("MaxAttempts", "0"),), "MaxAttempts: 0 is not 1 to 3 (the gateway's most)"),
    ((("MaxAttempts", "4"),), "MaxAttempts: 4 is not 1 to 3 (the gateway's most)"),
    ((("MaxAttempts", "two"),), "MaxAttempts: 'two' is not a whole number"),
    ((("Backoff", "fibonacci"),), "Backoff: 'fibonacci' is not one of: exponential, linear"),
    ((("InitialDelay", "soon"),), "InitialDelay: not a duration: 'soon'"),
    ((("InitialDelay", "-1"),), "InitialDelay: '-1' is not a duration of 0 or more"),
    ((("InitialDelay", "PT1H"),), "InitialDelay: 3600s is above the gateway's most (0.2s)"),
    ((("MaxDelay", "PT1S"),), "MaxDelay: 1s is above the gateway's most (0.2s)"),
    (
        (("InitialDelay", "0.1"), ("MaxDelay", "0.05")),
        "InitialDelay: 0.1s is above MaxDelay (0.05s)",
    ),
    ((("Timeout", "0"),), "Timeout: 0s is not above 0 and at most 1s"),
    ((("Timeout", "PT2S"),), "Timeout: 2s is not above 0 and at most 1s"),
    ((("RetryAfter", "maybe"),), "RetryAfter: 'maybe' is not true or false"),
    ((("RetryAfterMax", "PT1H"),), "RetryAfterMax: 3600s is above the gateway's most (300s)"),
    ((("FinalStatuses", "404 200"),), "FinalStatuses: 200 is not a failure status (300 to 599)"),
    ((("FinalStatuses", "4o4"),), "FinalStatuses: '4o4' is not an HTTP status (three digits)"),
    ((("FinalStatuses", ""),), "FinalStatuses: no status given"),
    ((("Ordering", "random"),), "Ordering: 'random' is not one of: ordered, unordered"),
    (
        (("Ordering", "unordered"), ("InFlight", "0")),
        "InFlight: 0 is not 1 to 16 (the gateway's most)",
    ),
    (
        (("Ordering", "unordered"), ("InFlight", "17")),
        "InFlight: 17 is not 1 to 16 (the gateway's most)",
    ),
    ((("InFlight", "four"),), "InFlight: 'four' is not a whole number"),
    ((("InFlight", "2"),), "InFlight: only with Ordering unordered"),
    (
        (("Ordering", "ordered"), ("InFlight", "2")),
        "InFlight: only with Ordering unordered",
    ),
    ((("Priority", "high"),), "Priority: not a child of DeliveryPolicy (one of"),
    ((("MaxAttempts", "2"), ("MaxAttempts", "3")), "MaxAttempts: given twice"),
]


@pytest.mark.parametrize(
    ("children", "problem"), INVALID, ids=[f"{i:02d}-{c[0][0]}" for i, (c, _) in enumerate(INVALID)]
)
def test_an_invalid_value_is_a_subscribe_fault_naming_it(
    service: BrokerService, children: Children, problem: str
) -> None:
    with pytest.raises(errors.SubscribeCreationFailed) as caught:
        subscribe(service, *children)
    assert str(caught.value).startswith(f"wsnmom:DeliveryPolicy/{problem}"), str(caught.value)
    assert service.registry.subscriptions == {}  # nothing was made


# ------------------------------------------------------------------- stored and advertised
def test_choices_are_stored_with_the_subscription_and_the_rest_is_the_gateways(
    service: BrokerService,
) -> None:
    sub_id = subscribe(
        service,
        ("MaxAttempts", "2"),
        ("Backoff", "linear"),
        ("InitialDelay", "PT0.1S"),
        ("Timeout", " 0.5 "),
        ("RetryAfter", "true"),
        ("FinalStatuses", "410, 404 404"),
    )
    chosen = DeliveryChoices(
        max_attempts=2,
        backoff="linear",
        initial_delay=0.1,
        timeout=0.5,
        retry_after=True,
        final_statuses=(404, 410),
    )
    assert service.get_subscription(sub_id).delivery_policy == chosen
    stored = service.store.get_subscription(sub_id)
    assert stored is not None and stored.delivery_policy == chosen
    policy = effective(chosen, service.settings.retry)
    assert (policy.max_delay, policy.retry_after_max) == (0.2, 300.0)  # the gateway's
    status = service.operations.subscription(sub_id)
    assert status.delivery_policy == policy


def test_the_policy_document_offers_the_gateways_values_as_defaults_and_bounds(
    service: BrokerService,
) -> None:
    offer = service.policy().delivery_policy
    assert offer.max_attempts == 3 and offer.max_delay == timedelta(seconds=0.2)
    assert offer.timeout == timedelta(seconds=1) and offer.backoffs == ("exponential", "linear")
    assert "DeliveryPolicy" in offer.subscribe_extension
    assert offer.final_statuses == () and offer.retry_after is False


def test_ordering_and_in_flight_are_stored_followed_and_advertised(
    service: BrokerService,
) -> None:
    sub_id = subscribe(service, ("Ordering", "unordered"), ("InFlight", "3"))
    chosen = DeliveryChoices(ordering="unordered", in_flight=3)
    stored = service.store.get_subscription(sub_id)
    assert stored is not None and stored.delivery_policy == chosen
    policy = service.operations.subscription(sub_id).delivery_policy
    assert policy is not None and (policy.ordering, policy.in_flight) == ("unordered", 3)
    channel = service.engine.channel(sub_id)
    assert isinstance(channel, UnorderedChannel) and channel.in_flight == 3
    # without a choice: the gateway's ordering (ordered: one delivery in flight)
    plain = service.subscribe(sub_req(C, topic=simple("t:a"))).id
    assert type(service.engine.channel(plain)).__name__ == "Channel"
    policy = service.operations.subscription(plain).delivery_policy
    assert policy is not None and (policy.ordering, policy.in_flight) == ("ordered", 1)
    offer = service.policy().delivery_policy
    assert (offer.ordering, offer.orderings) == ("ordered", ("ordered", "unordered"))
    assert (offer.in_flight, offer.max_in_flight) == (4, 16)
    assert "InFlight" in offer.subscribe_extension


def test_the_gateways_ordering_and_in_flight_are_the_defaults_and_bounds(
    make_broker: Any,
) -> None:
    b: Broker = make_broker(
        delivery__ordering="unordered", delivery__in_flight=6, delivery__max_in_flight=8
    )
    service = b.service
    assert service is not None
    plain = service.subscribe(sub_req(C, topic=simple("t:a"))).id
    channel = service.engine.channel(plain)
    assert isinstance(channel, UnorderedChannel) and channel.in_flight == 6
    ordered = subscribe(service, ("Ordering", "ordered"))
    assert type(service.engine.channel(ordered)).__name__ == "Channel"
    chosen = subscribe(service, ("InFlight", "8"))  # unordered by the gateway's default
    assert service.engine.channel(chosen).in_flight == 8  # type: ignore[union-attr]
    with pytest.raises(errors.SubscribeCreationFailed, match="InFlight: 9 is not 1 to 8"):
        subscribe(service, ("InFlight", "9"))


def test_unordered_delivery_on_the_embedded_adapter_goes_past_a_stalled_message(
    service: BrokerService, outbound: RecordingOutbound, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    stalled = threading.Event()
    notify = outbound.notify

    def holding(consumer: Any, soap_version: Any, messages: Any, **kw: Any) -> None:
        if any(d.message.payload == b"<m>one</m>" for d in messages):
            stalled.set()
            assert release.wait(10)
        notify(consumer, soap_version, messages, **kw)

    monkeypatch.setattr(outbound, "notify", holding)
    sub_id = subscribe(service, ("Ordering", "unordered"), ("InFlight", "2"))
    publish(service, "one")
    assert stalled.wait(10)
    publish(service, "two")
    [got] = outbound.wait_messages(C, 1)  # while the first one's answer is held
    assert got.message.payload == b"<m>two</m>"
    release.set()
    got2 = outbound.wait_messages(C, 2)
    assert [d.message.payload for d in got2] == [b"<m>two</m>", b"<m>one</m>"]
    channel = service.engine.channel(sub_id)
    assert channel is not None
    wait_until(lambda: channel.status().delivered == 2 and channel.held() == 0, 10)


def test_choices_above_bounds_lowered_since_are_held_to_the_new_bounds() -> None:
    retry = RetrySettings(
        max_attempts=8, max_delay=timedelta(seconds=60), timeout=10.0, final_statuses=[410]
    )
    chosen = parse((("MaxAttempts", "8"), ("MaxDelay", "60"), ("Timeout", "10")), retry)
    lowered = RetrySettings(max_attempts=2, max_delay=timedelta(seconds=5), timeout=1.0)
    policy = effective(chosen, lowered)
    assert (policy.max_attempts, policy.max_delay, policy.timeout) == (2, 5.0, 1.0)
    many = parse((("Ordering", "unordered"), ("InFlight", "16")), retry)
    fewer = DeliverySettings(max_in_flight=4, in_flight=9)
    assert effective(many, retry, fewer).in_flight == 4
    assert effective(DeliveryChoices(ordering="unordered"), retry, fewer).in_flight == 4
    assert effective(None, retry).final_statuses == (410,)


def test_schedules() -> None:
    exponential = Backoff(max_attempts=5, initial_delay=1.0, multiplier=3.0, max_delay=20.0)
    assert [exponential.delay(n) for n in (1, 2, 3, 4)] == [1.0, 3.0, 9.0, 20.0]
    linear = Backoff(max_attempts=5, initial_delay=2.0, max_delay=7.0, linear=True)
    assert [linear.delay(n) for n in (1, 2, 3, 4)] == [2.0, 4.0, 6.0, 7.0]
    # Retry-After replaces the backoff only when honoured, and never beyond its cap
    assert linear.delay(1, retry_after=30.0) == 2.0
    honouring = Backoff(initial_delay=1.0, retry_after_max=10.0)
    assert (honouring.delay(1, 4.0), honouring.delay(1, 30.0), honouring.delay(1)) == (
        4.0,
        10.0,
        1.0,
    )
    assert resolve(DeliveryChoices(final_statuses=(404,)), RetrySettings()).is_final(404)


def test_an_invalid_default_final_status_is_a_configuration_error(tmp_path: Path) -> None:
    environ = {"WSNMOM_RETRY__FINAL_STATUSES": "404,250", "HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"WSNMOM_RETRY__FINAL_STATUSES.*250 is not a failure"):
        load_settings(environ=environ)
    ok = load_settings(environ={"WSNMOM_RETRY__FINAL_STATUSES": "410,404", "HOME": str(tmp_path)})
    assert ok.retry.final_statuses == [404, 410]


# ---------------------------------------------------------------------------- behaviour
def test_max_attempts_two_gives_exactly_two_attempts_then_a_dead_letter(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    outbound.down.add(C)
    sub_id = subscribe(service, ("MaxAttempts", "2"))
    publish(service, "x")
    [letter] = wait_until(service.dead_letters, 10, what="the dead letter")
    assert (letter.reason, letter.attempts, letter.subscription_id) == (
        "retries-exhausted",
        2,
        sub_id,
    )
    assert len(outbound.attempts) == 2  # the dead letter follows the last attempt


def test_a_final_status_goes_straight_to_the_dead_letters_and_delivery_goes_on(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    outbound.answers[C] = DeliveryFailed("HTTP 410", answered=True, status=410)
    sub_id = subscribe(service, ("FinalStatuses", "404 410"))
    publish(service, "gone")
    [letter] = wait_until(service.dead_letters, 10, what="the dead letter")
    assert (letter.reason, letter.attempts, letter.last_error) == ("final-status", 1, "HTTP 410")
    assert len(outbound.attempts) == 1
    # the subscription lives on: the next message is delivered
    del outbound.answers[C]
    publish(service, "next")
    [got] = outbound.wait_messages(C, 1)
    assert got.message.payload == b"<m>next</m>"
    assert service.get_subscription(sub_id).id == sub_id
    assert len(service.dead_letters()) == 1


def test_a_status_not_final_for_this_subscription_is_retried(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    outbound.answers[C] = DeliveryFailed("HTTP 500", answered=True, status=500)
    subscribe(service, ("FinalStatuses", "404"))
    publish(service, "x")
    [letter] = wait_until(service.dead_letters, 10, what="the dead letter")
    assert (letter.reason, letter.attempts) == ("retries-exhausted", 3)


def test_linear_backoff_and_the_timeout_of_each_attempt(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    outbound.down.add(C)
    subscribe(service, ("Backoff", "linear"), ("InitialDelay", "0.06"), ("Timeout", "PT0.5S"))
    publish(service, "x")
    wait_until(service.dead_letters, 10, what="the dead letter")
    times = [a.at for a in outbound.attempts]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.06 and times[2] - times[1] >= 0.12
    assert {a.timeout for a in outbound.attempts} == {0.5}


def test_retry_after_is_honoured_up_to_its_cap(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    # asked to wait 100 s; the cap (0.15 s) applies, with a first delay of 0
    outbound.answers[C] = DeliveryFailed("HTTP 503", answered=True, status=503, retry_after=100)
    subscribe(
        service,
        ("MaxAttempts", "2"),
        ("InitialDelay", "0"),
        ("RetryAfter", "true"),
        ("RetryAfterMax", "PT0.15S"),
    )
    publish(service, "x")
    wait_until(service.dead_letters, 10, what="the dead letter")
    first, second = (a.at for a in outbound.attempts)
    assert second - first >= 0.15


def test_without_a_policy_the_gateways_timeout_applies(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    service.subscribe(sub_req(C, topic=simple("t:a")))
    publish(service, "x")
    outbound.wait_messages(C, 1)
    assert [a.timeout for a in outbound.attempts] == [1.0]


def test_the_policy_survives_a_restart(make_broker: Any, outbound: RecordingOutbound) -> None:
    b: Broker = make_broker()
    assert b.service is not None
    sub_id = subscribe(b.service, ("MaxAttempts", "1"), ("Timeout", "0.25"))
    service = b.restart()
    assert service.get_subscription(sub_id).delivery_policy == DeliveryChoices(
        max_attempts=1, timeout=0.25
    )
    outbound.down.add(C)
    publish(service, "after")
    [letter] = wait_until(service.dead_letters, 10, what="the dead letter")
    assert letter.attempts == 1 and [a.timeout for a in outbound.attempts] == [0.25]


def test_the_gateways_final_statuses_and_retry_after_apply_without_a_policy(
    make_broker: Any, outbound: RecordingOutbound
) -> None:
    b: Broker = make_broker(
        retry__final_statuses=[404],
        retry__honour_retry_after=True,
        retry__retry_after_max=timedelta(seconds=0.15),
    )
    service = b.service
    assert service is not None
    gone, busy = C + "/gone", C + "/busy"
    outbound.answers[gone] = DeliveryFailed("HTTP 404", answered=True, status=404)
    outbound.answers[busy] = DeliveryFailed("HTTP 503", answered=True, status=503, retry_after=9)
    service.subscribe(sub_req(gone, topic=simple("t:a")))
    service.subscribe(sub_req(busy, topic=simple("t:a")))
    publish(service, "x")
    found = wait_until(lambda: len(service.dead_letters()) == 2 and service.dead_letters(), 10)
    reasons = {d.consumer: (d.reason, d.attempts) for d in found}
    assert reasons == {gone: ("final-status", 1), busy: ("retries-exhausted", 3)}
    times = [a.at for a in outbound.attempts if a.address == busy]
    # each retry waited the capped Retry-After (0.15 s), not the 0.05 s first delay
    assert times[1] - times[0] >= 0.15 and times[2] - times[1] >= 0.15
