"""When a transaction also commits the proposals offset to the consumer group (AddOffsetsToTxn and
TxnOffsetCommit, two round trips): every transaction that carries no commits-topic record, and a transaction
that does only once the group's offset has lagged the records' for `group_offset_interval_s`. The first batch
after a pause, whose idle flush made the group's offset current, pays neither (every commit after a second's
pause did, a new writer's first among them). The producer and consumer here are stand-ins: what is checked is
which calls one transaction makes, not Kafka."""

from __future__ import annotations

import types
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from deltacoord.coordinator.kafka import batch_transaction
from deltacoord.coordinator.kafka.batch_transaction import BatchTransaction, Out
from deltacoord.coordinator.kafka.partition_health import PartitionProgress
from deltacoord.coordinator.metrics import Metrics
from deltacoord.coordinator.settings import CoordinatorSettings


class _Producer:
    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.commits = 0

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic: str, **kwargs: Any) -> None:
        pass

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], group: object, timeout: float) -> None:
        self.offsets.append(offsets[0].offset)

    def commit_transaction(self, timeout: float) -> None:
        self.commits += 1

    def poll(self, timeout: float) -> int:
        return 0


class _Consumer:
    def committed(self, tps: list[TopicPartition], timeout: float = 0) -> list[TopicPartition]:
        return [TopicPartition(tps[0].topic, tps[0].partition, -1001)]

    def consumer_group_metadata(self) -> object:
        return object()

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return 0, 0

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tps[0].topic, tps[0].partition, 0)]


class _Message:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


def _txn(interval_s: float) -> tuple[BatchTransaction, _Producer]:
    settings = CoordinatorSettings(bootstrap_servers="127.0.0.1:1", group_offset_interval_s=interval_s)
    consumer = _Consumer()
    txn = BatchTransaction(settings, 0, consumer, Metrics(), PartitionProgress(0, 60.0),  # type: ignore[arg-type]
                           on_recorded=lambda delivered: None)
    producer = _Producer()
    txn.producer = producer  # type: ignore[assignment]
    txn.resume_at(0)
    return txn, producer


def _batch(txn: BatchTransaction, offset: int) -> None:
    out = Out(txn.settings.topics.commits, b"decision", b"t", [], 0, offset)
    assert txn.record([_Message(offset)], [out])  # type: ignore[list-item]
    txn.committed([_Message(offset)])  # type: ignore[list-item]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(batch_transaction, "time", types.SimpleNamespace(monotonic=c.monotonic, time=lambda: c.now,
                                                                          sleep=lambda s: None))
    return c


def test_the_first_batch_after_an_idle_flush_carries_no_group_offset(clock: _Clock) -> None:
    txn, producer = _txn(interval_s=1.0)
    _batch(txn, 0)
    clock.now += 0.5
    _batch(txn, 1)
    assert producer.offsets == [], "within a second of lag, the records alone carry the offset"
    txn.flush_offsets()  # idle: the group's offset catches up in a transaction of its own
    assert producer.offsets == [2]
    clock.now += 5.0  # a pause; then a new writer's first commit
    _batch(txn, 2)
    assert producer.offsets == [2], "the group's offset was current: the next batch starts the lag clock"
    clock.now += 1.5  # busy for longer than the interval
    _batch(txn, 3)
    assert producer.offsets == [2, 4]
    _batch(txn, 4)
    assert producer.offsets == [2, 4]
    assert producer.commits == 6


def test_interval_zero_commits_the_group_offset_in_every_transaction(clock: _Clock) -> None:
    txn, producer = _txn(interval_s=0.0)
    for offset in range(3):
        _batch(txn, offset)
    assert producer.offsets == [1, 2, 3]
