"""SOAP faults become typed exceptions: every WS-N / WS-RF fault the gateway can answer,
rendered by the gateway's own fault code, maps to the client class of that name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import EndpointReference, SoapVersion
from wsnmom.soap_frontend.envelope import envelope_bytes
from wsnmom.soap_frontend.faults import BaseFaultError, fault_for_error

from wsnmom.client import errors as client_errors
from wsnmom.client.errors import (
    ALL_FAULT_CLASSES,
    InvalidFilterFault,
    SoapFault,
    TerminationTimeFault,
    UnacceptableTerminationTimeFault,
    UnrecognizedPolicyRequestFault,
    WsnFault,
    fault_from_envelope,
)

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _render(error: BaseException, version: SoapVersion) -> bytes:
    fault, action, _ = fault_for_error(
        error, version, now=NOW, originator=EndpointReference("http://broker/wsn/broker")
    )
    return envelope_bytes(version, fault, action=action)


def test_every_gateway_fault_has_a_client_class() -> None:
    names = {cls.fault_name for cls in ALL_FAULT_CLASSES.values()}
    assert set(errors.ALL_FAULTS) <= names
    for clark, cls in ALL_FAULT_CLASSES.items():
        assert clark == f"{{{cls.namespace}}}{cls.fault_name}"
        assert cls.__name__ in client_errors.__all__


@pytest.mark.parametrize("version", list(SoapVersion), ids=lambda v: v.name)
@pytest.mark.parametrize("name", sorted(errors.ALL_FAULTS))
def test_fault_maps_to_its_class(name: str, version: SoapVersion) -> None:
    error = errors.ALL_FAULTS[name](f"something about {name}")
    fault = fault_from_envelope(_render(error, version), 500)
    assert isinstance(fault, WsnFault)
    assert type(fault).fault_name == name == fault.name
    assert type(fault).namespace == error.namespace
    assert fault.description == f"something about {name}"
    assert fault.timestamp == NOW
    expected_code = {"Sender": "Client", "Receiver": "Server"}[error.code]
    assert fault.code == (error.code if version is SoapVersion.SOAP12 else expected_code)
    assert fault.status == 500


def test_fault_specific_details() -> None:
    err = errors.InvalidFilter("no")
    err.unknown_filters = ("{urn:f}Mine",)  # type: ignore[attr-defined]
    fault = fault_from_envelope(_render(err, SoapVersion.SOAP12), 500)
    assert isinstance(fault, InvalidFilterFault)
    assert fault.unknown_filters == ("{urn:f}Mine",)

    policy = errors.UnrecognizedPolicyRequest("no", policies=("{urn:p}X", "{urn:p}Y"))
    fault = fault_from_envelope(_render(policy, SoapVersion.SOAP11), 500)
    assert isinstance(fault, UnrecognizedPolicyRequestFault)
    assert fault.policies == ("{urn:p}X", "{urn:p}Y")

    late = NOW + timedelta(days=3)
    tt = errors.UnacceptableTerminationTime("no", minimum_time=NOW, maximum_time=late)
    fault = fault_from_envelope(_render(tt, SoapVersion.SOAP12), 500)
    assert isinstance(fault, UnacceptableTerminationTimeFault)
    assert isinstance(fault, TerminationTimeFault)
    assert (fault.minimum_time, fault.maximum_time) == (NOW, late)


def test_base_fault_and_internal_errors() -> None:
    fault = fault_from_envelope(_render(BaseFaultError("bad Notify"), SoapVersion.SOAP12), 500)
    assert type(fault) is WsnFault and fault.fault_name == "BaseFault"
    assert fault.description == "bad Notify"
    internal = fault_from_envelope(_render(RuntimeError("secret"), SoapVersion.SOAP12), 500)
    assert type(internal) is WsnFault and internal.code == "Receiver"
    assert "secret" not in str(internal)


def test_unknown_fault_element_with_timestamp_is_a_wsn_fault() -> None:
    data = (
        b'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body><s:Fault>'
        b"<s:Code><s:Value>s:Sender</s:Value></s:Code><s:Reason><s:Text>r</s:Text></s:Reason>"
        b'<s:Detail><v:VendorFault xmlns:v="urn:v" xmlns:bf="http://docs.oasis-open.org/wsrf/bf-2">'
        b"<bf:Timestamp>2030-01-01T00:00:00Z</bf:Timestamp><bf:Description>d</bf:Description>"
        b"</v:VendorFault></s:Detail></s:Fault></s:Body></s:Envelope>"
    )
    fault = fault_from_envelope(data, 500)
    assert type(fault) is WsnFault
    assert fault.name == "VendorFault" and fault.description == "d"
    assert str(fault) == "VendorFault: d"


def test_plain_soap_fault_and_non_faults() -> None:
    data = (
        b'<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Body><s:Fault>'
        b"<faultcode>s:Server</faultcode><faultstring>down</faultstring></s:Fault></s:Body>"
        b"</s:Envelope>"
    )
    fault = fault_from_envelope(data, 500)
    assert type(fault) is SoapFault and fault.reason == "down" and fault.code == "Server"
    assert fault.detail is None
    assert fault_from_envelope(b"not xml", 500) is None
    assert fault_from_envelope(b"<html/>", 500) is None
    ok = b'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body/></s:Envelope>'
    assert fault_from_envelope(ok, 200) is None
    assert isinstance(etree.fromstring(ok), etree._Element)
