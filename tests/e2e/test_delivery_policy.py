"""Per-subscription delivery policy on every middleware (issue 25, item 2): the Subscribe
policy extension ``wsnmom:DeliveryPolicy`` is honoured on each shape, queue (RabbitMQ,
embedded), log (Kafka on tansu, filelog) and session (MQTT): a subscriber's maximum
attempts, a final status (straight to the dead letters, delivery goes on), exponential
backoff seen in the attempts' times, ``Retry-After``; an invalid value is a Subscribe
fault; the policy document advertises it and the admin API shows it.

The suite gateways (``FAST_ENV``): 3 attempts, 0.2 s first delay, 0.5 s most, multiplier
2, 3 s timeout.  Each test names a dead-letter destination of its own.  Timings are lower
bounds only.  Cost: about 4 s per adapter.
"""

from __future__ import annotations

import uuid

import pytest
import requests
from lxml import etree

from tests.e2e.conftest import Wsn
from tests.fixtures.server import ConsumerServer, Received, RunningServer
from tests.support.dead_letters import letters
from tests.support.soap import WSNMOM
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

WSNMOM_POLICY = "urn:wsnmom:policy:1"


def policy(destination: str, **children: str) -> str:
    """``wsnmom:DeadLetters`` and ``wsnmom:DeliveryPolicy`` with ``children`` (local name
    -> text)."""
    inner = "".join(f"<wsnmom:{k}>{v}</wsnmom:{k}>" for k, v in children.items())
    return (
        f'<wsnmom:DeadLetters xmlns:wsnmom="{WSNMOM}">{destination}</wsnmom:DeadLetters>'
        f'<wsnmom:DeliveryPolicy xmlns:wsnmom="{WSNMOM}">{inner}</wsnmom:DeliveryPolicy>'
    )


def requests_to(consumer: ConsumerServer, path: str) -> list[Received]:
    return [r for r in consumer.notifies() if r.path == path]


@pytest.fixture
def destination() -> str:
    return "p" + uuid.uuid4().hex[:12]


def test_max_attempts_two_gives_two_attempts_then_a_dead_letter(
    wsnmom_server: RunningServer, wsn: Wsn, consumer: ConsumerServer, destination: str
) -> None:
    consumer.mode = "error"  # HTTP 500
    sub = wsn.subscribe(
        consumer.address("/two"), "tns:dp", policy=policy(destination, MaxAttempts="2")
    )
    wsn.notify(("tns:dp", '<n xmlns="urn:n">twice</n>'))
    [letter] = wait_until(lambda: letters(wsnmom_server, destination), 30, what="a dead letter")
    assert (letter["reason"], letter["attempts"], letter["subscription"]) == (
        "retries-exhausted",
        2,
        sub.id,
    )
    assert "500" in letter["last_error"]
    # the dead letter follows the last attempt: the gateway's third one never came
    assert len(requests_to(consumer, "/two")) == 2


def test_a_final_status_goes_straight_to_the_dead_letters_and_delivery_goes_on(
    wsnmom_server: RunningServer, wsn: Wsn, consumer: ConsumerServer, destination: str
) -> None:
    consumer.mode, consumer.error_status = "error", 410
    sub = wsn.subscribe(
        consumer.address("/final"),
        "tns:fs",
        policy=policy(destination, FinalStatuses="404 410"),
    )
    wsn.notify(("tns:fs", '<n xmlns="urn:n">gone</n>'))
    [letter] = wait_until(lambda: letters(wsnmom_server, destination), 30, what="a dead letter")
    assert (letter["reason"], letter["attempts"]) == ("final-status", 1)
    assert "410" in letter["last_error"]
    assert len(requests_to(consumer, "/final")) == 1
    # the subscription lives on: the next message reaches the consumer
    consumer.mode = "ok"
    wsn.notify(("tns:fs", "<sentinel/>"))
    consumer.wait_for_sentinel(sub.address, timeout=30)
    assert len(letters(wsnmom_server, destination)) == 1


def test_exponential_backoff_shows_in_the_attempts_times(
    wsnmom_server: RunningServer, wsn: Wsn, consumer: ConsumerServer, destination: str
) -> None:
    consumer.mode = "error"
    wsn.subscribe(
        consumer.address("/backoff"),
        "tns:bo",
        policy=policy(
            destination,
            MaxAttempts="3",
            Backoff="exponential",
            InitialDelay="PT0.15S",
            MaxDelay="PT0.5S",
        ),
    )
    wsn.notify(("tns:bo", '<n xmlns="urn:n">later</n>'))
    wait_until(lambda: letters(wsnmom_server, destination), 30, what="a dead letter")
    times = [r.at for r in requests_to(consumer, "/backoff")]
    assert len(times) == 3 and times == sorted(times)
    # 0.15 s, then 0.15 * 2 (the gateway's multiplier)
    assert times[1] - times[0] >= 0.15 and times[2] - times[1] >= 0.3, times


