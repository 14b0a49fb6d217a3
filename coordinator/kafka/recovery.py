"""Reading the commits topic: the source of truth that table states are rebuilt from.

`read_decisions` streams the committed decisions of one commits partition
(read_committed, so aborted transactions are never seen), refusing to stop
short of the high watermark: a partial history would rebuild wrong states.
`rebuild_states` folds them into `TableState`s (event sourcing) and reports,
per table, which versions are ratified but missing from `_delta_log`.
A coordinator reads its partitions once, when it takes them over; an aborted
batch never needs them again (see `coordinator.rules.batch`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from coordinator.rules.state import TableState
from coordinator.settings import CoordinatorSettings
from reader.log import newest_commit_version
from schemas.codec import decode_decision
from schemas.messages import Decision
from schemas.routing import H_TABLE_ID, H_VERSION, header

log = logging.getLogger(__name__)


class RecoveryError(RuntimeError):
    """The commits topic could not be read to its end; state must not be rebuilt from part of it."""


#: Errors a partition-leader election answers with for a while; asking again later is correct.
_LEADER_MOVING = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS,
})


def watermarks(c: Consumer, tp: TopicPartition, budget_s: float = 90.0) -> tuple[int, int]:
    """The partition's low and high offsets, asked again (backing off) while its leader moves, for up to
    `budget_s`: a leader election takes seconds, and recovery must not fail the daemon for it."""
    deadline = time.monotonic() + budget_s
    delay = 0.2
    while True:
        try:
            low, high = c.get_watermark_offsets(tp, timeout=min(30.0, max(1.0, deadline - time.monotonic())))
            return int(low), int(high)
        except KafkaException as e:
            err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
            moving = err is not None and (err.retriable() or err.code() in _LEADER_MOVING)
            if not moving or time.monotonic() + delay > deadline:
                raise
            log.info("offsets of %s[%d] not available yet (%s); asking again", tp.topic, tp.partition, err)
            time.sleep(delay)
            delay = min(delay * 2, 3.0)


def _header(msg: Message, name: str) -> str | None:
    v = header(msg, name)
    return None if v is None else v.decode("utf-8", errors="replace")


def read_decisions(
    settings: CoordinatorSettings, partition: int, *, table_id: str | None = None, min_version: int = 0,
    stall_timeout_s: float = 120.0, on_record: Callable[[], None] | None = None,
) -> Iterator[Decision]:
    """Committed decisions on one commits partition, in order (read_committed), streamed.

    `on_record` is called once per record fetched (filtered out or not), for the
    recovery metric.
    """
    c = Consumer(
        settings.client(
            {"fetch.message.max.bytes": max(settings.max_proposal_bytes * 2, 1_048_576)},
            **{"group.id": f"{settings.group_id}-recovery", "enable.auto.commit": False, "isolation.level": "read_committed",
               "enable.partition.eof": True},
        )
    )
    try:
        tp = TopicPartition(settings.topics.commits, partition)
        low, high = watermarks(c, tp)
        if high <= low:
            return
        c.assign([TopicPartition(settings.topics.commits, partition, low)])
        # Read up to the high watermark, however long the broker takes: a partial
        # history would rebuild wrong table states. Only lack of progress is an error.
        last_progress = last_report = time.monotonic()
        last_pos = low
        at_end = False
        while not at_end:
            msgs = c.consume(1000, 0.2)
            for m in msgs:
                merr = m.error()
                if merr is not None:
                    if merr.code() == KafkaError._PARTITION_EOF:
                        # The fetcher reached the end, control records and aborted batches included.
                        at_end = (m.offset() or 0) >= high
                        continue
                    raise KafkaException(merr)
                if on_record is not None:
                    on_record()
                if table_id is not None and _header(m, H_TABLE_ID) != table_id:
                    continue
                if min_version > 0:
                    v = _header(m, H_VERSION)
                    if v is None or int(v) < min_version:
                        continue
                value = m.value()
                if value is not None:
                    yield decode_decision(value)
            pos = c.position([tp])[0].offset
            if pos >= high:
                break
            if msgs or pos > last_pos:
                last_progress = time.monotonic()
                last_pos = max(last_pos, pos)
            elif time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log.warning("reading %s[%d]: waiting at offset %d of %d", settings.topics.commits, partition, pos, high)
            if not at_end and time.monotonic() - last_progress > stall_timeout_s:
                raise RecoveryError(
                    f"reading {settings.topics.commits}[{partition}] stalled at offset {pos} of {high} for "
                    f"{stall_timeout_s:.0f}s; refusing to continue with a partial history"
                )
    finally:
        c.close()


def rebuild_states(settings: CoordinatorSettings, partition: int, *, publish: Callable[[Decision], None],
                   new_table: Callable[[str], None] = lambda uri: None, heartbeat: Callable[[], None] = lambda: None,
                   on_record: Callable[[], None] | None = None,
                   published_version: Callable[[str], int] = newest_commit_version) -> dict[str, TableState]:
    """Table states as the fold of the partition's committed decisions (event sourcing).

    Ratified versions missing from `_delta_log` (a crash between the Kafka
    commit and publication) go to `publish`, oldest first, as they are read;
    so does the newest version already on disk, which put-if-absent re-checks
    byte for byte. `new_table(table_uri)` runs once per table, first;
    `published_version(table_uri)` is the newest version in its `_delta_log`.
    """
    states: dict[str, TableState] = {}
    on_disk: dict[str, int] = {}
    for i, d in enumerate(read_decisions(settings, partition, on_record=on_record)):
        if i % 1000 == 0:
            heartbeat()  # a long recovery is progress, not a hang
        if not d.committed or d.duplicate_of is not None or d.version is None:
            continue
        st = states.get(d.table_id)
        if st is None:
            st = TableState.empty(d.table_id, d.table_uri)
            states[d.table_id] = st
            on_disk[d.table_id] = published_version(d.table_uri)
            new_table(d.table_uri)
        if d.version != st.version + 1:
            raise RecoveryError(
                f"commits topic is not contiguous for table {d.table_id}: version {d.version} after {st.version}"
            )
        st.apply(d.version, d.actions)
        if d.version >= on_disk[d.table_id]:
            publish(d)
    return states


__all__ = ["RecoveryError", "read_decisions", "rebuild_states"]
