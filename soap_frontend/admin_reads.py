"""The admin API's reading endpoints, on the admin blueprint (:mod:`.admin_api`): what the
admin page (``/admin``) and ``wsnmom subscriptions list`` read, and the page's own data.

Reading::

    GET /wsn/admin/api/overview[?limit=N]   everything the page shows: health, totals,
                                            subscriptions, pull points, registrations,
                                            topics (:func:`.admin_json.overview_json`),
                                            upstreams (:mod:`.admin_upstreams`)
    GET /wsn/admin/api/subscriptions        {"count": n, "subscriptions": [...]}; searched,
                                            sorted and paged with ?q=&sort=&order=
                                            &offset=&limit= (:mod:`.admin_query`)
    GET /wsn/admin/api/subscriptions/<id>   one subscription ("pending": its backlog)
    GET /wsn/admin/api/subscriptions/<id>/peek?count=N
                                            the first N messages of its backlog, not
                                            consumed (:func:`.admin_json.peek_json`)
    GET /wsn/admin/api/pullpoints           {"count": n, "pull_points": [...]}
    GET /wsn/admin/api/pullpoints/<id>      one pull point
    GET /wsn/admin/api/pullpoints/<id>/peek?count=N
                                            the first N messages GetMessages would hand
                                            out, not consumed
    GET /wsn/admin/api/registrations        {"count": n, "registrations": [...]}
    GET /wsn/admin/api/topics               {"count": n, "topics": [...]}: messages, rate
    GET /wsn/admin/api/cluster              this instance and every instance on its store
                                            (:mod:`.admin_cluster`)

A backlog another instance of a cluster holds is peeked there (:mod:`.admin_forward`).
Errors as the rest of the admin API: 400 (a bad query or count), 404 (unknown resource),
503 (middleware unreachable; ``Retry-After``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flask import Response, current_app, request
from wsnmom.core import errors
from wsnmom.core.peek import MAX_PEEK, PeekResult
from wsnmom.core.ports import BrokerPort

from .admin_api import (
    ADMIN_API_PREFIX,
    _caller,
    _error,
    _json,
    _local_operator,
    _refused_reading,
    _service,
    _settings,
    admin_api,
)
from .admin_auth import AdminCaller
from .admin_charts import chart_svg
from .admin_cluster import cluster_json
from .admin_forward import elsewhere
from .admin_json import (
    attempts_json,
    history_json,
    overview_json,
    peek_json,
    pull_point_json,
    registration_json,
    status_json,
    topic_json,
)
from .admin_node import node_json
from .admin_query import QueryError, needs_delivery, query_subscriptions

__all__ = ["DEFAULT_LIMIT", "DEFAULT_PEEK", "PAGE_PEEK", "page_view", "peek_count"]

#: most entries per list of the overview by default
DEFAULT_LIMIT = 500
#: messages a peek shows unless ``?count=`` says otherwise
DEFAULT_PEEK = 10


def _upstream_states() -> list[dict[str, Any]]:
    """Each upstream's state (``wsnmom.upstreams``; none on an app without the relay)."""
    relay = current_app.extensions.get("wsnmom.upstreams")
    return list(relay.states()) if relay is not None else []


def page_view() -> tuple[dict[str, Any], str] | None:
    """For the page itself (:mod:`.admin_page`): the overview and the caller's role
    (``admin``, ``local operator``, ``read-only``) when the caller may read, else None."""
    caller = _caller()
    if _refused_reading(caller) is not None or not isinstance(caller, AdminCaller):
        return None
    service = _service()
    data = overview_json(service.overview(DEFAULT_LIMIT), service.broker_address, DEFAULT_LIMIT)
    data["node"] = node_json(_settings())
    data["upstreams"] = _upstream_states()
    detail_id = request.args.get("subscription")
    if detail_id:
        data["detail"] = _detail(service, detail_id)
        data["detail_id"] = detail_id
    peek = _page_peek(service, detail_id, str(caller.principal))
    if peek is not None:
        data["peek"] = peek
    role = "admin" if caller.authenticated_admin else "read-only"
    if role == "read-only" and _local_operator():
        role = "local operator"
    return data, role


#: messages the page's peek shows (as its script asks)
PAGE_PEEK = 20


