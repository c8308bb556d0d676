"""``[[upstream]]`` in the configuration file (docs/federation.md): each table becomes one
upstream with its keys converted as settings are; an unknown key, a missing URL, a name
used twice or credentials that do not go together are errors naming the entry."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from wsnmom.core.config import (
    ConfigError,
    UpstreamSettings,
    load_settings,
    upstream_from_json,
    upstream_to_json,
)


def _load(tmp_path: Path, toml: str) -> list[UpstreamSettings]:
    path = tmp_path / "wsnmom.toml"
    path.write_text(toml)
    settings = load_settings(path, environ={"HOME": "/nohome"}, warn=lambda _: None)
    return settings.upstream


def test_upstream_tables_become_upstreams(tmp_path: Path) -> None:
    (camera, broker) = _load(
        tmp_path,
        """
[[upstream]]
name = "cam-1"
url = "http://192.0.2.10/onvif/event_service"
topic = "tns1:RuleEngine//."
dialect = "concrete_set"
namespaces = { tns1 = "http://www.onvif.org/ver10/topics" }
user = "admin"
password = "secret"
wsse = "digest"
mode = "onvif-pull"
lifetime = "PT1M"

[[upstream]]
name = "plant"
url = "http://broker.example:8080/wsn/broker"
token = "t0ken"
namespace = "urn:relayed:plant"
""",
    )
    assert (camera.name, camera.wsse, camera.lifetime) == ("cam-1", "digest", timedelta(minutes=1))
    assert camera.mode == "onvif-pull"
    assert camera.namespaces == {"tns1": "http://www.onvif.org/ver10/topics"}
    assert (broker.token, broker.namespace, broker.mode) == ("t0ken", "urn:relayed:plant", "push")
    assert "secret" not in repr(camera) and "t0ken" not in repr(broker)
    # the stored document gives the same upstream back
    assert upstream_from_json(upstream_to_json(camera)) == camera


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('name = "a"\nurl = "http://h/"\ntopc = "x"', "unknown key 'topc'"),
        ('name = "a"', "url is required"),
        ('name = "a b"\nurl = "http://h/"', "name 'a b'"),
        ('name = "a"\nurl = "http://h/"\nuser = "u"', "user and password go together"),
        ('name = "a"\nurl = "http://h/"\ntoken = "t"\nuser = "u"\npassword = "p"', "not both"),
        ('name = "a"\nurl = "http://h/"\nwsse = "digest"', "wsse needs a user"),
        ('name = "a"\nurl = "http://h/"\nmode = "poll"', "not one of: push, pull, onvif-pull"),
        ('name = "a"\nurl = "ftp://h/"', "entry 1: url"),
    ],
)
def test_unusable_upstreams_are_errors(tmp_path: Path, entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match="upstream") as raised:
        _load(tmp_path, f"[[upstream]]\n{entry}\n")
    assert message in str(raised.value)


def test_a_name_used_twice_is_an_error(tmp_path: Path) -> None:
    entry = '[[upstream]]\nname = "a"\nurl = "http://h/"\n'
    with pytest.raises(ConfigError, match="used twice"):
        _load(tmp_path, entry + entry)
