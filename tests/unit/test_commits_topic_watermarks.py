"""The one retry policy for watermark queries (`deltacoord.schemas.commits_topic`).

Every reader of the commits topic asks a partition's offsets through `watermarks`: errors a leadership move or
a stale metadata cache answers are asked again within a budget, others raise at once; a `Watermarks` client
replaces its consumer when the failure says its metadata is stale. (Stand-in consumers: the behaviour under a
real broker restart is the writer fault test's and the three-broker chaos test's.)
"""

from __future__ import annotations

from typing import Any
from unittest.mock import Mock

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

import deltacoord.schemas.commits_topic as commits_topic
from deltacoord.schemas.commits_topic import RETRIED, Watermarks, retriable, watermarks

TP = TopicPartition("t.commits", 0)


def _answers(*answers: object) -> Mock:
    """A consumer whose watermark queries answer `answers` in order (a KafkaError is raised)."""
    side = [KafkaException(a) if isinstance(a, KafkaError) else a for a in answers]
    return Mock(spec=["get_watermark_offsets", "close"], get_watermark_offsets=Mock(side_effect=side))


@pytest.mark.parametrize("code", [
    # what the writer's reply offsets retried
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._WAIT_COORD, KafkaError._UNKNOWN_PARTITION,
    KafkaError.OFFSET_NOT_AVAILABLE,
    # what recovery retried
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS,
    # what StableOffsets replaced its consumer for
    KafkaError._UNKNOWN_TOPIC,
])
def test_every_error_a_copy_retried_is_retried(code: int) -> None:
    assert code in RETRIED
    assert retriable(KafkaError(code)) and retriable(KafkaException(KafkaError(code)))


def test_refusals_and_fatal_errors_are_not_retried() -> None:
    assert not retriable(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert not retriable(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, fatal=True))
    assert not retriable(KafkaException("no KafkaError in it"))
    assert not retriable(None)


def test_a_moving_leader_and_a_new_topic_are_asked_again() -> None:
    c = _answers(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), (3, 9))
    assert watermarks(c, TP, budget_s=30) == (3, 9)
    assert c.get_watermark_offsets.call_count == 3


def test_a_refusal_raises_at_once_and_an_exhausted_budget_raises() -> None:
    denied = _answers(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), (0, 1))
    with pytest.raises(KafkaException):
        watermarks(denied, TP)
    assert denied.get_watermark_offsets.call_count == 1
    never = _answers(*[KafkaError(KafkaError._TRANSPORT)] * 50)
    with pytest.raises(KafkaException):
        watermarks(never, TP, budget_s=0.5)
    assert 1 < never.get_watermark_offsets.call_count < 50


def _consumers(monkeypatch: pytest.MonkeyPatch, *made: Mock) -> list[dict[str, Any]]:
    """`Watermarks` gets its consumers from `made`, in order; the configs it made them with are returned."""
    configs: list[dict[str, Any]] = []
    queue = list(made)

    def make(config: dict[str, Any]) -> Mock:
        configs.append(config)
        return queue.pop(0)

    monkeypatch.setattr(commits_topic, "Consumer", make)
    return configs


def test_stale_metadata_replaces_the_consumer_and_the_new_one_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    stale = _answers(KafkaError(KafkaError._UNKNOWN_PARTITION, "Failed to get watermark offsets"))
    fresh = _answers((0, 42))
    configs = _consumers(monkeypatch, stale, fresh)
    w = Watermarks({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"})
    assert w.offsets(TP, budget_s=30) == (0, 42)
    assert w.rebuilds == 1 and stale.close.called and w.consumer is fresh
    assert configs[0] == configs[1], "the new consumer has the old one's settings"


def test_a_broker_away_for_a_moment_keeps_the_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _answers(KafkaError(KafkaError._TRANSPORT), KafkaError(KafkaError.LEADER_NOT_AVAILABLE), (5, 6))
    _consumers(monkeypatch, c)
    w = Watermarks({"bootstrap.servers": "127.0.0.1:9"})
    assert w.offsets(TP, budget_s=30) == (5, 6)
    assert w.rebuilds == 0 and w._failing_since is None


def test_a_closed_client_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _answers((0, 1))
    _consumers(monkeypatch, c)
    w = Watermarks({"bootstrap.servers": "127.0.0.1:9"})
    w.close()
    assert c.close.called
    with pytest.raises(KafkaException):
        w.get_watermark_offsets(TP)