def _page_peek(
    service: BrokerPort, subscription_id: str | None, admin: str
) -> dict[str, Any] | None:
    """The page's peek (``?subscription=``, ``?pull_point=`` or ``?peek=dead-letters``):
    its title and the API's answer, or an ``error``; None when the page shows none.  A
    backlog another instance holds is peeked there (:mod:`.admin_forward`)."""
    pull_point_id = request.args.get("pull_point")
    try:
        if subscription_id:
            title = f"Waiting messages of subscription {subscription_id}"
            answer = _peeked_elsewhere("subscription", subscription_id, admin) or peek_json(
                service.peek_subscription(subscription_id, PAGE_PEEK)
            )
        elif pull_point_id:
            title = f"Waiting messages of pull point {pull_point_id}"
            answer = _peeked_elsewhere("pull point", pull_point_id, admin) or peek_json(
                service.peek_pull_point(pull_point_id, PAGE_PEEK)
            )
        elif request.args.get("peek") == "dead-letters":
            title = "Dead letters' messages"
            letters = service.dead_letters()[:PAGE_PEEK]
            answer = {"complete": True, "note": None, "dead_letters": [
                letter.summary() | {"body": letter.body.decode("utf-8", "replace")}
                for letter in letters
            ]}  # fmt: skip
        else:
            return None
    except errors.ResourceUnknown as exc:
        return {"title": "Waiting messages", "error": exc.description}
    except errors.WsnError as exc:
        return {"title": "Waiting messages", "error": f"{exc.fault_name}: {exc.description}"}
    return {"title": title, **answer}


def _peeked_elsewhere(kind: str, resource_id: str, admin: str) -> dict[str, Any] | None:
    """The page's peek of a backlog another instance holds, as that instance's API
    answered it; None when this instance holds it."""
    segment = "pullpoints" if kind == "pull point" else "subscriptions"
    sent = elsewhere(
        kind,
        resource_id,
        admin,
        api_path=f"{ADMIN_API_PREFIX}/{segment}/{resource_id}/peek",
        query=f"count={PAGE_PEEK}",
    )
    if sent is None:
        return None
    if sent.status_code == 404:
        raise errors.ResourceUnknown(f"no {kind} {resource_id!r}")
    try:
        data = json.loads(sent.get_data())
    except ValueError:  # not the API's answer (a limit of the instance's own): its text
        data = {"error": sent.get_data(as_text=True).strip()}
    if sent.status_code != 200 or not isinstance(data, dict):
        error = data.get("error") if isinstance(data, dict) else None
        raise errors.ResourceUnavailable(str(error or f"HTTP {sent.status_code}"))
    answer: dict[str, Any] = data
    return answer


@admin_api.get("/overview")
def overview() -> Response:
    """Everything the admin page shows."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    try:
        limit = max(1, int(request.args.get("limit", DEFAULT_LIMIT)))
    except ValueError:
        return _error("limit must be a number", 400)
    service = _service()
    data = overview_json(service.overview(limit), service.broker_address, limit)
    data["node"] = node_json(_settings())
    data["cluster"] = cluster_json(service.cluster_status())
    data["upstreams"] = _upstream_states()
    return _json(data)


@admin_api.get("/cluster")
def cluster() -> Response:
    """This instance and every instance sharing its store: shards, leases, heartbeats."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    return _json(cluster_json(_service().cluster_status()))


@admin_api.get("/subscriptions")
def list_subscriptions() -> Response:
    """The live subscriptions that match the query, one page of them (:mod:`.admin_query`).
    Searching, sorting and paging look at a few fields of each subscription (delivery
    states only when the query needs them); the page's subscriptions are then read in
    full, with their backlogs from the middleware.  Sorted by backlog, the middleware is
    asked for all of them at once; the page shows the backlogs and delivery states it was
    searched and sorted by."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    service = _service()
    by_backlog = request.args.get("sort") == "backlog"
    with_delivery = needs_delivery(request.args)
    rows = service.subscription_rows(depths=by_backlog, delivery=with_delivery)
    try:
        matched, offset, limit, page = query_subscriptions(rows, request.args)
    except QueryError as exc:
        return _error(str(exc), 400)
    statuses = (
        service.subscription_statuses([r.id for r in page], depths=not by_backlog) if page else []
    )
    if with_delivery:
        read = {r.id: r for r in page}
        statuses = [
            replace(
                s,
                waiting=read[s.record.id].waiting if by_backlog else s.waiting,
                delivery=read[s.record.id].delivery,
            )
            for s in statuses
        ]
    return _json(
        {
            "count": matched,
            "total": len(rows),
            "offset": offset,
            "limit": limit,
            "subscriptions": [status_json(s) for s in statuses],
        }
    )


def _detail(service: BrokerPort, subscription_id: str) -> dict[str, Any] | None:
    """One subscription's page data (None: there is no such subscription)."""
    try:
        status = service.subscription_status(subscription_id)
    except errors.ResourceUnknown:
        return None
    data = status_json(status)
    data["pending"] = status.backlog
    data["attempts"] = attempts_json(status.delivery)
    try:
        letters = service.dead_letters()
    except errors.WsnError:  # the middleware does not answer: the rest of the page does
        letters = []
    data["dead_letters"] = [d.summary() for d in letters if d.subscription_id == subscription_id]
    return data


