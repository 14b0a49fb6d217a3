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
anything. An exception deciding one proposal halts that proposal's table (see
`deltacoord.coordinator.rules.batch`); any other exception from the decision path is a
bug: it propagates with the batch undecided and uncommitted, and the daemon
stops.

Nothing acknowledged is invisible: before a batch that ratifies version v of a
table is recorded, `_delta_log/<v>.json` must be absent (one HEAD, or a stat,
per table and batch, asked only while the table's version v-1 is published:
see `_probe`). A file there was written around the coordinator: the
table halts and the batch is decided again without it, so no writer is told
COMMITTED for a version readers would never see. A store that cannot answer
rejects that table's proposals of the batch (STORAGE_UNAVAILABLE, retryable).

Halts are persisted: a halt record (`deltacoord.coordinator.kafka.control`) goes into
the next transaction of the table's partition (the batch's, or one of its own
when the halt came from the publisher or the checkpointer), so recovery
restores it. A repeated proposal id is answered with its first decision
(`deltacoord.coordinator.rules.decided`).

One location, one table: a creation the batch accepts, and an adoption, claim the table's location in its own
store (`deltacoord.reader.claim`, `claim_problem`) before they are recorded; a location another table id holds refuses them
(TABLE_LOCATION_TAKEN), as a creation over a Delta table the coordinator does not decide is refused
(TABLE_EXISTS_UNCOORDINATED). A release drops the claim. A table's first commit in this process checks its claim
(`_confirm_claims`): a table from before claims claims its location then, one whose location another id holds halts.

At the door: a proposal for a table of another partition (murmur2(table id) %
partitions) is rejected with WRONG_PARTITION and never decided; the writer's
signature headers are handed to the rules (`rules.authentication`).

Poison is bounded: a dead letter carries at most `dead_letter_max_bytes` of the
raw message (full size and SHA-256 in headers). When Kafka refuses one record
of a transaction for what it is (too large, invalid: `RECORD_REFUSALS`), that
message is degraded one step per refusal and the batch retried: first its
proposal is rejected with UNRECORDABLE (an undecodable message keeps its
rejection) and its dead letter keeps only headers; then the dead letter is
dropped too. Every other message of the batch is decided as usual. A
transaction failing for any other reason (the broker, the network) is retried
as it was; `/healthz` reports a partition whose proposals wait while no batch
commits (`stalled`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from deltacoord.coordinator.delta_log.adoption import (
    PublishedState,
    StateLoader,
    StateLoadError,
    adoption_problems,
    load_published_state,
)
from deltacoord.coordinator.delta_log.files import sweep_temp_files
from deltacoord.coordinator.delta_log.publisher import Publisher, PublishTask
from deltacoord.coordinator.delta_log.table_files import delete_table_files, location_claimed
from deltacoord.coordinator.faults import fault_point
from deltacoord.coordinator.kafka.control import (
    ADOPT,
    CONTROL_PREFIX,
    DROP,
    HALT,
    RELEASE,
    RESUME,
    adoption_record,
    control_kind,
    drop_record,
    halt_record,
    is_request_id,
    release_record,
    resume_record,
)
from deltacoord.coordinator.kafka.notices import PublicationNotices
from deltacoord.coordinator.kafka.orphans import commit_with_retry, open_transaction, seal
from deltacoord.coordinator.kafka.reachability import STATS_INTERVAL_MS, KafkaReachability
from deltacoord.coordinator.kafka.recovery import Recovered, recover_partition
from deltacoord.coordinator.kafka.snapshot import PartitionSnapshot, SnapshotStore
from deltacoord.coordinator.locations import TableLocationError, TableLocations
from deltacoord.coordinator.metrics import Metrics
from deltacoord.coordinator.rules.admission import admission_error
from deltacoord.coordinator.rules.authentication import Signature, authentication_error
from deltacoord.coordinator.rules.batch import Overlay, Submitted, decide_batch, part_rejection, rejection, repeated
from deltacoord.coordinator.rules.decided import DecidedIds
from deltacoord.coordinator.rules.state import TableState
from deltacoord.coordinator.rules.validate import path_problem
from deltacoord.coordinator.settings import DEAD_LETTER_ERROR_CHARS, DEAD_LETTER_KEY_BYTES, CoordinatorSettings
from deltacoord.reader.claim import CLAIM_KEY, Claim, ClaimError, claim, drop_claim, read_claim
from deltacoord.reader.log import TableNotFoundError, commit_key, list_log_from_hint, newest_commit_version
from deltacoord.reader.staged_commits import (
    StagedCommitTooLargeError,
    delete_writer_staged,
    load_proposal,
    on_the_wire,
    stage_decision,
)
from deltacoord.schemas.actions import Action, AddCDCFile, AddFile, CommitInfo, RemoveFile
from deltacoord.schemas.codec import decode_proposal, encode_decision
from deltacoord.schemas.errors import DecodeError, InvalidProposalError
from deltacoord.schemas.messages import TRANSACTION_KEY, Decision, MultiTable, Proposal
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import (
    DROP_DELETE_FILES,
    H_CONTROL,
    H_ERROR,
    H_NEXT_OFFSET,
    H_OUTCOME,
    H_PROPOSAL_ID,
    H_RAW_SHA256,
    H_RAW_SIZE,
    H_REPLY_PARTITION,
    H_SIGNATURE,
    H_SIGNER,
    H_SOURCE,
    H_TABLE_ID,
    H_VERSION,
    H_WAIT,
    WAIT_RATIFIED,
    header,
    partition_for,
    spans_partitions_message,
)
from deltacoord.schemas.staged import DECISION_INLINE_MAX_ACTIONS, StagedCommitError
from deltacoord.schemas.table_features import coordinated
from deltacoord.storage.table import StorageError

log = logging.getLogger(__name__)


@functools.cache
def _probe_pool() -> ThreadPoolExecutor:
    """Threads that ask several tables' stores at once whether a version exists (`_probe`), shared by partitions."""
    return ThreadPoolExecutor(max_workers=16, thread_name_prefix="deltacoord-probe")

#: Kafka's refusals of one record for what it is: retrying the same record cannot succeed.
RECORD_REFUSALS = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG, KafkaError.INVALID_MSG_SIZE,
})
#: Degradation steps of a message Kafka refused to record (see the module docstring).
FULL, HEADERS_ONLY, REJECTION_ONLY = 0, 1, 2
#: Ids longer than this (from headers or a decoded proposal) are not echoed into a degraded rejection.
MAX_ECHOED_ID_CHARS = 1024
#: How long a release waits for the publisher to publish every ratified version of the table.
RELEASE_PUBLISH_WAIT_S = 30.0


def _not_files(actions: Sequence[Action]) -> tuple[Action, ...]:
    """A commit's actions less its file actions: what a publication hook reads of a commit published from its file."""
    return tuple(a for a in actions if not isinstance(a, (AddFile, RemoveFile, AddCDCFile)))


class ProducerStuckError(RuntimeError):
    """A call into the transactional producer outlived its bound; the producer must be replaced."""


class FencedError(RuntimeError):
    """A newer coordinator owns this partition; this one must stop."""


#: After an idle commit of the group's offset failed, the next try waits this long.
GROUP_OFFSET_RETRY_S = 5.0


def _header(msg: Message, name: str) -> str | None:
    v = header(msg, name)
    return None if v is None else v.decode("utf-8", errors="replace")


def decision_headers(d: Decision, control: str | None = None) -> list[tuple[str, str | bytes | None]]:
    h: list[tuple[str, str | bytes | None]] = [(H_PROPOSAL_ID, d.proposal_id.encode()), (H_TABLE_ID, d.table_id.encode()), (H_OUTCOME, d.outcome.value.encode())]
    if d.committed and d.version is not None:
        h.append((H_VERSION, str(d.version).encode()))
    if control is not None:
        h.append((H_CONTROL, control.encode()))
    return h


@dataclass
class _DeadLetter:
    """What is recorded of an undecodable message: a bounded prefix of its bytes, its size and hash."""

    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, str | bytes | None]]


@dataclass
class _Decoded:
    """One consumed message: a proposal to decide, or a rejection and/or a dead letter."""

    offset: int
    submitted: Submitted | None = None
    rejected: Decision | None = None
    dead: _DeadLetter | None = None
    #: The replies-topic partition the writer reads (header `deltacoord.reply_partition`), if valid.
    reply: int | None = None
    #: The writer returns at ratification (header `deltacoord.wait: ratified`): its reply goes at once.
    ratified_only: bool = False
    #: An operator's request to resume this table (`deltacoord table resume`).
    resume: str | None = None
    #: `adopt`, `release` or `drop`: `submitted` is that request (`deltacoord table adopt|release|drop`), answered on
    #: its own.
    request: str | None = None
    #: A multi-table transaction's other parts (`submitted` is its first), decided together with it.
    parts: list[Submitted] = field(default_factory=list)
    #: Their rejections, when the message was refused at the edge (`rejected` is the first part's).
    parts_rejected: list[Decision] = field(default_factory=list)

    def all_submitted(self) -> list[Submitted]:
        return [] if self.submitted is None else [self.submitted, *self.parts]

    def all_rejected(self) -> list[Decision]:
        return [] if self.rejected is None else [self.rejected, *self.parts_rejected]


@dataclass(frozen=True)
class _Refusal:
    """A record Kafka refused: the offset of the message it answers, where it went, its size and why."""

    source: int
    topic: str
    size: int
    why: str


