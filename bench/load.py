"""Keep-alive HTTP load from separate processes: ``wrk`` with a Lua script that POSTs a SOAP
body (preferred), or a multi-process Python generator when wrk is not installed; and a
paced (fixed offered rate) sender for latency measurements.

Every load is bounded by a duration (and the paced sender by a count as well) and only ever
targets 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench import soap

_WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "%(content_type)s"
%(extra_headers)s
local f = assert(io.open("%(body_path)s", "rb"))
wrk.body = f:read("*all")
f:close()
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %%d, "duration_us": %%d, "status_errors": %%d, '
    .. '"connect_errors": %%d, "read_errors": %%d, "write_errors": %%d, "timeouts": %%d, '
    .. '"latency_p50_us": %%d, "latency_p99_us": %%d}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass(slots=True)
class LoadResult:
    """What a load run achieved."""

    tool: str
    requests: int
    duration_s: float
    errors: int
    rps: float
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON-able form."""
        return asdict(self)


def wrk_available() -> bool:
    """True when the ``wrk`` binary is installed."""
    return shutil.which("wrk") is not None


def run_wrk(
    url: str,
    body: bytes,
    duration: float,
    connections: int = 16,
    threads: int = 2,
    headers: Mapping[str, str] | None = None,
) -> LoadResult:
    """POST ``body`` to ``url`` for ``duration`` seconds with wrk (keep-alive)."""
    with tempfile.TemporaryDirectory(prefix="wsnmom-wrk-") as tmp:
        body_path = Path(tmp) / "body.xml"
        body_path.write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(
            _WRK_LUA
            % {
                "content_type": soap.CONTENT_TYPE,
                "body_path": str(body_path),
                "extra_headers": "\n".join(
                    f'wrk.headers["{k}"] = "{v}"' for k, v in (headers or {}).items()
                ),
            }
        )
        cmd = [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, math.ceil(duration))}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            url,
        ]
        stdout, stderr = _wrk(cmd, duration)
    line = next((ln for ln in stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary: {stdout[-500:]} {stderr[-500:]}")
    data = json.loads(line[len("WRKJSON ") :])
    secs = data["duration_us"] / 1e6
    errors = sum(
        data[k]
        for k in ("status_errors", "connect_errors", "read_errors", "write_errors", "timeouts")
    )
    ok = data["requests"] - data["status_errors"]
    return LoadResult(
        tool="wrk",
        requests=data["requests"],
        duration_s=secs,
        errors=errors,
        rps=ok / secs if secs else 0.0,
        latency_p50_ms=data["latency_p50_us"] / 1000.0,
        latency_p99_ms=data["latency_p99_us"] / 1000.0,
    )


def _wrk(cmd: list[str], duration: float) -> tuple[str, str]:
    """Run wrk for ``duration`` seconds; its stdout and stderr.

    wrk's ``-d`` takes whole seconds.  A shorter or fractional duration runs with the next
    whole one and is ended by a SIGINT ``duration`` seconds after wrk said it is running
    (it prints that line once its SIGINT handler is installed; line-buffered through
    ``stdbuf``): wrk then stops its connections and prints its summary, whose
    ``duration_us`` is the time it really ran."""
    whole = max(1, math.ceil(duration))
    if duration >= whole or shutil.which("stdbuf") is None:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=whole + 60, check=False)
        return out.stdout, out.stderr
    with (
        tempfile.TemporaryFile("w+") as err,
        subprocess.Popen(
            ["stdbuf", "-oL", *cmd], stdout=subprocess.PIPE, stderr=err, text=True
        ) as proc,
    ):
        assert proc.stdout is not None
        head: list[str] = []
        for line in proc.stdout:  # ends at wrk's exit if it never says it runs
            head.append(line)
            if line.startswith("Running "):
                time.sleep(duration)
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.stdout.read()  # what wrk prints until it exits
        proc.wait(whole + 60)
        err.seek(0)
        return "".join(head) + rest, err.read()


def _py_load_proc(
    url: str,
    body: bytes,
    deadline: float,
    conns: int,
    out: multiprocessing.Queue[tuple[int, int]],
    headers: dict[str, str] | None = None,
) -> None:
    parts = urlsplit(url)
    host, _, port = parts.netloc.partition(":")
    counts = [0, 0]
    lock = threading.Lock()

    def loop() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        ok = err = 0
        while time.time() < deadline:
            try:
                conn.request(
                    "POST", parts.path, body, {"Content-Type": soap.CONTENT_TYPE, **(headers or {})}
                )
                resp = conn.getresponse()
                resp.read()
                if resp.status < 300:
                    ok += 1
                else:
                    err += 1
            except (OSError, http.client.HTTPException):
                err += 1
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.close()
        with lock:
            counts[0] += ok
            counts[1] += err

    threads = [threading.Thread(target=loop) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put((counts[0], counts[1]))


def run_python_load(
    url: str,
    body: bytes,
    duration: float,
    connections: int = 16,
    processes: int = 2,
    headers: Mapping[str, str] | None = None,
) -> LoadResult:
    """The same load as ``run_wrk`` from ``processes`` Python processes (fallback)."""
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[tuple[int, int]] = ctx.Queue()
    started = time.time()
    deadline = started + duration
    per = max(1, connections // processes)
    procs = [
        ctx.Process(
            target=_py_load_proc, args=(url, body, deadline, per, queue, dict(headers or {}))
        )
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=duration + 60) for _ in procs]
    for p in procs:
        p.join(10)
    secs = time.time() - started
    ok = sum(r[0] for r in results)
    err = sum(r[1] for r in results)
    return LoadResult("python", ok + err, secs, err, ok / secs if secs else 0.0)


def run_load(
    url: str,
    body: bytes,
    duration: float,
    connections: int = 16,
    headers: Mapping[str, str] | None = None,
) -> LoadResult:
    """Keep-alive POST load with wrk when installed, else with the Python generator;
    ``headers`` go with every request (credentials)."""
    if wrk_available():
        return run_wrk(url, body, duration, connections, headers=headers)
    return run_python_load(url, body, duration, connections, headers=headers)


# --- paced sender -------------------------------------------------------------------------


def _paced(
    url: str, template: bytes, rate: float, duration: float, threads: int
) -> dict[str, float]:
    """Send ``rate`` requests/s for ``duration`` s; ``ts`` = intended send time."""
    parts = urlsplit(url)
    host, _, port = parts.netloc.partition(":")
    total = int(rate * duration)
    start = time.time() + 0.2
    counts = {"sent": 0, "errors": 0, "late": 0}
    lock = threading.Lock()
    head, _, tail = template.partition(soap.TS_MARK.encode())

    def loop(k: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        sent = errors = late = 0
        for i in range(k, total, threads):
            intended = start + i / rate
            delay = intended - time.time()
            if delay > 0:
                time.sleep(delay)
            elif delay < -0.01:
                late += 1
            body = head + f"{intended:.6f}".encode() + tail
            try:
                conn.request("POST", parts.path, body, {"Content-Type": soap.CONTENT_TYPE})
                resp = conn.getresponse()
                resp.read()
                sent += 1
                if resp.status >= 300:
                    errors += 1
            except (OSError, http.client.HTTPException):
                errors += 1
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.close()
        with lock:
            counts["sent"] += sent
            counts["errors"] += errors
            counts["late"] += late

    workers = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {**counts, "planned": total, "elapsed_s": time.time() - start}


def run_paced(
    url: str, template: bytes, rate: float, duration: float, threads: int = 16
) -> dict[str, float]:
    """Run the paced sender in a separate process (``python -m bench.load``)."""
    with tempfile.NamedTemporaryFile(prefix="wsnmom-paced-", suffix=".xml") as f:
        f.write(template)
        f.flush()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.load",
                "--url",
                url,
                "--body",
                f.name,
                "--rate",
                str(rate),
                "--duration",
                str(duration),
                "--threads",
                str(threads),
            ],
            capture_output=True,
            text=True,
            timeout=duration + 120,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"paced sender failed: {out.stderr[-800:]}")
    data: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def main() -> None:
    """``python -m bench.load``: the paced sender, printing a JSON summary."""
    parser = argparse.ArgumentParser(description="paced SOAP sender (127.0.0.1 only)")
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", required=True, help="file with a body template (__TS__)")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    host = urlsplit(args.url).hostname
    if host not in ("127.0.0.1", "localhost"):
        parser.error("load is only ever sent to 127.0.0.1")
    template = Path(args.body).read_bytes()
    print(json.dumps(_paced(args.url, template, args.rate, min(args.duration, 120), args.threads)))


if __name__ == "__main__":
    main()
