"""GetMessages through the WSGI application (real core on the embedded adapter): the
messages of an answer are settled only once the server's write of the whole body
returned; an answer the server never wrote (closed first) or whose write never returned
is handed out again, first, by the next GetMessages; a written one never comes again
(``core.pull_handout``, ``soap_frontend.settled_answers``)."""

from __future__ import annotations

from wsnmom.core.model import CreatePullPointRequest
from wsnmom.core.service import BrokerService

from tests.support.pull_answers import cut, start_get_messages, written, wsgi_app

from .conftest import note


def test_an_answer_never_written_is_handed_out_again_first(service: BrokerService) -> None:
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note(f"<m>{i}</m>") for i in range(3)])
    status, body = start_get_messages(app, pp.id)
    assert status.startswith("200")
    body.close()  # the server closes the answer before writing its body
    service.notify_pull_point(pp.id, [note("<m>3</m>")])
    assert written(app, pp.id) == ["0", "1", "2", "3"]
    # written whole: settled, never handed out again
    assert written(app, pp.id) == []


def test_an_answer_whose_write_never_returned_comes_again(service: BrokerService) -> None:
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note(f"<m>{i}</m>") for i in range(2)])
    assert cut(app, pp.id) == ["0", "1"]
    assert written(app, pp.id) == ["0", "1"]
    assert written(app, pp.id) == []


def test_an_answer_the_server_wrote_is_settled(service: BrokerService) -> None:
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note("<m>0</m>")])
    _, body = start_get_messages(app, pp.id)
    chunks = iter(body)
    assert next(chunks)
    # the server's write returned and it asked for more: the answer is settled
    assert list(chunks) == []
    body.close()
    service.notify_pull_point(pp.id, [note("<m>1</m>")])
    assert written(app, pp.id) == ["1"]
