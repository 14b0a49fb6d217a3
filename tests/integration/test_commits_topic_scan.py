"""The one scan of the commits topic (`deltacoord.schemas.commits_topic.PartitionScan`), against the real broker.

A scan reads committed records only, keeps those whose headers match, ends at the partition's end as it was when
the scan began (past an aborted transaction's markers too), starts from an offset or a time, and says so when it
cannot reach an end that was moved past what readers can see.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from deltacoord.schemas.commits_topic import (
    CommitsTopicNotFoundError,
    PartitionScan,
    ScanIncompleteError,
    commits_partition,
    read_committed,
)
from deltacoord.schemas.routing import H_TABLE_ID, partition_for


def _topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
        f.result(30)


def _producer(bootstrap: str, unique_name: Callable[[str], str]) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("scan-tx")})
    p.init_transactions(30)
    return p


def _transaction(p: Producer, topic: str, records: list[tuple[bytes, bytes]], *, commit: bool = True,
                 timestamp: int = 0) -> None:
    """Produce (table id, value) records in one transaction, committed or aborted."""
    p.begin_transaction()
    for table, value in records:
        p.produce(topic, value=value, partition=0, headers=[(H_TABLE_ID, table)], timestamp=timestamp)
    p.flush(30)
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)


def _conf(bootstrap: str) -> dict[str, object]:
    return read_committed({"bootstrap.servers": bootstrap}, "deltacoord-scan-test")


def test_a_scan_reads_one_tables_committed_records_up_to_the_end_it_began_with(
        kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("scan")
    _topic(kafka_bootstrap, topic)
    p = _producer(kafka_bootstrap, unique_name)
    _transaction(p, topic, [(b"A", b"a1"), (b"B", b"b1"), (b"A", b"a2")])
    _transaction(p, topic, [(b"A", b"aborted")], commit=False)
    _transaction(p, topic, [(b"A", b"a3")])
    fetched: list[bytes | None] = []
    with PartitionScan(_conf(kafka_bootstrap), topic, 0, headers={H_TABLE_ID: {b"A"}},
                       on_record=lambda m: fetched.append(m.value()), deadline_s=60) as scan:
        assert scan.low == 0 and scan.end > 4  # three records, an aborted one, and the transaction markers
        _transaction(p, topic, [(b"A", b"a4")])  # committed after the scan began
        assert [m.value() for m in scan] == [b"a1", b"a2", b"a3"]
    assert fetched == [b"a1", b"b1", b"a2", b"a3"], "on_record sees every committed record before the header filter"


def test_a_scan_starts_at_an_offset_or_at_a_time(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("scan")
    _topic(kafka_bootstrap, topic)
    p = _producer(kafka_bootstrap, unique_name)
    now = int(time.time() * 1000)
    for i, age_s in enumerate((30, 20, 10)):
        _transaction(p, topic, [(b"A", f"v{i}".encode())], timestamp=now - age_s * 1000)

    def values(**start: int) -> list[bytes | None]:
        with PartitionScan(_conf(kafka_bootstrap), topic, 0, deadline_s=60, **start) as scan:
            return [m.value() for m in scan]

    assert values() == [b"v0", b"v1", b"v2"]
    assert values(since_ms=now - 25_000) == [b"v1", b"v2"]
    assert values(since_ms=now - 20_000) == [b"v1", b"v2"], "a record exactly as old as since_ms is in"
    assert values(since_ms=now + 60_000) == [], "no record that recent: nothing"
    with PartitionScan(_conf(kafka_bootstrap), topic, 0, deadline_s=60) as scan:
        second = [m.offset() for m in scan][1]
    assert second is not None and second > 1  # the first transaction's marker lies between
    assert values(from_offset=second) == [b"v1", b"v2"]
    assert values(from_offset=second, since_ms=now - 35_000) == [b"v1", b"v2"], "the later of the two starts"


@pytest.mark.parametrize("limit", ["deadline_s", "stall_s"])
def test_an_end_past_what_readers_see_is_an_error_not_a_partial_answer(
        kafka_bootstrap: str, unique_name: Callable[[str], str], limit: str) -> None:
    topic = unique_name("scan")
    _topic(kafka_bootstrap, topic)
    p = _producer(kafka_bootstrap, unique_name)
    _transaction(p, topic, [(b"A", b"a1")])
    p.begin_transaction()  # open: read_committed readers stop before it
    p.produce(topic, value=b"open", partition=0, headers=[(H_TABLE_ID, b"A")])
    p.flush(30)
    try:
        with PartitionScan(_conf(kafka_bootstrap), topic, 0, **{limit: 1.0}) as scan:
            end = scan.end
            assert end == 2, "the end is the last stable offset: the open transaction's record is after it"
            scan.end = end + 1  # as a reader that must not split a transaction moves it
            got: list[bytes | None] = []
            with pytest.raises(ScanIncompleteError) as ei:
                for m in scan:
                    got.append(m.value())
        assert got == [b"a1"]
        assert ei.value.end == end + 1 and ei.value.position == end
        assert str(end + 1) in str(ei.value)
    finally:
        p.abort_transaction(30)


def test_the_table_partition_is_found_and_a_missing_topic_named(
        kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("scan")
    _topic(kafka_bootstrap, topic, partitions=3)
    c = Consumer(_conf(kafka_bootstrap))
    try:
        assert commits_partition(c, topic, "s3://bucket/t", kafka_bootstrap) == partition_for("s3://bucket/t", 3)
        missing = unique_name("absent") + ".commits"
        with pytest.raises(CommitsTopicNotFoundError) as ei:
            commits_partition(c, missing, "s3://bucket/t", kafka_bootstrap, timeout_s=60)
        assert missing in str(ei.value) and kafka_bootstrap in str(ei.value) and "topic prefix" in str(ei.value)
    finally:
        c.close()