@admin_api.get("/subscriptions/<subscription_id>")
def show_subscription(subscription_id: str) -> Response:
    """One subscription with its backlog, delivery state and last delivery attempts."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    data = _detail(_service(), subscription_id)
    if data is None:
        return _error(f"no subscription {subscription_id!r}", 404)
    return _json(data)


def peek_count() -> int:
    """``?count=`` of a peek (:data:`DEFAULT_PEEK`); ValueError for anything but a
    number from 1 to ``core.peek.MAX_PEEK``."""
    text = request.args.get("count") or str(DEFAULT_PEEK)
    try:
        count = int(text)
    except ValueError:
        raise ValueError("count must be a number") from None
    if not 1 <= count <= MAX_PEEK:
        raise ValueError(f"count must be from 1 to {MAX_PEEK}")
    return count


def _peek(kind: str, resource_id: str, read: Callable[[int], PeekResult]) -> Response:
    """A peek's answer: 200 with the messages (``complete`` False and a ``note`` where
    the middleware cannot show its part), 400, 404 or 503."""
    caller = _caller()
    if (refused := _refused_reading(caller)) is not None:
        return refused
    assert isinstance(caller, AdminCaller)
    if (sent := elsewhere(kind, resource_id, str(caller.principal))) is not None:
        return sent
    try:
        result = read(peek_count())
    except ValueError as exc:
        return _error(str(exc), 400)
    except errors.ResourceUnknown:
        return _error(f"no {kind} {resource_id!r}", 404)
    except errors.ResourceUnavailable as exc:
        retry = exc.retry_after
        headers = (("Retry-After", str(max(1, round(retry)))),) if retry else ()
        return _error(exc.description, 503, headers)
    return _json(peek_json(result))


@admin_api.get("/subscriptions/<subscription_id>/peek")
def peek_subscription(subscription_id: str) -> Response:
    """The first messages of a subscription's backlog, left where they are."""
    service = _service()
    return _peek(
        "subscription",
        subscription_id,
        lambda n: service.peek_subscription(subscription_id, n),
    )


@admin_api.get("/pullpoints/<pull_point_id>/peek")
def peek_pull_point(pull_point_id: str) -> Response:
    """The first messages waiting in a pull point, left where they are."""
    service = _service()
    return _peek("pull point", pull_point_id, lambda n: service.peek_pull_point(pull_point_id, n))


@admin_api.get("/pullpoints")
def list_pull_points() -> Response:
    """Every live pull point with the messages waiting in it, oldest first."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    items = [pull_point_json(p) for p in _service().overview(0).pull_points]
    return _json({"count": len(items), "pull_points": items})


@admin_api.get("/pullpoints/<pull_point_id>")
def show_pull_point(pull_point_id: str) -> Response:
    """One pull point."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    for status in _service().overview(0).pull_points:
        if status.record.id == pull_point_id:
            return _json(pull_point_json(status))
    return _error(f"no pull point {pull_point_id!r}", 404)


@admin_api.get("/registrations")
def list_registrations() -> Response:
    """Every live publisher registration, oldest first."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    items = [registration_json(r) for r in _service().overview(0).registrations]
    return _json({"count": len(items), "registrations": items})


@admin_api.get("/history")
def history() -> Response:
    """The last hour of traffic: per-second rates and the backlog, oldest first."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    return _json(history_json(_service().rate_history()))


@admin_api.get("/charts/<any(notifications, deliveries, failures, backlog):series>.svg")
def chart(series: str) -> Response:
    """One series of the last hour as an SVG image (the admin page's charts).  Refused
    without an authentication challenge: the page loads these as images, and a challenge
    would make the browser open its own password dialog over the page's sign-in."""
    if (refused := _refused_reading(_caller())) is not None:
        return _error("not allowed to read the charts", refused.status_code)
    image = chart_svg(_service().rate_history(), series, time.time())
    return Response(image, content_type="image/svg+xml", headers={"Cache-Control": "no-store"})


@admin_api.get("/topics")
def list_topics() -> Response:
    """Every topic the gateway published on since it started, with counts and rates."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    view = _service().overview(0)
    items = [topic_json(t) for t in view.topics]
    return _json({"count": len(items), "topics": items, "forgotten": view.topics_forgotten})
