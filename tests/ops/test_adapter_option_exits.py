"""``wsnmom serve`` with a mistake in the adapter URL or its options: on every adapter it
exits with the configuration status (3) before it connects to anything, naming the option,
where it came from, and the closest known name.  Nothing listens on the middleware ports
used here: a gateway that tried to connect would wait for them instead of exiting.  (Bad
values of every boolean option are covered without a process in
tests/adapters/test_adapter_options.py.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.mosquitto import MosquittoNode
from wsnmom.startup import ExitStatus

from .serve_process import free_port, run_serve, run_slowed_serve, serve_env
from .test_serve_startup import _expect

#: (adapter URL, extra environment, fragments of the failure line); {tmp} and {port} filled in
CASES = [
    (
        "embedded://{tmp}/mw",
        {"WSNMOM_ADAPTER_OPTIONS__SYNCHRONUS": "full"},
        "unknown embedded adapter option adapter_options.synchronus = 'full' "
        "(did you mean synchronous?)",
    ),
    (
        "filelog://{tmp}/log?partitons=2",
        {},
        "unknown filelog adapter option ?partitons=2 (did you mean partitions?)",
    ),
    (
        "amqp://guest:guest@127.0.0.1:{port}/%2F?prefetchh=3",
        {},
        "unknown RabbitMQ URL argument ?prefetchh=3 (did you mean prefetch?)",
    ),
    (
        "kafka://127.0.0.1:{port}?topic_prefx=wsn",
        {},
        "unknown Kafka adapter option ?topic_prefx=wsn (did you mean topic_prefix?)",
    ),
    ("kafka://", {}, "the Kafka URL needs at least one host:port"),
    (
        "kafka://127.0.0.1:{port}?exact_watermarks=maybe",
        {},
        "?exact_watermarks=maybe: not a boolean: 'maybe'",
    ),
    (
        "mqtt://127.0.0.1:{port}?protocl=5",
        {},
        "unknown MQTT adapter option ?protocl=5 (did you mean protocol?)",
    ),
    ("mqtt://127.0.0.1:{port}/path", {}, "the MQTT URL takes no path"),
]


@pytest.mark.parametrize(("url", "env", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_adapter_configuration_mistake_exits_3(
    tmp_path: Path, url: str, env: dict[str, str], fragment: str
) -> None:
    adapter_url = url.format(tmp=tmp_path, port=free_port())
    result = run_serve(
        ["--adapter", adapter_url, "--port", str(free_port())],
        serve_env(tmp_path, **env),
        timeout=30,
    )
    _expect(result, ExitStatus.CONFIG, "adapter_url / adapter_options", fragment)


def test_unknown_option_in_the_toml_table_is_refused_on_embedded(tmp_path: Path) -> None:
    """It used to be silently ignored."""
    config = tmp_path / "gw.toml"
    config.write_text("[adapter_options]\nfoo = 1\n")
    result = run_serve(
        ["--config", str(config), "--port", str(free_port())], serve_env(tmp_path), timeout=30
    )
    _expect(
        result,
        ExitStatus.CONFIG,
        "unknown embedded adapter option adapter_options.foo = 1 (known: synchronous)",
    )


@pytest.mark.mqtt
def test_mqtt_wrong_password_is_the_credentials_status(
    tmp_path: Path, mosquitto_factory: Callable[..., MosquittoNode]
) -> None:
    """Mosquitto answers a wrong password with "Not authorized": the credentials status
    (10) with MQTT's hint, not the access status (11) with RabbitMQ's virtual hosts."""
    node = mosquitto_factory(users={"gw": "right-password"})
    url = f"mqtt://gw:certainly-wrong@127.0.0.1:{node.port}"
    result = run_serve(["--adapter", url, "--port", str(free_port())], serve_env(tmp_path))
    line = _expect(
        result,
        ExitStatus.MIDDLEWARE_CREDENTIALS,
        f"the MQTT broker 127.0.0.1:{node.port} refused the gateway's login (Not authorized",
        "adapter options username / password",
    )
    assert "virtual host" not in line
    assert "certainly-wrong" not in result.stderr


@pytest.mark.mqtt
def test_a_refusal_found_after_the_first_attempt_exits_with_its_status_and_line(
    tmp_path: Path, mosquitto_factory: Callable[..., MosquittoNode]
) -> None:
    """A refusal the background connector finds (the first attempt gave up after 0.5 s,
    as under load) stops the gateway with the same status and the same one line as at
    once.  Before, the connector's stop could come while serve wrote its "broker at" line,
    before the HTTP server ran: the process ended with status 0 and no line (seen in
    ``test_mqtt_wrong_password_is_the_credentials_status`` at load 20; checked to fail so
    before the fix)."""
    node = mosquitto_factory(users={"gw": "right-password"})
    url = f"mqtt://gw:certainly-wrong@127.0.0.1:{node.port}"
    result = run_slowed_serve(
        ["--adapter", url, "--port", str(free_port())],
        serve_env(tmp_path),
        no_first_attempt=True,
    )
    _expect(
        result,
        ExitStatus.MIDDLEWARE_CREDENTIALS,
        f"the MQTT broker 127.0.0.1:{node.port} refused the gateway's login (Not authorized",
    )
