"""Kafka records to rows of the bridge's schema, column by column (Arrow), for both Kafka
readers: ``wsn_kafka`` (messages consumed with confluent-kafka) and Spark's own Kafka
connector (its rows, through ``mapInArrow``).

The rows are the ones ``schema.RowBuilder`` makes of the Kafka adapter's records
(``record_from_message``): the same topic, filter verdict, message id, payload, media type,
headers and timestamp (the tests compare the two).  Records come one Kafka topic partition
at a time, so what is the same for all of them is worked out once per batch: the routing
topic of a per-path Kafka topic, whether it is internal, the topic filter's verdict and the
topic's names.  Values the records of a Notify share (media type, publication time,
producer reference) are decoded once per distinct value.  Per record there remain C-level
steps (the message's fields, a dict of its headers) and Python work only where a record
needs it:

* a record whose topic headers name another topic than its Kafka topic, and every record
  of a per-namespace Kafka topic or of the internal one: its topic from its key and
  headers (once per distinct combination);
* a record without a media type header: the media type sniffed from its body;
* the payload check.  A record that carries the gateway's message id header and an XML
  media type is taken as the gateway wrote it (the gateway publishes only well-formed
  payload elements): its body is its payload, as is.  Any other record is checked as a
  delivery is (``core.codec.xml_payload``: kept when it parses as XML, else wrapped in
  ``wsnmom:NativeMessage``); with ``verify_payloads`` every record is;
* a MessageContent filter, evaluated over each remaining record's payload.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, chain, compress
from operator import itemgetter, methodcaller
from typing import TYPE_CHECKING, Any

from wsnmom.adapters.kafka.public import CONTENT_TYPE_HEADERS, sniff_content_type
from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    HEADER_PRODUCER_REFERENCE,
    HEADER_PUBLISHED_AT,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
)
from wsnmom.core.codec import (
    epr_from_header,
    header_topic,
    is_internal_topic,
    is_xml_type,
    published_at_from_header,
    xml_payload,
)
from wsnmom.core.filters import CompiledFilter
from wsnmom.topic_mapping.model import Topic

from .schema import TopicVerdicts, arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from wsnmom.adapters.kafka.public import KafkaMapping

__all__ = ["KafkaRows", "RawHeaders", "collector_paused"]

#: a record's headers as Kafka clients give them: ``(name, value)`` pairs, or None
RawHeaders = Sequence[tuple[str, bytes | None]] | None

_ABSENT: Any = object()
_NO_HEADERS: tuple[tuple[str, bytes | None], ...] = ()
#: the columns of one topic: namespace, path, Clark notation (None: no topic)
_Names = tuple[str | None, str | None, str | None]
_NO_NAMES: _Names = (None, None, None)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (unless it was off already).

    A task's messages bring millions of short-lived tuples and lists (their headers),
    freed by reference counting; the collector's passes over them, triggered by their
    number alone, cost more than the rest of the conversion (~3 µs per record)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class KafkaRows:
    """Turns the records of one Kafka topic partition at a time into record batches of
    the bridge's schema (see the module docstring); counts what it accepted and dropped."""

    def __init__(
        self,
        source: str,
        mapping: KafkaMapping,
        selection: CompiledFilter,
        *,
        verify_payloads: bool = False,
        include_headers: bool = True,
    ) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        self._pa = pa
        self._pc = pc
        self.source = source
        self.mapping = mapping
        self.filter = selection
        self.verify_payloads = verify_payloads
        self.include_headers = include_headers
        self.schema = arrow_schema()
        self.accepted = 0
        self.dropped = 0
        self._verdicts = TopicVerdicts(selection)
        self._routes: dict[tuple[bytes | None, str | None], Topic] = {}

    # -- input -----------------------------------------------------------------------------
    def from_messages(self, log: str, partition: int, messages: Sequence[Any]) -> pa.RecordBatch:
        """The rows of consumed confluent-kafka ``messages`` (all of ``log``/``partition``,
        none an error), possibly none."""
        from confluent_kafka import Message

        pa = self._pa
        stamps = list(map(Message.timestamp, messages))
        kinds = pa.array(list(map(itemgetter(0), stamps)), pa.int32())
        millis = pa.array(list(map(itemgetter(1), stamps)), pa.int64())
        # timestamp type 0: the record has none
        millis = self._pc.if_else(self._pc.equal(kinds, 0), None, millis)
        # consumed messages always have an offset, and their headers are a list or None
        offsets: Any = list(map(Message.offset, messages))
        headers: Any = list(map(Message.headers, messages))
        return self.convert(
            log,
            partition,
            offsets,
            list(map(Message.key, messages)),
            list(map(Message.value, messages)),
            millis,
            headers,
        )

    # -- conversion ------------------------------------------------------------------------
    def convert(
        self,
        log: str,
        partition: int,
        offsets: Sequence[int],
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        millis: pa.Array | Sequence[int | None],
        headers: Sequence[RawHeaders],
    ) -> pa.RecordBatch:
        """The rows of the records of ``log``/``partition`` given field by field (record
        timestamps in ms since the epoch, None or <= 0 when unknown); possibly none."""
        pa, pc = self._pa, self._pc
        count = len(offsets)
        if count == 0:
            return _empty(self.schema)
        # the adapter's view of the headers: the last value of a name wins
        found: list[dict[str, bytes | None]] = list(map(dict, [h or _NO_HEADERS for h in headers]))
        offsets_array = pa.array(offsets, pa.int64())
        millis_array = millis if isinstance(millis, pa.Array) else pa.array(millis, pa.int64())
        ns = _text(pa, _namespaces(found))
        path = _text(pa, _get(found, HEADER_TOPIC_PATH))

        slots, table = self._topics(log, keys, ns, path)
        keep = [entry[1] for entry in table]
        if not any(keep):
            self.dropped += count
            return _empty(self.schema)
        if not all(keep):
            mask = [keep[slot] for slot in slots]
            selected = pa.array(mask, pa.bool_())
            found = list(compress(found, mask))
            values = list(compress(values, mask))
            slots = list(compress(slots, mask))
            offsets_array = offsets_array.filter(selected)
            millis_array = millis_array.filter(selected)
            self.dropped += count - len(found)
            count = len(found)
        stream = f"{log}/{partition}"

        content_type = self._content_types(found, values)
        headers_column = self._headers(found)
        message_id = _text(pa, _get(found, HEADER_MESSAGE_ID))
        has_id = pc.fill_null(pc.not_equal(message_id, ""), False)
        bodies = pa.array(values, pa.binary()).fill_null(b"")
        payload, payload_bytes = self._payloads(bodies, values, content_type, has_id)

        accepted = self._accepted(payload_bytes, values)

        if not pc.all(has_id).as_py():
            fallback = [f"{self.source}/{stream}/{offset}" for offset in offsets_array.to_pylist()]
            message_id = pc.if_else(has_id, message_id, pa.array(fallback, pa.string()))

        columns = self._topic_columns([entry[0] for entry in table], slots, count)
        arrays = [
            pa.repeat(pa.scalar(self.source, pa.string()), count),
            pa.repeat(pa.scalar("kafka", pa.string()), count),
            pa.repeat(pa.scalar(stream, pa.string()), count),
            offsets_array,
            *columns,
            message_id,
            self._producers(found),
            payload,
            bodies,
            content_type,
            headers_column,
            self._timestamps(found, millis_array),
        ]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        if accepted is not None:
            batch = batch.filter(accepted)
            self.dropped += count - batch.num_rows
        self.accepted += batch.num_rows
        return batch

    def _accepted(
        self, payload_bytes: Sequence[bytes] | None, values: Sequence[bytes | None]
    ) -> pa.Array | None:
        """The rows the MessageContent filter accepts (None: every row, or no filter)."""
        pa = self._pa
        content = self.filter.content
        if content is None:
            return None
        if payload_bytes is None:
            payload_bytes = [v or b"" for v in values]
        verdicts = [content.matches(p) for p in payload_bytes]
        return None if all(verdicts) else pa.array(verdicts, pa.bool_())

    def _topic_columns(
        self, names: Sequence[_Names], slots: Sequence[int], count: int
    ) -> list[pa.Array]:
        """The three topic columns of ``count`` rows: row i has the names of ``slots[i]``."""
        pa = self._pa
        if len(set(slots)) == 1:
            first = names[slots[0]]
            return [pa.repeat(pa.scalar(v, pa.string()), count) for v in first]
        index = pa.array(slots, pa.int32())
        return [pa.array([n[i] for n in names], pa.string()).take(index) for i in range(3)]

    def _topics(
        self,
        log: str,
        keys: Sequence[bytes | None],
        ns: pa.Array,
        path: pa.Array,
    ) -> tuple[list[int], list[tuple[_Names, bool]]]:
        """Per record the index of its entry in a table of ``(names, keep)``: the topic
        the gateway would give it and whether the selection keeps it (internal routing
        never, then the topic filter)."""
        pc = self._pc
        mapping = self.mapping
        count = len(keys)
        table: list[tuple[_Names, bool]] = []
        known: dict[tuple[Topic, str | None, str | None], int] = {}

        def slot(routing: Topic, header_ns: str | None, header_path: str | None) -> int:
            key = (routing, header_ns, header_path)
            found = known.get(key)
            if found is None:
                found = known[key] = len(table)
                table.append(self._verdict(routing, header_ns, header_path))
            return found

        routing = None if mapping.is_shared(log) else mapping.cached_log_topic(log)
        if routing is None and not mapping.is_shared(log):
            first = {
                name: value
                for name, value in (
                    (HEADER_TOPIC_NAMESPACE, ns[0].as_py()),
                    (HEADER_TOPIC_PATH, path[0].as_py()),
                )
                if value is not None
            }
            routing = mapping.log_topic(log, first)
        if routing is not None:
            # a per-path Kafka topic: one routing topic; the headers name it, or another
            named = pc.and_(
                pc.and_(pc.is_valid(ns), pc.is_valid(path)), pc.not_equal(path, "")
            ).fill_null(False)
            other = pc.and_(
                named,
                pc.or_(
                    pc.not_equal(ns, routing.namespace),
                    pc.not_equal(path, "/".join(routing.path)),
                ),
            ).fill_null(False)
            own = slot(routing, None, None)
            if not pc.any(other).as_py():
                return [own] * count, table
            slots = [own] * count
            texts_ns, texts_path = ns.to_pylist(), path.to_pylist()
            for i in pc.indices_nonzero(other).to_pylist():
                slots[i] = slot(routing, texts_ns[i], texts_path[i])
            return slots, table
        # the internal or a per-namespace Kafka topic: each record's key routes it
        texts_ns, texts_path = ns.to_pylist(), path.to_pylist()
        slots = []
        for key, header_ns, header_path in zip(keys, texts_ns, texts_path, strict=True):
            route = self._routes.get((key, header_path))
            if route is None:
                headers = {HEADER_TOPIC_PATH: header_path} if header_path is not None else {}
                route = mapping.record_topic(log, key, headers)
                if len(self._routes) > 10_000:
                    self._routes.clear()
                self._routes[(key, header_path)] = route
            slots.append(slot(route, header_ns, header_path))
        return slots, table

    def _verdict(
        self, routing: Topic, header_ns: str | None, header_path: str | None
    ) -> tuple[_Names, bool]:
        if is_internal_topic(routing):
            return _NO_NAMES, False
        topic = header_topic(header_ns, header_path, routing)
        if topic is None:
            return _NO_NAMES, self.filter.topic is None
        namespace, path, clark, accepted = self._verdicts.of(topic)
        return (namespace, path, clark), accepted

    def _content_types(
        self, found: list[dict[str, bytes | None]], values: Sequence[bytes | None]
    ) -> pa.Array:
        """The media type of each record (its first non-empty media type header, else
        sniffed from the body); the media type headers are taken out of ``found``."""
        pa, pc = self._pa, self._pc
        chosen: Any = None
        for name in CONTENT_TYPE_HEADERS:
            text = _text(pa, list(map(methodcaller("pop", name, None), found)))
            if text.null_count == len(text):
                continue
            text = pc.if_else(pc.equal(text, ""), None, text)
            chosen = text if chosen is None else pc.coalesce(chosen, text)
        if chosen is None:
            return pa.array([sniff_content_type(v or b"") for v in values], pa.string())
        if chosen.null_count:
            listed = chosen.to_pylist()
            for i in pc.indices_nonzero(pc.is_null(chosen)).to_pylist():
                listed[i] = sniff_content_type(values[i] or b"")
            chosen = pa.array(listed, pa.string())
        return chosen

    def _headers(self, found: list[dict[str, bytes | None]]) -> pa.Array:
        """The ``headers`` column (a header without a value maps to the empty string);
        null without ``include_headers``."""
        pa = self._pa
        if not self.include_headers:
            return pa.nulls(len(found), self.schema.field("headers").type)
        names = list(chain.from_iterable(found))
        texts = list(chain.from_iterable(map(dict.values, found)))
        offsets = pa.array(list(accumulate(map(len, found), initial=0)), pa.int32())
        items = _text(pa, texts).fill_null("")
        return pa.MapArray.from_arrays(
            offsets, pa.array(names, pa.string()), items, type=self.schema.field("headers").type
        )

    def _payloads(
        self,
        bodies: pa.Array,
        values: Sequence[bytes | None],
        content_type: pa.Array,
        has_id: pa.Array,
    ) -> tuple[pa.Array, list[bytes] | None]:
        """The ``payload`` column, and the payloads as bytes when some were checked."""
        pa, pc = self._pa, self._pc
        if self.verify_payloads:
            trusted = pa.repeat(pa.scalar(False), len(values))
        else:
            kinds = content_type.dictionary_encode()
            xml = pa.array([is_xml_type(t) for t in kinds.dictionary.to_pylist()], pa.bool_())
            trusted = pc.and_(has_id, xml.take(kinds.indices))
        if pc.all(trusted).as_py():
            return _text(pa, bodies), None
        checked = [v or b"" for v in values]
        types = content_type.to_pylist()
        for i in pc.indices_nonzero(pc.invert(trusted)).to_pylist():
            checked[i] = xml_payload(checked[i], types[i] or "application/xml")
        return _text(pa, checked), checked

    def _producers(self, found: list[dict[str, bytes | None]]) -> pa.Array:
        pa = self._pa
        texts = _text(pa, _get(found, HEADER_PRODUCER_REFERENCE))
        if texts.null_count == len(texts):
            return texts
        kinds = texts.dictionary_encode()
        addresses = []
        for text in kinds.dictionary.to_pylist():
            reference = epr_from_header(text)
            addresses.append(reference.address if reference is not None else None)
        return pa.array(addresses, pa.string()).take(kinds.indices)

    def _timestamps(self, found: list[dict[str, bytes | None]], millis: pa.Array) -> pa.Array:
        """``wsnmom-published-at``, else the record's timestamp."""
        pa, pc = self._pa, self._pc
        kind = self.schema.field("timestamp").type
        known = pc.if_else(pc.greater(millis, 0), millis, None)
        stamps = known.cast(pa.timestamp("ms", tz="UTC")).cast(kind)
        texts = _text(pa, _get(found, HEADER_PUBLISHED_AT))
        if texts.null_count == len(texts):
            return stamps
        kinds = texts.dictionary_encode()
        times = [published_at_from_header(t) for t in kinds.dictionary.to_pylist()]
        published = pa.array(times, kind).take(kinds.indices)
        return pc.coalesce(published, stamps)


def _get(found: list[dict[str, bytes | None]], name: str) -> list[bytes | None]:
    return list(map(methodcaller("get", name), found))


def _namespaces(found: list[dict[str, bytes | None]]) -> list[bytes | None]:
    """The topic namespace header of each record; one without a value counts as empty, as
    in the adapter's headers (the namespace is the only header where that differs from
    no header)."""
    values = list(map(methodcaller("get", HEADER_TOPIC_NAMESPACE, _ABSENT), found))
    if _ABSENT in values or None in values:
        values = [None if v is _ABSENT else (v or b"") for v in values]
    return values


def _text(pa: Any, values: Iterable[bytes | None] | Any) -> Any:
    """UTF-8 text of byte strings (None stays null; invalid sequences replaced, as the
    adapter decodes headers)."""
    array = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    try:
        return array.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array(
            [v.decode("utf-8", "replace") if v is not None else None for v in array.to_pylist()],
            pa.string(),
        )


def _empty(schema: Any) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([], schema=schema)
