"""The HA suite on Kafka (tansu) (issue 23, "Tests"; the run is described in
``tests/cluster/ha.py``): three instances, 60 streams, a consumer failing 10 %, kill -9,
restart, SIGSTOP/SIGCONT and SIGTERM in one run."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster import ha
from tests.cluster.conftest import Cluster

pytestmark = [pytest.mark.kafka, pytest.mark.e2e, pytest.mark.timeout(400)]


@pytest.mark.parametrize("middleware", ["kafka"], indirect=True)
def test_ha_suite(cluster: Callable[..., Cluster], middleware: str) -> None:
    ha.check(ha.run(cluster, middleware))
