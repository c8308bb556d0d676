"""What a Subscribe with an XPath topic expression costs to compile, with the topic
document kept per version of the topic set (``TopicSet.xpath_document``) and without it
(the document of every topic built for each expression, as before), measured in the same
run.

``python -m bench.topic_xpath [--topics N] [--rounds R] [--threads T]`` builds a topic set
of N ad-hoc topics (default 10,000) and times, in-process, ``core.filters
.compile_topic_filter`` (what Subscribe does with its TopicExpression) for a few XPath
expressions: the mean seconds per compile of each path and the ratio uncached / cached.
With ``--threads`` T > 1, T threads compile at once (what concurrent Subscribes do) and
the figure is the wall time per compile.  It also prints the memory the kept document
takes (tracemalloc).  Run it with ``uptime`` beside it: every figure depends on the
machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import TYPE_CHECKING

from wsnmom.core.filters import compile_topic_filter
from wsnmom.core.model import ExpressionSource
from wsnmom.topic_mapping.dialects import XPATH
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.topic_set import TopicSet
from wsnmom.topic_mapping.xpath_dialect import topic_document

if TYPE_CHECKING:
    from wsnmom.topic_mapping.model import XPathDocument

NS = "urn:bench"
EXPRESSIONS = ("p:g3/*[1]", "p:g7/p:t705 | p:g8/p:t801", "p:g2/*[position() < 4]")


class _Uncached(TopicSet):
    """The path before the per-version document: built for every expression."""

    def xpath_document(self) -> XPathDocument:
        return topic_document(self.to_element())


def _fill(topic_set: TopicSet, topics: int) -> TopicSet:
    for i in range(topics):
        topic_set.admit(Topic(NS, (f"g{i // 100}", f"t{i}")))
    return topic_set


def _per_compile(topic_set: TopicSet, rounds: int, threads: int) -> float:
    sources = [ExpressionSource(XPATH, text, {"p": NS}) for text in EXPRESSIONS]
    for source in sources:  # warm: the cached path builds its document here
        assert compile_topic_filter(source, topic_set).patterns

    def run() -> None:
        for _ in range(rounds):
            for source in sources:
                compile_topic_filter(source, topic_set)

    if threads == 1:
        spent = []
        for source in sources:
            for _ in range(rounds):
                started = time.perf_counter()
                compile_topic_filter(source, topic_set)
                spent.append(time.perf_counter() - started)
        return statistics.mean(spent)
    workers = [threading.Thread(target=run) for _ in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return (time.perf_counter() - started) / (threads * rounds * len(sources))


def _kept_bytes(topics: int) -> int:
    topic_set = _fill(TopicSet(), topics)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    topic_set.xpath_document()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    cached = _fill(TopicSet(), args.topics)
    uncached = _fill(_Uncached(), args.topics)
    paths: dict[str, Callable[[], float]] = {
        "uncached": lambda: _per_compile(uncached, args.rounds, args.threads),
        "cached": lambda: _per_compile(cached, args.rounds * 20, args.threads),
    }
    spent = {name: measure() for name, measure in paths.items()}
    print(
        f"{args.topics:,} topics, {len(EXPRESSIONS)} XPath expressions, {args.threads} "
        f"thread(s): uncached {spent['uncached'] * 1000:.1f} ms | cached "
        f"{spent['cached'] * 1000:.3f} ms per compile | ratio "
        f"{spent['uncached'] / spent['cached']:.0f}",
        flush=True,
    )
    print(f"kept document (elements and node tree): {_kept_bytes(args.topics) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
