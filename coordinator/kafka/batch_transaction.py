"""A batch's one Kafka transaction: its records (decisions, dead letters, control records), the proposals offset
it consumed up to, and what happens when Kafka refuses it.

The transactional id is fixed per partition, so a newer coordinator for the partition fences this one
(`FencedError`: the daemon stops without publishing). A transaction failing for any reason is aborted and the
batch consumed again from the last committed offset (the states never held it). When Kafka refuses one record
of a transaction for what it is (too large, invalid: `RECORD_REFUSALS`), the message it answers is degraded one
step per refusal and the batch retried: first its proposal is rejected with UNRECORDABLE (an undecodable message
keeps its rejection) and its dead letter keeps only headers; then the dead letter is dropped too (the door,
`deltacoord.coordinator.kafka.door`, decodes a degraded message so). A producer call that outlives its bound
(`ProducerStuckError`), or an abort that kills the producer without a newer owner (`NOT_FENCED`), replaces the
producer, as a restart would.

Commits-topic records carry the offset their batch consumed up to (`H_NEXT_OFFSET`); the group's offset is
committed in the transaction only when no such record does or once it has lagged them for
`group_offset_interval_s` (the idle flush makes it current between bursts). While a proposal is held
(`deltacoord.coordinator.kafka.holds`), the offset recorded stays at the first one not decided (`floor`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from deltacoord.coordinator.faults import fault_point
from deltacoord.coordinator.kafka.orphans import commit_with_retry, open_transaction, seal
from deltacoord.coordinator.kafka.partition_health import PartitionProgress
from deltacoord.coordinator.metrics import Metrics
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.routing import H_CONTROL, H_NEXT_OFFSET, H_OUTCOME, H_PROPOSAL_ID, H_TABLE_ID, H_VERSION

log = logging.getLogger(__name__)

#: Kafka's refusals of one record for what it is: retrying the same record cannot succeed.
RECORD_REFUSALS = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG, KafkaError.INVALID_MSG_SIZE,
})
#: Degradation steps of a message Kafka refused to record (see the module docstring).
FULL, HEADERS_ONLY, REJECTION_ONLY = 0, 1, 2
#: After an idle commit of the group's offset failed, the next try waits this long.
GROUP_OFFSET_RETRY_S = 5.0
#: How long a failed transaction's records are waited for before it is aborted (`_abort_and_rewind`).
ABORT_FLUSH_S = 10.0
#: Fatal errors of an abort that no newer owner caused: the producer is replaced, and the coordinator stays.
NOT_FENCED = frozenset({KafkaError.INVALID_TXN_STATE})


class ProducerStuckError(DeltaCoordError, RuntimeError):
    """A call into the transactional producer outlived its bound; the producer must be replaced."""


class FencedError(DeltaCoordError, RuntimeError):
    """A newer coordinator owns this partition; this one must stop."""


def decision_headers(d: Decision, control: str | None = None) -> list[tuple[str, str | bytes | None]]:
    h: list[tuple[str, str | bytes | None]] = [(H_PROPOSAL_ID, d.proposal_id.encode()), (H_TABLE_ID, d.table_id.encode()), (H_OUTCOME, d.outcome.value.encode())]
    if d.committed and d.version is not None:
        h.append((H_VERSION, str(d.version).encode()))
    if control is not None:
        h.append((H_CONTROL, control.encode()))
    return h


@dataclass(frozen=True)
class Refusal:
    """A record Kafka refused: the offset of the message it answers, where it went, its size and why."""

    source: int
    topic: str
    size: int
    why: str


@dataclass
class Out:
    """One record of a batch's transaction, with the offset of the message it answers."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, str | bytes | None]]
    partition: int | None
    source: int
    #: The decision this record carries (commits topic), for the offsets state snapshots need.
    decision: Decision | None = None


#: Called after a transaction committed with its commits-topic records and the offsets they got.
RecordedHook = Callable[[Sequence[tuple[Out, int]]], None]


