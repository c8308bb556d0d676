"""Runtime assembly and the HTTP surface over a real service (embedded adapter)."""

from __future__ import annotations

from pathlib import Path

from wsnmom.core.config import load_settings

from wsnmom.server import build_runtime

from .conftest import RecordingOutbound


def test_build_runtime_serves_health_policy_and_metrics(tmp_path: Path) -> None:
    settings = load_settings(
        None,
        environ={},
        overrides={
            "adapter_url": f"embedded://{tmp_path}/mw",
            "store_url": f"sqlite:///{tmp_path}/store.db",
            "port": 8123,
        },
    )
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
    settings = load_settings(
        None,
        environ={},
        overrides={
            "adapter_url": f"embedded://{tmp_path}/mw",
            "store_url": f"sqlite:///{tmp_path}/store.db",
        },
    )
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
        settings = load_settings(
            None,
            environ={},
            overrides={
                "adapter_url": f"{scheme}://{tmp_path}/{scheme}",
                "store_url": f"sqlite:///{tmp_path}/{scheme}.db",
            },
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
