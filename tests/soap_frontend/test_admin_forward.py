"""``admin_forward.elsewhere`` (soap_frontend/admin_forward.py): where an operator's purge
or peek is served.  An admin request another instance forwarded here is served here only
while this instance holds the backlog: once the shard moved on (a hand-over during the
request), the answer is "try again" (503), never a purge of what this instance no longer
holds, nor a second forward.  A store that cannot say which pull point a subscription
feeds is "try again" too, never an answer from an instance that may not hold it.  The
instances are a real :class:`PullOwners` and a real HTTP reader (``test_pull_forward``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask
from wsnmom.core.coordination import InstanceInfo, shard_of
from wsnmom.core.pull_owners import PullOwners
from wsnmom.soap_frontend.admin_forward import EXTENSION, elsewhere
from wsnmom.soap_frontend.auth import FORWARDED_ADMIN_KEY
from wsnmom.soap_frontend.pull_forward import PullForward

from tests.support.pull_forward_rig import PP, SECRET, Reader

SHARDS = 4


def owners(*, here: bool, table: list[InstanceInfo], fed_by: object = None) -> PullOwners:
    def fed(subscription_id: str) -> str | None:
        if isinstance(fed_by, Exception):
            raise fed_by
        return None

    return PullOwners(
        active=True,
        instance="g1",
        shards=SHARDS,
        lease=3.0,
        delivers=lambda _id: here,
        instances=lambda: table,
        retry_after=5.0,
        secret=lambda: SECRET,
        fed_by=fed,
    )


def holder(url: str, resource_id: str = PP) -> InstanceInfo:
    """Instance g2 at ``url``, holding the shard of ``resource_id``."""
    return InstanceInfo("g2", url, "v", 0.1, ((shard_of(resource_id, SHARDS), 1),), 2.0)


def app_of(readers: PullOwners) -> Flask:
    app = Flask(__name__)
    app.extensions[EXTENSION] = PullForward(lambda _e, _s: [b""], readers, 1 << 20)
    return app


@pytest.fixture
def reader() -> Iterator[Reader]:
    with Reader() as r:
        yield r


def test_a_forwarded_purge_at_an_instance_that_no_longer_holds_the_backlog_is_try_again(
    reader: Reader,
) -> None:
    """g0 sent the purge here (g1) as the reader; meanwhile the shard moved to g2: g1
    neither purges what it no longer reads nor sends the request on again."""
    app = app_of(owners(here=False, table=[holder(reader.url)]))
    path = f"/wsn/admin/api/pullpoints/{PP}/purge"
    for kind, resource in (("pull point", PP), ("subscription", PP)):
        with app.test_request_context(
            path, method="POST", environ_base={FORWARDED_ADMIN_KEY: "alice"}
        ):
            answer = elsewhere(kind, resource, "alice")
            assert answer is not None, kind  # not served here
            assert answer.status_code == 503, kind
            assert answer.headers["Retry-After"] == "5", kind
            assert "moved" in answer.get_data(as_text=True), kind
    assert reader.seen == []  # never sent on a second time


def test_a_forwarded_purge_at_the_holder_is_served_there(reader: Reader) -> None:
    app = app_of(owners(here=True, table=[holder(reader.url)]))
    with app.test_request_context(
        f"/wsn/admin/api/pullpoints/{PP}/purge",
        method="POST",
        environ_base={FORWARDED_ADMIN_KEY: "alice"},
    ):
        assert elsewhere("pull point", PP, "alice") is None
        assert elsewhere("subscription", PP, "alice") is None


def test_a_store_that_cannot_say_what_a_subscription_feeds_is_try_again(reader: Reader) -> None:
    app = app_of(owners(here=False, table=[holder(reader.url, "sub-1")], fed_by=OSError("down")))
    with app.test_request_context("/wsn/admin/api/subscriptions/sub-1/purge", method="POST"):
        answer = elsewhere("subscription", "sub-1", "alice")
        assert answer is not None and answer.status_code == 503
        assert answer.headers["Retry-After"] == "5"
    assert reader.seen == []
