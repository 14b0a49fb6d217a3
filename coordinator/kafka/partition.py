"""The coordinator's consume-decide-produce loop for one proposals partition.

Per batch: decode the proposals (read_committed) -> `decide_batch` (pure: the
decisions plus an overlay of the batch's tentative commits; group commit, so
later proposals see earlier acceptances of the same batch) -> ONE Kafka
transaction holding the decisions, any dead letters and the consumed offsets
-> once it commits, apply the overlay to the table states and hand the
ratified versions to the publisher. If the transaction aborts, the overlay is
dropped and the batch consumed again: the states never held it, so nothing is
re-read from the commits topic.

The transactional id is fixed per partition, so a newer coordinator for the
partition fences this one; a fenced coordinator stops without publishing
anything. An exception from the decision path is a bug: it propagates with
the batch undecided and uncommitted, and the daemon stops.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from coordinator.delta_log.files import sweep_temp_files
from coordinator.delta_log.publisher import Publisher, PublishTask
from coordinator.faults import fault_point
from coordinator.kafka.recovery import rebuild_states
from coordinator.locations import TableLocationError
from coordinator.metrics import Metrics
from coordinator.rules.batch import Submitted, decide_batch, rejection
from coordinator.rules.state import TableState
from coordinator.settings import CoordinatorSettings
from reader.log import newest_commit_version
from reader.storage import StorageError
from schemas.codec import decode_proposal, encode_decision
from schemas.errors import DecodeError, InvalidProposalError
from schemas.messages import Decision
from schemas.reasons import ReasonCode
from schemas.routing import H_ERROR, H_OUTCOME, H_PROPOSAL_ID, H_SOURCE, H_TABLE_ID, H_VERSION, header

log = logging.getLogger(__name__)


class FencedError(RuntimeError):
    """A newer coordinator owns this partition; this one must stop."""


def _header(msg: Message, name: str) -> str | None:
    v = header(msg, name)
    return None if v is None else v.decode("utf-8", errors="replace")


def decision_headers(d: Decision) -> list[tuple[str, str | bytes | None]]:
    h: list[tuple[str, str | bytes | None]] = [(H_PROPOSAL_ID, d.proposal_id.encode()), (H_TABLE_ID, d.table_id.encode()), (H_OUTCOME, d.outcome.value.encode())]
    if d.committed and d.version is not None:
        h.append((H_VERSION, str(d.version).encode()))
    return h


@dataclass
class _DeadLetter:
    raw: bytes | None
    key: bytes | None
    error: str
    source: str


@dataclass
class _Decoded:
    """One consumed message: a proposal to decide, or a rejection and/or a dead letter."""

    submitted: Submitted | None = None
    rejected: Decision | None = None
    dead: _DeadLetter | None = None


def make_consumer(settings: CoordinatorSettings) -> Consumer:
    """The proposals consumer: read_committed, offsets only ever committed inside transactions."""
    s = settings
    return Consumer(
        s.client(
            {
                "fetch.wait.max.ms": 100,
                "fetch.message.max.bytes": max(s.max_proposal_bytes * 2, 1_048_576),
                # A dead coordinator's partitions move after this long (group mode).
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 1_000,
                "partition.assignment.strategy": "range",
            },
            **{
                "group.id": s.group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            },
        )
    )


class PartitionCoordinator:
    """Owns one proposals partition: its table states and its transactional producer.

    The consumer is shared by every partition of the process; this object only
    ever handles messages of its own partition.
    """

    def __init__(self, settings: CoordinatorSettings, partition: int, publisher: Publisher, metrics: Metrics,
                 consumer: Consumer, heartbeat: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self._heartbeat = heartbeat or (lambda: None)
        self.partition = partition
        self.publisher = publisher
        self.metrics = metrics
        self.consumer = consumer
        self.states: dict[str, TableState] = {}
        self.producer: Producer | None = None
        self._label = str(partition)
        self._tp = TopicPartition(settings.topics.proposals, partition)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> int:
        """Fence older owners, rebuild state from the commits topic, publish what is missing.

        Returns the proposals offset to resume from (the last transactionally committed one).
        """
        s = self.settings
        self.producer = Producer(
            s.client(
                # The broker writes a transaction's markers after EndTxn returns; the next
                # transaction's AddOffsetsToTxn is answered CONCURRENT_TRANSACTIONS until then.
                # librdkafka's default 100 ms retry backoff made that ~100 ms per batch.
                {"linger.ms": 0, "retry.backoff.ms": 2, "retry.backoff.max.ms": 10,
                 "transaction.timeout.ms": s.transaction_timeout_ms},
                **{
                    "transactional.id": s.transactional_id(self.partition),
                    "message.max.bytes": max(s.max_proposal_bytes * 2, 1_000_000),
                },
            )
        )
        # Completes or aborts any transaction a previous owner left open, and fences it.
        log.info("partition %d: fencing the previous owner (init_transactions %s)", self.partition, s.transactional_id(self.partition))
        t0 = time.monotonic()
        self.producer.init_transactions(60)
        log.info("partition %d: transactional producer ready in %.1fs; recovering", self.partition, time.monotonic() - t0)
        self._recover()
        return self.committed_offset()

    def committed_offset(self) -> int:
        committed = _committed_with_retry(self.consumer, self._tp)
        return committed[0].offset if committed and committed[0].offset >= 0 else 0

    def close(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(KafkaException):  # a fenced producer fails every call, flush included
                self.producer.flush(5)
            self.producer = None

    def _recover(self) -> None:
        """Rebuild the partition's table states from the commits topic; publish what `_delta_log` lacks."""
        self.metrics.tables.dec(len(self.states))

        def publish(d: Decision) -> None:
            assert d.version is not None
            self.publisher.submit(PublishTask(d.table_id, d.table_uri, d.version, d.actions))

        locations = self.publisher.locations

        def new_table(table_uri: str) -> None:
            try:
                swept = sweep_temp_files(locations.storage(table_uri))
            except (TableLocationError, ValueError, OSError, StorageError):
                return  # a location the publisher will halt
            if swept:
                log.info("removed %d temp files a killed publisher left in %s", swept, table_uri)

        def published_version(table_uri: str) -> int:
            try:
                return newest_commit_version(locations.storage(table_uri))
            except (TableLocationError, ValueError, OSError, StorageError) as e:
                log.warning("cannot list _delta_log of %s (%s); republishing its history", table_uri, e)
                return -1

        self.states = rebuild_states(self.settings, self.partition, publish=publish, new_table=new_table,
                                     heartbeat=self._heartbeat, on_record=self.metrics.recovery_records.inc,
                                     published_version=published_version)
        self.metrics.tables.inc(len(self.states))
        log.info("partition %d: recovered %d tables from %s", self.partition, len(self.states), self.settings.topics.commits)

    # -- the loop ---------------------------------------------------------------
    def process(self, batch: Sequence[Message]) -> None:
        """Decide one batch of this partition's proposals and commit the decisions with the offsets."""
        assert self.producer is not None
        if not batch:
            return
        decoded = [self._decode(m) for m in batch]
        proposals = [x.submitted for x in decoded if x.submitted is not None]
        decided, overlay = decide_batch(self.states, proposals, int(time.time() * 1000),
                                        halted=self.publisher.halted_tables())
        it = iter(decided)
        decisions: list[Decision] = []
        for x in decoded:
            if x.submitted is not None:
                decisions.append(next(it))
            elif x.rejected is not None:
                decisions.append(x.rejected)
        dead = [x.dead for x in decoded if x.dead is not None]
        fault_point("after_decide")
        try:
            self._transact(batch, decisions, dead)
        except FencedError:
            raise
        except KafkaException as e:
            log.warning("partition %d: transaction failed (%s); dropping the batch's decisions and consuming it again",
                        self.partition, e)
            self._abort_and_rewind(e)
            return
        fault_point("after_kafka_commit")
        overlay.apply_to(self.states)
        self.metrics.tables.inc(len(overlay.created))
        now = time.time()
        for m in batch:
            ts = m.timestamp()[1]
            if ts > 0:
                self.metrics.decision_latency.observe(max(0.0, now - ts / 1000.0))
        self.metrics.batch_size.observe(len(batch))
        self.metrics.proposals.labels(self._label).inc(len(batch))
        for d in decisions:
            if d.committed and d.duplicate_of is None and d.version is not None:
                self.metrics.commits.labels(self._label).inc()
                self.publisher.submit(PublishTask(d.table_id, d.table_uri, d.version, d.actions))
            elif d.committed:
                self.metrics.duplicates.inc()
            elif d.error_type and d.reason_code is None:
                self.metrics.conflicts.labels(d.error_type).inc()
            else:
                self.metrics.rejections.labels(d.reason_code or "UNKNOWN").inc()
        self.metrics.dead_letters.inc(len(dead))
        self.metrics.publish_lag.set(self.publisher.lag())
        self.metrics.halted_tables.set(self.publisher.halted_count())

    def _decode(self, m: Message) -> _Decoded:
        raw = m.value()
        at_ms = max(0, m.timestamp()[1])
        source = f"{m.topic()}/{m.partition()}@{m.offset()}"
        try:
            if raw is None:
                raise DecodeError("empty message (no value)")
            if len(raw) > self.settings.max_proposal_bytes:
                raise InvalidProposalError(
                    ReasonCode.OVERSIZE,
                    f"proposal of {len(raw)} bytes exceeds the limit of {self.settings.max_proposal_bytes} bytes",
                )
            proposal = decode_proposal(raw)
        except (DecodeError, InvalidProposalError) as e:
            dead = _DeadLetter(raw, m.key(), str(e), source)
            hdr_pid, hdr_tid = _header(m, H_PROPOSAL_ID), _header(m, H_TABLE_ID)
            if hdr_pid and hdr_tid:
                # The writer said who it is: tell it, so it does not wait for nothing.
                err = e if isinstance(e, InvalidProposalError) else InvalidProposalError(ReasonCode.UNDECODABLE, str(e))
                return _Decoded(rejected=rejection(hdr_tid, "", hdr_pid, err, None, at_ms or int(time.time() * 1000)),
                                dead=dead)
            return _Decoded(dead=dead)
        # The door: a table location this coordinator may not serve is refused before anything is decided.
        refused = self.publisher.locations.problem(proposal.table_uri)
        if refused is not None:
            log.warning("partition %d: refused proposal %s for table %s: %s %s", self.partition, proposal.proposal_id,
                        proposal.table_id, refused.reason, refused)
            return _Decoded(rejected=rejection(proposal.table_id, proposal.table_uri, proposal.proposal_id, refused, None,
                                               at_ms or int(time.time() * 1000)))
        return _Decoded(submitted=Submitted(proposal, at_ms))

    def _transact(self, batch: Sequence[Message], decisions: Sequence[Decision], dead: Sequence[_DeadLetter]) -> None:
        assert self.producer is not None
        s = self.settings
        try:
            self.producer.begin_transaction()
            for d in decisions:
                self.producer.produce(
                    s.topics.commits, value=encode_decision(d), key=d.table_id.encode(),
                    partition=self.partition, headers=decision_headers(d),
                )
            for dl in dead:
                self.producer.produce(
                    s.topics.dead_letters, value=dl.raw, key=dl.key,
                    headers=[(H_ERROR, dl.error[:4000]), (H_SOURCE, dl.source)],
                )
            last_offset = batch[-1].offset()
            assert last_offset is not None
            offsets = [TopicPartition(s.topics.proposals, self.partition, last_offset + 1)]
            self.producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), 60)
            if fault_point("before_kafka_commit"):
                raise KafkaException(KafkaError(KafkaError._FAIL, "injected fault: the transaction fails before its commit",
                                                txn_requires_abort=True))
            self._commit_with_retry()
        except KafkaException as e:
            kerr = e.args[0]
            if isinstance(kerr, KafkaError) and (kerr.code() == KafkaError._FENCED or kerr.fatal()):
                raise FencedError(f"partition {self.partition}: {kerr}") from e
            raise

    def _commit_with_retry(self) -> None:
        assert self.producer is not None
        while True:
            try:
                self.producer.commit_transaction(60)
                return
            except KafkaException as e:
                kerr = e.args[0]
                if isinstance(kerr, KafkaError) and kerr.retriable() and not kerr.txn_requires_abort():
                    continue
                raise

    def _abort_and_rewind(self, cause: KafkaException) -> None:
        assert self.producer is not None
        try:
            self.producer.abort_transaction(60)
        except KafkaException as e:
            kerr = e.args[0]
            if isinstance(kerr, KafkaError) and kerr.fatal():
                raise FencedError(f"partition {self.partition}: {kerr}") from cause
        # The states never held this batch (its overlay is dropped): consume it again
        # from the last committed offset.
        self.consumer.seek(TopicPartition(self.settings.topics.proposals, self.partition, self.committed_offset()))


def _committed_with_retry(consumer: Consumer, tp: TopicPartition, timeout_s: float = 60.0) -> list[TopicPartition]:
    """The group's committed offset; retried while the group coordinator is still loading."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return list(consumer.committed([tp], timeout=10))
        except KafkaException as e:
            kerr = e.args[0]
            if time.monotonic() > deadline or not (isinstance(kerr, KafkaError) and (kerr.retriable() or kerr.code() in (
                    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE))):
                raise
            time.sleep(0.2)
