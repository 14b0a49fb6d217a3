"""The broker really supports what the coordinator relies on: Kafka transactions.

A consume-transform-produce round (init, begin, produce, send offsets, commit)
must be visible to a read_committed consumer, and an aborted one must not.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def _create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names])
    for f in futures.values():
        f.result(30)


def _drain(bootstrap: str, topic: str, group: str, isolation: str, expect_at_least: int, timeout_s: float = 120.0) -> list[bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])  # no group join: nothing to wait for on a loaded machine
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    quiet = 0
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                quiet += 1
                # Once enough arrived, two quiet polls in a row show nothing else is visible.
                if len(out) >= expect_at_least and quiet >= 2:
                    break
                continue
            quiet = 0
            if msg.error():
                raise KafkaException(msg.error())
            value = msg.value()
            assert value is not None
            out.append(value)
    finally:
        c.close()
    return out


def test_transactional_consume_transform_produce(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    src, dst = unique_name("txn-src"), unique_name("txn-dst")
    _create_topics(kafka_bootstrap, src, dst)

    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(3):
        plain.produce(src, value=f"in-{i}".encode())
    assert plain.flush(30) == 0

    group = unique_name("txn-group")
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(src, 0, 0)])
    inputs = []
    deadline = time.monotonic() + 120
    while len(inputs) < 3:
        msg = consumer.poll(1.0)
        if msg is None:
            assert time.monotonic() < deadline, f"only {len(inputs)} of 3 input messages arrived within 120 s"
            continue
        assert msg.error() is None
        inputs.append(msg)

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_name("txn-id")})
    producer.init_transactions(30)

    # An aborted transaction: invisible to read_committed.
    producer.begin_transaction()
    producer.produce(dst, value=b"aborted")
    assert producer.flush(30) == 0  # on the broker, so the abort has something to hide
    producer.abort_transaction(30)

    producer.begin_transaction()
    for msg in inputs:
        value = msg.value()
        assert value is not None
        producer.produce(dst, value=value.replace(b"in-", b"out-"))
    producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    consumer.close()

    committed = _drain(kafka_bootstrap, dst, unique_name("reader"), "read_committed", expect_at_least=3)
    assert committed == [b"out-0", b"out-1", b"out-2"]

    # read_uncommitted still sees the aborted record: the abort was real.
    uncommitted = _drain(kafka_bootstrap, dst, unique_name("reader"), "read_uncommitted", expect_at_least=4)
    assert b"aborted" in uncommitted

    # The consumed offsets were committed with the transaction.
    check = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False})
    offsets = check.committed([TopicPartition(src, 0)], timeout=30)
    check.close()
    assert offsets[0].offset == 3


def test_second_producer_fences_the_first(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("fence")
    _create_topics(kafka_bootstrap, topic)
    tid = unique_name("fence-id")
    old = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": tid})
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"zombie")

    new = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": tid})
    new.init_transactions(30)

    fenced = False
    try:
        old.commit_transaction(30)
    except KafkaException as e:
        fenced = e.args[0].fatal() or "fenced" in str(e).lower()
    assert fenced, "the older producer committed after a newer one with the same transactional.id initialised"

    new.begin_transaction()
    new.produce(topic, value=b"winner")
    new.commit_transaction(30)
    assert _drain(kafka_bootstrap, topic, unique_name("reader"), "read_committed", expect_at_least=1) == [b"winner"]
