"""An adapter's ``cluster_options`` (issue 23 §3): on a store several instances share,
``wsnmom serve`` sets them unless the adapter URL's query or the configured options name
them. RabbitMQ's is ``pull = "get"``: every instance takes a pull point's messages from its
queue, none holds them in a buffer of its own.  Only construction: nothing connects."""

from __future__ import annotations

import pytest
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.core.config import Settings
from wsnmom.core.store_url import shared_store

from wsnmom.server import make_adapter

AMQP = "amqp://guest:guest@127.0.0.1:1/%2F"
PG = "postgresql://wsnmom@127.0.0.1:1/wsnmom"


def _pull(adapter_url: str, store_url: str, options: dict[str, str] | None = None) -> str:
    settings = Settings(adapter_url=adapter_url, store_url=store_url)
    if options:
        settings.adapter_options = options
    adapter = make_adapter(settings)
    assert isinstance(adapter, RabbitMQAdapter)
    return adapter.opts.pull


def test_a_shared_store_sets_the_adapters_cluster_options() -> None:
    assert RabbitMQAdapter.cluster_options["pull"] == "get"
    assert _pull(AMQP, PG) == "get"
    assert _pull(AMQP, "sqlite:////tmp/store.db") == "buffer"


@pytest.mark.parametrize(
    ("url", "options"),
    [(AMQP + "?pull=buffer", None), (AMQP, {"pull": "buffer"})],
    ids=["query", "options"],
)
def test_what_the_operator_says_wins(url: str, options: dict[str, str] | None) -> None:
    assert _pull(url, PG, options) == "buffer"


def test_which_stores_are_shared() -> None:
    assert shared_store(PG) and shared_store("postgres://h/db")
    assert not shared_store("sqlite:////tmp/store.db")
