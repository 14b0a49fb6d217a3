"""Whether a proposals partition makes progress: what `/healthz` reports of it (`PartitionProgress.stalled`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition


@dataclass
class PartitionProgress:
    """The next proposals offset to commit, when a batch last committed, since when proposals wait, and why the
    last transaction failed."""

    partition: int
    stall_timeout_s: float
    committed_to: int = 0
    last_commit: float = field(default_factory=time.monotonic)
    waiting_since: float | None = None
    last_failure: str | None = None
    #: Transactions failed in a row (the retry backs off with them).
    failures: int = 0

    def committed(self, next_offset: int) -> None:
        """A transaction consumed the proposals up to `next_offset`."""
        self.committed_to = next_offset
        self.last_commit = time.monotonic()
        self.last_failure = None
        self.failures = 0

    def failed(self, why: str) -> None:
        self.last_failure = why
        self.failures += 1

    def observe(self, consumer: Consumer, tp: TopicPartition) -> None:
        """Note whether proposals wait on this partition (the loop calls it; `/healthz` reads the result)."""
        # Local reads (no broker round trip): the end offset from the last fetch, and the position,
        # which moves past transaction markers and aborted records that are never delivered.
        try:
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            position = consumer.position([tp])[0].offset
        except KafkaException:
            high, position = -1, -1
        waiting = self.last_failure is not None or high > max(position, self.committed_to)
        if not waiting:
            self.waiting_since = None
        elif self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def stalled(self, now: float | None = None) -> str | None:
        """Why decisions look stopped here (proposals wait, no batch committed for `stall_timeout_s`), or None."""
        since = self.waiting_since
        if since is None:
            return None
        t = time.monotonic() if now is None else now
        idle = t - max(since, self.last_commit)
        if idle <= self.stall_timeout_s:
            return None
        why = (f"partition {self.partition}: proposals wait from offset {self.committed_to} and no batch was committed "
               f"for {idle:.0f}s")
        return f"{why} (last failure: {self.last_failure})" if self.last_failure else why
