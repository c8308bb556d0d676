"""Requests forwarded to the instance that reads a pull point, in a cluster of three on
Kafka (no native pull) on one PostgreSQL store (issue 23 §2): an ONVIF pull-point
subscription made through one instance, fed by notifications through another, is read
through the third, which is not its reader: every message once and in order; its Renew,
SetSynchronizationPoint and Unsubscribe go to the reader too; an operator's peek and purge
through a non-reader act on the reader's backlog; a forwarded request captured between two
instances and sent again, to its reader or to another instance, is refused, and so is one
signed too long ago; a kill -9 of the reader answers "try again" (503, ``Retry-After``)
until another instance reads the pull point, which then answers.

Each instance's ``cluster.address`` is a recording relay in front of it (:class:`Tap`),
so the test sees the forwarded requests as they travel between the instances.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
import requests
from lxml import etree

from tests.cluster.conftest import INSTANCE, Cluster
from tests.cluster.ha import spread
from tests.cluster.test_any_instance import admin
from tests.support.threads import serve
from tests.support.waiting import wait_until
from wsnmom.testing.gateway import Gateway, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KAFKA = [pytest.param("kafka", marks=pytest.mark.kafka)]
TEV = "http://www.onvif.org/ver10/events/wsdl"
WSNT = "http://docs.oasis-open.org/wsn/b-2"
WSA = "http://www.w3.org/2005/08/addressing"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
NS = {"tev": TEV, "wsnt": WSNT, "wsa": WSA, "s": SOAP12}
HEADERS = {"Content-Type": "application/soap+xml; charset=utf-8"}
TOPIC = "{urn:cluster}onvif"
FORWARDED = "WSNMOM-Forwarded"


@dataclass(frozen=True, slots=True)
class Seen:
    """One request that crossed a :class:`Tap`."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Tap:
    """An HTTP relay in front of one instance that records what passes (the requests
    other instances forward to it)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.target = ""  # the instance's own address, known once it is made
        self.seen: list[Seen] = []
        tap = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items()}
                tap.seen.append(Seen(self.command, self.path, headers, body))
                host = tap.target.removeprefix("http://")
                connection = http.client.HTTPConnection(host, timeout=120)
                try:
                    connection.request(self.command, self.path, body=body, headers=headers)
                    answer = connection.getresponse()
                    data = answer.read()
                    self.send_response(answer.status)
                    for name, value in answer.getheaders():
                        if name.lower() not in (
                            "connection",
                            "transfer-encoding",
                            "date",
                            "server",
                        ):
                            self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    connection.close()

            do_GET = _relay
            do_POST = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        serve(self.server)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def taps() -> Iterator[list[Tap]]:
    made = [Tap() for _ in range(3)]
    try:
        yield made
    finally:
        for tap in made:
            tap.close()


def soap(address: str, body: str, timeout: float = 60.0, to: str = "") -> requests.Response:
    header = f"<wsa:To>{to}</wsa:To>" if to else ""
    envelope = (
        f'<s:Envelope xmlns:s="{SOAP12}" xmlns:tev="{TEV}" xmlns:wsnt="{WSNT}" '
        f'xmlns:wsa="{WSA}"><s:Header>{header}</s:Header><s:Body>{body}</s:Body></s:Envelope>'
    )
    return requests.post(address, data=envelope.encode(), headers=HEADERS, timeout=timeout)


def body_of(response: requests.Response) -> etree._Element:
    found = etree.fromstring(response.content).find("s:Body", NS)
    assert found is not None and len(found), response.text
    return found[0]


def fault_of(response: requests.Response) -> str:
    """The fault's detail element's local name (``ResourceUnknownFault``, ...)."""
    detail = etree.fromstring(response.content).find("s:Body/s:Fault/s:Detail", NS)
    assert detail is not None and len(detail), response.text
    return etree.QName(detail[0]).localname


def pull(address: str, wait: str = "PT0S", limit: int = 10) -> requests.Response:
    return soap(
        address,
        f"<tev:PullMessages><tev:Timeout>{wait}</tev:Timeout>"
        f"<tev:MessageLimit>{limit}</tev:MessageLimit></tev:PullMessages>",
    )


def numbers(response: requests.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return [
        int("".join(m.itertext()).strip())
        for m in body_of(response).iterfind("wsnt:NotificationMessage/wsnt:Message", NS)
    ]


def publish(c: Cluster, gateway: Gateway, values: range) -> None:
    client = c.client(gateway)
    for start in range(values.start, values.stop, 25):
        end = min(start + 25, values.stop)
        client.notify_many([(n(i), TOPIC) for i in range(start, end)])


def resign(secret: str, seen: Seen, moment: int) -> str:
    """``seen``'s forwarding header signed anew at ``moment`` with a fresh nonce (as
    ``forward_signature.sign`` does: a test that knows the store's secret)."""
    nonce = secrets.token_hex(16)
    instance = seen.headers[FORWARDED].split(" ")[0]
    identity = seen.headers.get("WSNMOM-Forwarded-Identity", "")
    address = seen.headers.get("WSNMOM-Forwarded-For", "")
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    mac.update(
        f"{instance}\n{moment}\n{nonce}\n{seen.method}\n{seen.path}\n{identity}\n{address}\n".encode()
    )
    mac.update(hashlib.sha256(seen.body).digest())
    return f"{instance} {moment} {nonce} {mac.hexdigest()}"


