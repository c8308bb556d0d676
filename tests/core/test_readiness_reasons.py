"""``/readyz`` and the 503 refusals say why the middleware is missing (issue 23): the first
line as before ("not ready: the middleware does not answer"), then a ``middleware: NAME:
why`` line with what the adapter says (``Adapter.unavailable_reason``), through the one
redaction rule, on one line; an adapter that says nothing (the default) gets a line too;
before the broker started, what its last attempt to open the adapter raised.  A real
gateway runtime on the embedded adapter, which the test makes unreachable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from wsnmom.adapters.embedded.adapter import EmbeddedAdapter
from wsnmom.core.adapter import Adapter, AdapterUnavailable
from wsnmom.core.config import load_settings

from tests.support.soap import content_type, envelope, fault_name, notify_body
from tests.support.waiting import wait_until
from wsnmom.server import Runtime, build_runtime

from .conftest import RecordingOutbound

#: what an adapter might carelessly say: a password in a URL, a line break
CARELESS = "cannot connect to amqp://gateway:s3cret@10.0.0.7:5672/:\n\tconnection refused"
#: the same, as the gateway shows it
SHOWN = "cannot connect to amqp://gateway:***@10.0.0.7:5672/: connection refused"


class _Down(EmbeddedAdapter):
    """The embedded adapter, unreachable while ``down`` (no ping, not available) and
    saying why; ``refuse_open``: its ``open`` fails as an unreachable middleware's."""

    down = False
    refuse_open = False

    def open(self) -> None:
        if self.refuse_open:
            raise AdapterUnavailable(CARELESS)
        super().open()

    def ping(self, timeout: float = 1.0) -> bool:
        return not self.down and super().ping(timeout)

    def available(self) -> bool:
        return not self.down and super().available()

    def unavailable_reason(self) -> str | None:
        return CARELESS if self.down else super().unavailable_reason()


class _Silent(_Down):
    """A third-party adapter that does not implement ``unavailable_reason``."""

    unavailable_reason = Adapter.unavailable_reason


def runtime(tmp_path: Path, adapter: EmbeddedAdapter, *, wait: bool = False) -> Runtime:
    settings = load_settings(
        None,
        environ={"WSNMOM_MIDDLEWARE__GRACE": "0"},  # refused at once: no wait for a return
        overrides={
            "adapter_url": adapter.url,
            "store_url": f"sqlite:///{tmp_path}/store.db",
            "data_dir": str(tmp_path),
        },
    )
    return build_runtime(settings, outbound=RecordingOutbound(), adapter=adapter, wait=wait)


@pytest.fixture
def down(tmp_path: Path) -> Iterator[tuple[_Down, FlaskClient]]:
    adapter = _Down(f"embedded://{tmp_path}/mw")
    rt = runtime(tmp_path, adapter)
    try:
        yield adapter, rt.app.test_client()
    finally:
        rt.close()


def readyz(client: FlaskClient) -> tuple[int, str]:
    answer = client.get("/readyz")
    return answer.status_code, answer.get_data(as_text=True)


def notify(client: FlaskClient) -> tuple[int, bytes]:
    answer = client.post(
        "/wsn/broker",
        data=envelope(notify_body(("tns:t", "<m/>"), ns="urn:test:reasons")),
        headers={"Content-Type": content_type()},
    )
    return answer.status_code, answer.get_data()


def test_readyz_and_the_refusal_say_why_without_credentials(
    down: tuple[_Down, FlaskClient],
) -> None:
    adapter, client = down
    assert readyz(client) == (200, "ready\n")
    adapter.down = True
    assert readyz(client) == (
        503,
        f"not ready: the middleware does not answer\nmiddleware: embedded: {SHOWN}\n",
    )
    status, body = notify(client)
    assert (status, fault_name(body)) == (503, "ResourceUnavailableFault")
    assert f"the middleware (embedded) is not reachable: {SHOWN}; retry later".encode() in body
    assert b"s3cret" not in body
    client.environ_base["REMOTE_ADDR"] = "127.0.0.1"  # the admin API's local operator
    health = client.get("/wsn/admin/api/overview").get_json()["health"]
    assert (health["ready"], health["reason"], health["store_reason"]) == (False, SHOWN, "")
    adapter.down = False
    assert readyz(client) == (200, "ready\n")
    assert notify(client)[0] == 202


def test_an_adapter_that_says_nothing_gets_a_reason_line(tmp_path: Path) -> None:
    adapter = _Silent(f"embedded://{tmp_path}/mw")
    rt = runtime(tmp_path, adapter)
    try:
        client = rt.app.test_client()
        adapter.down = True
        assert readyz(client) == (
            503,
            "not ready: the middleware does not answer\n"
            "middleware: embedded: no answer to a ping within 1 s\n",
        )
        status, body = notify(client)
        assert status == 503
        assert b"the middleware (embedded) is not reachable; retry later" in body
    finally:
        rt.close()


def test_before_the_broker_starts_the_reason_is_why_opening_failed(tmp_path: Path) -> None:
    adapter = _Down(f"embedded://{tmp_path}/mw")
    adapter.refuse_open = True
    rt = runtime(tmp_path, adapter, wait=True)
    try:
        client = rt.app.test_client()
        expected = (
            503,
            "not ready: the broker is starting: its middleware has not answered yet\n"
            f"middleware: embedded: {SHOWN}\n",
        )
        wait_until(lambda: readyz(client) == expected, 10, what=f"/readyz {expected}")
        status, body = notify(client)
        assert status == 503
        assert f"its middleware is not reachable yet: {SHOWN}".encode() in body
        assert b"s3cret" not in body
        adapter.refuse_open = False  # the connector's next attempt opens it
        wait_until(lambda: readyz(client) == (200, "ready\n"), 30, what="/readyz ready")
    finally:
        if rt.connector is not None:
            rt.connector.stop()
        rt.close()
