"""The failover part of scenario ``ha`` (docs/scale-out.md, "Measured"): two instances,
one shard, one push subscription receiving a sequence-numbered stream published through
the instance that does not deliver, and the deliverer hit again and again by one of three
events:

* ``kill``: kill -9, then started again;
* ``term``: SIGTERM (a graceful stop hands its shards over), then started again;
* ``stop``: SIGSTOP for :data:`STOPPED` seconds (longer than the default lease), then
  SIGCONT: the frozen instance must deliver nothing published after its stop unless its
  log shows it took the shard again, and it rejoins the cluster without a restart.

Each event gives the gap from the signal to the first delivery by the other instance and
the duplicates that arrived until the next event.  Every number published must arrive: a
loss, a stray delivery by the stopped instance or a SIGTERM that does not exit with 0
fails the scenario.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench import client, soap
from bench.ha_rig import Recorder, cluster_of, post, takes
from bench.server import ServerProcess
from bench.util import wait_until

TOPIC = "ha"
#: notifications per second of the stream
STREAM_RATE = 20.0
#: seconds a stopped instance stays stopped (the issue's 20 s: twice the default lease)
STOPPED = 20.0
EVENTS = ("kill", "term", "stop")


@dataclass
class Event:
    """One hit on the deliverer and what followed."""

    kind: str
    victim: str
    at: float
    gap: float = 0.0
    #: numbers published after a SIGSTOP that the stopped instance delivered while it did
    #: not hold the shard (must stay empty)
    stray: list[int] = field(default_factory=list)
    #: seconds from SIGCONT until the other instance saw the stopped one's heartbeat again
    rejoined_after: float | None = None
    duplicates: int = 0


@dataclass
class Stream:
    """The publisher: ``sent`` numbers, through whichever instance ``via`` names."""

    servers: dict[str, ServerProcess]
    via: str
    sent: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        pkc = client.KeepAliveClient()
        seq = 0
        while not self.stop.is_set():
            server = self.servers[self.via]
            try:
                post(server, soap.notify(server.broker_url, TOPIC, seq0=seq + 1), pkc)
            except Exception:  # the instance asked was stopped under the request
                pkc.close()
                pkc = client.KeepAliveClient()
                self.stop.wait(0.1)
                continue
            seq += 1
            self.sent.append(seq)
            self.stop.wait(1 / STREAM_RATE)
        pkc.close()


def _other(name: str) -> str:
    return "h1" if name == "h0" else "h0"


def run(
    servers: dict[str, ServerProcess],
    recorder: Recorder,
    plan: list[str],
    lease: float,
    heartbeat: float,
    log: Callable[[str], None],
) -> tuple[list[Event], list[int]]:
    """Subscribe, stream, hit the deliverer once per entry of ``plan``; returns the
    events and the numbers sent (the caller stops the servers)."""
    kc = client.KeepAliveClient()
    h0 = servers["h0"]
    post(h0, soap.subscribe(h0.broker_url, recorder.address, TOPIC), kc)
    post(h0, soap.notify(h0.broker_url, TOPIC, seq0=0), kc)
    if not wait_until(lambda: recorder.count() > 0, 30):
        raise RuntimeError("the first notification was not delivered")
    stream = Stream(servers, via=_other(recorder.snapshot()[0][1]))
    thread = threading.Thread(target=stream.run, daemon=True)
    thread.start()
    events: list[Event] = []
    try:
        for kind in plan:
            events.append(_hit(kind, servers, recorder, stream, (lease, heartbeat), log))
        stream.stop.set()
        thread.join(10)
        final = stream.sent[-1]
        if not wait_until(lambda: final in {s for _, _, s in recorder.snapshot()}, 90):
            raise RuntimeError(f"message {final}, the last one published, did not arrive")
    finally:
        stream.stop.set()
        kc.close()
    count_duplicates(events, recorder.snapshot())
    return events, stream.sent


def _hit(
    kind: str,
    servers: dict[str, ServerProcess],
    recorder: Recorder,
    stream: Stream,
    timing: tuple[float, float],
    log: Callable[[str], None],
) -> Event:
    """One event: wait until the stream flows, move the publisher off the deliverer, hit
    it, time the other's first delivery, bring the deliverer back."""
    lease, heartbeat = timing
    start = len(stream.sent)
    if not wait_until(lambda: _delivered_since(recorder, start) >= 5, 60):
        raise RuntimeError("the stream is not delivered")
    owner = recorder.snapshot()[-1][1]
    other = _other(owner)
    stream.via = other
    published = len(stream.sent)
    # the stream goes through the other instance now: the one in flight has answered
    wait_until(lambda: len(stream.sent) >= published + 2, 10)
    before = stream.sent[-1] + 1  # at most one Notify in flight when the signal goes
    event = Event(kind, owner, time.monotonic())
    wall = time.time()
    victim = servers[owner]
    if kind == "kill":
        victim.kill()
    elif kind == "term":
        victim.signal(signal.SIGTERM)
    else:
        victim.signal(signal.SIGSTOP)

    def taken() -> bool:
        return any(t > event.at and who == other for t, who, _ in recorder.snapshot())

    if not wait_until(taken, lease + 60, poll=0.01):
        raise RuntimeError(f"{other} did not take over within {lease + 60:.0f} s ({kind})")
    first = min(t for t, who, _ in recorder.snapshot() if t > event.at and who == other)
    event.gap = first - event.at
    if kind == "stop":
        _resume(event, (victim, servers[other]), recorder, stream, (before, heartbeat), wall)
    else:
        if kind == "term" and (status := victim.exited(60)) != 0:
            raise RuntimeError(f"{owner} exited with {status} after SIGTERM")
        victim.start()
        if not wait_until(lambda: _rejoined(owner, servers[other], heartbeat), 30):
            raise RuntimeError(f"{owner} did not rejoin after its restart")
    log(
        f"  {kind} of {owner}: {other} delivered after {event.gap:.2f} s"
        + (f"; rejoined {event.rejoined_after:.2f} s after SIGCONT" if kind == "stop" else "")
    )
    return event


