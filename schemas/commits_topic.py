"""Reading the commits topic: one reader (a tail, and the scan that bounds it) and one watermark client for
every reader of it.

The writer's lookup of a decision, ratified reads, consistent multi-table reads, recovery and the change
feed all read one partition of the commits topic `read_committed`. They share what is easy to get wrong:

* `watermarks` asks a partition's offsets again while its leadership settles (a failover, a new topic, a
  broker restart), with one list of retried errors (`RETRIED`), for a bounded time.
* `Watermarks` is a consumer that nothing polls, kept for watermark queries: librdkafka answers a query on a
  consumer another thread polls late. After a broker's controlled shutdown and restart, librdkafka once kept
  a topic without its partitions in a consumer's metadata cache and failed every query with
  `_UNKNOWN_PARTITION` until the entry aged out (15 minutes) without asking the broker again; a query failing
  that way (`STALE_METADATA`), or failing in any way for `REBUILD_AFTER_S`, replaces the consumer, whose
  fresh cache asks.
* `CommitsTail` reads committed records from an offset or a time on, as they arrive (the change feed), keeps
  those whose headers match, says when it reached the partition's end, and treats a consumer's error events
  by one policy (`read_on`: read on after passing ones, end the read on those no waiting mends).
* `PartitionScan`, a `CommitsTail`, reads to the partition's end as it was when the scan began (its last
  stable offset), and knows it reached that end by the consumer's position (transaction markers are never
  delivered, so the last record's offset may stay short of it) or by the end-of-partition event.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Self

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.routing import header, partition_for

log = logging.getLogger(__name__)

#: Errors a broker answers while a partition's leadership moves (a failover, a new topic, a restart), or a
#: stale metadata cache answers (`STALE_METADATA`): asking again is correct.
RETRIED = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN, KafkaError._WAIT_COORD, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC,
})
#: Failures that mean a consumer's metadata cache is stale, not that the broker is away.
STALE_METADATA = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC})
#: The longest one watermark query waits for its answer (seconds).
REQUEST_TIMEOUT_S = 10.0


def retriable(err: object) -> bool:
    """Whether a Kafka error (a `KafkaError`, or the `KafkaException` carrying one) is worth asking again."""
    if isinstance(err, KafkaException):
        err = err.args[0] if err.args else None
    return isinstance(err, KafkaError) and not err.fatal() and (err.retriable() or err.code() in RETRIED)


class WatermarkSource(Protocol):
    """What answers watermark queries: a consumer, or a `Watermarks`."""

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]: ...


def watermarks(source: WatermarkSource, tp: TopicPartition, budget_s: float = 30.0) -> tuple[int, int]:
    """The partition's low and high offsets (the high one is the last stable offset for a `read_committed`
    source), asked again with growing pauses while the failure is `retriable`, for up to `budget_s`."""
    deadline = time.monotonic() + budget_s
    delay = 0.05
    while True:
        remaining = deadline - time.monotonic()
        try:
            low, high = source.get_watermark_offsets(tp, timeout=max(1.0, min(REQUEST_TIMEOUT_S, remaining)))
            return int(low), int(high)
        except KafkaException as e:
            if not retriable(e) or time.monotonic() + delay > deadline:
                raise
            log.info("offsets of %s[%d] not available yet (%s); asking again", tp.topic, tp.partition, e.args[0])
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def read_committed(conf: Mapping[str, Any], group: str) -> dict[str, Any]:
    """`conf` for a consumer that reads committed records only, never joins `group` and never commits offsets."""
    return {**conf, "group.id": group, "enable.auto.commit": False, "isolation.level": "read_committed"}


class Watermarks:
    """Watermark queries on a consumer that nothing polls, replaced when its metadata goes stale or its queries
    have failed for `REBUILD_AFTER_S`. Thread-safe: one query at a time."""

    #: Replace the consumer when queries have failed this long (seconds), and at most this often.
    REBUILD_AFTER_S = 10.0
    STALE_METADATA = STALE_METADATA

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self._consumer: Consumer | None = Consumer(self._config)
        self._lock = threading.Lock()
        #: When queries started failing (monotonic), and when the consumer was last replaced.
        self._failing_since: float | None = None
        self._rebuilt_at = 0.0
        #: How many times the consumer was replaced (for tests and the log).
        self.rebuilds = 0

    @property
    def consumer(self) -> Consumer:
        """The current consumer (a tail assigns it once its watermarks are known: nothing replaces it after)."""
        if self._consumer is None:
            raise KafkaException(KafkaError(KafkaError._DESTROY, "closed"))
        return self._consumer

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, int]:
        """One query (no retry: see `offsets`); raises KafkaException when it fails, or after `close`."""
        with self._lock:
            c = self.consumer
            try:
                low, high = c.get_watermark_offsets(partition, timeout=timeout, cached=False)
            except KafkaException as e:
                self._after_failure(e)
                raise
            self._failing_since = None
            return int(low), int(high)

    def offsets(self, tp: TopicPartition, budget_s: float = 30.0) -> tuple[int, int]:
        """The partition's low and high offsets, asked again while they are `retriable` for up to `budget_s`."""
        return watermarks(self, tp, budget_s)

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
        log.info("watermark queries fail (%s); asking with a new client", e)
        if old is not None:
            with contextlib.suppress(KafkaException, RuntimeError):  # closed already, or failed fatally
                old.close()

    def close(self) -> None:
        """Free the consumer (a query in flight ends first; later ones raise)."""
        with self._lock:
            c, self._consumer = self._consumer, None
        if c is not None:
            c.close()


