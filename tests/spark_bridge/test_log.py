"""The notification log of the buffers (no Spark): appends, dedupe, bounds, trimming."""

from __future__ import annotations

import sqlite3
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
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '9' WHERE key = 'format'")
    with pytest.raises(ValueError, match="format 9"):
        NotificationLog(path)
    with pytest.raises(FileNotFoundError):
        NotificationLog(tmp_path / "missing.sqlite", create=False)


def test_a_reader_opening_a_log_while_it_is_created_sees_it_whole(tmp_path: Path) -> None:
    """A Spark reader (or a test) may open a log the moment its file appears, while the
    buffer is still creating it: the reader must not race the creator's meta (it failed
    with ``UNIQUE constraint failed: meta.key``) nor see the log without its name."""
    failures: list[str] = []
    for i in range(30):
        path = tmp_path / f"l{i}.sqlite"
        start = threading.Barrier(2)

        def create(path: Path = path, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                NotificationLog(path, name="plant", middleware="mqtt").close()
            except Exception as exc:  # every failure is reported below
                failures.append(f"creator {path.name}: {exc!r}")

        writer = threading.Thread(target=create)
        writer.start()
        start.wait()
        while not path.exists():  # open the very moment the file appears
            pass
        try:
            reader = NotificationLog(path, create=False)
        except Exception as exc:
            failures.append(f"reader {path.name}: {exc!r}")
        else:
            if (reader.name, reader.middleware) != ("plant", "mqtt"):
                failures.append(f"reader {path.name}: {reader.name}, {reader.middleware}")
            reader.close()
        writer.join()
    assert failures == []


def test_a_reader_never_writes_to_the_file(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(ValueError, match="not a notification log"):
        NotificationLog(other, create=False)
    with sqlite3.connect(other) as db:  # no schema and no meta were added to it
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]
    with sqlite3.connect(tmp_path / "l.sqlite") as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('format', '9')")
    with pytest.raises(ValueError, match="format 9"):
        NotificationLog(tmp_path / "l.sqlite", create=False)
