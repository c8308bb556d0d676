"""The JSON documents the stores keep of the broker's records (subscriptions, pull points,
publisher registrations, current messages) and of their parts (endpoint references,
expressions, topics, times), and back: the same in the SQLite and the PostgreSQL store.
Binary parts (reference parameters, filter and policy XML, payloads) are base64."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from wsnmom.core.delivery_policy import DeliveryChoices
from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    SoapVersion,
    Subscription,
    SubscriptionState,
    WireVersion,
)
from wsnmom.topic_mapping.model import Topic


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def time_to_json(value: datetime | None) -> str | None:
    """JSON form of a time (ISO 8601; the SQLite store's termination-time column too)."""
    return None if value is None else value.isoformat()


def time_from_json(text: str | None) -> datetime | None:
    """Inverse of :func:`time_to_json`."""
    return None if text is None else datetime.fromisoformat(text)


def epr_to_json(epr: EndpointReference | None) -> dict[str, Any] | None:
    """JSON form of an endpoint reference."""
    if epr is None:
        return None
    return {
        "address": epr.address,
        "reference_parameters": [_b64(p) for p in epr.reference_parameters],
        "metadata": _b64(epr.metadata),
    }


def epr_from_json(data: dict[str, Any] | None) -> EndpointReference | None:
    """Inverse of :func:`epr_to_json`."""
    if data is None:
        return None
    params = tuple(base64.b64decode(p) for p in data.get("reference_parameters", ()))
    return EndpointReference(data["address"], params, _unb64(data.get("metadata")))


def expr_to_json(expr: ExpressionSource | None) -> dict[str, Any] | None:
    """JSON form of an expression source (the None prefix is the default namespace)."""
    if expr is None:
        return None
    return {
        "dialect": expr.dialect,
        "text": expr.text,
        "namespaces": [[p, uri] for p, uri in expr.namespaces.items()],
    }


def expr_from_json(data: dict[str, Any] | None) -> ExpressionSource | None:
    """Inverse of :func:`expr_to_json`."""
    if data is None:
        return None
    return ExpressionSource(data["dialect"], data["text"], {p: u for p, u in data["namespaces"]})


def topic_to_json(topic: Topic | None) -> dict[str, Any] | None:
    """JSON form of a topic."""
    return None if topic is None else {"namespace": topic.namespace, "path": list(topic.path)}


def topic_from_json(data: dict[str, Any] | None) -> Topic | None:
    """Inverse of :func:`topic_to_json`."""
    return None if data is None else Topic(data["namespace"], tuple(data["path"]))


def topic_key(topic: Topic) -> str:
    """A topic as one text, ``{namespace}a/b`` (a recorded topic's key, and its id in the
    change log): its path's names are NCNames, so neither ``}`` nor ``/`` is in them."""
    return "{" + topic.namespace + "}" + "/".join(topic.path)


def topic_from_key(key: str) -> Topic:
    """The topic of a :func:`topic_key` text; ValueError when it is none."""
    namespace, brace, path = key.rpartition("}")
    if not brace or not namespace.startswith("{") or not path:
        raise ValueError(f"not a topic key: {key!r}")
    return Topic(namespace[1:], tuple(path.split("/")))


def subscription_to_json(sub: Subscription) -> dict[str, Any]:
    """JSON document of a subscription."""
    return {
        "id": sub.id,
        "consumer": epr_to_json(sub.consumer),
        "creation_time": time_to_json(sub.creation_time),
        "termination_time": time_to_json(sub.termination_time),
        "topic": expr_to_json(sub.topic),
        "message_content": expr_to_json(sub.message_content),
        "producer_properties": expr_to_json(sub.producer_properties),
        "filter_xml": _b64(sub.filter_xml),
        "policy_xml": _b64(sub.policy_xml),
        "use_raw": sub.use_raw,
        "subscription_end_topic": expr_to_json(sub.subscription_end_topic),
        "dead_letters": sub.dead_letters,
        "delivery_policy": (None if sub.delivery_policy is None else sub.delivery_policy.to_json()),
        "state": sub.state.value,
        "soap_version": sub.soap_version.value,
        "wire_version": sub.wire_version.value,
        "pull_point_id": sub.pull_point_id,
        "owner": sub.owner,
        "queued": sub.queued,
    }


def subscription_from_json(d: dict[str, Any]) -> Subscription:
    """Inverse of :func:`subscription_to_json`."""
    consumer = epr_from_json(d["consumer"])
    created = time_from_json(d["creation_time"])
    assert consumer is not None and created is not None
    return Subscription(
        id=d["id"],
        consumer=consumer,
        creation_time=created,
        termination_time=time_from_json(d["termination_time"]),
        topic=expr_from_json(d["topic"]),
        message_content=expr_from_json(d["message_content"]),
        producer_properties=expr_from_json(d["producer_properties"]),
        filter_xml=_unb64(d["filter_xml"]),
        policy_xml=_unb64(d["policy_xml"]),
        use_raw=d["use_raw"],
        subscription_end_topic=expr_from_json(d["subscription_end_topic"]),
        dead_letters=d.get("dead_letters"),
        delivery_policy=DeliveryChoices.from_json(d.get("delivery_policy")),
        state=SubscriptionState(d["state"]),
        soap_version=SoapVersion(d["soap_version"]),
        # records written before wire versions were kept are WS-N 1.3 ones
        wire_version=WireVersion(d.get("wire_version", WireVersion.WSN_13.value)),
        pull_point_id=d["pull_point_id"],
        owner=d.get("owner"),
        queued=d.get("queued", False),
    )


def pull_point_to_json(pp: PullPoint) -> dict[str, Any]:
    """JSON document of a pull point."""
    return {
        "id": pp.id,
        "creation_time": time_to_json(pp.creation_time),
        "termination_time": time_to_json(pp.termination_time),
        "name": pp.name,
        "owner": pp.owner,
    }


def pull_point_from_json(d: dict[str, Any]) -> PullPoint:
    """Inverse of :func:`pull_point_to_json`."""
    created = time_from_json(d["creation_time"])
    assert created is not None
    # records written before owners were recorded have none: anonymous-owned
    return PullPoint(
        d["id"], created, time_from_json(d["termination_time"]), d["name"], d.get("owner")
    )


def registration_to_json(reg: PublisherRegistration) -> dict[str, Any]:
    """JSON document of a publisher registration."""
    return {
        "id": reg.id,
        "creation_time": time_to_json(reg.creation_time),
        **registration_termination_to_json(reg.termination_time),
        "publisher_reference": epr_to_json(reg.publisher_reference),
        "topics": [expr_to_json(t) for t in reg.topics],
        "demand": reg.demand,
        **registration_demand_to_json(reg.demand_subscription, reg.demand_paused),
        "owner": reg.owner,
    }


def registration_demand_to_json(
    subscription: EndpointReference | None, paused: bool
) -> dict[str, Any]:
    """The part of a registration's document the demand manager writes (its subscription
    at the publisher), merged into the stored document by itself."""
    return {"demand_subscription": epr_to_json(subscription), "demand_paused": paused}


def registration_termination_to_json(termination_time: datetime | None) -> dict[str, Any]:
    """The part of a registration's document SetTerminationTime writes."""
    return {"termination_time": time_to_json(termination_time)}


def registration_from_json(d: dict[str, Any]) -> PublisherRegistration:
    """Inverse of :func:`registration_to_json`."""
    created = time_from_json(d["creation_time"])
    assert created is not None
    topics = tuple(t for t in (expr_from_json(x) for x in d["topics"]) if t is not None)
    return PublisherRegistration(
        id=d["id"],
        creation_time=created,
        termination_time=time_from_json(d["termination_time"]),
        publisher_reference=epr_from_json(d["publisher_reference"]),
        topics=topics,
        demand=d["demand"],
        demand_subscription=epr_from_json(d["demand_subscription"]),
        demand_paused=d["demand_paused"],
        owner=d.get("owner"),
    )


def message_to_json(msg: NotificationMessage) -> dict[str, Any]:
    """JSON document of a notification message."""
    return {
        "message_id": msg.message_id,
        "payload": _b64(msg.payload),
        "topic": topic_to_json(msg.topic),
        "topic_dialect": msg.topic_dialect,
        "producer_reference": epr_to_json(msg.producer_reference),
        "content_type": msg.content_type,
        "published_at": time_to_json(msg.published_at),
        "subscription_reference": epr_to_json(msg.subscription_reference),
        "headers": [list(pair) for pair in msg.headers],
    }


def message_from_json(d: dict[str, Any]) -> NotificationMessage:
    """Inverse of :func:`message_to_json`."""
    payload = _unb64(d["payload"])
    assert payload is not None
    return NotificationMessage(
        message_id=d["message_id"],
        payload=payload,
        topic=topic_from_json(d["topic"]),
        topic_dialect=d["topic_dialect"],
        producer_reference=epr_from_json(d["producer_reference"]),
        content_type=d["content_type"],
        published_at=time_from_json(d["published_at"]),
        subscription_reference=epr_from_json(d.get("subscription_reference")),
        headers=tuple((str(n), str(v)) for n, v in d.get("headers") or ()),
    )
