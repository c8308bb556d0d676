"""What a scenario is, and the context the runner hands it."""

from __future__ import annotations

import abc
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from bench import client, soap
from bench.middleware import Middleware
from bench.model import ScenarioResult
from bench.server import ServerProcess


@dataclass(slots=True)
class Context:
    """Run-wide settings and services handed to every scenario."""

    quick: bool
    workdir: Path
    log: Callable[[str], None]
    #: ``--smoke``: smaller still than quick, only to see each scenario run through (the
    #: harness's own test); figures of such a run mean nothing
    smoke: bool = False
    #: why ``wsnmom serve`` cannot run (None when it can)
    serve_unavailable: str | None = None
    #: scenario -> extra notes for the report
    notes: dict[str, str] = field(default_factory=dict)

    def pick(self, full: int, quick: int, smoke: int | None = None) -> int:
        """``smoke`` in a smoke run (when given), ``quick`` in quick mode, else ``full``."""
        if self.smoke and smoke is not None:
            return smoke
        return quick if self.quick else full

    def pickf(self, full: float, quick: float, smoke: float | None = None) -> float:
        """Float version of ``pick``."""
        if self.smoke and smoke is not None:
            return smoke
        return quick if self.quick else full


class Scenario(abc.ABC):
    """A benchmark scenario; ``run`` fills one ScenarioResult per middleware."""

    #: identifier used by ``--scenarios``
    name: ClassVar[str]
    title: ClassVar[str]
    #: middlewares it runs on: None = every available one; () = runs once, adapter "-"
    middlewares: ClassVar[tuple[str, ...] | None] = None
    needs_server: ClassVar[bool] = True

    @abc.abstractmethod
    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        """Measure, adding metrics/details to ``result``; raise on failure."""


@contextmanager
def running_server(
    ctx: Context, mw: Middleware, tag: str, config_extra: str = ""
) -> Iterator[ServerProcess]:
    """A fresh gateway (new store, new isolated adapter URL) for the block."""
    workdir = ctx.workdir / f"{tag}-{mw.name}"
    url = mw.adapter_url(workdir)
    server = ServerProcess(url, workdir, config_extra)
    try:
        startup = server.start()
        ctx.log(f"  server up on {server.base_url} in {startup:.1f}s ({mw.name})")
        yield server
    finally:
        server.stop()
        started = time.monotonic()
        mw.release(url)
        if time.monotonic() - started > 5:
            ctx.log(f"  released {mw.name} namespace in {time.monotonic() - started:.0f}s")


def check_notify(server: ServerProcess, topic: str) -> None:
    """One Notify must be accepted, or the scenario fails with the server's answer."""
    kc = client.KeepAliveClient()
    try:
        status, body = kc.post(server.broker_url, soap.notify(server.broker_url, topic))
    finally:
        kc.close()
    if status >= 300 or soap.is_fault(body):
        raise RuntimeError(f"Notify answered {status}: {soap.fault_summary(body)}")


#: how often a set-up request the gateway refused as overloaded is sent again
OVERLOAD_RETRIES = 3
#: "retry in N s" in the overload fault's text (its Retry-After)
_RETRY_IN = re.compile(r"retry in (\d+(?:\.\d+)?) ?s")


def _run_retrying(
    reqs: list[client.Request], refusals: list[str] | None
) -> tuple[list[client.Answer], float]:
    """``client.run_requests`` (addresses); with a ``refusals`` list, requests answered
    503 are sent again after the Retry-After their fault gives (at most
    ``OVERLOAD_RETRIES`` times), as a client honouring the fault would, and each refusal's
    text is appended to ``refusals``.  The seconds include the waits."""
    answers, secs = client.run_requests(reqs, extract="address")
    if refusals is None:
        return answers, secs
    for _ in range(OVERLOAD_RETRIES):
        again = [i for i, (status, _value) in enumerate(answers) if status == 503]
        if not again:
            break
        texts = [str(answers[i][1]) for i in again]
        refusals.extend(texts)
        waits = [float(m.group(1)) for t in texts if (m := _RETRY_IN.search(t))]
        pause = min(60.0, max(waits, default=5.0))
        time.sleep(pause)
        retried, more = client.run_requests([reqs[i] for i in again], extract="address")
        for i, answer in zip(again, retried, strict=True):
            answers[i] = answer
        secs += pause + more
    return answers, secs


def subscribe_all(
    server: ServerProcess,
    consumers: list[str],
    topics: list[str],
    content: str | None = None,
    refusals: list[str] | None = None,
) -> tuple[list[str], float]:
    """Subscribe ``consumers[i]`` to ``topics[i]`` concurrently (each with the XPath
    MessageContent filter ``content`` if given); (references, seconds).  ``refusals``:
    see :func:`_run_retrying`."""
    reqs = [
        client.Request(server.broker_url, soap.subscribe(server.broker_url, c, t, content=content))
        for c, t in zip(consumers, topics, strict=True)
    ]
    answers, secs = _run_retrying(reqs, refusals)
    return _addresses("Subscribe", answers), secs


def _addresses(operation: str, answers: list[client.Answer]) -> list[str]:
    """The addresses of successful answers; RuntimeError naming failures (count, first)."""
    bad = [
        (status, value)
        for status, value in answers
        if status != 200 or not isinstance(value, str) or not value.startswith("http")
    ]
    if bad:
        raise RuntimeError(
            f"{operation} failed {len(bad)} of {len(answers)} times; first: "
            f"HTTP {bad[0][0]} {bad[0][1]}"
        )
    return [str(value) for _, value in answers]


def create_pull_points(
    server: ServerProcess, count: int, refusals: list[str] | None = None
) -> tuple[list[str], float]:
    """Create ``count`` pull points concurrently; (their addresses, seconds).
    ``refusals``: see :func:`_run_retrying`."""
    reqs = [
        client.Request(server.broker_url, soap.create_pull_point(server.broker_url))
        for _ in range(count)
    ]
    answers, secs = _run_retrying(reqs, refusals)
    return _addresses("CreatePullPoint", answers), secs


def drain_once(addresses: list[str], maximum: int = 1) -> list[int]:
    """One GetMessages on every pull point concurrently; messages returned by each."""
    reqs = [client.Request(a, soap.get_messages(a, maximum)) for a in addresses]
    answers, _ = client.run_requests(reqs, extract="notifications")
    counts: list[int] = []
    for status, value in answers:
        if status != 200:
            raise RuntimeError(f"GetMessages failed: {status}: {value}")
        counts.append(int(value or 0))
    return counts
