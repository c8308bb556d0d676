"""Push delivery: order, batching, pause/resume, retries with backoff, give-up actions,
SubscriptionEnd (NCIA Annex 1), overflow policies."""

from __future__ import annotations

import time
from typing import Any

from lxml import etree
from wsnmom.core.service import NATO_NS, BrokerService

from .conftest import Broker, RecordingOutbound, full, note, simple, sub_req, wait_idle

C = "http://127.0.0.1:9/consumer"
WSA = "http://www.w3.org/2005/08/addressing"


def bodies(outbound: RecordingOutbound, address: str) -> list[str]:
    return [etree.fromstring(p).text or "" for p in outbound.payloads_to(address)]


def publish(service: BrokerService, n: int, start: int = 0, topic: str = "t:a") -> None:
    service.notify([note(f"<m>{i}</m>", simple(topic)) for i in range(start, start + n)])


def test_order_and_batching(service: BrokerService, outbound: RecordingOutbound) -> None:
    service.subscribe(sub_req(C, topic=simple("t:a")))
    publish(service, 25)
    outbound.wait_messages(C, 25)
    assert bodies(outbound, C) == [str(i) for i in range(25)]
    assert all(len(c.messages) <= service.settings.delivery.batch_size for c in outbound.delivered)


def test_use_raw_and_soap_version_passed(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    from wsnmom.core.model import SoapVersion

    service.subscribe(sub_req(C, use_raw=True, soap_version=SoapVersion.SOAP11))
    publish(service, 1)
    outbound.wait_messages(C, 1)
    call = outbound.delivered[0]
    assert call.use_raw is True
    assert call.soap_version is SoapVersion.SOAP11


#: one subscriber per dialect, each with an expression matching t:a/b
DIALECT_SUBSCRIBERS = {
    "full": ("http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full", "t:a//."),
    "concrete": ("http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete", "t:a/b"),
    "xpath": ("http://www.w3.org/TR/1999/REC-xpath-19991116", "t:a/b"),
    "onvif": ("http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet", "t:a/b|t:c"),
    "old-concrete": ("http://docs.oasis-open.org/wsn/2004/06/TopicExpression/Concrete", "t:a/b"),
}


def _subscribe_each_dialect(service: BrokerService) -> None:
    from wsnmom.core.model import ExpressionSource

    for name, (dialect, text) in DIALECT_SUBSCRIBERS.items():
        topic = ExpressionSource(dialect, text, {"t": "urn:test:topics"})
        service.subscribe(sub_req(f"http://127.0.0.1:9/{name}", topic=topic))
    service.subscribe(sub_req("http://127.0.0.1:9/none"))


def test_topic_rendered_in_subscriber_dialect(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    """META-04: each subscriber gets the Topic in the dialect (the URI) its Subscribe used;
    without a TopicExpression, Simple for a root topic and Concrete otherwise."""
    from wsnmom.topic_mapping.dialects import CONCRETE, SIMPLE

    _subscribe_each_dialect(service)
    service.notify([note("<x/>", simple("t:a")), note("<y/>", full("t:a/b"))])
    wait_idle(service)
    for name, (dialect, _) in DIALECT_SUBSCRIBERS.items():
        got = outbound.messages_to(f"http://127.0.0.1:9/{name}")
        assert [d.message.topic_dialect for d in got if d.message.topic.path == ("a", "b")] == [
            dialect
        ], name
    assert [d.message.topic_dialect for d in outbound.messages_to("http://127.0.0.1:9/none")] == [
        SIMPLE,
        CONCRETE,
    ]


def test_one_dialect_for_everyone_when_configured(
    make_broker: Any, outbound: RecordingOutbound
) -> None:
    """``topic_dialect = "concrete"``: every consumer, pull point and GetCurrentMessage gets
    Concrete, whatever the subscriber or the publisher used."""
    from wsnmom.core.model import CreatePullPointRequest
    from wsnmom.topic_mapping.dialects import CONCRETE

    service = make_broker(topic_dialect="concrete").service
    _subscribe_each_dialect(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note("<p/>", full("t:a/b"))])
    service.notify([note("<x/>", simple("t:a")), note("<y/>", full("t:a/b"))])
    wait_idle(service)
    for name in [*DIALECT_SUBSCRIBERS, "none"]:
        got = outbound.messages_to(f"http://127.0.0.1:9/{name}")
        assert got and {d.message.topic_dialect for d in got} == {CONCRETE}, name
    assert [m.topic_dialect for m in service.get_messages(pp.id, None)] == [CONCRETE]
    assert service.get_current_message(full("t:a/b")).topic_dialect == CONCRETE
    assert service.policy().topic_dialect == "Concrete for every topic and consumer"


def test_pause_accumulates_and_resume_delivers_in_order(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    sub = service.subscribe(sub_req(C, topic=simple("t:a")))
    publish(service, 2)
    outbound.wait_messages(C, 2)
    service.pause(sub.id)
    service.pause(sub.id)  # idempotent
    witness = "http://127.0.0.1:9/witness"  # the barrier: it gets a sentinel after the 5
    service.subscribe(sub_req(witness, topic=simple("t:a")))
    publish(service, 5, start=2)
    service.notify([note("<m>sentinel</m>", simple("t:a"))])
    outbound.wait_messages(witness, 6)
    assert len(outbound.messages_to(C)) == 2
    service.resume(sub.id)
    service.resume(sub.id)  # no change when not paused (RES-04)
    outbound.wait_messages(C, 8)
    assert bodies(outbound, C) == [str(i) for i in range(7)] + ["sentinel"]


def test_retry_with_backoff_then_success(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    outbound.down.add(C)
    service.subscribe(sub_req(C, topic=simple("t:a")))
    publish(service, 3)
    assert outbound.wait(lambda: len(outbound.attempts) >= 2)
    outbound.down.discard(C)
    outbound.wait_messages(C, 3)
    assert bodies(outbound, C) == ["0", "1", "2"]
    times = [a.at for a in outbound.attempts]
    # first retry after ~initial_delay (0.05 s), not a busy loop
    assert times[1] - times[0] >= 0.04


def test_backoff_schedule(make_broker: Any, outbound: RecordingOutbound) -> None:
    b: Broker = make_broker(retry__max_attempts=5, retry__give_up="keep")
    assert b.service is not None
    outbound.down.add(C)
    b.service.subscribe(sub_req(C))
    publish(b.service, 1)
    assert outbound.wait(lambda: len(outbound.attempts) >= 6, timeout=10)
    t = [a.at for a in outbound.attempts]
    gaps = [t[i + 1] - t[i] for i in range(len(t) - 1)]
    # 0.05, 0.1, 0.2 (capped), 0.2, then kept at max_delay 0.2 after give-up "keep"
    for gap, expected in zip(gaps, [0.05, 0.1, 0.2, 0.2, 0.2], strict=False):
        assert expected * 0.8 <= gap <= expected + 0.25, gaps
    # the same (single) message is retried: order is kept
    assert all(len(a.messages) == 1 for a in outbound.attempts)


def test_give_up_keep_keeps_subscription(make_broker: Any, outbound: RecordingOutbound) -> None:
    b: Broker = make_broker(retry__max_attempts=2, retry__give_up="keep")
    assert b.service is not None
    outbound.down.add(C)
    sub = b.service.subscribe(sub_req(C))
    publish(b.service, 2)
    assert outbound.wait(lambda: len(outbound.attempts) >= 4, timeout=5)
    assert b.service.get_subscription(sub.id).id == sub.id
    outbound.down.discard(C)
    outbound.wait_messages(C, 2)
    assert bodies(outbound, C) == ["0", "1"]


def test_give_up_end_publishes_subscription_end(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    watcher = "http://127.0.0.1:9/watcher"
    service.subscribe(sub_req(watcher, topic=simple("t:ends")))
    outbound.down.add(C)
    sub = service.subscribe(
        sub_req(C, topic=simple("t:a"), subscription_end_topic=simple("t:ends"))
    )
    publish(service, 1)
    got = outbound.wait_messages(watcher, 1, timeout=5)
    assert len(got) == 1
    end = etree.fromstring(got[0].message.payload)
    assert end.tag == f"{{{NATO_NS}}}SubscriptionEnd"
    address = end.find(f"{{{NATO_NS}}}SubscriptionReference/{{{WSA}}}Address")
    assert address is not None and address.text == service.subscription_address(sub.id)
    assert "unreachable" in "".join(end.itertext())
    assert got[0].message.topic is not None and got[0].message.topic.path == ("ends",)
    assert sub.id not in service.registry.subscriptions
    assert service.store.get_subscription(sub.id) is None
    # three attempts (max_attempts) were made
    assert len([a for a in outbound.attempts if a.address == C]) == 3


def test_unsubscribe_and_expiry_send_no_subscription_end(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    watcher = "http://127.0.0.1:9/watcher"
    service.subscribe(sub_req(watcher, topic=simple("t:ends")))
    sub = service.subscribe(sub_req(C, subscription_end_topic=simple("t:ends")))
    service.unsubscribe(sub.id)
    sub2 = service.subscribe(sub_req(C, subscription_end_topic=simple("t:ends")))
    service.subscriptions.end(sub2.id, "administrative removal")
    got = outbound.wait_messages(watcher, 1)
    assert len(got) == 1
    assert b"administrative removal" in got[0].message.payload


def test_overflow_drop_oldest(make_broker: Any, outbound: RecordingOutbound) -> None:
    b: Broker = make_broker(limits__max_messages=3, limits__overflow="drop_oldest")
    assert b.service is not None
    sub = b.service.subscribe(sub_req(C))
    b.service.pause(sub.id)
    publish(b.service, 6)
    b.service.resume(sub.id)
    wait_idle(b.service)
    assert bodies(outbound, C) == ["3", "4", "5"]


def test_overflow_drop_newest(make_broker: Any, outbound: RecordingOutbound) -> None:
    b: Broker = make_broker(limits__max_messages=3, limits__overflow="drop_newest")
    assert b.service is not None
    sub = b.service.subscribe(sub_req(C))
    b.service.pause(sub.id)
    publish(b.service, 6)
    b.service.resume(sub.id)
    wait_idle(b.service)
    assert bodies(outbound, C) == ["0", "1", "2"]


def test_subscribe_refuses_disallowed_consumers(make_broker: Any) -> None:
    import pytest
    from wsnmom.core import errors

    b: Broker = make_broker(outbound__deny=["*.evil.test", "10.0.0.0/8"])
    assert b.service is not None
    for address in (
        "http://169.254.169.254/latest",
        "http://x.evil.test/c",
        "http://10.1.2.3/c",
        "ftp://127.0.0.1/c",
        "",
    ):
        with pytest.raises(errors.SubscribeCreationFailed):
            b.service.subscribe(sub_req(address))
    b.service.subscribe(sub_req("http://localhost:1/ok"))


def test_overflow_end_ends_subscription(make_broker: Any, outbound: RecordingOutbound) -> None:
    b: Broker = make_broker(limits__max_messages=3, limits__on_full="end")
    assert b.service is not None
    watcher = "http://127.0.0.1:9/watcher"
    b.service.subscribe(sub_req(watcher, topic=simple("t:ends")))
    sub = b.service.subscribe(
        sub_req(C, topic=simple("t:a"), subscription_end_topic=simple("t:ends"))
    )
    b.service.pause(sub.id)
    publish(b.service, 2)
    b.service.sweep()
    assert sub.id in b.service.registry.subscriptions  # not full yet
    publish(b.service, 2, start=2)
    b.service.sweep()
    assert sub.id not in b.service.registry.subscriptions
    got = outbound.wait_messages(watcher, 1)
    assert b"accumulation limit reached" in got[0].message.payload


def test_delivery_log_records_name_the_publishing_request(
    service: BrokerService, outbound: RecordingOutbound, caplog: Any
) -> None:
    """A retry (and give-up) log line names the request id of the Notify that published
    the batch's first message, though it is written long after that request ended."""
    import logging

    from wsnmom.core.log_context import RequestIdFilter, bound_request_id

    caplog.handler.addFilter(RequestIdFilter())
    outbound.down.add(C)
    service.subscribe(sub_req(C, topic=simple("t:a")))
    with caplog.at_level(logging.INFO, logger="wsnmom.core.delivery"):
        with bound_request_id("notify-4711"):
            publish(service, 1)
        assert outbound.wait(lambda: len(outbound.attempts) >= 2, timeout=5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
            "retry" in r.getMessage() for r in caplog.records
        ):
            time.sleep(0.02)
    retries = [r for r in caplog.records if "delivery failed" in r.getMessage()]
    assert retries and all(getattr(r, "request_id", None) == "notify-4711" for r in retries)
