"""The ``ha`` family's recording push consumers, over real loopback HTTP: one server part
(``ha_rig.Posts``: each POST parsed into a ``Post`` and handed to a hook, answered 202)
under the three recorders the scenarios read (``ha_rig.Recorder``, ``ha_scale.PathRecorder``,
``ha_posts.Counting``)."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator

import pytest

from bench.ha_posts import Counting
from bench.ha_rig import Post, Posts, Recorder
from bench.scenarios.ha_scale import PORTS, PathRecorder

BODY = b'<Notify><m seq="7"/><m seq="8"/></Notify>'


def post(address: str, sender: str = "g1", body: bytes = BODY) -> int:
    request = urllib.request.Request(
        address, data=body, method="POST", headers={"WSNMOM-Instance": sender}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return int(answer.status)


@pytest.fixture
def posts() -> Iterator[tuple[Posts, list[Post]]]:
    got: list[Post] = []
    lock = threading.Lock()

    def record(p: Post) -> None:
        with lock:
            got.append(p)

    server = Posts(record, ports=2)
    yield server, got
    server.close()


def test_posts_parse_each_post_and_answer_202(posts: tuple[Posts, list[Post]]) -> None:
    server, got = posts
    first, second = server.address(0, "/a"), server.address(1, "/b")
    assert first.rsplit(":", 1)[0] == "http://127.0.0.1" and first != second
    assert server.address(2, "/a") == first  # the ports are taken in turn
    assert post(first, "g1") == 202
    assert post(second, "g2", b"<Notify/>") == 202
    assert [(p.path, p.sender, p.seqs) for p in got] == [("/a", "g1", (7, 8)), ("/b", "g2", ())]
    assert got[0].at <= got[1].at


def test_the_three_recorders_record_what_their_scenarios_read() -> None:
    recorder, paths, counting = Recorder(), PathRecorder(), Counting()
    try:
        assert post(recorder.address, "g0") == 202
        assert [(who, seq) for _, who, seq in recorder.snapshot()] == [("g0", 7), ("g0", 8)]
        assert recorder.count() == 2
        assert post(paths.address(PORTS + 3), "g2") == 202
        assert paths.address(PORTS + 3).endswith(f"/s{PORTS + 3}")
        assert [(p, who, seqs) for _, p, who, seqs in paths.snapshot()] == [
            (f"/s{PORTS + 3}", "g2", (7, 8))
        ]
        assert post(counting.address) == 202 and post(counting.address) == 202
        assert (counting.messages, counting.posts) == (4, 2)
    finally:
        recorder.close()
        paths.close()
        counting.close()
