"""The baselines that do the same work as the gateway (docs/performance.md, scenarios 1 and
2): the serialising Notify endpoint of bench/baseline_app.py and the minimal relay of
bench/relay.py, alone and inside a smoke-sized delivery scenario that reports the new and the old
ratio side by side.

These check that the baselines run, do their work and yield numbers; they never assert a
target.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench import client, soap
from bench.baseline_app import NOTIFY_PATH, SERIALISING_NOTIFY_PATH, BaselineServer
from bench.consumer import ConsumerProcess
from bench.relay import RelayServer, is_loopback_url
from tests.support.bench_runs import smoke_report

#: a Notify whose only NotificationMessage has an empty wsnt:Message
_NO_PAYLOAD = (
    "<wsnt:Notify><wsnt:NotificationMessage><wsnt:Message/></wsnt:NotificationMessage>"
    "</wsnt:Notify>"
)


@pytest.fixture(scope="module")
def baseline() -> Iterator[BaselineServer]:
    server = BaselineServer(4).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def consumer() -> Iterator[ConsumerProcess]:
    proc = ConsumerProcess().start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def relay(consumer: ConsumerProcess) -> Iterator[RelayServer]:
    server = RelayServer(4, consumer.base_url + "/c/relayed").start()
    try:
        yield server
    finally:
        server.stop()


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    kc = client.KeepAliveClient(timeout=30)
    try:
        return kc.post(url, body)
    finally:
        kc.close()


@pytest.mark.timeout(60)
def test_serialising_endpoint_takes_every_payload(baseline: BaselineServer) -> None:
    url = baseline.base_url + SERIALISING_NOTIFY_PATH
    assert _post(url, soap.notify(url, "t", messages=100))[0] == 202
    assert _post(url, soap.notify(url, "t", messages=1))[0] == 202
    # it looks at each payload: a message without one is refused, the parse-only one takes it
    empty = soap.envelope(soap.ACTION_NOTIFY, url, _NO_PAYLOAD)
    status, text = _post(url, empty)
    assert status == 400 and b"without payload" in text
    assert _post(baseline.base_url + NOTIFY_PATH, empty)[0] == 202
    none = soap.envelope(soap.ACTION_NOTIFY, url, "<wsnt:Notify/>")
    assert _post(url, none)[0] == 400


@pytest.mark.timeout(60)
def test_relay_delivers_every_message(relay: RelayServer, consumer: ConsumerProcess) -> None:
    url = relay.notify_url
    # 1 to 3 messages per Notify, 16 concurrent keep-alive publishers
    requests = [
        client.Request(url, soap.notify(url, "t", messages=1 + i % 3, seq0=i)) for i in range(150)
    ]
    answers, _ = client.run_requests(requests, processes=1, threads=16)
    assert [status for status, _ in answers] == [202] * len(requests)
    # the relay answers after the consumer did: everything is there already
    stats = consumer.stats()
    assert stats["requests"] == len(requests)
    assert stats["messages"] == sum(1 + i % 3 for i in range(150))
    assert stats["distinct_paths"] == 1


@pytest.mark.timeout(60)
def test_relay_refuses_a_notify_without_messages_and_reports_a_lost_consumer(
    relay: RelayServer, consumer: ConsumerProcess
) -> None:
    url = relay.notify_url
    assert _post(url, soap.envelope(soap.ACTION_NOTIFY, url, "<wsnt:Notify/>"))[0] == 400
    assert consumer.stats()["requests"] == 0
    consumer.stop()
    status, text = _post(url, soap.notify(url, "t"))
    assert status == 502 and b"consumer" in text


def test_relay_forwards_to_loopback_only() -> None:
    assert is_loopback_url("http://127.0.0.1:8/c") and is_loopback_url("http://[::1]:8/")
    assert is_loopback_url("http://localhost:8/") and is_loopback_url("http://127.9.9.9/")
    for url in ("http://10.0.0.1/", "http://example.org/", "ftp://127.0.0.1/", "127.0.0.1"):
        assert not is_loopback_url(url)
        with pytest.raises(ValueError, match="loopback"):
            RelayServer(4, url)


@pytest.fixture(scope="module")
def delivery_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "report.json"
    data, _ = smoke_report(out, "delivery", timeout=240)
    return data


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_delivery_reports_the_relay_and_the_raw_client_ratios(
    delivery_report: dict[str, Any],
) -> None:
    (res,) = delivery_report["results"]
    assert res["status"] == "ok", res.get("reason")
    metrics = {m["name"]: m for m in res["metrics"]}
    new, old = metrics["push_throughput"], metrics["push_throughput_vs_raw_client"]
    assert new["value"] == old["value"] > 0
    assert "relay" in new["baseline_name"] and "raw embedded" in old["baseline_name"]
    assert new["target"] == {"op": ">=", "threshold": 0.5, "on": "ratio"}
    assert new["passed"] is (new["ratio"] >= 0.5)
    assert old["target"] is None and old["passed"] is None and "old definition" in old["note"]
    for m in (new, old):
        assert m["baseline"] > 0 and m["ratio"] == pytest.approx(m["value"] / m["baseline"])
    # the relay ran before and after the gateway and delivered every Notify both times
    count = res["details"]["count"]
    relays = res["details"]["relay"]
    assert len(relays) == 2
    for run in relays:
        assert run["accepted"] == run["delivered"] == count and run["complete"]
        assert run["msgs_per_s"] > 0
    assert new["baseline"] == max(r["msgs_per_s"] for r in relays)
    assert new["note"] is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_delivery_reports_the_relays_latency_at_the_same_rate(
    delivery_report: dict[str, Any],
) -> None:
    (res,) = delivery_report["results"]
    metrics = {m["name"]: m for m in res["metrics"]}
    relay = metrics["latency_p99_half_load_relay"]
    assert relay["value"] > 0 and relay["target"] is None
    offered = res["details"]["offered_rate"]
    assert f"{offered:,.0f} msg/s" in relay["note"]
    # the embedded adapter has no raw client latency of its own (Kafka measures one)
    assert "latency_p99_half_load_raw_client" not in metrics
