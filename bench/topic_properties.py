"""What answering the broker's topic properties costs per request, with the per-version
cache (``core.advertised.AdvertisedProperties`` and ``resource_properties.rendered_once``)
and without it, measured in the same run.

``python -m bench.topic_properties [--topics N] [--rounds R]`` builds a topic set of N ad-hoc
topics (default 10,000) and times, in-process, the answers the frontend builds and
serialises: GetResourceProperty of ``wstop:TopicSet``, of ``wsnt:TopicExpression``,
GetResourcePropertyDocument (NotificationBrokerRP) and ONVIF's GetEventProperties.  The
uncached path is the one before the cache: the properties rebuilt for every request (one
expression and one element per topic) and rendered anew.  Prints the mean seconds of each
and the ratio uncached / cached.  Run it with ``uptime`` beside it: every figure depends
on the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from lxml import etree
from wsnmom.core.advertised import AdvertisedProperties, broker_properties
from wsnmom.core.config import Settings
from wsnmom.core.ports import BrokerProperties
from wsnmom.soap_frontend import codec
from wsnmom.soap_frontend.envelope import SoapVersion, envelope_bytes
from wsnmom.soap_frontend.onvif import EventService
from wsnmom.soap_frontend.xml import WSTOP, qname
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.topic_set import TopicSet


class _Port:
    """The part of ``BrokerPort`` the property answers use."""

    def __init__(self, props: Callable[[], BrokerProperties]) -> None:
        self.broker_properties = props

    def policy(self) -> Any:
        return {}


def _answers(port: Any) -> dict[str, Callable[[], bytes]]:
    def rp(names: list[str]) -> bytes:
        table = codec.broker_properties(port)
        body = codec.get_resource_property_response(table, names)
        return envelope_bytes(SoapVersion.SOAP12, body, action=None)

    def document() -> bytes:
        table = codec.broker_properties(port)
        body = codec.resource_property_document(table, codec.BR("NotificationBrokerRP"))
        return envelope_bytes(SoapVersion.SOAP12, body, action=None)

    def onvif() -> bytes:
        body = EventService(port, None, "http://127.0.0.1", 10)._event_properties()
        return envelope_bytes(SoapVersion.SOAP12, body, action=None)

    return {
        "GetResourceProperty TopicSet": lambda: rp([qname(WSTOP, "TopicSet")]),
        "GetResourceProperty TopicExpression": lambda: rp([codec.T("TopicExpression")]),
        "GetResourcePropertyDocument": document,
        "GetEventProperties": onvif,
    }


def _mean(call: Callable[[], bytes], rounds: int) -> tuple[float, int]:
    size = len(call())  # warm: the cached path renders once here
    spent = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        spent.append(time.perf_counter() - started)
    return statistics.mean(spent), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    topic_set = TopicSet()
    for i in range(args.topics):
        topic_set.admit(Topic("urn:bench", ("t", f"t{i}")))
    settings = Settings()
    cache = AdvertisedProperties(settings, topic_set)
    uncached = _answers(_Port(lambda: broker_properties(settings, topic_set)))
    cached = _answers(_Port(cache.get))
    print(f"{args.topics:,} topics, mean of {args.rounds} answers (in-process, serialised)")
    for name in uncached:
        before, size = _mean(uncached[name], args.rounds)
        after, size2 = _mean(cached[name], args.rounds)
        assert size == size2, (name, size, size2)
        print(
            f"{name:38} {size / 2**10:7.0f} KiB | uncached {before * 1000:8.1f} ms | "
            f"cached {after * 1000:7.1f} ms | ratio {before / after:5.1f}",
            flush=True,
        )
    etree.clear_error_log()


if __name__ == "__main__":
    main()
