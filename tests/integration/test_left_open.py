"""A transaction left open on the commits partition is closed before recovery reads it.

The case seen in the history runs (a restarted broker skipping a partition's commit markers) cannot
be made on purpose; what can: a producer leaves a transaction open on the commits partition. The
coordinator taking the partition must notice (the last stable offset stays below the end), seal the
partition with an empty record in a transaction of its own, wait until Kafka shows it, and only
then read and decide. Here the open transaction is another producer's, so the seal does not close
it: the coordinator waits until the broker aborts it at its timeout, then serves the table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from deltacoord.coordinator.kafka.orphans import H_SEAL
from deltacoord.schemas.routing import header
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics


@pytest.mark.slow
def test_a_transaction_left_open_is_sealed_before_recovery(kafka_bootstrap: str, tmp_path: Path,
                                                           unique_name: Callable[[str], str],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    with coordinator_thread(kafka_bootstrap, topics):
        t = Table(path, kafka_bootstrap, topics=topics)
        try:
            assert t.create(pa.schema([("id", pa.int64())])).version == 0
        finally:
            t.close()

    # Another producer leaves a transaction open on the commits partition (the broker aborts it after its 10 s
    # timeout, at its next check for timed-out transactions, every 10 s by default).
    rogue = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_name("rogue"),
                      "transaction.timeout.ms": 10_000})
    rogue.init_transactions(30)
    rogue.begin_transaction()
    delivered: list[object] = []
    rogue.produce(topics.commits, value=None, partition=0, on_delivery=lambda err, _m: delivered.append(err))
    rogue.flush(30)
    assert delivered == [None], f"the open transaction's record was not written: {delivered}"

    caplog.set_level(logging.WARNING, logger="deltacoord.coordinator.kafka.batch_transaction")
    started = time.monotonic()
    with coordinator_thread(kafka_bootstrap, topics):
        took = time.monotonic() - started
        assert any("left open" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        t = Table(path, kafka_bootstrap, topics=topics)
        try:
            assert t.append(pa.table({"id": [1]})).version == 1
        finally:
            t.close()
    assert took >= 5, f"ready after {took:.1f}s, before the broker aborted the open transaction"

    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique_name("check"), "enable.auto.commit": False,
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topics.commits, 0, 0)])
        seals, deadline = 0, time.monotonic() + 60
        while time.monotonic() < deadline and not seals:
            for m in c.consume(100, 0.5):
                if m.error() is None and header(m, H_SEAL) is not None:
                    assert m.value() is None and m.key() is None
                    seals += 1
        assert seals == 1, "no committed seal record on the commits partition"
    finally:
        c.close()
