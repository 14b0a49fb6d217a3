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

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

log = logging.getLogger(__name__)

#: A failing admin client is replaced at most this often.
RENEW_AFTER_S = 1.0


class StableOffsets:
    """`stable(partition, offset)`: whether `read_committed` readers of the commits topic see that record."""

    def __init__(self, client_config: dict[str, Any], topic: str, request_timeout_s: float = 10.0) -> None:
        self.topic = topic
        self.request_timeout_s = request_timeout_s
        self._config = client_config
        self._admin = AdminClient(client_config)
        self._renewed_at = time.monotonic()
        self._known: dict[int, int] = {}
        self._lock = threading.Lock()

    def __call__(self, partition: int, offset: int) -> bool:
        with self._lock:
            if self._known.get(partition, -1) > offset:
                return True
        lso = self.last_stable_offset(partition)
        with self._lock:
            self._known[partition] = max(self._known.get(partition, -1), lso)
        return lso > offset

    def last_stable_offset(self, partition: int) -> int:
        """Ask the partition's leader (one ListOffsets request); raises KafkaException when it does not answer.

        After a failure the admin client is replaced (at most once a second): librdkafka's admin ListOffsets
        keeps the leader epoch it cached, and after a broker restart it is refused (FENCED_LEADER_EPOCH) for
        as long as that client lives."""
        tp = TopicPartition(self.topic, partition)
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        try:
            futures = self._admin.list_offsets({tp: latest}, isolation_level=IsolationLevel.READ_COMMITTED,
                                               request_timeout=self.request_timeout_s)
            return int(futures[tp].result().offset)
        except KafkaException:
            if time.monotonic() - self._renewed_at >= RENEW_AFTER_S:
                self._admin = AdminClient(self._config)
                self._renewed_at = time.monotonic()
            raise


__all__ = ["StableOffsets"]
