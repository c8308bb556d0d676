"""The GetMessages loads of :mod:`bench.ab`: ``get`` (1 message per GetMessages) and
``get-10`` (10 per GetMessages) on one pull point subscribed to the comparison's topic.

Before each round the pull point is filled (100-message Notifies, confirmed before their
answer), then one keep-alive client sends GetMessages one after the other until it has
read them all; the round counts the server's CPU time and each GetMessages' time from
request to the end of its answer (the client's latency) over the reads only.  On RabbitMQ
the gateways read with ``pull = "get"`` (``basic.get`` per GetMessages), set on both
sides' adapter URL.
"""

from __future__ import annotations

import time

from bench import client, soap
from bench.server import ServerProcess
from bench.util import percentile, process_cpu_seconds

#: load name -> messages per GetMessages
GET_LOADS = {"get": 1, "get-10": 10}
#: messages per filling Notify
FILL_BATCH = 100


def adapter_url(adapter: str, url: str) -> str:
    """``url`` with the adapter option the GetMessages loads measure (RabbitMQ: ``pull =
    "get"``); other adapters' own pull needs none."""
    if adapter != "rabbitmq":
        return url
    return url + ("&" if "?" in url else "?") + "pull=get"


def create(server: ServerProcess, topic: str, headers: dict[str, str]) -> str:
    """A pull point subscribed to ``topic``; its address."""
    kc = client.KeepAliveClient()
    try:
        url = server.broker_url
        status, body = kc.post(url, soap.create_pull_point(url), headers=headers)
        address = soap.first_address(body) if status == 200 else None
        if address is None:
            raise RuntimeError(f"CreatePullPoint answered {status}: {soap.fault_summary(body)}")
        status, body = kc.post(url, soap.subscribe(url, address, topic), headers=headers)
        if status != 200:
            raise RuntimeError(f"Subscribe answered {status}: {soap.fault_summary(body)}")
    finally:
        kc.close()
    return address


def get_round(
    server: ServerProcess,
    pull_point: str,
    topic: str,
    per_answer: int,
    answers: int,
    headers: dict[str, str],
) -> tuple[float, float, float, float]:
    """Fill ``pull_point`` with ``per_answer * answers`` messages, then read them with
    ``answers`` GetMessages; (CPU µs per GetMessages, GetMessages/s, p50 ms, p99 ms)."""
    pid = server.pid
    assert pid is not None
    kc = client.KeepAliveClient()
    try:
        total = per_answer * answers
        for seq0 in range(0, total, FILL_BATCH):
            n = min(FILL_BATCH, total - seq0)
            body = soap.notify(server.broker_url, topic, messages=n, seq0=seq0)
            status, answer = kc.post(server.broker_url, body, headers=headers)
            if status >= 300:  # 202: Notify is one-way
                raise RuntimeError(f"Notify answered {status}: {soap.fault_summary(answer)}")
        time.sleep(0.3)  # what the fill left for the server to do is not this round's
        request = soap.get_messages(pull_point, per_answer)
        times: list[float] = []
        got = 0
        before = process_cpu_seconds(pid)
        started = time.perf_counter()
        for _ in range(answers):
            sent = time.perf_counter()
            status, answer = kc.post(pull_point, request, headers=headers)
            times.append((time.perf_counter() - sent) * 1000)
            if status != 200:
                raise RuntimeError(f"GetMessages answered {status}: {soap.fault_summary(answer)}")
            got += soap.count_notifications(answer)
        elapsed = time.perf_counter() - started
        spent = process_cpu_seconds(pid) - before
    finally:
        kc.close()
    if got != total:
        raise RuntimeError(f"GetMessages read {got} of {total} messages")
    return (
        spent * 1e6 / answers,
        answers / elapsed,
        percentile(times, 50) or 0.0,
        percentile(times, 99) or 0.0,
    )