def test_retry_after_is_honoured_when_chosen(
    wsnmom_server: RunningServer, wsn: Wsn, consumer: ConsumerServer, destination: str
) -> None:
    consumer.mode, consumer.error_status, consumer.retry_after = "error", 503, "1"
    wsn.subscribe(
        consumer.address("/later"),
        "tns:ra",
        policy=policy(destination, MaxAttempts="2", InitialDelay="0", RetryAfter="true"),
    )
    wsn.notify(("tns:ra", '<n xmlns="urn:n">wait</n>'))
    wait_until(lambda: letters(wsnmom_server, destination), 30, what="a dead letter")
    first, second = (r.at for r in requests_to(consumer, "/later"))
    assert second - first >= 1.0  # the consumer's Retry-After, not the first delay of 0


INVALID = {
    "attempts": ({"MaxAttempts": "4"}, "MaxAttempts: 4 is not 1 to 3"),
    "backoff": ({"Backoff": "random"}, "Backoff: 'random' is not one of"),
    "delay": ({"MaxDelay": "PT1M"}, "MaxDelay: 60s is above the gateway's most (0.5s)"),
    "timeout": ({"Timeout": "PT10S"}, "Timeout: 10s is not above 0 and at most 3s"),
    "retry-after": ({"RetryAfter": "often"}, "RetryAfter: 'often' is not true or false"),
    "statuses": ({"FinalStatuses": "204"}, "FinalStatuses: 204 is not a failure status"),
    "unknown": ({"Priority": "4"}, "Priority: not a child of DeliveryPolicy"),
    "ordering": ({"Ordering": "fifo"}, "Ordering: 'fifo' is not one of: ordered, unordered"),
    "in-flight": (
        {"Ordering": "unordered", "InFlight": "17"},
        "InFlight: 17 is not 1 to 16 (the gateway's most)",
    ),
    "in-flight-ordered": ({"InFlight": "2"}, "InFlight: only with Ordering unordered"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_an_invalid_value_is_a_precise_subscribe_fault(
    wsnmom_server: RunningServer, wsn: Wsn, case: str
) -> None:
    children, problem = INVALID[case]
    answer = wsn.post(
        wsn.broker,
        _subscribe("http://127.0.0.1:9/c", wsn.ns, policy("default", **children)),
    )
    assert answer.fault == "SubscribeCreationFailedFault"
    assert f"wsnmom:DeliveryPolicy/{problem}" in answer.data.decode(), answer.data


def _subscribe(address: str, ns: str, pol: str) -> str:
    from tests.support.soap import subscribe_body

    return subscribe_body(address, "tns:bad", ns=ns, policy=pol)


def test_the_policy_document_advertises_it_and_the_admin_api_shows_it(
    wsnmom_server: RunningServer, wsn: Wsn, consumer: ConsumerServer, destination: str
) -> None:
    doc = etree.fromstring(requests.get(f"{wsnmom_server.base_url}/wsn/policy", timeout=10).content)
    [offer] = doc.findall(f"{{{WSNMOM_POLICY}}}DeliveryPolicy")
    assert offer.findtext(f"{{{WSNMOM_POLICY}}}MaxAttempts") == "3"
    assert offer.findtext(f"{{{WSNMOM_POLICY}}}MaxDelay") == "PT0.5S"
    assert "DeliveryPolicy" in (offer.findtext(f"{{{WSNMOM_POLICY}}}SubscribeExtension") or "")
    assert offer.findtext(f"{{{WSNMOM_POLICY}}}Ordering") == "ordered"
    assert offer.findtext(f"{{{WSNMOM_POLICY}}}MaxInFlight") == "16"
    sub = wsn.subscribe(
        consumer.address("/shown"),
        "tns:sh",
        policy=policy(
            destination, MaxAttempts="1", Backoff="linear", Ordering="unordered", InFlight="3"
        ),
    )
    url = f"{wsnmom_server.base_url}/wsn/admin/api/subscriptions/{sub.id}"
    shown = requests.get(url, timeout=10).json()["delivery_policy"]
    assert (shown["max_attempts"], shown["backoff"], shown["max_delay"]) == (1, "linear", 0.5)
    assert (shown["ordering"], shown["in_flight"]) == ("unordered", 3)
    assert shown["chosen"] == ["backoff", "in_flight", "max_attempts", "ordering"]
    assert shown["summary"].endswith(
        "; unordered, 3 in flight (chosen: backoff, in_flight, max_attempts, ordering)"
    )
    assert shown["summary"].startswith("1 attempt; linear backoff from 0.2 s to 0.5 s")
