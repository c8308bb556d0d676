"""docs/conformance.md §12 at service level: resource EPRs are capabilities (SEC-01), so every
subscription, pull point and registration id is a fresh 128-bit random value."""

from __future__ import annotations

import re

from wsnmom.core.model import CreatePullPointRequest, RegisterPublisherRequest
from wsnmom.core.service import BrokerService

from .conftest import simple, sub_req

HEX128 = re.compile(r"[0-9a-f]{32}")


def test_resource_ids_are_unguessable(service: BrokerService) -> None:
    """SEC-01, SEC-08: ids are 32 hex digits (uuid4), all distinct, and the resource
    addresses carry them, so knowing one EPR reveals nothing about another."""
    ids = [service.subscribe(sub_req(topic=simple("t:sec"))).id for _ in range(20)]
    ids += [service.create_pull_point(CreatePullPointRequest()).id for _ in range(5)]
    ids += [
        service.register_publisher(RegisterPublisherRequest(None, topics=(simple("t:sec"),))).id
        for _ in range(5)
    ]
    assert all(HEX128.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert service.subscription_address(ids[0]).endswith(ids[0])
