"""PerThread (one lxml parser / compiled XPath per thread) and the callers that rely on it:
MessageContent filters, ``safe_parse`` and the frontend's ``parse_xml`` evaluated from many
threads at once must give each thread its own object and the right answers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
from wsnmom.core.codec import safe_parse
from wsnmom.core.filters import XPATH10, MessageContentFilter
from wsnmom.core.model import ExpressionSource
from wsnmom.core.per_thread import PerThread
from wsnmom.soap_frontend.xml import XmlRejected, parse_xml

THREADS = 8
R = TypeVar("R")


def _in_threads(work: Callable[[int], R], count: int = THREADS) -> list[R]:
    """Run ``work(i)`` in ``count`` threads started together; results in order."""
    barrier = threading.Barrier(count)

    def run(i: int) -> R:
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def test_one_instance_per_thread_made_lazily() -> None:
    made: list[object] = []

    def factory() -> object:
        obj = object()
        made.append(obj)
        return obj

    per = PerThread(factory)
    assert made == []
    mine = per.get()
    assert per.get() is mine and made == [mine]
    barrier = threading.Barrier(THREADS)

    def twice(_: int) -> tuple[object, object]:
        first = per.get()
        barrier.wait()  # every thread holds its instance at the same moment
        return first, per.get()

    pairs = _in_threads(twice)
    firsts = [p[0] for p in pairs]
    assert all(a is b for a, b in pairs)
    assert len({id(o) for o in firsts}) == THREADS
    assert mine not in firsts
    assert len(made) == THREADS + 1


def test_first_instance_belongs_to_the_creating_thread() -> None:
    first = object()
    per = PerThread(object, first)
    assert per.get() is first
    (other,) = _in_threads(lambda _: per.get(), 1)
    assert other is not first


def test_message_content_filter_from_many_threads() -> None:
    f = MessageContentFilter(ExpressionSource(XPATH10, "/e/@n mod 3 = 0", {}))

    def work(i: int) -> list[bool]:
        return [f.matches(f'<e n="{n}"/>'.encode()) for n in range(i, i + 300)]

    results = _in_threads(work)
    for i, got in enumerate(results):
        assert got == [n % 3 == 0 for n in range(i, i + 300)]


def test_parsers_from_many_threads() -> None:
    def work(i: int) -> list[str]:
        tags = []
        for n in range(200):
            tags.append(safe_parse(f"<a{i}_{n}/>".encode()).tag)
            tags.append(parse_xml(f"<b{i}_{n}><c/></b{i}_{n}>".encode()).tag)
        return tags

    results = _in_threads(work)
    for i, tags in enumerate(results):
        expected = [t for n in range(200) for t in (f"a{i}_{n}", f"b{i}_{n}")]
        assert tags == expected


def test_depth_limit_holds_in_every_thread() -> None:
    deep = b"<x>" * 40 + b"</x>" * 40

    def work(_: int) -> bool:
        parse_xml(deep, max_depth=40)
        with pytest.raises(XmlRejected, match="deeper than 39"):
            parse_xml(deep, max_depth=39)
        return True

    assert all(_in_threads(work))
