"""The faults an older WS-N version's WSDL (``?wsdl&version=1.0`` / ``1.2-draft``) declares
per operation are exactly the ones the runtime sends for it: every 1.3 fault the 1.3 WSDL
declares for the operation(s) an older request is handled as, plus any request's
(wsrf-bf:BaseFault, ResourceUnavailableFault, an internal error), rendered by
:func:`legacy_faults.fault` as the server does, is declared there with that element and name;
and each declared fault is one the runtime sends."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from wsnmom.core import errors
from wsnmom.core.model import SoapVersion, WireVersion
from wsnmom.soap_frontend import legacy_faults
from wsnmom.soap_frontend.faults import BaseFaultError
from wsnmom.soap_frontend.legacy import LEGACY, Legacy
from wsnmom.soap_frontend.legacy_wsdl import render_legacy_wsdl
from wsnmom.soap_frontend.metadata import render_wsdl

from tests.support.wsdl_faults import Fault, declared

S12 = "http://www.w3.org/2003/05/soap-envelope"
BASE = "http://127.0.0.1:1"

#: older WSDL operation → (kind of request, the 1.3 operations it is handled as)
OPERATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Notify": ("notify", ()),
    "Subscribe": ("subscribe", ("Subscribe",)),
    "GetCurrentMessage": ("current", ("GetCurrentMessage",)),
    "PauseSubscription": ("pause", ("PauseSubscription",)),
    "ResumeSubscription": ("resume", ("ResumeSubscription",)),
    "RegisterPublisher": ("register", ("RegisterPublisher",)),
    "Destroy": ("destroy", ("Unsubscribe", "DestroyRegistration")),
    "SetTerminationTime": ("set_termination_time", ("Renew",)),
    "GetResourceProperty": ("get_property", ("GetResourceProperty",)),
}


def _faults_13(names: tuple[str, ...]) -> list[str]:
    """The fault elements (Clark names) the served 1.3 WSDL declares for ``names``."""
    ops = declared(render_wsdl(BASE))
    return sorted({el for (_, op), faults in ops.items() if op in names for _, el in faults})


def _error(element: str) -> BaseException:
    ns, local = element[1:].split("}", 1)
    cls = errors.ALL_FAULTS[local]
    assert cls.namespace == ns, element
    return cls("provoked")


def sent(legacy: Legacy, exc: BaseException, kind: str) -> Fault:
    """(fault name, detail element) of the fault the runtime sends for ``exc``."""
    fault, _, _ = legacy_faults.fault(
        legacy, exc, SoapVersion.SOAP12, kind, now=datetime.now(UTC), originator=None
    )
    detail = fault.find(f"{{{S12}}}Detail")
    assert detail is not None and len(detail) == 1
    element = str(detail[0].tag)
    if legacy.version is WireVersion.WSN_10:
        text = fault.findtext(f"{{{S12}}}Reason/{{{S12}}}Text") or ""
        assert (detail[0].text or "").split(":")[0] == text.split(":")[0]
        return text.split(":")[0], element
    return element.rsplit("}", 1)[1], element


@pytest.mark.parametrize("version", list(LEGACY), ids=lambda v: f"wsn-{v.value}")
def test_every_fault_sent_is_declared_for_its_operation(version: WireVersion) -> None:
    legacy = LEGACY[version]
    ops = declared(render_legacy_wsdl(version, BASE))
    assert {op for _, op in ops} == set(OPERATIONS)
    checked = 0
    for (port_type, op), faults in ops.items():
        kind, ops_13 = OPERATIONS[op]
        if kind == "notify":  # one-way: WSDL 1.1 has no fault for it
            assert faults == set()
            continue
        provoked = [
            *(_error(el) for el in _faults_13(ops_13)),
            errors.ResourceUnavailable("overloaded"),
            BaseFaultError("malformed"),
            RuntimeError("internal"),
        ]
        answered = {sent(legacy, exc, kind) for exc in provoked}
        for exc in provoked:
            assert sent(legacy, exc, kind) in faults, (port_type, op, exc)
            checked += 1
        # and nothing is declared that the runtime does not send
        assert faults == answered, (port_type, op)
    assert checked > 50


@pytest.mark.parametrize("version", list(LEGACY), ids=lambda v: f"wsn-{v.value}")
@pytest.mark.parametrize("kind", [k for k, _ in OPERATIONS.values()])
def test_the_runtime_and_the_wsdl_follow_one_rule(version: WireVersion, kind: str) -> None:
    """For every fault core has, whatever the request: the element sent is the one
    :func:`legacy_faults.fault_element` names (the rule the WSDL is built from)."""
    legacy = LEGACY[version]
    for name, cls in sorted(errors.ALL_FAULTS.items()):
        rule = legacy_faults.fault_element(legacy, f"{{{cls.namespace}}}{name}", kind)
        assert sent(legacy, cls("x"), kind) == (
            rule.name,
            f"{{{rule.namespace}}}{rule.local}",
        )


def test_draft_names_and_10_namespaces() -> None:
    """The defect this guards against: the 1.2-draft WSDL named 1.0 faults
    (``UnknownResourceFault``), and 1.0's put every ErrorMessage in the notification
    namespace."""
    draft = LEGACY[WireVersion.WSN_12_DRAFT]
    ops = declared(render_legacy_wsdl(WireVersion.WSN_12_DRAFT, BASE))
    destroy = ops[("SubscriptionManager", "Destroy")]
    assert ("ResourceUnknownFault", f"{{{draft.wsrl}}}ResourceUnknownFault") in destroy
    assert ("ResourceNotDestroyedFault", f"{{{draft.wsrl}}}ResourceNotDestroyedFault") in destroy
    subscribe = ops[("NotificationBroker", "Subscribe")]
    assert ("TopicPathDialectUnknownFault", f"{{{draft.wsnt}}}TopicPathDialectUnknownFault") in (
        subscribe
    )
    assert not any("UnknownResource" in el for faults in ops.values() for _, el in faults)
    ten = LEGACY[WireVersion.WSN_10]
    ops = declared(render_legacy_wsdl(WireVersion.WSN_10, BASE))
    assert ("UnknownResource", f"{{{ten.wsrl}}}ErrorMessage") in ops[
        ("PublisherRegistrationManager", "Destroy")
    ]
    assert ("UnknownResource", f"{{{ten.wsrp}}}ErrorMessage") in ops[
        ("SubscriptionManager", "GetResourceProperty")
    ]
    assert ("UnknownResource", f"{{{ten.wsnt}}}ErrorMessage") in ops[
        ("SubscriptionManager", "PauseSubscription")
    ]
