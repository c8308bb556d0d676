"""Logging: quiet third-party loggers, pika's NOT_FOUND channel-close warnings dropped,
text and JSON formats, request ids on records and responses."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from wsnmom.core.config import load_settings
from wsnmom.core.log_context import bound_request_id, current_request_id

from wsnmom.logs import QUIET_LOGGERS, configure_logging
from wsnmom.server import build_runtime

from .serve_process import free_port, running_serve, serve_env

_TOUCHED = [*QUIET_LOGGERS, "pika.channel", "wsnmom", "wsnmom.test"]


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """Configure logging into a buffer; restore the root logger and levels afterwards."""
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), {n: logging.getLogger(n).level for n in _TOUCHED})
    stream = io.StringIO()
    yield stream
    for handler in list(root.handlers):
        if handler not in saved[1]:
            root.removeHandler(handler)
    root.setLevel(saved[0])
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


_NOT_FOUND = "NOT_FOUND - no exchange 'wsnmom.all' in vhost '/'"
_INEQUIVALENT = (
    "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue "
    "'wsnmom.sub.wsnmom-dead-letters-default' in vhost '/': received 'classic' but current "
    "is 'quorum'"
)
_QUEUE_LIMIT = (
    "PRECONDITION_FAILED - cannot declare queue 'q': queue limit in vhost '/' (1) is reached"
)


def _pika_channel_close(code: int, text: str = _NOT_FOUND) -> None:
    logging.getLogger("pika.channel").warning(
        "Received remote Channel.Close (%s): %r on %s", code, text, "<Channel number=1>"
    )


def test_third_party_loggers_are_quiet_by_default(log_stream: io.StringIO) -> None:
    configure_logging("DEBUG", stream=log_stream)
    logging.getLogger("urllib3.connectionpool").info("Starting new HTTP connection")
    logging.getLogger("waitress").info("Serving on http://127.0.0.1:8080")
    logging.getLogger("pika.adapters.utils.connection_workflow").error("TCP connection failed")
    logging.getLogger("pika.connection").error("Connection closed while authenticating")
    logging.getLogger("pika.channel").warning("something pika worries about")
    logging.getLogger("wsnmom.test").debug("our own debug line")
    lines = log_stream.getvalue().splitlines()
    assert [ln.split(" ", 2)[2] for ln in lines] == [
        "WARNING pika.channel: something pika worries about",
        "DEBUG wsnmom.test: our own debug line",
    ]


def test_a_stricter_root_level_also_applies_to_third_parties(log_stream: io.StringIO) -> None:
    configure_logging("ERROR", stream=log_stream)
    logging.getLogger("urllib3").warning("retrying")
    assert log_stream.getvalue() == ""


def test_log_levels_make_a_library_talk(log_stream: io.StringIO) -> None:
    configure_logging("INFO", levels={"pika": "DEBUG"}, stream=log_stream)
    logging.getLogger("pika.connection").error("Connection closed while authenticating")
    assert "ERROR pika.connection" in log_stream.getvalue()


def test_not_found_channel_close_is_dropped(log_stream: io.StringIO) -> None:
    configure_logging("INFO", stream=log_stream)
    _pika_channel_close(404)
    _pika_channel_close(406, _QUEUE_LIMIT)  # not an answer the adapter expects
    lines = log_stream.getvalue().splitlines()
    assert len(lines) == 1 and "Channel.Close (406)" in lines[0] and "queue limit" in lines[0]


def test_an_inequivalent_arg_close_is_dropped(log_stream: io.StringIO) -> None:
    """A single instance on a broker where a cluster made the dead-letter queue a quorum
    queue: the adapter's declaration meets 406 "inequivalent arg" and handles it itself
    (session 13: pika's warning of it failed test_middleware_outage after
    test_any_instance on one worker)."""
    configure_logging("INFO", stream=log_stream)
    _pika_channel_close(406, _INEQUIVALENT)
    _pika_channel_close(406, _QUEUE_LIMIT)
    lines = log_stream.getvalue().splitlines()
    assert len(lines) == 1 and "queue limit" in lines[0]


def test_not_found_channel_close_is_debug_when_pika_debugs(log_stream: io.StringIO) -> None:
    configure_logging("INFO", levels={"pika": "DEBUG"}, stream=log_stream)
    _pika_channel_close(404)
    assert "DEBUG pika.channel: Received remote Channel.Close (404)" in log_stream.getvalue()


def test_json_lines(log_stream: io.StringIO) -> None:
    configure_logging("INFO", "json", stream=log_stream)
    log = logging.getLogger("wsnmom.test")
    with bound_request_id("req-1"):
        log.info("notify %s", "accepted", extra={"subscription": "s1", "count": 3})
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("failed")
    first, second = (json.loads(line) for line in log_stream.getvalue().splitlines())
    assert first["level"] == "INFO" and first["logger"] == "wsnmom.test"
    assert first["message"] == "notify accepted"
    assert first["request_id"] == "req-1"
    assert first["subscription"] == "s1" and first["count"] == 3
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert "request_id" not in second
    assert second["level"] == "ERROR" and "ValueError: bad" in second["exception"]


def test_text_lines_carry_the_request_id(log_stream: io.StringIO) -> None:
    configure_logging("INFO", stream=log_stream)
    with bound_request_id("abc"):
        logging.getLogger("wsnmom.test").info("inside")
    logging.getLogger("wsnmom.test").info("outside")
    inside, outside = log_stream.getvalue().splitlines()
    assert inside.endswith("INFO wsnmom.test: inside request_id=abc")
    assert outside.endswith("INFO wsnmom.test: outside")


def test_configuring_twice_keeps_one_handler(log_stream: io.StringIO) -> None:
    configure_logging("INFO", stream=log_stream)
    configure_logging("INFO", stream=log_stream)
    logging.getLogger("wsnmom.test").info("once")
    assert log_stream.getvalue().count("once") == 1


# --- request ids over HTTP -------------------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path) -> Iterator[object]:
    settings = load_settings(None, environ={}, overrides={"data_dir": str(tmp_path)})
    runtime = build_runtime(settings)
    try:
        yield runtime.app
    finally:
        runtime.close()


def test_response_echoes_the_clients_request_id(app: object) -> None:
    client = app.test_client()  # type: ignore[attr-defined]
    resp = client.get("/healthz", headers={"X-Request-Id": "client-42"})
    assert resp.headers["X-Request-Id"] == "client-42"
    post = client.post("/wsn/broker", data=b"<x/>", headers={"X-Request-Id": "client-43"})
    assert post.headers["X-Request-Id"] == "client-43"


def test_request_id_is_generated_or_replaced(app: object) -> None:
    client = app.test_client()  # type: ignore[attr-defined]
    generated = client.get("/healthz").headers["X-Request-Id"]
    assert len(generated) == 32 and int(generated, 16) >= 0
    assert client.get("/healthz").headers["X-Request-Id"] != generated
    unsafe = client.get("/healthz", headers={"X-Request-Id": "a b INFO forged"})
    assert unsafe.headers["X-Request-Id"] != "a b INFO forged"
    assert len(unsafe.headers["X-Request-Id"]) == 32
    assert current_request_id() is None  # nothing leaks out of the request


def test_records_of_a_request_carry_its_id(app: object, log_stream: io.StringIO) -> None:
    from wsnmom.soap_frontend.faults import invalid_requests

    invalid_requests.reset()  # (the line is throttled: another test may have written one)
    configure_logging("INFO", "json", stream=log_stream)
    client = app.test_client()  # type: ignore[attr-defined]
    client.post(
        "/wsn/broker",
        data=b"<not-an-envelope/>",
        content_type="application/soap+xml",
        headers={"X-Request-Id": "trace-7"},
    )
    records = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    rejected = [r for r in records if r["logger"] == "wsnmom.soap.invalid"]
    assert rejected and all(r.get("request_id") == "trace-7" for r in rejected)


# --- a real gateway on a fresh RabbitMQ vhost ------------------------------------------------


@pytest.mark.rabbitmq
def test_fresh_rabbitmq_logs_no_not_found_warning(tmp_path: Path, rabbitmq_url: str) -> None:
    """A never-seen catch-all exchange makes the adapter's passive declaration fail with 404
    NOT_FOUND, which pika logs at WARNING: at the default level that line must not show."""
    exchange = f"wsnmom.test.{uuid.uuid4().hex[:10]}"
    env = serve_env(tmp_path, WSNMOM_ADAPTER_OPTIONS__ALL_EXCHANGE=exchange)
    with running_serve(["--adapter", rabbitmq_url], env, free_port()) as process:
        pass
    out = process.stdout.read() if process.stdout else ""
    assert f"declared topic exchange '{exchange}'" in out
    assert "NOT_FOUND" not in out
    assert not [ln for ln in out.splitlines() if " pika." in ln], out
