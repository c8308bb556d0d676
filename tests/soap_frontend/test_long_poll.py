"""The long-poll retries of soap_frontend.long_poll (the poller behind ONVIF's PullMessages;
parking on waitress is tested end to end in tests/e2e/test_onvif_events.py)."""

from __future__ import annotations

import threading
import time

from wsnmom.soap_frontend.long_poll import Poll, Poller


def test_a_poll_answers_when_its_attempt_finds_something() -> None:
    tries: list[bool] = []

    def attempt(final: bool) -> str | None:
        tries.append(final)
        return "found" if len(tries) >= 3 else None

    poller = Poller(interval=0.01)
    assert poller.wait(Poll(attempt, time.monotonic() + 30)) == "found"
    assert tries == [False, False, False]
    assert poller.waiting() == 0


def test_a_poll_answers_finally_at_its_deadline() -> None:
    finals: list[bool] = []

    def attempt(final: bool) -> str | None:
        finals.append(final)
        return "empty" if final else None

    started = time.monotonic()
    assert Poller(interval=0.05).wait(Poll(attempt, started + 0.3)) == "empty"
    assert time.monotonic() - started >= 0.3
    assert finals[-1] is True and finals.count(True) == 1


def test_an_answer_resumes_the_parked_request() -> None:
    resumed = threading.Event()
    poll: Poll[str] = Poll(lambda final: "x", time.monotonic() + 5)
    poll.resume = resumed.set
    Poller(interval=0.01).add(poll)
    assert resumed.wait(5)
    assert poll.reply == "x" and poll.done.is_set()


def test_many_polls_share_one_thread() -> None:
    before = threading.active_count()
    release = threading.Event()
    poller = Poller(interval=0.01)
    polls = [
        Poll(lambda final: "go" if release.is_set() or final else None, time.monotonic() + 30)
        for _ in range(50)
    ]
    for poll in polls:
        poller.add(poll)
    assert threading.active_count() <= before + 1  # the poller's one thread
    release.set()
    for poll in polls:
        assert poll.done.wait(10)
    assert {p.reply for p in polls} == {"go"}