@pytest.mark.parametrize("middleware", KAFKA, indirect=True)
def test_onvif_and_admin_requests_through_any_instance_reach_the_reader_once(
    cluster: Callable[..., Cluster], taps: list[Tap]
) -> None:
    c = cluster(3, instance_env=lambda i: {"WSNMOM_CLUSTER__ADDRESS": taps[i].url})
    for tap, gateway in zip(taps, c.gateways, strict=True):
        tap.target = gateway.base_url

    # in fair shares, so that no shard moves any more (one moving meanwhile answered a
    # pull through C "being handed over", 503, in fresh-clone run70)
    wait_until(lambda: spread(c.gateways[0], 3), 30, what="the 64 shards in fair shares over three")
    a = c.gateways[0]
    created = soap(
        f"{a.base_url}/onvif/event_service",
        "<tev:CreatePullPointSubscription><tev:InitialTerminationTime>PT10M"
        "</tev:InitialTerminationTime></tev:CreatePullPointSubscription>",
    )
    assert created.status_code == 200, created.text
    reference = body_of(created).findtext("tev:SubscriptionReference/wsa:Address", namespaces=NS)
    assert reference is not None and reference.startswith(c.public_url)
    # who reads it: every answer names the reader, whichever instance was asked
    readers = {pull(c.via(g, reference)).headers[INSTANCE] for g in c.gateways}
    assert len(readers) == 1, readers
    reader_id = readers.pop()
    ids = [c.instance_of(g) for g in c.gateways]
    reader = c.gateways[ids.index(reader_id)]
    others = [g for g in c.gateways if g is not reader]
    # A made it; B notifies; C, which does not read it, pulls
    b, cc = (others[0], others[1]) if others[1] is not a else (others[1], others[0])
    via_c = c.via(cc, reference)
    count = 60
    publish(c, b, range(count))
    got: list[int] = []
    answered_by: set[str] = set()

    def drained() -> bool:
        r = pull(via_c, "PT1S", 7)
        got.extend(numbers(r))
        if got:
            answered_by.add(r.headers[INSTANCE])
        return len(got) >= count

    wait_until(drained, 60, what="every message through the instance that does not read")
    assert got == list(range(count))  # once each, in order
    assert answered_by == {reader_id}
    assert numbers(pull(via_c)) == []  # nothing more
    # its other operations through C go to the reader as well
    renewed = soap(
        via_c,
        "<wsnt:Renew><wsnt:TerminationTime>PT20M</wsnt:TerminationTime></wsnt:Renew>",
    )
    assert renewed.status_code == 200 and renewed.headers[INSTANCE] == reader_id, renewed.text
    # posted to the event service with the subscription in wsa:To: the reader answers too
    publish(c, b, range(count, count + 1))
    addressed: list[int] = []
    wait_until(
        lambda: (
            addressed.extend(
                numbers(
                    soap(
                        f"{cc.base_url}/onvif/event_service",
                        "<tev:PullMessages><tev:Timeout>PT1S</tev:Timeout>"
                        "<tev:MessageLimit>5</tev:MessageLimit></tev:PullMessages>",
                        to=reference,
                    )
                )
            )
            or addressed
        ),
        30,
        what="the message through the event service",
    )
    assert addressed == [count]
    synced = soap(via_c, "<tev:SetSynchronizationPoint/>")
    assert synced.status_code == 200 and synced.headers[INSTANCE] == reader_id, synced.text
    # the current message of the one topic, published only through B: the reader's topic
    # set is the cluster's (core.topic_share), whichever instance reads
    resynced: list[int] = []
    wait_until(
        lambda: resynced.extend(numbers(pull(via_c, "PT1S", 10))) or count in resynced,
        30,
        what="the current message SetSynchronizationPoint put into the pull point",
    )
    assert resynced == [count]
    forwarded = [s for s in taps[ids.index(reader_id)].seen if FORWARDED in s.headers]
    assert {s.path for s in forwarded} == {urlpath(reference), "/onvif/event_service"}
    senders = {s.headers[FORWARDED].split(" ")[0] for s in forwarded}
    assert senders == {c.instance_of(g) for g in others}  # the first round asked all three

    # -- an operator's peek and purge through a non-reader act on the reader's backlog
    pull_point = pull_point_of(cc, reference)
    publish(c, b, range(100, 120))
    peeked: list[Any] = []

    def peek_all() -> bool:
        r = admin(cc, "GET", f"/pullpoints/{pull_point}/peek?count=50")
        assert r.status_code == 200, r.text
        peeked[:] = r.json()["messages"]
        return len(peeked) == 20

    wait_until(peek_all, 30, what="the 20 messages in the peek through C")
    # the admin page's own peek through C shows them too (the reader's API answered it)
    page = requests.get(f"{cc.base_url}/admin?pull_point={pull_point}", timeout=30)
    assert page.status_code == 200
    assert 'id="peek-count">(20)<' in page.text, page.text[:2000]
    purged = admin(cc, "POST", f"/pullpoints/{pull_point}/purge")
    assert purged.status_code == 200, purged.text
    assert purged.headers[INSTANCE] == reader_id
    assert purged.json()["purged"] is not None and purged.json()["purged"] >= 20
    assert "by " in reader.log_tail(200) and "purge pull point" in reader.log_tail(200)
    publish(c, b, range(200, 201))  # the sentinel: the purged 20 do not come before it
    after: list[int] = []
    wait_until(
        lambda: after.extend(numbers(pull(via_c, "PT1S", 50))) or 200 in after,
        30,
        what="the sentinel after the purge",
    )
    assert after == [200]

    # -- a captured forward sent again, to its reader and to another instance: refused
    captured = [s for s in taps[ids.index(reader_id)].seen if FORWARDED in s.headers][-1]
    assert b"PullMessages" in captured.body  # the last forward: the sentinel's PullMessages
    publish(c, b, range(300, 301))
    wait_until(
        lambda: len(admin(cc, "GET", f"/pullpoints/{pull_point}/peek").json()["messages"]) == 1,
        30,
        what="the next message waiting",
    )
    for target in (reader, a if a is not reader else b):
        replay = requests.request(
            captured.method,
            target.base_url + captured.path,
            data=captured.body,
            headers=captured.headers,
            timeout=30,
        )
        assert replay.status_code == 403, replay.text
        assert "replayed" in replay.text
    # one signed more than 60 s ago is refused as well; the same signed now is served
    with psycopg.connect(c.store_url) as conn:
        row = conn.execute("SELECT value FROM wsnmom_meta WHERE key = 'cluster_secret'").fetchone()
        assert row is not None
        secret = str(row[0])
        recorded = conn.execute("SELECT count(*) FROM wsnmom_nonces").fetchone()
        assert recorded is not None and recorded[0] > 0
    old = {**captured.headers, FORWARDED: resign(secret, captured, int(time.time()) - 61)}
    stale = requests.post(reader.base_url + captured.path, data=captured.body, headers=old)
    assert stale.status_code == 403 and "replayed" not in stale.text, stale.text
    fresh = {**captured.headers, FORWARDED: resign(secret, captured, int(time.time()))}
    served = requests.post(reader.base_url + captured.path, data=captured.body, headers=fresh)
    # the control: the request itself is fine, and what the refused ones asked for was
    # not handed out to them
    assert numbers(served) == [300]

    # -- kill -9 of the reader: "try again" through the others, then another reader
    assert reader.process is not None
    reader.process.kill()
    reader.process.wait(10)
    publish(c, b, range(400, 401))
    refusals: list[requests.Response] = []

    def read_again() -> bool:
        r = pull(via_c, "PT0S", 10)
        if r.status_code == 503:
            refusals.append(r)
            return False
        return 400 in numbers(r)

    # at a client's pace (each request a new connection: none piles up at the instance)
    wait_until(read_again, 30, what="another instance reading the pull point", interval=0.25)
    assert refusals, "no 'try again' while nobody read the pull point"
    assert all(
        fault_of(r) == "ResourceUnavailableFault" and r.headers.get("Retry-After") for r in refusals
    )
    # Unsubscribe through the other survivor: gone everywhere
    survivor = next(g for g in others if g is not cc)
    gone = soap(c.via(survivor, reference), "<wsnt:Unsubscribe/>")
    assert gone.status_code == 200, gone.text
    answers: list[requests.Response] = []

    def refused() -> bool:
        answers.append(pull(via_c))
        return answers[-1].status_code != 200

    wait_until(refused, 10, what="the subscription unknown", interval=0.1)
    assert fault_of(answers[-1]) == "ResourceUnknownFault", answers[-1].text


def urlpath(address: str) -> str:
    return "/" + address.split("/", 3)[3]


def pull_point_of(gateway: Gateway, reference: str) -> str:
    """The pull point an ONVIF subscription feeds (the admin API's subscription view)."""
    subscription = reference.rsplit("/", 1)[1]
    r = admin(gateway, "GET", f"/subscriptions/{subscription}")
    assert r.status_code == 200, r.text
    data = r.json()
    found = data.get("pull_point_id") or data.get("pull_point")
    assert found, data
    return str(found)


def n(i: int) -> str:
    return f'<n xmlns="urn:n">{i}</n>'
