"""`deltacoord.reader.stream.CommitStream` against the real broker and coordinator.

The stream reads decisions from the commits topic, so it sees a version as soon
as it is ratified; `test_sees_a_version_before_it_is_published` holds the
coordinator's publisher back to show that, then checks the published file is
byte for byte the commit the stream delivered. The coordinator-backed tests run
with the table in a local directory and on S3.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from deltacoord.coordinator.delta_log.publisher import PublishTask
from deltacoord.coordinator.kafka.batch_transaction import decision_headers
from deltacoord.reader.stream import (
    CommitEvent,
    CommitStream,
    StreamGapError,
    UnsupportedSourceChangeError,
    normalize_table_id,
)
from deltacoord.schemas.actions import (
    AddFile,
    CommitInfo,
    Metadata,
    Protocol,
    RemoveFile,
    commit_to_json_lines,
    parse_commit,
)
from deltacoord.schemas.codec import encode_decision
from deltacoord.schemas.errors import ClientClosedError, MetadataChangedException
from deltacoord.schemas.messages import Decision, Outcome
from deltacoord.schemas.routing import Topics
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("value", pa.string())])

pytestmark = pytest.mark.kafka


def rows(ids: list[int], date: str) -> pa.Table:
    return pa.table({"id": ids, "date": [date] * len(ids), "value": [f"v{i}" for i in ids]})


def drain(stream: CommitStream, *, until: Callable[[list[CommitEvent]], bool] | None = None,
          timeout_s: float = 120.0) -> tuple[list[CommitEvent], Exception | None]:
    """Poll until `until(events)` holds, an error is raised, or `timeout_s` passes (then until quiet)."""
    events: list[CommitEvent] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = stream.poll(0.5)
        except Exception as e:
            return events, e
        events.extend(got)
        if until is not None and until(events):
            return events, None
        if until is None and not got and events:
            return events, None
    return events, None


def versions(events: list[CommitEvent]) -> list[int]:
    return [e.version for e in events]


def test_reader_started_first_sees_100_concurrent_commits_then_stops_at_add_columns(
        kafka_bootstrap: str, table_place: TablePlace) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = table_place.uri("t")
    opts = table_place.storage_options
    writers, per_writer = 4, 25
    with coordinator_thread(kafka_bootstrap, topics, **table_place.coordinator_settings) as coord:
        # The reader starts before the table exists.
        stream = CommitStream(path, kafka_bootstrap, topics=topics)
        collected: list[CommitEvent] = []
        failure: list[BaseException] = []
        done = threading.Event()

        def read() -> None:
            while not done.is_set():
                try:
                    collected.extend(stream.poll(0.2))
                except BaseException as e:
                    failure.append(e)
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        with Table(path, kafka_bootstrap, topics=topics, storage_options=opts) as creator:
            creator.create(SCHEMA, partition_by=["date"], properties={"deltacoord.coalesce": "false"})  # a version per commit

        def write(w: int) -> None:
            with Table(path, kafka_bootstrap, topics=topics, writer_name=f"w{w}", storage_options=opts) as t:
                for i in range(per_writer):
                    t.append(rows([w * 1000 + i], f"2024-01-0{w + 1}"))

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for th in threads:
            th.start()
        for th in threads:  # 100 commits by 4 fresh writers on an object store: minutes at CI's load
            th.join(600)
        assert not any(th.is_alive() for th in threads), "the writers had not finished after 600 s"
        with Table(path, kafka_bootstrap, topics=topics, storage_options=opts) as t:
            assert t.add_columns([pa.field("x", pa.int64())]).version == 101
            assert t.append(pa.table({"id": [7], "date": ["2024-02-01"], "value": ["z"], "x": [1]})).version == 102
            assert t.append(pa.table({"id": [8], "date": ["2024-02-01"], "value": ["z"], "x": [2]})).version == 103
        deadline = time.monotonic() + 120
        while not failure and reader.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        done.set()
        assert failure, f"the stream did not fail at ADD COLUMNS; it delivered {versions(collected)[-3:]}"
        err = failure[0]
        assert isinstance(err, MetadataChangedException), repr(err)
        assert err.winning_version == 101 and "schema change" in str(err) and "version 101" in str(err)
        # Every earlier version, in order, exactly once; the stream stops at the change.
        assert versions(collected) == list(range(1, 101))
        assert stream.position == 101
        with pytest.raises(MetadataChangedException):  # errors are sticky
            stream.poll(0)
        stream.close()

        assert coord.wait_published(120)
        for e in collected:
            published = table_place.read(path, table_place.commit_key(e.version))
            assert commit_to_json_lines(e.actions) == published
            actions = parse_commit(published)
            info = next(a for a in actions if isinstance(a, CommitInfo))
            assert e.operation == info.operation == "WRITE"
            assert e.timestamp == info.timestamp
            assert [a.path for a in e.added] == [a.path for a in actions if isinstance(a, AddFile) and a.data_change]
            assert len(e.added) == 1 and e.removed == ()

        # A stream restarted at the change continues with the new schema.
        with CommitStream(str(path), kafka_bootstrap, topics=topics, starting_version=101) as again:
            events, error = drain(again, until=lambda ev: len(ev) >= 2)
            assert error is None
            assert versions(events) == [102, 103]
            assert again.position == 104


def test_optimize_deletes_options_and_starting_points(kafka_bootstrap: str, table_place: TablePlace) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = table_place.uri("t")
    with coordinator_thread(kafka_bootstrap, topics, **table_place.coordinator_settings) as coord, \
            Table(path, kafka_bootstrap, topics=topics, storage_options=table_place.storage_options) as t:
        t.create(SCHEMA, partition_by=["date"])                          # 0
        t.append(rows([1, 2], "A"))                                      # 1
        t.append(rows([3], "B"))                                         # 2
        t.append(rows([4], "A"))                                         # 3
        assert t.optimize().version == 4                                 # 4: dataChange=false
        t.append(rows([5], "C"))                                         # 5
        assert t.delete("date = 'B'").version == 6                       # 6: only removes
        t.append(rows([6], "D"))                                         # 7
        assert t.delete("id = 1").version == 8                           # 8: remove + add (a change)
        t.append(rows([7], "E"))                                         # 9
        assert t.append(pa.table({"id": [8, 9, 10], "date": ["X", "Y", "Z"], "value": ["a", "b", "c"]})).version == 10
        assert t.set_properties({"owner": "me"}).version == 11           # property-only metaData
        t.append(rows([11], "F"))                                        # 12
        assert coord.wait_published(30)

        def stream(**kw: Any) -> CommitStream:
            return CommitStream(path, kafka_bootstrap, topics=topics, **kw)

        def until(v: int) -> Callable[[list[CommitEvent]], bool]:
            return lambda ev: bool(ev) and ev[-1].version >= v

        # Every version, as a commit log.
        with stream(include_all_commits=True) as s:
            log_events, error = drain(s, until=until(12))
        assert error is None and versions(log_events) == list(range(13))
        ts = {e.version: e.timestamp for e in log_events}
        opt = log_events[4]
        assert opt.operation == "OPTIMIZE" and not opt.data_change

        # Default: OPTIMIZE is not an event; the DELETE fails the stream after v5 was delivered.
        with stream() as s:
            events, error = drain(s)
            assert versions(events) == [1, 2, 3, 5]
            assert isinstance(error, UnsupportedSourceChangeError)
            assert error.error_class == "DELTA_SOURCE_IGNORE_DELETE" and error.version == 6
            assert "Detected deleted data" in str(error) and "ignoreDeletes" in str(error)
            assert s.position == 6
        assert [a.path for a in events[0].added] == [a.path for a in parse_commit(table_place.read(path, table_place.commit_key(1)))
                                                     if isinstance(a, AddFile)]

        # skip_change_commits: both DELETEs are skipped; the property change does not fail the stream.
        with stream(skip_change_commits=True) as s:
            events, error = drain(s, until=until(12))
            assert error is None and versions(events) == [1, 2, 3, 5, 7, 9, 10, 12]
            assert s.position == 13

        # ignore_deletes: the only-remove commit passes (with its removed files); a rewrite still fails.
        with stream(ignore_deletes=True) as s:
            events, error = drain(s)
            assert versions(events) == [1, 2, 3, 5, 6, 7]
            deleted = events[4]
            assert deleted.added == () and len(deleted.removed) == 1 and all(isinstance(r, RemoveFile) for r in deleted.removed)
            assert deleted.operation == "DELETE"
            assert isinstance(error, UnsupportedSourceChangeError)
            assert error.error_class == "DELTA_SOURCE_TABLE_IGNORE_CHANGES" and error.version == 8
            assert "skipChangeCommits" in str(error)

        # starting_version (inclusive).
        with stream(starting_version=5, skip_change_commits=True) as s:
            events, error = drain(s, until=until(12))
            assert error is None and versions(events) == [5, 7, 9, 10, 12]

        # starting_timestamp: the earliest commit whose timestamp is >= the given one.
        target = ts[7]
        first = min(v for v, t_ in ts.items() if t_ >= target)
        with stream(starting_timestamp=target, skip_change_commits=True) as s:
            events, error = drain(s, until=until(12))
            assert error is None
            assert versions(events) == [v for v in [1, 2, 3, 5, 7, 9, 10, 12] if v >= first]
        with pytest.raises(ValueError, match="not both"):
            stream(starting_version=1, starting_timestamp=target)

        # Batches of whole commits: at most 2 files, except a bigger commit alone.
        with stream(skip_change_commits=True, max_files_per_batch=2) as s:
            batches: list[list[CommitEvent]] = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and sum(map(len, batches)) < 8:
                b = s.poll_batch(0.5)
                if b:
                    batches.append(b)
        flat = [e for b in batches for e in b]
        assert versions(flat) == [1, 2, 3, 5, 7, 9, 10, 12]
        for b in batches:
            assert len(b) == 1 or sum(e.num_files for e in b) <= 2
        assert [b for b in batches if any(e.version == 10 for e in b)] == [[flat[6]]]
        assert flat[6].num_files == 3

        # "latest": nothing that exists now, then what comes next.
        with stream(starting_version="latest") as s:
            events, error = drain(s, timeout_s=1.5)
            assert events == [] and error is None
            assert s.position == 13
            assert t.append(rows([12], "G")).version == 13
            events, error = drain(s, until=until(13))
            assert error is None and versions(events) == [13]


def test_sees_a_version_before_it_is_published(kafka_bootstrap: str, table_place: TablePlace) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = table_place.uri("t")
    with coordinator_thread(kafka_bootstrap, topics, **table_place.coordinator_settings) as coord, \
            Table(path, kafka_bootstrap, topics=topics, storage_options=table_place.storage_options) as t:
        t.create(SCHEMA)
        t.append(rows([1], "A"))
        assert coord.wait_published(30)
        held: list[PublishTask] = []
        submit_all = coord.publisher.submit_all
        coord.publisher.submit_all = held.extend  # type: ignore[method-assign,assignment]
        t.wait = "ratified"  # version 2's publication is held back on purpose
        try:
            assert t.append(rows([2], "A")).version == 2
            with CommitStream(path, kafka_bootstrap, topics=topics, starting_version=2) as s:
                events, error = drain(s, until=lambda ev: bool(ev))
            assert error is None and versions(events) == [2]
            assert not table_place.exists(path, table_place.commit_key(2))
            # Decided but not yet handed to the publisher: its queue is idle, yet version 2 is not out.
            assert coord.publisher.wait_idle(1)
            assert not coord.wait_published(0.5)
        finally:
            coord.publisher.submit_all = submit_all  # type: ignore[method-assign]
            submit_all(held)
        assert coord.wait_published(30)
        assert table_place.read(path, table_place.commit_key(2)) == commit_to_json_lines(events[0].actions)


def _decision(table: str, version: int | None, actions: tuple[Any, ...] = (), *, outcome: Outcome = Outcome.COMMITTED,
              duplicate_of: int | None = None, pid: str = "p") -> Decision:
    return Decision(table_id=table, table_uri=table, proposal_id=f"{pid}{version}", outcome=outcome, version=version,
                    actions=actions, duplicate_of=duplicate_of, error_type=None if outcome is Outcome.COMMITTED else "X")


def test_header_filtering_redeliveries_rejections_and_gaps(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Decisions written straight to a commits topic: what the stream skips and where it stops."""
    topics = fresh_topics(kafka_bootstrap)
    table = normalize_table_id(tmp_path / "t")
    assert normalize_table_id(str(tmp_path / "t")) == normalize_table_id(table) == table
    md = Metadata(id="m", schema_string='{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}')

    def commit(v: int, *extra: Any) -> Decision:
        info = CommitInfo({"timestamp": 1000 + v, "operation": "WRITE"})
        add = AddFile(f"f{v}.parquet", {}, 1, 1, True)
        return _decision(table, v, (info, *extra, add))

    p = Producer({"bootstrap.servers": kafka_bootstrap})

    def send(d: Decision | None, headers: list[tuple[str, Any]] | None = None) -> None:
        value = b"not avro" if d is None else encode_decision(d)
        p.produce(topics.commits, value=value, key=b"k", partition=0, headers=headers if d is None else decision_headers(d))

    send(_decision(table, 0, (CommitInfo({"timestamp": 1, "operation": "CREATE TABLE"}), Protocol(1, 2), md)))
    send(None, [("deltacoord.table_id", b"other"), ("deltacoord.outcome", b"COMMITTED"), ("deltacoord.version", b"0")])
    send(_decision(table, None, outcome=Outcome.REJECTED))
    send(commit(1))
    send(_decision(table, 1, duplicate_of=1, pid="dup"))  # a redelivered proposal: not a new version
    send(commit(1))                                        # the same version again (e.g. re-produced)
    send(commit(2, Protocol(1, 2)))                        # same protocol: not a change
    send(commit(3))
    send(commit(5))                                        # version 4 is missing
    p.flush(10)

    with CommitStream(table, kafka_bootstrap, topics=topics) as s:
        events, error = drain(s)
    assert versions(events) == [1, 2, 3]
    assert [e.timestamp for e in events] == [1001, 1002, 1003]
    assert isinstance(error, StreamGapError) and "not version 4" in str(error)

    # A protocol upgrade is a metadata change; a stream starting on it does not fail.
    table = "orders"  # an explicit table id, not a path
    send(_decision(table, 0, (CommitInfo({"timestamp": 1, "operation": "CREATE TABLE"}), Protocol(1, 2), md)))
    send(commit(1))
    send(commit(2, Protocol(1, 7, writer_features=("appendOnly",))))
    send(commit(3))
    p.flush(10)
    with CommitStream(table, kafka_bootstrap, topics=topics) as s:
        events, error = drain(s)
        assert versions(events) == [1]
        assert isinstance(error, MetadataChangedException) and "protocol change" in str(error)
        assert s.position == 2
    with CommitStream(table, kafka_bootstrap, topics=topics, starting_version=s.position) as s2:
        events, error = drain(s2)
        assert error is None and versions(events) == [2, 3]


def test_rejects_bad_arguments(kafka_bootstrap: str) -> None:
    topics = fresh_topics(kafka_bootstrap)
    with pytest.raises(ValueError):
        CommitStream("t", kafka_bootstrap, topics=topics, starting_version=-1)
    with pytest.raises(ValueError):
        CommitStream("t", kafka_bootstrap, topics=topics, max_files_per_batch=0)
    with pytest.raises(Exception, match="not found"):
        CommitStream("t", kafka_bootstrap, topics=Topics.with_prefix("no-such-prefix-x"))


def test_a_closed_stream_says_so(kafka_bootstrap: str) -> None:
    topics = fresh_topics(kafka_bootstrap)
    stream = CommitStream("t", kafka_bootstrap, topics=topics)
    assert stream.poll(0.5) == []
    stream.close()
    stream.close()  # closing twice is harmless
    for read in (stream.poll, stream.poll_batch):
        with pytest.raises(ClientClosedError, match="the stream is closed") as ei:
            read(0.1)
        assert isinstance(ei.value, RuntimeError), "still the RuntimeError it was before it had a name"
