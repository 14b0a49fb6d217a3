"""A coordinator starting while a broker of its cluster dies asks another: a transport failure under
DescribeConfigs or Metadata is retried, not an exit (seen in the cluster history: a leader SIGKILLed while a
coordinator read the dead-letter topic's config)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from deltacoord.coordinator.kafka.topics import describe_topic_config


class _Admin:
    """Answers DescribeConfigs with `errors` first, then with a configuration."""

    def __init__(self, errors: list[int]) -> None:
        self.errors = list(errors)
        self.asked = 0

    def describe_configs(self, resources: list[Any]) -> dict[Any, Future[dict[str, Any]]]:
        self.asked += 1
        f: Future[dict[str, Any]] = Future()
        if self.errors:
            f.set_exception(KafkaException(KafkaError(self.errors.pop(0))))
        else:
            f.set_result({"cleanup.policy": "delete"})
        return {resources[0]: f}


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError.UNKNOWN_TOPIC_OR_PART])
def test_a_broker_dying_under_the_request_is_asked_again(code: int) -> None:
    admin = _Admin([code, code])
    assert describe_topic_config(admin, "p.deadletters") == {"cleanup.policy": "delete"}  # type: ignore[arg-type]
    assert admin.asked == 3


def test_an_error_that_will_not_clear_is_raised_at_once() -> None:
    admin = _Admin([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException):
        describe_topic_config(admin, "p.deadletters")  # type: ignore[arg-type]
    assert admin.asked == 1
