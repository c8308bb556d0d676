"""``wsnmom.soap.invalid`` (one INFO line per refused or faulted request) is throttled like
the refusal warnings (``core.guard.ThrottledLog``): a client repeating a bad request writes
one line per fault every 10 s, and the next line written tells how many were left out."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from wsnmom.core import guard
from wsnmom.core.config import Settings
from wsnmom.soap_frontend import create_app
from wsnmom.soap_frontend.faults import invalid_requests

from tests.soap_frontend.fake_service import FakeService
from tests.support.soap import content_type, envelope, fault_name

BAD_PROPERTY = "<wsrf-rp:GetResourceProperty>wsnt:NoSuchThing</wsrf-rp:GetResourceProperty>"


@pytest.fixture
def client() -> Iterator[FlaskClient]:
    settings = Settings(max_request_bytes=64 * 1024)
    settings.auth.required = "false"
    invalid_requests.reset()  # (lines other tests of this process wrote)
    yield create_app(FakeService(), settings).test_client()
    invalid_requests.reset()


def post(client: FlaskClient, path: str, body: str) -> str:
    resp = client.post(path, data=envelope(body), content_type=content_type())
    return fault_name(resp.data)


def test_a_flood_of_bad_requests_writes_one_line_per_fault_and_counts_the_rest(
    client: FlaskClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(guard.time, "monotonic", lambda: now[0])
    with caplog.at_level(logging.INFO, logger="wsnmom.soap.invalid"):
        for _ in range(30):
            assert post(client, "/wsn/broker", BAD_PROPERTY) == "InvalidResourcePropertyQNameFault"
        # the sentinel: another fault is still written
        assert post(client, "/wsn/subscriptions/" + "0" * 32, "<wsnt:Unsubscribe/>") == (
            "ResourceUnknownFault"
        )
        now[0] += 11  # past the interval: the next line is written, with the count
        assert post(client, "/wsn/broker", BAD_PROPERTY) == "InvalidResourcePropertyQNameFault"
    lines = [r.getMessage() for r in caplog.records if r.name == "wsnmom.soap.invalid"]
    assert len(lines) == 3, lines
    assert lines[0].startswith("InvalidResourcePropertyQNameFault on ")
    assert "more like it" not in lines[0]
    assert lines[1].startswith("ResourceUnknownFault on ")
    assert lines[2].startswith("InvalidResourcePropertyQNameFault on ")
    assert lines[2].endswith("(29 more like it in the last 10 s)"), lines[2]
