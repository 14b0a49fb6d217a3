"""The coordinator's consume-decide-produce loop for one proposals partition.

Per batch: decode the proposals (read_committed; `door`) -> `decide_batch` (pure: the decisions plus an overlay of
the batch's tentative commits; group commit, so later proposals see earlier acceptances of the same batch), checked
against the tables' stores (`batch_checks`) -> ONE Kafka transaction holding the decisions, any dead letters, halt
records and the consumed offsets (`batch_transaction`) -> once it commits, apply the overlay to the table states
and hand the ratified versions to the publisher. If the transaction aborts, the overlay is dropped and the batch
consumed again: the states never held it, so nothing is re-read from the commits topic.

The transactional id is fixed per partition, so a newer coordinator for the partition fences this one; a fenced
coordinator stops without publishing anything. An exception deciding one proposal halts that proposal's table
(see `deltacoord.coordinator.rules.batch`); any other exception from the decision path is a bug: it propagates
with the batch undecided and uncommitted, and the daemon stops.

Halts are kept in the process's one record of halts (`deltacoord.coordinator.halts`) and persisted: a halt record
(`deltacoord.coordinator.kafka.control`) goes into the next transaction of the table's partition (the batch's, or
one of its own when the halt came from the publisher or the checkpointer), so recovery restores it. A repeated
proposal id is answered with its first decision (`deltacoord.coordinator.rules.decided`).

Adopt, release and drop requests (`table_requests`) change which tables this partition decides: each is answered
in a transaction of its own, after the proposals before it and before those after it. A resumption is recorded
with its batch, then the partition is rebuilt as at a restart. State snapshots (`state_snapshots`) are written
between batches; `/healthz` reads the partition's progress (`partition_health`).

An expensive proposal (a large commit by reference, huge read predicates) is decided on a worker thread while its
table is held and the partition's other tables go on (`holds`): what comes later for the held table waits behind it,
and no transaction records an offset past it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from deltacoord.coordinator.delta_log.adoption import (
    PublishedState,
    StateLoader,
    StateLoadError,
    load_published_state,
)
from deltacoord.coordinator.delta_log.files import sweep_temp_files
from deltacoord.coordinator.delta_log.publisher import Publisher, PublishTask
from deltacoord.coordinator.delta_log.table_files import location_claimed
from deltacoord.coordinator.faults import fault_point
from deltacoord.coordinator.halts import Halt
from deltacoord.coordinator.kafka.batch_checks import BatchChecks
from deltacoord.coordinator.kafka.batch_transaction import BatchTransaction, Out, decision_headers
from deltacoord.coordinator.kafka.control import (
    ADOPT,
    DROP,
    HALT,
    RELEASE,
    RESUME,
    control_kind,
    halt_record,
    resume_record,
)
from deltacoord.coordinator.kafka.door import Decoded, Door
from deltacoord.coordinator.kafka.holds import Behind, Hold, Holds, expensive, joins, tables_of
from deltacoord.coordinator.kafka.notices import PublicationNotices
from deltacoord.coordinator.kafka.partition_health import PartitionProgress
from deltacoord.coordinator.kafka.partition_tables import PartitionTables
from deltacoord.coordinator.kafka.reachability import STATS_INTERVAL_MS, KafkaReachability
from deltacoord.coordinator.kafka.recovery import Recovered, recover_partition
from deltacoord.coordinator.kafka.state_snapshots import PartitionSnapshots
from deltacoord.coordinator.kafka.table_requests import TableRequests
from deltacoord.coordinator.locations import TableLocationError
from deltacoord.coordinator.metrics import Metrics
from deltacoord.coordinator.rules.batch import Overlay, part_rejection, rejection
from deltacoord.coordinator.rules.decided import DecidedIds
from deltacoord.coordinator.rules.state import TableState
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import newest_commit_version
from deltacoord.reader.staged_commits import on_the_wire
from deltacoord.schemas.actions import Action, AddCDCFile, AddFile, RemoveFile
from deltacoord.schemas.codec import encode_decision
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.routing import partition_for
from deltacoord.storage.table import StorageError

log = logging.getLogger(__name__)


def _not_files(actions: Sequence[Action]) -> tuple[Action, ...]:
    """A commit's actions less its file actions: what a publication hook reads of a commit published from its file."""
    return tuple(a for a in actions if not isinstance(a, (AddFile, RemoveFile, AddCDCFile)))


