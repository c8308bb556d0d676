"""``wsnmom serve`` start-up failures: one line naming the cause and what to do, a distinct
exit status per kind of cause, the traceback only with ``--debug``.

Failures of the settings and the configuration file come before the command opens
anything (no logging set up, no socket, no adapter): those tests run the command in this
process (:func:`_serve_in_process`); the others, and one of those (``--port 70000``), start
a real process."""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from click.testing import CliRunner
from wsnmom.core.adapter import AccessRefused, AdapterUnavailable, CredentialsRefused
from wsnmom.core.store_sqlite import SqliteTooOld

from tests.support.ports import closed_port
from wsnmom.cli import cli
from wsnmom.startup import ExitStatus, StartupError, explain, middleware_failure, open_listeners

from .serve_process import free_port, run_serve, run_serve_on_a_free_port, running_serve, serve_env

ROOT = Path(__file__).resolve().parents[2]


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The failure line (the last line of stderr), checked to be the only line from us."""
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("wsnmom serve:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def _expect(result: subprocess.CompletedProcess[str], status: ExitStatus, *fragments: str) -> str:
    line = _one_line(result)
    assert result.returncode == status, (result.returncode, result.stderr)
    for fragment in fragments:
        assert fragment in line, line
    return line


def _serve_in_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``wsnmom serve ARGS`` run by click in this process with ``env`` (the caller's
    ``WSNMOM_*`` variables unset, as :func:`serve_env` leaves them out), as a finished
    process: for failures that stop the command before it opens anything."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("WSNMOM_")}
    result = CliRunner().invoke(cli, ["serve", *args], env={**unset, **env})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["wsnmom", "serve", *args], result.exit_code, result.stdout, result.stderr
    )


def test_exit_statuses_are_distinct() -> None:
    assert len({int(s) for s in ExitStatus}) == len(ExitStatus)


def test_exit_statuses_are_documented() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    for status in ExitStatus:
        assert re.search(rf"^\| {int(status)} \| `{status.name}` \|", text, re.M), status


# --- configuration -----------------------------------------------------------------------


def test_port_out_of_range(tmp_path: Path) -> None:
    result = run_serve(["--port", "70000"], serve_env(tmp_path))
    _expect(result, ExitStatus.CONFIG, "--port=70000", "port", "out of range (1..65535)")


def test_port_out_of_range_in_the_environment(tmp_path: Path) -> None:
    result = _serve_in_process([], serve_env(tmp_path, WSNMOM_PORT="0"))
    _expect(result, ExitStatus.CONFIG, "WSNMOM_PORT=0: port:")


def test_bad_log_level(tmp_path: Path) -> None:
    result = _serve_in_process([], serve_env(tmp_path, WSNMOM_LOG_LEVEL="verbose"))
    _expect(result, ExitStatus.CONFIG, "WSNMOM_LOG_LEVEL=verbose: log_level: not a log level")


def test_bad_setting_names_variable_and_setting(tmp_path: Path) -> None:
    result = _serve_in_process([], serve_env(tmp_path, WSNMOM_RETRY__MAX_DELAY="5min"))
    _expect(
        result,
        ExitStatus.CONFIG,
        "WSNMOM_RETRY__MAX_DELAY=5min: retry.max_delay: not a duration: '5min'",
    )


def test_unknown_variables_warn_and_start(tmp_path: Path) -> None:
    """The issue's symptom: documented plugin and test variables, and a typo, must not stop
    the gateway; the typo is a warning with a suggestion."""
    env = serve_env(
        tmp_path,
        WSNMOM_BLOCKED_PLUGINS="nats",
        WSNMOM_PLUGINS="embedded",
        WSNMOM_DISABLE_PLUGIN_AUTOLOAD="1",
        WSNMOM_TRACE_PLUGINS="1",
        WSNMOM_TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:1/",
        WSNMOM_THREAD="4",
    )
    port = free_port()
    with running_serve([], env, port) as process:
        pass
    out = process.stdout.read() if process.stdout else ""
    warnings = [ln for ln in out.splitlines() if "WARNING wsnmom.config" in ln]
    assert len(warnings) == 1, out
    assert warnings[0].endswith(
        "WSNMOM_THREAD: not a wsnmom setting, ignored (did you mean WSNMOM_THREADS?)"
    )


def test_toml_typo_warns_with_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text("thread = 4\n")
    port = free_port()
    with running_serve(["--config", str(cfg)], serve_env(tmp_path), port) as process:
        pass
    out = process.stdout.read() if process.stdout else ""
    assert f"{cfg}: unknown setting 'thread', ignored (did you mean 'threads'?)" in out


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    result = _serve_in_process(["--config", str(missing)], serve_env(tmp_path))
    _expect(result, ExitStatus.CONFIG_FILE, f"cannot read configuration file {missing}")


def test_config_file_from_the_environment_is_checked_the_same_way(tmp_path: Path) -> None:
    result = _serve_in_process([], serve_env(tmp_path, WSNMOM_CONFIG=str(tmp_path)))  # a directory
    _expect(result, ExitStatus.CONFIG_FILE, f"cannot read configuration file {tmp_path}")


def test_invalid_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text("port = \n")
    result = _serve_in_process(["--config", str(cfg)], serve_env(tmp_path))
    _expect(result, ExitStatus.CONFIG_FILE, f"configuration file {cfg} is not valid TOML")


# --- adapter -------------------------------------------------------------------------------


def test_unknown_adapter_scheme(tmp_path: Path) -> None:
    result = run_serve(
        ["--adapter", "embeded://x", "--port", str(free_port())], serve_env(tmp_path)
    )
    _expect(result, ExitStatus.ADAPTER, "no adapter for URL scheme 'embeded'", "'embedded'")


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (["--adapter", "/no/scheme"], {}, "adapter URL needs a scheme"),
        (
            ["--adapter", "amqp://guest:guest@127.0.0.1:1/"],
            {"WSNMOM_ADAPTER_OPTIONS__NO_SUCH_OPTION": "1"},
            "unknown RabbitMQ adapter option adapter_options.no_such_option = '1'",
        ),
    ],
)
def test_unusable_adapter_url_or_options(
    tmp_path: Path, args: list[str], env: dict[str, str], fragment: str
) -> None:
    result = run_serve_on_a_free_port(args, serve_env(tmp_path, **env))
    _expect(result, ExitStatus.CONFIG, "adapter_url / adapter_options", fragment)


def test_kafka_cluster_that_does_not_answer(tmp_path: Path) -> None:
    with closed_port() as closed:
        url = f"kafka://127.0.0.1:{closed}?connect_timeout=1"
        result = run_serve(
            ["--adapter", url, "--port", str(free_port()), "--wait-for-middleware", "2"],
            serve_env(tmp_path),
        )
    _expect(result, ExitStatus.MIDDLEWARE_UNREACHABLE, "Kafka cluster", "does not answer")


# --- listening -----------------------------------------------------------------------------


def test_port_in_use_names_host_and_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_serve(["--port", str(port)], serve_env(tmp_path))
    _expect(result, ExitStatus.PORT, f"cannot listen on 127.0.0.1:{port}", "already in use")
    # the port is checked before the middleware is opened: nothing was created
    assert not (tmp_path / "xdg").exists()


def test_bad_adapter_url_is_reported_before_the_port(tmp_path: Path) -> None:
    """A typo in the adapter URL is the error to fix, whatever holds the port."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_serve(["--adapter", "embeded://x", "--port", str(port)], serve_env(tmp_path))
    _expect(result, ExitStatus.ADAPTER, "no adapter for URL scheme 'embeded'")


