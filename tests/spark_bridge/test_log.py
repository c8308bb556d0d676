"""The notification log of the buffers (no Spark): appends, dedupe, bounds, trimming."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from wsnmom.spark_bridge.log import Entry, NotificationLog
from wsnmom.topic_mapping.model import Topic

T = Topic("urn:x", ("a", "b"))


def entry(i: int, **kw: object) -> Entry:
    return Entry(native="x/a/b", topic=T, body=f"<m>{i}</m>".encode(), **kw)  # type: ignore[arg-type]


def test_append_numbers_records_in_order_and_reads_ranges(tmp_path: Path) -> None:
    log = NotificationLog(tmp_path / "l.sqlite", name="plant", middleware="mqtt")
    assert log.bounds() == (1, 1)
    seqs = log.append([entry(i) for i in range(5)])
    assert seqs == [1, 2, 3, 4, 5]
    assert log.bounds() == (1, 6)
    got = list(log.read(2, 5))
    assert [r.offset for r in got] == [2, 3, 4]
    assert got[0].body == b"<m>1</m>" and got[0].topic == T and got[0].stream == ("plant", 0)
    reopened = NotificationLog(tmp_path / "l.sqlite", create=False)
    assert (reopened.name, reopened.middleware) == ("plant", "mqtt")


def test_dedupe_key_and_redelivered_digest(tmp_path: Path) -> None:
    log = NotificationLog(tmp_path / "l.sqlite")
    assert log.append([entry(1, dedupe="id-1"), entry(2, digest="d2")]) == [1, 2]
    # the same id again is a duplicate; a redelivered native message with a recent digest too
    again = log.append(
        [entry(1, dedupe="id-1"), entry(2, digest="d2"), entry(3, digest="d2")],
        redelivered=[True, True, False],
    )
    assert again == [None, None, 4]  # an identical message that is *not* a redelivery stays
    assert len(log) == 3


def test_redelivered_digest_only_within_the_window(tmp_path: Path) -> None:
    log = NotificationLog(tmp_path / "l.sqlite")
    log.append([entry(0, digest="old")] + [entry(i) for i in range(1, 6)])
    assert log.append([entry(0, digest="old")], redelivered=[True], window=3) == [7]


def test_trim_and_bounds_after_trim(tmp_path: Path) -> None:
    log = NotificationLog(tmp_path / "l.sqlite")
    log.append([entry(i) for i in range(10)])
    assert log.trim(6) == 5
    assert log.bounds() == (6, 11)
    log.trim(11)
    assert log.bounds() == (11, 11)  # empty, but the sequence goes on
    assert log.append([entry(99)]) == [11]


def test_readers_on_other_threads_see_committed_appends(tmp_path: Path) -> None:
    log = NotificationLog(tmp_path / "l.sqlite")
    log.append([entry(i) for i in range(3)])
    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.extend(r.offset for r in log.read(1, 100)))
    t.start()
    t.join()
    assert seen == [1, 2, 3]


def test_a_log_of_another_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    NotificationLog(path)
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '9' WHERE key = 'format'")
    with pytest.raises(ValueError, match="format 9"):
        NotificationLog(path)
    with pytest.raises(FileNotFoundError):
        NotificationLog(tmp_path / "missing.sqlite", create=False)
