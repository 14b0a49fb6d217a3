"""Propose commits and learn their outcome from the commits topic.

A `CoordinatorClient` produces each proposal to its table's partition and
listens on the same partition of the commits topic. Decisions are matched by
the proposal-id header, so other writers' decisions are skipped without being
decoded. A decision that does not arrive in time is an unknown outcome, never a
failure: the proposal may still commit.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from schemas import kafka_logs
from schemas.codec import decode_decision, encode_proposal
from schemas.errors import CommitOutcomeUnknownError, EncodeError, ProposalNotSentError
from schemas.messages import Decision, Proposal
from schemas.routing import H_PROPOSAL_ID, H_SIGNATURE, H_SIGNER, H_TABLE_ID, Topics, header, partition_for
from schemas.signing import WriterKey


def _end_offset(consumer: Consumer, tp: TopicPartition, timeout_s: float = 30.0) -> int:
    """The partition's end offset, retried while leadership settles (new topic, moving leader)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _low, high = consumer.get_watermark_offsets(tp, timeout=10)
            return int(high)
        except KafkaException as e:
            err = e.args[0]
            if time.monotonic() > deadline or not (isinstance(err, KafkaError) and (err.retriable() or err.code() in (
                    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART))):
                raise
            time.sleep(0.2)


class _PartitionListener:
    """Tails one commits partition from a fixed offset and resolves pending futures."""

    def __init__(self, conf: dict[str, Any], topic: str, partition: int) -> None:
        self._consumer = Consumer({
            **conf,
            "group.id": f"deltacoord-writer-{id(self)}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
        })
        tp = TopicPartition(topic, partition)
        high = _end_offset(self._consumer, tp)
        # Start at the end as of now: every proposal produced after this point
        # has its decision at a later offset.
        self._consumer.assign([TopicPartition(topic, partition, high)])
        self._pending: dict[bytes, Future[Decision]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"deltacoord-decisions-{partition}", daemon=True)
        self._thread.start()

    def expect(self, proposal_id: str) -> Future[Decision]:
        fut: Future[Decision] = Future()
        with self._lock:
            self._pending[proposal_id.encode()] = fut
        return fut

    def forget(self, proposal_id: str) -> None:
        with self._lock:
            self._pending.pop(proposal_id.encode(), None)

    def _run(self) -> None:
        while not self._stop.is_set():
            # poll() returns as soon as one decision is there; consume(n, t) would wait for n.
            first = self._consumer.poll(0.1)
            if first is None:
                continue
            for m in [first, *self._consumer.consume(500, 0)]:
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        time.sleep(0.1)
                    continue
                pid = header(m, H_PROPOSAL_ID)
                if pid is None:
                    continue
                with self._lock:
                    fut = self._pending.pop(pid, None)
                if fut is None:
                    continue
                value = m.value()
                try:
                    assert value is not None
                    fut.set_result(decode_decision(value))
                except Exception as e:  # a decision we cannot read is still not an outcome we may invent
                    fut.set_exception(e)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


#: Delivery errors that mean the broker never wrote the proposal (not a timeout, whose message may
#: still be written): the proposal cannot commit.
_NOT_WRITTEN = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION, KafkaError.INVALID_RECORD, KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError._INVALID_ARG,
})


