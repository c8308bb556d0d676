"""What a notifier inventing topics costs the gateway, with and without
``quotas.ad_hoc_topics`` (docs/security.md, "Topics").

``python -m bench.topic_growth [--topics N]`` starts a gateway (embedded adapter) with the
bound lifted and Notifies N new topics (default 50,000; 100 messages of 100 distinct topics
per Notify, 4 keep-alive connections), and at each checkpoint prints the gateway's resident
memory, the size and answer time of the TopicSet resource property and of ONVIF's
GetEventProperties (the first answer after the topics were added builds them; the second,
"again", is answered from what it built: ``core.advertised.AdvertisedProperties``), and the
bytes of the middleware's and the store's files. Then it starts a gateway with the default
bound (10,000) and Notifies 12,000 new topics: how many were accepted, how fast the refusals
came, and its memory. Run it with ``uptime`` beside it: every figure depends on the
machine's load. Only ever loads 127.0.0.1.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench import client, soap
from bench.server import ServerProcess

#: messages (each on a topic of its own) per Notify
BATCH = 100
THREADS = 4
WSTOP = "http://docs.oasis-open.org/wsn/t-1"
TEV = "http://www.onvif.org/ver10/events/wsdl"
RP = "http://docs.oasis-open.org/wsrf/rp-2"
ACTION_GET_RP = (
    "http://docs.oasis-open.org/wsrf/rpw-2/GetResourceProperty/GetResourcePropertyRequest"
)


def _notify_topics(url: str, first: int, count: int) -> tuple[int, int, list[float]]:
    """Notify topics ``t<first>`` .. ``t<first + count - 1>``, one message each, from
    :data:`THREADS` connections: (messages accepted, refused, refusal seconds)."""
    batches = [range(i, min(i + BATCH, first + count)) for i in range(first, first + count, BATCH)]
    lock = threading.Lock()
    accepted = refused = 0
    refusals: list[float] = []

    def loop(mine: list[range]) -> None:
        nonlocal accepted, refused
        kc = client.KeepAliveClient(timeout=120)
        try:
            for batch in mine:
                items = "".join(
                    f"<wsnt:NotificationMessage>{soap.topic_element('Topic', f't{i}')}"
                    f"<wsnt:Message>{soap.payload(i, '0', 16)}</wsnt:Message>"
                    "</wsnt:NotificationMessage>"
                    for i in batch
                )
                body = soap.envelope(soap.ACTION_NOTIFY, url, f"<wsnt:Notify>{items}</wsnt:Notify>")
                started = time.perf_counter()
                status, answer = kc.post(url, body)
                spent = time.perf_counter() - started
                with lock:
                    if status == 202:
                        accepted += len(batch)
                    elif b"ad_hoc_topics" in answer:
                        refused += len(batch)
                        refusals.append(spent)
                    else:
                        raise RuntimeError(f"HTTP {status}: {soap.fault_summary(answer)}")
        finally:
            kc.close()

    threads = [threading.Thread(target=loop, args=(batches[n::THREADS],)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return accepted, refused, refusals


def _timed_post(url: str, body: bytes) -> tuple[int, float]:
    kc = client.KeepAliveClient(timeout=300)
    try:
        started = time.perf_counter()
        status, answer = kc.post(url, body)
        spent = time.perf_counter() - started
    finally:
        kc.close()
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {soap.fault_summary(answer)}")
    return len(answer), spent


def _topic_set(server: ServerProcess) -> tuple[int, float]:
    body = f'<wsrf-rp:GetResourceProperty xmlns:wsrf-rp="{RP}" xmlns:wstop="{WSTOP}">'
    body += "wstop:TopicSet</wsrf-rp:GetResourceProperty>"
    url = server.broker_url
    return _timed_post(url, soap.envelope(ACTION_GET_RP, url, body))


def _event_properties(server: ServerProcess) -> tuple[int, float]:
    url = f"{server.base_url}/onvif/event_service"
    action = f"{TEV}/EventPortType/GetEventPropertiesRequest"
    body = f'<tev:GetEventProperties xmlns:tev="{TEV}"/>'
    return _timed_post(url, soap.envelope(action, url, body))


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _checkpoint(server: ServerProcess, work: Path, topics: int, baseline: int | None) -> None:
    doc, doc_s = _topic_set(server)
    onvif, onvif_s = _event_properties(server)
    # asked again with no topic added since: answered from what the first one built
    _, doc_again = _topic_set(server)
    _, onvif_again = _event_properties(server)
    rss = server.rss() or 0
    growth = ""
    if baseline is not None and topics:
        growth = f" (+{(rss - baseline) / topics:6.0f} B/topic)"
    print(
        f"{topics:>9,} topics | RSS {rss / 2**20:7.1f} MiB{growth} | "
        f"TopicSet {doc / 2**10:8.0f} KiB in {doc_s:5.2f} s, again {doc_again:5.3f} s | "
        f"GetEventProperties {onvif / 2**10:8.0f} KiB in {onvif_s:5.2f} s, again "
        f"{onvif_again:5.3f} s | middleware "
        f"{_bytes_under(work / 'mw') / 2**20:6.1f} MiB | store "
        f"{_bytes_under(work / 'gw') / 2**20:5.1f} MiB",
        flush=True,
    )


def _unbounded(work: Path, total: int) -> None:
    server = ServerProcess(f"embedded://{work / 'mw'}", work / "gw")  # bound lifted
    server.start()
    try:
        url = server.broker_url
        _notify_topics(url, -BATCH, BATCH)  # warm-up: every code path loaded
        _checkpoint(server, work, 0, None)
        baseline = server.rss() or 0
        done = 0
        for mark in sorted({min(total, m) for m in (1_000, 10_000, 25_000, 50_000, total)}):
            _notify_topics(url, done, mark - done)
            done = mark
            _checkpoint(server, work, done, baseline)
    finally:
        server.stop()


def _bounded(work: Path, total: int) -> None:
    server = ServerProcess(f"embedded://{work / 'mw'}", work / "gw")
    server.config.write_text('threads = 16\nlog_level = "WARNING"\n')  # the default bound
    server.start()
    try:
        started = time.perf_counter()
        accepted, refused, refusals = _notify_topics(server.broker_url, 0, total)
        spent = time.perf_counter() - started
        median = statistics.median(refusals) * 1000 if refusals else 0.0
        print(
            f"default bound: {accepted:,} topics accepted, {refused:,} refused "
            f"({len(refusals)} Notifies, median refusal {median:.1f} ms) in {spent:.1f} s; "
            f"RSS {(server.rss() or 0) / 2**20:.1f} MiB",
            flush=True,
        )
        _checkpoint(server, work, accepted, None)
    finally:
        server.stop()


def main() -> None:
    """Entry point of ``python -m bench.topic_growth``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=50_000, help="new topics to Notify")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wsnmom-topics-") as tmp:
        print("bound lifted (quotas.ad_hoc_topics = none):")
        _unbounded(Path(tmp) / "unbounded", args.topics)
    with tempfile.TemporaryDirectory(prefix="wsnmom-topics-") as tmp:
        _bounded(Path(tmp) / "bounded", 12_000)


if __name__ == "__main__":
    main()
