"""Subscribe / Notify / push delivery through the real embedded adapter."""

from __future__ import annotations

from lxml import etree
from wsnmom.core.service import BrokerService

from .conftest import RecordingOutbound, note, simple, sub_req

C = "http://127.0.0.1:9/consumer"


def test_subscribe_notify_delivers_one_message(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    sub = service.subscribe(sub_req(C, topic=simple("t:myTopic")))
    service.notify([note('<foo xmlns="urn:test:org">bar</foo>', simple("t:myTopic"))])
    got = outbound.wait_messages(C, 1)
    assert len(got) == 1
    d = got[0]
    assert etree.fromstring(d.message.payload).text == "bar"
    assert d.subscription_reference is not None
    assert d.subscription_reference.address == service.subscription_address(sub.id)
    assert d.message.topic is not None and d.message.topic.path == ("myTopic",)
    service.unsubscribe(sub.id)