class CoordinatorClient:
    """Send proposals to the coordinator and wait for decisions."""

    def __init__(self, bootstrap_servers: str, *, topics: Topics | None = None, **kafka_config: Any) -> None:
        self.topics = topics or Topics.with_prefix()
        self._conf: dict[str, Any] = kafka_logs.kafka_config({"bootstrap.servers": bootstrap_servers, **kafka_config})
        self._producer = Producer({**self._conf, "enable.idempotence": True, "linger.ms": 0, "acks": "all"})
        self._listeners: dict[int, _PartitionListener] = {}
        self._lock = threading.Lock()
        self._num_partitions: int | None = None

    def partition_of(self, table_id: str) -> int:
        if self._num_partitions is None:
            md = self._producer.list_topics(self.topics.proposals, timeout=30)
            t = md.topics.get(self.topics.proposals)
            if t is None or t.error is not None or not t.partitions:
                raise RuntimeError(
                    f"proposals topic {self.topics.proposals} not found on {self._conf['bootstrap.servers']}: is a coordinator running?"
                )
            self._num_partitions = len(t.partitions)
        return partition_for(table_id, self._num_partitions)

    def _listener(self, partition: int) -> _PartitionListener:
        with self._lock:
            lst = self._listeners.get(partition)
            if lst is None:
                lst = _PartitionListener(self._conf, self.topics.commits, partition)
                self._listeners[partition] = lst
            return lst

    def propose(self, proposal: Proposal, key: WriterKey | None = None) -> Future[Decision]:
        """Produce the proposal (signed with `key` when given); the future resolves with its decision."""
        partition = self.partition_of(proposal.table_id)
        fut = self._listener(partition).expect(proposal.proposal_id)
        delivery: Future[None] = Future()

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                delivery.set_result(None)
            elif err.code() in _NOT_WRITTEN:
                delivery.set_exception(ProposalNotSentError(f"proposal {proposal.proposal_id} was refused by Kafka: {err}"))
            else:
                delivery.set_exception(RuntimeError(f"proposal {proposal.proposal_id} was not delivered: {err}"))

        try:
            value = encode_proposal(proposal)
            headers: list[tuple[str, str | bytes | None]] = [(H_PROPOSAL_ID, proposal.proposal_id.encode()),
                                                             (H_TABLE_ID, proposal.table_id.encode())]
            if key is not None:
                if proposal.writer != key.name:
                    raise ValueError(f"proposal {proposal.proposal_id} declares writer {proposal.writer!r} but would be "
                                     f"signed by key {key.name!r}: the coordinator requires them to match")
                headers += [(H_SIGNER, key.name.encode()), (H_SIGNATURE, key.sign(value))]
            self._producer.produce(
                self.topics.proposals, value=value, key=proposal.table_id.encode(), partition=partition, headers=headers,
                on_delivery=on_delivery,
            )
        except (EncodeError, BufferError, KafkaException, ValueError) as e:  # refused before anything was sent
            self._listener(partition).forget(proposal.proposal_id)
            raise ProposalNotSentError(f"proposal {proposal.proposal_id} could not be produced: {e}") from e
        self._producer.flush(30)
        try:
            delivery.result(0)
        except Exception:
            self._listener(partition).forget(proposal.proposal_id)
            raise
        return fut

    def commit(self, proposal: Proposal, timeout_s: float = 60.0, key: WriterKey | None = None) -> Decision:
        """Propose (signed with `key` when given) and wait. Raises CommitOutcomeUnknownError if no decision arrives in time."""
        fut = self.propose(proposal, key)
        try:
            return fut.result(timeout_s)
        except TimeoutError:
            self._listener(self.partition_of(proposal.table_id)).forget(proposal.proposal_id)
            raise CommitOutcomeUnknownError(proposal.proposal_id, proposal.table_id, timeout_s) from None

    def lookup_decision(self, table_id: str, proposal_id: str, timeout_s: float = 30.0) -> Decision | None:
        """Scan the table's commits partition for a proposal's decision (after an unknown outcome)."""
        partition = self.partition_of(table_id)
        c = Consumer({**self._conf, "group.id": "deltacoord-lookup", "enable.auto.commit": False, "isolation.level": "read_committed"})
        try:
            tp = TopicPartition(self.topics.commits, partition)
            low, high = c.get_watermark_offsets(tp, timeout=timeout_s)
            if high <= low:
                return None  # nothing decided on this partition yet
            c.assign([TopicPartition(self.topics.commits, partition, low)])
            want = proposal_id.encode()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for m in c.consume(500, 0.2):
                    value = m.value()
                    if m.error() is None and value is not None and header(m, H_PROPOSAL_ID) == want:
                        return decode_decision(value)
                # The position, not the last message offset: transaction markers are never delivered.
                if c.position([tp])[0].offset >= high:
                    return None
            return None
        finally:
            c.close()

    def close(self) -> None:
        for lst in self._listeners.values():
            lst.close()
        self._listeners.clear()
        self._producer.flush(10)
