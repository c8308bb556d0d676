"""The address layout of the broker's endpoints, defined once.

The NotificationBroker is ``<base>/wsn/broker``; each resource the broker creates lives at
``<base>/wsn/<kind>/<id>``, where ``<kind>`` is ``subscriptions``, ``pullpoints`` or
``registrations`` and ``<id>`` an unguessable id (``core.model.new_resource_id``).  Core
builds addresses with :func:`resource_address`; the SOAP frontend routes and resolves them
with :data:`RESOURCE_PATH` and :func:`parse_resource_path`.
"""

from __future__ import annotations

import enum
import re

__all__ = [
    "BROKER_PATH",
    "RESOURCE_ID_CHARS",
    "RESOURCE_PATH",
    "UPSTREAM_PATH",
    "ResourceKind",
    "broker_address",
    "kind_path",
    "parse_resource_path",
    "resource_address",
    "resource_path",
    "upstream_address",
]

#: path of the NotificationBroker endpoint
BROKER_PATH = "/wsn/broker"
#: path under which the gateway receives what its upstreams send (``wsnmom.upstreams``)
UPSTREAM_PATH = "/wsn/upstream"
#: characters of a resource id in a path (URL-unreserved characters)
RESOURCE_ID_CHARS = r"[A-Za-z0-9._~-]+"


class ResourceKind(enum.Enum):
    """A kind of resource the broker creates; the value is its path segment."""

    SUBSCRIPTION = "subscriptions"
    PULL_POINT = "pullpoints"
    REGISTRATION = "registrations"


#: ``/wsn/<kind>/<id>`` anywhere in a path (an optional trailing slash allowed after it);
#: group 1 is the kind's segment, group 2 the id
RESOURCE_PATH = re.compile(
    r"/wsn/(" + "|".join(k.value for k in ResourceKind) + r")/(" + RESOURCE_ID_CHARS + r")/?$"
)


def resource_path(kind: ResourceKind, resource_id: str) -> str:
    """``/wsn/<kind>/<id>``."""
    return f"{kind_path(kind)}/{resource_id}"


def kind_path(kind: ResourceKind) -> str:
    """``/wsn/<kind>``: the path every resource of ``kind`` lives under."""
    return f"/wsn/{kind.value}"


def resource_address(base_url: str, kind: ResourceKind, resource_id: str) -> str:
    """The address of a resource under ``base_url`` (no trailing slash)."""
    return base_url + resource_path(kind, resource_id)


def broker_address(base_url: str) -> str:
    """The address of the NotificationBroker endpoint under ``base_url``."""
    return base_url + BROKER_PATH


def parse_resource_path(path: str) -> tuple[ResourceKind, str] | None:
    """The resource a URL path designates (``.../wsn/<kind>/<id>``), or None."""
    match = RESOURCE_PATH.search(path)
    if match is None:
        return None
    return ResourceKind(match.group(1)), match.group(2)


def upstream_address(base_url: str, key: str) -> str:
    """The consumer address an upstream subscription delivers to."""
    return f"{base_url}{UPSTREAM_PATH}/{key}"
