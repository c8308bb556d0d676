"""core.takeover_timing: the first delivery of each subscription opened for a taken
shard is timed stage by stage in ``wsnmom_takeover_seconds{stage}``, once; deliveries
that follow, and openings that are not a take-over's, observe nothing
(docs/scale-out.md, "Failover at scale")."""

from __future__ import annotations

from wsnmom.core import metrics
from wsnmom.core.lanes import Lanes
from wsnmom.core.ownership import Ownership
from wsnmom.core.service import BrokerService
from wsnmom.core.takeover_timing import STAGES

from .conftest import RecordingOutbound, note, simple, sub_req

TAKEN = "http://127.0.0.1:9/taken"


def _observed() -> dict[str, tuple[float, float]]:
    """Per stage: (observations, sum of seconds) so far."""
    out = {}
    for stage in STAGES:
        labels = {"stage": stage}
        count = metrics.REGISTRY.get_sample_value("wsnmom_takeover_seconds_count", labels)
        total = metrics.REGISTRY.get_sample_value("wsnmom_takeover_seconds_sum", labels)
        out[stage] = (count or 0.0, total or 0.0)
    return out


def test_the_first_delivery_after_a_take_is_timed_stage_by_stage_once(
    service: BrokerService, outbound: RecordingOutbound, ownership: Ownership
) -> None:
    sub_id = service.subscribe(sub_req(TAKEN, topic=simple("t:take"))).id
    service.engine.close_channel(sub_id)  # another instance delivered its shard
    service.notify([note("<m>waiting</m>", simple("t:take"))])
    before = _observed()
    ownership.gained(set(range(service.settings.cluster.shards)))
    assert ownership.settled()
    outbound.wait_messages(TAKEN, 1)
    # a second delivery, and its sentinel: nothing more is observed
    service.notify([note("<m>after</m>", simple("t:take"))])
    outbound.wait_messages(TAKEN, 2)
    channel = service.engine.channel(sub_id)
    assert channel is not None and channel.timing is None
    after = _observed()
    seconds = {}
    for stage in STAGES:
        assert after[stage][0] - before[stage][0] == 1, stage
        seconds[stage] = after[stage][1] - before[stage][1]
    # the message waited in the middleware: each step after the opening follows the last
    order = ["opening", "read", "lane", "run", "post", "answer"]
    assert [seconds[s] for s in order] == sorted(seconds[s] for s in order)
    assert seconds["opening"] <= seconds["channel"] <= seconds["opened"]


def test_openings_that_are_no_take_over_are_not_timed(
    service: BrokerService, outbound: RecordingOutbound, ownership: Ownership
) -> None:
    before = _observed()
    sub_id = service.subscribe(sub_req(TAKEN, topic=simple("t:plain"))).id
    service.engine.close_channel(sub_id)
    ownership.reconcile(set(range(service.settings.cluster.shards)))  # not a take
    assert ownership.settled()
    service.notify([note("<m>plain</m>", simple("t:plain"))])
    outbound.wait_messages(TAKEN, 1)
    assert _observed() == before


def test_a_taken_over_first_delivery_waits_at_the_head_of_a_full_lane() -> None:
    lanes = Lanes(1, per_host=2)
    held = lanes.enter("http://h:1", ("own-1", 0))
    assert held is not None
    assert lanes.enter("http://h:1", ("own-2", 0)) is None  # waits in the destination's
    assert lanes.enter("http://h:1", ("taken", 0), first=True) is None
    assert lanes.leave(held) == [("taken", 0)]  # ahead of the one served a moment ago
    # the same in a full host lane (many ports of one host, as in the bench)
    other = lanes.enter("http://h:2", ("own-3", 0))
    again = lanes.enter("http://h:1", ("taken", 0), first=True)
    assert other is not None and again is not None
    assert lanes.enter("http://h:3", ("own-4", 0)) is None  # the host's two places taken
    assert lanes.enter("http://h:3", ("taken-2", 0), first=True) is None
    assert lanes.leave(other) == [("taken-2", 0)]
