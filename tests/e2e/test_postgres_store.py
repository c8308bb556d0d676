"""A gateway on a PostgreSQL store (``--store postgresql://...``), over HTTP: its
resources are rows in PostgreSQL and survive a restart, a second gateway started on the
same store after the first one stopped finds them, and while PostgreSQL is down the
operations that need the store answer at once with a Receiver fault and HTTP 503 (not a
500) and ``/readyz`` says 503, until PostgreSQL is back, without a restart."""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from wsnmom.core.store_url import open_store

from tests.fixtures.postgres import PostgresNode, fresh_database
from tests.support.waiting import wait_until
from wsnmom.client.errors import ResourceUnavailableFault
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e]

TOPIC = "{urn:pgstore}sensors/t1"


def payload(i: int) -> str:
    return f'<n xmlns="urn:n">{i}</n>'


def readyz(gateway: Gateway) -> int:
    return readyz_answer(gateway)[0]


def readyz_answer(gateway: Gateway) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(gateway.base_url + "/readyz", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def wait_for(what: str, check: Callable[[], object], timeout: float = 30.0) -> None:
    wait_until(check, timeout, what=what, interval=0.1)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="wsnmom-pgstore-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_resources_live_in_postgres_and_survive_a_restart(
    postgres_store_url: str, data_dir: Path
) -> None:
    gateway = Gateway(
        "embedded", f"embedded://{data_dir}/mw", data_dir, store_url=postgres_store_url
    )
    gateway.start()
    try:
        client = gateway.client()
        pull_point = client.create_pull_point(name="pg-kept")
        subscription = client.subscribe(pull_point.reference, TOPIC)
        client.notify(payload(1), TOPIC)
        wait_for("the first message in the pull point", lambda: pull_point.get_messages())
        store = open_store(postgres_store_url)
        try:
            assert [s.id for s in store.list_subscriptions()] == [subscription.id]
            assert store.find_pull_point("pg-kept") is not None
        finally:
            store.close()
        gateway.restart()
        client = gateway.client()
        client.notify(payload(2), TOPIC)
        got: list[str] = []

        def drained() -> bool:
            got.extend(
                n.payload.text or "" for n in client.pull_point(pull_point.reference).get_messages()
            )
            return "2" in got

        wait_for("the message published after the restart", drained)
        assert got == ["2"]
    finally:
        gateway.stop()


def test_store_outage_answers_503_and_recovers_without_restart(data_dir: Path) -> None:
    node = PostgresNode()
    try:
        node.start()
        with fresh_database(node.url) as url:
            gateway = Gateway("embedded", f"embedded://{data_dir}/mw", data_dir, store_url=url)
            gateway.start()
            try:
                client = gateway.client()
                kept = client.create_pull_point()
                node.stop()
                wait_for("/readyz 503 while PostgreSQL is down", lambda: readyz(gateway) == 503)
                # the first line names the dependency, the next one says why (a probe of
                # the stopped server: nothing listens on its port)
                wait_for(
                    "/readyz to say that PostgreSQL refuses connections",
                    lambda: "Connection refused" in readyz_answer(gateway)[1],
                )
                status, body = readyz_answer(gateway)
                first, store, *rest = body.splitlines()
                assert (status, first, rest) == (503, "not ready: the store does not answer", [])
                assert store.startswith("store: the PostgreSQL store is not answering: "), body
                assert f"port {node.port} failed: Connection refused" in store, body
                started = time.monotonic()
                with pytest.raises(ResourceUnavailableFault) as caught:
                    client.create_pull_point()
                assert caught.value.status == 503
                assert "store" in str(caught.value)
                assert time.monotonic() - started < 15  # one connect timeout, no hang
                node.start()
                wait_for("/readyz 200 once PostgreSQL is back", lambda: readyz(gateway) == 200)
                again = gateway.client().create_pull_point()
                client.notify(payload(3), to=kept.reference)
                wait_for(
                    "a message in the pull point made before the outage",
                    lambda: client.pull_point(kept.reference).get_messages(),
                )
                assert again.reference.address != kept.reference.address
            finally:
                gateway.stop()
    finally:
        node.cleanup()
