"""Benchmark: per-message topic matching cost of ``TopicIndex`` against subscription count.

Builds an index of N mixed subscriptions (Simple, Concrete and Full expressions, parsed
from text like the broker does) for N = 1k, 10k, 100k and measures the mean time of
``TopicIndex.match`` over a fixed sample of published topics.  The topic space grows with N
(more root topics per namespace, the same subtree shape under each root), so the number of
subscriptions matching a message stays roughly constant; a handful of broad subscriptions
(whole namespace, all roots) exist at every size.

Usage::

    python bench/topic_matching.py [--sizes 1000,10000,100000] [--messages 5000]
                                   [--json PATH] [--brute-force]

Prints a table and the ratio cost@largest / cost@smallest (target: <= 5).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from wsnmom.topic_mapping import (
    CONCRETE,
    FULL,
    SIMPLE,
    Topic,
    TopicExpression,
    TopicIndex,
    parse_topic_expression,
)

NAMESPACE_COUNT = 8
BRANCHING = 3
DEPTH = 3  # levels below a root
SUBS_PER_ROOT = 25


@dataclass
class Row:
    """One benchmark result."""

    subscriptions: int
    topics: int
    build_s: float
    match_us: float
    match_us_p95: float
    mean_matches: float
    brute_force_us: float | None = None


def _subtree(prefix: tuple[str, ...], depth: int) -> list[tuple[str, ...]]:
    out = [prefix]
    if depth:
        for i in range(BRANCHING):
            out.extend(_subtree((*prefix, f"c{i}"), depth - 1))
    return out


def build_topics(n_subs: int) -> list[Topic]:
    """A topic forest sized for ``n_subs`` subscriptions."""
    roots_per_ns = max(1, n_subs // (SUBS_PER_ROOT * NAMESPACE_COUNT))
    topics: list[Topic] = []
    for k in range(NAMESPACE_COUNT):
        ns = f"http://example.org/bench/ns{k}"
        for r in range(roots_per_ns):
            topics.extend(Topic(ns, p) for p in _subtree((f"root{r}",), DEPTH))
    return topics


def _prefix_map(topics: list[Topic]) -> dict[str, str]:
    uris = sorted({t.namespace for t in topics})
    return {f"p{i}": uri for i, uri in enumerate(uris)}


def make_subscription(rng: random.Random, topics: list[Topic], prefixes: dict[str, str]) -> str:
    """Expression text (dialect chosen by the caller) for one random subscription."""
    by_uri = {uri: p for p, uri in prefixes.items()}
    t = rng.choice(topics)
    p = by_uri[t.namespace]
    path = "/".join(t.path)
    roll = rng.random()
    if roll < 0.15:
        return f"{p}:{t.root}"  # Simple
    if roll < 0.55:
        return f"{p}:{path}"  # Concrete
    if roll < 0.70:
        return f"{p}:{path}/*"
    if roll < 0.82:
        return f"{p}:{path}//."
    if roll < 0.90:
        return f"{p}:{t.root}//c{rng.randrange(BRANCHING)}"
    if roll < 0.95:
        return f"{p}:{t.root}/*/c{rng.randrange(BRANCHING)}"
    other = rng.choice(topics)
    return f"{p}:{path} | {by_uri[other.namespace]}:{'/'.join(other.path)}"


def build_index(
    n_subs: int, rng: random.Random
) -> tuple[TopicIndex[int], list[Topic], list[TopicExpression]]:
    topics = build_topics(n_subs)
    prefixes = _prefix_map(topics)
    exprs: list[TopicExpression] = []
    # broad subscriptions present at every size
    for i in range(NAMESPACE_COUNT):
        exprs.append(parse_topic_expression(f"p{i}://*", FULL, prefixes))
        exprs.append(parse_topic_expression(f"p{i}:*", FULL, prefixes))
    while len(exprs) < n_subs:
        text = make_subscription(rng, topics, prefixes)
        if "*" in text or "|" in text or "//" in text:
            dialect = FULL
        elif "/" in text:
            dialect = CONCRETE
        else:
            dialect = SIMPLE
        exprs.append(parse_topic_expression(text, dialect, prefixes))
    index: TopicIndex[int] = TopicIndex()
    for key, expr in enumerate(exprs):
        index.add(key, expr)
    return index, topics, exprs


def measure(n_subs: int, messages: int, seed: int, brute_force: bool) -> Row:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    index, topics, exprs = build_index(n_subs, rng)
    build_s = time.perf_counter() - t0
    sample = [rng.choice(topics) for _ in range(messages)]
    # warm-up
    for topic in sample[:200]:
        index.match(topic)
    timings: list[float] = []
    matched = 0
    for topic in sample:
        start = time.perf_counter()
        keys = index.match(topic)
        timings.append(time.perf_counter() - start)
        matched += len(keys)
    timings.sort()
    brute_us: float | None = None
    if brute_force:
        few = sample[:50]
        start = time.perf_counter()
        for topic in few:
            {k for k, e in enumerate(exprs) if e.matches(topic)}
        brute_us = (time.perf_counter() - start) / len(few) * 1e6
    return Row(
        subscriptions=n_subs,
        topics=len(topics),
        build_s=build_s,
        match_us=statistics.fmean(timings) * 1e6,
        match_us_p95=timings[int(len(timings) * 0.95)] * 1e6,
        mean_matches=matched / len(sample),
        brute_force_us=brute_us,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--brute-force", action="store_true", help="also time a linear scan (slow at 100k)"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rows = [measure(n, args.messages, args.seed, args.brute_force) for n in sizes]

    header = (
        f"{'subs':>8} {'topics':>8} {'build s':>8} {'match us':>9} {'p95 us':>8} {'matches':>8}"
    )
    if args.brute_force:
        header += f" {'scan us':>10}"
    print(header)
    for r in rows:
        line = (
            f"{r.subscriptions:>8} {r.topics:>8} {r.build_s:>8.2f} {r.match_us:>9.2f} "
            f"{r.match_us_p95:>8.2f} {r.mean_matches:>8.1f}"
        )
        if r.brute_force_us is not None:
            line += f" {r.brute_force_us:>10.1f}"
        print(line)
    ratio = rows[-1].match_us / rows[0].match_us
    print(
        f"cost ratio {rows[-1].subscriptions} / {rows[0].subscriptions} subscriptions: "
        f"{ratio:.2f} (target <= 5)"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": [asdict(r) for r in rows], "ratio": ratio}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
