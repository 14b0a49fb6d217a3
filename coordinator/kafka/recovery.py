"""Reading the commits topic: the source of truth that table states are rebuilt from.

`read_decisions` streams the committed decisions of one commits partition
(read_committed, so aborted transactions are never seen), refusing to stop
short of the high watermark: a partial history would rebuild wrong states.
`rebuild_states` folds them into `TableState`s (event sourcing) and reports,
per table, which versions are ratified but missing from `_delta_log`.
A coordinator reads its partitions once, when it takes them over; an aborted
batch never needs them again (see `deltacoord.coordinator.rules.batch`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from deltacoord.coordinator.delta_log.adoption import PublishedState, StateLoadError, load_published_state
from deltacoord.coordinator.delta_log.table_files import deleted_problem, location_claimed
from deltacoord.coordinator.kafka.control import ADOPT, DROP, HALT, RELEASE, RESUME, control_kind
from deltacoord.coordinator.locations import TableLocationError, TableLocations
from deltacoord.coordinator.rules.authentication import registers_writer_keys
from deltacoord.coordinator.rules.decided import DecidedIds
from deltacoord.coordinator.rules.state import TableState
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import newest_commit_version
from deltacoord.reader.staged_commits import resolve_decision_bytes
from deltacoord.schemas.codec import decode_decision
from deltacoord.schemas.commits_topic import PartitionScan, ScanIncompleteError, read_committed
from deltacoord.schemas.commits_topic import watermarks as watermarks  # asked for here by the recovery tests
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.routing import H_NEXT_OFFSET, H_TABLE_ID, H_VERSION, header
from deltacoord.schemas.staged import StagedCommitError
from deltacoord.storage.table import StorageError, TableStorage

log = logging.getLogger(__name__)


class RecoveryError(DeltaCoordError, RuntimeError):
    """The commits topic could not be read to its end; state must not be rebuilt from part of it."""


#: How long recovery asks for a commits partition's offsets while its leader moves (a leader election takes
#: seconds, and recovery must not fail the daemon for it).
WATERMARKS_BUDGET_S = 90.0


class SnapshotUnusableError(RecoveryError):
    """A state snapshot cannot serve this recovery (a table's `_delta_log` lacks versions it does not say how to find)."""


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
    for d, _offset in read_decisions_at(settings, partition, table_id=table_id, min_version=min_version,
                                        stall_timeout_s=stall_timeout_s, on_record=on_record):
        yield d


def read_decisions_at(
    settings: CoordinatorSettings, partition: int, *, table_id: str | None = None, min_version: int = 0,
    stall_timeout_s: float = 120.0, on_record: Callable[[], None] | None = None, from_offset: int | None = None,
    on_end: Callable[[int], None] | None = None, on_next_offset: Callable[[int], None] | None = None,
) -> Iterator[tuple[Decision, int]]:
    """`read_decisions` with each record's offset, from `from_offset` (default: the start of the partition).

    `on_end` is called first with the offset the read ends at (the high watermark); `on_next_offset` with the
    `deltacoord.next_offset` of every record that carries one (before any table filter)."""
    conf = settings.client(
        {"fetch.message.max.bytes": max(settings.max_proposal_bytes * 2, 1_048_576)},
        **read_committed({}, f"{settings.group_id}-recovery"),
    )

    def fetched(m: Message) -> None:
        if on_record is not None:
            on_record()
        if on_next_offset is not None and (nxt := _header(m, H_NEXT_OFFSET)) is not None:
            on_next_offset(int(nxt))

    wanted: dict[str, set[bytes]] = {} if table_id is None else {H_TABLE_ID: {table_id.encode()}}
    # Read up to the high watermark, however long the broker takes: a partial history would rebuild wrong table
    # states. Only lack of progress is an error.
    with PartitionScan(conf, settings.topics.commits, partition, from_offset=from_offset, headers=wanted,
                       on_record=fetched, budget_s=WATERMARKS_BUDGET_S, stall_s=stall_timeout_s) as scan:
        if on_end is not None:
            on_end(scan.end)
        try:
            for m in scan:
                if min_version > 0:
                    v = _header(m, H_VERSION)
                    if v is None or int(v) < min_version:
                        continue
                value = m.value()
                if value is not None:
                    yield decode_decision(value), m.offset() or 0
        except ScanIncompleteError as e:
            raise RecoveryError(str(e)) from e


@dataclass
class Recovered:
    """What recovery rebuilt of one commits partition."""

    states: dict[str, TableState] = field(default_factory=dict)
    #: Halted tables (their last control record is a halt, or recovery halted them) -> (table uri, why).
    halted: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Halts found by this recovery, not yet on the commits topic (the caller records them).
    new_halts: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Tables released to uncoordinated writers (their last adopt/release record is a release) -> (table uri,
    #: the version they were released at).
    released: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: Per table, ratified versions to (re)publish, oldest first, with their commits-topic offsets: those not in
    #: `_delta_log`, and the newest one there.
    to_publish: dict[str, list[tuple[Decision, int]]] = field(default_factory=dict)
    decided: DecidedIds = field(default_factory=DecidedIds)
    #: The commits-topic offset read up to (exclusive) and how many records were read.
    end_offset: int = 0
    records: int = 0
    #: (offset, proposal id) of the last record folded (None: none yet).
    last: tuple[int, str] | None = None
    #: The state snapshot recovery started from (its offset), if any.
    snapshot_offset: int | None = None
    #: The proposals offset the committed transactions consumed up to, as their records say
    #: (`deltacoord.next_offset`; 0: none says).
    proposals_next: int = 0
    #: (table id, version) -> the bytes of a version in `to_publish` recorded by reference, to publish as they are.
    staged_data: dict[tuple[str, int], bytes] = field(default_factory=dict)

    def halt(self, table_id: str, table_uri: str, why: str) -> None:
        """Halt a table this recovery found at fault (recorded by the caller)."""
        log.error("halting table %s during recovery: %s", table_id, why)
        self.halted[table_id] = (table_uri, why)
        self.new_halts[table_id] = (table_uri, why)
        self.to_publish.pop(table_id, None)


def rebuild_states(settings: CoordinatorSettings, partition: int, *, publish: Callable[[Decision], None] | None = None,
                   new_table: Callable[[str], None] = lambda uri: None, heartbeat: Callable[[], None] = lambda: None,
                   on_record: Callable[[], None] | None = None,
                   published_version: Callable[[str], int] = newest_commit_version,
                   base: Recovered | None = None, from_offset: int | None = None,
                   republish_from: Mapping[str, tuple[int, int]] | None = None,
                   load_state: Callable[[str, int], PublishedState] | None = None,
                   resolve: Callable[[Decision], tuple[Decision, bytes | None]] | None = None,
                   claimed: Callable[[str], bool | None] | None = None) -> Recovered:
    """Table states as the fold of the partition's committed decisions (event sourcing), from the
    start of the partition or from `from_offset` on top of `base` (a snapshot's state); with
    `republish_from` (table id -> (offset, version)) the records from there to `from_offset` are read
    again only for the versions of those tables `_delta_log` still lacks. A table of `base` whose
    `_delta_log` lacks older versions than that raises SnapshotUnusableError.

    Ratified versions missing from `_delta_log` (a crash between the Kafka commit
    and publication) are listed in `to_publish`, oldest first (`publish`, if
    given, is called with each at the end); so is every version after the last
    one known to be published (a snapshot says which; without one, from the
    newest version on disk), which put-if-absent compares byte for byte with what
    `_delta_log` holds. `new_table(table_uri)`
    runs once per table, first; `published_version(table_uri)` is the newest
    version in its `_delta_log`.

    A fault of one table halts that table, never the recovery: a version that
    does not follow its predecessor, an error applying it, and a `_delta_log`
    holding versions beyond the newest one Kafka ratified (written around the
    coordinator: the next commit would be acknowledged but invisible). Control
    records (`deltacoord.coordinator.kafka.control`) halt and resume tables, adopt and release them: an adoption at
    version N replaces the table's state by its published log at N (`load_state(table_uri, N)`, default
    `adoption.load_published_state` with the settings' storage options), whose failure halts that table; a
    release drops the table's state (it is listed in `released`). A version recorded by reference is
    resolved to its whole commit (`resolve`, default `deltacoord.reader.staged_commits.resolve_decision` through the
    settings' locations); one that cannot be halts its table.

    A drop record ends a table: everything folded of it so far is forgotten (state, halt, release, versions to
    republish), so a table created later under the same id starts from nothing. A table whose location has neither
    a log nor a claim (`claimed(table_uri)`, default: the claim object through the settings' storage options) was
    deleted around the coordinator: it is halted (`deltacoord.coordinator.delta_log.table_files.deleted_problem`, naming
    `deltacoord table drop`) rather than republished over data files that are gone.
    """
    rec = base if base is not None else Recovered(decided=DecidedIds(settings.decided_ids_limit,
                                                                     settings.decided_ids_max_age_ms))
    states = rec.states

    def remember(d: Decision) -> None:  # as the partition loop does (`PartitionTables.remember`)
        rec.decided.remember(d, signed=registers_writer_keys(states.get(d.table_id)))

    if load_state is None:
        def load_state(table_uri: str, version: int) -> PublishedState:
            return load_published_state(TableStorage(table_uri, settings.storage_options), version)
    if resolve is None:
        resolve = decision_resolver(settings)
    if claimed is None:
        def claimed(table_uri: str) -> bool | None:
            return location_claimed(TableStorage(table_uri, settings.storage_options))
    on_disk: dict[str, int] = {}
    #: Per table, the first version to (re)publish: every ratified version from there on is compared byte
    #: for byte with `_delta_log` (put-if-absent), written where it is missing.
    compare_from: dict[str, int] = {}

    def first_sight(table_id: str, table_uri: str) -> None:
        on_disk[table_id] = compare_from[table_id] = published_version(table_uri)
        new_table(table_uri)

    for known in states.values():
        first_sight(known.table_id, known.table_uri)
    broken: set[str] = set()  # tables whose later versions cannot be applied (halted)
    n = 0
    fold_from = from_offset or 0
    again: dict[str, int] = {}
    for tid, st0 in states.items():
        # A snapshot knows what was published when it was written: every version after that is compared.
        offset_version = (republish_from or {}).get(tid)
        compare_from[tid] = min(on_disk[tid], offset_version[1] if offset_version else st0.version + 1)
        if tid in rec.halted:
            continue
        if offset_version is not None and offset_version[0] < fold_from:
            again[tid] = offset_version[0]
        if on_disk[tid] < st0.version and (offset_version is None or on_disk[tid] + 1 < offset_version[1]):
            raise SnapshotUnusableError(
                f"table {tid}: _delta_log ends at version {on_disk[tid]}, the snapshot at offset {fold_from} holds it at "
                f"{st0.version} and knows where to find versions from {offset_version[1] if offset_version else '-'} on")
    start = min([fold_from, *again.values()])

    def ended(high: int) -> None:
        rec.end_offset = max(high, fold_from)

    def consumed_to(nxt: int) -> None:
        rec.proposals_next = max(rec.proposals_next, nxt)

    for d, offset in read_decisions_at(settings, partition, from_offset=start, on_record=on_record, on_end=ended,
                                       on_next_offset=consumed_to):
        n += 1
        if n % 1000 == 0:
            heartbeat()  # a long recovery is progress, not a hang
        if offset < fold_from:  # already in the snapshot: only a version _delta_log may still lack
            tid = d.table_id
            if (tid in again and offset >= again[tid] and d.holds_version and d.version is not None
                    and d.version >= compare_from[tid] and d.version <= states[tid].version):
                try:
                    whole, data = resolve(d)
                except (StagedCommitError, TableLocationError, StorageError, OSError) as e:
                    rec.halt(tid, d.table_uri, f"version {d.version} cannot be republished: {e}")
                    continue
                rec.to_publish.setdefault(tid, []).append((whole, offset))
                if data is not None and whole.version is not None:
                    rec.staged_data[(tid, whole.version)] = data
            continue
        rec.last = (offset, d.proposal_id)
        kind = control_kind(d)
        if kind == HALT:
            rec.halted[d.table_id] = (d.table_uri, d.error_message or "halted")
            rec.new_halts.pop(d.table_id, None)
            continue
        if kind == RESUME:
            rec.halted.pop(d.table_id, None)
            rec.new_halts.pop(d.table_id, None)
            continue
        if kind == ADOPT:
            remember(d)  # a replay of the request gets this answer again (`PartitionCoordinator._answer_request`)
            _fold_adoption(rec, d, load_state, first_sight, broken)
            continue
        if kind == DROP:
            remember(d)
            if d.duplicate_of is None:  # a drop answered again changed nothing
                _fold_drop(rec, d.table_id, broken, on_disk, compare_from)
            continue
        if kind == RELEASE:
            remember(d)
            if d.duplicate_of is not None:  # a release answered again changed nothing
                continue
            states.pop(d.table_id, None)
            rec.to_publish.pop(d.table_id, None)  # published before the release was recorded
            broken.discard(d.table_id)
            rec.released[d.table_id] = (d.table_uri, d.winning_version if d.winning_version is not None else -1)
            continue
        remember(d)
        if not d.holds_version or d.version is None:  # coalesced: the version is its leader's decision
            continue
        found = states.get(d.table_id)
        if found is None:
            st = states[d.table_id] = TableState.empty(d.table_id, d.table_uri)
            first_sight(d.table_id, d.table_uri)
        else:
            st = found
        if d.table_id in broken:
            continue
        if d.version != st.version + 1:
            broken.add(d.table_id)
            rec.halt(d.table_id, d.table_uri, (
                f"the commits topic is not contiguous for this table: version {d.version} follows {st.version}. The "
                "table is halted with its state at that version"))
            continue
        try:
            d, data = resolve(d)
        except (StagedCommitError, TableLocationError, StorageError, OSError) as e:
            broken.add(d.table_id)
            rec.halt(d.table_id, d.table_uri, f"version {d.version} was recorded by reference and cannot be read: {e}")
            continue
        assert d.version is not None
        try:
            st.apply(d.version, d.actions)
        except Exception as e:  # a fault of this code on one table: that table stops, the others recover
            broken.add(d.table_id)
            rec.halt(d.table_id, d.table_uri, f"recovering version {d.version} failed unexpectedly ({type(e).__name__}: {e})")
            continue
        if d.version >= compare_from[d.table_id]:
            rec.to_publish.setdefault(d.table_id, []).append((d, offset))
            if data is not None:
                rec.staged_data[(d.table_id, d.version)] = data
    rec.records += n
    for tid, st in states.items():
        disk = on_disk.get(tid, -1)
        if disk > st.version and tid not in rec.halted:
            rec.halt(tid, st.table_uri, (
                f"_delta_log holds version {disk} but Kafka ratified only up to {st.version}: versions "
                f"{st.version + 1}..{disk} were written around the coordinator, and the next commit would be acknowledged "
                "but invisible. The table is halted; see 'Recover a halted table'"))
        if disk < 0 and tid not in rec.halted:
            why = deleted_problem(tid, st.table_uri, st.version, claimed(st.table_uri))
            if why is not None:
                rec.halt(tid, st.table_uri, why)
    for tid in list(rec.to_publish):
        if tid in rec.halted:
            del rec.to_publish[tid]
    if publish is not None:
        for ds in rec.to_publish.values():
            for d, _offset in ds:
                publish(d)
    return rec


def _fold_drop(rec: Recovered, table_id: str, broken: set[str], on_disk: dict[str, int],
               compare_from: dict[str, int]) -> None:
    """A drop record: nothing folded of the table so far counts any more (a table created later under its id is
    seen afresh: its first record looks at `_delta_log` again)."""
    rec.states.pop(table_id, None)
    rec.halted.pop(table_id, None)
    rec.new_halts.pop(table_id, None)
    rec.released.pop(table_id, None)
    rec.to_publish.pop(table_id, None)
    for key in [k for k in rec.staged_data if k[0] == table_id]:
        del rec.staged_data[key]
    broken.discard(table_id)
    on_disk.pop(table_id, None)
    compare_from.pop(table_id, None)


def _fold_adoption(rec: Recovered, d: Decision, load_state: Callable[[str, int], PublishedState],
                   first_sight: Callable[[str, str], None], broken: set[str]) -> None:
    """An adoption record, as the live coordinator applied it: the table is neither released nor halted any more,
    and its state is its published log at the adopted version (read again unless this recovery already holds the
    table at that version). An adoption answered again (`duplicate_of`) changed nothing. A log that cannot give
    the version halts the table."""
    tid, version = d.table_id, d.winning_version
    if version is None or d.duplicate_of is not None:
        return
    rec.released.pop(tid, None)
    rec.halted.pop(tid, None)
    rec.new_halts.pop(tid, None)
    rec.to_publish.pop(tid, None)
    known = rec.states.get(tid)
    if known is not None and known.version == version and tid not in broken:
        return
    broken.discard(tid)
    try:
        loaded = load_state(d.table_uri, version)
        if loaded.version != version:
            raise StateLoadError("unreadable", f"loading version {version} gave version {loaded.version}")
    except StateLoadError as e:
        rec.states.pop(tid, None)
        broken.add(tid)
        rec.halt(tid, d.table_uri, (
            f"the table was adopted at version {version}, and recovery rebuilds its state from _delta_log at that "
            f"version, which failed: {e}. Restore _delta_log up to version {version}, or accept what it holds now, and "
            "adopt the table again (`deltacoord table adopt`): the adoption reads its current version"))
        return
    rec.states[tid] = loaded.table_state(tid, d.table_uri)
    if known is None:
        first_sight(tid, d.table_uri)
    log.info("table %s: adopted state at version %d rebuilt from _delta_log (%d live files)", tid, version,
             loaded.num_files)


def recover_partition(settings: CoordinatorSettings, partition: int, **kwargs: Any) -> Recovered:
    """`rebuild_states` from the newest usable state snapshot (`deltacoord.coordinator.kafka.state_snapshots`), or from the start."""
    if settings.state_root:
        from deltacoord.coordinator.kafka.state_snapshots import SnapshotStore

        store = SnapshotStore(settings.state_root, settings.storage_options, settings.topics.commits, partition)
        try:
            snapshots = store.newest()
        except (OSError, StorageError) as e:
            log.warning("cannot list the state snapshots of partition %d under %s (%s); reading the whole commits "
                        "partition", partition, settings.state_root, e)
            snapshots = []
        for snap in snapshots:
            if snap.commits_topic != settings.topics.commits or snap.partition != partition:
                continue
            if snap.last is not None and not _record_is(settings, partition, snap.last):
                log.warning("ignoring the state snapshot at offset %d of %s[%d]: the record it ends with is not on the "
                            "topic (was the topic recreated?)", snap.offset, settings.topics.commits, partition)
                continue
            t0 = time.monotonic()
            base = Recovered(states={t.table_id: TableState.from_export(t) for t in snap.tables}, halted=dict(snap.halted),
                             released=dict(snap.released),
                             decided=DecidedIds(settings.decided_ids_limit, settings.decided_ids_max_age_ms),
                             last=snap.last, snapshot_offset=snap.offset, proposals_next=snap.proposals_next)
            keyed = {tid for tid, st in base.states.items() if registers_writer_keys(st)}
            base.decided.extend(snap.decided, signed=keyed.__contains__)
            log.info("partition %d: state snapshot at offset %d loaded (%d tables) in %.2fs", partition, snap.offset,
                     len(snap.tables), time.monotonic() - t0)
            try:
                return rebuild_states(settings, partition, base=base, from_offset=snap.offset,
                                      republish_from=snap.republish_from, **kwargs)
            except SnapshotUnusableError as e:
                log.warning("partition %d: not using the state snapshot at offset %d: %s", partition, snap.offset, e)
    return rebuild_states(settings, partition, **kwargs)


#: A store that does not answer while recovery resolves a version recorded by reference is asked again this
#: many times (1, 2, 4, 8, 16 s apart) before the table is halted (an operator resumes it once the store is back).
RESOLVE_ATTEMPTS = 6


def decision_resolver(settings: CoordinatorSettings) -> Callable[[Decision], tuple[Decision, bytes | None]]:
    """Resolves decisions recorded by reference to their whole commit (and its bytes), through the settings' table
    locations; a store that does not answer is asked again for about half a minute."""
    locations: TableLocations | None = None

    def resolve(d: Decision) -> tuple[Decision, bytes | None]:
        nonlocal locations
        if d.staged is None or d.version is None:
            return d, None
        if locations is None:
            locations = settings.locations()
        for attempt in range(RESOLVE_ATTEMPTS):
            try:
                return resolve_decision_bytes(locations.storage(d.table_uri), d)
            except (StorageError, OSError) as e:
                if isinstance(e, FileNotFoundError) or attempt == RESOLVE_ATTEMPTS - 1:
                    raise
                log.warning("reading version %d of %s recorded by reference failed (%s); asking again", d.version,
                            d.table_uri, e)
                time.sleep(2.0 ** attempt)
        raise AssertionError("unreachable")

    return resolve


def _record_is(settings: CoordinatorSettings, partition: int, last: tuple[int, str]) -> bool:
    """Whether the committed record at offset `last[0]` of the commits partition has proposal id `last[1]`."""
    for d, offset in read_decisions_at(settings, partition, from_offset=last[0], stall_timeout_s=30):
        return offset == last[0] and d.proposal_id == last[1]
    return False


__all__ = ["RESOLVE_ATTEMPTS", "Recovered", "RecoveryError", "SnapshotUnusableError", "decision_resolver", "read_decisions", "read_decisions_at",
           "rebuild_states", "recover_partition"]