def test_host_that_is_not_local(tmp_path: Path) -> None:
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine (bind fails locally)
    result = run_serve(["--host", "192.0.2.1", "--port", str(free_port())], serve_env(tmp_path))
    _expect(result, ExitStatus.HOST, "192.0.2.1", "not an address of this machine")


def test_unresolvable_host_is_a_host_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_name(*args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    with pytest.raises(StartupError) as info:
        open_listeners("gateway.invalid", 8080)
    assert info.value.status is ExitStatus.HOST
    assert "gateway.invalid:8080" in info.value.message and "does not resolve" in info.value.message


def test_privileged_port_is_a_port_error() -> None:
    from wsnmom.startup import _listen_error

    denied = _listen_error(OSError(errno.EACCES, "Permission denied"), "127.0.0.1", "127.0.0.1:80")
    assert denied.status is ExitStatus.PORT and "permission denied" in denied.message


def test_unexpected_errors_point_at_debug() -> None:
    error = explain(RuntimeError("boom"))
    assert error.status is ExitStatus.INTERNAL and "--debug" in error.message


def test_sqlite_too_old_is_a_configuration_error() -> None:
    error = explain(SqliteTooOld("3.31.1"))
    assert error.status is ExitStatus.CONFIG
    assert "SQLite 3.35.0 or later" in error.message and "3.31.1" in error.message


# --- data directory ------------------------------------------------------------------------


def test_data_directory_used_by_another_gateway(tmp_path: Path) -> None:
    data = tmp_path / "shared-data"
    env = serve_env(tmp_path)
    with running_serve(["--data-dir", str(data)], env, free_port()):
        result = run_serve_on_a_free_port(["--data-dir", str(data)], env)
        _expect(result, ExitStatus.DATA_DIR, f"data directory {data} is in use by another gateway")


def test_embedded_directory_used_by_another_gateway(tmp_path: Path) -> None:
    """Separate stores, one embedded middleware directory: the adapter's own lock."""
    env = serve_env(tmp_path)
    middleware = tmp_path / "mw"
    first = ["--adapter", f"embedded://{middleware}", "--store", f"sqlite:///{tmp_path}/a.db"]
    with running_serve(first, env, free_port()):
        second = ["--adapter", f"embedded://{middleware}", "--store", f"sqlite:///{tmp_path}/b.db"]
        result = run_serve_on_a_free_port(second, env)
        _expect(result, ExitStatus.DATA_DIR, "another gateway uses this data directory")


def test_unwritable_data_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_serve(
        ["--data-dir", str(blocker / "data"), "--port", str(free_port())], serve_env(tmp_path)
    )
    _expect(result, ExitStatus.DATA_DIR)


# --- --debug ---------------------------------------------------------------------------------


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run_serve(
        ["--adapter", "embeded://x", "--port", str(free_port()), "--debug"], serve_env(tmp_path)
    )
    assert result.returncode == ExitStatus.ADAPTER
    assert "Traceback (most recent call last)" in result.stderr
    assert "UnknownAdapterScheme" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("wsnmom serve: no adapter")


def test_cli_runner_exit_status(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["serve", "--port", "70000"], env={"XDG_DATA_HOME": str(tmp_path)}
    )
    assert result.exit_code == ExitStatus.CONFIG
    assert "--port=70000: port: 70000 is out of range" in result.output


# --- middleware ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (CredentialsRefused("login refused"), ExitStatus.MIDDLEWARE_CREDENTIALS),
        (AccessRefused("no such namespace"), ExitStatus.MIDDLEWARE_ACCESS),
        (
            AdapterUnavailable("cannot connect: AMQPConnectionError"),
            ExitStatus.MIDDLEWARE_UNREACHABLE,
        ),
        (
            AdapterUnavailable(
                "cannot connect to RabbitMQ at amqp://h:5672//: ConnectionClosedByBroker: (403) "
                "'ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN.'"
            ),
            ExitStatus.MIDDLEWARE_CREDENTIALS,
        ),
        (
            AdapterUnavailable(
                "cannot connect to RabbitMQ at amqp://h:5672/v: ConnectionClosedByBroker: (530) "
                "'NOT_ALLOWED - vhost v not found'"
            ),
            ExitStatus.MIDDLEWARE_ACCESS,
        ),
        (
            AdapterUnavailable(
                "ConnectionClosedByBroker: (403) \"ACCESS_REFUSED - access to vhost 'v' refused "
                "for user 'u'\""
            ),
            ExitStatus.MIDDLEWARE_ACCESS,
        ),
        (ValueError("not a middleware failure"), None),
    ],
)
def test_middleware_failures_are_classified(exc: BaseException, status: ExitStatus | None) -> None:
    assert middleware_failure(exc) == status


