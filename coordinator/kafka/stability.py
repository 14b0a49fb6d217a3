"""When a committed decision is readable: the commits partition's last stable offset.

`commit_transaction` returns once the transaction coordinator logged the commit; the
markers that make the records readable to `read_committed` consumers are written after
that, usually within milliseconds. A broker that restarts in between can lose them:
seen on a one-broker cluster killed and restarted, whose transaction coordinator found
the partition leaderless while re-sending markers, took it for deleted and skipped it.
The records then stay in an open transaction that a later fencing aborts, so a decision
the coordinator took for committed is gone from Kafka.

Nothing the coordinator shows the world may run ahead of what Kafka's readers see, so
publication to `_delta_log` and every reply wait until the partition's last stable
offset (ListOffsets with `read_committed`) is past the decision's record.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)


class StableOffsets:
    """`stable(partition, offset)`: whether `read_committed` readers of the commits topic see that record.

    Asked with a `read_committed` consumer that joins no group and reads nothing: its watermark query
    (ListOffsets) answers the last stable offset, synchronously within `request_timeout_s`, and it
    follows leadership moves and broker restarts itself (librdkafka's admin ListOffsets kept a cached
    leader epoch after a restart and was refused for as long as the client lived).

    Except in one case, seen after a broker's controlled shutdown and restart: the consumer's metadata
    cache kept the topic without the partition, and every query failed with `_UNKNOWN_PARTITION` until
    the entry aged out (15 minutes by default) without asking the broker again. A query failing that
    way, or failing in any way for `REBUILD_AFTER_S`, replaces the consumer, whose fresh cache asks."""

    #: Replace the consumer when queries have failed this long (seconds), and at most this often.
    REBUILD_AFTER_S = 10.0
    #: Failures that mean the metadata cache is stale, not that the broker is away: replace at once.
    STALE_METADATA = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC})

    def __init__(self, client_config: dict[str, Any], topic: str, request_timeout_s: float = 10.0) -> None:
        self.topic = topic
        self.request_timeout_s = request_timeout_s
        self._config = {**client_config, "group.id": f"deltacoord-stable-{topic}", "enable.auto.commit": False,
                        "isolation.level": "read_committed"}
        self._consumer: Consumer | None = Consumer(self._config)
        self._known: dict[int, int] = {}
        self._lock = threading.Lock()
        #: When queries started failing (monotonic), and when the consumer was last replaced.
        self._failing_since: float | None = None
        self._rebuilt_at = 0.0
        #: How many times the consumer was replaced (for tests and the log).
        self.rebuilds = 0

    def __call__(self, partition: int, offset: int) -> bool:
        with self._lock:
            if self._known.get(partition, -1) > offset:
                return True
        lso = self.last_stable_offset(partition)
        with self._lock:
            self._known[partition] = max(self._known.get(partition, -1), lso)
        return lso > offset

    def last_stable_offset(self, partition: int) -> int:
        """Ask the partition's leader; raises KafkaException when it does not answer in time (or after `close`)."""
        with self._lock:  # one query at a time, and never one on a closed consumer
            if self._consumer is None:
                raise KafkaException(KafkaError(KafkaError._DESTROY, "closed"))
            try:
                _low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                                  timeout=self.request_timeout_s, cached=False)
            except KafkaException as e:
                self._after_failure(e)
                raise
            self._failing_since = None
            return int(high)

    def _after_failure(self, e: KafkaException) -> None:
        """Replace the consumer (under the lock) when its metadata looks stale or failures have lasted."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
        stale = err is not None and err.code() in self.STALE_METADATA
        lasting = now - self._failing_since >= self.REBUILD_AFTER_S
        if not (stale or lasting) or now - self._rebuilt_at < (1.0 if stale else self.REBUILD_AFTER_S):
            return
        old, self._consumer = self._consumer, Consumer(self._config)
        self._rebuilt_at = now
        self.rebuilds += 1
        log.info("asking for the last stable offset of %s fails (%s); asking with a new client", self.topic, e)
        if old is not None:
            old.close()

    def close(self) -> None:
        """Free the consumer (a query in flight ends first; later ones raise)."""
        with self._lock:
            c, self._consumer = self._consumer, None
        if c is not None:
            c.close()


__all__ = ["StableOffsets"]
