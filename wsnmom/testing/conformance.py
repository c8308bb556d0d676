"""Adapter conformance kit: the behaviour every wsnmom adapter must show, as pytest classes.

Subclass :class:`AdapterConformance` in your adapter's test suite and provide an
``adapter_url`` fixture (and, optionally, ``adapter_options``)::

    import pytest
    from wsnmom.testing.conformance import AdapterConformance

    class TestNatsConformance(AdapterConformance):
        @pytest.fixture
        def adapter_url(self, nats_server):
            return nats_server.url

        # brokers that route asynchronously may need more time
        receive_timeout = 10.0

Every test uses its own topic namespace and subscription names (uuid4), so the classes can
share one broker, also with other suites running against it.  A test that needs something
the adapter's ``Capabilities`` say it cannot do is *skipped*, with the capability name as
the reason (``retained_current_message``, ``syntax.multi_level_mid_path``, ...); it never
fails for that reason.  Pick single groups by subclassing only some of the base classes
(``class TestMine(TopicRouting, AckSemantics)``: each group brings the fixtures).

The adapter is resolved from the URL through the plugin registry (so your plugin's entry
point is exercised too), unless you override the ``adapter_class`` fixture.

Adapters without a pull of their own (``native_pull=False``: logs; RabbitMQ with its
default ``pull = "buffer"``) are checked through
``wsnmom.core.pull_buffer.PullBuffer``, the same buffer core uses for their pull points;
the ``PullSemantics`` group (the adapter's own pull) is skipped for them.

Import every name from this module.  The kit is laid out in parts: the fixtures and
helpers in :mod:`.conformance_fixtures`, the groups in :mod:`.conformance_routing`
(basics, routing), :mod:`.conformance_delivery` (acks, pull, pause and resume),
:mod:`.conformance_retention` (durability, limits, dead letters, delete) and
:mod:`.conformance_messages` (current message, headers and bodies, peek); the wsnmom
pytest plugin rewrites the assertions of each.
"""

from __future__ import annotations

from wsnmom.testing.conformance_delivery import AckSemantics, PauseResume, PullSemantics
from wsnmom.testing.conformance_fixtures import (
    KIT_BUFFER,
    SENTINEL,
    AdapterFixtures,
    Collector,
    MakeAdapter,
    Names,
    Puller,
    require,
    require_pattern_support,
)
from wsnmom.testing.conformance_messages import CurrentMessage, HeadersAndBodies, Peek
from wsnmom.testing.conformance_retention import (
    Delete,
    DroppedToDeadLetters,
    Durability,
    QueueLimitsSemantics,
)
from wsnmom.testing.conformance_routing import AdapterBasics, TopicRouting

__all__ = [
    "KIT_BUFFER",
    "SENTINEL",
    "AckSemantics",
    "AdapterBasics",
    "AdapterConformance",
    "AdapterFixtures",
    "Collector",
    "CurrentMessage",
    "Delete",
    "DroppedToDeadLetters",
    "Durability",
    "HeadersAndBodies",
    "MakeAdapter",
    "Names",
    "PauseResume",
    "Peek",
    "PullSemantics",
    "Puller",
    "QueueLimitsSemantics",
    "TopicRouting",
    "require",
    "require_pattern_support",
]


class AdapterConformance(
    AdapterBasics,
    TopicRouting,
    AckSemantics,
    PullSemantics,
    PauseResume,
    Durability,
    QueueLimitsSemantics,
    DroppedToDeadLetters,
    CurrentMessage,
    Delete,
    HeadersAndBodies,
    Peek,
):
    """Every conformance group.  Subclass it (name it ``Test...``) and give ``adapter_url``."""
