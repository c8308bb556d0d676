"""The HA suite on Kafka (tansu) (issue 23, "Tests"; the run is described in
``tests/cluster/ha.py``): three instances, 60 streams, a consumer failing 10 %, kill -9,
restart, SIGSTOP/SIGCONT and SIGTERM in one run.  Each subscription's order holds
throughout (docs/scale-out.md, "Order across a failover" under Kafka): a new deliverer
continues from the position the last one saved, which lies at or below the last one's
first unsettled record, and reads the one partition in order; what the old deliverer
still posts after it lost the subscription (a post under way, a zombie's after SIGCONT)
holds only records from that position on, which the new one delivers again in order: a
duplicate, never a number first accepted after a higher one."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster import ha
from tests.cluster.conftest import Cluster

pytestmark = [pytest.mark.kafka, pytest.mark.e2e, pytest.mark.timeout(400)]


@pytest.mark.parametrize("middleware", ["kafka"], indirect=True)
def test_ha_suite(cluster: Callable[..., Cluster], middleware: str) -> None:
    ha.check(
        ha.run(cluster, middleware),
        keeps_order=("none", "kill -9", "restart", "sigstop", "sigterm"),
    )
