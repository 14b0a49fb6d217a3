"""The coordinator's consume-decide-produce loop for one proposals partition.

Per batch: consume proposals (read_committed) -> decide each in order with the
conflict engine (group commit: later proposals see earlier decisions of the
same batch) -> ONE Kafka transaction holding the decisions, any dead letters
and the consumed offsets -> only after it commits, hand the ratified versions
to the publisher. The transactional id is fixed per partition, so a newer
coordinator for the partition fences this one; a fenced coordinator stops
without publishing anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from coordinator.conflicts import Accepted, Duplicate, Rejected, decide
from coordinator.faults import fault_point
from coordinator.metrics import Metrics
from coordinator.publisher import Publisher, PublishTask, sweep_temp_files
from coordinator.state import TableState
from reader.log import table_root
from schemas.codec import decode_decision, decode_proposal, encode_decision
from schemas.errors import DecodeError, InvalidProposalError
from schemas.messages import Decision, Outcome, Proposal
from schemas.routing import H_ERROR, H_OUTCOME, H_PROPOSAL_ID, H_SOURCE, H_TABLE_ID, H_VERSION, Topics, header

log = logging.getLogger(__name__)


class RecoveryError(RuntimeError):
    """The commits topic could not be read to its end; state must not be rebuilt from part of it."""


class FencedError(RuntimeError):
    """A newer coordinator owns this partition; this one must stop."""


class ProducerStuckError(RuntimeError):
    """A call into the transactional producer outlived its bound; the producer must be replaced."""


@dataclass
class CoordinatorSettings:
    """How a coordinator reaches Kafka and how it batches."""

    bootstrap_servers: str
    topics: Topics = field(default_factory=Topics.with_prefix)
    #: Extra client settings passed to every Kafka client (TLS, SASL, ...).
    kafka: dict[str, Any] = field(default_factory=dict)
    group_id: str = "deltacoord-coordinator"
    transactional_id_prefix: str = "deltacoord-coordinator"
    max_batch: int = 500
    poll_timeout_s: float = 0.1
    max_proposal_bytes: int = 4 * 1024 * 1024
    transaction_timeout_ms: int = 60_000
    #: Bound on adding the consumed offsets to a transaction. librdkafka can block in
    #: send_offsets_to_transaction for ever, its own timeout unchecked, when the group
    #: coordinator's broker dies (confluentinc/librdkafka#5456, #5511); a group coordinator
    #: failover takes about broker.session.timeout.ms (9 s), so this leaves room for one.
    send_offsets_timeout_s: float = 20.0

    def client(self, defaults: dict[str, Any] | None = None, **required: Any) -> dict[str, Any]:
        """Client config: our tuning defaults, then the user's settings, then what correctness requires."""
        return {**(defaults or {}), "bootstrap.servers": self.bootstrap_servers, **self.kafka, **required}

    def transactional_id(self, partition: int) -> str:
        return f"{self.transactional_id_prefix}-{self.topics.proposals}-{partition}"


def _header(msg: Message, name: str) -> str | None:
    v = header(msg, name)
    return None if v is None else v.decode("utf-8", errors="replace")


#: Table property naming the writers allowed to propose commits (comma-separated).
ALLOWED_WRITERS_KEY = "deltacoord.allowedWriters"


def allowed_writers(st: TableState) -> frozenset[str] | None:
    """The table's writer allow-list at its head, or None when every writer may commit.

    Writer names are declared by the writer; Kafka ACLs (see deploy/) decide who
    may produce proposals at all, this list narrows it per table.
    """
    if st.metadata is None:
        return None
    raw = st.metadata.configuration.get(ALLOWED_WRITERS_KEY)
    if raw is None:
        return None
    return frozenset(w.strip() for w in raw.split(",") if w.strip())


def decision_headers(d: Decision) -> list[tuple[str, str | bytes | None]]:
    h: list[tuple[str, str | bytes | None]] = [(H_PROPOSAL_ID, d.proposal_id.encode()), (H_TABLE_ID, d.table_id.encode()), (H_OUTCOME, d.outcome.value.encode())]
    if d.committed and d.version is not None:
        h.append((H_VERSION, str(d.version).encode()))
    return h


def rejection(p_table_id: str, p_table_uri: str, proposal_id: str, err: Exception, winning_version: int | None, now_ms: int) -> Decision:
    return Decision(
        table_id=p_table_id, table_uri=p_table_uri, proposal_id=proposal_id, outcome=Outcome.REJECTED,
        error_type=type(err).__name__, error_message=str(err),
        reason_code=getattr(err, "reason", None), winning_version=winning_version, decided_at_ms=now_ms,
    )