def make_consumer(settings: CoordinatorSettings, reachability: KafkaReachability | None = None) -> Consumer:
    """The proposals consumer: read_committed, offsets only ever committed inside transactions. With
    `reachability`, its statistics and errors tell whether Kafka is reached (`/healthz`)."""
    s = settings
    callbacks: dict[str, Any] = {}
    if reachability is not None:
        callbacks = {"stats_cb": reachability.on_stats, "error_cb": reachability.on_error}
    return Consumer(
        s.client(
            {
                "statistics.interval.ms": STATS_INTERVAL_MS if reachability is not None else 0,
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
                **callbacks,
            },
        )
    )


class PartitionCoordinator:
    """Owns one proposals partition: its table states and its transactional producer.

    The consumer is shared by every partition of the process; this object only
    ever handles messages of its own partition.
    """

    def __init__(self, settings: CoordinatorSettings, partition: int, publisher: Publisher, metrics: Metrics,
                 consumer: Consumer, heartbeat: Callable[[], None] | None = None, num_partitions: int = 0,
                 notices: PublicationNotices | None = None, load_state: StateLoader | None = None) -> None:
        self.settings = settings
        self.partition = partition
        #: The proposals topic's partition count (0: unknown, the partition check is off).
        self.num_partitions = num_partitions
        #: Where writers' replies and publication notices go (None: decisions only on the commits topic).
        self.notices = notices
        self.publisher = publisher
        self.halts = publisher.halts
        self.metrics = metrics
        self.consumer = consumer
        self._heartbeat = heartbeat or (lambda: None)
        self._label = str(partition)
        self.tables = PartitionTables(DecidedIds(settings.decided_ids_limit, settings.decided_ids_max_age_ms))
        self.snapshots = PartitionSnapshots(settings, partition)
        self.progress = PartitionProgress(partition, settings.stall_timeout_s)
        self.txn = BatchTransaction(settings, partition, consumer, metrics, self.progress,
                                    on_recorded=lambda delivered: self.snapshots.note_recorded(
                                        [(o.decision, offset) for o, offset in delivered]))
        self.txn.restart = self.start
        self.door = Door(settings, partition, num_partitions, publisher.locations, self.tables, self.txn.degraded,
                         reply_partitions=lambda: notices.num_partitions if notices is not None else 0,
                         expensive=lambda p: expensive(p, settings))
        self.holds = Holds(settings.hold_runahead or max(1, settings.decided_ids_limit // 2))
        self.txn.floor = self.holds.floor
        self.checks = BatchChecks(partition, publisher, self.tables)
        #: Reads a table's published state for adoption and its recovery (the daemon's checkpoint worker, or here).
        self.load_state: StateLoader = load_state or load_published_state
        self.requests = TableRequests(partition, self.tables, publisher, metrics, self.load_state, self._heartbeat,
                                      on_dropped=self.snapshots.forget)

    @property
    def states(self) -> dict[str, TableState]:
        return self.tables.states

    @property
    def producer(self) -> Producer | None:
        return self.txn.producer

    @property
    def committed_to(self) -> int:
        return self.progress.committed_to

    @property
    def snapshots_written(self) -> int:
        """State snapshots written by this partition coordinator (for tests and logs)."""
        return self.snapshots.written

    def owns(self, table_id: str) -> bool:
        """Whether this partition decides `table_id` (and records its halts)."""
        return table_id in self.states or self.num_partitions <= 0 or partition_for(
            table_id, self.num_partitions) == self.partition

    # -- the loop ---------------------------------------------------------------
    def process(self, batch: Sequence[Message]) -> None:
        """Decide one batch of this partition's proposals and commit the decisions with the offsets.

        An adopt or release request changes which tables this coordinator decides: it is answered in a
        transaction of its own, after the proposals before it and before those after it, so each proposal
        is decided against the tables as its position in the partition finds them. An expensive proposal starts a
        hold (`holds`); what names a held table waits behind it.
        """
        assert self.producer is not None
        if not batch:
            return
        if self.progress.waiting_since is None:
            self.progress.waiting_since = time.monotonic()
        if not self.poll_hold():
            return  # the consumer was rewound: this batch is consumed again
        consumed_at = time.time()
        self._run(list(zip(batch, self.door.decode_batch(batch), strict=True)), consumed_at, drained=False)

    def _run(self, items: Sequence[tuple[Message, Decoded]], consumed_at: float, drained: bool) -> bool:
        """Decide consumed messages in order: runs of proposals together, each request on its own, an expensive
        proposal as a hold; those a hold blocks are set aside behind it. False when a transaction was not recorded
        (fresh messages are consumed again; `drained` ones, which waited behind a hold, wait again)."""
        run: list[tuple[Message, Decoded, bool]] = []  # (message, decoded, set aside behind the hold)
        aside, pending = Behind(), 0  # what the run sets aside; how many decisions it makes
        first = 0  # the index of the first item not recorded yet
        gen = self.holds.generation if drained else 0  # what waited, until a rebuild consumes it again
        i = 0
        while i < len(items):
            m, x = items[i]
            if self.holds.at_limit(pending):
                if not self._decide_run(run, consumed_at):
                    return self._not_recorded(items[first:], gen)
                run, aside, pending, first = [], Behind(), 0, i
                if not self._wait_for_holds():
                    return self._not_recorded(items[first:], gen)
            i += 1
            if self.holds.blocks(x, aside) or (x.expensive and self.holds.hold is not None):
                run.append((m, x, True))
                aside.add(x)
                continue
            if x.request is None and x.expensive is None:
                run.append((m, x, False))
                pending += len(x.all_submitted()) or 1
                continue
            if not self._decide_run(run, consumed_at):
                return self._not_recorded(items[first:], gen)
            run, aside, pending, first = [], Behind(), 0, i - 1
            if x.request is not None and not self._answer_request(m, x, consumed_at):
                return self._not_recorded(items[first:], gen)
            if x.request is None:
                held = [(m, x)]
                while i < len(items) and len(held) < self.settings.max_batch and joins(items[i][1], tables_of(x)):
                    held.append(items[i])
                    i += 1
                if not self._start_hold(held, consumed_at):
                    return self._not_recorded(items[first:], gen)
            first = i
        return self._decide_run(run, consumed_at) or self._not_recorded(items[first:], gen)

    def _not_recorded(self, items: Sequence[tuple[Message, Decoded]], gen: int) -> bool:
        """After a transaction failed: fresh messages (`gen` 0) are consumed again (the consumer was rewound);
        messages that waited behind a hold, consumed before, wait again, decoded anew (as a message Kafka refused to
        record is), unless the partition was rebuilt since (generation `gen`): then they are consumed again too."""
        if gen and gen == self.holds.generation and items:
            self.holds.wait(list(zip([m for m, _x in items], self.door.decode_batch([m for m, _x in items]),
                                     strict=True)))
        return False

    def _decide_run(self, run: Sequence[tuple[Message, Decoded, bool]], consumed_at: float) -> bool:
        """Decide a run's proposals in one transaction; those set aside wait behind the hold once it is recorded."""
        if not run:
            return True
        aside = [(m, x) for m, x, a in run if a]
        decide = [x for _m, x, a in run if not a]
        if decide and not self._decide([m for m, _x, _a in run], decide, consumed_at,
                                       floor=self.holds.floor([x for _m, x in aside])):
            return False
        if not decide:
            self.progress.committed_to = max(self.progress.committed_to, (run[-1][0].offset() or 0) + 1)
        self.holds.wait(aside)
        return True

    def _decide(self, batch: Sequence[Message], decoded: Sequence[Decoded], consumed_at: float,
                floor: int | None = None, held: tuple[list[Decision], Overlay, dict[int, bytes]] | None = None) -> bool:
        """Decide and record these proposals (`held`: a hold's decision, made on its worker thread); False when they
        were not recorded (the consumer was rewound) or the partition was rebuilt (a resumption): the rest of the
        fetched batch is then consumed again. The transaction records no offset past `floor`."""
        now_ms = int(time.time() * 1000)
        self._refuse_released(decoded, now_ms)
        proposals = [s for x in decoded for s in x.all_submitted()]
        decided, overlay, encoded = held if held is not None else self.checks.decide(
            proposals, now_ms, self._told_when_ratified(decoded))
        decisions, replies, outs = self._decision_outs(decoded, decided, encoded)
        resumes = self._resumes(decoded, now_ms)
        halts = self._unrecorded_halts(exclude=resumes)
        outs += [self._halt_out(h) for h in halts]
        outs += [self._control_out(d, RESUME) for d in resumes.values()]
        fault_point("after_decide")
        if not self.txn.record(batch, outs, floor):
            return False  # the overlay is dropped: the states never held the batch
        fault_point("after_kafka_commit")
        self.txn.committed(batch)
        self.halts.recorded(halts)
        self.checks.drop_writer_staged(proposals)
        overlay.apply_to(self.states)
        for d in decisions:
            self.tables.remember(d)
        self.holds.recorded(len(decisions))
        offsets = {x.offset for x in decoded}  # less what waits behind a hold, counted when decided
        self._hand_over([m for m in batch if m.offset() in offsets], decisions, replies, overlay, consumed_at,
                        dead=sum(1 for x in decoded if x.dead is not None))
        if resumes:
            self._resume(list(resumes))
            return False
        self.maybe_snapshot()
        return True

    # -- holds ----------------------------------------------------------------------------
    def _start_hold(self, items: list[tuple[Message, Decoded]], consumed_at: float) -> bool:
        """Hand an expensive proposal, and the messages of its table right after it (`holds.joins`), to a worker thread
        (`holds`); those of a released table are refused at once."""
        self._refuse_released([x for _m, x in items], int(time.time() * 1000))
        x = items[0][1]
        if x.submitted is None:
            return self._decide([m for m, _x in items], [d for _m, d in items], consumed_at, floor=self.holds.floor())
        assert x.expensive is not None
        p = x.submitted.proposal
        self.progress.committed_to = max(self.progress.committed_to, items[-1][1].offset + 1)
        self.holds.start(items, x.expensive, self._decide_held, consumed_at)
        self.metrics.holds.labels(x.expensive).inc()
        log.info("partition %d: proposal %s for table %s (offset %d) is decided off the deciding thread (%s), with the "
                 "%d messages of its table right after it; the table is held, the partition's other tables go on",
                 self.partition, p.proposal_id[:100], p.table_id[:200], x.offset, x.expensive, len(items) - 1)
        return True

    def _decide_held(self, xs: list[Decoded]) -> tuple[list[Decoded], tuple[list[Decision], Overlay, dict[int, bytes]]]:
        """On the hold's worker thread: load the proposals' staged actions and decide them against their table, which
        nothing else changes meanwhile (the rules are pure; the store checks are `BatchChecks`')."""
        fault_point("hold")
        xs = [self.door.loaded(x) for x in xs]  # one refused as it was loaded is answered with its rejection
        return xs, self.checks.decide([s for x in xs for s in x.all_submitted()], int(time.time() * 1000),
                                      self._told_when_ratified(xs))

    def poll_hold(self) -> bool:
        """Record a hold's decision once its worker is done, then decide what waited behind it (the loop calls this
        between batches, and when idle). False when a transaction failed: the consumer was rewound to the offset
        consumed up to, so a batch in hand is consumed again."""
        h = self.holds.hold
        if h is not None and h.future.done() and not self._finish_hold(h):
            return False
        while self.holds.hold is None and self.holds.waiting:
            if not self._run(self.holds.take_waiting(), time.time(), drained=True):
                return False
        return True

    def _finish_hold(self, h: Hold) -> bool:
        """Record the hold's decision in the next transaction; not recorded (False), the proposal waits to be decided
        again."""
        self.holds.hold = None
        xs, held = h.future.result()  # an exception is a bug of the decision path: it propagates (the daemon stops)
        messages = [m for m, _x in h.items]
        gen = self.holds.generation
        if not self._decide(messages, xs, h.consumed_at, floor=self.holds.floor(), held=held):
            if gen == self.holds.generation:  # else the partition was rebuilt (a producer replaced): consumed again
                self.holds.wait(list(zip(messages, self.door.decode_batch(messages), strict=True)), first=True)
            return False
        log.info("partition %d: the %d held messages from offset %d are decided after %.1fs", self.partition,
                 len(messages), h.offset, time.monotonic() - h.since)
        return True

    def _wait_for_holds(self) -> bool:
        """At the run-ahead bound: wait until the hold's decision and what waited behind it are recorded (False: a
        transaction failed, see `poll_hold`)."""
        while self.holds.at_limit():
            h = self.holds.hold
            if h is not None:
                log.warning("partition %d: %d decisions passed the held proposal at offset %d (the bound); waiting "
                            "for it", self.partition, self.holds.runahead, h.offset)
                while not h.future.done():
                    self._heartbeat()
                    time.sleep(0.05)
            if not self.poll_hold():
                return False
        return True

    def _told_when_ratified(self, decoded: Sequence[Decoded]) -> frozenset[str] | None:
        """The tables of these messages whose versions must be checked against the store before they are ratified:
        some of their writers hear their outcome at ratification, before it is published (they return then, or
        read the commits topic: no replies partition), or they are parts of a multi-table transaction, whose parts
        are all published or none is committed. None: every writer hears at ratification (no replies are sent)."""
        if self.notices is None:
            return None
        return frozenset(s.proposal.table_id for x in decoded if x.reply is None or x.ratified_only or x.parts
                         for s in x.all_submitted())

    def _refuse_released(self, decoded: Sequence[Decoded], now_ms: int) -> None:
        """Proposals for released tables are refused (TABLE_RELEASED) before anything is decided."""
        for x in decoded:
            released = [s.proposal for s in x.all_submitted() if s.proposal.table_id in self.tables.released]
            if released and x.submitted is not None:
                at = x.submitted.at_ms or now_ms
                first = released[0]
                failure = rejection(first.table_id, first.table_uri, first.proposal_id,
                                    self.requests.released_error(first.table_id), None, at)
                x.rejected, *x.parts_rejected = [failure if s.proposal is first else part_rejection(s.proposal, failure, at)
                                                 for s in x.all_submitted()]
                x.submitted, x.parts = None, []

    def _decision_outs(self, decoded: Sequence[Decoded], decided: Sequence[Decision], encoded: dict[int, bytes],
                       ) -> tuple[list[Decision], list[tuple[int | None, bool]], list[Out]]:
        """The batch's answers in message order, where each goes (reply partition, ratified only), and their records
        (with the dead letters)."""
        it = iter(decided)
        decisions: list[Decision] = []
        replies: list[tuple[int | None, bool]] = []
        outs: list[Out] = []
        s = self.settings
        for x in decoded:
            answers = [next(it) for _ in x.all_submitted()] if x.submitted is not None else x.all_rejected()
            for d in answers:
                decisions.append(d)
                replies.append((x.reply, x.ratified_only))
                value = encoded.get(id(d))
                outs.append(Out(s.topics.commits, value if value is not None else encode_decision(on_the_wire(d)),
                                d.table_id.encode(), decision_headers(d), self.partition, x.offset, d))
            if x.dead is not None:
                outs.append(Out(s.topics.dead_letters, x.dead.value, x.dead.key, x.dead.headers, None, x.offset))
        return decisions, replies, outs

    def _resumes(self, decoded: Sequence[Decoded], now_ms: int) -> dict[str, Decision]:
        """The resume records of the batch's resumption requests, by table."""
        out: dict[str, Decision] = {}
        for x in decoded:
            if x.resume is None or x.resume in out:
                continue
            st = self.states.get(x.resume)
            if st is None:
                log.warning("partition %d: a request to resume table %s, which this partition does not hold; ignored",
                            self.partition, x.resume[:200])
                continue
            out[x.resume] = resume_record(x.resume, st.table_uri, st.version, now_ms)
        return out

    def _hand_over(self, batch: Sequence[Message], decisions: Sequence[Decision],
                   replies: Sequence[tuple[int | None, bool]], overlay: Overlay, consumed_at: float, dead: int) -> None:
        """After the batch's transaction committed: its ratified versions to the publisher, its answers to the
        writers, its counts to the metrics."""
        self.metrics.tables.inc(len(overlay.created))
        now = time.time()
        times = {"consumed": consumed_at, "ratified": now}
        for m in batch:
            ts = m.timestamp()[1]
            if ts > 0:
                self.metrics.decision_latency.observe(max(0.0, now - ts / 1000.0))
        self.metrics.batch_size.observe(len(batch))
        self.metrics.proposals.labels(self._label).inc(len(batch))
        # What the transaction decided is shown (published, answered) once Kafka's readers see it (see
        # coordinator.kafka.stability): the publisher waits for the last stable offset to pass this record.
        last = self.txn.last_offset
        stable_at = None if last is None else (self.partition, last)
        tasks: list[PublishTask] = []
        per_table: dict[str, int] = {}  # new versions per table URI: one metric update per table and batch
        for d, (reply, ratified_only) in zip(decisions, replies, strict=True):
            new_version = d.holds_version
            # A commit coalesced into another decision's version: its writer hears when that version is published.
            coalesced = d.committed and d.coalesced_into is not None
            if reply is not None and self.notices is not None:
                # After the transaction, outside it (see coordinator.kafka.notices).
                if (new_version or coalesced) and not ratified_only:
                    self.notices.expect(d, reply, times)  # one reply, once published (registered before submit)
                elif stable_at is None:
                    self.notices.decided(d, reply, times)
                else:  # held until Kafka's readers see the record: without the commit's actions
                    self.notices.decided_when_stable(stable_at, dataclasses.replace(d, actions=()), reply, times)
            if new_version:
                assert d.version is not None
                per_table[d.table_uri] = per_table.get(d.table_uri, 0) + 1
                # A commit by reference is published from its staged file: the task holds none of its file actions.
                tasks.append(PublishTask(d.table_id, d.table_uri, d.version,
                                         d.actions if d.staged is None else _not_files(d.actions), stable_at,
                                         staged=(d.proposal_id, d.staged) if d.staged is not None else None,
                                         decided_at=consumed_at))
            elif coalesced:
                self.metrics.coalesced.inc()
            elif d.committed:
                self.metrics.duplicates.inc()
            elif d.error_type and d.reason_code is None:
                self.metrics.conflicts.labels(d.error_type).inc()
                self.metrics.table_conflicts.labels(d.table_uri, d.error_type).inc()
            else:
                self.metrics.rejections.labels(d.reason_code or "UNKNOWN").inc()
        self.publisher.submit_all(tasks)  # after every reply is registered (`notices.expect`)
        if tasks:
            self.metrics.commits.labels(self._label).inc(len(tasks))
            for uri, n in per_table.items():
                self.metrics.table_commits.labels(uri).inc(n)
        self.metrics.dead_letters.inc(dead)
        self.metrics.publish_lag.set(self.publisher.lag())
        self.metrics.halted_tables.set(self.publisher.halted_count())

    # -- adopt, release and drop requests, resumptions -------------------------------------------
    def _answer_request(self, m: Message, x: Decoded, consumed_at: float) -> bool:
        """Answer an adopt, release or drop request (`table_requests`) in a transaction of its own (with the pending
        halts); False when it was not recorded (consumed again)."""
        assert x.submitted is not None and x.request is not None
        p, sig = x.submitted.proposal, x.submitted.signature
        at = x.submitted.at_ms or int(time.time() * 1000)
        d, done = self.requests.answer(x.request, p, sig, at)
        kind = control_kind(d)
        # Pending halts first: an adoption lifts a halt of the table, so it is folded after them.
        halts = self._unrecorded_halts()
        outs = [self._halt_out(h) for h in halts]
        outs.append(Out(self.settings.topics.commits, encode_decision(d), d.table_id.encode(), decision_headers(d, kind),
                        self.partition, x.offset, d))
        if not self.txn.record([m], outs, self.holds.floor()):
            return False
        self.txn.committed([m])
        self.halts.recorded(halts)
        self.holds.recorded(1)
        if done is not None:
            done()
        if kind in (None, ADOPT, RELEASE, DROP):
            self.tables.remember(d)  # as recovery does: the answer to a request (a rejection, or its record)
        if kind is None:
            self.metrics.rejections.labels(d.reason_code or "UNKNOWN").inc()
        self.metrics.proposals.labels(self._label).inc()
        if x.reply is not None and self.notices is not None:
            self.notices.decided(d, x.reply, {"consumed": consumed_at, "ratified": time.time()})
        log.warning("partition %d: %s request %s for table %s: %s", self.partition, x.request, p.proposal_id[:100],
                    p.table_id[:200], d.error_message if kind is not None else f"refused, {d.reason_code}: {d.error_message}")
        self.maybe_snapshot()
        return True

    def _resume(self, tables: Sequence[str]) -> None:
        """After a resumption is recorded: rebuild the partition as at a restart, which republishes what the halt
        held back (and halts the table again if its cause is still there)."""
        log.warning("partition %d: tables %s resumed by an operator; rebuilding the partition", self.partition, list(tables))
        for tid in tables:
            self.publisher.resume(tid)
        self.publisher.forget(self.states.keys())
        self.close()
        self.consumer.seek(TopicPartition(self.settings.topics.proposals, self.partition, self.start()))

    # -- halts --------------------------------------------------------------------
    def _unrecorded_halts(self, exclude: Collection[str] = ()) -> list[Halt]:
        """This partition's halts not yet on the commits topic (less those of tables resumed in the batch), each
        naming the table's head when first recorded."""
        out = []
        for h in self.halts.unrecorded():
            if h.table_id in exclude or not self.owns(h.table_id):
                continue
            st = self.states.get(h.table_id)
            fixed = self.halts.fix_head(h.table_id, st.version if st is not None else -1)
            if fixed is not None:
                out.append(fixed)
        return out

    def flush_controls(self) -> None:
        """Record pending halts in a transaction of their own (when no batch comes to carry them)."""
        if self.producer is None:
            return
        halts = self._unrecorded_halts()
        if not halts:
            return
        outs = [self._halt_out(h) for h in halts]
        if self.txn.record_alone(outs, "halts"):
            log.info("partition %d: recorded halts of %s", self.partition, sorted({h.table_id for h in halts}))
            self.halts.recorded(halts)

    def _halt_out(self, h: Halt) -> Out:
        return self._control_out(halt_record(h.table_id, h.table_uri, h.why, h.head if h.head is not None else -1,
                                             h.since_ms), HALT)

    def _control_out(self, d: Decision, kind: str) -> Out:
        return Out(self.settings.topics.commits, encode_decision(d), d.table_id.encode(), decision_headers(d, kind),
                   self.partition, -1, d)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> int:
        """Fence older owners, rebuild state from the commits topic, publish what is missing.

        Returns the proposals offset to resume from (the last transactionally committed one). A hold and what
        waited behind it are forgotten: they are consumed again from there.
        """
        self.holds.reset()
        self.txn.open()
        recovered_to = self._recover()
        self.flush_controls()
        return self.txn.resume_at(recovered_to)

    def committed_offset(self) -> int:
        return self.txn.committed_offset()

    def close(self) -> None:
        self.txn.close()

    def flush_offsets(self) -> None:
        """When idle, commit to the group the offset the last transactions recorded only in their records."""
        self.txn.flush_offsets()

    def _recover(self) -> int:
        """Rebuild the partition's table states from the commits topic; publish what `_delta_log` lacks;
        restore the halts (and record those recovery found). Returns the proposals offset the recorded
        transactions consumed up to."""
        self.metrics.tables.dec(len(self.states))
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

        def load_state(table_uri: str, version: int) -> PublishedState:
            try:
                storage = locations.storage(table_uri)
            except (TableLocationError, ValueError) as e:
                raise StateLoadError("unreadable", f"the table's location cannot be opened: {e}") from e
            return self.load_state(storage, version)

        def claimed(table_uri: str) -> bool | None:
            try:
                return location_claimed(locations.storage(table_uri))
            except (TableLocationError, ValueError):
                return None

        rec: Recovered = recover_partition(self.settings, self.partition, new_table=new_table, heartbeat=self._heartbeat,
                                           on_record=self.metrics.recovery_records.inc,
                                           published_version=published_version, load_state=load_state, claimed=claimed)
        self.tables.states = rec.states
        self.tables.released = rec.released
        self.tables.decided = rec.decided
        self.snapshots.recovered(rec.end_offset, rec.last,
                                 rec.records if rec.snapshot_offset is not None else rec.end_offset)
        for tid, (uri, why) in rec.halted.items():
            self.publisher.halt(tid, uri, why, notify=False, recorded=True)
        for tid, (uri, why) in rec.new_halts.items():
            self.checks.halt(tid, uri, why)
        for tid, st in self.states.items():
            if tid not in rec.halted:
                pending = rec.to_publish.get(tid)
                first = pending[0][0].version if pending else None
                self.publisher.mark_published(tid, st.version if first is None else first - 1)
        for ds in rec.to_publish.values():
            for d, offset in ds:
                assert d.version is not None
                self.snapshots.recorded_at(d.table_id, d.version, offset)
                self.publisher.submit(PublishTask(d.table_id, d.table_uri, d.version, d.actions,
                                                  staged=(d.proposal_id, d.staged) if d.staged is not None else None,
                                                  data=rec.staged_data.pop((d.table_id, d.version), None)))
        self.metrics.tables.inc(len(self.states))
        self.metrics.halted_tables.set(self.publisher.halted_count())
        log.info("partition %d: recovered %d tables (%d halted) from %d records of %s%s", self.partition, len(self.states),
                 len(rec.halted), rec.records, self.settings.topics.commits,
                 "" if rec.snapshot_offset is None else f" after the state snapshot at offset {rec.snapshot_offset}")
        return rec.proposals_next

    # -- state snapshots and health ----------------------------------------------------------
    def maybe_snapshot(self, force: bool = False) -> bool:
        """Write a state snapshot when one is due (`state_snapshots.PartitionSnapshots.maybe_write`); none while a
        proposal is held (its offset is not consumed)."""
        if self.holds.open():
            return False
        return self.snapshots.maybe_write(self.tables, self.publisher, self.progress.committed_to, force)

    def request_snapshot(self) -> None:
        """Have the deciding thread write a snapshot at its next turn (from another thread: the states are its own)."""
        self.snapshots.request()

    def wait_snapshot(self, timeout_s: float = 60.0) -> None:
        """Wait for the snapshot being written, if any."""
        self.snapshots.wait(timeout_s)

    def observe(self) -> None:
        """Note whether proposals wait on this partition (the loop calls it; `/healthz` reads the result)."""
        self.progress.observe(self.consumer, self.txn.tp)

    def stalled(self, now: float | None = None) -> str | None:
        """Why decisions look stopped here (proposals wait, no batch committed for `stall_timeout_s`), or None."""
        return self.progress.stalled(now)
