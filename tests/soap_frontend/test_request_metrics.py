"""Request counting: ``count_request`` keeps each operation's counter child instead of
looking it up with ``labels()`` on every call; every call must still count."""

from __future__ import annotations

from wsnmom.core import metrics
from wsnmom.soap_frontend import faults


def requests_counted(operation: str) -> float:
    value = metrics.REGISTRY.get_sample_value("wsnmom_requests_total", {"operation": operation})
    return value or 0.0


def test_every_request_is_counted() -> None:
    before = requests_counted("CountedOp")
    for _ in range(3):
        metrics.count_request("CountedOp")
    faults.count_request("CountedOp")  # the frontend's hook
    assert requests_counted("CountedOp") == before + 4
    assert requests_counted("OtherOp") == 0.0
    metrics.count_request("OtherOp")
    assert requests_counted("OtherOp") == 1.0


def test_faults_are_counted_through_the_hook() -> None:
    def faults_counted() -> float:
        value = metrics.REGISTRY.get_sample_value("wsnmom_faults_total", {"fault": "CountedFault"})
        return value or 0.0

    before = faults_counted()
    faults.count_fault("CountedFault")
    assert faults_counted() == before + 1
