"""Scenario 7, Spark bridge: notifications per second that Spark reads from Kafka through the
bridge's Python data source (``wsn_kafka``), in a batch query and in a streaming query,
against a plain confluent-kafka consumer reading the same records in the same run.

Everything measured runs on all CPUs the bench may use (``cpus.on_all_cpus``), the plain
consumer as well as Spark: ``local[2]`` means two cores; the broker stays on the load
side's CPU.  The machine is shared: the load averages are in the details, and every
figure is the median of several runs (``RUNS``, ``CONSUMER_RUNS``; every run's figure is
in the details too), and the details give the CPU time per notification of each run
(``cpu_us_per_msg``: this process and everything it started, i.e. the consumer, or the
driver, Spark's JVM and its Python workers; ``broker_cpu_us_per_msg``: the broker), which
the other users of the machine disturb much less than the rates.

Setup (not timed): ``count`` notifications (``WSNMOM_BENCH_SPARK_NOTIFICATIONS``, default
200,000) published the way the gateway publishes them, in Notifies of ten messages, on
four WS topics, i.e. four Kafka topics of one partition (the adapter's default layout);
a ``local[2]`` SparkSession; warm-ups, untimed: one run of each consumer, one full batch
read and one prepared-batches read (the first queries of a session start the Python
workers and pay the JVM's compilation of the hot paths; the first read after publishing
was also slower for the plain consumer).

Measured:
* ``plain_consumer``: one confluent-kafka consumer assigned to every partition from offset
  0, ``consume(1000)`` until it has every record (the baseline: it decodes nothing);
* ``spark_batch``: ``read_notifications(..., streaming=False)`` and an aggregate over the
  payloads (every row decoded, filtered and handed to the JVM), from planning to result;
* ``spark_stream``: the same as a streaming query into Spark's ``noop`` sink with
  ``Trigger.AvailableNow``: the time of its micro-batches (the sum of their
  ``triggerExecution``; the query's start-up is reported apart).

Target: each Spark figure >= 0.5 of the plain consumer.  Reported beside it, without a
target, what bounds the Spark figures on the same machine in the same run:

* ``equal work``: the plain consumer that also turns every record into the bridge's rows
  with the conversion a task of the source runs (``spark_bridge.kafka_rows``), in one
  process: the source's work per record, without Spark;
* ``prepared batches``: Spark reading the same number of rows of the bridge's schema that
  a Python source hands over ready-made (one real batch repeated, four tasks): Spark's
  own work per row, without Kafka and the conversion;
* ``empty batch query``: a batch read that selects nothing (planning, the job): the fixed
  cost every batch query and micro-batch pays, whatever it reads.

Spark's native Kafka connector is not measured: its jar cannot be installed from PyPI (the
bridge detects and uses it when it is on the classpath, see docs/spark.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import cpus, spark_runs
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario

#: runs of every Spark measurement (the median is reported)
RUNS = 3
#: runs of the consumers (a run is short, and the plain consumer's varies most)
CONSUMER_RUNS = 5


def _load() -> list[float]:
    """The machine's load averages (1, 5, 15 minutes)."""
    return [round(x, 2) for x in os.getloadavg()]


