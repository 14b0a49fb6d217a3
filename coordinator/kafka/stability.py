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

from typing import Any

from confluent_kafka import TopicPartition

from deltacoord.schemas.commits_topic import Watermarks, read_committed


class StableOffsets(Watermarks):
    """`stable(partition, offset)`: whether `read_committed` readers of the commits topic see that record.

    Asked with a `read_committed` consumer that joins no group and reads nothing: its watermark query
    (ListOffsets) answers the last stable offset, synchronously within `request_timeout_s`, and it
    follows leadership moves and broker restarts itself (librdkafka's admin ListOffsets kept a cached
    leader epoch after a restart and was refused for as long as the client lived). A consumer whose
    metadata went stale is replaced (`deltacoord.schemas.commits_topic.Watermarks`). One query per call: the
    publisher asks again on its own schedule."""

    def __init__(self, client_config: dict[str, Any], topic: str, request_timeout_s: float = 10.0) -> None:
        super().__init__(read_committed(client_config, f"deltacoord-stable-{topic}"))
        self.topic = topic
        self.request_timeout_s = request_timeout_s
        self._known: dict[int, int] = {}

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
        return self.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=self.request_timeout_s)[1]


__all__ = ["StableOffsets"]
