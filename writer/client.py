"""Propose commits and learn their outcome from the writer's own reply partition.

Decisions are routed, not broadcast: each proposal names a partition of the
replies topic (header `deltacoord.reply_partition`), and once the Kafka
transaction recording the decision has committed, the coordinator sends the
writer one reply there: the decision, and for a new version by default only
once `_delta_log/<v>.json` exists (`deltacoord.coordinator.kafka.notices`). A writer process
leases reply partitions through a consumer group on the replies topic
(`group.protocol=consumer`): Kafka gives each partition to one live member, so
a writer fetches only its own answers and the broker's fetch work per commit
does not grow with the number of writers. The group consumer only holds the
lease (its partitions are paused); a second consumer, assigned by hand, reads.
The lease starts `LEASE_AFTER_S` after the client (a process that ends sooner never
joins the group). Until the first lease arrives, or when there are
more writer processes than reply partitions, a writer uses a shared partition
and skips other writers' answers by the proposal-id header.

A reply is a copy; the commits topic is the truth. A writer that hears nothing
within `REPLY_WAIT_S` (a coordinator that died between its transaction and the
reply, a reply lost) looks for its proposal id in the table's commits partition,
from shortly before it proposed, and again with growing pauses; a decision found
in neither by the deadline is an unknown outcome, never a failure: the proposal
may still commit.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from deltacoord.reader.ratified import RatifiedSource
from deltacoord.schemas import client_settings, kafka_logs
from deltacoord.schemas.codec import decode_decision, encode_proposal
from deltacoord.schemas.commits_topic import PartitionScan, ScanIncompleteError, Watermarks, read_committed, watermarks
from deltacoord.schemas.errors import (
    ClientClosedError,
    CommitOutcomeUnknownError,
    EncodeError,
    KafkaAccessDeniedError,
    ProposalNotSentError,
    ProposalUnconfirmedError,
    TopicNotFoundError,
)
from deltacoord.schemas.messages import Decision, Proposal
from deltacoord.schemas.routing import (
    H_CONTROL,
    H_PROPOSAL_ID,
    H_SIGNATURE,
    H_SIGNER,
    H_TABLE_ID,
    Topics,
    partition_for,
)
from deltacoord.schemas.signing import WriterKey
from deltacoord.writer.delivery import flush_deliveries
from deltacoord.writer.relay_link import RelayLink
from deltacoord.writer.replies import Pending, ReplyCounts, Routing, check_wait
from deltacoord.writer.serving import CoordinatorCheck

log = logging.getLogger(__name__)

#: How long a writer waits for its reply before it also looks for its decision in the commits topic.
REPLY_WAIT_S = 5.0
#: The commits-topic scan starts this long before the proposal was produced (clocks of the writer,
#: the broker and the coordinator may disagree by this much).
CLOCK_SKEW_MS = 60_000

#: How long a proposal's delivery to Kafka is waited for before its outcome is unknown.
DELIVERY_WAIT_S = 30.0
#: How long a first commit waits for the client's background questions (`_lease_early`) before asking itself.
WARM_WAIT_S = 10.0
#: The longest one poll of the reply threads blocks: `close` waits for them, and so does every short-lived
#: process's exit (at 0.1 s, a CLI write spent a tenth of its process there).
POLL_S = 0.025
#: How long `ReplyPartitions.close` waits for each reply thread (one in a rebalance callback may take long).
CLOSE_WAIT_S = 30.0
#: How long a closing client polls its lease for the revocation of its partitions before it closes it.
LEAVE_WAIT_S = 5.0
#: A reply partition assigned this long ago counts as fetched even if its end was not reached yet.
LIVE_AFTER_S = 0.5
#: How long a new client's partition count may go unanswered before a probe asks whether any broker answers
#: (an unreachable broker is reported in seconds, not after the count's metadata timeout).
PROBE_AFTER_S = 0.5
#: How long after a client's start its reply partitions' lease starts (`ReplyPartitions`): a short-lived
#: process (a CLI write, a cron job) commits on the shared partition and never joins the writers' group.
LEASE_AFTER_S = 1.0
#: The writer's clients' `reconnect.backoff.ms` unless given (librdkafka's default is 100). A new client drops
#: its bootstrap connection once it learns the brokers, and a request sent on it meanwhile fails over to a new
#: connection only after `reconnect.backoff.ms / 2` (at least 11 ms): 50 ms of a fresh process's first commit,
#: once per client it opens. Reconnects after a failure still back off exponentially to
#: `reconnect.backoff.max.ms` (10 s).
RECONNECT_BACKOFF_MS = 20
#: librdkafka's `enable.sparse.connections` for the clients a fresh writer's first commit waits for (its proposal
#: producer, its reply reader, the coordinator check's listing), unless given. Sparse (librdkafka's default), a
#: new client connects to the broker its bootstrap connection named only `reconnect.backoff.ms / 2` (at least
#: 11 ms) after it opened that connection, and a first request caught on the bootstrap connection, which it drops,
#: waits for that: a fresh client's first metadata answer took 14 ms of which 11 were this wait, 3 ms without it.
#: Not sparse, a client connects to each broker as soon as it learns it: at most one idle connection per
#: other broker (the check's listing asks every broker anyway).
SPARSE_CONNECTIONS = False


def eager(conf: Mapping[str, Any]) -> dict[str, Any]:
    """`conf` with `enable.sparse.connections` set to SPARSE_CONNECTIONS unless it sets it itself."""
    return {"enable.sparse.connections": SPARSE_CONNECTIONS, **conf}

_SILENT = logging.getLogger("deltacoord.kafka.keyword-check")
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False


def check_kafka_keywords(owner: Callable[..., Any], kafka_config: dict[str, Any]) -> None:
    """TypeError, with a did-you-mean among `owner`'s keywords, for a keyword that is no Kafka client setting: a
    misspelt keyword (`bootstrap_server=`) would otherwise reach librdkafka as a setting of that name."""
    for key, value in kafka_config.items():
        if "." in key or _librdkafka_accepts(key, value):
            continue
        # Only for the error: a signature costs ~50 us, and every table handle of a transaction checks.
        keywords = [p for p in inspect.signature(owner).parameters if p not in ("self", "kafka_config")]
        close = difflib.get_close_matches(key, keywords, n=1, cutoff=0.6)
        raise TypeError(f"{owner.__qualname__.split('.')[0]}() got an unexpected keyword argument {key!r}"
                        + (f"; did you mean {close[0]!r}?" if close else ".")
                        + " Other keywords are Kafka client settings, by librdkafka's names (for example "
                          "**{'security.protocol': 'SASL_SSL'}).")


def _librdkafka_accepts(key: str, value: Any) -> bool:
    """Whether librdkafka (or confluent-kafka's own callbacks, such as `logger`) knows a setting named `key`."""
    try:
        # A client that is never used: it says whether the name exists, and logs nothing.
        Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0, "logger": _SILENT, key: value}).flush(0)
    except KafkaException as e:
        return "No such configuration property" not in str(e)
    except (TypeError, ValueError):
        return True  # a known name given a bad value: librdkafka says so when the client is made
    return True


