"""What a start's listing of every subscription costs on a PostgreSQL store, against the
store's call deadline (``core.store_postgres_pool.CALL_TIMEOUT``): ``list_subscriptions``
on a store of N subscriptions (100,000 by default), the store call itself (the query and
its rows, inside the deadline) and the whole listing (the records decoded too), each
round timed with the load average read next to it.

    python -m bench.store_listing [--subscriptions 100000] [--rounds 3]

The subscriptions are written in one COPY (the change log's trigger runs for each); their
documents are those of a Subscribe with a topic expression, a message-content filter,
a reference parameter and a subscription policy.  PostgreSQL: ``WSNMOM_BENCH_POSTGRES_URL``
or a private server (the test suite's fixture code).  Prints the listing's seconds and
their share of the call deadline; nothing here is a timed test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from wsnmom.core.model import EndpointReference, ExpressionSource, Subscription
from wsnmom.core.store_documents import subscription_to_json
from wsnmom.core.store_postgres import PostgresStore
from wsnmom.core.store_postgres_pool import CALL_TIMEOUT, LIST_PAGE

from bench.util import postgres

TOPIC = ExpressionSource(
    "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete",
    "t:plant/line-4/press/temperature",
    {"t": "urn:example:plant"},
)
CONTENT = ExpressionSource(
    "http://www.w3.org/TR/1999/REC-xpath-19991116",
    "boolean(//m:reading[@unit='C'][. > 80])",
    {"m": "urn:example:measurements"},
)


def _subscription(n: int, now: datetime) -> Subscription:
    return Subscription(
        id=f"sub-{n:08d}-5f0c2a9e",
        consumer=EndpointReference(
            f"http://consumer-{n % 500}.example.org:8080/wsn/notify",
            (f"<c:Id xmlns:c='urn:example:consumer'>{n}</c:Id>".encode(),),
        ),
        creation_time=now,
        termination_time=now + timedelta(days=30),
        topic=TOPIC,
        message_content=CONTENT,
        filter_xml=b"<wsnt:Filter xmlns:wsnt='http://docs.oasis-open.org/wsn/b-2'>"
        b"<wsnt:TopicExpression>t:plant/line-4/press/temperature</wsnt:TopicExpression>"
        b"</wsnt:Filter>",
        policy_xml=b"<wsnt:SubscriptionPolicy xmlns:wsnt='http://docs.oasis-open.org/wsn/b-2'/>",
        owner="plant-operator",
    )


def fill(store: PostgresStore, count: int) -> int:
    """Write ``count`` subscriptions in one COPY; the documents' mean size in bytes."""
    from psycopg.types.json import Jsonb

    now = datetime.now(UTC)
    size = 0
    with (
        store.transaction(None) as conn,
        conn.cursor() as cur,
        cur.copy("COPY subscriptions (id, termination_time, data, revision) FROM STDIN") as copy,
    ):
        for n in range(count):
            sub = _subscription(n, now)
            doc = subscription_to_json(sub)
            size += len(str(doc))
            copy.write_row((sub.id, sub.termination_time, Jsonb(doc), 1))
    return size // max(1, count)


def _load() -> float:
    return os.getloadavg()[0]


def _timing_bounds(store: PostgresStore, into: list[float]) -> None:
    """Record how long each bounded call of ``store`` took (the listing's pages)."""
    bound = store.deadline

    @contextmanager
    def timed(conn: Any, seconds: float) -> Iterator[list[bool]]:
        started = time.perf_counter()
        with bound(conn, seconds) as cut:
            yield cut
        into.append(time.perf_counter() - started)

    store.deadline = timed


def measure(store: PostgresStore, rounds: int) -> dict[str, Any]:
    """Each round: the listing in one call (as before the pages: rows fetched and their
    documents parsed by psycopg inside one deadline), then ``list_subscriptions`` (paged:
    its longest page, and the whole listing with the records decoded); seconds and load
    averages."""
    one_call: list[float] = []
    longest_page: list[float] = []
    whole: list[float] = []
    loads: list[float] = []
    listed = 0
    for _ in range(rounds):
        loads.append(_load())
        started = time.perf_counter()
        with store.statement(None) as conn:  # unbounded: its time, even past the deadline
            rows = conn.execute("SELECT data, revision FROM subscriptions ORDER BY seq").fetchall()
        one_call.append(time.perf_counter() - started)
        del rows
        pages: list[float] = []
        _timing_bounds(store, pages)
        started = time.perf_counter()
        listed = len(store.list_subscriptions())
        whole.append(time.perf_counter() - started)
        del store.deadline
        longest_page.append(max(pages))
        loads.append(_load())
    return {
        "listed": listed,
        "one_call": one_call,
        "longest_page": longest_page,
        "whole": whole,
        "loads": loads,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscriptions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with postgres() as url:
        store = PostgresStore(url, instance_id="bench-listing")
        try:
            started = time.perf_counter()
            size = fill(store, args.subscriptions)
            print(
                f"wrote {args.subscriptions} subscriptions ({size} B documents) in "
                f"{time.perf_counter() - started:.1f} s, load {_load():.1f}"
            )
            result = measure(store, args.rounds)
        finally:
            store.close()
    print(f"listed {result['listed']} subscriptions, {args.rounds} rounds")
    for label, key in (
        ("in one call (before the pages)", "one_call"),
        (f"longest page of {LIST_PAGE} rows", "longest_page"),
        ("whole paged listing, decoded", "whole"),
    ):
        values = result[key]
        print(
            f"{label}: median {statistics.median(values):.2f} s, max {max(values):.2f} s "
            f"= {max(values) / CALL_TIMEOUT:.0%} of the {CALL_TIMEOUT:g} s deadline"
        )
    loads = result["loads"]
    print(f"load average (1 min) around the rounds: {min(loads):.1f}-{max(loads):.1f}")


if __name__ == "__main__":
    main()
