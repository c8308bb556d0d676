"""SOAP 1.2 / WS-Addressing envelopes for the WS-N operations the benchmarks drive, and
cheap extraction of what the benchmarks need from the answers (regular expressions, so the
load generators spend no time in an XML parser).

Every Notify payload is ``<b:event xmlns:b="urn:wsnmom:bench" seq=".." ts="..">``; ``ts`` is
the (intended) send time in seconds since the epoch, which the consumer servers use to
measure end-to-end latency.
"""

from __future__ import annotations

import re
import uuid
from xml.sax.saxutils import escape

SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
WSA = "http://www.w3.org/2005/08/addressing"
WSNT = "http://docs.oasis-open.org/wsn/b-2"
SIMPLE_DIALECT = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
CONCRETE_DIALECT = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
BENCH_NS = "urn:wsnmom:bench"
CONTENT_TYPE = "application/soap+xml; charset=utf-8"

ACTION_NOTIFY = "http://docs.oasis-open.org/wsn/bw-2/NotificationConsumer/Notify"
ACTION_SUBSCRIBE = "http://docs.oasis-open.org/wsn/bw-2/NotificationProducer/SubscribeRequest"
ACTION_CREATE_PULL_POINT = (
    "http://docs.oasis-open.org/wsn/bw-2/CreatePullPoint/CreatePullPointRequest"
)
ACTION_GET_MESSAGES = "http://docs.oasis-open.org/wsn/bw-2/PullPoint/GetMessagesRequest"
ACTION_PAUSE = (
    "http://docs.oasis-open.org/wsn/bw-2/PausableSubscriptionManager/PauseSubscriptionRequest"
)
ACTION_RESUME = (
    "http://docs.oasis-open.org/wsn/bw-2/PausableSubscriptionManager/ResumeSubscriptionRequest"
)
ACTION_RENEW = "http://docs.oasis-open.org/wsn/bw-2/SubscriptionManager/RenewRequest"
ACTION_UNSUBSCRIBE = "http://docs.oasis-open.org/wsn/bw-2/SubscriptionManager/UnsubscribeRequest"

#: placeholder in body templates replaced by the send timestamp (see ``bench.pacer``)
TS_MARK = "__TS__"

_ADDRESS_RE = re.compile(rb"<(?:[\w.-]+:)?Address(?:\s[^>]*)?>\s*([^<\s]+)\s*</")
_NOTIFICATION_RE = re.compile(rb"<(?:[\w.-]+:)?NotificationMessage[\s>]")
_TS_RE = re.compile(rb'\sts="([0-9.]+)"')
_FAULT_RE = re.compile(rb"<(?:[\w.-]+:)?Fault[\s>]")
_FAULT_TEXT_RE = re.compile(
    rb"<(?:[\w.-]+:)?(?:Text|faultstring|Description|Subcode|Value)(?:\s[^>]*)?>([^<]+)</"
)


def envelope(action: str, to: str, body: str) -> bytes:
    """A SOAP 1.2 envelope with the WS-Addressing headers and ``body`` as the Body child."""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>'
        f'<s:Envelope xmlns:s="{SOAP12}" xmlns:wsa="{WSA}" xmlns:wsnt="{WSNT}">'
        f"<s:Header><wsa:Action>{action}</wsa:Action><wsa:To>{escape(to)}</wsa:To>"
        f"<wsa:MessageID>urn:uuid:{uuid.uuid4()}</wsa:MessageID></s:Header>"
        f"<s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


def topic_element(tag: str, topic: str) -> str:
    """``<wsnt:Topic>`` / ``<wsnt:TopicExpression>`` in the Simple dialect, prefix ``b``."""
    return f'<wsnt:{tag} Dialect="{SIMPLE_DIALECT}" xmlns:b="{BENCH_NS}">b:{topic}</wsnt:{tag}>'


def payload(seq: int, ts: str, size: int = 0) -> str:
    """The benchmark's message payload; ``size`` pads the text content to roughly that."""
    filler = "x" * max(0, size)
    return f'<b:event xmlns:b="{BENCH_NS}" seq="{seq}" ts="{ts}">{filler}</b:event>'


def notify(
    to: str, topic: str, messages: int = 1, ts: str = "0", size: int = 64, seq0: int = 0
) -> bytes:
    """A Notify with ``messages`` NotificationMessages on ``topic``."""
    items = "".join(
        f"<wsnt:NotificationMessage>{topic_element('Topic', topic)}"
        f"<wsnt:Message>{payload(seq0 + i, ts, size)}</wsnt:Message>"
        f"</wsnt:NotificationMessage>"
        for i in range(messages)
    )
    return envelope(ACTION_NOTIFY, to, f"<wsnt:Notify>{items}</wsnt:Notify>")