def _with(
    url: str, *, password: str | None = None, vhost: str | None = None, port: int | None = None
) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    user = parts.username or "guest"
    secret = password if password is not None else (parts.password or "guest")
    netloc = f"{user}:{secret}@{host}:{port if port is not None else parts.port}"
    path = "/" + vhost if vhost is not None else parts.path
    return urlunsplit((parts.scheme, netloc, path, "", ""))


@pytest.mark.rabbitmq
def test_rabbitmq_connection_refused_with_a_bounded_wait(tmp_path: Path, rabbitmq_url: str) -> None:
    """By default the gateway waits for its middleware (tests/e2e/test_middleware_outage.py);
    ``--wait-for-middleware`` bounds the wait and exits with status 9."""
    env = serve_env(tmp_path, WSNMOM_ADAPTER_OPTIONS__OPERATION_TIMEOUT="1")
    started = time.monotonic()
    with closed_port() as closed:  # nothing listens there
        url = _with(rabbitmq_url, port=closed)
        result = run_serve(
            ["--adapter", url, "--port", str(free_port()), "--wait-for-middleware", "3"], env
        )
    _expect(
        result,
        ExitStatus.MIDDLEWARE_UNREACHABLE,
        "cannot connect to RabbitMQ",
        "check that it runs",
        "waited 3 s",
    )
    # it waited (and said how long: "waited 3 s"); an unbounded wait would not have ended
    # within run_serve's timeout.  No upper bound here: at load 34 the process's start
    # alone took over 27 s (the 30 s this asserted before)
    assert time.monotonic() - started >= 3


