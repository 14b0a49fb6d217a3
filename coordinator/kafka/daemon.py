"""A coordinator process: partition loops, the publisher, checkpoints, metrics and signals."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from deltacoord.coordinator.delta_log.adoption import StateLoader
from deltacoord.coordinator.delta_log.checkpoint_worker import (
    CheckpointFailedError,
    CheckpointWorker,
    CheckpointWorkerError,
)
from deltacoord.coordinator.delta_log.publisher import Publisher, PublishTask
from deltacoord.coordinator.kafka.batch_transaction import FencedError
from deltacoord.coordinator.kafka.notices import PublicationNotices
from deltacoord.coordinator.kafka.partition import PartitionCoordinator, make_consumer
from deltacoord.coordinator.kafka.reachability import KafkaReachability
from deltacoord.coordinator.kafka.stability import StableOffsets
from deltacoord.coordinator.kafka.topics import ensure_topics
from deltacoord.coordinator.locations import TableLocationError
from deltacoord.coordinator.metrics import Metrics, MetricsServer
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import checkpoint_exists, newest_commit_version
from deltacoord.schemas.actions import Action, Metadata
from deltacoord.schemas.properties import TableProperties
from deltacoord.storage.table import StorageError, TableStorage

log = logging.getLogger(__name__)

#: Writes the checkpoint of (table storage, version); returns nothing, raises on failure.
CheckpointFn = Callable[[TableStorage, int], object]

#: `run()` exit codes: stopped on request, fenced by a newer coordinator, stopped by an error,
#: stopped on request with ratified versions not in `_delta_log` (the next owner publishes them).
#: (4 is the watchdog's `os._exit`.)
EXIT_OK, EXIT_FENCED, EXIT_ERROR, EXIT_UNPUBLISHED = 0, 3, 5, 6
#: Kafka errors of a cluster too slow or busy to answer a startup request in time: asked again.
_SLOW_KAFKA = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                         KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_CONTROLLER, KafkaError.LEADER_NOT_AVAILABLE,
                         KafkaError.UNKNOWN_TOPIC_OR_PART})

#: How long a stopping coordinator goes on writing the checkpoints due (the newest per table) before it leaves
#: the rest to the next checkpoint interval: a checkpoint speeds readers up and is never needed for correctness,
#: and supervisors kill a process that outlives its grace period (Kubernetes: 30 s). Eight tables on a store
#: with 60 ms round trips took over a minute to checkpoint, and the stop waited for all of them.
STOP_CHECKPOINTS_S = 10.0
#: How long fetched proposals of tables whose stores lag wait for one of them to publish (see `_linger`).
LINGER_MAX_S = 0.2
#: How often a lingering batch looks at the lanes (and takes what arrived) while it waits.
LINGER_POLL_S = 0.005


@dataclass
class _CheckpointRequest:
    table_id: str
    table_uri: str
    version: int


@dataclass
class Coordinator:
    """Runs one `PartitionCoordinator` per owned proposals partition in a single deciding thread."""

    settings: CoordinatorSettings
    partitions: Sequence[int] | None = None
    num_partitions: int = 1
    metrics_port: int | None = None
    publish_fsync: bool = True
    checkpoint_fn: CheckpointFn | None = None
    #: Exit the process (code 4) when the deciding loop makes no progress this long;
    #: None disables it (in-process use). A supervisor restarts the coordinator,
    #: and fencing plus recovery make that restart safe.
    watchdog_s: float | None = None
    #: How long a stop waits for queued versions to reach `_delta_log`.
    publish_drain_s: float = 60.0
    metrics: Metrics = field(default_factory=Metrics)
    stop_event: threading.Event = field(default_factory=threading.Event)
    #: See `STOP_CHECKPOINTS_S`.
    stop_checkpoints_s: float = STOP_CHECKPOINTS_S
    fenced: bool = False
    #: True once the coordinator owns its partitions with their state rebuilt (in group mode:
    #: after its first assignment, with every assigned partition recovered).
    ready: bool = False
    #: Ratified versions a stopped coordinator left unpublished: table id -> (published, ratified).
    unpublished: dict[str, tuple[int, int]] = field(default_factory=dict)
    _workers: dict[int, PartitionCoordinator] = field(default_factory=dict)
    _recovering: list[int] = field(default_factory=list)
    _leaving: bool = False
    _num_partitions: int = 0
    _last_loop: float = 0.0
    _ckpt_q: queue.Queue[_CheckpointRequest | None] = field(default_factory=queue.Queue)
    _stopping_since: float | None = None
    _server: MetricsServer | None = None
    _notices: PublicationNotices | None = None
    #: Whether the proposals consumer reaches a broker (its statistics and errors), for `/healthz`.
    kafka_reachability: KafkaReachability = field(default_factory=KafkaReachability)

    def __post_init__(self) -> None:
        self.locations = self.settings.locations(fsync=self.publish_fsync)
        self.publisher = Publisher(fsync=self.publish_fsync, on_published=self._on_published,
                                   on_unpublished=self._on_unpublished, locations=self.locations,
                                   on_halted=self._on_halted, lanes=self.settings.publish_lanes)
        #: The process's one record of halts: the publisher, the checkpoint thread and the partition loops halt
        #: tables through it, the partition loops record them on the commits topic, `/healthz` and metrics read it.
        self.halts = self.publisher.halts
        self.metrics.watch_tables(self.publisher.table_gauges)

    def _on_unpublished(self, task: PublishTask, why: str) -> None:
        if self._notices is not None:
            self._notices.unpublished(task.table_id, task.version, why)

    # -- halts (in force at once, recorded by the deciding thread) ---------------------
    def _on_halted(self, table_id: str, table_uri: str, why: str) -> None:
        self.metrics.halted_tables.set(self.halts.count())

    def _record_halts(self) -> None:
        """Have the owning partitions record the halts not yet on the commits topic (from the publisher and
        checkpoint threads); a halt of a table no partition here owns is left to its owner, which finds its cause."""
        workers = list(self._workers.values())
        for h in self.halts.unrecorded():
            if not any(w.owns(h.table_id) for w in workers):
                self.halts.drop_unrecorded(h.table_id)
        for w in workers:
            w.flush_controls()

    def _record_halts_at_stop(self) -> None:
        try:
            self._record_halts()
        except FencedError as e:
            log.error("fenced while recording halts at stop: %s", e)
        except Exception:
            log.exception("recording halts at stop failed: the next owner of their partitions does not know of them")

    # -- checkpoints (never on the deciding thread) -------------------------------
    def _on_published(self, table_id: str, table_uri: str, version: int, actions: Sequence[Action], count: int) -> None:
        if self._notices is not None:
            self._notices.published(table_id, version)  # first: a writer waits on it
        md = next((a for a in actions if isinstance(a, Metadata)), None) or self._metadata_of(table_id)
        interval = TableProperties.of(md).checkpoint_interval
        large = 0 < self.settings.checkpoint_after_actions <= count
        if self.checkpoint_fn is not None and version > 0 and (version % interval == 0 or large):
            self._ckpt_q.put(_CheckpointRequest(table_id, table_uri, version))
        self.metrics.publish_lag.set(self.publisher.lag())
        self.metrics.halted_tables.set(self.publisher.halted_count())

    def _metadata_of(self, table_id: str) -> Metadata | None:
        """The table's current metadata from the owning partition's state (read from the publisher thread)."""
        for w in list(self._workers.values()):
            st = w.states.get(table_id)
            if st is not None:
                return st.metadata
        return None

    def _checkpoint_loop(self) -> None:
        spacing = self.settings.checkpoint_min_interval_s
        last_round = -spacing
        while True:
            first = self._ckpt_q.get()
            if first is None:
                return
            # At most one round of checkpoints per `checkpoint_min_seconds`: the requests met while waiting
            # are coalesced to each table's newest version (a stop cuts the wait short).
            wait = last_round + spacing - time.monotonic()
            if wait > 0:
                self.stop_event.wait(wait)
            last_round = time.monotonic()
            pending = self._coalesce(first)
            for i, req in enumerate(pending):
                if req is None:
                    return
                if self._stop_checkpoints_over():
                    left = [r for r in pending[i:] if r is not None]
                    log.info("stopping: %d due checkpoint(s) left to the next checkpoint interval (%s)", len(left),
                             ", ".join(f"{r.table_uri}@{r.version}" for r in left))
                    return
                self._checkpoint(req)

    def _stop_checkpoints_over(self) -> bool:
        """Whether a stop began more than `STOP_CHECKPOINTS_S` ago (the checkpoint thread's clock of it)."""
        if not self.stop_event.is_set():
            return False
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()
        return time.monotonic() - self._stopping_since > self.stop_checkpoints_s

    def _coalesce(self, first: _CheckpointRequest) -> list[_CheckpointRequest | None]:
        """Pending requests, keeping only the newest version per table.

        When checkpoints fall behind the commit rate, writing the older ones
        would only add work: readers start from the newest checkpoint anyway.
        A stop request (None) stays last.
        """
        newest: dict[str, _CheckpointRequest] = {first.table_id: first}
        stop = False
        while True:
            try:
                req = self._ckpt_q.get_nowait()
            except queue.Empty:
                break
            if req is None:
                stop = True
                break
            cur = newest.get(req.table_id)
            if cur is None or req.version > cur.version:
                newest[req.table_id] = req
        out: list[_CheckpointRequest | None] = list(newest.values())
        return [*out, None] if stop else out

    def _checkpoint(self, req: _CheckpointRequest) -> None:
        assert self.checkpoint_fn is not None
        t0 = time.monotonic()
        try:
            self.checkpoint_fn(self.locations.storage(req.table_uri), req.version)
            self.metrics.checkpoint_duration.observe(time.monotonic() - t0)
        except (OSError, StorageError) as e:  # transient: the next checkpoint of the table tries again
            log.warning("checkpoint of %s at version %d failed: %s", req.table_uri, req.version, e)
        except CheckpointWorkerError as e:
            if not isinstance(e, CheckpointFailedError):  # the worker died or hung: not this table's fault
                log.error("checkpoint of %s at version %d failed: %s", req.table_uri, req.version, e)
                return
            self.publisher.halt(req.table_id, req.table_uri, f"the checkpoint of version {req.version} failed: {e}")
        except Exception as e:  # a fault of this code on this table: halt it, the others go on
            log.exception("checkpoint of %s at version %d failed", req.table_uri, req.version)
            self.publisher.halt(req.table_id, req.table_uri,
                                f"the checkpoint of version {req.version} failed unexpectedly ({type(e).__name__}: {e})")

    # -- liveness ---------------------------------------------------------------------
    def heartbeat(self) -> None:
        self._last_loop = time.monotonic()

    def _watchdog(self) -> None:
        assert self.watchdog_s is not None
        while not self.stop_event.wait(min(5.0, self.watchdog_s / 4)):
            if self._last_loop and time.monotonic() - self._last_loop > self.watchdog_s:
                # The loop thread may be stuck inside librdkafka (seen after a broker restart:
                # send_offsets_to_transaction ignoring its timeout), so only a process exit frees it.
                log.critical("no progress for %.0fs; exiting so the supervisor restarts this coordinator", self.watchdog_s)
                logging.shutdown()
                os._exit(4)

    # -- health --------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, object]]:
        """(ok, detail): ok once every owned partition is recovered, while the loop runs, decisions do not
        stall, every table publishes and Kafka is reached; `reasons` says why not.

        `live` leaves out what a restart does not cure (a table's store failing, Kafka unreachable): those
        make the coordinator not ready (`/healthz` 503) but still live (`/livez` 200)."""
        now = time.monotonic()
        stale = now - self._last_loop if self._last_loop else None
        reasons: list[str] = []
        if self.fenced:
            reasons.append("fenced: another coordinator owns a partition this one had")
        if self._recovering:
            reasons.append(f"recovering partitions {sorted(self._recovering)} from the commits topic")
        elif not self.ready:
            reasons.append("starting: not yet owning partitions (joining the consumer group or recovering)")
        if stale is None or stale >= 30:
            reasons.append(f"the deciding loop has not run for {stale or 0:.0f}s")
        for w in list(self._workers.values()):
            why = w.stalled(now)
            if why is not None:
                reasons.append(f"decisions stalled: {why}")
        unstable = self.publisher.unstable_for(now)
        if unstable is not None and unstable[2] > self.settings.stall_timeout_s:
            reasons.append(f"publication stalled: offset {unstable[1]} of commits partition {unstable[0]} was committed "
                           f"{unstable[2]:.0f}s ago and Kafka still hides it from read_committed readers")
        live = not reasons
        failing = self.publisher.failing(self.settings.publish_failing_s, now)
        for f in failing:
            reasons.append(f"publication failing: table {f.table_id} ({f.table_uri}) could not publish version "
                           f"{f.version} for {f.seconds:.0f}s: " + (f.error or "the store has not answered"))
        unreachable = self.kafka_reachability.unreachable_for(now)
        if unreachable is not None and unreachable[0] > self.settings.kafka_unreachable_s:
            reasons.append(f"Kafka unreachable: no broker connection for {unreachable[0]:.0f}s ({unreachable[1]})")
        halted = self.halts.tables()
        # A hold is progress, not a stall: shown, never a reason (`deltacoord.coordinator.kafka.holds`).
        holds = {str(p): d for p, w in list(self._workers.items()) if (d := w.holds.describe(now)) is not None}
        detail: dict[str, object] = {
            "ready": self.ready and not self._recovering and not failing
            and (unreachable is None or unreachable[0] <= self.settings.kafka_unreachable_s),
            "live": live, "fenced": self.fenced, "partitions": sorted(self._workers),
            "publish_lag": self.publisher.lag(), "halted_tables": halted, "holds": holds,
            "publish_failing": {f.table_id: {"uri": f.table_uri, "version": f.version, "seconds": round(f.seconds, 1),
                                             "error": f.error} for f in failing},
        }
        if reasons:
            detail["reasons"] = reasons
        return not reasons, detail

    def _linger(self, consumer: Consumer, msgs: list[Message]) -> tuple[list[Message], frozenset[str]]:
        """Group commit at the store's pace: while every table the fetched proposals name (their keys) coalesces
        (`deltacoord.coalesce`) and is paced by its lane (`Publisher.paced`: a version decided now would only wait
        behind the one in flight), they wait (at most `LINGER_MAX_S`), and what arrived meanwhile joins them, to
        share the next version (`deltacoord.coordinator.rules.coalesce`). They are decided once that version,
        decided now, would reach the lane about as the one in flight lands: its Kafka transaction overlaps the
        PUT in flight, and nothing queues behind it. A lane idle (light load), or a table that does not
        coalesce: decided at once, as always; a proposal of such a table arriving meanwhile ends the wait, so a
        slow store never delays another table. Returns the messages and the tables whose proposals waited."""
        s = self.settings
        tables: set[str] = set()
        waiting = msgs
        held: frozenset[str] = frozenset()
        deadline = time.monotonic() + LINGER_MAX_S
        while len(msgs) < s.max_batch:
            for m in waiting:
                key = m.key() if m.error() is None else None
                if not key:
                    return msgs, held
                tables.add(key.decode("utf-8", errors="replace"))
            if self.publisher.paced(tables) != tables or not all(self._coalesces(t) for t in tables):
                return msgs, held  # a lane has room (or a table does not coalesce): decide now
            held = frozenset(tables)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return msgs, held
            waiting = consumer.consume(s.max_batch - len(msgs), min(remaining, LINGER_POLL_S))
            msgs = [*msgs, *waiting]
        return msgs, held

    def _coalesces(self, table_id: str) -> bool:
        for w in self._workers.values():
            st = w.states.get(table_id)
            if st is not None:
                return TableProperties.of(st.metadata).coalesce and not TableProperties.of(st.metadata).maxcompute
        return False

    def wait_published(self, timeout_s: float = 30.0) -> bool:
        """Block until every version this coordinator decided is in `_delta_log` (or its table is halted).

        Waits on the deciding state, not on the publisher's queue: a writer can
        read its decision before the coordinator hands the version to the
        publisher, so an idle publisher alone does not mean that version is out.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                decided = {tid: st.version for w in list(self._workers.values()) for tid, st in list(w.states.items())}
            except RuntimeError:  # a table appeared while reading; read again
                continue
            if not self.publisher.behind(decided):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    # -- partitions ------------------------------------------------------------------
    def _take(self, consumer: Consumer, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        """Own these partitions: fence their previous owner, rebuild their tables, resume at committed offsets."""
        out = []
        self._recovering = sorted(tp.partition for tp in partitions)
        try:
            for tp in partitions:
                w = PartitionCoordinator(self.settings, tp.partition, self.publisher, self.metrics, consumer, self.heartbeat,
                                         num_partitions=self._num_partitions, notices=self._notices,
                                         load_state=self._state_loader())
                start = w.start()
                self._workers[tp.partition] = w
                self._schedule_missing_checkpoints(w)
                out.append(TopicPartition(tp.topic, tp.partition, start))
                self._recovering = [p for p in self._recovering if p != tp.partition]
        finally:
            self._recovering = []
        log.info("owning partitions %s", sorted(self._workers))
        return out

    def _state_loader(self) -> StateLoader | None:
        """Where adoption reads a table's published state: in the checkpoint worker, which already holds Arrow
        (the deciding process never imports it); None (in this process) without a worker."""
        return self.checkpoint_fn.load_state if isinstance(self.checkpoint_fn, CheckpointWorker) else None

    def _schedule_missing_checkpoints(self, w: PartitionCoordinator) -> None:
        """After a crash the newest due checkpoint may be missing (publication got ahead of it): write it."""
        if self.checkpoint_fn is None:
            return
        for table_id, st in w.states.items():
            if st.metadata is None:
                continue
            interval = TableProperties.of(st.metadata).checkpoint_interval
            try:
                storage = self.locations.storage(st.table_uri)
                published = newest_commit_version(storage)
                due = published - published % interval
                missing = due > 0 and not checkpoint_exists(storage, due)
            except (TableLocationError, ValueError, OSError, StorageError) as e:  # the publisher halts a table it cannot reach
                log.warning("cannot look for a missing checkpoint of %s: %s", st.table_uri, e)
                continue
            if missing:
                self._ckpt_q.put(_CheckpointRequest(table_id, st.table_uri, due))

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(self._take(consumer, partitions))
        if not self.ready:
            self.ready = True
            log.info("coordinator ready on %s (group), owning partitions %s", self.settings.topics.proposals,
                     sorted(self._workers))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Batches are decided and committed synchronously in the loop, so nothing is
        # half-done here; drop the partition's producer and stop publishing its tables,
        # unless this coordinator is stopping: then it still publishes what it ratified
        # (the next owner's put-if-absent finds the same bytes) before it exits.
        for tp in partitions:
            w = self._workers.pop(tp.partition, None)
            if w is not None:
                if not self._leaving:
                    self.publisher.forget(w.states.keys())
                self.metrics.tables.dec(len(w.states))
                w.close()
        log.info("released partitions %s; owning %s", sorted(tp.partition for tp in partitions), sorted(self._workers))

    # -- run -------------------------------------------------------------------------
    def _ensure_topics(self) -> int | None:
        """Check (or create) the topics and return the proposals topic's partition count, asking again while Kafka
        does not answer in time (a cluster losing a node while this process starts, brokers still starting): a
        configuration problem (`TopicConfigError`) is raised at once, a slow cluster only delays readiness.
        None when stopped meanwhile."""
        started = time.monotonic()
        warned_at: float | None = None
        delay = 0.5
        while True:
            admin = AdminClient(self.settings.client())
            try:
                return ensure_topics(admin, self.settings.topics, partitions=self.num_partitions,
                                     dead_letter_bound=self.settings.dead_letter_record_bound(),
                                     client_config=self.settings.client())
            except (TimeoutError, KafkaException) as e:
                err = e.args[0] if isinstance(e, KafkaException) and e.args else None
                if isinstance(err, KafkaError) and (err.fatal() or not (err.retriable() or err.code() in _SLOW_KAFKA)):
                    raise
                now = time.monotonic()
                if warned_at is None or now - warned_at >= 10.0:
                    warned_at = now
                    log.warning("checking the topics: Kafka did not answer in time (%s: %s) after %.0fs; asking "
                                "again", type(e).__name__, e, now - started)
            finally:
                del admin  # an idle admin client would keep reconnecting for the life of the process
            self.heartbeat()
            if self.stop_event.wait(delay):
                return None
            self.heartbeat()
            delay = min(delay * 2, 5.0)

    def run(self) -> int:
        """Run until `stop_event` is set (graceful) or this coordinator is fenced. Returns an exit code.

        With explicit `partitions` the coordinator owns exactly those (static
        assignment); otherwise it joins the consumer group and owns what Kafka
        assigns it, so more instances split the partitions between them.
        """
        # The metrics port first: a port that is taken is a configuration error, found before any Kafka work.
        if self.metrics_port is not None and self._server is None:
            self._server = MetricsServer(self.metrics, self.health, self.metrics_port)
        # Watch startup too: a client call can hang before the loop ever runs.
        self.heartbeat()
        if self.watchdog_s is not None:
            threading.Thread(target=self._watchdog, name="deltacoord-watchdog", daemon=True).start()
        if self.locations.roots is None:
            log.warning("table_roots is not set: this coordinator creates and publishes tables in any local directory "
                        "it can write, and serves no object store; set table_roots in production")
        else:
            log.info("table roots: %s", self.locations.describe_roots())
        num_partitions = self._ensure_topics()
        if num_partitions is None:  # stopped while Kafka did not answer
            return EXIT_OK
        self._num_partitions = num_partitions
        if self.publisher.stable is None:
            self.publisher.stable = StableOffsets(self.settings.client(), self.settings.topics.commits)
        self._notices = PublicationNotices(self.settings.client(), self.settings.topics.replies,
                                           stable=self.publisher.stable)
        if self._server is not None:
            self._server.start()
        self.publisher.start()
        if isinstance(self.checkpoint_fn, CheckpointWorker):
            log.info("checkpoint worker started (pid %d)", self.checkpoint_fn.start())
        ckpt = threading.Thread(target=self._checkpoint_loop, name="deltacoord-checkpointer", daemon=True)
        ckpt.start()
        consumer = make_consumer(self.settings, self.kafka_reachability)
        topic = self.settings.topics.proposals
        self.heartbeat()
        code = EXIT_OK
        try:
            if self.partitions is not None:
                consumer.assign(self._take(consumer, [TopicPartition(topic, p) for p in self.partitions]))
                self.ready = True
                log.info("coordinator ready on %s (static)", topic)
            else:
                # Ready (and /healthz 200) only after the first assignment is recovered (`_on_assign`).
                consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                   on_lost=self._on_revoke)
                log.info("coordinator joining the group %s on %s; ready once its partitions are recovered",
                         self.settings.group_id, topic)
            s = self.settings
            while not self.stop_event.is_set():
                self.heartbeat()
                self._record_halts()
                first = consumer.poll(s.poll_timeout_s)
                if first is None:
                    for owned in list(self._workers.values()):
                        owned.poll_hold()
                        owned.observe()
                        owned.flush_offsets()
                        owned.maybe_snapshot()
                    continue
                msgs = [first, *consumer.consume(s.max_batch - 1, 0)] if s.max_batch > 1 else [first]
                msgs, paced = self._linger(consumer, msgs)
                by_partition: dict[int, list[Message]] = {}
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise KafkaException(err)
                        continue
                    p = m.partition()
                    if p is not None:
                        by_partition.setdefault(p, []).append(m)
                for p, batch in by_partition.items():
                    w = self._workers.get(p)
                    if w is not None:  # a message of a partition just revoked is someone else's now
                        w.checks.paced = paced
                        try:
                            w.process(batch)
                        finally:
                            w.checks.paced = frozenset()
                for owned in list(self._workers.values()):
                    owned.poll_hold()
                    owned.observe()
        except FencedError as e:
            # A newer coordinator owns the partition: publish nothing more, exit at once.
            log.error("fenced: %s; stopping without publishing", e)
            self.fenced = True
            code = EXIT_FENCED
        except Exception:
            # A bug of ours (or an error nothing here can handle): the batch in hand was neither
            # committed nor decided for good, so its proposals are decided again after a restart.
            # What is already ratified is still published below.
            log.critical("stopping on an unexpected error; the current batch is not committed", exc_info=True)
            code = EXIT_ERROR
        finally:
            self.ready = False
            self._leaving = True
            if self.fenced:
                self.publisher.abandon()
            else:
                # Publish what is ratified, then record the halts that publication (or the last loop turn)
                # raised while the partitions' producers are still open: a halt not on the commits topic
                # would be lifted by the restart.
                self.publisher.stop(self.publish_drain_s)
                self._record_halts_at_stop()
            for w in self._workers.values():
                w.close()
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.close()
            if not self.fenced:
                self.unpublished = {tid: (t.published, t.ratified) for tid, t in list(self.publisher.tables.items())
                                    if t.published < t.ratified}
                if self.unpublished:
                    log.error("stopping with ratified versions not in _delta_log (table id: published, ratified): %s; "
                              "the next owner of their partitions publishes them", self.unpublished)
                    if code == EXIT_OK:
                        code = EXIT_UNPUBLISHED
            if self._notices is not None:
                self._notices.close()
            if isinstance(self.publisher.stable, StableOffsets):
                self.publisher.stable.close()
            self._ckpt_q.put(None)
            # The checkpoint running at the stop may finish; no new one starts after `stop_checkpoints_s`.
            ckpt.join(self.stop_checkpoints_s + 20 if not self.fenced else 0.1)
            if isinstance(self.checkpoint_fn, CheckpointWorker):
                self.checkpoint_fn.close(wait=not self.fenced, grace_s=10)
            if self._server is not None:
                self._server.stop()
        return code

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: finish the current batch, commit it, publish, exit (6 if versions stay unpublished)."""

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping after the current batch", signum)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
