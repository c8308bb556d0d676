"""``quotas.ad_hoc_topics`` on a cluster (docs/security.md, "Topics: a notifier inventing
them"): two gateway processes on one PostgreSQL store admitting new topics at once never
record more than the bound in the shared table; each refuses a new topic beyond it with a
schema-valid TopicNotSupportedFault (HTTP 500); every topic either accepted is kept in the
topic set of the instance that accepted it, and is either recorded or counted as not
recorded (the other instance filled the table first)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import psycopg
import pytest
import requests
from lxml import etree

from tests.cluster.conftest import BOTH, Cluster
from tests.support.soap import content_type, envelope, notify_body
from tests.support.waiting import wait_until
from tests.support.wsn_schemas import assert_body_valid
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "urn:cluster-bound"
WSTOP = "http://docs.oasis-open.org/wsn/t-1"
BOUND = 6


def _notify(gateway: Gateway, *names: str) -> requests.Response:
    """A Notify of one message on each topic ``names`` (in :data:`NS`)."""
    return requests.post(
        gateway.broker_url,
        data=envelope(notify_body(*((f"tns:{name}", "<m/>") for name in names), ns=NS)),
        headers={"Content-Type": content_type("1.2")},
        timeout=30,
    )


def _assert_refused(answer: requests.Response) -> None:
    assert answer.status_code == 500, (answer.status_code, answer.text)
    fault = assert_body_valid(answer.content)  # the Fault, its detail schema-valid
    details = fault.findall(".//{http://docs.oasis-open.org/wsn/b-2}TopicNotSupportedFault")
    assert len(details) == 1, answer.text
    assert "(quotas.ad_hoc_topics)" in answer.text and f"maximum of {BOUND}" in answer.text


def _members(c: Cluster, gateway: Gateway) -> set[str]:
    (found,) = c.client(gateway).get_resource_property(f"{{{WSTOP}}}TopicSet")
    return {
        etree.QName(el).localname
        for el in found
        if el.get(f"{{{WSTOP}}}topic") == "true" and etree.QName(el).namespace == NS
    }


def _not_recorded(gateway: Gateway) -> float:
    text = requests.get(f"{gateway.base_url}/metrics", timeout=10).text
    found = re.search(r"^wsnmom_topics_not_recorded_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _recorded(c: Cluster) -> int:
    with psycopg.connect(c.store_url) as store:
        row = store.execute("SELECT count(*) FROM wsnmom_topics").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("middleware", BOTH[:1], indirect=True)
def test_instances_admitting_at_once_never_record_more_topics_than_the_bound(
    cluster: Callable[..., Cluster],
) -> None:
    """Both instances admit the bound's worth of new topics before either learns of the
    other's: the test holds the table locked against inserts meanwhile, so neither
    records (nor takes in) anything yet.  Once it lets go, the recordings race for the
    room: exactly the bound is recorded, the rest counted as not recorded, and every
    accepted topic stays in its instance's topic set."""
    c = cluster(2, WSNMOM_QUOTAS__AD_HOC_TOPICS=str(BOUND), WSNMOM_CLUSTER__SHARDS="1")
    names = [[f"g{n}-t{i}" for i in range(BOUND)] for n in range(2)]
    with psycopg.connect(c.store_url) as holder:
        holder.execute("LOCK TABLE wsnmom_topics IN EXCLUSIVE MODE")  # reads pass, inserts wait
        answers: list[requests.Response | None] = [None, None]

        def notify_all(n: int) -> None:
            answers[n] = _notify(c.gateways[n], *names[n])

        threads = [threading.Thread(target=notify_all, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for answer in answers:
            assert answer is not None and answer.status_code == 202, answer
        for gateway in c.gateways:  # each instance's own bound holds meanwhile
            _assert_refused(_notify(gateway, "one-more"))
        holder.commit()  # the recorders go on
    wait_until(
        lambda: _recorded(c) + sum(_not_recorded(g) for g in c.gateways) == 2 * BOUND,
        30,
        what="every accepted topic recorded or counted as not recorded",
    )
    assert _recorded(c) == BOUND
    for n, gateway in enumerate(c.gateways):
        assert set(names[n]) <= _members(c, gateway)  # nothing accepted is lost
    _assert_refused(_notify(c.gateways[0], "after"))
    assert _recorded(c) == BOUND
