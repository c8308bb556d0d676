"""The two quota findings of the security review, measured against a gateway with its
default quotas: one anonymous client creating subscriptions as fast as it can, and a
9 MB Notify against every one of them.

``python -m bench.abuse`` starts a gateway (embedded adapter, default settings, no quota
lifted as the other benchmarks do), floods Subscribe from 16 keep-alive connections for at
most 30 s, and prints how many were created, how long it took, and how fast the refusals
came; then posts a 9 MB Notify on the flooded topic (refused by
``quotas.notify_fanout_bytes``) and on a topic nobody subscribed to (accepted), timing
both.  Only ever loads 127.0.0.1.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench import client, soap
from bench.server import ServerProcess

TOPIC = "flood"
THREADS = 16
FLOOD_SECONDS = 30.0


def _flood(url: str, stop_after_refusals: int) -> tuple[int, float, list[float]]:
    created = 0
    refusals: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + FLOOD_SECONDS
    body = soap.subscribe(url, "http://127.0.0.1:9/consumer", TOPIC)

    def loop() -> None:
        nonlocal created
        kc = client.KeepAliveClient(timeout=30)
        try:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                status, _ = kc.post(url, body)
                spent = time.perf_counter() - started
                with lock:
                    if status == 200:
                        created += 1
                    else:
                        refusals.append(spent)
                        if len(refusals) >= stop_after_refusals:
                            return
        finally:
            kc.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=loop) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return created, time.perf_counter() - started, refusals


def _notify(url: str, topic: str, size: int) -> tuple[int, float]:
    body = soap.notify(url, topic, size=size)
    kc = client.KeepAliveClient(timeout=120)
    try:
        started = time.perf_counter()
        status, _ = kc.post(url, body)
        return status, time.perf_counter() - started
    finally:
        kc.close()


def main() -> None:
    """Entry point of ``python -m bench.abuse``."""
    with tempfile.TemporaryDirectory(prefix="wsnmom-abuse-") as tmp:
        work = Path(tmp)
        server = ServerProcess(f"embedded://{work / 'mw'}", work / "gw")
        # the gateway's defaults: no [quotas] lifted
        server.config.write_text(
            'threads = 16\nlog_level = "WARNING"\nmax_request_bytes = 16000000\n'
        )
        server.start()
        try:
            url = server.broker_url
            created, seconds, refusals = _flood(url, stop_after_refusals=1000)
            line = f"flood: {created} subscriptions created in {seconds:.1f} s"
            if refusals:
                median_ms = statistics.median(refusals) * 1000
                line += f"; {len(refusals)} refused, median refusal {median_ms:.1f} ms"
            print(line)
            status, spent = _notify(url, TOPIC, 9_000_000)
            print(f"9 MB Notify to {created} subscriptions: HTTP {status} in {spent:.2f} s")
            status, spent = _notify(url, "nobody", 9_000_000)
            print(f"9 MB Notify to no subscription: HTTP {status} in {spent:.2f} s")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