@dataclass
class _DeadLetter:
    raw: bytes | None
    key: bytes | None
    error: str
    source: str


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
        """Event sourcing: table states are the fold of the commits partition.

        Ratified versions missing from `_delta_log` (a crash between the Kafka
        commit and publication) are handed to the publisher, oldest first; the
        newest version already on disk is re-checked byte for byte.
        """
        s = self.settings
        self.metrics.tables.dec(len(self.states))
        self.states = {}
        on_disk: dict[str, int] = {}
        for i, d in enumerate(read_decisions(s, self.partition)):
            if i % 1000 == 0:
                self._heartbeat()  # a long recovery is progress, not a hang
            if not d.committed or d.duplicate_of is not None or d.version is None:
                continue
            st = self.states.get(d.table_id)
            if st is None:
                st = TableState.empty(d.table_id, d.table_uri)
                self.states[d.table_id] = st
                on_disk[d.table_id] = newest_published_version(d.table_uri)
                swept = sweep_temp_files(d.table_uri)
                if swept:
                    log.info("removed %d temp files a killed publisher left in %s", swept, d.table_uri)
            if d.version != st.version + 1:
                raise RuntimeError(
                    f"commits topic is not contiguous for table {d.table_id}: version {d.version} after {st.version}"
                )
            st.apply(d.version, d.actions)
            if d.version >= on_disk[d.table_id]:
                self.publisher.submit(PublishTask(d.table_id, d.table_uri, d.version, d.actions))
        self.metrics.tables.inc(len(self.states))
        log.info("partition %d: recovered %d tables from %s", self.partition, len(self.states), s.topics.commits)

    # -- the loop ---------------------------------------------------------------
    def process(self, batch: Sequence[Message]) -> None:
        """Decide one batch of this partition's proposals and commit the decisions with the offsets."""
        assert self.producer is not None
        if not batch:
            return
        decisions, dead = self._decide_batch(batch)
        fault_point("after_decide")
        try:
            self._transact(batch, decisions, dead)
        except FencedError:
            raise
        except ProducerStuckError as e:
            self._replace_producer(e)
            return
        except KafkaException as e:
            log.warning("partition %d: transaction failed (%s); rebuilding state and retrying the batch", self.partition, e)
            self._abort_and_rewind(e)
            return
        fault_point("after_kafka_commit")
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

    def _decide_batch(self, batch: Sequence[Message]) -> tuple[list[Decision], list[_DeadLetter]]:
        decisions: list[Decision] = []
        dead: list[_DeadLetter] = []
        for m in batch:
            d = self._decide_one(m, dead)
            if d is not None:
                decisions.append(d)
        return decisions, dead

    def _decide_one(self, m: Message, dead: list[_DeadLetter]) -> Decision | None:
        raw = m.value()
        now_ms = m.timestamp()[1] if m.timestamp()[1] > 0 else int(time.time() * 1000)
        hdr_pid, hdr_tid = _header(m, H_PROPOSAL_ID), _header(m, H_TABLE_ID)
        source = f"{m.topic()}/{m.partition()}@{m.offset()}"
        try:
            if raw is None:
                raise DecodeError("empty message (no value)")
            if len(raw) > self.settings.max_proposal_bytes:
                raise InvalidProposalError(
                    "OVERSIZE", f"proposal of {len(raw)} bytes exceeds the limit of {self.settings.max_proposal_bytes} bytes"
                )
            p = decode_proposal(raw)
        except (DecodeError, InvalidProposalError) as e:
            dead.append(_DeadLetter(raw, m.key(), str(e), source))
            if hdr_pid and hdr_tid:
                # The writer said who it is: tell it, so it does not wait for nothing.
                err = e if isinstance(e, InvalidProposalError) else InvalidProposalError("UNDECODABLE", str(e))
                return rejection(hdr_tid, "", hdr_pid, err, None, now_ms)
            return None
        return self.decide_proposal(p, now_ms)

    def decide_proposal(self, p: Proposal, now_ms: int) -> Decision:
        """Decide one decoded proposal and apply an acceptance to the in-memory state."""
        st = self.states.get(p.table_id)
        if st is None:
            if p.read_version != -1:
                err = InvalidProposalError("UNKNOWN_TABLE", f"table {p.table_id} has no commits on this coordinator; create it first")
                return rejection(p.table_id, p.table_uri, p.proposal_id, err, None, now_ms)
            st = TableState.empty(p.table_id, p.table_uri)
        elif st.table_uri != p.table_uri:
            err = InvalidProposalError("TABLE_URI_MISMATCH", f"table {p.table_id} lives at {st.table_uri}, not {p.table_uri}")
            return rejection(p.table_id, p.table_uri, p.proposal_id, err, None, now_ms)
        allowed = allowed_writers(st)
        if allowed is not None and p.writer not in allowed:
            err = InvalidProposalError(
                "WRITER_NOT_ALLOWED", f"writer {p.writer!r} is not in the allow-list of table {p.table_id} ({ALLOWED_WRITERS_KEY})"
            )
            return rejection(p.table_id, p.table_uri, p.proposal_id, err, None, now_ms)
        halted = self.publisher.halted(p.table_id)
        if halted is not None:
            err = InvalidProposalError("TABLE_HALTED", halted)
            return rejection(p.table_id, p.table_uri, p.proposal_id, err, None, now_ms)
        result = decide(st, p, now_ms)
        if isinstance(result, Accepted):
            st.apply(result.version, result.actions)
            if p.table_id not in self.states:
                self.metrics.tables.inc()
            self.states[p.table_id] = st
            return Decision(
                table_id=p.table_id, table_uri=p.table_uri, proposal_id=p.proposal_id, outcome=Outcome.COMMITTED,
                version=result.version, actions=result.actions, decided_at_ms=now_ms,
            )
        if isinstance(result, Duplicate):
            return Decision(
                table_id=p.table_id, table_uri=p.table_uri, proposal_id=p.proposal_id, outcome=Outcome.COMMITTED,
                version=result.version, duplicate_of=result.version, decided_at_ms=now_ms,
            )
        assert isinstance(result, Rejected)
        return rejection(p.table_id, p.table_uri, p.proposal_id, result.error, result.winning_version, now_ms)

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
            self._send_offsets(offsets)
            self._commit_with_retry()
        except KafkaException as e:
            kerr = e.args[0]
            if isinstance(kerr, KafkaError) and (kerr.code() == KafkaError._FENCED or kerr.fatal()):
                raise FencedError(f"partition {self.partition}: {kerr}") from e
            raise

    def _send_offsets(self, offsets: list[TopicPartition]) -> None:
        """send_offsets_to_transaction, bounded: the call runs in a daemon thread, and one that
        outlives `send_offsets_timeout_s` raises ProducerStuckError (the thread and its producer
        are left behind; the replacement's init_transactions fences that producer)."""
        producer, timeout = self.producer, self.settings.send_offsets_timeout_s
        assert producer is not None
        group = self.consumer.consumer_group_metadata()
        done = threading.Event()
        failure: list[BaseException] = []

        def call() -> None:
            try:
                fault_point("send_offsets")
                producer.send_offsets_to_transaction(offsets, group, timeout)
            except BaseException as e:
                failure.append(e)
            finally:
                done.set()

        threading.Thread(target=call, name=f"deltacoord-send-offsets-{self.partition}", daemon=True).start()
        if not done.wait(timeout + 5):
            raise ProducerStuckError(f"partition {self.partition}: send_offsets_to_transaction still blocked after {timeout + 5:.0f}s")
        if failure:
            raise failure[0]

    def _replace_producer(self, cause: ProducerStuckError) -> None:
        """Start over with a new transactional producer, as a restarted coordinator would: its
        init_transactions aborts the open transaction and fences the stuck producer; then rebuild
        the state and consume again from the last committed offset."""
        log.error("%s; replacing the transactional producer and retrying the batch", cause)
        self.producer = None  # never closed: a thread is still inside one of its calls
        self.consumer.seek(TopicPartition(self.settings.topics.proposals, self.partition, self.start()))

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
        # In-memory states may hold this batch's tentative commits: rebuild them,
        # and consume again from the last committed offset.
        self._recover()
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


def newest_published_version(table_uri: str) -> int:
    """The newest `<v>.json` in a table's `_delta_log`, or -1."""
    newest = -1
    try:
        names = os.listdir(table_root(table_uri) / "_delta_log")
    except FileNotFoundError:
        return -1
    for name in names:
        if len(name) == 25 and name.endswith(".json") and name[:20].isdigit():
            newest = max(newest, int(name[:20]))
    return newest


def read_decisions(
    settings: CoordinatorSettings, partition: int, *, table_id: str | None = None, min_version: int = 0,
    stall_timeout_s: float = 120.0,
) -> Iterator[Decision]:
    """Committed decisions on one commits partition, in order (read_committed), streamed."""
    c = Consumer(
        settings.client(
            {"fetch.message.max.bytes": max(settings.max_proposal_bytes * 2, 1_048_576)},
            **{"group.id": f"{settings.group_id}-recovery", "enable.auto.commit": False, "isolation.level": "read_committed",
               "enable.partition.eof": True},
        )
    )
    try:
        tp = TopicPartition(settings.topics.commits, partition)
        low, high = c.get_watermark_offsets(tp, timeout=30)
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