class CommitsTopicNotFoundError(DeltaCoordError):
    """The commits topic does not exist on the brokers a reader was given."""


def commits_partition(c: Consumer, topic: str, table_id: str, where: str, timeout_s: float = 30.0) -> int:
    """The partition of `topic` that holds `table_id`'s decisions (CommitsTopicNotFoundError if the topic is
    missing on `where`, the brokers asked)."""
    md = c.list_topics(topic, timeout=timeout_s)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        raise CommitsTopicNotFoundError(
            f"commits topic {topic} not found on {where}{'' if t is None or t.error is None else f' ({t.error})'}: "
            "is a coordinator running, and are the bootstrap servers and topic prefix the coordinator's?")
    return partition_for(table_id, len(t.partitions))


class ScanIncompleteError(DeltaCoordError):
    """A scan did not reach its end in time (`deadline_s`) or stopped moving for `stall_s`."""

    def __init__(self, message: str, *, position: int, end: int) -> None:
        super().__init__(message)
        self.position = position
        self.end = end


#: Errors a reading consumer reports that no waiting mends: the topic is gone or closed to this reader, or the
#: consumer skipped records (its offset was out of range). A read that met one is not whole.
ENDED = frozenset({
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.OFFSET_OUT_OF_RANGE,
    KafkaError._AUTO_OFFSET_RESET,
})


def read_on(err: KafkaError) -> bool:
    """Whether a reading consumer's error event passes (a connection lost, a leader moving: log it and read on)
    rather than ends the read (fatal, or one of `ENDED`)."""
    return not err.fatal() and err.code() not in ENDED


@dataclass(frozen=True, slots=True)
class Fetched:
    """What one `CommitsTail.poll` read."""

    #: The committed records whose headers match, in offset order.
    records: list[Message]
    #: Records and events the fetch returned, matching or not (0: nothing arrived within the wait).
    count: int
    #: The reader reached the partition's end right after these records (an end-of-partition event).
    at_end: bool


