"""A transaction left open on a commits partition, closed before recovery reads the partition.

A broker restarted while it wrote a transaction's markers can skip the partition (seen on a
one-broker cluster: the restarted transaction coordinator found the partition leaderless, took it
for deleted, and logged the transaction complete). The records then stay in an open transaction
that nothing closes: the last stable offset stops there, so `read_committed` readers (recovery,
change feeds, writers looking up a decision) see nothing from it on, and the first transaction
this producer id writes there later commits it, whatever was decided meanwhile.

The decisions of such a transaction were never shown (publication and replies wait until Kafka
shows a decision, `deltacoord.coordinator.kafka.stability`), and the producer that wrote them took them for
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

from deltacoord.coordinator.kafka.stability import StableOffsets
from deltacoord.coordinator.stable_wait import StableWait
from deltacoord.schemas.commits_topic import watermarks
from deltacoord.schemas.errors import CommitsPartitionBlockedError

log = logging.getLogger(__name__)

#: Header of the empty record that closes a transaction left open.
H_SEAL = "deltacoord.seal"
#: How long the partition may show an open transaction after init_transactions before it counts as left open
#: (the markers of the transaction init_transactions completed or aborted follow within milliseconds).
OPEN_AFTER_S = 5.0
#: How long the seal may take to make the partition readable before the coordinator gives up.
SEAL_WAIT_S = 60.0


#: How long the partition's offsets may stay unanswered (a leader moving, a broker restarting) before start fails.
ANSWER_WAIT_S = 120.0


def _end(consumer: Consumer, tp: TopicPartition, deadline: float) -> int:
    """The partition's end as `consumer`'s isolation level sees it, asked again while the brokers cannot answer
    (the commits topic's one retry policy, `watermarks`) until `deadline`."""
    return watermarks(consumer, tp, max(0.0, deadline - time.monotonic()))[1]


def open_transaction(client_config: dict[str, Any], topic: str, partition: int, wait_s: float = OPEN_AFTER_S) -> tuple[int, int] | None:
    """(last stable offset, end offset) of the partition while an open transaction holds it back after `wait_s`;
    None once they meet."""
    tp = TopicPartition(topic, partition)
    conf = {**client_config, "group.id": f"deltacoord-orphans-{topic}", "enable.auto.commit": False}
    committed = Consumer({**conf, "isolation.level": "read_committed"})
    uncommitted = Consumer({**conf, "isolation.level": "read_uncommitted"})
    try:
        deadline = time.monotonic() + wait_s
        answers_by = time.monotonic() + ANSWER_WAIT_S
        while True:
            end = _end(uncommitted, tp, answers_by)
            stable = _end(committed, tp, answers_by)
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
    (which closes an open transaction of the same producer id). Returns its offset; CommitsPartitionBlockedError
    (a RuntimeError) when the partition stays unreadable (the open transaction belongs to another producer id)."""
    offsets: list[int] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is None and msg.offset() is not None:
            offsets.append(msg.offset())

    gives_up = time.monotonic() + wait_s
    while True:
        offsets.clear()
        producer.begin_transaction()
        try:
            producer.produce(topic, value=None, key=None, partition=partition,
                             headers=[(H_SEAL, b"closes a transaction left open")], on_delivery=delivered)
            commit_with_retry(producer)
            break
        except KafkaException as e:
            kerr = e.args[0]
            if not isinstance(kerr, KafkaError) or kerr.fatal() or time.monotonic() >= gives_up:
                raise
            log.warning("the seal's transaction failed (%s); trying again", kerr)
            producer.abort_transaction(60)
            time.sleep(0.5)
    producer.poll(0)
    if not offsets:
        raise KafkaException(KafkaError(KafkaError._FAIL, "the seal record's delivery was not reported"))
    at = offsets[0]
    stable = StableOffsets(client_config, topic)
    try:
        # StableWait keeps asking while the brokers cannot answer (a leader moving, a broker restarting).
        if not StableWait(stable, "the seal").until({partition: at}, give_up=lambda waited: waited >= wait_s):
            try:
                lso: int | str = stable.last_stable_offset(partition)
            except KafkaException:
                lso = "<the last stable offset>"
            raise CommitsPartitionBlockedError(
                f"commits partition {topic}[{partition}] stays unreadable from offset {lso}: a transaction of another "
                f"producer is open there. Abort it (kafka-transactions.sh --bootstrap-server <brokers> abort --topic "
                f"{topic} --partition {partition} --start-offset {lso}), then start the coordinator again")
    finally:
        stable.close()
    return at


def commit_with_retry(producer: Producer) -> None:
    """commit_transaction, called again while it fails with an error that says so (retriable, no abort needed)."""
    while True:
        try:
            producer.commit_transaction(60)
            return
        except KafkaException as e:
            kerr = e.args[0]
            if isinstance(kerr, KafkaError) and kerr.retriable() and not kerr.txn_requires_abort():
                continue
            raise


__all__ = ["H_SEAL", "OPEN_AFTER_S", "SEAL_WAIT_S", "commit_with_retry", "open_transaction", "seal"]
