"""The ingress scenario's raw-client harness, shared by the raw baselines of every
middleware (``bench.kafka_raw.ingress``, ``bench.mqtt_raw.ingress``).

``threads`` threads stand for the gateway's request threads: each calls ``notify`` (one
Notify's messages published through the client under test, returning once the broker has
confirmed all of them, raising when it did not) again and again until ``seconds`` have
passed.  The result is Notifies/s and messages/s: the most a gateway with that many
request threads could confirm through this client and broker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def run(
    notify: Callable[[], None], batch: int, seconds: float, threads: int, what: str
) -> dict[str, float]:
    """Drive ``notify`` from ``threads`` threads for ``seconds``; ``batch`` is the number of
    messages one call publishes, ``what`` names the client in errors.  Returns ``{"rps":
    Notifies/s, "msgs_per_s": messages/s}``; raises ``RuntimeError`` when any call failed."""
    done = [0]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(until: float) -> None:
        try:
            while time.monotonic() < until:
                notify()
                with lock:
                    done[0] += 1
        except BaseException as exc:
            errors.append(exc)

    started = time.perf_counter()
    until = time.monotonic() + seconds
    workers = [threading.Thread(target=worker, args=(until,)) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"raw {what} ingress failed: {errors[0]!r}")
    return {"rps": done[0] / elapsed, "msgs_per_s": done[0] * batch / elapsed}