def _missing() -> str | None:
    for module in ("pyspark", "pyarrow", "confluent_kafka"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'wsnmom[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (Java 17 or 21)"
    return None


class _Runs:
    """Rates of repeated runs, by name, with the load at each and the CPU time per
    notification: of the reading side (this process and what it started: the consumer, or
    Spark's JVM and Python workers) and of the broker."""

    def __init__(self, count: int, ctx: Context, broker: list[int]) -> None:
        self.count = count
        self.ctx = ctx
        self.broker = frozenset(broker)
        self.rates: dict[str, list[float]] = {}
        self.loads: dict[str, list[float]] = {}
        self.cpu_us: dict[str, list[float]] = {}
        self.broker_cpu_us: dict[str, list[float]] = {}

    def _cpu(self) -> tuple[float | None, float | None]:
        reader = spark_runs.tree_cpu(os.getpid(), self.broker)
        broker = [spark_runs.tree_cpu(pid) for pid in self.broker]
        known = [b for b in broker if b is not None]
        return reader, (sum(known) if broker and len(known) == len(broker) else None)

    def measure(
        self, name: str, run: Callable[[], float], times: int = RUNS, warm_up: bool = False
    ) -> float:
        """Run ``run`` (seconds for ``count`` records) ``times`` times, after one untimed
        run with ``warm_up``; the median rate."""
        if warm_up:
            run()
        for _ in range(times):
            reader, broker = self._cpu()
            self.rates.setdefault(name, []).append(self.count / run())
            self.loads.setdefault(name, []).append(round(os.getloadavg()[0], 2))
            reader_after, broker_after = self._cpu()
            if reader is not None and reader_after is not None:
                spent = (reader_after - reader) / self.count * 1e6
                self.cpu_us.setdefault(name, []).append(round(spent, 2))
            if broker is not None and broker_after is not None:
                spent = (broker_after - broker) / self.count * 1e6
                self.broker_cpu_us.setdefault(name, []).append(round(spent, 2))
        rate = statistics.median(self.rates[name])
        cpu = self.cpu_us.get(name)
        note = f", CPU {statistics.median(cpu):.1f} µs/msg" if cpu else ""
        self.ctx.log(f"  {name}: {rate:,.0f} msg/s (runs: {self._listed(name)}){note}")
        return rate

    def _listed(self, name: str) -> str:
        return ", ".join(f"{r:,.0f}" for r in self.rates[name])


class SparkBridge(Scenario):
    """Spark reads from Kafka through the bridge vs a plain consumer."""

    name = "spark"
    title = "Spark bridge: notifications/s read from Kafka vs a plain consumer"
    middlewares = ("kafka",)
    needs_server = False

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        missing = _missing()
        if missing is not None:
            result.status = "not_available"
            result.reason = missing
            return
        assert mw is not None
        bootstrap = getattr(mw, "bootstrap", None)
        if not bootstrap:
            raise RuntimeError("the Kafka middleware has no bootstrap address")
        count = int(os.environ.get("WSNMOM_BENCH_SPARK_NOTIFICATIONS") or ctx.pick(200_000, 20_000))
        url = mw.adapter_url(ctx.workdir / "spark")
        result.details.update(
            {"notifications": count, "kafka_topics": TOPICS_LAYOUT, "cores": 2, "runs": RUNS}
        )
        started = time.perf_counter()
        logs = spark_runs.publish(url, count)
        result.setup["publish_s"] = time.perf_counter() - started
        result.details["load_avg_start"] = _load()
        runs = _Runs(count, ctx, mw.pids())
        with cpus.on_all_cpus():
            figures = self._measure(ctx, runs, bootstrap, url, logs, result)
        result.details["load_avg_end"] = _load()
        result.details["rates"] = {k: [round(r) for r in v] for k, v in runs.rates.items()}
        result.details["load_1min_at_runs"] = runs.loads
        result.details["cpu_us_per_msg"] = runs.cpu_us
        result.details["broker_cpu_us_per_msg"] = runs.broker_cpu_us
        self._report(result, figures)

    def _measure(
        self,
        ctx: Context,
        runs: _Runs,
        bootstrap: str,
        url: str,
        logs: list[str],
        result: ScenarioResult,
    ) -> dict[str, float]:
        count = runs.count
        consume = spark_runs.consume
        figures = {
            "plain": runs.measure(
                "plain consumer",
                lambda: consume(bootstrap, logs, count)[0],
                CONSUMER_RUNS,
                warm_up=True,
            ),
            "equal": runs.measure(
                "equal work, one process",
                lambda: consume(bootstrap, logs, count, url)[0],
                CONSUMER_RUNS,
                warm_up=True,
            ),
        }
        # one real batch of the source's rows, for the prepared-batches run
        _, sample = consume(bootstrap, logs, min(count, 4096 * spark_runs.TOPICS), url)

        started = time.perf_counter()
        from wsnmom.spark_bridge import kafka, local_session

        spark = local_session("wsnmom-bench", cores=2)
        spark.sparkContext.setLogLevel("ERROR")
        result.setup["session_s"] = time.perf_counter() - started
        try:
            source = kafka(url, alias="bench")
            started = time.perf_counter()
            self._batch(spark, source, count)
            spark_runs.prepared_query(spark, sample, count)
            result.setup["warm_up_s"] = time.perf_counter() - started
            empty = [spark_runs.batch_query(spark, source, "p:none")[0] for _ in range(RUNS)]
            result.details["empty_batch_query_s"] = round(statistics.median(empty), 3)
            figures["batch"] = runs.measure(
                "Spark batch", lambda: self._batch(spark, source, count)
            )
            walls: list[float] = []
            figures["stream"] = runs.measure(
                "Spark streaming", lambda: self._stream(spark, source, count, ctx, walls)
            )
            result.details["stream_wall_s"] = [round(w, 2) for w in walls]
            figures["prepared"] = runs.measure(
                "Spark, prepared batches",
                lambda: spark_runs.prepared_query(spark, sample, count),
            )
        finally:
            spark.stop()
        return figures

    @staticmethod
    def _batch(spark: Any, source: Any, count: int) -> float:
        seconds, rows = spark_runs.batch_query(spark, source)
        if rows != count:
            raise RuntimeError(f"the batch query read {rows} of {count} notifications")
        return seconds

    @staticmethod
    def _stream(spark: Any, source: Any, count: int, ctx: Context, walls: list[float]) -> float:
        seconds, wall, rows = spark_runs.stream_query(spark, source, ctx.workdir)
        if rows != count:
            raise RuntimeError(f"the streaming query read {rows} of {count} notifications")
        walls.append(wall)
        return seconds

    @staticmethod
    def _report(result: ScenarioResult, figures: dict[str, float]) -> None:
        plain = figures["plain"]
        for name in ("batch", "stream"):
            value = figures[name]
            result.add(
                Metric(
                    name=f"spark_{name}_msgs_per_s",
                    value=value,
                    unit="msg/s",
                    baseline=plain,
                    baseline_name="plain confluent-kafka consumer",
                    target=Target(">=", 0.5),
                )
            )
            result.add(
                Metric(
                    name=f"spark_{name}_vs_equal_work",
                    value=value,
                    unit="msg/s",
                    baseline=figures["equal"],
                    baseline_name="plain consumer making the same rows, one process",
                )
            )
        for name, baseline in (("equal", "equal_work"), ("prepared", "spark_prepared_batches")):
            result.add(
                Metric(
                    name=f"{baseline}_msgs_per_s",
                    value=figures[name],
                    unit="msg/s",
                    baseline=plain,
                    baseline_name="plain confluent-kafka consumer",
                )
            )


#: the Kafka layout of the published notifications
TOPICS_LAYOUT = f"{spark_runs.TOPICS} topics x 1 partition"
