"""Pull fan-out on RabbitMQ (issue 29, docs/performance.md F8): 400 pull points, each sent
one Notify, drained with concurrent GetMessages: all get their message, once, and none
answers 503.
(The bench's fan-out scenario feeds them through subscriptions; here the Notify goes to the
pull point itself, which halves the queues the test has to create and keeps it short.)

Before the fix every GetMessages was a ``basic.get`` round trip on a channel opened on the
first one, and at 10,000 pull points a drain answered ``503 ... not reachable``; now the
pull points (and the subscriptions feeding them) are consumed with prefetch into core's
pull buffer and GetMessages reads memory.  The count is not what catches that defect: this
test with 2,000 points (its count until 2026-12) passed on the code before the fix
(c97e6ac), fed through subscriptions and fed directly, at load 5-20 (docs/testing.md,
"Where the time goes").  The defect's own scale is the bench's (10,000, scenario 3); here
400 points keep 25 per concurrent client, so every drain round keeps all 16 clients busy.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.fixtures.server import RunningServer
from tests.support.soap import (
    body_child,
    content_type,
    envelope,
    epr_address,
    notify_body,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.e2e, pytest.mark.slow]

POINTS = 400
#: concurrent HTTP clients, as many as the gateway has worker threads
CLIENTS = 16
NO_QUOTAS = {
    f"WSNMOM_QUOTAS__{name.upper()}": "none"
    for name in ("subscriptions", "pull_points", "total_subscriptions", "total_pull_points")
}


@pytest.fixture
def gateway(rabbitmq_url: str) -> Iterator[RunningServer]:
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-pullfan-"))
    server = RunningServer(
        "rabbitmq", rabbitmq_url, data_dir, extra_env={"WSNMOM_THREADS": str(CLIENTS), **NO_QUOTAS}
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_400_pull_points_drained_concurrently_get_every_message_without_503(
    gateway: RunningServer,
) -> None:
    ns = f"urn:test:pullfan:{uuid.uuid4().hex[:12]}"
    broker = gateway.broker_url
    local = threading.local()

    def post(url: str, body: str) -> requests.Response:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        return session.post(
            url, data=envelope(body), headers={"Content-Type": content_type()}, timeout=60
        )

    def create(_: int) -> str:
        resp = post(broker, "<wsnt:CreatePullPoint/>")
        assert resp.status_code == 200, resp.content
        return epr_address(body_child(resp.content).find("{*}PullPoint"))

    def notify(pp: str) -> int:
        return post(pp, notify_body(("tns:fan", "<m>fan</m>"), ns=ns)).status_code

    def drain(pp: str) -> tuple[int, int]:
        resp = post(
            pp, "<wsnt:GetMessages><wsnt:MaximumNumber>10</wsnt:MaximumNumber></wsnt:GetMessages>"
        )
        if resp.status_code != 200:
            return resp.status_code, 0
        found = body_child(resp.content).findall("{*}NotificationMessage")
        return 200, len(found)

    with ThreadPoolExecutor(CLIENTS) as pool:
        points = list(pool.map(create, range(POINTS)))
        assert set(pool.map(notify, points)) == {202}
        got = dict.fromkeys(points, 0)
        statuses: set[int] = set()
        pending = list(points)
        deadline = time.monotonic() + 120
        while pending and time.monotonic() < deadline:  # rounds until all had their message
            answers = list(pool.map(drain, pending))
            for pp, (status, n) in zip(pending, answers, strict=True):
                statuses.add(status)
                got[pp] += n
            pending = [pp for pp in pending if got[pp] == 0]
    assert statuses == {200}, statuses  # never a 503 (nor anything else)
    assert not pending, f"{len(pending)} of {POINTS} pull points never got the message"
    assert set(got.values()) == {1}, "a pull point got the message more than once"