@dataclass
class _Out:
    """One record of a batch's transaction, with the offset of the message it answers."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, str | bytes | None]]
    partition: int | None
    source: int
    #: The decision this record carries (commits topic), for the offsets state snapshots need.
    decision: Decision | None = None


def dead_letter(raw: bytes | None, key: bytes | None, error: str, source: str, keep_bytes: int) -> _DeadLetter:
    """A dead letter holding at most `keep_bytes` of `raw` (0: none); full size and SHA-256 in headers."""
    size = len(raw) if raw is not None else 0
    digest = hashlib.sha256(raw).hexdigest() if raw is not None else ""
    value = raw[:keep_bytes] if raw is not None and keep_bytes > 0 else None
    headers: list[tuple[str, str | bytes | None]] = [
        (H_ERROR, error.encode("utf-8", errors="replace")[:DEAD_LETTER_ERROR_CHARS]), (H_SOURCE, source),
        (H_RAW_SIZE, str(size)), (H_RAW_SHA256, digest),
    ]
    return _DeadLetter(value, key[:DEAD_LETTER_KEY_BYTES] if key is not None else None, headers)


def added_files_problem(locations: TableLocations, table_uri: str, files: Sequence[AddFile | AddCDCFile]) -> str | None:
    """Why an added file is not in the table's storage with its declared size, or None (the storage edge's `head`,
    through the coordinator's own storage options for the table's location).

    Paths validation will refuse (outside the table, into `_delta_log`) are left to it.
    """
    from deltacoord.storage.table import ObjectNotFoundError

    try:
        storage = locations.storage(table_uri)
    except (StorageError, TableLocationError, ValueError) as e:
        return f"the table's storage at {table_uri} cannot be opened to check the added files: {e}"
    for f in files:
        if path_problem(f.path, table_uri) is not None:
            continue
        if "://" in f.path or f.path.startswith(("/", "file:")):
            return f"added file {f.path} is given as an absolute path: a table that verifies added files takes relative paths"
        key = unquote(f.path)
        try:
            info = storage.head(key)
        except ObjectNotFoundError:
            return f"added file {f.path} does not exist in {table_uri}"
        except (StorageError, OSError) as e:
            return f"added file {f.path} could not be checked: {e}"
        if info.size != f.size:
            return f"added file {f.path} has {info.size} bytes, not the {f.size} the proposal declares"
    return None


def claim_problem(locations: TableLocations, table_id: str, table_uri: str, request_id: str, at_ms: int, *,
                  creating: bool) -> InvalidProposalError | None:
    """Claim the table's location for `table_id` as it is created (`creating`) or adopted, or say why not
    (`deltacoord.reader.claim`): another table id holds the location (TABLE_LOCATION_TAKEN), a creation would land on a
    Delta table the coordinator does not decide (TABLE_EXISTS_UNCOORDINATED), the store did not answer
    (STORAGE_UNAVAILABLE). The storage edge of a creation's or an adoption's decision; None once claimed."""
    doing = "create" if creating else "adopt"
    try:
        storage = locations.storage(table_uri)
        holder = read_claim(storage)
        if creating and (holder is None or holder.table_id == table_id):
            try:
                head = list_log_from_hint(storage).latest_version
            except TableNotFoundError:
                head = None
            if head is not None:
                return InvalidProposalError(ReasonCode.TABLE_EXISTS_UNCOORDINATED, (
                    f"a Delta table already exists at {table_uri} (version {head}) and this coordinator does not decide "
                    f"it: table {table_id} was not created over it. To put that table under coordination, adopt it: "
                    f"`deltacoord table adopt {table_uri}` (Python: Table(uri, ...).adopt()); to make a new table, "
                    "choose an empty location"))
        if holder is None:
            holder = claim(storage, Claim(table_id, at_ms, request_id))
    except TableLocationError as e:
        return e
    except ClaimError as e:
        return InvalidProposalError(ReasonCode.TABLE_LOCATION_TAKEN, (
            f"table {table_id} cannot {doing} {table_uri}: the location's claim cannot be read ({e}). If no "
            f"coordinated table uses that location, remove {table_uri}/{CLAIM_KEY} and retry"))
    except (StorageError, OSError, ValueError) as e:
        return InvalidProposalError(ReasonCode.STORAGE_UNAVAILABLE, (
            f"the claim of {table_uri} (which table id holds the location) could not be checked or written ({e}); "
            f"table {table_id} was not {'created' if creating else 'adopted'}, retry"))
    if holder.table_id != table_id:
        return InvalidProposalError(ReasonCode.TABLE_LOCATION_TAKEN, (
            f"{table_uri} is the location of table id {holder.table_id!r} (claimed by {holder.claimed_by or 'a request'}"
            f" in {CLAIM_KEY}), so table id {table_id!r} may not {doing} it: two table ids over one _delta_log would "
            f"both ratify the same versions, and only one of each can be published. Write the table under its own id: "
            f"Table(uri, table_id={holder.table_id!r}) (CLI: --table-id {holder.table_id!r}; a local table's id is "
            f"its file:// URI by default). If table {holder.table_id!r} is gone, release it first (`deltacoord table "
            f"release {table_uri} --table-id {holder.table_id!r}`), which frees the location"))
    return None


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
        #: Reads a table's published state for adoption and its recovery (the daemon's checkpoint worker, or here).
        self.load_state: StateLoader = load_state or load_published_state
        self._heartbeat = heartbeat or (lambda: None)
        self.partition = partition
        #: The proposals topic's partition count (0: unknown, the partition check is off).
        self.num_partitions = num_partitions
        #: Where writers' replies and publication notices go (None: decisions only on the commits topic).
        self.notices = notices
        self.publisher = publisher
        self.metrics = metrics
        self.consumer = consumer
        self.states: dict[str, TableState] = {}
        #: Tables released to uncoordinated writers -> (table uri, version released at); their proposals are refused.
        self.released: dict[str, tuple[str, int]] = {}
        #: Tables whose location's claim (`deltacoord.reader.claim`) names them, as this process saw: the claim is checked once
        #: per table and process, so a table created or adopted before claims existed gets one at its next commit.
        self._claimed: set[str] = set()
        self.decided = DecidedIds(settings.decided_ids_limit, settings.decided_ids_max_age_ms)
        # -- state snapshots (`deltacoord.coordinator.kafka.snapshot`): the commits-topic offset the states cover, the
        # last record folded, records since the last snapshot, and where recent versions were recorded.
        self._snapshots = (SnapshotStore(settings.state_root, settings.storage_options, settings.topics.commits, partition)
                           if settings.state_root else None)
        self.commits_end = 0
        self._last_record: tuple[int, str] | None = None
        self._since_snapshot = 0
        self._recorded_at: deque[tuple[str, int, int]] = deque(maxlen=max(2 * settings.snapshot_every_records, 1000))
        self._delivered: list[tuple[_Out, int]] = []
        #: The last commits-topic offset of the last committed transaction (None: it wrote none there).
        self.txn_last_offset: int | None = None
        self._snapshot_thread: threading.Thread | None = None
        self._snapshot_requested = False
        #: State snapshots written by this partition coordinator (for tests and logs).
        self.snapshots_written = 0
        #: Halt and resume records not yet on the commits topic: (table id, kind, record).
        self._controls: list[tuple[str, str, Decision]] = []
        self.producer: Producer | None = None
        self._label = str(partition)
        self._tp = TopicPartition(settings.topics.proposals, partition)
        #: Offset -> (degradation step, why) of messages Kafka refused to record as they were.
        self._degraded: dict[int, tuple[int, str]] = {}
        # -- progress, for /healthz: the next offset to commit, when a batch last committed,
        # since when proposals wait, and why the last transaction failed.
        self.committed_to = 0
        #: The offset last committed to the group (in a transaction), and when.
        self._group_offset = 0
        self._group_offset_at = time.monotonic()
        self._group_offset_retry_at = 0.0
        self.last_commit = time.monotonic()
        self.waiting_since: float | None = None
        self.last_failure: str | None = None
        self._failures = 0

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
        self._close_left_open()
        recovered_to = self._recover()
        self.flush_controls()
        # The group's offset lags the records' `deltacoord.next_offset` by up to `group_offset_interval_s` of
        # transactions (or leads it after transactions that recorded no decision): resume after both.
        self._group_offset = self.committed_offset()
        self._group_offset_at = time.monotonic()
        self.committed_to = max(self._group_offset, recovered_to)
        self.last_commit = time.monotonic()
        if self.committed_to > self._group_offset:
            log.info("partition %d: resuming at proposals offset %d (the group's committed offset is %d)", self.partition,
                     self.committed_to, self._group_offset)
        return self.committed_to

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

    def committed_offset(self) -> int:
        committed = _committed_with_retry(self.consumer, self._tp)
        return committed[0].offset if committed and committed[0].offset >= 0 else 0

    def close(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(KafkaException):  # a fenced producer fails every call, flush included
                self.producer.flush(5)
            self.producer = None

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
        self.states = rec.states
        self.released = rec.released
        self.decided = rec.decided
        self.commits_end = rec.end_offset
        self._last_record = rec.last
        self._since_snapshot = rec.records if rec.snapshot_offset is not None else rec.end_offset
        self._recorded_at.clear()
        for tid, (uri, why) in rec.halted.items():
            self.publisher.halt(tid, uri, why, notify=False)
        for tid, (uri, why) in rec.new_halts.items():
            self.note_halt(tid, uri, why)
        for tid, st in self.states.items():
            if tid not in rec.halted:
                pending = rec.to_publish.get(tid)
                first = pending[0][0].version if pending else None
                self.publisher.mark_published(tid, st.version if first is None else first - 1)
        for ds in rec.to_publish.values():
            for d, offset in ds:
                assert d.version is not None
                self._recorded_at.append((d.table_id, d.version, offset))
                self.publisher.submit(PublishTask(d.table_id, d.table_uri, d.version, d.actions,
                                                  staged=(d.proposal_id, d.staged) if d.staged is not None else None,
                                                  data=rec.staged_data.pop((d.table_id, d.version), None)))
        self.metrics.tables.inc(len(self.states))
        self.metrics.halted_tables.set(self.publisher.halted_count())
        log.info("partition %d: recovered %d tables (%d halted) from %d records of %s%s", self.partition, len(self.states),
                 len(rec.halted), rec.records, self.settings.topics.commits,
                 "" if rec.snapshot_offset is None else f" after the state snapshot at offset {rec.snapshot_offset}")
        return rec.proposals_next

    # -- state snapshots --------------------------------------------------------------
    def _note_recorded(self) -> None:
        """After a transaction committed: the offsets its commits-topic records got."""
        self.txn_last_offset = max((offset for _o, offset in self._delivered), default=None)
        for o, offset in self._delivered:
            self.commits_end = max(self.commits_end, offset + 1)
            self._since_snapshot += 1
            d = o.decision
            if d is None:
                continue
            if self._last_record is None or offset > self._last_record[0]:
                self._last_record = (offset, d.proposal_id)
            if d.holds_version:
                assert d.version is not None
                self._recorded_at.append((d.table_id, d.version, offset))
        self._delivered = []

    def maybe_snapshot(self, force: bool = False) -> bool:
        """Write a state snapshot when `snapshot_every_records` records were recorded since the last (or `force`).

        The states are exported here, between batches; encoding and writing happen in a thread. False
        when none was started (not due, one still being written, or a version not yet published is too
        old to find again).
        """
        force = force or self._snapshot_requested
        if self._snapshots is None or not (force or self._since_snapshot >= self.settings.snapshot_every_records):
            return False
        if self._snapshot_thread is not None and self._snapshot_thread.is_alive():
            return False
        republish: dict[str, tuple[int, int]] = {}
        halted = self.publisher.halted_tables()
        for tid, st in self.states.items():
            published = self.publisher.published_version(tid)
            if tid in halted or published >= st.version:
                continue
            at = next((off for t, v, off in self._recorded_at if t == tid and v == published + 1), None)
            if at is None:
                log.info("partition %d: no state snapshot now: version %d of %s is not published yet and was recorded "
                         "too long ago", self.partition, published + 1, tid)
                self._since_snapshot = self.settings.snapshot_every_records // 2
                return False
            republish[tid] = (at, published + 1)
        snap = PartitionSnapshot(
            commits_topic=self.settings.topics.commits, partition=self.partition, offset=self.commits_end,
            last=self._last_record, tables=[st.export() for st in self.states.values()],
            halted={tid: (self.states[tid].table_uri, why) for tid, why in halted.items() if tid in self.states},
            released=dict(self.released), decided=list(self.decided), republish_from=republish, created_ms=int(time.time() * 1000),
            proposals_next=self.committed_to)
        self._since_snapshot = 0
        self._snapshot_requested = False
        store = self._snapshots

        def write() -> None:
            t0 = time.monotonic()
            try:
                size = store.write(snap)
            except Exception as e:  # a snapshot is an optimisation: the next one tries again
                log.warning("partition %d: writing the state snapshot at offset %d failed: %s", self.partition,
                            snap.offset, e)
                return
            log.info("partition %d: state snapshot at offset %d written (%d tables, %d bytes) in %.2fs", self.partition,
                     snap.offset, len(snap.tables), size, time.monotonic() - t0)
            self.snapshots_written += 1

        self._snapshot_thread = threading.Thread(target=write, name=f"deltacoord-snapshot-{self.partition}", daemon=True)
        self._snapshot_thread.start()
        return True

    def request_snapshot(self) -> None:
        """Have the deciding thread write a snapshot at its next turn (from another thread: the states are its own)."""
        self._snapshot_requested = True

    def wait_snapshot(self, timeout_s: float = 60.0) -> None:
        """Wait for the snapshot being written, if any."""
        t = self._snapshot_thread
        if t is not None:
            t.join(timeout_s)

    # -- halts --------------------------------------------------------------------
    def note_halt(self, table_id: str, table_uri: str, why: str) -> None:
        """Record a halt of `table_id` (already in force in the publisher) on the commits topic, with the next transaction."""
        if any(tid == table_id and kind == HALT for tid, kind, _ in self._controls):
            return
        st = self.states.get(table_id)
        head = st.version if st is not None else -1
        self._controls.append((table_id, HALT, halt_record(table_id, table_uri, why, head, int(time.time() * 1000))))

    def flush_controls(self) -> None:
        """Record pending halts in a transaction of their own (when no batch comes to carry them)."""
        if not self._controls or self.producer is None:
            return
        outs = [self._control_out(d, kind) for _tid, kind, d in self._controls]
        try:
            self._transact([], outs, [])
        except FencedError:
            raise
        except ProducerStuckError as e:
            self._failed(str(e))
            self._replace_producer(e)
            return
        except KafkaException as e:
            self._failed(str(e))
            log.warning("partition %d: recording %d halts failed (%s); retrying with the next transaction", self.partition,
                        len(outs), e)
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction(60)
            return
        log.info("partition %d: recorded halts of %s", self.partition, sorted({t for t, _k, _d in self._controls}))
        self._controls = []

    def flush_offsets(self) -> None:
        """When idle, commit to the group the offset the last transactions recorded only in their records,
        so lag tools (and the group's view of this partition) are current while no batch comes."""
        if self.producer is None or self.committed_to <= self._group_offset or time.monotonic() < self._group_offset_retry_at:
            return
        try:
            self._transact([], [], [], offsets_to=self.committed_to)
        except FencedError:
            raise
        except ProducerStuckError as e:
            self._failed(str(e))
            self._replace_producer(e)
        except KafkaException as e:
            # Nothing depends on it (recovery reads the records): try again later, not at every idle poll.
            self._group_offset_retry_at = time.monotonic() + GROUP_OFFSET_RETRY_S
            log.warning("partition %d: committing offset %d to the group failed (%s); trying again in %.0fs",
                        self.partition, self.committed_to, e, GROUP_OFFSET_RETRY_S)
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction(60)

    def _control_out(self, d: Decision, kind: str) -> _Out:
        return _Out(self.settings.topics.commits, encode_decision(d), d.table_id.encode(), decision_headers(d, kind),
                    self.partition, -1, d)

    def _uri_of(self, table_id: str, proposals: Sequence[Submitted]) -> str:
        st = self.states.get(table_id)
        if st is not None:
            return st.table_uri
        return next((p.proposal.table_uri for p in proposals if p.proposal.table_id == table_id), "")

    @staticmethod
    def _encode_all(decided: Sequence[Decision], faults: dict[str, str]) -> dict[int, bytes]:
        """Encode the batch's decisions (by id()); a table whose decision cannot be encoded goes to `faults`."""
        out: dict[int, bytes] = {}
        for d in decided:
            if d.table_id in faults:
                continue
            try:
                out[id(d)] = encode_decision(on_the_wire(d))
            except Exception as e:  # a fault of this code on that table
                log.exception("encoding the decision of %s for table %s failed", d.proposal_id[:100], d.table_id[:200])
                faults[d.table_id] = (f"encoding a decision of this table failed unexpectedly ({type(e).__name__}: {e}); "
                                      "the table is halted so that the other tables go on. Report it with the log")
        return out

    def _probe(self, overlay: Overlay, probed: dict[tuple[str, int], str | None]) -> tuple[dict[str, str], dict[str, str]]:
        """Tables the batch would ratify a version of whose `<v>.json` already exists (foreign, why), and those whose
        store cannot say (unavailable, why). `probed` caches answers within the batch.

        A table whose lane has not published its newest ratified version yet is not asked: a Delta writer writes
        the version after the newest it lists, so `<v>.json` cannot appear around the coordinator before
        `<v-1>.json`, which is ours and unpublished; one written there meets our publication, which halts the table
        (and tells its writers the version is unpublished). Under load, when each question would cost the deciding
        thread a store round trip per batch, the lanes are busy and nothing is asked."""
        foreign: dict[str, str] = {}
        unavailable: dict[str, str] = {}
        lagging = self.publisher.lagging(overlay.tables)
        keys = {tid: (tid, live.version + 1 if (live := self.states.get(tid)) is not None else 0) for tid in overlay.tables
                if tid not in lagging}
        # (table id, next version) -> table URI, for the keys not asked yet in this batch
        todo = {key: overlay.tables[tid].table_uri for tid, key in keys.items() if key not in probed}

        def ask(key: tuple[str, int]) -> tuple[tuple[str, int], bool | Exception]:
            try:
                return key, self.publisher.locations.storage(todo[key]).exists(commit_key(key[1]))
            except (TableLocationError, StorageError, OSError, ValueError) as e:
                return key, e

        # The tables' stores are asked at once: on an object store each question is a round trip.
        answers = list(map(ask, todo)) if len(todo) < 2 else list(_probe_pool().map(ask, todo))
        for (tid, v), found in answers:
            if isinstance(found, Exception):
                unavailable[tid] = (f"the table's storage could not be checked for a version {v} written around the "
                                    f"coordinator ({found}); nothing was decided, retry")
                probed[(tid, v)] = "unavailable"
            else:
                probed[(tid, v)] = None if not found else (
                    f"_delta_log/{commit_key(v).rsplit('/', 1)[-1]} exists, but version {v} was not ratified: it was "
                    "written around the coordinator, and a commit as that version would be invisible. The table is "
                    "halted; see 'Recover a halted table'")
        for tid, key in keys.items():
            why = probed[key]
            if why == "unavailable":
                unavailable.setdefault(tid, "the table's storage could not be checked; retry")
            elif why is not None:
                foreign[tid] = why
        return foreign, unavailable

    def _claim_created(self, overlay: Overlay, proposals: Sequence[Submitted],
                       claims: dict[str, InvalidProposalError | None]) -> dict[str, InvalidProposalError]:
        """Claim the location of each table the batch creates (`claim_problem`); the tables refused, with why.
        `claims` caches answers within the batch."""
        refused: dict[str, InvalidProposalError] = {}
        for tid in overlay.created:
            if tid not in claims:
                st = overlay.tables[tid]
                by = next((x.proposal.proposal_id for x in proposals if x.proposal.table_id == tid
                           and x.proposal.read_version < 0), "")
                claims[tid] = claim_problem(self.publisher.locations, tid, st.table_uri, by, int(time.time() * 1000),
                                            creating=True)
                if claims[tid] is not None:
                    log.warning("partition %d: the creation of table %s at %s is refused: %s", self.partition, tid[:200],
                                st.table_uri[:500], str(claims[tid])[:500])
            why = claims[tid]
            if why is not None:
                refused[tid] = why
            else:
                self._claimed.add(tid)
        return refused

    def _confirm_claims(self, overlay: Overlay) -> dict[str, str]:
        """Tables the batch commits to whose location another table id holds -> why (they halt). A table not seen
        yet in this process claims its location if nobody does (one created or adopted before claims existed);
        a store that does not answer is asked again at the next batch."""
        todo = [(tid, st.table_uri) for tid, st in overlay.tables.items()
                if tid not in self._claimed and tid not in overlay.created]
        now_ms = int(time.time() * 1000)

        def ask(item: tuple[str, str]) -> tuple[str, str, Claim | Exception]:
            tid, uri = item
            try:
                return tid, uri, claim(self.publisher.locations.storage(uri), Claim(tid, now_ms, "a commit"))
            except (TableLocationError, StorageError, OSError, ValueError) as e:
                return tid, uri, e

        taken: dict[str, str] = {}
        answers = list(map(ask, todo)) if len(todo) < 2 else list(_probe_pool().map(ask, todo))
        for tid, uri, holder in answers:
            if isinstance(holder, Exception):
                log.info("partition %d: the claim of %s could not be checked (%s); asking again at the next batch",
                         self.partition, uri[:500], holder)
            elif holder.table_id == tid:
                self._claimed.add(tid)
            else:
                taken[tid] = (
                    f"{uri} is the location of table id {holder.table_id!r} ({CLAIM_KEY}), not of this table ({tid!r}): "
                    "two table ids over one _delta_log would both ratify the same versions, so this one is halted "
                    "before it ratifies any. Keep one of them: release the other (`deltacoord table release ... "
                    "--table-id ...`), or, if this table is the one to keep, remove the claim and resume it")
        return taken

    # -- the loop ---------------------------------------------------------------
    def process(self, batch: Sequence[Message]) -> None:
        """Decide one batch of this partition's proposals and commit the decisions with the offsets.

        An adopt or release request changes which tables this coordinator decides: it is answered in a
        transaction of its own, after the proposals before it and before those after it, so each proposal
        is decided against the tables as its position in the partition finds them.
        """
        assert self.producer is not None
        if not batch:
            return
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
        consumed_at = time.time()
        decoded = [self._decode(m) for m in batch]
        for m, x in zip(batch, decoded, strict=True):
            x.reply = self._reply_partition(m)
            x.ratified_only = header(m, H_WAIT) == WAIT_RATIFIED
        start = 0
        for i, x in enumerate(decoded):
            if x.request is None:
                continue
            if i > start and not self._decide(batch[start:i], decoded[start:i], consumed_at):
                return  # not recorded (or the partition was rebuilt): consumed again from the committed offset
            if not self._answer_request(batch[i], x, consumed_at):
                return
            start = i + 1
        if start < len(batch):
            self._decide(batch[start:], decoded[start:], consumed_at)

    def _decide(self, batch: Sequence[Message], decoded: Sequence[_Decoded], consumed_at: float) -> bool:
        """Decide and record these proposals; False when they were not recorded (the consumer was rewound) or
        the partition was rebuilt (a resumption): the rest of the fetched batch is then consumed again."""
        now_ms = int(time.time() * 1000)
        for x in decoded:
            released = [s.proposal for s in x.all_submitted() if s.proposal.table_id in self.released]
            if released and x.submitted is not None:
                at = x.submitted.at_ms or now_ms
                first = released[0]
                failure = rejection(first.table_id, first.table_uri, first.proposal_id,
                                    self._released_error(first.table_id), None, at)
                x.rejected, *x.parts_rejected = [failure if s.proposal is first else part_rejection(s.proposal, failure, at)
                                                 for s in x.all_submitted()]
                x.submitted, x.parts = None, []
        proposals = [s for x in decoded for s in x.all_submitted()]
        check_files = functools.partial(added_files_problem, self.publisher.locations)
        halted = self.publisher.halted_tables()
        # Tables whose store has not taken every ratified version: their compatible appends share versions.
        busy = self.publisher.lagging({x.proposal.table_id for x in proposals})
        decided, overlay = decide_batch(self.states, proposals, now_ms, halted=halted, check_files=check_files,
                                        earlier=self._earlier_decision, busy=busy)
        # One location is one table: a creation the batch accepts claims its location (`deltacoord.reader.claim`); one whose
        # location another table id holds, or that holds an uncoordinated Delta table, is refused.
        # Nothing acknowledged is invisible: no version of the batch may already have a file in _delta_log.
        # A decision that cannot be encoded is a fault of this code on its table: the table halts.
        claims: dict[str, InvalidProposalError | None] = {}
        refused: dict[str, InvalidProposalError] = {}
        probed: dict[tuple[str, int], str | None] = {}
        unavailable: set[str] = set()
        while True:
            taken = self._claim_created(overlay, proposals, claims)
            if taken:
                refused.update(taken)
                decided, overlay = decide_batch(self.states, proposals, now_ms, halted=halted, check_files=check_files,
                                                earlier=self._earlier_decision, refused_creates=refused, busy=busy)
                continue
            foreign, cannot = self._probe(overlay, probed)
            foreign.update(self._confirm_claims(overlay))
            if not foreign and not cannot:
                decided, cannot = self._by_reference(decided, proposals)
            encoded = self._encode_all(decided, foreign)
            if not foreign and not cannot:
                break
            if all(t in halted for t in [*foreign, *cannot]):
                raise RuntimeError(f"partition {self.partition}: the decisions of halted tables {sorted(foreign)} cannot be "
                                   "encoded either")
            for tid, why in foreign.items():
                uri = overlay.tables[tid].table_uri if tid in overlay.tables else self._uri_of(tid, proposals)
                log.error("partition %d: %s: %s", self.partition, tid, why)
                self.publisher.halt(tid, uri, why, notify=False)
                self.note_halt(tid, uri, why)
            unavailable.update(cannot)
            halted = {**halted, **foreign, **cannot}
            decided, overlay = decide_batch(self.states, proposals, now_ms, halted=halted, check_files=check_files,
                                            earlier=self._earlier_decision, refused_creates=refused, busy=busy)
        if unavailable:
            decided = [dataclasses.replace(d, reason_code=ReasonCode.STORAGE_UNAVAILABLE.value)
                       if d.table_id in unavailable and d.reason_code == ReasonCode.TABLE_HALTED.value
                       and d.table_id not in self.publisher.halted_tables() else d for d in decided]
        hints: dict[str, str] = {}
        decided = [self._with_table_hint(d, hints) if d.reason_code == ReasonCode.UNKNOWN_TABLE.value else d
                   for d in decided]
        for tid, why in overlay.halts.items():
            uri = self._uri_of(tid, proposals)
            self.publisher.halt(tid, uri, why, notify=False)
            self.note_halt(tid, uri, why)
        it = iter(decided)
        decisions: list[Decision] = []
        replies: list[tuple[int | None, bool]] = []
        outs: list[_Out] = []
        resumed: list[str] = []
        s = self.settings
        for x in decoded:
            answers = [next(it) for _ in x.all_submitted()] if x.submitted is not None else x.all_rejected()
            for d in answers:
                decisions.append(d)
                replies.append((x.reply, x.ratified_only))
                value = encoded.get(id(d))
                outs.append(_Out(s.topics.commits, value if value is not None else encode_decision(on_the_wire(d)),
                                 d.table_id.encode(),
                                 decision_headers(d), self.partition, x.offset, d))
            if x.dead is not None:
                outs.append(_Out(s.topics.dead_letters, x.dead.value, x.dead.key, x.dead.headers, None, x.offset))
            if x.resume is not None and x.resume not in resumed:
                st = self.states.get(x.resume)
                if st is None:
                    log.warning("partition %d: a request to resume table %s, which this partition does not hold; ignored",
                                self.partition, x.resume[:200])
                    continue
                resumed.append(x.resume)
                self._controls = [c for c in self._controls if c[0] != x.resume]
                self._controls.append((x.resume, RESUME, resume_record(x.resume, st.table_uri, st.version, now_ms)))
        controls = list(self._controls)
        outs.extend(self._control_out(d, kind) for _tid, kind, d in controls)
        dead = sum(1 for x in decoded if x.dead is not None)
        fault_point("after_decide")
        if not self._record(batch, outs):
            return False
        fault_point("after_kafka_commit")
        self._committed(batch)
        self._controls = [c for c in self._controls if c not in controls]
        self._drop_writer_staged(proposals)
        overlay.apply_to(self.states)
        for d in decisions:
            self.decided.remember(d)
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
        stable_at = None if self.txn_last_offset is None else (self.partition, self.txn_last_offset)
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
                                         staged=(d.proposal_id, d.staged) if d.staged is not None else None))
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
        if resumed:
            self._resume(resumed)
            return False
        self.maybe_snapshot()
        return True

    def _by_reference(self, decided: Sequence[Decision],
                      proposals: Sequence[Submitted]) -> tuple[list[Decision], dict[str, str]]:
        """Large commits are recorded by reference (`deltacoord.schemas.staged`): the whole commit is staged in the table's
        store before the transaction that ratifies it, and the decision names it by digest. Versions of proposals
        that came by reference, and any with more actions than a message should hold. Tables whose store did not
        take the file are returned with why (their batch is decided again without them: nothing is ratified)."""
        by_ref = {(x.proposal.table_id, x.proposal.proposal_id) for x in proposals if x.proposal.staged is not None}
        out: list[Decision] = []
        cannot: dict[str, str] = {}
        for d in decided:
            if (d.holds_version and d.staged is None
                    and ((d.table_id, d.proposal_id) in by_ref or len(d.actions) > DECISION_INLINE_MAX_ACTIONS)):
                try:
                    d = stage_decision(self.publisher.locations.storage(d.table_uri), d)
                except (TableLocationError, StorageError, OSError) as e:
                    cannot[d.table_id] = (f"the table's store did not take the staged commit of version {d.version} "
                                          f"({e}); nothing was decided, retry")
            out.append(d)
        return out, cannot

    def _drop_writer_staged(self, proposals: Sequence[Submitted]) -> None:
        """Once decided and recorded, a proposal's staged actions are not needed (the decision holds or names
        the commit): deleted off the deciding thread. One left by a crash is swept by VACUUM."""
        staged = [x.proposal for x in proposals if x.proposal.staged is not None]
        if not staged:
            return

        def drop(p: Proposal) -> None:
            assert p.staged is not None
            try:
                delete_writer_staged(self.publisher.locations.storage(p.table_uri), p.proposal_id, p.staged)
            except (TableLocationError, StorageError, OSError) as e:
                log.warning("partition %d: deleting the staged actions of %s failed (%s); VACUUM removes them",
                            self.partition, p.proposal_id[:100], e)

        for p in staged:
            _probe_pool().submit(drop, p)

    def _record(self, batch: Sequence[Message], outs: Sequence[_Out]) -> bool:
        """One transaction of `outs` with the offsets of `batch`; False (aborted and rewound, or the producer
        replaced) when it failed, so the batch is consumed again."""
        refused: list[_Refusal] = []
        try:
            self._transact(batch, outs, refused)
        except FencedError:
            raise
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
                time.sleep(min(0.05 * 2 ** min(self._failures, 5), 1.0))
            return False
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

    def _earlier_decision(self, table_id: str, proposal_id: str) -> Decision | None:
        """The first decision of a proposal id, for deciding proposals: an adoption or release record answered a
        control request, and is no answer to a proposal that reuses its id (recovery would fold the copy as one)."""
        first = self.decided.get(table_id, proposal_id)
        return None if first is None or control_kind(first) is not None else first

    # -- adoption and release (`deltacoord.coordinator.kafka.control`) ---------------------------------
    def _answer_request(self, m: Message, x: _Decoded, consumed_at: float) -> bool:
        """Answer an adopt or release request in a transaction of its own; then apply it. False when the
        transaction failed (the request is consumed again).

        A request id decided before (a resend, or a captured request replayed later) gets its first answer and
        changes nothing (`_answered_before`), as a proposal does."""
        assert x.submitted is not None and x.request is not None
        p, sig = x.submitted.proposal, x.submitted.signature
        at = x.submitted.at_ms or int(time.time() * 1000)
        again = self._answered_before(p, x.request, at)
        if again is not None:
            d, done = again, None
        elif x.request == ADOPT:
            d, done = self._adopt(p, sig, at)
        elif x.request == DROP:
            d, done = self._drop(p, sig, at)
        else:
            d, done = self._release(p, sig, at)
        kind = control_kind(d)
        controls = list(self._controls)
        # Pending halts first: an adoption lifts a halt of the table, so it is folded after them.
        outs = [self._control_out(c, k) for _tid, k, c in controls]
        outs.append(_Out(self.settings.topics.commits, encode_decision(d), d.table_id.encode(), decision_headers(d, kind),
                         self.partition, x.offset, d))
        if not self._record([m], outs):
            return False
        self._committed([m])
        self._controls = [c for c in self._controls if c not in controls]
        if done is not None:
            done()
        if kind in (None, ADOPT, RELEASE, DROP):
            self.decided.remember(d)  # as recovery does: the answer to a request (a rejection, or its record)
        if kind is None:
            self.metrics.rejections.labels(d.reason_code or "UNKNOWN").inc()
        self.metrics.proposals.labels(self._label).inc()
        if x.reply is not None and self.notices is not None:
            self.notices.decided(d, x.reply, {"consumed": consumed_at, "ratified": time.time()})
        log.warning("partition %d: %s request %s for table %s: %s", self.partition, x.request, p.proposal_id[:100],
                    p.table_id[:200], d.error_message if kind is not None else f"refused, {d.reason_code}: {d.error_message}")
        self.maybe_snapshot()
        return True

    def _answered_before(self, p: Proposal, request: str, at_ms: int) -> Decision | None:
        """The first answer again, when this request id was decided before (in the decided-ids window): an adoption
        or release record marked `duplicate_of` (recovery folds nothing of it), or the first rejection."""
        first = self.decided.get(p.table_id, p.proposal_id)
        if first is None:
            return None
        kind = control_kind(first)
        if kind == request:
            return dataclasses.replace(first, duplicate_of=first.winning_version if first.winning_version is not None
                                       else -1, decided_at_ms=at_ms)
        if kind is None and not first.committed:
            return repeated(first, at_ms)
        return self._refused(p, ReasonCode.BAD_PROPOSAL_ID, (
            f"the {request} request's id {p.proposal_id[:100]!r} was already used by another "
            f"{kind + ' request' if kind else 'proposal'} of table {p.table_id}: nothing was done. Send a new request "
            "(each `deltacoord table adopt|release|drop` makes a new id)"), at_ms)[0]

    def _refused(self, p: Proposal, reason: ReasonCode, why: str, at_ms: int) -> tuple[Decision, None]:
        return rejection(p.table_id, p.table_uri, p.proposal_id, InvalidProposalError(reason, why), None, at_ms), None

    def _adopt(self, p: Proposal, sig: Signature | None, at_ms: int) -> tuple[Decision, Callable[[], None] | None]:
        """Put an existing Delta table under coordination at its current version: read its state through this
        coordinator's own storage edge, check that it can be coordinated, answer with the adoption record."""
        tid, uri = p.table_id, p.table_uri
        if not is_request_id(p.proposal_id, ADOPT):
            return self._refused(p, ReasonCode.BAD_PROPOSAL_ID, (
                f"an adopt request's proposal id must be {CONTROL_PREFIX}{ADOPT}:<uuid>, not {p.proposal_id[:100]!r}"), at_ms)
        st = self.states.get(tid)
        if st is not None:
            if st.table_uri == uri and st.version == p.read_version:  # asked again (an answer lost): the same answer
                again = adoption_record(tid, uri, p.proposal_id, st.version, (
                    f"already coordinated at version {st.version}; nothing changed"), at_ms)
                return dataclasses.replace(again, duplicate_of=st.version), None
            return self._refused(p, ReasonCode.TABLE_ALREADY_COORDINATED, (
                f"table {tid} at {st.table_uri} is already under this coordinator (version {st.version}, the request saw "
                f"{p.read_version}): its writers commit through deltacoord; there is nothing to adopt"), at_ms)
        try:
            storage = self.publisher.locations.storage(uri)
            loaded = self.load_state(storage, None)
        except TableLocationError as e:
            return rejection(tid, uri, p.proposal_id, e, None, at_ms), None
        except StateLoadError as e:
            if e.kind == "missing":
                return self._refused(p, ReasonCode.UNKNOWN_TABLE, (
                    f"there is no Delta table at {uri} to adopt (no _delta_log with a commit or checkpoint). To make a new "
                    f"table there: `deltacoord table create {uri} --schema ...` (Python: Table(uri, ...).create(schema))"),
                    at_ms)
            if e.kind == "unreadable":
                return self._refused(p, ReasonCode.UNREADABLE_TABLE, f"the table cannot be adopted: {e}", at_ms)
            return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, f"the table was not adopted, retry: {e}", at_ms)
        if p.read_version != loaded.version:  # a delayed or replayed request is not taken for a fresh one
            return self._refused(p, ReasonCode.STALE_CONTROL_REQUEST, (
                f"the adopt request saw table {uri} at version {p.read_version}, but its log is at version "
                f"{loaded.version}: the request is older than the table's latest commits (sent long ago, or replayed), "
                "or its writer read another view of the store. Nothing was adopted; send a new request (`deltacoord "
                "table adopt` reads the current version)"), at_ms)
        problems = adoption_problems(loaded.protocol, loaded.metadata)
        if problems:
            return self._refused(p, ReasonCode.UNSUPPORTED_TABLE_FEATURE, (
                f"table {uri} (version {loaded.version}) cannot be coordinated: {'; '.join(problems)}. Keep writing it "
                "with an engine that supports these features, or change the table so it no longer needs them"), at_ms)
        adopted = loaded.table_state(tid, uri)
        err = authentication_error(adopted, p, sig) or admission_error(adopted, p, {})
        if err is None:  # one location, one table: another table id holding it refuses the adoption
            err = claim_problem(self.publisher.locations, tid, uri, p.proposal_id, at_ms, creating=False)
        if err is not None:
            return rejection(tid, uri, p.proposal_id, err, None, at_ms), None
        source = f"checkpoint {loaded.checkpoint_version} and the commits after it" if loaded.checkpoint_version is not None \
            else "its commits"
        d = adoption_record(tid, uri, p.proposal_id, loaded.version, (
            f"adopted at version {loaded.version} ({loaded.num_files} live files, read from {source}); this coordinator "
            f"decides version {loaded.version + 1} on"), at_ms)

        def done() -> None:
            self.states[tid] = adopted
            self._claimed.add(tid)
            self.released.pop(tid, None)
            self.publisher.resume(tid)  # a halt of the unknown table (a creation onto its log) is lifted
            self.publisher.mark_published(tid, loaded.version)
            self.metrics.tables.inc()

        return d, done

    def _release(self, p: Proposal, sig: Signature | None, at_ms: int) -> tuple[Decision, Callable[[], None] | None]:
        """Hand a table back to uncoordinated writers once everything ratified is in `_delta_log`."""
        tid = p.table_id
        if not is_request_id(p.proposal_id, RELEASE):
            return self._refused(p, ReasonCode.BAD_PROPOSAL_ID, (
                f"a release request's proposal id must be {CONTROL_PREFIX}{RELEASE}:<uuid>, not {p.proposal_id[:100]!r}"),
                at_ms)
        st = self.states.get(tid)
        if st is None:
            if tid in self.released:  # asked again: the same answer
                uri, head = self.released[tid]
                return dataclasses.replace(release_record(tid, uri, p.proposal_id, head, at_ms), duplicate_of=head), None
            return self._refused(p, ReasonCode.UNKNOWN_TABLE, (
                f"table {tid} is not under this coordinator: there is nothing to release"), at_ms)
        halted = self.publisher.halted(tid)
        if halted is not None:
            return self._refused(p, ReasonCode.TABLE_HALTED, (
                f"table {tid} is halted ({halted}); repair and resume it (`deltacoord table resume`) before releasing it, "
                "so that everything ratified is published first"), at_ms)
        err = authentication_error(st, p, sig) or admission_error(st, p, {})
        if err is not None:
            return rejection(tid, p.table_uri, p.proposal_id, err, None, at_ms), None
        published = self._wait_published(tid, st.version)
        halted = self.publisher.halted(tid)
        if halted is not None:
            return self._refused(p, ReasonCode.TABLE_HALTED, (
                f"table {tid} halted while its ratified versions were being published ({halted}); it was not released"),
                at_ms)
        if published < st.version:
            return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, (
                f"versions up to {st.version} are ratified but _delta_log holds only up to {published} after "
                f"{RELEASE_PUBLISH_WAIT_S:.0f}s: the table was not released (uncoordinated writers would overwrite what "
                "the publisher still owes). Retry once the publisher caught up"), at_ms)
        head, uri = st.version, st.table_uri
        d = release_record(tid, uri, p.proposal_id, head, at_ms)

        def done() -> None:
            self.states.pop(tid, None)
            self.released[tid] = (uri, head)
            self.publisher.forget([tid])
            self.metrics.tables.dec()
            self._claimed.discard(tid)
            try:  # the location is free: any table id may adopt it again
                drop_claim(self.publisher.locations.storage(uri), tid)
            except (TableLocationError, StorageError, OSError, ValueError) as e:
                log.warning("partition %d: table %s is released, but its claim %s/%s could not be removed (%s): "
                            "adopting the location under another table id is refused until it is removed",
                            self.partition, tid[:200], uri[:500], CLAIM_KEY, e)

        return d, done

    def _drop(self, p: Proposal, sig: Signature | None, at_ms: int) -> tuple[Decision, Callable[[], None] | None]:
        """Forget a table for good (Delta's DROP TABLE for a path table): once every version it ratified is
        published (or it is halted), optionally delete its files (`deleteFiles`), then record the drop; recovery
        and state snapshots never bring it back, and a table created later at its location starts from nothing.

        Keeping the files keeps a Delta table the coordinator no longer decides: its log must not carry the
        `deltacoord-coordinated` writer feature any more (the writer drops it first, as for a release), unless the
        log is gone. A halted table may be dropped (a table whose files were deleted is halted)."""
        tid = p.table_id
        if not is_request_id(p.proposal_id, DROP):
            return self._refused(p, ReasonCode.BAD_PROPOSAL_ID, (
                f"a drop request's proposal id must be {CONTROL_PREFIX}{DROP}:<uuid>, not {p.proposal_id[:100]!r}"), at_ms)
        delete = p.operation_parameters.get(DROP_DELETE_FILES) == "true"
        st = self.states.get(tid)
        if st is None and tid not in self.released:
            return self._refused(p, ReasonCode.UNKNOWN_TABLE, (
                f"table {tid} is not under this coordinator: there is nothing to drop (it was never created here, or "
                f"was dropped already). Files left at {p.table_uri} are no table of the coordinator's: delete them, or "
                f"adopt the Delta table they hold (`deltacoord table adopt {p.table_uri}`)"), at_ms)
        if st is not None:
            uri, head = st.table_uri, st.version
            err = authentication_error(st, p, sig) or admission_error(st, p, {})
            if err is not None:
                return rejection(tid, p.table_uri, p.proposal_id, err, None, at_ms), None
            if self.publisher.halted(tid) is None:
                published = self._wait_published(tid, st.version)
                if self.publisher.halted(tid) is None and published < st.version:
                    return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, (
                        f"versions up to {st.version} are ratified but _delta_log holds only up to {published} after "
                        f"{RELEASE_PUBLISH_WAIT_S:.0f}s: the table was not dropped. Retry once the publisher caught up"),
                        at_ms)
        else:
            uri, head = self.released[tid]
            if delete:
                return self._refused(p, ReasonCode.TABLE_RELEASED, (
                    f"table {tid} was released at version {head}: its files are its uncoordinated writers' now, and the "
                    "coordinator does not delete them. Drop it without --delete-files (the coordinator forgets it), "
                    "and delete the files with the tools that write the table"), at_ms)
        try:
            storage = self.publisher.locations.storage(uri)
            holder = read_claim(storage)
            on_disk = newest_commit_version(storage)
        except TableLocationError as e:
            return rejection(tid, p.table_uri, p.proposal_id, e, None, at_ms), None
        except (StorageError, OSError, ValueError) as e:
            return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, (
                f"the table's storage at {uri} could not be read ({e}); nothing was dropped, retry"), at_ms)
        if holder is not None and holder.table_id != tid:
            return self._refused(p, ReasonCode.TABLE_LOCATION_TAKEN, (
                f"{uri} is now the location of table id {holder.table_id!r} ({CLAIM_KEY}), not of {tid!r}: nothing was "
                f"dropped (nor deleted). Drop that table under its own id (--table-id {holder.table_id!r})"), at_ms)
        if p.read_version != on_disk:  # a delayed or replayed request is not taken for a fresh one
            return self._refused(p, ReasonCode.STALE_CONTROL_REQUEST, (
                f"the drop request saw {uri} at version {p.read_version}, but its _delta_log is at version {on_disk}: "
                "the request is older than the table's latest commits (sent long ago, or replayed), or its writer read "
                "another view of the store. Nothing was dropped; send a new request (`deltacoord table drop` reads the "
                "current version)"), at_ms)
        if (not delete and st is not None and on_disk >= 0 and st.protocol is not None and coordinated(st.protocol)):
            halted = self.publisher.halted(tid)
            return self._refused(p, ReasonCode.TABLE_HALTED if halted else ReasonCode.TABLE_ALREADY_COORDINATED, (
                f"table {tid} keeps its files, and its log still carries the deltacoord-coordinated writer feature, which "
                "would keep Delta writers out of a table no coordinator decides. " + (
                    f"The table is halted ({halted}): resume it (`deltacoord table resume`) so that the feature can be "
                    "dropped first, or delete its files with the drop (`deltacoord table drop --delete-files`)"
                    if halted else "Drop it through `deltacoord table drop` or Table.drop(), which drop the feature "
                    "first, or delete its files with the drop (--delete-files)")), at_ms)
        deleted = 0
        if delete:
            try:
                deleted = delete_table_files(storage)
            except (StorageError, OSError) as e:
                return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, (
                    f"deleting the files of {uri} failed ({e}); the table was not dropped and some of its files may be "
                    "gone: drop it again (with --delete-files) to finish"), at_ms)
        what = (f"its {deleted} files were deleted" if delete else
                "its files are kept (an uncoordinated Delta table, if it has a log)" if on_disk >= 0 else
                "it had no files left")
        d = drop_record(tid, uri, p.proposal_id, head, (
            f"dropped at version {head}: the coordinator forgot the table, and {what}; a table created at {uri} "
            "starts from version 0"), at_ms)

        def done() -> None:
            if self.states.pop(tid, None) is not None:
                self.metrics.tables.dec()
            self.released.pop(tid, None)
            self.publisher.reset(tid)
            self._claimed.discard(tid)
            # Where the dropped table's versions were recorded: a snapshot must not send recovery back to them.
            kept = [r for r in self._recorded_at if r[0] != tid]
            self._recorded_at.clear()
            self._recorded_at.extend(kept)
            self._controls = [c for c in self._controls if c[0] != tid]
            self.metrics.halted_tables.set(self.publisher.halted_count())
            if not delete:
                try:  # the location is free (files kept: any table id may adopt it)
                    drop_claim(storage, tid)
                except (StorageError, OSError, ValueError) as e:
                    log.warning("partition %d: table %s is dropped, but its claim %s/%s could not be removed (%s)",
                                self.partition, tid[:200], uri[:500], CLAIM_KEY, e)

        return d, done

    def _wait_published(self, table_id: str, version: int) -> int:
        """The table's published version once it reaches `version`, or after RELEASE_PUBLISH_WAIT_S (or a halt)."""
        deadline = time.monotonic() + RELEASE_PUBLISH_WAIT_S
        while True:
            published = self.publisher.published_version(table_id)
            if published >= version or self.publisher.halted(table_id) is not None or time.monotonic() >= deadline:
                return published
            self._heartbeat()
            time.sleep(0.01)

    def _released_error(self, table_id: str) -> InvalidProposalError:
        uri, head = self.released[table_id]
        return InvalidProposalError(ReasonCode.TABLE_RELEASED, (
            f"table {table_id} was released from coordination at version {head}: deltacoord no longer decides its "
            f"commits. To commit through deltacoord again, stop its uncoordinated writers and adopt it: "
            f"`deltacoord table adopt {uri}` (Python: Table(uri, ...).adopt())"))

    def _with_table_hint(self, d: Decision, hints: dict[str, str]) -> Decision:
        """An UNKNOWN_TABLE rejection with what to do: adopt the Delta table found at its location, or create one."""
        uri = d.table_uri
        if uri not in hints:
            try:
                head = newest_commit_version(self.publisher.locations.storage(uri))
            except (TableLocationError, StorageError, OSError, ValueError):
                head = None
            if head is None:
                hints[uri] = (f" If a Delta table exists at {uri}, adopt it: `deltacoord table adopt {uri}`; else create "
                              f"it: `deltacoord table create {uri} --schema ...`")
            elif head >= 0:
                hints[uri] = (f" A Delta table exists at {uri} (version {head}), but this coordinator does not decide its "
                              f"commits: put it under coordination with `deltacoord table adopt {uri}` (Python: "
                              "Table(uri, ...).adopt())")
            else:
                hints[uri] = (f" There is no Delta table at {uri}: create it first with `deltacoord table create {uri} "
                              "--schema ...` (Python: Table(uri, ...).create(schema))")
        return dataclasses.replace(d, error_message=f"{d.error_message or ''}{hints[uri]}")

    # -- progress and poison -------------------------------------------------------
    def _committed(self, batch: Sequence[Message]) -> None:
        last = batch[-1].offset()
        assert last is not None
        self.committed_to = last + 1
        self.last_commit = time.monotonic()
        self.last_failure = None
        self._failures = 0
        self._degraded = {o: v for o, v in self._degraded.items() if o >= self.committed_to}
        self.observe()

    def _failed(self, why: str) -> None:
        self.metrics.transaction_failures.inc()
        self.last_failure = why
        self._failures += 1

    def _degrade(self, refused: Sequence[_Refusal]) -> bool:
        """One more degradation step for the largest record Kafka refused on each topic (see the module docstring);
        False when none was left to take.

        Kafka refuses a whole record batch, so a small record sharing a batch with a large one is refused
        too; only the largest is certainly too large (a batch grows past `batch.size` only with one record).
        """
        largest: dict[str, _Refusal] = {}
        for r in refused:
            if r.topic not in largest or r.size > largest[r.topic].size:
                largest[r.topic] = r
        degraded = False
        for offset, why in sorted({r.source: r.why for r in largest.values()}.items()):
            step = self._degraded.get(offset, (FULL, ""))[0] + 1
            source = f"{self.settings.topics.proposals}/{self.partition}@{offset}"
            if step > REJECTION_ONLY:
                # Even a bare rejection was refused: the commits topic cannot take a small record,
                # which no message causes. Retried like any other failure; /healthz shows the stall.
                log.error("partition %d: Kafka refuses even the bare rejection of %s (%s); check the commits "
                          "topic's max.message.bytes", self.partition, source, why)
                continue
            self._degraded[offset] = (step, why)
            degraded = True
            self.metrics.unrecordable.labels("headers_only" if step == HEADERS_ONLY else "rejection_only").inc()
            log.error("partition %d: Kafka refused to record what answers %s (%s); %s", self.partition, source, why,
                      "recording a rejection and a dead letter without its bytes instead" if step == HEADERS_ONLY
                      else "recording only its rejection (if it names a proposal) and skipping it")
        return degraded

    def observe(self) -> None:
        """Note whether proposals wait on this partition (the loop calls it; `/healthz` reads the result)."""
        # Local reads (no broker round trip): the end offset from the last fetch, and the position,
        # which moves past transaction markers and aborted records that are never delivered.
        try:
            _low, high = self.consumer.get_watermark_offsets(self._tp, cached=True)
            position = self.consumer.position([self._tp])[0].offset
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
        if idle <= self.settings.stall_timeout_s:
            return None
        why = f"partition {self.partition}: proposals wait from offset {self.committed_to} and no batch was committed for {idle:.0f}s"
        return f"{why} (last failure: {self.last_failure})" if self.last_failure else why

    # -- decoding -------------------------------------------------------------------
    def _reply_partition(self, m: Message) -> int | None:
        """The valid reply partition a message names, or None (no replies topic, no or a bad header)."""
        n = self.notices.num_partitions if self.notices is not None else 0
        raw = header(m, H_REPLY_PARTITION)
        if n <= 0 or raw is None or not raw.isdigit() or len(raw) > 9:
            return None
        p = int(raw)
        return p if p < n else None

    def _decode(self, m: Message) -> _Decoded:
        offset = m.offset()
        assert offset is not None
        x = self._decode_fully(m, offset)
        step, why = self._degraded.get(offset, (FULL, ""))
        if step == FULL:
            return x
        # Kafka refused to record this message's answer as it was: a rejection (a decodable proposal
        # is not decided) and at most a dead letter without bytes.
        rejected = x.rejected
        parts_rejected = x.parts_rejected
        if x.submitted is not None:
            p = x.submitted.proposal
            at = x.submitted.at_ms or int(time.time() * 1000)
            rejected = rejection(p.table_id, p.table_uri, p.proposal_id, InvalidProposalError(
                ReasonCode.UNRECORDABLE, f"Kafka refused to record this proposal's decision ({why}); the proposal was "
                "not decided: make it smaller"), None, at)
            parts_rejected = [part_rejection(q.proposal, rejected, at) for q in x.parts]
        if rejected is not None and max(len(rejected.table_id), len(rejected.proposal_id), len(rejected.table_uri)) > MAX_ECHOED_ID_CHARS:
            rejected = None
        dead = None
        if step == HEADERS_ONLY:
            error = f"{_error_of(x, rejected)}; not recorded with its bytes: {why}"
            dead = dead_letter(m.value(), None, error, _source(m), 0)
        return _Decoded(offset, rejected=rejected, dead=dead, parts_rejected=parts_rejected if rejected else [])

    def _load_staged(self, p: Proposal, at_ms: int) -> Proposal | Decision:
        """The proposal with its staged actions loaded (the Kafka edge: the rules only see whole proposals), or its
        rejection (STAGED_COMMIT_INVALID, or STORAGE_UNAVAILABLE when the store does not answer). A proposal
        decided before (a redelivery after its staged file was deleted) goes on to be answered as decided."""
        st = self.states.get(p.table_id)
        known = self.decided.get(p.table_id, p.proposal_id) is not None or (
            st is not None and st.committed_version_of(p.proposal_id) is not None)
        if known:
            return p  # a redelivery: answered with its first decision, nothing to load
        try:
            return load_proposal(self.publisher.locations.storage(p.table_uri), p, self.settings.max_staged_bytes)
        except StagedCommitError as e:
            if known:
                return p
            reason = ReasonCode.OVERSIZE if isinstance(e, StagedCommitTooLargeError) else ReasonCode.STAGED_COMMIT_INVALID
            err = InvalidProposalError(reason, f"{e}; nothing was decided")
        except (TableLocationError, StorageError, OSError) as e:
            if known:
                return p
            err = InvalidProposalError(ReasonCode.STORAGE_UNAVAILABLE, (
                f"the proposal's staged actions could not be read ({e}); nothing was decided, retry"))
        log.warning("partition %d: refused proposal %s for table %s: %s", self.partition, p.proposal_id[:100],
                    p.table_id[:200], err)
        return rejection(p.table_id, p.table_uri, p.proposal_id, err, None, at_ms)

    def _decode_fully(self, m: Message, offset: int) -> _Decoded:
        raw = m.value()
        at_ms = max(0, m.timestamp()[1])
        source = _source(m)
        control = header(m, H_CONTROL)
        request: str | None = None
        if control is not None:
            table_id = _header(m, H_TABLE_ID)
            if control == RESUME.encode() and table_id:
                log.warning("partition %d: %s asks to resume table %s", self.partition, source, table_id[:200])
                return _Decoded(offset, resume=table_id)
            if control not in (ADOPT.encode(), RELEASE.encode(), DROP.encode()):
                error = (f"a control message that is not a resume request with a table id, nor an adopt, release or drop "
                         f"request "
                         f"(control={control[:100]!r})")
                return _Decoded(offset, dead=dead_letter(raw, m.key(), error, source, self.settings.dead_letter_max_bytes))
            request = control.decode()
        try:
            if raw is None:
                raise DecodeError("empty message (no value)")
            if len(raw) > self.settings.max_proposal_bytes:
                raise InvalidProposalError(
                    ReasonCode.OVERSIZE,
                    f"proposal of {len(raw)} bytes exceeds the limit of {self.settings.max_proposal_bytes} bytes",
                )
            p = decode_proposal(raw)
        except (DecodeError, InvalidProposalError) as e:
            dead = dead_letter(raw, m.key(), str(e), source, self.settings.dead_letter_max_bytes)
            hdr_pid, hdr_tid = _header(m, H_PROPOSAL_ID), _header(m, H_TABLE_ID)
            if hdr_pid and hdr_tid and max(len(hdr_pid), len(hdr_tid)) <= MAX_ECHOED_ID_CHARS:
                # The writer said who it is: tell it, so it does not wait for nothing.
                err = e if isinstance(e, InvalidProposalError) else InvalidProposalError(ReasonCode.UNDECODABLE, str(e))
                return _Decoded(offset, rejected=rejection(hdr_tid, "", hdr_pid, err, None, at_ms or int(time.time() * 1000)),
                                dead=dead)
            return _Decoded(offset, dead=dead)
        if p.transaction is not None and request is None:
            signer, signature = header(m, H_SIGNER), header(m, H_SIGNATURE)
            sig = None
            if signer is not None and signature is not None:
                sig = Signature(signer.decode("utf-8", errors="replace"), signature, raw)
            return self._decode_transaction(p, offset, at_ms or int(time.time() * 1000), sig)
        if self.num_partitions > 0:
            home = partition_for(p.table_id, self.num_partitions)
            if home != self.partition:
                log.warning("partition %d: proposal %s for table %s arrived at %s, but the table's partition is %d of %d; "
                            "rejected (WRONG_PARTITION)", self.partition, p.proposal_id[:100], p.table_id[:200], source,
                            home, self.num_partitions)
                err = InvalidProposalError(ReasonCode.WRONG_PARTITION, (
                    f"table {p.table_id} belongs to partition {home} of {self.num_partitions} "
                    f"(murmur2(table id) % partitions), not {self.partition}: nothing was decided. Is the writer's "
                    "partition count stale (topics changed)?"))
                return _Decoded(offset, rejected=rejection(p.table_id, p.table_uri, p.proposal_id, err, None,
                                                           at_ms or int(time.time() * 1000)))
        # The door: a table location this coordinator may not serve is refused before anything is decided.
        refused = self.publisher.locations.problem(p.table_uri)
        if refused is not None:
            log.warning("partition %d: refused proposal %s for table %s: %s %s", self.partition, p.proposal_id[:100],
                        p.table_id[:200], refused.reason, str(refused)[:500])
            return _Decoded(offset, rejected=rejection(p.table_id, p.table_uri, p.proposal_id, refused, None,
                                                       at_ms or int(time.time() * 1000)))
        signer, signature = header(m, H_SIGNER), header(m, H_SIGNATURE)
        sig = None
        if signer is not None and signature is not None:
            sig = Signature(signer.decode("utf-8", errors="replace"), signature, raw)
        if p.staged is not None:
            loaded = self._load_staged(p, at_ms or int(time.time() * 1000))
            if isinstance(loaded, Decision):
                return _Decoded(offset, rejected=loaded)
            p = loaded
        if request is not None:
            log.warning("partition %d: %s asks to %s table %s", self.partition, source, request, p.table_id[:200])
        return _Decoded(offset, submitted=Submitted(p, at_ms, sig), request=request)

    def _decode_transaction(self, p: Proposal, offset: int, at_ms: int, sig: Signature | None) -> _Decoded:
        """A multi-table transaction's message: its parts to decide together (each stamped with the transaction in
        its commitInfo), or all of them refused with the reason one of them is."""
        assert p.transaction is not None
        tx = p.transaction
        parts = [dataclasses.replace(q, transaction=tx.without_parts()) for q in p.parts]
        err: InvalidProposalError | None = None
        failing = parts[0]
        ids = [q.table_id for q in parts]
        if tuple(ids) != tx.tables or len(set(ids)) != len(ids) or any(
                q.transaction is None or q.transaction.id != tx.id or q.transaction.tables != tx.tables for q in parts):
            err = InvalidProposalError(ReasonCode.BAD_TRANSACTION, (
                f"multi-table transaction {tx.id} is not well formed: its tables {list(tx.tables)} must be its parts' "
                f"tables {ids}, each once, and every part must name the transaction; nothing was decided"))
        homes = {q.table_id: partition_for(q.table_id, self.num_partitions) for q in parts} if self.num_partitions > 0 else {}
        if err is None and any(h != self.partition for h in homes.values()):
            failing = next(q for q in parts if homes[q.table_id] != self.partition)
            err = InvalidProposalError(ReasonCode.TRANSACTION_SPANS_PARTITIONS, spans_partitions_message(
                tx.id, homes, self.num_partitions) + "; nothing was decided")
        if err is None:
            for q in parts:
                refused = self.publisher.locations.problem(q.table_uri)
                if refused is not None:
                    failing, err = q, refused
                    break
        loaded: list[Proposal] = []
        if err is None:
            for q in parts:
                if q.staged is not None:
                    got = self._load_staged(q, at_ms)
                    if isinstance(got, Decision):
                        return self._refused_transaction(parts, q, got, offset, at_ms)
                    q = got
                loaded.append(_stamped(q, tx))
        if err is not None:
            log.warning("partition %d: refused multi-table transaction %s: %s %s", self.partition, tx.id[:100],
                        err.reason, str(err)[:500])
            failure = rejection(failing.table_id, failing.table_uri, failing.proposal_id, err, None, at_ms)
            return self._refused_transaction(parts, failing, failure, offset, at_ms)
        first, *rest = [Submitted(q, at_ms, sig) for q in loaded]
        return _Decoded(offset, submitted=first, parts=rest)

    @staticmethod
    def _refused_transaction(parts: Sequence[Proposal], failing: Proposal, failure: Decision, offset: int,
                             at_ms: int) -> _Decoded:
        first, *rest = [failure if q is failing else part_rejection(q, failure, at_ms) for q in parts]
        return _Decoded(offset, rejected=first, parts_rejected=rest)

    def _transact(self, batch: Sequence[Message], outs: Sequence[_Out], refused: list[_Refusal], *,
                  offsets_to: int | None = None) -> None:
        """One transaction: the records and the offset the batch consumed up to (or `offsets_to`, for a
        transaction of the offset alone). Commits-topic records carry that offset (`H_NEXT_OFFSET`); the
        group's offset is committed in the transaction only when no such record does or every
        `group_offset_interval_s`. Records Kafka refuses for what they are (`RECORD_REFUSALS`) are appended to
        `refused` before the error propagates."""
        assert self.producer is not None
        s = self.settings
        nxt = offsets_to
        if batch:
            last_offset = batch[-1].offset()
            assert last_offset is not None
            nxt = last_offset + 1
        carried = bool(batch) and any(o.topic == s.topics.commits for o in outs)
        mark: list[tuple[str, str | bytes | None]] = [(H_NEXT_OFFSET, str(nxt).encode())] if carried else []
        to_group = nxt is not None and (not carried or time.monotonic() - self._group_offset_at >= s.group_offset_interval_s)

        def note(o: _Out, err: KafkaError) -> None:
            size = len(o.value or b"") + len(o.key or b"") + sum(len(k) + len(v or b"") for k, v in o.headers)
            refused.append(_Refusal(o.source, o.topic, size, f"{o.topic}: {err.str()}"))

        def noted(o: _Out) -> Callable[[KafkaError | None, Message], None]:
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
                self._group_offset, self._group_offset_at = nxt, time.monotonic()
            self._note_recorded()
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
        self.consumer.seek(TopicPartition(self.settings.topics.proposals, self.partition, self.start()))

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
        if group > self.committed_to:
            raise FencedError(f"partition {self.partition}: another coordinator decided proposals up to offset {group} "
                              f"while this one's producer was stuck (it had committed up to {self.committed_to}); "
                              f"leaving the partition to it") from cause

    def _abort_and_rewind(self, cause: KafkaException) -> None:
        assert self.producer is not None
        try:
            self.producer.abort_transaction(60)
        except KafkaException as e:
            kerr = e.args[0]
            if isinstance(kerr, KafkaError) and kerr.fatal():
                raise FencedError(f"partition {self.partition}: {kerr}") from cause
        # The states never held this batch (its overlay is dropped): consume it again from the offset the
        # last committed transaction consumed up to (the group's offset may lag it: `group_offset_interval_s`).
        self.consumer.seek(TopicPartition(self.settings.topics.proposals, self.partition, self.committed_to))


def _stamped(p: Proposal, tx: MultiTable) -> Proposal:
    """A part whose commitInfo records its transaction (`TRANSACTION_KEY`), so `history` shows which versions go
    together: the coordinator's stamp, whatever the writer put there."""
    values = {**p.commit_info.values, TRANSACTION_KEY: {"id": tx.id, "tables": list(tx.tables)}}
    return dataclasses.replace(p, commit_info=CommitInfo(values))


def _source(m: Message) -> str:
    return f"{m.topic()}/{m.partition()}@{m.offset()}"


def _error_of(x: _Decoded, rejected: Decision | None) -> str:
    """What went wrong with a degraded message, for its dead letter."""
    if x.dead is not None:
        for k, v in x.dead.headers:
            if k == H_ERROR and isinstance(v, bytes):
                return v.decode("utf-8", errors="replace")
    if rejected is not None and rejected.error_message:
        return rejected.error_message
    return "a proposal whose decision Kafka refused to record"


def _committed_with_retry(consumer: Consumer, tp: TopicPartition, timeout_s: float = 60.0) -> list[TopicPartition]:
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
