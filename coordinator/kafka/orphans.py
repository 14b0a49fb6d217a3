"""A transaction left open on a commits partition, closed before recovery reads the partition.

A broker restarted while it wrote a transaction's markers can skip the partition (seen on a
one-broker cluster: the restarted transaction coordinator found the partition leaderless, took it
for deleted, and logged the transaction complete). The records then stay in an open transaction
that nothing closes: the last stable offset stops there, so `read_committed` readers (recovery,
change feeds, writers looking up a decision) see nothing from it on, and the first transaction
this producer id writes there later commits it, whatever was decided meanwhile.

The decisions of such a transaction were never shown (publication and replies wait until Kafka
shows a decision, `coordinator.kafka.stability`), and the producer that wrote them took them for
committed. So a coordinator taking the partition commits them on purpose, before it reads: one
transaction with one empty record (no key, no value, header `deltacoord.seal`; every reader skips
records without a value), whose commit marker closes the open transaction of the same producer id.
Recovery then reads them like any decision, and their proposals, consumed again, are duplicates.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from coordinator.kafka.stability import StableOffsets

log = logging.getLogger(__name__)

#: Header of the empty record that closes a transaction left open.
H_SEAL = "deltacoord.seal"
#: How long the partition may show an open transaction after init_transactions before it counts as left open
#: (the markers of the transaction init_transactions completed or aborted follow within milliseconds).
OPEN_AFTER_S = 5.0
#: How long the seal may take to make the partition readable before the coordinator gives up.
SEAL_WAIT_S = 60.0


def open_transaction(client_config: dict[str, Any], topic: str, partition: int, wait_s: float = OPEN_AFTER_S) -> tuple[int, int] | None:
    """(last stable offset, end offset) of the partition while an open transaction holds it back after `wait_s`;
    None once they meet."""
    tp = TopicPartition(topic, partition)
    conf = {**client_config, "group.id": f"deltacoord-orphans-{topic}", "enable.auto.commit": False}
    committed = Consumer({**conf, "isolation.level": "read_committed"})
    uncommitted = Consumer({**conf, "isolation.level": "read_uncommitted"})
    try:
        deadline = time.monotonic() + wait_s
        while True:
            _low, end = uncommitted.get_watermark_offsets(tp, timeout=30, cached=False)
            _low, stable = committed.get_watermark_offsets(tp, timeout=30, cached=False)
            if stable >= end:
                return None
            if time.monotonic() >= deadline:
                return stable, end
            time.sleep(0.05)
    finally:
        committed.close()
        uncommitted.close()


def seal(producer: Producer, client_config: dict[str, Any], topic: str, partition: int,
         wait_s: float = SEAL_WAIT_S) -> int:
    """Commit one empty record on the partition in a transaction of `producer`, and wait until Kafka shows it
    (which closes an open transaction of the same producer id). Returns its offset; RuntimeError when the
    partition stays unreadable (the open transaction belongs to another producer id)."""
    offsets: list[int] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is None and msg.offset() is not None:
            offsets.append(msg.offset())

    producer.begin_transaction()
    producer.produce(topic, value=None, key=None, partition=partition,
                     headers=[(H_SEAL, b"closes a transaction left open")], on_delivery=delivered)
    producer.commit_transaction(60)
    producer.poll(0)
    if not offsets:
        raise KafkaException(KafkaError(KafkaError._FAIL, "the seal record's delivery was not reported"))
    at = offsets[0]
    stable = StableOffsets(client_config, topic)
    try:
        deadline = time.monotonic() + wait_s
        while not stable(partition, at):
            if time.monotonic() >= deadline:
                lso = stable.last_stable_offset(partition)
                raise RuntimeError(
                    f"commits partition {topic}[{partition}] stays unreadable from offset {lso}: a transaction of another "
                    f"producer is open there. Abort it (kafka-transactions.sh --bootstrap-server <brokers> abort --topic "
                    f"{topic} --partition {partition} --start-offset {lso}), then start the coordinator again")
            time.sleep(0.05)
    finally:
        stable.close()
    return at


__all__ = ["H_SEAL", "OPEN_AFTER_S", "SEAL_WAIT_S", "open_transaction", "seal"]
