"""The cursor engine's peek: the records waiting for a detached cursor, read by a reader of
its own from the cursor's positions up to the head and committed nowhere (see
:mod:`wsnmom.adapters.logbase.engine`)."""

from __future__ import annotations

import time

from wsnmom.core.adapter import AdapterUnavailable

from .backend import LogRecord, RecordsLost
from .cursor import Cursor
from .parts import EngineParts


class Peeking(EngineParts):
    """``peek`` of the cursor engine."""

    def peek(self, cursor: Cursor, count: int, timeout: float = 5.0) -> list[LogRecord]:
        """Up to ``count`` of the records waiting for ``cursor``, read by a reader of its
        own from the cursor's positions up to the head and committed nowhere: the
        cursor, the head and the stored positions stay as they are.  In read order,
        which is offset order within each stream.  A cursor riding on the head has
        nothing waiting (its records are handed out as they arrive): empty.  The
        ``count`` oldest records ``discard`` will skip are left out.  Stops after
        ``timeout`` seconds with what it read."""
        if count <= 0:
            return []
        with self.lock:
            if not self._running:
                raise AdapterUnavailable("the log adapter is not open")
            if cursor.attached or cursor.deleted:
                return []
            start = self._assignment(cursor)
            ends = {s: self._head.get(s, 0) for s in start}
            skip = cursor.skip_oldest
        todo = {s: o for s, o in start.items() if max(o, 0) < ends[s]}
        if not todo:
            return []
        reader = self.backend.reader()
        out: list[LogRecord] = []
        deadline = time.monotonic() + timeout
        try:
            reader.assign(todo)
            while todo and len(out) < count and time.monotonic() < deadline:
                finished = False
                for item in reader.poll(self.batch, self.poll_timeout):
                    stream = item.stream
                    if stream not in todo:
                        continue
                    if isinstance(item, RecordsLost):
                        # retention deleted some (or the log started again): go on after
                        todo[stream] = item.next if item.next >= item.first else ends[stream]
                    else:
                        todo[stream] = item.offset + 1
                        if item.offset < ends[stream] and cursor.wants(item.topic):
                            if skip:
                                skip -= 1
                            elif len(out) < count:
                                out.append(item)
                    if todo[stream] >= ends[stream]:
                        del todo[stream]
                        finished = True
                if finished and todo and len(out) < count:
                    reader.assign(todo)  # stop reading the streams read to their end
        finally:
            reader.close()
        return out
