"""The authentication side channels of issue 22 (item 8), measured against a gateway with
a credentials file (one identity with a default-cost scrypt password) and an admin token.

``python -m bench.auth_abuse`` prints:

* **enumeration**: the median time of a Basic refusal for unknown names and for the known
  name with a wrong password (alternating, ``--probes`` of each);
* **flood**: the median and 90th percentile of a bearer client's sequential 1-message
  Notify, alone and while ``--flood`` connections send Basic requests with wrong
  passwords as fast as they are answered, and how the flood was answered;
* **lockout**: ten wrong admin sign-ins from 127.0.0.2, then the right admin token from
  127.0.0.1: its status (429 when one guesser locks everyone out).

``--pythonpath DIR`` runs the gateway from another checkout's import tree (the "before"
figures).  Only ever loads 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from bench import client, soap
from bench.server import ServerProcess

TOKEN = "bench-admin-token-0123456789"


def _basic(user: str, password: str) -> dict[str, str]:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


def _timed(kc: client.KeepAliveClient, url: str, body: bytes, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    kc.post(url, body, headers=headers)
    return time.perf_counter() - started


def enumeration(url: str, probes: int) -> tuple[float, float]:
    """Median seconds of a refusal: (unknown name, known name with a wrong password)."""
    body = soap.notify(url, "enum")
    kc = client.KeepAliveClient(timeout=60)
    unknown: list[float] = []
    known: list[float] = []
    try:
        for i in range(probes):
            unknown.append(_timed(kc, url, body, _basic(f"nobody{i}", f"x{i}")))
            known.append(_timed(kc, url, body, _basic("alice", f"x{i}")))
    finally:
        kc.close()
    return statistics.median(unknown), statistics.median(known)


def _bearer_latencies(url: str, seconds: float) -> list[float]:
    body = soap.notify(url, "bearer")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    kc = client.KeepAliveClient(timeout=60)
    out: list[float] = []
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            out.append(_timed(kc, url, body, headers))
    finally:
        kc.close()
    return out


def flood(url: str, connections: int, seconds: float) -> tuple[list[float], Counter[int]]:
    """The bearer client's latencies while ``connections`` send wrong passwords."""
    answers: Counter[int] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    body = soap.notify(url, "flood")

    def guess(n: int) -> None:
        kc = client.KeepAliveClient(timeout=60)
        i = 0
        try:
            while not stop.is_set():
                i += 1
                try:
                    status, _ = kc.post(url, body, headers=_basic("alice", f"g{n}-{i}"))
                except OSError:
                    status = 0
                with lock:
                    answers[status] += 1
        finally:
            kc.close()

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(connections)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)  # let the flood build up
        latencies = _bearer_latencies(url, seconds)
    finally:
        stop.set()
        for t in threads:
            t.join()
    return latencies, answers


def _sign_in(base: str, port: int, source: str, token: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request(
            "POST",
            "/wsn/admin/api/session",
            json.dumps({"token": token}),
            {"Content-Type": "application/json", "Origin": base},
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def lockout(base: str, port: int) -> tuple[list[int], int]:
    """Statuses of ten wrong sign-ins from 127.0.0.2, then the right one from 127.0.0.1."""
    wrong = [_sign_in(base, port, "127.0.0.2", "guess") for _ in range(10)]
    return wrong, _sign_in(base, port, "127.0.0.1", TOKEN)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    """Entry point of ``python -m bench.auth_abuse``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--flood", type=int, default=8, help="flooding connections")
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--pythonpath", help="run the gateway from this import tree")
    args = parser.parse_args()
    if args.pythonpath:
        os.environ["PYTHONPATH"] = args.pythonpath
    from wsnmom.soap_frontend.passwords import hash_password

    with tempfile.TemporaryDirectory(prefix="wsnmom-auth-abuse-") as tmp:
        work = Path(tmp)
        users = work / "users.toml"
        users.write_text(f'[users.alice]\npassword = "{hash_password("right")}"\n')
        users.chmod(0o600)
        server = ServerProcess(
            f"embedded://{work / 'mw'}",
            work / "gw",
            f'log_level = "ERROR"\n[auth]\nadmin_token = "{TOKEN}"\nusers_file = "{users}"\n',
        )
        server.start()
        try:
            url = server.broker_url
            load = os.getloadavg()
            unknown, known = enumeration(url, args.probes)
            print(
                f"enumeration: unknown name {unknown * 1000:.1f} ms, known name with a "
                f"wrong password {known * 1000:.1f} ms (medians of {args.probes})"
            )
            alone = _bearer_latencies(url, args.seconds)
            flooded, answers = flood(url, args.flood, args.seconds)
            for name, values in (("alone", alone), (f"flood x{args.flood}", flooded)):
                print(
                    f"bearer Notify {name}: median {statistics.median(values) * 1000:.1f} ms, "
                    f"p90 {_percentile(values, 0.9) * 1000:.1f} ms ({len(values)} requests)"
                )
            print(f"flood answers: {dict(sorted(answers.items()))}")
            wrong, right = lockout(server.base_url, server.port)
            print(f"lockout: 10 wrong sign-ins from 127.0.0.2 {wrong}; right token: {right}")
            print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
