"""WS-N message codec: request bodies → core request records, core results → response XML.

Import from this module; it re-exports its parts: :mod:`.wsn_operations` (the operations,
their body QNames and actions, the dialect URIs), :mod:`.request_parsers` (request bodies
to core records; which fault each malformed body raises), :mod:`.responses` (builders,
EPRs, NotificationMessages, the responses) and :mod:`.resource_properties`
(WS-ResourceProperties, the policy).

Parsing is strict about what the specifications make mandatory and lenient elsewhere
(unknown ``##other`` extension children are ignored, prefixes never matter, a
TopicExpression without ``Dialect`` is passed on with ``dialect=None``).  Every malformed
body raises the precise ``WsnError`` of the operation, never a bare exception.

Every EPR the broker issues carries the resource id twice: in the address path and as the
reference parameter ``<wsnmom:ResourceId>`` (so clients that post to the wrong URL but echo
reference parameters still reach the resource).
"""

from __future__ import annotations

from .request_parsers import (
    HOPS,
    VIA,
    apply_hops,
    expression,
    hops_header,
    parse_create_pull_point,
    parse_filter,
    parse_get_current_message,
    parse_get_messages,
    parse_get_multiple_resource_properties,
    parse_get_resource_property,
    parse_notify,
    parse_register_publisher,
    parse_renew,
    parse_subscribe,
    parse_time,
)
from .resource_properties import (
    PropertyRenderer,
    broker_properties,
    get_resource_property_response,
    policy_element,
    pull_point_properties,
    registration_properties,
    resource_property_document,
    subscription_properties,
)
from .responses import (
    add,
    add_epr,
    add_expression,
    add_time,
    add_topic,
    create_pull_point_response,
    empty_response,
    get_current_message_response,
    get_messages_response,
    new,
    notification_messages_xml,
    notify_element,
    payload_element,
    payload_xml,
    raw_payload,
    register_publisher_response,
    renew_response,
    resource_epr,
    subscribe_response,
    topic_dialect_for,
)
from .wsn_operations import (
    ACTIONS,
    BR,
    CONCRETE,
    FULL,
    INFINITE,
    NOTIFY_ACTION,
    ONVIF_TOPICS,
    OPERATIONS,
    SIMPLE,
    Op,
    T,
    response_action,
)

__all__ = [
    "ACTIONS",
    "BR",
    "CONCRETE",
    "FULL",
    "HOPS",
    "INFINITE",
    "NOTIFY_ACTION",
    "ONVIF_TOPICS",
    "OPERATIONS",
    "SIMPLE",
    "VIA",
    "Op",
    "PropertyRenderer",
    "T",
    "add",
    "add_epr",
    "add_expression",
    "add_time",
    "add_topic",
    "apply_hops",
    "broker_properties",
    "create_pull_point_response",
    "empty_response",
    "expression",
    "get_current_message_response",
    "get_messages_response",
    "get_resource_property_response",
    "hops_header",
    "new",
    "notification_messages_xml",
    "notify_element",
    "parse_create_pull_point",
    "parse_filter",
    "parse_get_current_message",
    "parse_get_messages",
    "parse_get_multiple_resource_properties",
    "parse_get_resource_property",
    "parse_notify",
    "parse_register_publisher",
    "parse_renew",
    "parse_subscribe",
    "parse_time",
    "payload_element",
    "payload_xml",
    "policy_element",
    "pull_point_properties",
    "raw_payload",
    "register_publisher_response",
    "registration_properties",
    "renew_response",
    "resource_epr",
    "resource_property_document",
    "response_action",
    "subscribe_response",
    "subscription_properties",
    "topic_dialect_for",
]
