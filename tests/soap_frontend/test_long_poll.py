"""The long-poll retries of soap_frontend.long_poll (the poller behind ONVIF's PullMessages;
parking on waitress is tested end to end in tests/e2e/test_onvif_events.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from lxml import etree
from wsnmom.soap_frontend.broker_calls import Role
from wsnmom.soap_frontend.dispatch import Frontend, Posted, Result, soap_post
from wsnmom.soap_frontend.envelope import SoapRequest
from wsnmom.soap_frontend.long_poll import PARK, Parked, Poll, Poller, WaitFor

from tests.soap_frontend.fake_service import FakeService, as_port


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


# --- soap_post with a handler that waits --------------------------------------------------
ENVELOPE = (
    b'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body>'
    b'<w:Wait xmlns:w="urn:test:wait"/></s:Body></s:Envelope>'
)
SOAP12 = "application/soap+xml; charset=utf-8"


class WaitingHandler:
    """Answers ``<w:Done/>`` on its third try (the first is the request's own)."""

    def __init__(self) -> None:
        self.tries = 0

    def operation_name(self, operation: str) -> str:
        return "test:Wait"

    def handle(self, req: SoapRequest, environ: Any) -> Result:
        def attempt(final: bool) -> Result | None:
            self.tries += 1
            if self.tries < 3 and not final:
                return None
            return etree.Element("{urn:test:wait}Done"), "urn:test:wait/DoneResponse"

        first = attempt(False)
        if first is not None:  # pragma: no cover - the first try finds nothing
            return first
        raise WaitFor(attempt, time.monotonic() + 30)


def _frontend() -> Frontend:
    return Frontend(as_port(FakeService()), None, poller=Poller(interval=0.01))


def test_a_waiting_request_is_answered_on_its_thread_without_a_parking_server() -> None:
    handler = WaitingHandler()
    posted = Posted(Role.BROKER, None, "POST", SOAP12, ENVELOPE, "/x", {}, {}, handler)
    reply = soap_post(_frontend(), posted)
    assert reply.status == 200 and b"Done" in reply.body
    assert handler.tries == 3


def test_a_waiting_request_is_parked_and_resumed_with_its_reply() -> None:
    parked: list[Poll[Any]] = []

    def park(poll: Poll[Any]) -> None:
        parked.append(poll)
        raise Parked(poll)

    resumed = threading.Event()
    environ = {PARK: park, "wsnmom.request_id": "r-1"}
    with pytest.raises(Parked):
        soap_post(
            _frontend(),
            Posted(
                Role.BROKER, None, "POST", SOAP12, ENVELOPE, "/x", {}, environ, WaitingHandler()
            ),
        )
    (poll,) = parked
    assert poll.request_id == "r-1" and not poll.done.is_set()
    poll.resume = resumed.set
    assert poll.begin is not None
    poll.begin()  # what the server does once the request's thread let go of it
    assert resumed.wait(10)
    assert poll.reply.status == 200 and b"Done" in poll.reply.body
