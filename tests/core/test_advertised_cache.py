"""The broker's property answer (``BrokerService.broker_properties``) is built once per
topic-set version and visibility (``core.advertised.AdvertisedProperties``): a topic
admitted here or taken in from another instance is in the next answer, and each identity
still sees exactly the topics its ACLs name, whoever asked before it."""

from __future__ import annotations

from lxml import etree
from wsnmom.core.access import ANONYMOUS, Principal, bound_principal
from wsnmom.core.service import BrokerService
from wsnmom.topic_mapping.model import DEEP, PathPattern, Topic

from .conftest import NS, concrete, note

SENSORS = Principal("sensor-app", subscribe=(PathPattern(NS, ("sensors", DEEP)),), method="basic")
#: another name with the same ACLs as SENSORS
SENSORS_TOO = Principal(
    "sensor-app-2", subscribe=(PathPattern(NS, ("sensors", DEEP)),), method="basic"
)
ALARMS = Principal("alarm-app", notify=(PathPattern(NS, ("alarms",)),), method="basic")


def seen(service: BrokerService, principal: Principal) -> set[str]:
    """The topic expressions ``principal`` is shown; checks the TopicSet element agrees."""
    with bound_principal(principal):
        props = service.broker_properties()
    texts = {str(e.text) for e in props.topic_expressions}
    marked = {
        "tns:" + "/".join(etree.QName(n).localname for n in [el, *el.iterancestors()][-2::-1])
        for el in props.topic_set.iter()
        if el.get("{http://docs.oasis-open.org/wsn/t-1}topic") == "true"
    }
    assert marked == texts, (marked, texts)
    return texts


def test_a_topic_admitted_is_in_the_next_answer(service: BrokerService) -> None:
    service.notify([note("<a/>", concrete("t:sensors/room1"))])
    before = seen(service, ANONYMOUS)
    assert before == seen(service, ANONYMOUS)  # (the second answer comes from the cache)
    service.notify([note("<b/>", concrete("t:sensors/room2"))])
    assert seen(service, ANONYMOUS) == before | {"tns:sensors/room2"}


def test_a_topic_taken_in_from_another_instance_is_in_the_next_answer(
    service: BrokerService,
) -> None:
    service.notify([note("<a/>", concrete("t:sensors/room1"))])
    before = seen(service, ANONYMOUS)
    assert service.topic_set.take_in([Topic(NS, ("sensors", "elsewhere"))])
    assert seen(service, ANONYMOUS) == before | {"tns:sensors/elsewhere"}


def test_each_identity_sees_exactly_what_its_acls_name(service: BrokerService) -> None:
    service.notify([note("<a/>", concrete("t:sensors/room1")), note("<b/>", concrete("t:alarms"))])
    for _ in range(2):  # built, then from the cache, in turns
        assert seen(service, SENSORS) == {"tns:sensors/room1"}
        assert seen(service, ALARMS) == {"tns:alarms"}
        assert seen(service, ANONYMOUS) == {"tns:sensors/room1", "tns:alarms"}
        assert seen(service, SENSORS_TOO) == {"tns:sensors/room1"}
    service.notify([note("<c/>", concrete("t:sensors/room2")), note("<d/>", concrete("t:other"))])
    assert seen(service, ALARMS) == {"tns:alarms"}
    assert seen(service, SENSORS) == {"tns:sensors/room1", "tns:sensors/room2"}
    assert "tns:other" in seen(service, ANONYMOUS)
