"""Each WS-N operation answered by a call on the broker port: the endpoint a request was
posted to (:class:`Role`) and the operations each serves, the resource a request
addresses, and the broker call and the response element of each operation
(:func:`run_operation`, which :func:`.dispatch.soap_post` calls once the request is parsed,
its caller known and its older wire format, if any, rewritten).

A resource operation finds its resource from the URL path, else from ``wsa:To`` (an
address of the resource kind, see ``core.addresses``), else from the
``wsnmom:ResourceId`` reference parameter echoed as a header; with none of these it answers
ResourceUnknownFault.  A ``wsa:To`` that is not a URL addresses nothing.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, parse_qs, urlsplit

from lxml import etree
from wsnmom.core import errors
from wsnmom.core.addresses import ResourceKind, parse_resource_path
from wsnmom.core.model import WireVersion
from wsnmom.core.ports import BrokerPort

from . import codec, settled_answers
from .codec import Op
from .envelope import SoapRequest
from .faults import BaseFaultError
from .message_info import apply_app_headers, messages_header, trace_headers
from .splice import Spliced
from .xml import WSNMOM, WSRF_RL, qname

__all__ = ["BROKER_OPS", "RESOURCE_OPS", "RP_OPS", "Role", "broker_address", "run_operation"]


class Role(enum.Enum):
    """Which endpoint a request was posted to: the broker, or a resource of one of the
    kinds of ``core.addresses`` (the value is the kind's path segment)."""

    BROKER = "broker"
    #: ``/wsn/upstream/<key>``: Notify from an upstream producer (``wsnmom.upstreams``)
    UPSTREAM = "upstream"
    SUBSCRIPTION = ResourceKind.SUBSCRIPTION.value
    PULL_POINT = ResourceKind.PULL_POINT.value
    REGISTRATION = ResourceKind.REGISTRATION.value

    @classmethod
    def of(cls, kind: ResourceKind) -> Role:
        """The role of the endpoint of a resource kind."""
        return cls(kind.value)

    @property
    def kind(self) -> ResourceKind | None:
        """The resource kind of this endpoint (None for the broker)."""
        if self is Role.BROKER or self is Role.UPSTREAM:
            return None
        return ResourceKind(self.value)


#: operations that act on one resource, and the resource kind they need
RESOURCE_OPS: dict[Op, Role] = {
    Op.RENEW: Role.SUBSCRIPTION,
    Op.UNSUBSCRIBE: Role.SUBSCRIPTION,
    Op.PAUSE: Role.SUBSCRIPTION,
    Op.RESUME: Role.SUBSCRIPTION,
    Op.GET_MESSAGES: Role.PULL_POINT,
    Op.DESTROY_PULL_POINT: Role.PULL_POINT,
    Op.DESTROY_REGISTRATION: Role.REGISTRATION,
}
#: operations of the broker endpoint only
BROKER_OPS = frozenset(
    {Op.SUBSCRIBE, Op.GET_CURRENT_MESSAGE, Op.CREATE_PULL_POINT, Op.REGISTER_PUBLISHER}
)
RP_OPS = frozenset(
    {
        Op.GET_RESOURCE_PROPERTY,
        Op.GET_MULTIPLE_RESOURCE_PROPERTIES,
        Op.GET_RESOURCE_PROPERTY_DOCUMENT,
    }
)


def broker_address(service: BrokerPort) -> str:
    """The broker's address (the Originator of faults, a registration's broker)."""
    addr = service.broker_address
    return str(addr() if callable(addr) else addr)


def _to_parts(req: SoapRequest) -> SplitResult | None:
    """The request's wsa:To split into URL parts; None when absent or not a URL (a
    malformed wsa:To then addresses nothing, like an absent one)."""
    to = req.addressing.to
    if not to:
        return None
    try:
        return urlsplit(to)
    except ValueError:
        return None


def _to_path(req: SoapRequest) -> str:
    """The path of the request's wsa:To ("" when absent or not a URL)."""
    parts = _to_parts(req)
    return parts.path if parts is not None else ""


def _resolve(
    role: Role, resource_id: str | None, kind: Role, req: SoapRequest, args: Mapping[str, str]
) -> str:
    """The id of the ``kind`` resource a request targets (path, wsa:To, ResourceId)."""
    if role is kind and resource_id:
        return resource_id
    parts = _to_parts(req)
    if parts is not None:
        found = parse_resource_path(parts.path)
        if found is not None and found[0] is kind.kind:
            return found[1]
        if kind is Role.SUBSCRIPTION:  # OKSE style ...?wsn-subscriberkey=<id>
            key = parse_qs(parts.query).get("wsn-subscriberkey")
            if key:
                return key[0]
    header_id = req.addressing.resource_id
    if header_id:
        return header_id
    if kind is Role.SUBSCRIPTION and args.get("wsn-subscriberkey"):
        return str(args["wsn-subscriberkey"])
    raise errors.ResourceUnknown(
        f"no {kind.value[:-1]} is addressed by this request (use the EPR returned when it was "
        "created: its address, or echo its reference parameters)"
    )


def run_operation(
    service: BrokerPort,
    role: Role,
    resource_id: str | None,
    op: Op,
    req: SoapRequest,
    args: Mapping[str, str],
    environ: Mapping[str, Any] | None = None,
) -> etree._Element | Spliced | None:
    """The broker's answer to the WS-N operation ``op`` posted to the endpoint of ``role``
    (None: one-way); core errors propagate, to be rendered as faults."""
    body = req.body
    now = service.now
    if op in BROKER_OPS and role is not Role.BROKER:
        raise BaseFaultError(f"{op.local} is not an operation of this endpoint; use the broker")
    if op is Op.NOTIFY:
        messages = codec.parse_notify(body)
        others = req.addressing.other_headers
        if role is not Role.PULL_POINT and others:
            messages = codec.apply_hops(others, messages)
        messages = apply_app_headers(others, messages, trace_headers(environ))
        if role is Role.PULL_POINT:
            service.notify_pull_point(
                _resolve(role, resource_id, Role.PULL_POINT, req, args), messages
            )
        elif role is Role.SUBSCRIPTION:
            raise BaseFaultError("a subscription manager does not accept Notify")
        else:
            service.notify(messages)
        return None
    if op is Op.SUBSCRIBE:
        request = codec.parse_subscribe(body, req.version)
        if req.wire is not WireVersion.WSN_13:  # delivered to in the format it spoke
            request = dataclasses.replace(request, wire_version=req.wire)
        sub = service.subscribe(request)
        return codec.subscribe_response(sub, service.subscription_address(sub.id), now())
    if op is Op.GET_CURRENT_MESSAGE:
        message = service.get_current_message(codec.parse_get_current_message(body))
        return codec.get_current_message_response(message)
    if op is Op.CREATE_PULL_POINT:
        pp = service.create_pull_point(codec.parse_create_pull_point(body))
        return codec.create_pull_point_response(pp, service.pull_point_address(pp.id), now())
    if op is Op.REGISTER_PUBLISHER:
        reg = service.register_publisher(codec.parse_register_publisher(body))
        return codec.register_publisher_response(
            reg, service.registration_address(reg.id), broker_address(service)
        )
    if op is Op.RENEW and req.wire is not WireVersion.WSN_13:
        registration = _registration_addressed(role, resource_id, req)
        if registration is not None:  # an older SetTerminationTime of a registration
            value, invalid = codec.parse_renew(body)
            reg = service.renew_registration(registration, value, invalid=invalid)
            return codec.renew_response(reg, now())
    if op in RESOURCE_OPS:
        rid = _resolve(role, resource_id, RESOURCE_OPS[op], req, args)
        return _resource_op(service, op, rid, body)
    if op in RP_OPS:
        return _resource_properties(service, role, resource_id, op, req)
    if op is Op.DESTROY:
        return _wsrl_destroy(service, role, resource_id, req)
    raise BaseFaultError(f"unsupported operation {op.local}")  # pragma: no cover


def _registration_addressed(role: Role, resource_id: str | None, req: SoapRequest) -> str | None:
    """The registration a request posted to its address (or to the broker with the
    registration's address in ``wsa:To``) is for; None for any other resource."""
    if role is Role.REGISTRATION:
        return resource_id
    if role is Role.BROKER:
        found = parse_resource_path(_to_path(req))
        if found is not None and Role.of(found[0]) is Role.REGISTRATION:
            return found[1]
    return None


def _wsrl_destroy(
    service: BrokerPort, role: Role, resource_id: str | None, req: SoapRequest
) -> etree._Element:
    """WS-ResourceLifetime immediate termination (``wsrf-rl:Destroy``) of a subscription,
    pull point or publisher registration: the resources expose WS-RP properties, so they
    must support it (docs/conformance.md: RP-02, PP-03, PRM-02).  The broker itself is not
    destroyable."""
    target, rid = role, resource_id
    if role is Role.BROKER:
        found = parse_resource_path(_to_path(req))
        if found is None:
            raise errors.ResourceUnknown(
                "wsrf-rl:Destroy needs a subscription, pull point or "
                "registration; the broker cannot be destroyed"
            )
        target, rid = Role.of(found[0]), found[1]
    if rid is None:  # pragma: no cover - resource endpoints always carry an id
        raise errors.ResourceUnknown("no resource addressed")
    if target is Role.SUBSCRIPTION:
        service.unsubscribe(rid)
    elif target is Role.PULL_POINT:
        service.destroy_pull_point(rid)
    else:
        service.destroy_registration(rid)
    return codec.empty_response(qname(WSRF_RL, "DestroyResponse"))


def _resource_op(
    service: BrokerPort, op: Op, rid: str, body: etree._Element
) -> etree._Element | Spliced:
    T = codec.T
    if op is Op.RENEW:
        value, invalid = codec.parse_renew(body)
        sub = service.renew(rid, value, invalid=invalid)
        return codec.renew_response(sub, service.now())
    if op is Op.UNSUBSCRIBE:
        service.unsubscribe(rid)
        return codec.empty_response(T("UnsubscribeResponse"))
    if op is Op.PAUSE:
        service.pause(rid)
        return codec.empty_response(T("PauseSubscriptionResponse"))
    if op is Op.RESUME:
        service.resume(rid)
        return codec.empty_response(T("ResumeSubscriptionResponse"))
    if op is Op.GET_MESSAGES:
        maximum = codec.parse_get_messages(body)
        taken, settlement = service.hand_out_messages(rid, maximum)
        # settled once the answer is written, given back if it is not
        settled_answers.defer(settlement)
        response = codec.get_messages_response(taken)
        if not taken:
            return response
        return dataclasses.replace(response, headers=(messages_header(taken),))
    if op is Op.DESTROY_PULL_POINT:
        service.destroy_pull_point(rid)
        return codec.empty_response(T("DestroyPullPointResponse"))
    if op is Op.DESTROY_REGISTRATION:
        service.destroy_registration(rid)
        return codec.empty_response(codec.BR("DestroyRegistrationResponse"))
    raise BaseFaultError(f"unsupported operation {op.local}")  # pragma: no cover


def _property_table(
    service: BrokerPort, role: Role, resource_id: str | None, req: SoapRequest
) -> tuple[dict[str, codec.PropertyRenderer], str]:
    now = service.now()
    target_role, rid = role, resource_id
    if role is Role.BROKER:
        # a resource's properties asked at the broker URL: find it from the headers
        found = parse_resource_path(_to_path(req))
        if found is not None:
            target_role, rid = Role.of(found[0]), found[1]
        elif (header_id := req.addressing.resource_id) is not None:
            for candidate in (Role.SUBSCRIPTION, Role.PULL_POINT, Role.REGISTRATION):
                try:
                    _lookup(service, candidate, header_id)
                except errors.ResourceUnknown:
                    continue
                target_role, rid = candidate, header_id
                break
            else:
                raise errors.ResourceUnknown(f"no resource {header_id}")
    if target_role is Role.BROKER or rid is None:
        return codec.broker_properties(service), codec.BR("NotificationBrokerRP")
    if target_role is Role.SUBSCRIPTION:
        sub = service.get_subscription(rid)
        return codec.subscription_properties(sub, now), codec.T("SubscriptionManagerRP")
    if target_role is Role.PULL_POINT:
        pp = service.get_pull_point(rid)
        return codec.pull_point_properties(pp, now), f"{{{WSNMOM}}}PullPointRP"
    reg = service.get_registration(rid)
    return codec.registration_properties(reg, now), codec.BR("PublisherRegistrationRP")


def _lookup(service: BrokerPort, role: Role, rid: str) -> object:
    if role is Role.SUBSCRIPTION:
        return service.get_subscription(rid)
    if role is Role.PULL_POINT:
        return service.get_pull_point(rid)
    return service.get_registration(rid)


def _resource_properties(
    service: BrokerPort, role: Role, resource_id: str | None, op: Op, req: SoapRequest
) -> etree._Element:
    if op is Op.GET_RESOURCE_PROPERTY:
        name = codec.parse_get_resource_property(req.body)
        table, _ = _property_table(service, role, resource_id, req)
        return codec.get_resource_property_response(table, [name])
    if op is Op.GET_MULTIPLE_RESOURCE_PROPERTIES:
        names = codec.parse_get_multiple_resource_properties(req.body)
        table, _ = _property_table(service, role, resource_id, req)
        return codec.get_resource_property_response(table, names, multiple=True)
    table, doc_tag = _property_table(service, role, resource_id, req)
    return codec.resource_property_document(table, doc_tag)