def _unconfirmed(proposal: Proposal, e: BaseException) -> Exception:
    """What a proposal's delivery failure means to its writer: refused (ProposalNotSentError: nothing can commit),
    else an unknown outcome (a delivery not confirmed may still be written, or written later by the producer's
    retries, or by a relay that died after producing it)."""
    if isinstance(e, ProposalNotSentError):
        return e
    why = (f"Kafka did not confirm its delivery within {DELIVERY_WAIT_S:.0f}s" if isinstance(e, TimeoutError)
           else f"its delivery failed after it was sent ({e})")
    return CommitOutcomeUnknownError(proposal.proposal_id, proposal.table_id, DELIVERY_WAIT_S, proposal.table_uri, why=why)


def proposal_producer(conf: dict[str, Any]) -> Producer:
    """The producer of proposals (a writer's own, or its host relay's): idempotent, `acks=all`, sent at once."""
    quiet = {k: v for k, v in conf.items() if k != "statistics.interval.ms"}  # statistics: the reply reader's
    return Producer({**quiet, "enable.idempotence": True, "linger.ms": 0, "acks": "all"})


#: How long a writer waits for the proposals topic on a cluster that has no deltacoord topics at all: a
#: coordinator started a moment ago creates them within a few seconds (`coordinator run &` then a write).
TOPICS_APPEAR_S = 10.0


def partition_count(client: Producer | Consumer, topic: str, servers: str, timeout_s: float = 30,
                    conf: Mapping[str, Any] | None = None) -> int:
    """How many partitions `topic` has (a clear error when it does not exist: at once when other prefixes'
    topics exist, else after TOPICS_APPEAR_S of waiting for a starting coordinator to create them; at once
    when no ACL lets this client's principal describe it: `conf` are its settings)."""
    suffix = "." + topic.rsplit(".", 1)[-1]
    give_up = time.monotonic() + TOPICS_APPEAR_S
    while True:
        md = client.list_topics(topic, timeout=timeout_s)
        t = md.topics.get(topic)
        if t is not None and t.error is None and t.partitions:
            return len(t.partitions)
        if t is not None and t.error is not None and t.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise KafkaAccessDeniedError({"bootstrap.servers": servers, **(conf or {})}, "DESCRIBE", f"topic {topic}")
        names = client.list_topics(timeout=timeout_s).topics
        prefixes = sorted(n.removesuffix(suffix) for n in names if n.endswith(suffix))
        if (prefixes and topic not in names) or time.monotonic() >= give_up:  # in names: being created
            raise TopicNotFoundError(topic, servers, prefixes)
        time.sleep(0.25)


