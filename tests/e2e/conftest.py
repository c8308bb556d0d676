"""Helpers for the end-to-end tests: a thin raw-SOAP client bound to the running gateway."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from lxml import etree

from tests.fixtures.server import RunningServer
from tests.support.soap import (
    NS,
    SIMPLE,
    body_child,
    content_type,
    envelope,
    epr_address,
    fault_name,
    notify_body,
    resource_id,
    subscribe_body,
)
from tests.support.wsn_schemas import assert_body_valid
from wsnmom.client import NotificationConsumer, WsnClient

pytestmark = pytest.mark.e2e


@dataclass
class Answer:
    """A SOAP answer: status, raw bytes, first Body child, fault name (if any)."""

    status: int
    data: bytes

    @property
    def body(self) -> etree._Element:
        return body_child(self.data)

    @property
    def fault(self) -> str | None:
        return fault_name(self.data) if self.status in (500, 503) else None

    def ok(self, validate: bool = True) -> etree._Element:
        assert self.status == 200, self.data
        return assert_body_valid(self.data) if validate else self.body


@dataclass
class Subscribed:
    """A subscription created through the broker."""

    id: str
    address: str
    response: etree._Element


class Wsn:
    """Raw SOAP calls against one running gateway."""

    def __init__(self, server: RunningServer, ns: str) -> None:
        self.server = server
        self.ns = ns
        self.http = requests.Session()

    @property
    def broker(self) -> str:
        return self.server.broker_url

    def post(
        self, url: str, body: str, *, version: str = "1.2", validate: bool = True, **kw: Any
    ) -> Answer:
        data = envelope(body, version=version, **kw)
        resp = self.http.post(url, data=data, headers={"Content-Type": content_type(version)})
        if validate and resp.status_code in (200, 500, 503):
            assert_body_valid(resp.content)
        return Answer(resp.status_code, resp.content)

    def subscribe(self, consumer: str, topic: str | None = "tns:myTopic", **kw: Any) -> Subscribed:
        kw.setdefault("ns", self.ns)
        ans = self.post(self.broker, subscribe_body(consumer, topic, **kw))
        resp = ans.ok()
        ref = resp.find("wsnt:SubscriptionReference", NS)
        assert ref is not None
        return Subscribed(resource_id(ref), epr_address(ref), resp)

    def subscribe_fault(self, consumer: str, topic: str | None = "tns:myTopic", **kw: Any) -> str:
        kw.setdefault("ns", self.ns)
        ans = self.post(self.broker, subscribe_body(consumer, topic, **kw))
        assert ans.status == 500, ans.data
        return str(ans.fault)

    def notify(self, *messages: tuple[str | None, str], url: str | None = None, **kw: Any) -> None:
        kw.setdefault("ns", self.ns)
        data = envelope(notify_body(*messages, **kw))
        resp = self.http.post(
            url or self.broker, data=data, headers={"Content-Type": content_type()}
        )
        assert resp.status_code in (200, 202), resp.content

    def create_pull_point(self, attrs: str = "") -> tuple[str, str]:
        resp = self.post(self.broker, f"<wsnt:CreatePullPoint {attrs}/>").ok()
        pp = resp.find("wsnt:PullPoint", NS)
        assert pp is not None
        return resource_id(pp), epr_address(pp)

    def get_messages(self, pp_address: str, maximum: int | None = None) -> list[etree._Element]:
        inner = f"<wsnt:MaximumNumber>{maximum}</wsnt:MaximumNumber>" if maximum is not None else ""
        resp = self.post(pp_address, f"<wsnt:GetMessages>{inner}</wsnt:GetMessages>").ok()
        return resp.findall("wsnt:NotificationMessage", NS)

    def simple(self, local: str) -> str:
        return f'<wsnt:Topic xmlns:tns="{self.ns}" Dialect="{SIMPLE}">tns:{local}</wsnt:Topic>'


@pytest.fixture
def wsn(wsnmom_server: RunningServer) -> Iterator[Wsn]:
    """A raw SOAP client with a fresh topic namespace (isolates tests sharing the server);
    its HTTP session closed at teardown (left to the garbage collector, its keep-alive
    connection stayed open for many tests)."""
    client = Wsn(wsnmom_server, f"urn:test:{uuid.uuid4().hex[:12]}")
    yield client
    client.http.close()


@pytest.fixture
def client(wsnmom_server: RunningServer, wsn: Wsn) -> Iterator[WsnClient]:
    """``wsnmom.client`` bound to the running gateway; the prefix ``tns`` is the test's own
    topic namespace (the same as ``wsn.ns``)."""
    with WsnClient(wsnmom_server.broker_url, namespaces={"tns": wsn.ns}, timeout=10) as c:
        yield c


@pytest.fixture
def inbox() -> Iterator[NotificationConsumer]:
    """A ``wsnmom.client`` consumer endpoint on a free loopback port."""
    with NotificationConsumer() as consumer:
        yield consumer
