"""The middleware gets ``publish_timeout`` seconds to confirm a Notify's messages: the
setting reaches the adapter, and a bad value is refused at start."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from wsnmom.core.adapter import OutboundMessage, PublishReceipt
from wsnmom.core.config import ConfigError, load_settings

from tests.core.conftest import Broker, note, simple


def test_notify_gives_the_adapter_the_configured_time(
    make_broker: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make_broker(publish_timeout=42.5)
    assert broker.adapter is not None and broker.service is not None
    seen: list[float] = []
    publish = broker.adapter.publish_many

    def recording(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> Any:
        seen.append(timeout)
        result: list[PublishReceipt] = publish(messages, timeout)
        return result

    monkeypatch.setattr(broker.adapter, "publish_many", recording)
    broker.service.notify([note("<x/>", simple("t:a", {"t": "urn:t"}))])
    assert seen == [42.5]


def test_default_is_thirty_seconds() -> None:
    assert load_settings(None, environ={}).publish_timeout == 30.0


@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_timeout_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match="publish_timeout"):
        load_settings(None, environ={}, overrides={"publish_timeout": value})
