"""The admin overview (``GET /wsn/admin/api/overview``) counts its totals and picks the
subscriptions it shows from a light scan of each subscription (F31), not from every one's
full status.  Every figure must still be what the full statuses give: here they are
computed from ``subscription_statuses()`` the way the overview computed them before the
scan, over a gateway on the embedded adapter holding paused, failing, backlogged, idle,
expiring, expired and pull-point-fed subscriptions and a pull point."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient
from wsnmom.core.config import Settings
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    ExpressionSource,
    InboundNotification,
    SubscribeRequest,
    SubscriptionState,
)
from wsnmom.core.operations import SubscriptionStatus
from wsnmom.soap_frontend.admin_json import status_json

from tests.support.waiting import wait_until
from wsnmom.server import Runtime, build_runtime

API = "/wsn/admin/api/overview"
SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
#: nothing listens on the discard port: each delivery there fails
REFUSED = "http://127.0.0.1:9/down"


def _topic(name: str) -> ExpressionSource:
    return ExpressionSource(SIMPLE, f"t:{name}", {"t": "urn:t"})


def _notify(runtime: Runtime, name: str, count: int) -> None:
    runtime.service.notify([InboundNotification(b"<m/>", _topic(name)) for _ in range(count)])


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """One gateway for the module: the tests only read its overview, once it settled."""
    tmp_path = tmp_path_factory.mktemp("overview")
    settings = Settings(
        adapter_url=f"embedded://{tmp_path / 'mw'}",
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
    )
    settings.retry.initial_delay = timedelta(minutes=5)  # a failure stays as it is
    rt = build_runtime(settings)
    try:
        yield rt
    finally:
        rt.close()


@pytest.fixture(scope="module")
def settled(runtime: Runtime) -> tuple[dict[str, int], list[SubscriptionStatus]]:
    """The mixed subscriptions, made once, and their full statuses once settled (nothing
    changes after: failures wait 5 min for a retry, the expiring one lives 5 min)."""
    expected = _mixed(runtime)
    return expected, _settled(runtime, expected)


def _subscribe(runtime: Runtime, consumer: str, topic: str, **kw: Any) -> str:
    req = SubscribeRequest(EndpointReference(consumer), topic=_topic(topic), **kw)
    return runtime.service.subscribe(req).id


def _mixed(runtime: Runtime) -> dict[str, int]:
    """The subscriptions, the messages published and the backlog each live one reaches."""
    service = runtime.service
    expected: dict[str, int] = {}
    # first, with 2 s to live, so that its Pause comes before its end on a loaded machine
    # (made last with 1 s, the Pause could meet an expired subscription: ResourceUnknown);
    # _settled waits for it to be gone
    gone = datetime.now(UTC) + timedelta(seconds=2)
    expired = _subscribe(runtime, "http://127.0.0.1:9/expired", "x", initial_termination_time=gone)
    service.pause(expired)
    _notify(runtime, "x", 1)
    for n, count in enumerate((3, 1, 3, 5)):  # paused, backlogged (two of the same)
        sub = _subscribe(runtime, f"http://127.0.0.1:9/paused-{n}", f"p{n}")
        service.pause(sub)
        _notify(runtime, f"p{n}", count)
        expected[sub] = count
    for n, count in enumerate((2, 4)):  # failing, their messages held for a retry
        sub = _subscribe(runtime, f"{REFUSED}-{n}", f"f{n}")
        _notify(runtime, f"f{n}", count)
        expected[sub] = count
    for n in range(2):  # idle: nothing published on their topic
        expected[_subscribe(runtime, f"http://127.0.0.1:9/idle-{n}", "idle")] = 0
    soon = datetime.now(UTC) + timedelta(minutes=5)
    expiring = _subscribe(
        runtime, "http://127.0.0.1:9/expiring", "e", initial_termination_time=soon
    )
    service.pause(expiring)
    _notify(runtime, "e", 2)
    expected[expiring] = 2
    pull_point = service.create_pull_point(CreatePullPointRequest(name="inbox"))
    fed = _subscribe(runtime, service.pull_point_address(pull_point.id), "pp")
    _notify(runtime, "pp", 3)
    expected[fed] = -1  # routed or read by its pull point: its backlog is the pull point's
    return expected


def _settled(runtime: Runtime, expected: dict[str, int]) -> list[SubscriptionStatus]:
    """The full statuses once each subscription holds its backlog, each failing one has
    failed, and the short-lived one has expired."""
    statuses: list[SubscriptionStatus] = []

    def settled() -> bool:
        statuses[:] = runtime.service.subscription_statuses()
        if {s.record.id for s in statuses} != set(expected):
            return False
        for s in statuses:
            if expected[s.record.id] >= 0 and s.backlog != expected[s.record.id]:
                return False
            if s.record.consumer.address.startswith(REFUSED) and not (
                s.delivery is not None and s.delivery.failures >= 1
            ):
                return False
        return True

    wait_until(settled, timeout=30, what="every subscription at its backlog, failing ones failed")
    return statuses


def _attention(status: SubscriptionStatus) -> tuple[int, int]:
    failures = status.delivery.failures if status.delivery is not None else 0
    return (-failures, -(status.backlog or 0))


def _reference(
    statuses: list[SubscriptionStatus], pull_points: list[dict[str, Any]], limit: int
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The totals and the subscriptions shown, as the overview computed them from every
    full status before F31."""
    subs = sorted(statuses, key=lambda s: (s.record.creation_time, s.record.id))
    shown = subs
    if len(subs) > limit:
        shown = sorted(sorted(subs, key=_attention)[:limit], key=lambda s: s.record.creation_time)
    backlogs = [s.backlog for s in subs if s.mode != "routed"]
    backlogs += [p["waiting"] for p in pull_points]
    totals = {
        "subscriptions": len(subs),
        "paused": sum(1 for s in subs if s.record.state is SubscriptionState.PAUSED),
        "failing": sum(1 for s in subs if s.delivery is not None and s.delivery.failures),
        "backlog": sum(b for b in backlogs if b is not None),
        "backlog_unknown": sum(1 for b in backlogs if b is None),
    }
    return totals, [json.loads(json.dumps(status_json(s))) for s in shown]


def _overview(client: FlaskClient, limit: int | None) -> dict[str, Any]:
    resp = client.get(API, query_string={} if limit is None else {"limit": limit})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    data = resp.json
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("limit", [None, 12, 5, 3, 1])
def test_every_overview_figure_is_what_the_full_statuses_give(
    runtime: Runtime,
    settled: tuple[dict[str, int], list[SubscriptionStatus]],
    limit: int | None,
) -> None:
    expected, statuses = settled
    client = runtime.app.test_client()
    client.environ_base["REMOTE_ADDR"] = "127.0.0.1"
    data = _overview(client, limit)
    totals, shown = _reference(statuses, data["pull_points"], data["limit"])
    assert {k: data["totals"][k] for k in totals} == totals
    assert totals["subscriptions"] == 10 and totals["paused"] == 5 and totals["failing"] == 2
    assert data["subscriptions"] == shown
    failing = list(expected)[4:6]  # failing with 2 and 4 messages held
    if limit == 1:
        assert [s["id"] for s in shown] == failing[1:]  # the larger backlog of the two
    elif limit is not None and limit < 10:
        assert len(shown) == limit and {s["id"] for s in shown} >= set(failing)
