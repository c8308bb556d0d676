"""Observer hooks (``wsnmom_adapter_opened``, ``wsnmom_notification_published``,
``wsnmom_notification_delivered``, ``wsnmom_delivery_failed``) reach a plugin registered at
runtime, through the ``PluginManager`` facade; without an implementing plugin core skips
the work."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wsnmom.core.adapter import Adapter, PublishReceipt
from wsnmom.core.hookspecs import hookimpl
from wsnmom.core.model import CreatePullPointRequest, NotificationMessage
from wsnmom.core.plugins import PluginManager, get_plugin_manager

from tests.support.waiting import wait_until
from wsnmom.server import build_runtime

from .conftest import Broker, RecordingOutbound, note, runtime_settings, simple, sub_req

UP = "http://127.0.0.1:9/up"
DOWN = "http://127.0.0.1:9/down"


class Observer:
    """Records every observer hook call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.published: list[tuple[NotificationMessage, PublishReceipt | None]] = []
        self.delivered: list[tuple[bytes, str]] = []
        self.failed: list[tuple[bytes, str, BaseException]] = []
        self.opened: list[Adapter] = []

    @hookimpl
    def wsnmom_adapter_opened(self, adapter: Adapter) -> None:
        self.opened.append(adapter)

    @hookimpl
    def wsnmom_notification_published(
        self, message: NotificationMessage, receipt: PublishReceipt | None
    ) -> None:
        with self.lock:
            self.published.append((message, receipt))

    @hookimpl
    def wsnmom_notification_delivered(
        self, message: NotificationMessage, subscription_id: str
    ) -> None:
        with self.lock:
            self.delivered.append((message.payload, subscription_id))

    @hookimpl
    def wsnmom_delivery_failed(
        self, message: NotificationMessage, subscription_id: str, error: BaseException
    ) -> None:
        with self.lock:
            self.failed.append((message.payload, subscription_id, error))


def wait(check: Callable[[], Any], timeout: float = 5.0) -> None:
    wait_until(check, timeout, what="the observers' records")


def test_observers_registered_at_runtime_see_publish_delivery_failure_and_pull(
    make_broker: Callable[..., Broker], outbound: RecordingOutbound
) -> None:
    pm = PluginManager(environ={}, autoload=False).load()
    broker = make_broker(plugins=pm)
    service = broker.service
    assert service is not None
    assert not pm.observes("wsnmom_notification_published")
    service.notify([note("<before/>", simple("t:obs"))])  # nobody observes yet: no cost

    observer = Observer()
    pm.register(observer, name="observer")  # after the service started
    assert pm.observes("wsnmom_notification_delivered")

    outbound.down.add(DOWN)
    up = service.subscribe(sub_req(UP, topic=simple("t:obs")))
    down = service.subscribe(sub_req(DOWN, topic=simple("t:obs")))
    pp = service.create_pull_point(CreatePullPointRequest(None))
    service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:obs")))
    service.notify([note("<one/>", simple("t:obs")), note("<two/>", simple("t:obs"))])

    assert [m.payload for m, _ in observer.published] == [b"<one/>", b"<two/>"]
    assert all(isinstance(r, PublishReceipt) for _, r in observer.published)
    assert all(m.topic is not None and m.topic.path == ("obs",) for m, _ in observer.published)

    wait(lambda: len([d for d in observer.delivered if d[1] == up.id]) == 2)
    assert [p for p, sid in observer.delivered if sid == up.id] == [b"<one/>", b"<two/>"]
    wait(lambda: any(sid == down.id for _, sid, _ in observer.failed))
    payload, _, error = next(f for f in observer.failed if f[1] == down.id)
    assert payload in (b"<one/>", b"<two/>")
    assert "down" in str(error)

    # a forward into the pull point is not a delivery; GetMessages is
    wait(lambda: (service.registry.pull_points[pp.id].handle.depth() or 0) >= 2)
    assert not any(sid == pp.id for _, sid in observer.delivered)
    got = service.get_messages(pp.id, None)
    assert [m.payload for m in got] == [b"<one/>", b"<two/>"]
    assert [p for p, sid in observer.delivered if sid == pp.id] == [b"<one/>", b"<two/>"]

    pm.unregister("observer")
    assert not pm.observes("wsnmom_notification_published")
    before = len(observer.published)
    service.notify([note("<after/>", simple("t:obs"))])
    assert len(observer.published) == before


def test_adapter_opened_and_published_through_the_runtime(tmp_path: Path) -> None:
    """``wsnmom serve``'s assembly wires the process-wide plugin manager into the service."""
    observer = Observer()
    pm = get_plugin_manager()
    pm.register(observer, name="test-runtime-observer")
    try:
        settings = runtime_settings(tmp_path)
        runtime = build_runtime(settings, outbound=RecordingOutbound())
        try:
            assert observer.opened == [runtime.adapter]
            assert runtime.service.plugins is pm
            runtime.service.notify([note("<x/>", simple("t:rt"))])
            assert [m.payload for m, _ in observer.published] == [b"<x/>"]
        finally:
            runtime.close()
    finally:
        pm.unregister("test-runtime-observer")
