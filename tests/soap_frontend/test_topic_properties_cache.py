"""The broker's topic properties over HTTP, answered from the per-version cache
(``core.advertised.AdvertisedProperties``, ``resource_properties.rendered_once``): a topic
notified is in the very next GetResourceProperty (TopicSet, TopicExpression),
GetResourcePropertyDocument and ONVIF GetEventProperties, and an identity with a topic ACL
still sees only its topics, whoever asked before it (docs/security.md, "Topics")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lxml import etree
from wsnmom.core.config import load_settings

from tests.support.soap import CONCRETE, WSNT, content_type, envelope, notify_body
from wsnmom.server import build_runtime

NS = "urn:test:topics"
WSTOP = "http://docs.oasis-open.org/wsn/t-1"
WSRF_RP = "http://docs.oasis-open.org/wsrf/rp-2"
TEV = "http://www.onvif.org/ver10/events/wsdl"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
PROXY = "10.0.0.5"


@pytest.fixture
def http(tmp_path: Path) -> Iterator[Any]:
    users = tmp_path / "users.toml"
    users.write_text(f'[users.carol]\nsubscribe = ["{{{NS}}}sensors//*"]\n[users.dave]\n')
    users.chmod(0o600)
    settings = load_settings(
        None,
        environ={},
        overrides={
            "data_dir": str(tmp_path),
            "auth__users_file": str(users),
            "trusted_proxies": [PROXY],
            "auth__proxy_header": "X-Client-Identity",
        },
    )
    runtime = build_runtime(settings)
    try:
        yield runtime.app.test_client()
    finally:
        runtime.close()


def post(http: Any, who: str, body: str, path: str = "/wsn/broker") -> etree._Element:
    resp = http.post(
        path,
        data=envelope(body),
        content_type=content_type("1.2"),
        headers={"X-Client-Identity": who},
        environ_base={"REMOTE_ADDR": PROXY},
    )
    assert resp.status_code in (200, 202), resp.data
    if resp.status_code == 202:
        return etree.Element("accepted")
    found = etree.fromstring(resp.data).find(f"{{{SOAP12}}}Body")
    assert found is not None
    return found[0]


def marked(topic_set: etree._Element) -> set[str]:
    """The member topics of a ``wstop:TopicSet`` element, as ``a/b`` paths in :data:`NS`."""
    out = set()
    for el in topic_set.iter():
        if el.get(f"{{{WSTOP}}}topic") == "true":
            path = [el]
            while (parent := path[-1].getparent()) is not None and parent is not topic_set:
                path.append(parent)
            path.reverse()
            assert all(etree.QName(n).namespace == NS for n in path)
            out.add("/".join(etree.QName(n).localname for n in path))
    return out


def answers(http: Any, who: str) -> list[set[str]]:
    """What ``who`` is shown as topics by each of the four answers."""
    rp = f'<wsrf-rp:GetResourceProperty xmlns:wstop="{WSTOP}">wstop:TopicSet'
    (topic_set,) = post(http, who, rp + "</wsrf-rp:GetResourceProperty>")
    expressions = post(
        http, who, "<wsrf-rp:GetResourceProperty>wsnt:TopicExpression</wsrf-rp:GetResourceProperty>"
    )
    document = post(http, who, "<wsrf-rp:GetResourcePropertyDocument/>")
    (in_document,) = document.iter(f"{{{WSTOP}}}TopicSet")
    onvif = post(http, who, f'<tev:GetEventProperties xmlns:tev="{TEV}"/>', "/onvif/event_service")
    (onvif_set,) = onvif.iter(f"{{{WSTOP}}}TopicSet")
    listed = {str(e.text).split(":", 1)[1] for e in expressions.iter(f"{{{WSNT}}}TopicExpression")}
    return [marked(topic_set), listed, marked(in_document), marked(onvif_set)]


def test_the_next_answer_has_the_new_topic_and_each_identity_its_own(http: Any) -> None:
    assert answers(http, "dave") == [set()] * 4  # the empty set, cached
    assert answers(http, "carol") == [set()] * 4
    post(
        http,
        "dave",
        notify_body(("tns:sensors/room1", "<a/>"), ("tns:alarms", "<b/>"), dialect=CONCRETE),
    )
    assert answers(http, "carol") == [{"sensors/room1"}] * 4
    assert answers(http, "dave") == [{"sensors/room1", "alarms"}] * 4
    assert answers(http, "carol") == [{"sensors/room1"}] * 4  # (from the cache)
    post(http, "dave", notify_body(("tns:sensors/room2", "<c/>"), dialect=CONCRETE))
    assert answers(http, "dave") == [{"sensors/room1", "sensors/room2", "alarms"}] * 4
    assert answers(http, "carol") == [{"sensors/room1", "sensors/room2"}] * 4


def test_what_is_rendered_of_a_properties_object_goes_with_it() -> None:
    """The frontend keeps its renderings of a ``BrokerProperties`` only while the broker
    (or a request) holds the object: a topic set's old versions are not kept."""
    import gc

    from wsnmom.core.ports import BrokerProperties
    from wsnmom.soap_frontend import resource_properties

    props = BrokerProperties([], False, (), etree.Element("x"), False)
    builds: list[int] = []

    def build() -> list[etree._Element]:
        builds.append(1)
        return [etree.Element("rendered")]

    first = resource_properties.rendered_once(props, "n", build)
    again = resource_properties.rendered_once(props, "n", build)
    assert [e.tag for e in first + again] == ["rendered", "rendered"] and len(builds) == 1
    assert first[0] is not again[0]  # each answer its own copy
    key = id(props)
    assert key in resource_properties._rendered
    del props
    gc.collect()
    assert key not in resource_properties._rendered
