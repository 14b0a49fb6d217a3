"""Recovery asks for a partition's offsets again while its leader moves, instead of failing the daemon.

(A stand-in consumer: the behaviour under a real leader kill is the three-broker chaos test's.)
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from deltacoord.coordinator.kafka.recovery import watermarks


class _Answers:
    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        self.calls += 1
        a = self.answers.pop(0)
        if isinstance(a, KafkaError):
            raise KafkaException(a)
        assert isinstance(a, tuple)
        return a


def test_a_moving_leader_is_asked_again() -> None:
    c = _Answers(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), KafkaError(KafkaError.LEADER_NOT_AVAILABLE), (3, 9))
    assert watermarks(c, TopicPartition("t.commits", 0), budget_s=30) == (3, 9)  # type: ignore[arg-type]
    assert c.calls == 3


def test_other_errors_and_an_exhausted_budget_raise() -> None:
    with pytest.raises(KafkaException):
        watermarks(_Answers(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), TopicPartition("t", 0))  # type: ignore[arg-type]
    never = _Answers(*[KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)] * 50)
    with pytest.raises(KafkaException):
        watermarks(never, TopicPartition("t", 0), budget_s=0.5)  # type: ignore[arg-type]
    assert 1 < never.calls < 50