class CommitsTail:
    """The committed records of one partition from a start on, as they arrive: the change feed's reader, and
    (`PartitionScan`) every bounded read of the commits topic.

    The start is `from_offset`, or the first record at or after `since_ms` (ms since the epoch; with no record
    that recent, the partition's end), or the partition's beginning; `low` and `end` are the partition's
    offsets when the tail began (`end` its last stable offset). `poll` returns the records whose headers match
    `headers` (name -> accepted values); `on_record` sees every record before that filter. Errors follow one
    policy (`read_on`). Close it (or use it as a context manager) to free its consumer."""

    def __init__(self, config: Mapping[str, Any], topic: str, partition: int | Callable[[Consumer], int], *,
                 from_offset: int | None = None, since_ms: int | None = None,
                 headers: Mapping[str, Collection[bytes]] | None = None,
                 on_record: Callable[[Message], None] | None = None, budget_s: float = 30.0) -> None:
        """`partition` is a number, or a function of the tail's consumer that finds it (`commits_partition`)."""
        self.headers = dict(headers or {})
        self._on_record = on_record
        self._w = Watermarks({**config, "enable.partition.eof": True})
        try:
            self.tp = TopicPartition(topic, partition if isinstance(partition, int) else partition(self._w.consumer))
            self.low, self.end = self._w.offsets(self.tp, budget_s)
            self.start = self.low if from_offset is None else max(self.low, from_offset)
            if since_ms is not None and since_ms > 0 and self.start < self.end:
                (found,) = self._w.consumer.offsets_for_times([TopicPartition(topic, self.tp.partition, since_ms)],
                                                              timeout=budget_s)
                self.start = self.end if found.offset < 0 else max(self.start, found.offset)
        except BaseException:
            self._w.close()
            raise
        #: The highest offset an end-of-partition event reported (markers included).
        self.eof_at = self.start
        self._assigned = False
        #: Fetched after an end-of-partition event: the next `poll` returns them.
        self._pending: collections.deque[Message] = collections.deque()
        #: An error met after records `poll` returned: the next `poll` raises it.
        self._failed: KafkaException | None = None

    def wanted(self, m: Message) -> bool:
        """Whether a record's headers match the tail's."""
        return all(header(m, name) in accepted for name, accepted in self.headers.items())

    def _in_range(self, offset: int) -> bool:
        """Whether a record at `offset` belongs to the read (a bounded read ends before some)."""
        return True

    @property
    def consumer(self) -> Consumer:
        """The consumer, assigned to the partition at the start on first use."""
        c = self._w.consumer
        if not self._assigned:
            c.assign([TopicPartition(self.tp.topic, self.tp.partition, self.start)])
            self._assigned = True
        return c

    def position(self) -> int:
        """The offset the next fetch reads from (past transaction markers too)."""
        return int(self.consumer.position([self.tp])[0].offset)

    def poll(self, timeout_s: float, max_records: int = 500) -> Fetched:
        """The matching records of one fetch (waiting up to `timeout_s`), up to the partition's end when an
        end-of-partition event is among them (`at_end`; what follows it comes with the next poll). Raises
        KafkaException for an error that ends the read, after the records before it were returned."""
        if self._failed is not None:
            raise self._failed
        c = self.consumer
        if self._pending:
            batch, self._pending = list(self._pending), collections.deque()
        else:
            batch = c.consume(max_records, max(0.0, timeout_s))
        records: list[Message] = []
        for i, m in enumerate(batch):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.eof_at = max(self.eof_at, m.offset() or 0)
                    self._pending.extend(batch[i + 1:])
                    return Fetched(records, i + 1, True)
                if read_on(err):
                    log.info("reading %s[%d]: %s (reading on)", self.tp.topic, self.tp.partition, err)
                    continue
                self._failed = KafkaException(err)
                if not records:
                    raise self._failed
                return Fetched(records, i + 1, False)
            offset = m.offset()
            if offset is None or not self._in_range(offset):
                continue
            if self._on_record is not None:
                self._on_record(m)
            if self.wanted(m):
                records.append(m)
        return Fetched(records, len(batch), False)

    def close(self) -> None:
        self._w.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PartitionScan(CommitsTail):
    """A tail that ends at the end captured when it began, and knows it reached that end by the consumer's
    position (transaction markers are never delivered, so the last record's offset may stay short of it) or
    by the end-of-partition event. Iterate it for the matching records. The end (`end`) may be moved later
    while the scan runs (a reader that must not split a transaction); records after it are not read (nor
    shown to `on_record`). `deadline_s` bounds the whole read, `stall_s` a wait without progress."""

    #: How long one fetch waits for records (seconds).
    POLL_S = 0.1

    def __init__(self, config: Mapping[str, Any], topic: str, partition: int | Callable[[Consumer], int], *,
                 from_offset: int | None = None, since_ms: int | None = None,
                 headers: Mapping[str, Collection[bytes]] | None = None,
                 on_record: Callable[[Message], None] | None = None, budget_s: float = 30.0,
                 deadline_s: float | None = None, stall_s: float | None = None) -> None:
        super().__init__(config, topic, partition, from_offset=from_offset, since_ms=since_ms, headers=headers,
                         on_record=on_record, budget_s=budget_s)
        self.deadline_s = deadline_s
        self.stall_s = stall_s

    def _in_range(self, offset: int) -> bool:
        return offset < self.end  # committed after the scan began, or past a moved end: not this scan's

    def __iter__(self) -> Iterator[Message]:
        if self.start >= self.end:
            return
        began = last_progress = last_report = time.monotonic()
        last_pos = self.start
        while True:
            fetched = self.poll(self.POLL_S)
            yield from fetched.records
            pos = self.position()
            if not self._pending and (pos >= self.end or self.eof_at >= self.end):
                return  # (records fetched after an end-of-partition event come first: the end may have moved)
            now = time.monotonic()
            if fetched.count or pos > last_pos:
                last_progress = now
                last_pos = max(last_pos, pos)
            elif now - last_report > 10:
                last_report = now
                log.warning("reading %s[%d]: waiting at offset %d of %d", self.tp.topic, self.tp.partition, pos,
                            self.end)
            if self.deadline_s is not None and now - began > self.deadline_s:
                raise ScanIncompleteError(
                    f"{self.tp.topic} partition {self.tp.partition} was not read to offset {self.end} within "
                    f"{self.deadline_s:.0f}s (an open transaction holds read_committed readers back)",
                    position=pos, end=self.end)
            if self.stall_s is not None and now - last_progress > self.stall_s:
                raise ScanIncompleteError(
                    f"reading {self.tp.topic}[{self.tp.partition}] stalled at offset {pos} of {self.end} for "
                    f"{self.stall_s:.0f}s; refusing to continue with a partial history", position=pos, end=self.end)


__all__ = ["ENDED", "REQUEST_TIMEOUT_S", "RETRIED", "STALE_METADATA", "CommitsTail", "CommitsTopicNotFoundError",
           "Fetched", "PartitionScan", "ScanIncompleteError", "WatermarkSource", "Watermarks", "commits_partition", "read_committed",
           "read_on", "retriable", "watermarks"]
