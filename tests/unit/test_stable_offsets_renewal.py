"""`StableOffsets` replaces its consumer when the consumer's metadata goes stale.

After a broker's controlled shutdown and restart, librdkafka once kept the commits topic
without its partition in a consumer's metadata cache and failed every watermark query
with `_UNKNOWN_PARTITION` until the entry aged out (15 minutes): a coordinator waiting on
it never answered a writer again. Seen in a clean-clone run of the writer fault test and
reproduced by hand (1 run in 5); the end-to-end check is that test. Here: the policy.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from deltacoord.coordinator.kafka.stability import StableOffsets


def _failing(code: int) -> KafkaException:
    return KafkaException(KafkaError(code, "Failed to get watermark offsets"))


def test_a_stale_metadata_failure_replaces_the_consumer_at_once_and_at_most_once_a_second() -> None:
    s = StableOffsets({"bootstrap.servers": "127.0.0.1:9"}, "commits")
    try:
        first = s._consumer
        s._after_failure(_failing(KafkaError._UNKNOWN_PARTITION))
        assert s.rebuilds == 1 and s._consumer is not first
        s._after_failure(_failing(KafkaError._UNKNOWN_PARTITION))
        assert s.rebuilds == 1, "replaced twice within a second"
        s._rebuilt_at -= 1.0
        s._after_failure(_failing(KafkaError._UNKNOWN_TOPIC))
        assert s.rebuilds == 2
    finally:
        s.close()


def test_other_failures_replace_it_only_once_they_have_lasted() -> None:
    s = StableOffsets({"bootstrap.servers": "127.0.0.1:9"}, "commits")
    try:
        s._after_failure(_failing(KafkaError._TRANSPORT))
        s._after_failure(_failing(KafkaError._ALL_BROKERS_DOWN))
        assert s.rebuilds == 0, "a broker that is away for a moment is no reason for a new client"
        assert s._failing_since is not None
        s._failing_since -= StableOffsets.REBUILD_AFTER_S
        s._after_failure(_failing(KafkaError._TRANSPORT))
        assert s.rebuilds == 1
        s._after_failure(_failing(KafkaError._TRANSPORT))
        assert s.rebuilds == 1, "replaced again before another REBUILD_AFTER_S"
    finally:
        s.close()

