"""MQTT adapters a test opens on a broker (the session's or its own), closed at its end."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from wsnmom.adapters.mqtt.adapter import MqttAdapter


@contextmanager
def mqtt_adapters(
    tmp_path: Path, ns: str, url: str | None = None, **defaults: Any
) -> Iterator[Callable[..., MqttAdapter]]:
    """A function that opens an MQTT adapter on its ``url`` (else ``url`` here) with its
    options, ``defaults`` for those not given: each on a data directory of its own under
    ``tmp_path`` unless ``data_dir`` is given, the namespace ``ns`` on one topic prefix of
    the block's own unless ``namespaces`` is given.  Closed at the block's end, last
    opened first."""
    made: list[MqttAdapter] = []
    prefix = f"t{uuid.uuid4().hex[:8]}"

    def open_adapter(broker: str | None = None, **options: Any) -> MqttAdapter:
        options.setdefault("data_dir", str(tmp_path / uuid.uuid4().hex[:8]))
        options.setdefault("namespaces", {ns: prefix})
        for name, value in defaults.items():
            options.setdefault(name, value)
        target = broker or url
        assert target is not None, "no broker URL"
        adapter = MqttAdapter(target, options)
        adapter.open()
        made.append(adapter)
        return adapter

    try:
        yield open_adapter
    finally:
        for adapter in reversed(made):
            adapter.close()