class BatchTransaction:
    """The partition's transactional producer and the transactions it runs, one per decided batch."""

    def __init__(self, settings: CoordinatorSettings, partition: int, consumer: Consumer, metrics: Metrics,
                 progress: PartitionProgress, on_recorded: RecordedHook) -> None:
        self.settings = settings
        self.partition = partition
        self.consumer = consumer
        self.metrics = metrics
        self.progress = progress
        self.on_recorded = on_recorded
        self.producer: Producer | None = None
        #: Takes the partition over again from the commits topic (after a replaced producer); the offset to resume at.
        self.restart: Callable[[], int] = lambda: self.progress.committed_to
        self.tp = TopicPartition(settings.topics.proposals, partition)
        #: Offset -> (degradation step, why) of messages Kafka refused to record as they were.
        self.degraded: dict[int, tuple[int, str]] = {}
        #: The last commits-topic offset of the last committed transaction (None: it wrote none there).
        self.last_offset: int | None = None
        #: The offset last committed to the group (in a transaction), and since when the group's offset lags the
        #: records' (None: it does not; the idle flush made it current).
        self._group_offset = 0
        self._group_behind_since: float | None = None
        self._group_offset_retry_at = 0.0
        self._delivered: list[tuple[Out, int]] = []
        #: The first proposals offset not decided yet (a held proposal), which no offset recorded passes; None: none.
        self.floor: Callable[[], int | None] = lambda: None

    # -- the producer ------------------------------------------------------------------
    def open(self) -> None:
        """A new transactional producer; its init_transactions completes or aborts any transaction a previous
        owner left open, and fences it."""
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
        log.info("partition %d: fencing the previous owner (init_transactions %s)", self.partition, s.transactional_id(self.partition))
        t0 = time.monotonic()
        self.producer.init_transactions(60)
        log.info("partition %d: transactional producer ready in %.1fs; recovering", self.partition, time.monotonic() - t0)
        self._close_left_open()

    def _close_left_open(self) -> None:
        """Commit a transaction a broker left open on the commits partition (coordinator.kafka.orphans)."""
        assert self.producer is not None
        s = self.settings
        found = open_transaction(s.client(), s.topics.commits, self.partition)
        if found is None:
            return
        stable, end = found
        log.warning("partition %d: %s[%d] holds a transaction left open from offset %d (its end is %d): a broker lost "
                    "its commit markers. Committing it with an empty record before reading the partition",
                    self.partition, s.topics.commits, self.partition, stable, end)
        at = seal(self.producer, s.client(), s.topics.commits, self.partition)
        log.warning("partition %d: the transaction left open is committed (empty record at offset %d)", self.partition, at)

    def resume_at(self, recovered_to: int) -> int:
        """The proposals offset to resume from: after both the group's offset and what recovery found recorded."""
        # The group's offset lags the records' `deltacoord.next_offset` by up to `group_offset_interval_s` of
        # transactions (or leads it after transactions that recorded no decision): resume after both.
        self._group_offset = self.committed_offset()
        self.progress.committed_to = max(self._group_offset, recovered_to)
        self._group_behind_since = time.monotonic() if self.progress.committed_to > self._group_offset else None
        self.progress.last_commit = time.monotonic()
        if self.progress.committed_to > self._group_offset:
            log.info("partition %d: resuming at proposals offset %d (the group's committed offset is %d)", self.partition,
                     self.progress.committed_to, self._group_offset)
        return self.progress.committed_to

    def committed_offset(self) -> int:
        committed = committed_with_retry(self.consumer, self.tp)
        return committed[0].offset if committed and committed[0].offset >= 0 else 0

    def close(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(KafkaException):  # a fenced producer fails every call, flush included
                self.producer.flush(5)
            self.producer = None

    # -- one transaction -----------------------------------------------------------------
    def record(self, batch: Sequence[Message], outs: Sequence[Out], floor: int | None = None) -> bool:
        """One transaction of `outs` with the offsets of `batch` (recorded no further than `floor`, the first offset
        left undecided); False (aborted and rewound, or the producer replaced) when it failed, so the batch is
        consumed again."""
        refused: list[Refusal] = []
        try:
            self._transact(batch, outs, refused, floor=floor)
        except ProducerStuckError as e:
            self._failed(str(e))
            self._replace_producer(e)
            return False
        except KafkaException as e:
            self._failed(str(e))
            degraded = self._degrade(refused) if refused else False
            if not refused:
                log.warning("partition %d: transaction failed (%s); dropping the batch's decisions and consuming it again",
                            self.partition, e)
            self._abort_and_rewind(e)
            if not degraded:
                # Whatever failed is not one record's fault: do not spin on it.
                time.sleep(min(0.05 * 2 ** min(self.progress.failures, 5), 1.0))
            return False
        return True

    def record_alone(self, outs: Sequence[Out], what: str) -> bool:
        """A transaction of `outs` only (control records no batch came to carry); False when it failed (tried again
        with the next transaction)."""
        if self.producer is None:
            return False
        try:
            self._transact([], outs, [])
        except ProducerStuckError as e:
            self._failed(str(e))
            self._replace_producer(e)
            return False
        except KafkaException as e:
            self._failed(str(e))
            log.warning("partition %d: recording %d %s failed (%s); retrying with the next transaction", self.partition,
                        len(outs), what, e)
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction(60)
            return False
        return True

    def flush_offsets(self) -> None:
        """When idle, commit to the group the offset the last transactions recorded only in their records,
        so lag tools (and the group's view of this partition) are current while no batch comes."""
        floor = self.floor()
        committed_to = self.progress.committed_to if floor is None else min(floor, self.progress.committed_to)
        if self.producer is None or committed_to <= self._group_offset or time.monotonic() < self._group_offset_retry_at:
            return
        try:
            self._transact([], [], [], offsets_to=committed_to)
        except ProducerStuckError as e:
            self._failed(str(e))
            self._replace_producer(e)
        except KafkaException as e:
            # Nothing depends on it (recovery reads the records): try again later, not at every idle poll.
            self._group_offset_retry_at = time.monotonic() + GROUP_OFFSET_RETRY_S
            log.warning("partition %d: committing offset %d to the group failed (%s); trying again in %.0fs",
                        self.partition, committed_to, e, GROUP_OFFSET_RETRY_S)
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction(60)

    def committed(self, batch: Sequence[Message]) -> None:
        """The transaction of `batch` committed: its proposals are consumed (decided, or held or waiting behind a
        hold: a batch decided after a hold does not move the offset back)."""
        last = batch[-1].offset()
        assert last is not None
        self.progress.committed(max(last + 1, self.progress.committed_to))
        for o in [o for o in self.degraded if o < last + 1]:
            del self.degraded[o]
        self.progress.observe(self.consumer, self.tp)

    def _failed(self, why: str) -> None:
        self.metrics.transaction_failures.inc()
        self.progress.failed(why)

    def _degrade(self, refused: Sequence[Refusal]) -> bool:
        """One more degradation step for the largest record Kafka refused on each topic (see the module docstring);
        False when none was left to take.

        Kafka refuses a whole record batch, so a small record sharing a batch with a large one is refused
        too; only the largest is certainly too large (a batch grows past `batch.size` only with one record).
        """
        largest: dict[str, Refusal] = {}
        for r in refused:
            if r.topic not in largest or r.size > largest[r.topic].size:
                largest[r.topic] = r
        degraded = False
        for offset, why in sorted({r.source: r.why for r in largest.values()}.items()):
            step = self.degraded.get(offset, (FULL, ""))[0] + 1
            source = f"{self.settings.topics.proposals}/{self.partition}@{offset}"
            if step > REJECTION_ONLY:
                # Even a bare rejection was refused: the commits topic cannot take a small record,
                # which no message causes. Retried like any other failure; /healthz shows the stall.
                log.error("partition %d: Kafka refuses even the bare rejection of %s (%s); check the commits "
                          "topic's max.message.bytes", self.partition, source, why)
                continue
            self.degraded[offset] = (step, why)
            degraded = True
            self.metrics.unrecordable.labels("headers_only" if step == HEADERS_ONLY else "rejection_only").inc()
            log.error("partition %d: Kafka refused to record what answers %s (%s); %s", self.partition, source, why,
                      "recording a rejection and a dead letter without its bytes instead" if step == HEADERS_ONLY
                      else "recording only its rejection (if it names a proposal) and skipping it")
        return degraded

    def _transact(self, batch: Sequence[Message], outs: Sequence[Out], refused: list[Refusal], *,
                  offsets_to: int | None = None, floor: int | None = None) -> None:
        """One transaction: the records and the offset the batch consumed up to (or `offsets_to`, for a
        transaction of the offset alone). Commits-topic records carry that offset (`H_NEXT_OFFSET`); the
        group's offset is committed in the transaction only when no such record does or once it has lagged for
        `group_offset_interval_s`. Records Kafka refuses for what they are (`RECORD_REFUSALS`) are appended to
        `refused` before the error propagates."""
        assert self.producer is not None
        s = self.settings
        nxt = offsets_to
        if batch:
            last_offset = batch[-1].offset()
            assert last_offset is not None
            nxt = max(last_offset + 1, self.progress.committed_to)
            if floor is not None:
                nxt = min(nxt, floor)
        carried = bool(batch) and any(o.topic == s.topics.commits for o in outs)
        mark: list[tuple[str, str | bytes | None]] = [(H_NEXT_OFFSET, str(nxt).encode())] if carried else []
        # While busy, the group's offset follows every `group_offset_interval_s` of lag. The first batch after an idle
        # flush made it current starts that clock instead of paying AddOffsetsToTxn and TxnOffsetCommit (two round
        # trips): otherwise every commit after a pause of a second, a new writer's first among them, paid them.
        behind = self._group_behind_since
        to_group = nxt is not None and (not carried or s.group_offset_interval_s <= 0 or (
            behind is not None and time.monotonic() - behind >= s.group_offset_interval_s))

        def note(o: Out, err: KafkaError) -> None:
            size = len(o.value or b"") + len(o.key or b"") + sum(len(k) + len(v or b"") for k, v in o.headers)
            refused.append(Refusal(o.source, o.topic, size, f"{o.topic}: {err.str()}"))

        def noted(o: Out) -> Callable[[KafkaError | None, Message], None]:
            def on_delivery(err: KafkaError | None, msg: Message) -> None:
                if err is not None and err.code() in RECORD_REFUSALS:
                    note(o, err)
                elif err is None and o.topic == s.topics.commits:
                    offset = msg.offset()
                    if offset is not None and offset >= 0:
                        self._delivered.append((o, offset))
            return on_delivery

        self._delivered = []
        try:
            self.producer.begin_transaction()
            for o in outs:
                headers = [*o.headers, *mark] if mark and o.topic == s.topics.commits else o.headers
                try:
                    if o.partition is None:
                        self.producer.produce(o.topic, value=o.value, key=o.key, headers=headers, on_delivery=noted(o))
                    else:
                        self.producer.produce(o.topic, value=o.value, key=o.key, headers=headers, partition=o.partition,
                                              on_delivery=noted(o))
                except KafkaException as e:
                    kerr = e.args[0]
                    if isinstance(kerr, KafkaError) and kerr.code() in RECORD_REFUSALS:
                        note(o, kerr)
                    raise
            if to_group and nxt is not None:
                self._send_offsets([TopicPartition(s.topics.proposals, self.partition, nxt)])
            if fault_point("before_kafka_commit"):
                raise KafkaException(KafkaError(KafkaError._FAIL, "injected fault: the transaction fails before its commit",
                                                retriable=True, txn_requires_abort=True))
            commit_with_retry(self.producer)
            if to_group and nxt is not None:
                self._group_offset, self._group_behind_since = nxt, None
            elif carried and self._group_behind_since is None:
                self._group_behind_since = time.monotonic()
            self.last_offset = max((offset for _o, offset in self._delivered), default=None)
            self.on_recorded(self._delivered)
            self._delivered = []
        except KafkaException as e:
            # Delivery reports of the failed transaction say which records were refused.
            with contextlib.suppress(KafkaException, RuntimeError):
                self.producer.poll(0)
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
        init_transactions aborts the open transaction and fences the stuck producer. The states
        never held the batch (its overlay is dropped); consume again from the last committed offset."""
        log.error("%s; replacing the transactional producer and retrying the batch", cause)
        self.producer = None  # never closed: a thread is still inside one of its calls
        self._leave_if_superseded(cause)
        self.consumer.seek(TopicPartition(self.settings.topics.proposals, self.partition, self.restart()))

    def _leave_if_superseded(self, cause: ProducerStuckError) -> None:
        """A new producer's init_transactions fences whoever holds the partition now. While this one was stuck
        (cut off from the brokers, say), another coordinator may have taken the partition and decided on: the
        group's offset then lies beyond what this one ever committed, since only a committed transaction moves
        it. Fencing that owner back would only make it exit in turn; this one leaves instead, as a fenced
        coordinator does. (An owner that has not yet committed a group offset is not seen: it is fenced, and
        recovery from the commits topic keeps every decision exact either way.)"""
        try:
            group = self.committed_offset()
        except KafkaException as e:
            log.warning("partition %d: cannot read the group's offset (%s); taking the partition back", self.partition, e)
            return
        if group > self.progress.committed_to:
            raise FencedError(f"partition {self.partition}: another coordinator decided proposals up to offset {group} "
                              f"while this one's producer was stuck (it had committed up to {self.progress.committed_to}); "
                              f"leaving the partition to it") from cause

    def _abort_and_rewind(self, cause: KafkaException) -> None:
        assert self.producer is not None
        # Every record of the transaction delivered (or failed) first: librdkafka sends the abort's EndTxn once it has
        # sent AddPartitionsToTxn, not once the broker has added the partitions. An EndTxn that gets there first finds
        # no open transaction, and the broker's INVALID_TXN_STATE is fatal to the producer (librdkafka issue #4849).
        # A delivered record proves its partition was added.
        with contextlib.suppress(KafkaException, RuntimeError):
            self.producer.flush(ABORT_FLUSH_S)
        try:
            self.producer.abort_transaction(60)
        except KafkaException as e:
            kerr = e.args[0]
            if isinstance(kerr, KafkaError) and kerr.code() in NOT_FENCED:
                # The producer is dead but nobody fenced it: start over with a new one, as a restart would.
                self._replace_producer(ProducerStuckError(f"partition {self.partition}: aborting a failed transaction "
                                                          f"failed ({kerr.str()})"))
                return
            if isinstance(kerr, KafkaError) and kerr.fatal():
                raise FencedError(f"partition {self.partition}: {kerr}") from cause
        # The states never held this batch (its overlay is dropped): consume it again from the offset the
        # last committed transaction consumed up to (the group's offset may lag it: `group_offset_interval_s`).
        self.consumer.seek(TopicPartition(self.settings.topics.proposals, self.partition, self.progress.committed_to))




def committed_with_retry(consumer: Consumer, tp: TopicPartition, timeout_s: float = 60.0) -> list[TopicPartition]:
    """The group's committed offset; retried while the group coordinator is still loading or moving (a local
    timeout: the broker that led the group died and its successor has not answered yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return list(consumer.committed([tp], timeout=10))
        except KafkaException as e:
            kerr = e.args[0]
            if time.monotonic() > deadline or not (isinstance(kerr, KafkaError) and (kerr.retriable() or kerr.code() in (
                    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
                    KafkaError._TIMED_OUT, KafkaError._TRANSPORT))):
                raise
            time.sleep(0.2)
