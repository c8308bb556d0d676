"""A GetMessages answer cut by a kill -9 of its reading instance, after the head and the
first byte of its body went out, loses nothing: its messages were not settled (the
settlement waits for the server's write of the whole body, ``core.pull_handout``), so
the middleware hands them out again through the survivor (MQTT: the session's unacked
messages; RabbitMQ ``pull = "get"``: the dead connection's unacked gets; Kafka: the
unsaved position).  The reader kills itself in that window every time
(``tests/support/killpoint``, ``KILLPOINT_CUT_ANSWER``, armed by a file once the reader
is known): the head and the first byte of a GetMessages answer holding messages go out,
then the process sends itself SIGKILL.  Before the fix, MQTT
lost the cut answer every time (``[1, 2, 3]``), as did RabbitMQ's auto-ack gets; a
GetMessages forwarded to the reader by the other instance was answered 503 ("try again")
while its messages were settled.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.cluster.conftest import BOTH, MQTT, Cluster
from tests.cluster.test_pull_owner import ONE_SHARD, feed, get_messages, publish
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: the test-only fault injection the gateways start with (``KILLPOINT_CUT_ANSWER``)
KILLPOINT = Path(__file__).parent.parent / "support" / "killpoint"


@pytest.mark.parametrize(
    ("middleware", "forwarded"),
    [
        *[pytest.param(*m.values, False, marks=m.marks, id=str(m.values[0])) for m in BOTH],
        # asked through the other instance, which relays the reader's cut answer as a 503:
        # the reader is cut as a client's answer would be (a gateway start per case is
        # most of its time, so MQTT has this case only)
        pytest.param(*MQTT.values, True, marks=MQTT.marks, id="mqtt-forwarded"),
    ],
    indirect=["middleware"],
)
def test_an_answer_cut_by_a_kill_of_its_reader_comes_again(
    cluster: Callable[..., Cluster], tmp_path: Path, forwarded: bool
) -> None:
    arms = [tmp_path / f"arm-{i}" for i in range(2)]
    c = cluster(
        2,
        instance_env=lambda i: {"KILLPOINT_CUT_ANSWER": str(arms[i])},
        PYTHONPATH=str(KILLPOINT),
        **ONE_SHARD,
    )
    a, b = c.gateways
    address = c.client(a).create_pull_point().reference.address
    feed(c, b, address)
    total = 20
    publish(c, a, range(10))
    first = wait_until(
        lambda: (lambda x: x if x.numbers else None)(get_messages(c, a, address, 1)),
        20,
        what="the first message",
    )
    got = list(first.numbers)
    reader, survivor = (a, b) if first.instance == c.instance_of(a) else (b, a)
    arms[c.gateways.index(reader)].touch()
    if forwarded:
        assert get_messages(c, survivor, address, 3).status == 503  # the relay was cut
    else:
        with pytest.raises((requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
            get_messages(c, reader, address, 3)  # cut: the reader died
    assert reader.process is not None
    reader.process.wait(10)
    # what comes after the kill is the sentinel: once all of it is drained from the
    # survivor, what the dead reader cut had its chance to come again
    publish(c, survivor, range(10, total))

    def drained() -> bool:
        answer = get_messages(c, survivor, address, 50)
        if answer.status == 200:
            got.extend(answer.numbers)
        return set(range(10, total)) <= set(got)

    wait_until(drained, 90, what="the survivor hands out everything sent after the kill")
    missing = sorted(set(range(total)) - set(got))
    assert missing == [], f"lost with the answer the kill cut: {missing}"