class ReplyPartitions(Routing):
    """This process's reply partitions: the lease (group consumer, paused) and the reader (manual assignment).

    A fresh process's first commits run on the reader alone: it counts the topic's partitions and asks the
    shared partition's end before its thread polls it (a consumer nothing polls answers at once), so the first
    proposal waits for one client's connection, not three. The lease and its watermark client start
    `lease_after_s` later (or at once when `wait_leased` is asked): a process that ends sooner never joins the
    writers' group, whose other members would otherwise give up partitions to it and take them back.
    """

    def __init__(self, conf: dict[str, Any], topic: str, group_id: str, num_partitions: int | None = None, *,
                 lease_after_s: float = 0.0, count_timeout_s: float = 30.0) -> None:
        super().__init__()
        self.topic = topic
        self._group_id = group_id
        self._leased: set[int] = set()
        self._reading: set[int] = set()
        self._to_assign: list[TopicPartition] = []  # applied by the reading thread (`_assign_new`)
        self._assigned_at: dict[int, float] = {}  # when the reading thread assigned each partition
        self._live: set[int] = set()  # partitions whose end the reader reached: an answer there is read at once
        self._lease_seen = threading.Event()
        self._lease_moved = threading.Event()  # the reading thread releases idle partitions at once
        self._lease_now = threading.Event()  # start the lease before `lease_after_s` (`wait_leased`, `close`)
        self._lease_after_s = lease_after_s
        self._stop = threading.Event()
        self._rx: dict[str, int] = {}
        self._stats_lock = threading.Lock()
        stats = {"stats_cb": self._on_stats} if "statistics.interval.ms" in conf else {}
        self._reader = Consumer({
            **stats,
            **eager(conf),
            "group.id": f"deltacoord-writer-reader-{uuid.uuid4().hex[:12]}",  # never joins: assigned by hand
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
            "enable.partition.eof": True,  # says when a newly assigned partition is fetched (`_live`)
        })
        # Statistics (the bench's fetch bytes) only from the reader: building librdkafka's statistics costs
        # CPU in every client that has them, and the lease fetches nothing.
        self._quiet = {k: v for k, v in conf.items() if k != "statistics.interval.ms"}
        # End offsets are asked of a consumer no thread polls: librdkafka answers a watermark query on a
        # consumer another thread is polling late (about 1 s for a writer's first commit, minutes under load).
        # Made with the lease (`_watermarks`); until the reader's thread starts, the reader answers them.
        self._offsets: Watermarks | None = None
        self._offsets_lock = threading.Lock()
        self._lease: Consumer | None = None
        try:
            if num_partitions is None:
                # The count's metadata request also teaches the reader the topic's leaders (below).
                num_partitions = partition_count(self._reader, topic, str(conf["bootstrap.servers"]),
                                                 count_timeout_s, conf)
            else:
                # The reader learns the topic's leaders now: a partition assigned before its leader is known
                # waits for librdkafka's next periodic metadata refresh (up to a second) before its first fetch.
                with contextlib.suppress(KafkaException):
                    self._reader.list_topics(topic, timeout=10)
        except BaseException:
            with contextlib.suppress(KafkaException, RuntimeError):
                self._reader.close()
            raise
        self.num_partitions = num_partitions
        self._shared = random.randrange(num_partitions)
        with contextlib.suppress(KafkaException):  # else asked again (of the watermark client) by `expect`
            _low, high = watermarks(self._reader, TopicPartition(topic, self._shared), 10.0)
            with self._lock:  # until this writer leases a partition
                self._to_assign.append(TopicPartition(topic, self._shared, high))
                self._reading.add(self._shared)
        self._threads = [
            threading.Thread(target=self._read, name="deltacoord-replies", daemon=True),
            threading.Thread(target=self._hold_lease, name="deltacoord-reply-lease", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _watermarks(self) -> Watermarks:
        """The watermark client (made on first use)."""
        with self._offsets_lock:
            if self._offsets is None:
                self._offsets = Watermarks(read_committed(
                    self._quiet, f"deltacoord-writer-offsets-{uuid.uuid4().hex[:12]}"))
            return self._offsets

    def _on_stats(self, raw: str) -> None:
        # Runs inside a consumer's poll: never under `_lock`, which `expect` holds across broker calls.
        # Bytes received per broker connection (`brokers.*.rxbytes`; the top level has no `rxbytes`).
        # Logical brokers (the group coordinator's alias of a real one) would count a connection twice.
        doc = json.loads(raw)
        brokers = doc.get("brokers") or {}
        rx = sum(int(b.get("rxbytes", 0)) for b in brokers.values() if b.get("source") != "logical")
        with self._stats_lock:
            self._rx[str(doc.get("name"))] = rx
            self.counts.rx_bytes = sum(self._rx.values())

    # -- the lease ------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        consumer.pause(partitions)  # the lease consumer holds partitions; the reader fetches
        with self._lock:
            self._leased.update(tp.partition for tp in partitions)
        self._follow_lease()
        if self.leased():
            self._lease_seen.set()
        self._lease_moved.set()  # the shared partition, or a lower one, is no longer current

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._leased.difference_update(tp.partition for tp in partitions)
        self._follow_lease()
        self._lease_moved.set()  # stop reading what is no longer leased before another writer's answers arrive

    def _follow_lease(self) -> None:
        """Read the partition the next proposals will name before they name it. Its end is asked outside `_lock`
        (a broker round trip during which answers are routed); until it is read, `_current` names the shared
        partition, or `expect` asks for it itself."""
        with self._lock:
            target = min(self._leased) if self._leased else None
            if target is None or target in self._reading:
                return
        with contextlib.suppress(KafkaException):
            _low, high = self._watermarks().offsets(TopicPartition(self.topic, target), 5.0)
            with self._lock:
                if target not in self._reading:  # `expect` may have started it meanwhile
                    self._to_assign.append(TopicPartition(self.topic, target, high))
                    self._reading.add(target)

    def _join(self) -> Consumer | None:
        """The lease consumer, subscribed to the replies topic, and the watermark client it needs (None: closed)."""
        self._watermarks()
        lease = Consumer({
            **self._quiet,
            "group.id": self._group_id,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
        })
        lease.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke)
        with self._lock:
            stopped = self._stop.is_set()
            if not stopped:
                self._lease = lease
        if stopped:
            self._leave(lease)  # not under `_lock`, which the revocation's callback takes
            return None
        return lease

    def _hold_lease(self) -> None:
        self._lease_now.wait(self._lease_after_s)
        if self._stop.is_set():
            return
        try:
            lease = self._join()
        except (KafkaException, RuntimeError) as e:
            log.warning("cannot join the writers' group on %s (%s); sharing a reply partition", self.topic, e)
            return
        while lease is not None and not self._stop.is_set():
            try:
                lease.poll(POLL_S)  # delivers no records (paused); runs the group protocol
            except (KafkaException, RuntimeError):
                time.sleep(0.2)
        if lease is not None:  # this thread polls the lease, so it closes it, leaving the group (`close`)
            self._leave(lease)

    @staticmethod
    def _leave(lease: Consumer) -> None:
        """Give the leased partitions back while polling, then close: a revocation served inside `close` runs
        confluent-kafka's fallback `incremental_unassign` there, which librdkafka (group.protocol=consumer) can
        leave waiting for ever while it holds the GIL (seen: a test process frozen in `Consumer.close`)."""
        with contextlib.suppress(KafkaException, RuntimeError):
            lease.unsubscribe()
            deadline = time.monotonic() + LEAVE_WAIT_S
            while lease.assignment() and time.monotonic() < deadline:
                lease.poll(POLL_S)  # serves the revocation (`_on_revoke`) here, outside `close`
        with contextlib.suppress(KafkaException, RuntimeError):
            lease.close()

    def leased(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._leased)

    def reading(self) -> frozenset[int]:
        """The reply partitions the reader fetches (or is about to): the current one, and any still in use."""
        with self._lock:
            return frozenset(self._reading)

    def wait_leased(self, timeout_s: float) -> bool:
        """True once this writer holds a reply partition of its own (the lease starts now if it had not yet)."""
        self._lease_now.set()
        return self._lease_seen.wait(timeout_s) and bool(self.leased())

    # -- routing ----------------------------------------------------------------------
    def expect(self, proposal_id: str, wait: str = "published") -> Pending:
        """Register a proposal on this writer's current reply partition (read from its end from now on)."""
        with self._lock:
            partition = self._current()
            self._start_reading(partition)
            return self.register(proposal_id, partition, wait)

    def _current(self) -> int:
        """The partition the next proposal names: the lowest leased one, or the shared one until a lease came.
        While the shared one is fetched and the leased one not yet, the shared one: a partition assigned a moment
        ago is fetched only once the reader's pending fetch (up to `fetch.wait.max.ms`) returns, which a fresh
        process's first commit would wait for. The caller holds `_lock`."""
        if not self._leased:
            return self._shared
        leased = min(self._leased)
        if not self._is_live(leased) and self._is_live(self._shared):
            return self._shared
        return leased

    def _is_live(self, partition: int) -> bool:
        if partition in self._live:
            return True
        at = self._assigned_at.get(partition)
        return at is not None and time.monotonic() - at > LIVE_AFTER_S  # no end reached, as on a busy partition

    def _start_reading(self, partition: int, timeout_s: float = 30.0) -> None:
        """Have the reading thread read `partition` from its current end (the caller holds `_lock`)."""
        if partition not in self._reading:
            _low, high = self._watermarks().offsets(TopicPartition(self.topic, partition), timeout_s)
            # Every answer to a proposal produced from now on lies at a later offset, so the reader may
            # start there whenever its thread gets to it.
            self._to_assign.append(TopicPartition(self.topic, partition, high))
            self._reading.add(partition)

    def _release_idle(self) -> None:
        """Stop reading partitions no longer leased nor in use (after a lease moved, or after the shared one)."""
        with self._lock:
            in_use = {p.reply_partition for p in self._pending.values()}
            current = self._current()
            idle = [p for p in self._reading if p not in self._leased and p not in in_use and p != current]
            if idle:
                self._reader.incremental_unassign([TopicPartition(self.topic, p) for p in idle])
                self._reading.difference_update(idle)
                self._live.difference_update(idle)
                for p in idle:
                    self._assigned_at.pop(p, None)

    def _assign_new(self) -> None:
        """Start reading the partitions `expect` added. Only the reading thread calls the reader: librdkafka
        serves an assignment made while another thread polls the same consumer late (1 s, or minutes)."""
        with self._lock:
            todo, self._to_assign = self._to_assign, []
        if not todo:
            return
        try:
            self._reader.incremental_assign(todo)
        except (KafkaException, RuntimeError):
            with self._lock:
                self._to_assign[:0] = todo  # tried again on the next turn
            raise
        now = time.monotonic()
        with self._lock:
            self._assigned_at.update((tp.partition, now) for tp in todo)

    def _read(self) -> None:
        try:
            self._read_until_stopped()
        finally:  # this thread polls the reader, so it closes it (`close`)
            with contextlib.suppress(KafkaException, RuntimeError):
                self._reader.close()

    def _read_until_stopped(self) -> None:
        last_release = time.monotonic()
        while not self._stop.is_set():
            try:
                self._assign_new()
            except (KafkaException, RuntimeError):
                time.sleep(0.1)
                continue
            if self._lease_moved.is_set() or time.monotonic() - last_release > 1.0:
                last_release = time.monotonic()
                self._lease_moved.clear()
                with contextlib.suppress(KafkaException):
                    self._release_idle()
            try:
                first = self._reader.poll(POLL_S)
            except (KafkaException, RuntimeError):
                time.sleep(0.1)
                continue
            if first is None:
                continue
            for m in [first, *self._reader.consume(500, 0)]:
                err = m.error()
                if err is not None:
                    partition = m.partition()
                    if err.code() == KafkaError._PARTITION_EOF and partition is not None:
                        with self._lock:
                            self._live.add(partition)
                    elif err.code() != KafkaError._PARTITION_EOF:
                        time.sleep(0.1)
                    continue
                partition = m.partition()
                if partition is not None and partition not in self._live:
                    with self._lock:  # a record fetched from it: answers there are read at once, as after its end
                        self._live.add(partition)
                self.route(m)

    def close(self) -> None:
        """Stop the threads, which close the consumers they poll as they leave: librdkafka's close of a consumer
        another thread is still polling can block for ever (a test process hung in it for minutes when the
        threads were given 5 s and their consumers closed from here regardless)."""
        with self._lock:
            self._stop.set()
        self._lease_now.set()
        for t in self._threads:
            t.join(CLOSE_WAIT_S)
            if t.is_alive():
                log.warning("the reply thread %s did not stop within %.0fs; its consumer is closed when it does",
                            t.name, CLOSE_WAIT_S)
        if self._offsets is not None:  # polled by no thread
            with contextlib.suppress(KafkaException, RuntimeError):
                self._offsets.close()


#: Delivery errors that mean the broker never wrote the proposal (not a timeout, whose message may
#: still be written): the proposal cannot commit.
NOT_WRITTEN = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION, KafkaError.INVALID_RECORD, KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError._INVALID_ARG,
})