@pytest.mark.rabbitmq
def test_rabbitmq_wrong_password(tmp_path: Path, rabbitmq_url: str) -> None:
    url = _with(rabbitmq_url, password="certainly-wrong")
    result = run_serve_on_a_free_port(["--adapter", url], serve_env(tmp_path))
    line = _expect(result, ExitStatus.MIDDLEWARE_CREDENTIALS, "user name and password")
    assert "certainly-wrong" not in result.stderr + line


@pytest.mark.rabbitmq
def test_rabbitmq_wrong_vhost(tmp_path: Path, rabbitmq_url: str) -> None:
    url = _with(rabbitmq_url, vhost="no-such-vhost")
    result = run_serve_on_a_free_port(["--adapter", url], serve_env(tmp_path))
    _expect(result, ExitStatus.MIDDLEWARE_ACCESS, "no-such-vhost", "virtual host")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"host": "0.0.0.0"}, "without public_url: endpoint references will say http://0.0.0.0"),
        ({"trusted_proxies": ["10.0.0.0/8"]}, "trusted_proxies without public_url"),
        ({"host": "0.0.0.0", "public_url": "https://gw.example"}, None),
        ({}, None),
    ],
)
def test_start_up_advice(
    overrides: dict[str, object], expected: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    from wsnmom.core.config import load_settings

    from wsnmom.serving import _advise

    with caplog.at_level("WARNING", logger="wsnmom.server"):
        _advise(load_settings(None, environ={}, overrides=overrides))
    messages = [r.getMessage() for r in caplog.records if r.name == "wsnmom.server"]
    if expected is None:
        assert messages == []
    else:
        assert len(messages) == 1 and expected in messages[0]


def test_banner_hides_the_password() -> None:
    from wsnmom.core.redaction import redact_url as redact

    assert redact("amqp://wsn:s3cret@rabbit:5672/v") == "amqp://wsn:***@rabbit:5672/v"
    assert redact("embedded:///var/lib/wsnmom") == "embedded:///var/lib/wsnmom"
    # a Kafka bootstrap list with a SASL user part and librdkafka properties
    kafka = "kafka://gw:hunter2@k1:9092,k2:9092?security.protocol=SASL_SSL"
    assert redact(kafka) == "kafka://gw:***@k1:9092,k2:9092?security.protocol=SASL_SSL"


def test_listening_beyond_loopback_needs_an_identity(tmp_path: Path) -> None:
    """Authentication is off by default on loopback only: elsewhere the gateway refuses
    to start without an identity and names the one setting that turns it on."""
    result = run_serve_on_a_free_port(["--host", "0.0.0.0"], serve_env(tmp_path), "0.0.0.0")
    _expect(result, ExitStatus.CONFIG, "beyond loopback", "WSNMOM_AUTH__ADMIN_TOKEN")


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"WSNMOM_TLS__CERTFILE": "/nonexistent/cert.pem"}, ("tls.certfile", "cannot load")),
        ({"WSNMOM_TLS__CLIENT_CA": "/tmp/ca.pem"}, ("tls.client_ca needs tls.certfile",)),
        ({"WSNMOM_AUTH__USERS_FILE": "/nonexistent/users.toml"}, ("auth.users_file",)),
    ],
)
def test_unusable_security_settings_stop_the_start(
    tmp_path: Path, env: dict[str, str], fragments: tuple[str, ...]
) -> None:
    result = run_serve_on_a_free_port([], {**serve_env(tmp_path), **env})
    _expect(result, ExitStatus.CONFIG, *fragments)


