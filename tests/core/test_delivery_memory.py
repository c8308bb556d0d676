"""Issue 22, item 1, on every adapter shape: the bytes delivery holds stay within
``delivery.memory`` and ``delivery.memory_per_owner``; what does not fit stays in the
middleware (the channel parks: its handle is stopped, as a pause does) and arrives, in
order, once the consumer answers again.

Queue shape: embedded, RabbitMQ; log shape: file log, Kafka (``adapters.logbase``
cursors); session shape: MQTT.  The budget is a few messages; six subscriptions to a
consumer that is down would otherwise each hold all twelve.  Parking stops and starts a
log cursor many times a second; what a catch-up reader read meanwhile beyond the cursor's
position must not be handed out (``tests/adapters/test_logbase_catch_up.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from wsnmom.core.delivery_budget import MESSAGE_OVERHEAD

from tests.fixtures.server import kafka_gateway_url, mqtt_gateway_url

from .conftest import Broker, RecordingOutbound, note, simple, sub_req

SUBSCRIPTIONS = 6
MESSAGES = 12
PAYLOAD = 4096
BUDGET = 8 * (PAYLOAD + 64 + MESSAGE_OVERHEAD)
#: the broker's settings: the budget for everyone (one owner), consumers retried for ever
#: with their messages kept
BUDGETED: dict[str, object] = {
    "delivery__memory": BUDGET,
    "delivery__memory_per_owner": BUDGET,
    "retry__max_attempts": 10_000,
    "retry__give_up": "keep",
    "limits__max_age": None,
}


def _adapter_url(kind: str, request: pytest.FixtureRequest) -> str | None:
    if kind == "embedded":
        return None
    if kind == "filelog":
        return "filelog://{tmp}/log"
    if kind == "rabbitmq":
        return str(request.getfixturevalue("rabbitmq_url"))
    if kind == "kafka":
        return kafka_gateway_url(request.getfixturevalue("kafka_url"))
    return mqtt_gateway_url(request.getfixturevalue("mqtt_url")) + "&data_dir={tmp}/mqtt"


@pytest.mark.parametrize("kind", ["embedded", "filelog", "rabbitmq", "kafka", "mqtt"])
def test_held_bytes_stay_within_the_budget_and_everything_arrives_in_order(
    make_broker: Callable[..., Broker],
    outbound: RecordingOutbound,
    request: pytest.FixtureRequest,
    kind: str,
) -> None:
    b = make_broker(adapter_url=_adapter_url(kind, request), **BUDGETED)
    service = b.service
    assert service is not None
    addresses = [f"http://127.0.0.1:9/c{i}" for i in range(SUBSCRIPTIONS)]
    outbound.down.update(addresses)
    for address in addresses:
        service.subscribe(sub_req(address, topic=simple("t:a")))
    filler = "x" * PAYLOAD
    expected = [f"<m><n>{n}</n>{filler}</m>".encode() for n in range(MESSAGES)]
    for payload in expected:
        service.notify([note(payload, simple("t:a"))])
    budget = service.engine.budget
    # the consumers refuse until every subscription tried, and some had to wait for room
    assert outbound.wait(
        lambda: {c.address for c in outbound.attempts} == set(addresses) and budget.parks > 0,
        timeout=30,
    ), (budget.parks, {c.address for c in outbound.attempts})
    outbound.down.clear()
    assert outbound.wait(
        lambda: all(len(set(outbound.payloads_to(a))) == MESSAGES for a in addresses),
        timeout=60,
    ), [len(set(outbound.payloads_to(a))) for a in addresses]
    for address in addresses:
        # at-least-once: a batch sent while its channel parked may come again
        assert list(dict.fromkeys(outbound.payloads_to(address))) == expected, address
    assert budget.peak <= BUDGET


def test_failing_consumers_do_not_keep_the_room_from_an_answering_one(
    make_broker: Callable[..., Broker], outbound: RecordingOutbound
) -> None:
    """Six subscriptions whose consumer is down take the whole budget with four messages
    each, and hold them while they wait for their retries; a subscription (same owner)
    made afterwards, whose consumer answers, still gets its messages while the six keep
    failing: a channel waiting for a retry parks while others wait for room."""
    b = make_broker(**BUDGETED)
    service = b.service
    assert service is not None
    failing = [f"http://127.0.0.1:9/down{i}" for i in range(SUBSCRIPTIONS)]
    outbound.down.update(failing)
    for address in failing:
        service.subscribe(sub_req(address, topic=simple("t:a")))
    filler = "x" * PAYLOAD
    held = [f"<m><n>{n}</n>{filler}</m>".encode() for n in range(4)]
    for payload in held:
        service.notify([note(payload, simple("t:a"))])
    budget = service.engine.budget
    assert outbound.wait(lambda: budget.parks > 0 and len(outbound.attempts) > 3, 30)
    healthy = "http://127.0.0.1:9/healthy"
    service.subscribe(sub_req(healthy, topic=simple("t:b")))
    expected = [f"<h><n>{n}</n>{filler}</h>".encode() for n in range(4)]
    for payload in expected:
        service.notify([note(payload, simple("t:b"))])
    assert outbound.wait(lambda: len(set(outbound.payloads_to(healthy))) == 4, 60)
    assert list(dict.fromkeys(outbound.payloads_to(healthy))) == expected
    assert not any(outbound.payloads_to(a) for a in failing)  # still down meanwhile
    outbound.down.clear()
    assert outbound.wait(lambda: all(len(set(outbound.payloads_to(a))) == 4 for a in failing), 60)
    assert budget.peak <= BUDGET
