"""Runtime assembly and the HTTP surface over a real service (embedded adapter)."""

from __future__ import annotations

import time
from pathlib import Path

from wsnmom.server import build_runtime

from .conftest import RecordingOutbound, runtime_settings


def test_build_runtime_serves_health_policy_and_metrics(tmp_path: Path) -> None:
    settings = runtime_settings(tmp_path, port=8123)
    runtime = build_runtime(settings, outbound=RecordingOutbound())
    try:
        client = runtime.app.test_client()
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200
        policy = client.get("/wsn/policy")
        assert policy.status_code == 200 and b"AND" in policy.data
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and b"wsnmom_subscriptions" in metrics.data
        assert runtime.service.broker_address == "http://127.0.0.1:8123/wsn/broker"
    finally:
        runtime.close()
    assert (tmp_path / "store.db").exists()


def test_build_runtime_default_outbound_client(tmp_path: Path) -> None:
    settings = runtime_settings(tmp_path)
    runtime = build_runtime(settings)
    try:
        assert type(runtime.service.outbound).__name__ == "SoapClient"
    finally:
        runtime.close()


def test_policy_advertises_the_order_the_adapter_keeps(tmp_path: Path) -> None:
    """DeliveryOrder follows ``Capabilities.ordering``: FIFO per subscription on the
    embedded adapter, per partition on a log-shaped one (Kafka, the file log), where one
    subscription can receive a 4-partition topic's records interleaved."""
    seen = {}
    for scheme in ("embedded", "filelog"):
        settings = runtime_settings(
            tmp_path,
            adapter_url=f"{scheme}://{tmp_path}/{scheme}",
            store_url=f"sqlite:///{tmp_path}/{scheme}.db",
        )
        runtime = build_runtime(settings, outbound=RecordingOutbound())
        try:
            policy = runtime.app.test_client().get("/wsn/policy")
            assert policy.status_code == 200
            seen[scheme] = policy.data.decode()
        finally:
            runtime.close()
    assert "FIFO per subscription<" in seen["embedded"]
    assert "FIFO per subscription<" not in seen["filelog"]
    assert "FIFO per partition of the middleware's log" in seen["filelog"]


def test_metrics_carry_each_subscriptions_backlog(tmp_path: Path) -> None:
    """``wsnmom_subscription_backlog_messages{subscription}``: one subscription's lag, here
    of one whose consumer is down (its notifications wait, retried)."""
    import re

    from lxml import etree

    from tests.support.soap import content_type, envelope, notify_body, subscribe_body

    settings = runtime_settings(tmp_path, retry={"initial_delay": 3600, "max_delay": 3600})
    outbound = RecordingOutbound(down={"http://127.0.0.1:9/down", "http://127.0.0.1:9/up"})
    runtime = build_runtime(settings, outbound=outbound)
    try:
        client = runtime.app.test_client()

        def post(body: str) -> bytes:
            resp = client.post("/wsn/broker", data=envelope(body), content_type=content_type())
            assert resp.status_code in (200, 202), resp.data
            return bytes(resp.data)

        ids = []
        for consumer in ("http://127.0.0.1:9/down", "http://127.0.0.1:9/up"):
            answer = etree.fromstring(post(subscribe_body(consumer, "tns:t")))
            address = answer.find(".//{*}SubscriptionReference/{*}Address")
            assert address is not None and address.text
            ids.append(address.text.rsplit("/", 1)[1])
        outbound.down.discard("http://127.0.0.1:9/up")
        post(notify_body(*[("tns:t", f"<m>{i}</m>") for i in range(3)]))

        def backlogs() -> dict[str, float]:
            text = client.get("/metrics").data.decode()
            pattern = r'^wsnmom_subscription_backlog_messages\{subscription="(\w+)"\} (\S+)$'
            return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}

        deadline = time.monotonic() + 30
        while backlogs() != {ids[0]: 3.0, ids[1]: 0.0}:
            assert time.monotonic() < deadline, backlogs()
            time.sleep(0.05)
    finally:
        runtime.close()