class CoordinatorClient:
    """Send proposals to the coordinator and wait for decisions (and publication) on this writer's reply partition.

    `reply_group` names the consumer group whose members lease the replies topic's partitions
    (default `deltacoord-writer-<replies topic>`, inside the writers' ACL group prefix); writers with a different group id share nothing but may
    collide on partitions, so keep one group per deployment.

    `bootstrap_servers` defaults to DELTACOORD_BOOTSTRAP_SERVERS and `topic_prefix` to DELTACOORD_TOPIC_PREFIX
    (else `deltacoord`); `topics=` names the topics one by one instead. Before proposing, the client checks that a
    live coordinator of the consumer group `coordinator_group` (default DELTACOORD_GROUP_ID, else
    `<prefix>-coordinator`) holds the table's partition (`deltacoord.writer.serving`); `coordinator_check=False` (or
    DELTACOORD_COORDINATOR_CHECK=0) turns that off, for coordinators given a static partition list.

    `relay` (default DELTACOORD_RELAY; `""` for none) is the Unix socket of the host's relay (`deltacoord.writer.relay`):
    proposals go to it and it forwards this client's answers, so the client runs no producer or reply consumer.
    """

    def __init__(self, bootstrap_servers: str | None = None, *, topics: Topics | None = None,
                 topic_prefix: str | None = None, reply_group: str | None = None, coordinator_group: str | None = None,
                 coordinator_check: bool | None = None, relay: str | None = None, **kafka_config: Any) -> None:
        check_kafka_keywords(CoordinatorClient.__init__, kafka_config)
        self.topics = client_settings.topics_of(topic_prefix, topics)
        servers = client_settings.bootstrap_servers(bootstrap_servers)
        self._conf: dict[str, Any] = kafka_logs.kafka_config({"bootstrap.servers": servers,
                                                             "reconnect.backoff.ms": RECONNECT_BACKOFF_MS,
                                                             **kafka_config})
        self.coordinator_check = CoordinatorCheck(eager(self._conf), self.topics,
                                                  client_settings.coordinator_group(coordinator_group, self.topics),
                                                  enabled=client_settings.coordinator_check(coordinator_check))
        #: The host relay's socket (`deltacoord.writer.relay`): proposals and answers go through it, not this process's clients.
        self.relay = client_settings.relay(relay)
        self._producer = None if self.relay else proposal_producer(eager(self._conf))
        self._lock = threading.Lock()
        self._num_partitions: int | None = None
        self._reply_group = reply_group or f"deltacoord-writer-{self.topics.replies}"
        self._replies_: ReplyPartitions | RelayLink | None = None
        self._making_replies = threading.Lock()
        self._closed = False
        self._warmed = threading.Event()
        # Ask what a first commit needs now, in the background (`_lease_early`).
        threading.Thread(target=self._lease_early, name="deltacoord-reply-start", daemon=True).start()

    def _lease_early(self) -> None:
        # What a first commit asks Kafka, asked now and side by side (each is mostly a wait on the broker, and a
        # fresh process's first commit would otherwise wait for their sum): whether a broker answers at all, the
        # proposals topic's partitions, whether live coordinators hold them, and the reply partitions (their
        # reader; the lease follows later, `ReplyPartitions`). `_warmed` (which the first commit waits for rather than asking again) is
        # set once the partitions and the coordinator question are answered, or as soon as the probe finds no
        # broker answering. No broker or topics yet: asked again (and reported) by the first proposal.
        checked = threading.Event()
        counted = threading.Event()

        def check() -> None:
            try:
                with contextlib.suppress(Exception):
                    self.coordinator_check.warm()
            finally:
                checked.set()
                answered.set()

        def count() -> None:
            try:
                with contextlib.suppress(Exception):
                    self._num_partitions = self._partition_count(self.topics.proposals, timeout_s=10)
            finally:
                counted.set()
                answered.set()
            with contextlib.suppress(Exception):
                self._start_producer_id()

        def replies() -> None:
            with contextlib.suppress(Exception):
                self._replies(timeout_s=10)

        def probe() -> None:
            if counted.wait(PROBE_AFTER_S):
                return  # the partition count answered: so does Kafka, and no probe client need start
            try:
                kafka_logs.probe(self._conf)  # nothing answering: the first commit says so at once
            except Exception:
                unreachable.set()
                answered.set()

        unreachable = threading.Event()
        answered = threading.Event()  # set by each question as it is answered
        threading.Thread(target=check, name="deltacoord-check-start", daemon=True).start()
        try:
            if not self.relay and self._num_partitions is None:
                threading.Thread(target=count, name="deltacoord-count-start", daemon=True).start()
                threading.Thread(target=replies, name="deltacoord-reply-lease-start", daemon=True).start()
                threading.Thread(target=probe, name="deltacoord-probe-start", daemon=True).start()
            else:
                counted.set()
            # The count and the check answered say that Kafka answers: the probe is for when they do not.
            deadline = time.monotonic() + WARM_WAIT_S
            while not unreachable.is_set() and not (counted.is_set() and checked.is_set()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                answered.wait(left)
                answered.clear()
        finally:
            self._warmed.set()
        if self.relay:
            replies()

    def _start_producer_id(self) -> None:
        """Have the idempotent producer ask for its producer id now, not half a second or a second later.

        librdkafka asks for it when a metadata answer arrives from a broker it stays connected to, else on a 500 ms
        timer. A fresh producer's first answers often come on its bootstrap connection, which it drops once it
        learns the brokers' ids, and (sparse connections) nothing connects it to a broker until that timer fires:
        the first proposal then waited 0.5 s or 1 s (4 of 25 fresh processes on a loaded machine). One more
        metadata request, sent after the first was answered, connects to a broker that stays, and its answer
        starts the request (a round trip in the background when the id is already there)."""
        assert self._producer is not None
        self._producer.list_topics(self.topics.proposals, timeout=10)

    def _partition_count(self, topic: str, timeout_s: float = 30) -> int:
        assert self._producer is not None
        return partition_count(self._producer, topic, str(self._conf["bootstrap.servers"]), timeout_s, self._conf)

    def partition_of(self, table_id: str) -> int:
        if self._num_partitions is None:
            if self.relay:
                self._num_partitions = self._link().partitions
            else:
                # Brokers that do not answer fail in seconds with one line, not after the metadata timeout.
                kafka_logs.probe(self._conf)
                self._num_partitions = self._partition_count(self.topics.proposals)
        return partition_for(table_id, self._num_partitions)

    def _link(self) -> RelayLink:
        """The connection to the host's relay, opened again if the relay went away (RelayUnavailableError if none answers)."""
        assert self.relay is not None
        with self._lock:
            if self._closed:
                raise ClientClosedError("the coordinator client is closed")
            link = self._replies_
            if isinstance(link, RelayLink) and not link.closed.is_set():
                return link
            # Answers still due to the old connection are looked for in the commits topic (`decided`).
            self._replies_ = link = RelayLink(self.relay, self.topics)
            return link

    def _replies(self, timeout_s: float = 30) -> ReplyPartitions | RelayLink:
        if self.relay:
            return self._link()
        with self._lock:
            if self._replies_ is not None:
                return self._replies_
        with self._making_replies:  # one at a time: a first commit waits for the one the start-up is making
            with self._lock:
                if self._replies_ is not None:
                    return self._replies_
                if self._closed:
                    raise ClientClosedError("the coordinator client is closed")
            # Broker round trips: not under `_lock`, which `close` and `forget` take.
            made = ReplyPartitions(self._conf, self.topics.replies, self._reply_group, lease_after_s=LEASE_AFTER_S,
                                   count_timeout_s=timeout_s)
            with self._lock:
                if not self._closed:
                    self._replies_ = made
                    return made
            made.close()
            raise ClientClosedError("the coordinator client is closed")

    @property
    def reply_counts(self) -> ReplyCounts:
        """Records this writer's reply consumer fetched, and how many answered other writers' proposals."""
        return self._replies().counts

    def wait_leased(self, timeout_s: float = 30.0) -> bool:
        """Block until this writer holds a reply partition of its own (False on timeout: it shares one)."""
        return self._replies().wait_leased(timeout_s)

    def ensure_coordinator(self, table_id: str) -> None:
        """Raise NoCoordinatorError unless a live coordinator holds `table_id`'s proposals partition (cached, see
        `deltacoord.writer.serving`); writers call it before staging, so a commit without a coordinator fails before any work."""
        try:
            self._serving_partition(table_id)
        except KafkaException as e:  # brokers stopped or moving: a write that stages nothing and sends nothing
            raise ProposalNotSentError(f"nothing was sent for table {table_id}: Kafka did not answer "
                                       f"({e.args[0] if e.args else e}); a retry is safe") from e

    def _serving_partition(self, table_id: str) -> int:
        """`table_id`'s proposals partition, once a coordinator is known to serve it (NoCoordinatorError otherwise;
        a KafkaException when Kafka does not answer: each caller says what was not sent)."""
        self._warmed.wait(WARM_WAIT_S)  # the start-up questions being asked answer this one's too
        partition = self.partition_of(table_id)
        self.coordinator_check.ensure(partition)
        return partition

    def ratified_source(self, table_id: str) -> RatifiedSource:
        """Where a reader finds `table_id`'s ratified but unpublished versions (this client's Kafka and topics)."""
        conf = {k: v for k, v in self._conf.items() if k != "bootstrap.servers"}
        return RatifiedSource(str(self._conf["bootstrap.servers"]), table_id, self.topics, conf)

    def expect(self, proposal_id: str, wait: str = "published") -> Pending:
        """Wait for answers to a proposal produced elsewhere: produce it with the result's `headers`."""
        if self.relay:
            raise ValueError("expect() needs this process's own reply partition: a proposal produced outside the client "
                             "cannot be routed through the relay; use a client made with relay=''")
        return self._replies().expect(proposal_id, check_wait(wait))

    def propose_transaction(self, proposal: Proposal, key: WriterKey | None = None,
                            wait: str = "published") -> list[Pending]:
        """Produce a multi-table transaction's one message (`proposal` carries every part); one pending per part,
        in order, each resolving with its part's decision (and publication)."""
        if self.relay:
            raise ValueError("a multi-table transaction is answered part by part on this process's own reply "
                             "partition: use a client made with relay=''")
        others = proposal.parts[1:]
        try:
            replies = self._replies()
            pendings = [replies.expect(q.proposal_id, check_wait(wait)) for q in others]
        except KafkaException as e:
            raise ProposalNotSentError(f"multi-table proposal {proposal.proposal_id} was not sent: Kafka did not answer "
                                       f"({e.args[0] if e.args else e}); nothing can commit, a retry is safe") from e
        try:
            first = self.propose(proposal, key=key, wait=wait)
        except BaseException as e:
            if isinstance(e, ProposalNotSentError):
                for q in others:
                    replies.forget(q.proposal_id)
            raise
        return [first, *pendings]

    def propose(self, proposal: Proposal, key: WriterKey | None = None, wait: str = "published",
                control: str | None = None) -> Pending:
        """Produce the proposal (signed with `key` when given); the result's futures resolve with its decision
        and (`wait="published"`) its publication. `control` (`adopt`, `release`) makes it that request instead
        of a commit (`deltacoord.schemas.routing.CONTROL_ADOPT`)."""
        try:
            partition = self._serving_partition(proposal.table_id)  # NoCoordinatorError (nothing sent) when none
            replies = self._replies()
            pending = replies.expect(proposal.proposal_id, check_wait(wait))
        except KafkaException as e:  # a broker that does not answer, before anything was sent
            raise ProposalNotSentError(f"proposal {proposal.proposal_id} was not sent: Kafka did not answer "
                                       f"({e.args[0] if e.args else e}); nothing can commit, a retry is safe") from e
        if isinstance(replies, RelayLink):
            return self._propose_relayed(replies, pending, proposal, partition, key, control)
        producer = self._producer
        assert producer is not None  # a client without a relay has its own
        delivery: Future[None] = Future()

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                delivery.set_result(None)
            elif err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                delivery.set_exception(KafkaAccessDeniedError(self._conf, "WRITE", f"topic {self.topics.proposals}"))
            elif err.code() in NOT_WRITTEN:
                delivery.set_exception(ProposalNotSentError(f"proposal {proposal.proposal_id} was refused by Kafka: {err}"))
            else:
                delivery.set_exception(ProposalUnconfirmedError(f"proposal {proposal.proposal_id} was not delivered: {err}"))

        try:
            value, headers = self._proposal_record(proposal, pending, key, control)
            pending.sent_at = time.time()
            producer.produce(
                self.topics.proposals, value=value, key=proposal.table_id.encode(), partition=partition, headers=headers,
                on_delivery=on_delivery,
            )
        except (EncodeError, BufferError, KafkaException, ValueError) as e:  # refused before anything was sent
            replies.forget(proposal.proposal_id)
            raise ProposalNotSentError(f"proposal {proposal.proposal_id} could not be produced: {e}") from e
        flush_deliveries(producer, DELIVERY_WAIT_S)  # a Ctrl-C: KeyboardInterrupt, the proposal may be sent
        pending.produced_at = time.time()
        try:
            delivery.result(0)
        except Exception as e:
            replies.forget(proposal.proposal_id)
            raise _unconfirmed(proposal, e) from e
        return pending

    def _propose_relayed(self, link: RelayLink, pending: Pending, proposal: Proposal, partition: int,
                         key: WriterKey | None, control: str | None) -> Pending:
        """`propose` through the host's relay: it produces the proposal with its own reply partition."""
        try:
            value, headers = self._proposal_record(proposal, pending, key, control)
        except (EncodeError, ValueError) as e:
            link.forget(proposal.proposal_id)
            raise ProposalNotSentError(f"proposal {proposal.proposal_id} could not be produced: {e}") from e
        pending.sent_at = time.time()
        try:
            delivery = link.produce(proposal.proposal_id, self.topics.proposals, partition, proposal.table_id.encode(),
                                    value, headers)
        except ProposalNotSentError:
            link.forget(proposal.proposal_id)
            raise
        try:
            delivery.result(DELIVERY_WAIT_S)
        except Exception as e:
            link.forget(proposal.proposal_id)
            raise _unconfirmed(proposal, e) from e
        pending.produced_at = time.time()
        return pending

    @staticmethod
    def _proposal_record(proposal: Proposal, pending: Pending, key: WriterKey | None,
                         control: str | None) -> tuple[bytes, list[tuple[str, str | bytes | None]]]:
        """The proposal's value and headers (signed with `key` when given)."""
        value = encode_proposal(proposal)
        headers: list[tuple[str, str | bytes | None]] = [(H_PROPOSAL_ID, proposal.proposal_id.encode()),
                                                         (H_TABLE_ID, proposal.table_id.encode()),
                                                         *pending.headers]
        if control is not None:
            headers.append((H_CONTROL, control.encode()))
        if key is not None:
            if proposal.writer != key.name:
                raise ValueError(f"proposal {proposal.proposal_id} declares writer {proposal.writer!r} but would be "
                                 f"signed by key {key.name!r}: the coordinator requires them to match")
            headers += [(H_SIGNER, key.name.encode()), (H_SIGNATURE, key.sign(value))]
        return value, headers

    def decided(self, pending: Pending, table_id: str, timeout_s: float, table_uri: str | None = None) -> Decision:
        """The decision of a proposed `pending`: its reply, or (none within REPLY_WAIT_S) the decision found in
        the commits topic; CommitOutcomeUnknownError (naming `table_uri` in its lookup hint) if neither has it
        within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        wait_s = REPLY_WAIT_S
        while True:
            try:
                d = pending.decision.result(max(0.0, min(wait_s, deadline - time.monotonic())))
            except TimeoutError:
                pass
            else:
                if pending.replied_at:  # a coordinator answered: its partition is served
                    self.coordinator_check.served(self.partition_of(table_id))
                return d
            # No reply yet: the decision may be recorded all the same (the source of truth is the commits topic).
            remaining = deadline - time.monotonic()
            try:
                found = self.lookup_decision(table_id, pending.proposal_id, timeout_s=max(1.0, min(30.0, remaining)),
                                             since_ms=pending.proposed_ms - CLOCK_SKEW_MS)
            except (KafkaException, RuntimeError) as e:  # brokers down or moving: looked for again, or unknown
                log.info("looking up proposal %s on the commits topic failed (%s); waiting on", pending.proposal_id, e)
                found = None
            if found is not None:
                if not pending.decision.done():
                    with contextlib.suppress(InvalidStateError):  # a reply that raced the scan says the same
                        pending.decision.set_result(found)
                return found
            if time.monotonic() >= deadline:
                self.forget(pending.proposal_id)
                raise CommitOutcomeUnknownError(pending.proposal_id, table_id, timeout_s, table_uri) from None
            wait_s = min(wait_s * 2, 30.0)

    def forget(self, proposal_id: str) -> None:
        """Stop waiting for any answer to `proposal_id` (never opens a connection: a relay that went away has
        nothing to forget)."""
        with self._lock:
            replies = self._replies_
        if replies is not None:
            replies.forget(proposal_id)

    def commit(self, proposal: Proposal, timeout_s: float = 60.0, key: WriterKey | None = None) -> Decision:
        """Propose (signed with `key` when given) and wait for the decision (ratification only).
        Raises CommitOutcomeUnknownError if no decision arrives in time."""
        pending = self.propose(proposal, key, wait="ratified")
        d = self.decided(pending, proposal.table_id, timeout_s, proposal.table_uri)
        self.forget(proposal.proposal_id)
        return d

    def lookup_decision(self, table_id: str, proposal_id: str, timeout_s: float = 30.0,
                        since_ms: int | None = None) -> Decision | None:
        """Scan the table's commits partition for a proposal's decision (after an unknown outcome), from its
        start or from the first record at or after `since_ms` (ms since the epoch)."""
        conf = {k: v for k, v in self._conf.items() if k != "statistics.interval.ms"}
        want = {proposal_id.encode()}
        try:
            with PartitionScan(read_committed(conf, "deltacoord-lookup"), self.topics.commits,
                               self.partition_of(table_id), since_ms=since_ms, headers={H_PROPOSAL_ID: want},
                               budget_s=timeout_s, deadline_s=timeout_s) as scan:
                for m in scan:
                    value = m.value()
                    if value is not None:
                        return decode_decision(value)
        except ScanIncompleteError:
            pass  # not read to its end in time: not found yet
        return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            replies, self._replies_ = self._replies_, None
        if replies is not None:
            replies.close()
        self.coordinator_check.close()
        if self._producer is not None:
            # A producer failed fatally (e.g. no ACL lets its principal get a producer id) has nothing to deliver, and
            # its error already reached the operation that failed: closing must not hide that error with its own.
            with contextlib.suppress(KafkaException):
                self._producer.flush(10)