def test_anonymous_beyond_loopback_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from wsnmom.core.config import load_settings

    from wsnmom.serving import _check_auth

    settings = load_settings(
        None,
        environ={},
        overrides={"host": "0.0.0.0", "auth__required": "false", "data_dir": str(tmp_path)},
    )
    with caplog.at_level("WARNING", logger="wsnmom.server"):
        _check_auth(settings)
    assert "authentication is off (auth.required = false)" in caplog.text


@pytest.mark.parametrize(
    ("host", "outbound", "warned"),
    [
        ("0.0.0.0", {}, "loopback and private"),
        ("::", {"outbound__allow_loopback": "false"}, "on private addresses"),
        ("192.0.2.1", {"outbound__allow_private": "false"}, "on loopback addresses"),
        ("0.0.0.0", {"outbound__allow_loopback": "false", "outbound__allow_private": "false"}, ""),
        ("127.0.0.1", {}, ""),
        ("localhost", {}, ""),
    ],
)
def test_outbound_beyond_loopback_is_a_warning(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    host: str,
    outbound: dict[str, str],
    warned: str,
) -> None:
    """Issue 22 item 7: a gateway reachable beyond loopback that may call loopback and
    private addresses says so at start and names the strict profile's settings."""
    from wsnmom.core.config import load_settings

    from wsnmom.serving import _advise_outbound

    settings = load_settings(
        None,
        environ={},
        overrides={"host": host, "data_dir": str(tmp_path), **outbound},
    )
    with caplog.at_level("WARNING", logger="wsnmom.server"):
        _advise_outbound(settings)
    lines = [r.getMessage() for r in caplog.records if "calls consumers" in r.getMessage()]
    if not warned:
        assert lines == []
        return
    assert len(lines) == 1 and warned in lines[0], lines
    assert "strict profile" in lines[0]
    for name in ("loopback", "private"):
        assert (f"outbound.allow_{name}" in lines[0]) == (name in warned), lines
