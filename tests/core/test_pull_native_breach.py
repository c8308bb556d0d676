"""Native pull (embedded) and a feed's filter going over its budget while answers that
took the feed's messages are on their way: each message such an answer took before the
breach is handed out (the answer written) or a dead letter (not written), once.  The
embedded middleware's backlog burial takes what is handed out and unsettled too, so the
end waits for those answers (``PullReader.wait_settled``); before, a written answer's
message was also a dead letter, an unwritten one's twice, and the answer that met the
breach settled what it took at once (lost when it was not written)."""

from __future__ import annotations

from typing import Any

import pytest
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource
from wsnmom.core.pull_reader import PullReader

from tests.core.conftest import note, simple, sub_req
from tests.support.pull_answers import start_get_messages, wsgi_app
from tests.support.waiting import wait_until

XPATH10 = "http://www.w3.org/TR/1999/REC-xpath-19991116"
#: nested location paths: minutes of CPU on BIG, far past any filter budget
CUBIC = "count(//a[count(//a[count(//a) > 0]) > 0]) > 0"
BIG = "<r>" + "<a/>" * 3000 + "</r>"
EARLY = "<r><a/><e>early</e></r>"


@pytest.mark.parametrize("taken", ["by the answer that meets the breach", "by an earlier answer"])
@pytest.mark.parametrize("answer", ["written", "cut"])
def test_what_an_answer_took_before_the_breach_is_handed_out_or_a_dead_letter_once(
    make_broker: Any, answer: str, taken: str
) -> None:
    b = make_broker(filters__cpu_limit=0.2, filters__costly_nice=0, limits__max_age=None)
    service = b.service
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    reader = service.registry.pull_points[pp.id].reader
    assert isinstance(reader, PullReader)
    content = ExpressionSource(XPATH10, CUBIC, {})
    address = service.pull_point_address(pp.id)
    sub = service.subscribe(sub_req(address, topic=simple("t:e"), message_content=content))
    if taken == "by the answer that meets the breach":
        service.notify([note(EARLY, simple("t:e")), note(BIG, simple("t:e"))])
        status, body = start_get_messages(app, pp.id)  # takes EARLY, meets BIG
    else:
        service.notify([note(EARLY, simple("t:e"))])
        status, body = start_get_messages(app, pp.id)  # takes EARLY
        service.notify([note(BIG, simple("t:e"))])
        assert service.get_messages(pp.id, None) == []  # meets BIG
    try:
        # the end waits for the answer, or (the defect) buried the backlog with EARLY
        wait_until(
            lambda: reader.settling(sub.id) or sub.id not in service.registry.subscriptions,
            30,
            what="the end waiting for the answer",
        )
        data = b"".join(body) if answer == "written" else next(iter(body))
    finally:
        body.close()
    assert status.startswith("200") and b"early" in data, data
    wait_until(lambda: sub.id not in service.registry.subscriptions, 30, what="the end")
    bodies = [BIG.encode()[:20]] + ([EARLY.encode()[:20]] if answer == "cut" else [])
    wait_until(lambda: len(service.dead_letters()) >= len(bodies), 15, what="the dead letters")
    service.notify_pull_point(pp.id, [note("<m>sentinel</m>")])
    got: list[bytes] = []

    def sentinel() -> bool:
        got.extend(m.payload for m in service.get_messages(pp.id, None))
        return bool(got)

    wait_until(sentinel, 10, what="the sentinel")
    assert got == [b"<m>sentinel</m>"]  # nothing kept in the inbox
    assert sorted(d.body[:20] for d in service.dead_letters()) == sorted(bodies)
