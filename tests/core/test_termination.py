"""Termination-time rules (docs/conformance.md: ITT-*, REN-*), renew, expiry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import isodate
import pytest
from wsnmom.core import errors
from wsnmom.core.model import INFINITE, CreatePullPointRequest, RegisterPublisherRequest
from wsnmom.core.service import BrokerService

from .conftest import Broker, FakeClock, RecordingOutbound, note, simple, sub_req, wait_idle


def test_default_termination_is_finite(service: BrokerService, clock: FakeClock) -> None:
    sub = service.subscribe(sub_req(topic=simple("t:a")))
    assert sub.termination_time == clock() + service.settings.termination.default


def test_duration_and_absolute(service: BrokerService, clock: FakeClock) -> None:
    sub = service.subscribe(sub_req(initial_termination_time=timedelta(seconds=60)))
    assert sub.termination_time == clock() + timedelta(seconds=60)
    when = clock() + timedelta(hours=2)
    sub = service.subscribe(sub_req(initial_termination_time=when))
    assert sub.termination_time == when
    # a dateTime without timezone is UTC (ITT-05)
    naive = (clock() + timedelta(hours=3)).replace(tzinfo=None)
    sub = service.subscribe(sub_req(initial_termination_time=naive))
    assert sub.termination_time == naive.replace(tzinfo=UTC)
    # isodate.Duration with months is calendar arithmetic: P1M from 1 Jan is 31 days,
    # beyond the 30-day maximum
    with pytest.raises(errors.UnacceptableInitialTerminationTime) as info:
        service.subscribe(sub_req(initial_termination_time=isodate.parse_duration("P1M")))
    assert "2030-02-01" in info.value.description


@pytest.mark.parametrize(
    "requested",
    [
        datetime(2000, 1, 1, tzinfo=UTC),  # past
        timedelta(0),  # not in the future
        timedelta(seconds=-5),
        timedelta(days=365),  # beyond the 30-day maximum
        INFINITE,  # infinite not configured
        datetime.max.replace(tzinfo=UTC),  # the frontend's spelling of xsi:nil
    ],
)
def test_unacceptable_initial_termination(service: BrokerService, requested: object) -> None:
    with pytest.raises(errors.UnacceptableInitialTerminationTime) as info:
        service.subscribe(sub_req(initial_termination_time=requested))
    assert info.value.minimum_time == service.now()  # type: ignore[attr-defined]
    assert service.registry.subscriptions == {}


def test_empty_initial_termination_time_faults(service: BrokerService) -> None:
    with pytest.raises(errors.UnacceptableInitialTerminationTime):
        service.subscribe(sub_req(initial_termination_time_invalid=True))


def test_infinite_when_configured(make_broker: object) -> None:
    b = make_broker(termination__allow_infinite=True)  # type: ignore[operator]
    sub = b.service.subscribe(sub_req(initial_termination_time=INFINITE))
    assert sub.termination_time is None
    sub = b.service.subscribe(sub_req(initial_termination_time=datetime.max.replace(tzinfo=UTC)))
    assert sub.termination_time is None


def test_renew(service: BrokerService, clock: FakeClock) -> None:
    sub = service.subscribe(sub_req(initial_termination_time=timedelta(seconds=10)))
    renewed = service.renew(sub.id, timedelta(days=1))
    assert renewed.termination_time == clock() + timedelta(days=1)
    assert service.get_subscription(sub.id).termination_time == renewed.termination_time
    with pytest.raises(errors.UnacceptableTerminationTime):
        service.renew(sub.id, clock() - timedelta(seconds=1))
    with pytest.raises(errors.UnacceptableTerminationTime) as info:
        service.renew(sub.id, timedelta(days=400))
    assert info.value.maximum_time == clock() + timedelta(days=30)  # type: ignore[attr-defined]
    with pytest.raises(errors.UnacceptableTerminationTime):
        service.renew(sub.id, None, invalid=True)
    with pytest.raises(errors.ResourceUnknown):
        service.renew("nope", timedelta(days=1))


def test_renew_keeps_paused_state(service: BrokerService) -> None:
    sub = service.subscribe(sub_req())
    service.pause(sub.id)
    service.renew(sub.id, timedelta(hours=2))
    assert service.get_subscription(sub.id).state.value == "paused"


def test_expiry_destroys_everything(
    broker: Broker, clock: FakeClock, outbound: RecordingOutbound
) -> None:
    service = broker.service
    assert service is not None and broker.adapter is not None
    c = "http://127.0.0.1:9/exp"
    sub = service.subscribe(
        sub_req(c, topic=simple("t:a"), initial_termination_time=timedelta(seconds=2))
    )
    pp = service.create_pull_point(
        CreatePullPointRequest(initial_termination_time=timedelta(seconds=2))
    )
    reg = service.register_publisher(
        RegisterPublisherRequest(None, initial_termination_time=clock() + timedelta(seconds=2))
    )
    clock.advance(seconds=3)
    # expired resources are unknown even before the sweep ran (CXF testRenew, ported)
    for get in (service.get_subscription, service.get_pull_point, service.get_registration):
        with pytest.raises(errors.ResourceUnknown):
            get(
                sub.id
                if get == service.get_subscription
                else pp.id
                if get == service.get_pull_point
                else reg.id
            )
    with pytest.raises(errors.ResourceUnknown):
        service.renew(sub.id, timedelta(hours=1))
    service.sweep()
    assert sub.id not in broker.adapter.subscription_names()
    assert pp.id not in broker.adapter.subscription_names()
    assert service.store.get_subscription(sub.id) is None
    assert service.store.get_pull_point(pp.id) is None
    assert service.store.get_registration(reg.id) is None
    # the barrier: a live subscription to the same topic gets the notification
    witness = "http://127.0.0.1:9/witness"
    service.subscribe(sub_req(witness, topic=simple("t:a")))
    service.notify([note("<x/>", simple("t:a"))])
    assert len(outbound.wait_messages(witness, 1)) == 1
    wait_idle(service)  # and every subscription settled what was routed to it
    assert [c.address for c in outbound.attempts] == [witness]


def test_pull_point_and_registration_default_lifetimes(
    service: BrokerService, clock: FakeClock
) -> None:
    pp = service.create_pull_point(CreatePullPointRequest())
    assert pp.termination_time == clock() + service.settings.termination.pull_point_default
    reg = service.register_publisher(RegisterPublisherRequest(None))
    assert reg.termination_time == clock() + service.settings.termination.registration_default
    with pytest.raises(errors.UnacceptableInitialTerminationTime):
        service.register_publisher(
            RegisterPublisherRequest(None, initial_termination_time=clock() - timedelta(1))
        )


def test_expired_subscription_delivers_nothing_before_the_sweep(
    service: BrokerService, clock: FakeClock, outbound: RecordingOutbound
) -> None:
    """Between its termination time and the next sweep a subscription is already unknown to
    clients, so it must not deliver either (a Notify answered after expiry never arrives)."""
    short = timedelta(seconds=2)
    service.subscribe(
        sub_req("http://127.0.0.1:9/late", topic=simple("t:late"), initial_termination_time=short)
    )
    pp = service.create_pull_point(CreatePullPointRequest())
    service.subscribe(
        sub_req(
            service.pull_point_address(pp.id),
            topic=simple("t:late"),
            initial_termination_time=short,
        )
    )
    clock.advance(seconds=3)  # both expired; the sweep (hourly in these tests) has not run
    # the barrier: a live subscription to the same topic, subscribed after the expiry
    witness = "http://127.0.0.1:9/witness"
    service.subscribe(sub_req(witness, topic=simple("t:late")))
    service.notify([note("<late/>", simple("t:late"))])
    assert len(outbound.wait_messages(witness, 1)) == 1
    wait_idle(service)  # and every subscription settled what was routed to it
    assert [c.address for c in outbound.attempts] == [witness]
    assert service.get_messages(pp.id, None) == []


def test_renew_registration(broker: Broker, clock: FakeClock) -> None:
    """A registration's new termination time (WS-N 1.0's SetTerminationTime of a
    PublisherRegistration): the Renew rules, kept in the store, and it postpones expiry."""
    service = broker.service
    assert service is not None
    reg = service.register_publisher(
        RegisterPublisherRequest(None, initial_termination_time=timedelta(seconds=10))
    )
    renewed = service.renew_registration(reg.id, timedelta(hours=1))
    assert renewed.termination_time == clock() + timedelta(hours=1)
    stored = service.store.get_registration(reg.id)
    assert stored is not None and stored.termination_time == renewed.termination_time
    for refused in (clock() - timedelta(seconds=1), timedelta(days=400), None):
        with pytest.raises(errors.UnacceptableTerminationTime):
            service.renew_registration(reg.id, refused)
    with pytest.raises(errors.UnacceptableTerminationTime):
        service.renew_registration(reg.id, None, invalid=True)
    with pytest.raises(errors.ResourceUnknown):
        service.renew_registration("nope", timedelta(hours=1))
    clock.advance(seconds=30)  # past the first termination time: still registered
    service.sweep()
    assert service.get_registration(reg.id).termination_time == renewed.termination_time
    clock.advance(seconds=3600)
    with pytest.raises(errors.ResourceUnknown):
        service.renew_registration(reg.id, timedelta(hours=1))


def test_renew_of_a_registration_destroyed_elsewhere_is_unknown_and_writes_nothing(
    broker: Broker,
) -> None:
    """SetTerminationTime of a registration another instance destroyed (its store row
    gone, this instance not told yet) answers ResourceUnknown and forgets it here; before,
    the whole record was written back, and the registration lived again."""
    service = broker.service
    assert service is not None
    reg = service.register_publisher(RegisterPublisherRequest(None))
    assert service.store.delete_registration(reg.id) is not None  # through another instance
    with pytest.raises(errors.ResourceUnknown):
        service.renew_registration(reg.id, timedelta(hours=1))
    assert service.store.get_registration(reg.id) is None
    with pytest.raises(errors.ResourceUnknown):
        service.get_registration(reg.id)
