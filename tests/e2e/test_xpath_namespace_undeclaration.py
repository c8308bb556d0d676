"""MC-06 (f): a namespace undeclaration (``xmlns=""``) inside a payload survives the SOAP path: a
MessageContent filter (XPath 1.0 dialect) sees an element that undeclares the default
namespace in no namespace, as it does in process, and the consumer gets the same infoset
(wrapped and raw) that was published.

The payload crosses the gateway as bytes: the Notify is parsed, the payload re-serialised
for the middleware, read back by the filter and rendered for the consumer.  An element
``<a xmlns=""/>`` inside ``<x xmlns="urn:n">`` is ``{}a``; were the undeclaration lost on
the way, it would become ``{urn:n}a`` and ``//a`` would not match it.
"""

from __future__ import annotations

import uuid

import pytest
from lxml import etree

from tests.e2e.conftest import Wsn
from tests.fixtures.server import ConsumerServer
from tests.support.soap import NS, XPATH
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

PAYLOADS = {
    # the default namespace of the payload root undeclared on its child (the likelier loss)
    "default-undeclared": '<x xmlns="urn:n"><a xmlns=""/></x>',
    # a prefixed root, its child in no namespace, an undeclaration that changes nothing
    "prefixed-root": '<n:x xmlns:n="urn:n"><a xmlns=""/></n:x>',
    # deeper: an undeclaration under two default namespaces, declared again below it
    "nested": '<x xmlns="urn:n"><y xmlns="urn:m"><a xmlns=""><b xmlns="urn:n"/></a></y></x>',
}


def _c14n(el: etree._Element) -> bytes:
    """The element's infoset as exclusive canonical XML (namespaces as they are in scope:
    an ``xmlns=""`` is written where it undeclares a default namespace, nowhere else)."""
    return etree.tostring(el, method="c14n", exclusive=True, with_comments=False)


@pytest.mark.parametrize("case", sorted(PAYLOADS))
def test_an_undeclared_default_namespace_matches_and_is_delivered_as_published(
    wsn: Wsn, consumer_factory: object, case: str
) -> None:
    make = consumer_factory  # type: ignore[assignment]
    wrapped: ConsumerServer = make()  # type: ignore[operator]
    raw: ConsumerServer = make()  # type: ignore[operator]
    payload = PAYLOADS[case]
    topic = f"tns:u{uuid.uuid4().hex[:8]}"
    mc = f'<wsnt:MessageContent Dialect="{XPATH}">//a</wsnt:MessageContent>'
    wsn.subscribe(wrapped.address(), topic, extra_filter=mc)
    wsn.subscribe(raw.address(), topic, extra_filter=mc, policy="<wsnt:UseRaw/>")
    # the sentinel passes the filter too (its root is an ``a``): once it has come, the
    # payload before it was either delivered or filtered out
    wsn.notify((topic, payload))
    wsn.notify((topic, '<a sentinel="1"/>'))

    def wrapped_payloads() -> list[etree._Element]:
        return [c for m in wrapped.messages() for c in m.findall("wsnt:Message/*", NS)]

    def raw_payloads() -> list[etree._Element]:
        return [rec.body_child for rec in raw.notifies()]

    for name, got in (("wrapped", wrapped_payloads), ("raw", raw_payloads)):
        wait_until(
            lambda got=got: any(p.tag == "a" and p.get("sentinel") for p in got()),  # type: ignore[misc]
            what=f"the sentinel at the {name} consumer",
        )
        payloads = [p for p in got() if p.get("sentinel") is None]
        # matched: ``//a`` found the element in no namespace
        assert len(payloads) == 1, f"{name}: {[etree.tostring(p) for p in payloads]}"
        (delivered,) = payloads
        assert delivered.find(".//a") is not None and delivered.find(".//{urn:n}a") is None
        # the consumer sees the infoset that was published
        assert _c14n(delivered) == _c14n(etree.fromstring(payload)), name
        if case != "prefixed-root":  # there the undeclaration changes nothing
            sent = b"".join(rec.body for rec in (wrapped if name == "wrapped" else raw).notifies())
            assert b'<a xmlns=""' in sent, name
