"""Issue 16, finding 1: one anonymous subscription froze the gateway.

Two subscriptions with the MessageContent filter ``re:test(string(.),'^(a+)+$')`` and one
30-byte Notify blocked every request, ``/healthz`` included, for 18.7 s (Python's ``re``
backtracking while holding the GIL).  Now the filter is refused at Subscribe by default,
and where an operator enables the EXSLT regular-expression functions it is evaluated in a
worker process within ``filters.cpu_limit``: the gateway keeps answering and the two
subscriptions are ended with SubscriptionEnd.

Cost: two gateways, about 6 s.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fixtures.server import ConsumerServer, RunningServer
from tests.support.abuse import PROMPT
from tests.support.soap import SIMPLE, XPATH, fault_name, notify_body, subscribe_body
from tests.support.waiting import wait_until

from .conftest import HealthProbe, post

pytestmark = pytest.mark.e2e

RE = "http://exslt.org/regular-expressions"
NATO = "http://nc3a.nato.int/ces/wsn/extension"
NS = "urn:test:topics"
REDOS = "re:test(string(.),'^(a+)+$')"
#: the issue's 30-byte Notify payload: 24 a's and a character that makes the match fail
PAYLOAD = "<m>" + "a" * 24 + "!</m>"
#: four a's more: evaluated unbounded, as before the fix, one match costs 16 times the
#: issue's (about 14 s of CPU here instead of 0.8 s), so that a gateway the filter stalls
#: shows as failed health probes (5 s) and not as latencies a loaded machine also gives;
#: within ``filters.cpu_limit`` its length costs nothing
STALLING = "<m>" + "a" * 28 + "!</m>"


def redos_subscribe(consumer: str, *, end_topic: bool = False) -> str:
    content = (
        f'<wsnt:MessageContent xmlns:re="{RE}" Dialect="{XPATH}">{REDOS}</wsnt:MessageContent>'
    )
    end = (
        f'<wsn-nato:SubscriptionEndTopic xmlns:wsn-nato="{NATO}" xmlns:tns="{NS}" '
        f'Dialect="{SIMPLE}">tns:ends</wsn-nato:SubscriptionEndTopic>'
        if end_topic
        else ""
    )
    return subscribe_body(consumer, "tns:t", extra_filter=content, extra=end)


def test_redos_filter_is_refused_at_subscribe(
    gateway_factory: Callable[..., RunningServer], consumer: ConsumerServer
) -> None:
    gateway = gateway_factory()
    answer = post(gateway.broker_url, redos_subscribe(consumer.address()))
    assert answer.status_code == 500, answer.content
    assert fault_name(answer.content) == "InvalidMessageContentExpressionFault"
    assert b"filters.exslt_regex" in answer.content


def test_redos_filter_enabled_by_the_operator_cannot_stall_the_gateway(
    gateway_factory: Callable[..., RunningServer],
    consumer_factory: Callable[[], ConsumerServer],
) -> None:
    gateway = gateway_factory(
        {"WSNMOM_FILTERS__EXSLT_REGEX": "true", "WSNMOM_FILTERS__CPU_LIMIT": "0.3"}
    )
    victim, watcher = consumer_factory(), consumer_factory()
    ok = post(gateway.broker_url, subscribe_body(watcher.address(), "tns:ends"))
    assert ok.status_code == 200, ok.content
    for _ in range(2):
        answer = post(gateway.broker_url, redos_subscribe(victim.address(), end_topic=True))
        assert answer.status_code == 200, answer.content
    with HealthProbe(gateway.base_url) as probe:
        sent = post(gateway.broker_url, notify_body(("tns:t", STALLING), ns=NS))
        assert sent.status_code == 202, sent.content
        # both subscriptions are ended, each with a SubscriptionEnd naming the budget
        ends = wait_until(
            lambda: (
                [
                    m
                    for m in watcher.messages()
                    if m.find(f".//{{{NATO}}}SubscriptionEnd") is not None
                ]
                if len(watcher.messages()) >= 2
                else None
            ),
            timeout=20,
            what="two SubscriptionEnd notices",
        )
        # and the gateway answered throughout, a normal Notify included
        again = post(gateway.broker_url, notify_body(("tns:other", "<m/>"), ns=NS), timeout=2)
        assert again.status_code == 202
    assert len(ends) == 2
    for end in ends:
        assert "filters.cpu_limit" in "".join(end.itertext())
    assert probe.failures == 0
    assert len(probe.latencies) >= 5
    assert probe.worst < PROMPT, probe.latencies
    assert victim.notifies() == []
    log = gateway.log_path.read_text(errors="replace")
    assert "filters.cpu_limit" in log
    # a harmless regular expression still works on this gateway
    harmless = subscribe_body(
        victim.address(),
        "tns:t",
        extra_filter=(
            f'<wsnt:MessageContent xmlns:re="{RE}" Dialect="{XPATH}">'
            "re:test(string(.), '^a+!$')</wsnt:MessageContent>"
        ),
    )
    assert post(gateway.broker_url, harmless).status_code == 200
    assert post(gateway.broker_url, notify_body(("tns:t", PAYLOAD), ns=NS)).status_code == 202
    (message,) = victim.wait_for_messages(1, timeout=10)
    payload = message.find("{*}Message/m")
    assert payload is not None and payload.text == "a" * 24 + "!"
