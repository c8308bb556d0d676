"""What the log machinery offers code outside the adapters (the Spark bridge): the record
type every log reader yields.

:class:`LogRecord` is one record of a stream (its stream, offset and the WS topic the
adapter's mapping gave it; body, headers, media type and timestamp given at once or on
first use).  The Spark bridge's readers (Kafka, RabbitMQ streams, its notification logs)
yield it, so one row builder serves them all.  Everything else in ``adapters.logbase`` is
the cursor engine's inside and may change without notice.
"""

from __future__ import annotations

from .backend import LogRecord, StreamId

__all__ = ["LogRecord", "StreamId"]