def _resume(
    event: Event,
    pair: tuple[ServerProcess, ServerProcess],
    recorder: Recorder,
    stream: Stream,
    limits: tuple[int, float],
    wall: float,
) -> None:
    """Keep the stopped instance stopped for :data:`STOPPED` s, SIGCONT it, wait for its
    heartbeat and for a number published after that, then look for strays: numbers
    published after the stop that it delivered before its log says it took the shard
    again."""
    victim, other = pair
    before, heartbeat = limits
    time.sleep(max(0.0, event.at + STOPPED - time.monotonic()))  # the length of the stop
    victim.signal(signal.SIGCONT)
    resumed = time.monotonic()
    if not wait_until(lambda: _rejoined(event.victim, other, heartbeat), 60):
        raise RuntimeError(f"{event.victim} did not rejoin after SIGCONT")
    event.rejoined_after = time.monotonic() - resumed
    sentinel = len(stream.sent) + 2
    if not wait_until(lambda: _arrived(recorder, sentinel), 60):
        raise RuntimeError(f"message {sentinel}, published after the rejoin, did not arrive")
    retaken = [at for at, _ in takes(victim) if at > wall]
    offset = time.time() - time.monotonic()
    retaken_at = min(retaken) - offset if retaken else float("inf")
    event.stray = strays(recorder.snapshot(), event.victim, (event.at, retaken_at), before)
    if event.stray:
        raise RuntimeError(
            f"{event.victim} delivered {event.stray[:10]} after its stop without the shard"
        )


def strays(
    arrivals: list[tuple[float, str, int]],
    victim: str,
    window: tuple[float, float],
    before: int,
) -> list[int]:
    """The numbers above ``before`` (published after the stop) that ``victim`` delivered
    between its stop and its next take of the shard (``window``, monotonic seconds)."""
    stopped, retaken = window
    return sorted(
        s for t, who, s in arrivals if who == victim and stopped < t < retaken and s > before
    )


def _delivered_since(recorder: Recorder, seq: int) -> int:
    return sum(1 for _, _, s in recorder.snapshot() if s > seq)


def _arrived(recorder: Recorder, seq: int) -> bool:
    return any(s >= seq for _, _, s in recorder.snapshot())


def _rejoined(name: str, asked: ServerProcess, heartbeat: float) -> bool:
    """``asked`` sees a fresh heartbeat of ``name`` (within one and a half beats)."""
    seen = cluster_of(asked)["instances"]
    return any(i["id"] == name and i["heartbeat_age"] < 1.5 * heartbeat + 0.75 for i in seen)


def count_duplicates(events: list[Event], arrivals: list[tuple[float, str, int]]) -> None:
    """Each delivery of a number seen before counts for the last event before it."""
    seen: set[int] = set()
    for t, _, s in sorted(arrivals):
        if s in seen:
            hit = [e for e in events if e.at <= t]
            if hit:
                hit[-1].duplicates += 1
        seen.add(s)
