"""What a single Kafka gateway saves of its subscriptions' positions, and when:

* a clean stop (SIGTERM) of a gateway with many push subscriptions that received and
  acknowledged messages saves where every one of them is, with no save failure (a
  periodic save stuck on a dropped connection no longer spends the close's deadline):
  after the restart nothing acknowledged before the stop comes again (a sentinel
  published after the restart reaches every subscription, and is the only message each
  gets);
* a pull point's purge answers once its new position is saved: a gateway killed (SIGKILL)
  right after the purge returned does not hand the purged messages out after its restart.

docs/adapters/kafka.md ("Positions at shutdown", "Purge") describes both."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import AdminClient

from tests.cluster.test_kafka_groups import groups
from tests.e2e.conftest import Wsn
from tests.fixtures.server import ConsumerServer, RunningServer, kafka_gateway_url
from tests.support.soap import NS
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.slow]

KILLPOINT = Path(__file__).parent.parent / "support" / "killpoint"
#: push subscriptions of the shutdown test (the bench's single instance had 131 when its
#: shutdown saves timed out)
SUBSCRIPTIONS = 60
SENTINEL = 10**9


def numbers(elements: list) -> list[int]:  # type: ignore[type-arg]
    return [int(m.findtext("wsnt:Message/{urn:n}n", namespaces=NS) or -1) for m in elements]


def note(i: int) -> tuple[str, str]:
    return ("tns:saves", f'<n xmlns="urn:n">{i}</n>')


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="wsnmom-kafka-saves-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_clean_stop_saves_every_subscriptions_position(
    kafka_url: str, kafka_bootstrap: str, consumer: ConsumerServer, data_dir: Path
) -> None:
    """Many push subscriptions, and a pull point whose own consumer group was made (its
    messages waited unread past ``pin_seconds``) and deleted (drained) before the stop:
    the first save to that group after its delete made tansu drop the connection of the
    saves in flight with it."""
    tag = uuid.uuid4().hex[:10]
    server = RunningServer("kafka", kafka_gateway_url(kafka_url, tag), data_dir)
    server.start()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    prefix = f"wsnmom.sub.{tag}."
    try:
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        paths = [f"/s{i}" for i in range(SUBSCRIPTIONS)]
        for path in paths:
            wsn.subscribe(consumer.address(path), "tns:saves")
        _, pull_point = wsn.create_pull_point()
        pulled = wsn.subscribe(pull_point, "tns:saves")
        for i in range(3):
            wsn.notify(note(i))

        def got(wanted: set[int]) -> bool:
            seen: dict[str, set[int]] = {p: set() for p in paths}
            for rec in consumer.notifies():
                if rec.path in seen:
                    seen[rec.path].update(numbers(_messages(rec)))
            return all(wanted <= s for s in seen.values())

        wait_until(lambda: got({0, 1, 2}), 60, what="every message at every subscription")
        group = prefix + pulled.id
        wait_until(lambda: group in groups(admin, prefix), 30, what="the unread feed's group")
        drained: list[int] = []

        def all_pulled() -> bool:
            drained.extend(numbers(wsn.get_messages(pull_point)))
            return sorted(drained) == [0, 1, 2]

        wait_until(all_pulled, 30, what="the pull point drained")
        wait_until(lambda: group not in groups(admin, prefix), 30, what="its group deleted")
        before = len(consumer.notifies())
        server.stop(timeout=30)
        assert server.process is not None and server.process.returncode == 0
        log = server.log_path.read_text(errors="replace")
        assert "saving subscription positions at close failed" not in log, log[-3000:]
        server.start()
        wsn.notify(note(SENTINEL))
        wait_until(lambda: got({SENTINEL}), 60, what="the sentinel at every subscription")
        again = Counter(n for rec in consumer.notifies()[before:] for n in numbers(_messages(rec)))
        assert again == {SENTINEL: SUBSCRIPTIONS}, again

        def sentinel_pulled() -> bool:
            drained.extend(numbers(wsn.get_messages(pull_point)))
            return SENTINEL in drained

        wait_until(sentinel_pulled, 30, what="the sentinel in the pull point")
        assert sorted(drained) == [0, 1, 2, SENTINEL]
    finally:
        server.stop()


def _messages(rec: object) -> list:  # type: ignore[type-arg]
    child = rec.body_child  # type: ignore[attr-defined]
    return list(child.iter("{http://docs.oasis-open.org/wsn/b-2}NotificationMessage"))


def test_a_pull_points_purge_answered_is_not_undone_by_a_kill(
    kafka_url: str, data_dir: Path
) -> None:
    """The gateway SIGKILLs itself right after the purge returned (test-only killpoint,
    tests/support/killpoint): the purge had said the ten messages are gone, so the
    restarted gateway hands out only the sentinel published after."""
    path = os.pathsep.join(p for p in (str(KILLPOINT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "KILLPOINT_AFTER_PURGE": "1"}
    server = RunningServer("kafka", kafka_gateway_url(kafka_url), data_dir, extra_env=env)
    server.start()
    try:
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        pp_id, pp_address = wsn.create_pull_point()
        for i in range(10):
            wsn.notify(note(i), url=pp_address)
        api = f"{server.base_url}/wsn/admin/api/pullpoints/{pp_id}"

        def waiting() -> int:
            return int(requests.get(api, timeout=30).json()["waiting"])

        wait_until(lambda: waiting() == 10, 30, what="the ten messages waiting")
        with pytest.raises(requests.ConnectionError):
            requests.post(f"{api}/purge", timeout=60)
        assert server.process is not None
        assert wait_until(server.process.poll, 30, what="the killed gateway's end") == -9
        server.start()
        wsn.notify(note(SENTINEL), url=pp_address)
        pulled: list[int] = []

        def drained() -> bool:
            pulled.extend(numbers(wsn.get_messages(pp_address)))
            return SENTINEL in pulled

        wait_until(drained, 30, what="the sentinel in the pull point")
        assert pulled == [SENTINEL]
    finally:
        server.stop()