#: the XPath 1.0 dialect of a MessageContent filter
XPATH_DIALECT = "http://www.w3.org/TR/1999/REC-xpath-19991116"


def subscribe(
    to: str, consumer: str, topic: str, termination: str = "PT4H", content: str | None = None
) -> bytes:
    """A Subscribe of ``consumer`` (an address) to ``topic`` for ``termination``, with the
    XPath MessageContent filter ``content`` if given."""
    mc = (
        f'<wsnt:MessageContent Dialect="{XPATH_DIALECT}">{escape(content)}</wsnt:MessageContent>'
        if content
        else ""
    )
    body = (
        f"<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>{escape(consumer)}"
        f"</wsa:Address></wsnt:ConsumerReference><wsnt:Filter>"
        f"{topic_element('TopicExpression', topic)}{mc}</wsnt:Filter>"
        f"<wsnt:InitialTerminationTime>{termination}</wsnt:InitialTerminationTime>"
        f"</wsnt:Subscribe>"
    )
    return envelope(ACTION_SUBSCRIBE, to, body)


def notify_xml(to: str, topic: str, xml: str) -> bytes:
    """A Notify of one message whose payload is ``xml``."""
    item = (
        f"<wsnt:NotificationMessage>{topic_element('Topic', topic)}"
        f"<wsnt:Message>{xml}</wsnt:Message></wsnt:NotificationMessage>"
    )
    return envelope(ACTION_NOTIFY, to, f"<wsnt:Notify>{item}</wsnt:Notify>")


def create_pull_point(to: str) -> bytes:
    """A CreatePullPoint request."""
    return envelope(ACTION_CREATE_PULL_POINT, to, "<wsnt:CreatePullPoint/>")


def pause(subscription: str) -> bytes:
    """A PauseSubscription sent to ``subscription`` (its SubscriptionManager address)."""
    return envelope(ACTION_PAUSE, subscription, "<wsnt:PauseSubscription/>")


def resume(subscription: str) -> bytes:
    """A ResumeSubscription sent to ``subscription``."""
    return envelope(ACTION_RESUME, subscription, "<wsnt:ResumeSubscription/>")


def renew(subscription: str, termination: str) -> bytes:
    """A Renew sent to ``subscription`` for ``termination`` (an xsd:duration)."""
    body = f"<wsnt:Renew><wsnt:TerminationTime>{termination}</wsnt:TerminationTime></wsnt:Renew>"
    return envelope(ACTION_RENEW, subscription, body)


def unsubscribe(subscription: str) -> bytes:
    """An Unsubscribe sent to ``subscription``."""
    return envelope(ACTION_UNSUBSCRIBE, subscription, "<wsnt:Unsubscribe/>")


def get_messages(to: str, maximum: int = 1) -> bytes:
    """A GetMessages request for at most ``maximum`` messages."""
    body = (
        f"<wsnt:GetMessages><wsnt:MaximumNumber>{maximum}</wsnt:MaximumNumber></wsnt:GetMessages>"
    )
    return envelope(ACTION_GET_MESSAGES, to, body)


def first_address(response: bytes) -> str | None:
    """The first ``wsa:Address`` in a response (subscription or pull point reference)."""
    found = _ADDRESS_RE.search(response)
    return found.group(1).decode() if found else None


def count_notifications(body: bytes) -> int:
    """How many NotificationMessage elements ``body`` holds."""
    return len(_NOTIFICATION_RE.findall(body))


def timestamps(body: bytes) -> list[float]:
    """The ``ts`` attributes of the benchmark payloads in ``body``."""
    return [float(t) for t in _TS_RE.findall(body)]


def is_fault(body: bytes) -> bool:
    """True when ``body`` is a SOAP fault."""
    return _FAULT_RE.search(body) is not None


def fault_summary(body: bytes, limit: int = 400) -> str:
    """The texts of a SOAP fault (reason, codes, WS-BaseFaults descriptions), for messages."""
    texts = [t.decode("utf-8", "replace").strip() for t in _FAULT_TEXT_RE.findall(body)]
    summary = " / ".join(t for t in texts if t)
    return (summary or body[:limit].decode("utf-8", "replace"))[:limit]
