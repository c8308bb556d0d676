"""Each adapter page's ``| option | default |`` table states the default its adapter
declares (the names both ways are checked by tests/adapters/test_adapter_options.py)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from wsnmom.adapters.embedded.adapter import EmbeddedAdapter
from wsnmom.adapters.filelog.adapter import FileLogAdapter
from wsnmom.adapters.kafka.adapter import KafkaAdapter
from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.core.adapter import Adapter

from tests.support.documented_values import documented_value, split_defaults

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS: list[type[Adapter]] = [
    EmbeddedAdapter,
    FileLogAdapter,
    RabbitMQAdapter,
    KafkaAdapter,
    MqttAdapter,
]
#: defaults a page describes rather than states: (documented text, the declared value)
DESCRIBED = {
    ("rabbitmq", "single_active_consumer"): ("in cluster mode", None),
    ("rabbitmq", "instance"): ("random", None),
    ("filelog", "retention"): ("unlimited", None),
    ("mqtt", "data_dir"): ("the gateway's data directory", None),
    ("mqtt", "client_id"): ("`wsnmom-<random>`, kept", None),
    ("mqtt", "max_message_bytes"): ("the broker's Maximum Packet Size, if it says", None),
}


def _rows(adapter: str) -> Iterator[tuple[str, str]]:
    """(option, documented default) of every row of the page's options table."""
    in_table = False
    for line in (ROOT / "docs" / "adapters" / f"{adapter}.md").read_text().splitlines():
        if line.startswith("| option | default |"):
            in_table = True
        elif in_table and not line.startswith("|"):
            return
        elif in_table and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            names = re.findall(r"`([a-z0-9_]+)`", cells[0])
            yield from zip(names, split_defaults(cells[1], len(names)), strict=True)


def _declared(cls: type[Adapter]) -> dict[str, object]:
    assert cls.declared_options is not None
    defaults: dict[str, object] = {}
    for spec in dataclasses.fields(cls.declared_options):
        if spec.default is not dataclasses.MISSING:
            defaults[spec.name] = spec.default
        elif spec.default_factory is not dataclasses.MISSING:
            defaults[spec.name] = spec.default_factory()
    return defaults


def _same(documented: object, declared: object) -> bool:
    if isinstance(documented, str) and isinstance(declared, str):
        return documented.lower() == declared.lower()  # SQLite's `normal` is NORMAL
    return documented == declared


@pytest.mark.parametrize("cls", ADAPTERS, ids=[cls.name for cls in ADAPTERS])
def test_every_documented_option_default_is_the_declared_one(cls: type[Adapter]) -> None:
    declared = _declared(cls)
    rows = list(_rows(cls.name))
    assert rows
    wrong = []
    for name, text in rows:
        if (cls.name, name) in DESCRIBED:
            assert (text, declared.get(name)) == DESCRIBED[cls.name, name], name
        elif name in declared and not _same(documented_value(text, declared[name]), declared[name]):
            wrong.append(f"{name}: documented {text!r}, declared {declared[name]!r}")
    assert wrong == []
