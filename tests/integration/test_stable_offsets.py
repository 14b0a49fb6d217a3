"""`StableOffsets` reads what read_committed readers see, from the real broker.

The coordinator publishes and answers a decision only once the commits partition's
last stable offset is past its record (coordinator.kafka.stability): a record of an
open transaction is not stable, a committed one is once its markers are written, an
aborted one never counts as readable but the offsets after the abort do; and the
answer comes back after a broker restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from deltacoord.coordinator.kafka.stability import StableOffsets
from deltacoord.tooling.broker import LocalBroker


def _topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)]).values():
        f.result(30)


def _produced_at(p: Producer, topic: str, value: bytes) -> int:
    offsets: list[int] = []
    p.produce(topic, value=value, partition=0, on_delivery=lambda err, m: offsets.append(-1 if err else m.offset()))
    p.flush(30)
    assert offsets and offsets[0] >= 0, offsets
    return offsets[0]


def _becomes(check: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return False


def test_an_open_transaction_is_not_stable_until_it_commits(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("stable")
    _topic(kafka_bootstrap, topic)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_name("stable-tx")})
    p.init_transactions(30)
    stable = StableOffsets({"bootstrap.servers": kafka_bootstrap}, topic)

    p.begin_transaction()
    first = _produced_at(p, topic, b"decision 1")
    assert not stable(0, first)
    assert stable.last_stable_offset(0) == first  # the open transaction holds the partition back
    p.commit_transaction(30)
    assert _becomes(lambda: stable(0, first)), "a committed transaction's record never became stable"

    p.begin_transaction()
    aborted = _produced_at(p, topic, b"decision 2")
    time.sleep(0.2)
    assert not stable(0, aborted)
    p.abort_transaction(30)
    p.begin_transaction()
    third = _produced_at(p, topic, b"decision 3")
    assert not stable(0, third)
    p.commit_transaction(30)
    assert _becomes(lambda: stable(0, third))
    assert stable.last_stable_offset(0) > third > aborted > first


def _one_committed_record(bootstrap: str, unique_name: Callable[[str], str]) -> tuple[Producer, str, int]:
    """A new topic with one committed transactional record: (its producer, the topic, the record's offset)."""
    topic = unique_name("stable")
    _topic(bootstrap, topic)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("stable-tx")})
    p.init_transactions(30)
    p.begin_transaction()
    at = _produced_at(p, topic, b"x")
    p.commit_transaction(30)
    return p, topic, at


def test_the_answer_is_remembered_for_earlier_offsets(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    _p, topic, at = _one_committed_record(kafka_bootstrap, unique_name)
    stable = StableOffsets({"bootstrap.servers": kafka_bootstrap}, topic)
    assert _becomes(lambda: stable(0, at))
    stable.close()  # no more requests: an earlier offset is answered from memory, a later one fails
    assert stable(0, at - 1 if at > 0 else at)
    with pytest.raises(KafkaException):
        stable(0, at + 100)


def test_the_answer_comes_back_after_a_broker_restart(kafka_bootstrap: str, local_broker: LocalBroker | None,
                                                      unique_name: Callable[[str], str]) -> None:
    """The query follows the restarted broker (librdkafka's admin ListOffsets kept its cached leader epoch and was
    refused with FENCED_LEADER_EPOCH for as long as the client lived: a publication waiting on it waited for ever)."""
    if local_broker is None:
        pytest.fail("this test restarts the broker and needs the local broker fixture (unset KAFKA_BOOTSTRAP_SERVERS "
                    "so the tests start their own)", pytrace=False)
    p, topic, at = _one_committed_record(kafka_bootstrap, unique_name)
    stable = StableOffsets({"bootstrap.servers": kafka_bootstrap}, topic)
    assert _becomes(lambda: stable(0, at))
    local_broker.kill()
    local_broker.start()
    p.begin_transaction()
    after = _produced_at(p, topic, b"y")
    p.commit_transaction(60)

    def answered() -> bool:
        try:
            return stable(0, after)
        except KafkaException:
            return False

    assert _becomes(answered, timeout_s=60), "the last stable offset is never answered again after the restart"
