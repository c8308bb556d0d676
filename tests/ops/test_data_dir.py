"""One data directory for the store and the embedded middleware: XDG default, explicit
``data_dir``, an explicit ``embedded://PATH`` as the data directory, explicit
``store_url`` / ``embedded://`` URLs kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from wsnmom.core.config import Settings, default_data_dir, load_settings

from .serve_process import free_port, running_serve, serve_env


def _settings(env: dict[str, str], **overrides: object) -> Settings:
    return load_settings(None, environ=env, overrides=overrides)


def test_default_is_under_xdg_data_home() -> None:
    s = _settings({"XDG_DATA_HOME": "/xdg", "HOME": "/home/u"})
    assert s.data_dir == "/xdg/wsnmom"
    assert s.adapter_url == "embedded:///xdg/wsnmom"
    assert s.store_url == "sqlite:////xdg/wsnmom/store.db"


def test_default_without_xdg_is_in_the_home_directory() -> None:
    assert default_data_dir({"HOME": "/home/u"}) == Path("/home/u/.local/share/wsnmom")
    # the XDG spec: a relative XDG_DATA_HOME is invalid and ignored
    assert default_data_dir({"HOME": "/home/u", "XDG_DATA_HOME": "rel"}) == Path(
        "/home/u/.local/share/wsnmom"
    )


def test_explicit_data_dir_holds_store_and_middleware() -> None:
    s = _settings({"HOME": "/h", "WSNMOM_DATA_DIR": "/srv/wsn"})
    assert (s.adapter_url, s.store_url) == ("embedded:///srv/wsn", "sqlite:////srv/wsn/store.db")


def test_other_adapter_keeps_the_store_in_the_data_dir() -> None:
    s = _settings({"HOME": "/h"}, adapter_url="amqp://guest:guest@127.0.0.1/")
    assert s.store_url == "sqlite:////h/.local/share/wsnmom/store.db"
    s = _settings({"HOME": "/h"}, adapter_url="amqp://127.0.0.1/", data_dir="/var/lib/wsn")
    assert s.store_url == "sqlite:////var/lib/wsn/store.db"


def test_embedded_path_is_the_data_dir_when_none_is_given() -> None:
    s = _settings({"HOME": "/h"}, adapter_url="embedded://./cfgdata")
    assert (s.data_dir, s.store_url) == ("./cfgdata", "sqlite:///./cfgdata/store.db")
    s = _settings({"HOME": "/h"}, adapter_url="embedded://./mw?synchronous=FULL", data_dir="/d")
    assert (s.adapter_url, s.store_url) == (
        "embedded://./mw?synchronous=FULL",
        "sqlite:////d/store.db",
    )


def test_explicit_urls_are_kept() -> None:
    s = _settings(
        {"HOME": "/h"}, adapter_url="embedded:///mw", store_url="sqlite:///:memory:", data_dir="/d"
    )
    assert (s.adapter_url, s.store_url) == ("embedded:///mw", "sqlite:///:memory:")


def test_paths_that_need_quoting() -> None:
    s = _settings({"HOME": "/h"}, data_dir="/data dir/50%")
    assert s.adapter_url == "embedded:///data%20dir/50%25"
    from wsnmom.adapters.embedded.adapter import parse_url

    assert parse_url(s.adapter_url)[0] == "/data dir/50%"


def test_settings_built_in_code_get_the_same_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "/xdg")
    assert Settings().store_url == "sqlite:////xdg/wsnmom/store.db"
    assert Settings(data_dir="/d").adapter_url == "embedded:///d"


# --- a real gateway ------------------------------------------------------------------------


def test_quick_start_puts_everything_in_the_xdg_directory(tmp_path: Path) -> None:
    """``wsnmom serve`` with no options (what ``make run`` does) in an empty directory."""
    work = tmp_path / "cwd"
    work.mkdir()
    env = serve_env(tmp_path)
    with running_serve([], env, free_port(), cwd=work):
        pass
    data = tmp_path / "xdg" / "wsnmom"
    assert (data / "store.db").is_file()
    assert (data / "embedded.sqlite3").is_file()
    assert list(work.iterdir()) == []


def test_toml_embedded_url_creates_one_directory(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text('adapter_url = "embedded://./cfgdata"\n')
    with running_serve(["--config", str(cfg)], serve_env(tmp_path), free_port(), cwd=tmp_path):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfgdata", "gw.toml"]
    assert {"store.db", "embedded.sqlite3"} <= {p.name for p in (tmp_path / "cfgdata").iterdir()}


@pytest.mark.rabbitmq
def test_rabbitmq_gateway_stores_in_the_data_dir(tmp_path: Path, rabbitmq_url: str) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    env = serve_env(tmp_path)
    with running_serve(["--adapter", rabbitmq_url], env, free_port(), cwd=work):
        pass
    assert (tmp_path / "xdg" / "wsnmom" / "store.db").is_file()
    assert not (tmp_path / "xdg" / "wsnmom" / "embedded.sqlite3").exists()
    assert not (work / "wsnmom-data").exists()
