"""A subscription whose backlog is full is ended after its backlog went to its dead
letters; when the middleware does not take the backlog its delivery is started again.
That stop and start are changes of the subscription like a Pause's, under its lock
(review of issue 23's lock per subscription): a Pause meanwhile waits, and then holds.
Before, the Pause went through while the delivery was stopped and the failed ending
started it again: a paused subscription delivering."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from wsnmom.core.adapter import AdapterError
from wsnmom.core.model import SubscriptionState
from wsnmom.core.service import BrokerService

from .conftest import RecordingOutbound, note, simple, sub_req

VICTIM = "http://127.0.0.1:9/victim"
CONTROL = "http://127.0.0.1:9/control"


class Refusing:
    """The subscription's handle as the ending sees it: sending the backlog to the dead
    letters fails, after ``meanwhile`` ran."""

    def __init__(self, real: Any, meanwhile: Any) -> None:
        self.real = real
        self.meanwhile = meanwhile

    def delete_into_dead_letters(self, *args: Any, **kwargs: Any) -> int:
        self.meanwhile()
        raise AdapterError("the dead letters refuse the backlog")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_pause_while_a_full_subscription_fails_to_end_holds(
    service: BrokerService, outbound: RecordingOutbound, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub_id = service.subscribe(sub_req(VICTIM, topic=simple("t:a"))).id
    service.subscribe(sub_req(CONTROL, topic=simple("t:a")))
    state = service.registry.subscriptions[sub_id]
    dead_letters: Any = service._ctx.dead_letters
    monkeypatch.setattr(dead_letters, "ending_context", lambda sub, error: {})
    pausing: list[threading.Thread] = []

    def pause_meanwhile() -> None:
        thread = threading.Thread(target=service.pause, args=(sub_id,), daemon=True)
        thread.start()
        pausing.append(thread)
        thread.join(1)  # it either waits for the ending or (before) went through

    state.handle = Refusing(state.handle, pause_meanwhile)  # type: ignore[assignment]
    assert not service.subscriptions.end_full(state, "accumulation limit reached")
    pausing[0].join(10)
    assert not pausing[0].is_alive()
    assert service.get_subscription(sub_id).state is SubscriptionState.PAUSED
    channel = service.engine.channel(sub_id)
    assert channel is not None and not channel.active  # before: started again
    service.notify([note("<m>after</m>", simple("t:a"))])
    outbound.wait_messages(CONTROL, 1)  # the sentinel
    assert outbound.payloads_to(VICTIM) == []
