"""The pure decision function: check a proposal against the commits it did not see.

`decide(state, proposal, now_ms)` = redelivery check + validation + window
lookup + `check`. `check` follows Delta Spark's ConflictChecker, winner by
winner in version order, first failure wins:

    protocol -> metadata -> domain metadata -> app ids -> appends
             -> delete-read -> delete-delete

Isolation. The table's `delta.isolationLevel` (default WriteSerializable, as
the Databricks documentation states; Delta OSS defaults to Serializable) is
downgraded to SnapshotIsolation exactly as Delta's
`canDowngradeToSnapshotIsolation`: every own action is a file action with
dataChange=false (or there are none; a `delta.rowTracking` domainMetadata is
allowed), and at WriteSerializable the operation does not change data.

Deliberate choices where this engine is stricter than Delta Spark (the seed
documents state that metadata and protocol changes fail concurrent writes):

* any winner `protocol` fails the transaction with ProtocolChangedException
  (Spark lets a transaction without its own protocol action adopt a winner
  that only adds features);
* any winner `metaData` fails it with MetadataChangedException (Spark has an
  allow-list of config-only changes such as enabling row tracking, deletion
  vectors or in-commit timestamps; delta-rs and Kernel fail on any metaData),
  except, as in Spark, a winner that only advanced identity columns'
  high-water marks, against a transaction that changes no metadata itself;
* on a row-level table (deletion vectors enabled, no partition columns;
  `deltacoord.coordinator.rules.row_level`) the append check ignores files a winner only
  re-added with a new deletion vector and matches its other new files against
  the read predicates by their statistics; a file the transaction only read
  may be changed or removed by a winner; and two deletion-vector updates of
  one file with disjoint changed rows do not conflict: the current one is
  rebased onto the union of both vectors (overlapping rows are a
  ConcurrentDeleteDeleteException). Complex conditions keep the file-level
  rules;
* on any deletion-vector table an OPTIMIZE without ZORDER BY records a row map
  and does not conflict with row changes of the files it merged: the deleted
  rows are moved through the map (`deltacoord.coordinator.rules.compaction`);
* on a table whose protocol supports row tracking the coordinator assigns row
  ids itself when it accepts a commit (`deltacoord.coordinator.rules.row_ids`), so the
  `delta.rowTracking` domain never conflicts; on any other table a winner and
  the current transaction both writing it is a retryable
  ConcurrentWriteException.

Rebase never re-runs the query: the accepted commit is the proposal's actions
at head+1 with commitInfo first (readVersion, isolationLevel, isBlindAppend,
txnId, operation, operationParameters, timestamp, and inCommitTimestamp when
in-commit timestamps are enabled), identical SetTransactions de-duplicated,
the ICT enablement version/timestamp moved to the real version, and row ids
assigned on row-tracking tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from deltacoord.coordinator.rules.compaction import Compaction, Placement, compaction_of
from deltacoord.coordinator.rules.identity import only_marks_changed
from deltacoord.coordinator.rules.row_ids import assign_row_ids
from deltacoord.coordinator.rules.row_level import (
    Change,
    NewRowMatcher,
    Rows,
    changed_rows,
    changes_of,
    decoded,
    deletion_vector_table,
    loose_stats,
    row_level_table,
    same_vector,
    simple_conditions,
)
from deltacoord.coordinator.rules.state import TableState, WindowExceededError, Winners, WinningCommit
from deltacoord.coordinator.rules.validate import check_txn_versions, table_isolation_level, validate_proposal
from deltacoord.schemas.actions import (
    Action,
    AddCDCFile,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from deltacoord.schemas.deletion_vectors import inline_descriptor
from deltacoord.schemas.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    DeltaCoordError,
    InvalidProposalError,
    MetadataChangedException,
    ProtocolChangedException,
    format_partition,
)
from deltacoord.schemas.expressions.partitions import (
    PartitionSchema,
    Row,
    compile_read_predicates,
    partition_schema,
    row_of,
    row_to_mapping,
)
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.properties import (
    SERIALIZABLE,
    SNAPSHOT_ISOLATION,
    WRITE_SERIALIZABLE,
    Property,
    TableProperties,
)
from deltacoord.schemas.row_tracking import DOMAIN, high_water_mark
from deltacoord.schemas.row_tracking import supported as row_tracking_supported

#: The domain whose metadata assigns row ids (row tracking).
ROW_TRACKING_DOMAIN = DOMAIN


@dataclass(frozen=True, slots=True)
class Accepted:
    """The proposal commits as `version`; `actions` is the commit, commitInfo first."""

    version: int
    actions: tuple[Action, ...]

    @property
    def commit_info(self) -> CommitInfo:
        ci = self.actions[0]
        assert isinstance(ci, CommitInfo)
        return ci


@dataclass(frozen=True, slots=True)
class Rejected:
    """The proposal does not commit: a Delta conflict or an InvalidProposalError."""

    error: DeltaCoordError
    winning_version: int | None

    @property
    def retryable(self) -> bool:
        return bool(getattr(self.error, "retryable", False))

    @property
    def reason(self) -> str:
        """Delta's exception name for a conflict, the reason code for invalid input."""
        if isinstance(self.error, InvalidProposalError):
            return self.error.reason
        return type(self.error).__name__


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The proposal id already committed at `version` (a redelivery)."""

    version: int


# ---------------------------------------------------------------------------
# Isolation level
# ---------------------------------------------------------------------------


def can_downgrade_to_snapshot_isolation(actions: Sequence[Action], changes_data: bool, level: str) -> bool:
    """Delta's rule, evaluated on the transaction's own actions (commitInfo excluded)."""
    for a in actions:
        if isinstance(a, (AddFile, RemoveFile, AddCDCFile)):
            if a.data_change:
                return False
        elif isinstance(a, DomainMetadata) and a.domain == ROW_TRACKING_DOMAIN:
            continue
        else:
            return False  # txn, metaData, protocol, other domains: never downgraded
    if level == SERIALIZABLE:
        return True
    if level == WRITE_SERIALIZABLE:
        return not changes_data
    return False


def isolation_level_to_use(proposal: Proposal, metadata: Metadata | None) -> str:
    """The level a proposal is checked (and recorded) at."""
    level = table_isolation_level(metadata)
    if can_downgrade_to_snapshot_isolation(proposal.actions, proposal.changes_data, level):
        return SNAPSHOT_ISOLATION
    return level


# ---------------------------------------------------------------------------
# Conflict check
# ---------------------------------------------------------------------------


class Conflict(Exception):
    def __init__(self, error: DeltaConcurrentModificationException, version: int | None) -> None:
        self.error = error
        self.version = version


def _hint(pv: Mapping[str, str | None] | None, schema: PartitionSchema) -> str | None:
    if not schema:
        return None
    return format_partition(row_to_mapping(row_of(pv, schema), schema), [c.name for c in schema])


def _row_hint(row: Row, schema: PartitionSchema) -> str | None:
    if not schema:
        return None
    return format_partition(row_to_mapping(row, schema), [c.name for c in schema])


def _new_protocol(proposal: Proposal) -> Protocol | None:
    for a in proposal.actions:
        if isinstance(a, Protocol):
            return a
    return None


class CheckedTransaction:
    """The proposal being decided, as every conflict profile (Delta's, MaxCompute's) checks it: computed once."""

    __slots__ = (
        "_predicates",
        "blind",
        "changes",
        "checks_appends",
        "checks_blind_appends",
        "domains",
        "dv_table",
        "has_metadata",
        "has_protocol",
        "inputs",
        "level",
        "matcher",
        "new_metadata",
        "original_changes",
        "out_deleted",
        "own",
        "read_app_ids",
        "read_files",
        "read_paths",
        "read_schema",
        "remove_pvs",
        "rewritten",
        "row_level",
        "row_matcher",
        "row_rules",
        "whole_table",
    )

    def __init__(self, state: TableState, winners: Sequence[WinningCommit], proposal: Proposal) -> None:
        new_metadata: Metadata | None = None
        has_protocol = False
        domains: set[str] = set()
        remove_pvs: dict[str, Mapping[str, str | None] | None] = {}
        for a in proposal.actions:
            if isinstance(a, RemoveFile):
                remove_pvs.setdefault(a.path, a.partition_values)
            elif isinstance(a, Metadata):
                new_metadata = a
            elif isinstance(a, Protocol):
                has_protocol = True
            elif isinstance(a, DomainMetadata):
                domains.add(a.domain)
        self.new_metadata = new_metadata
        self.has_metadata = new_metadata is not None
        self.has_protocol = has_protocol
        if row_tracking_supported(_new_protocol(proposal) or state.protocol):
            domains.discard(ROW_TRACKING_DOMAIN)  # the coordinator assigns row ids: never a conflict
        self.domains = frozenset(domains)
        self.remove_pvs = remove_pvs
        read_md = winners[0].prior_metadata if winners else state.metadata
        if proposal.read_version < 0:
            read_md = new_metadata
        self.read_schema: PartitionSchema = partition_schema(read_md)
        self.level = isolation_level_to_use(proposal, new_metadata if new_metadata is not None else read_md)
        self.blind = proposal.is_blind_append
        self.whole_table = proposal.read_whole_table
        self.read_files = proposal.read_files
        self.read_paths = frozenset(f.path for f in proposal.read_files)
        self.read_app_ids = frozenset(proposal.read_app_ids)
        # Check 5 looks at winners' new files only for a transaction that read (not a blind
        # append) above SnapshotIsolation, and at blind appends' files only at Serializable
        # or when the transaction changes metadata.
        self.checks_appends = not self.blind and self.level != SNAPSHOT_ISOLATION
        self.checks_blind_appends = self.checks_appends and (self.level == SERIALIZABLE or self.has_metadata)
        # Compiled only when the append check can use it.
        self.matcher = (
            compile_read_predicates(proposal.read_predicates, self.read_schema)
            if self.read_schema
            and not self.whole_table
            and self.checks_appends
            and proposal.read_predicates
            else None
        )
        # Row-level concurrency (see `row_level`) and compactions (`compaction`) on deletion-vector tables.
        self.dv_table = proposal.read_version >= 0 and deletion_vector_table(read_md)
        self.row_level = self.dv_table and row_level_table(read_md)
        # Row-by-row resolution of one file's concurrent changes: simple conditions only (the seeds' limits);
        # decided on first use (`resolves_rows`), as it parses the predicates.
        self.row_rules: bool | None = None if self.row_level else False
        self._predicates = (proposal.read_predicates, read_md)
        self.row_matcher = (
            NewRowMatcher(proposal.read_predicates, read_md)
            if self.row_level and read_md is not None and self.checks_appends and not self.whole_table
            else None
        )
        #: This transaction's changes of files, by the path they now apply to (rebasing may move them).
        self.changes: dict[str, Change] = {}
        #: This transaction's own row map, when it is a compaction: its removes of merged files as rebased
        #: (None: dropped, a winner removed the file) and the rows of its outputs to mark deleted.
        self.own: Compaction | None = None
        self.inputs: dict[str, RemoveFile | None] = {}
        self.out_deleted: dict[str, Rows] = {}
        self.rewritten = False
        if self.dv_table:
            self.own = compaction_of(proposal.operation, proposal.operation_parameters, proposal.commit_info.values,
                                     proposal.actions, committed=False)
            if self.own is not None:
                self.inputs = {a.path: a for a in proposal.actions
                               if isinstance(a, RemoveFile) and a.path in self.own.placements}
            else:
                self.changes = changes_of(proposal.actions)
        self.original_changes = frozenset(self.changes)


def check_table_level(cur: CheckedTransaction, w: WinningCommit, table: str) -> None:
    """Checks 1-4 (protocol, metadata, domain metadata, app ids): the same under every conflict profile."""
    v = w.version
    op = w.operation
    # 1. protocol
    if w.protocol is not None:
        raise Conflict(ProtocolChangedException(winning_version=v, winning_operation=op, table=table), v)
    # 2. metadata (a winner that only advanced identity high-water marks passes a transaction without metaData)
    if w.metadata is not None and (cur.has_metadata or not only_marks_changed(w.prior_metadata, w.metadata)):
        raise Conflict(MetadataChangedException(winning_version=v, winning_operation=op, table=table), v)
    # 3. domain metadata
    if cur.domains and w.domains:
        both = cur.domains & w.domains
        if both:
            domain = min(both)
            if domain == ROW_TRACKING_DOMAIN and len(both) == 1:
                raise Conflict(
                    ConcurrentWriteException(
                        f"ConcurrentWriteException: a concurrent update ({op or 'TRANSACTION'} committed at version "
                        f"{v}) also assigned row ids (domain {ROW_TRACKING_DOMAIN}); this coordinator does not "
                        "re-assign row ids. Please try the operation again.",
                        winning_version=v,
                        winning_operation=op,
                        table=table,
                    ),
                    v,
                )
            domain = min(both - {ROW_TRACKING_DOMAIN})
            raise Conflict(
                ConcurrentTransactionException(
                    f"A conflicting metadata domain {domain} is added.",
                    winning_version=v,
                    winning_operation=op,
                    table=table,
                ),
                v,
            )
    # 4. app ids the transaction read
    if cur.read_app_ids and not w.app_ids.isdisjoint(cur.read_app_ids):
        raise Conflict(ConcurrentTransactionException(winning_version=v, winning_operation=op, table=table), v)


def _check_new_rows(cur: CheckedTransaction, w: WinningCommit, table: str) -> None:
    """Check 5 on a row-level table: the winner's files holding new rows, matched by their statistics."""
    if not w.new_files or not cur.checks_appends or (w.is_blind_append and not cur.checks_blind_appends):
        return
    hit = w.new_files[0] if cur.whole_table or cur.row_matcher is None else cur.row_matcher.first_match(w.new_files)
    if hit is not None:
        raise Conflict(ConcurrentAppendException(winning_version=w.version, winning_operation=w.operation, table=table),
                        w.version)


def _resolves_rows(cur: CheckedTransaction) -> bool:
    if cur.row_rules is None:
        predicates, md = cur._predicates
        cur.row_rules = md is not None and simple_conditions(predicates, md)
    return cur.row_rules


def _same_rows(cur: CheckedTransaction, w: WinningCommit, path: str, both: Rows, table: str) -> Conflict:
    return Conflict(
        ConcurrentDeleteDeleteException(
            f"ConcurrentDeleteDeleteException: This transaction attempted to delete or update {len(both)} row(s) "
            f"of file {path} (row {int(both[0])} first) that a concurrent update ({w.operation or 'TRANSACTION'} "
            f"committed at version {w.version}) also deleted or updated. Please try the operation again.",
            winning_version=w.version, winning_operation=w.operation, table=table),
        w.version)


def _union(a: Rows | None, b: Rows) -> Rows:
    return b if a is None else np.union1d(a, b)


def _move_rows(cur: CheckedTransaction, output: AddFile, rows: Rows, removed_at: int | None) -> bool:
    """Delete `rows` of a winner's compaction output in this transaction (merged with what it already deletes
    there): a remove of the output's live vector and an add with the union. False when that vector is not inline."""
    existing = cur.changes.get(output.path)
    if existing is not None:
        if existing.add is None or existing.rows is None:
            return True  # already removes the whole output
        new_rows = decoded(existing.add.deletion_vector)
        if new_rows is None:
            return False
        existing.rows = np.union1d(existing.rows, rows)
        existing.add = replace(existing.add, deletion_vector=inline_descriptor(np.union1d(new_rows, rows)))
        return True
    old = decoded(output.deletion_vector)
    if old is None:
        return False
    remove = output.to_remove(removed_at or 0, data_change=True)
    moved = Change(remove, replace(output, deletion_vector=inline_descriptor(np.union1d(old, rows)), data_change=True,
                                   stats=loose_stats(output.stats)))
    moved.rows = rows
    cur.changes[output.path] = moved
    return True


def follow_compaction(cur: CheckedTransaction, w: WinningCommit, path: str, place: Placement, change: Change) -> bool:
    """This transaction changed rows of a file the winner compacted: change the same rows of its outputs."""
    assert w.compaction is not None
    if not same_vector(change.remove.deletion_vector, w.removed_vectors.get(path)):
        return False
    if change.add is None:
        ranks: Rows | None = place.every_rank()
    else:
        ranks = None if change.rows is None else place.ranks(change.rows)
    if ranks is None:
        return False
    for target, rows in place.targets(ranks).items():
        output = w.compaction.outputs.get(target)
        if output is None or not _move_rows(cur, output, rows, change.remove.deletion_timestamp):
            return False
    del cur.changes[path]
    cur.rewritten = True
    return True


def absorb_winner(cur: CheckedTransaction, w: WinningCommit, path: str) -> bool:
    """This transaction compacts a file the winner changed: its outputs lose the rows the winner deleted, and
    its remove names the winner's vector (or goes, when the winner removed the whole file)."""
    assert cur.own is not None
    place = cur.own.placements[path]
    mine = cur.inputs.get(path)
    if mine is None:
        return True
    wu = w.dv_updates.get(path)
    if wu is not None:
        rows = changed_rows(wu) if same_vector(mine.deletion_vector, wu.old) else None
        ranks = None if rows is None else place.ranks(rows)
        if ranks is None:
            return False
        cur.inputs[path] = replace(mine, deletion_vector=wu.new, stats=wu.add.stats)
    else:
        ranks = place.every_rank()  # removed for good (every row deleted, a rewrite, another compaction)
        cur.inputs[path] = None
    for target, rows in place.targets(ranks).items():
        cur.out_deleted[target] = _union(cur.out_deleted.get(target), rows)
    cur.rewritten = True
    return True


def _resolve_rows(cur: CheckedTransaction, w: WinningCommit, removed: frozenset[str], table: str) -> frozenset[str]:
    """The winner's removed paths that still conflict once row-level changes are resolved (deletion-vector tables).

    * This transaction compacts the file (row map, no ZORDER BY on either side): the winner's deleted rows are
      deleted in its outputs (`absorb_winner`).
    * The winner compacted the file (row map): a file this transaction only read is unchanged; rows it changed
      are changed in the winner's outputs (`follow_compaction`).
    * Row-level tables, simple conditions: a file the winner changed (a new deletion vector, or removed) does
      not conflict with a transaction that only read it: that transaction selected none of its rows, so the
      rows the winner deleted are not ones it selected, and the rows the winner wrote are in its other files,
      which check 5 matched. Nor does a new vector conflict with one that replaced the same vector with
      disjoint rows (rebased onto the union); the same row changed by both is a conflict.
    """
    remaining: set[str] = set()
    wc = w.compaction
    for p in removed:
        if cur.own is not None and p in cur.own.placements:
            if w.zorder or not absorb_winner(cur, w, p):
                remaining.add(p)
            continue
        change = cur.changes.get(p)
        if change is None and p not in cur.read_paths and p not in cur.remove_pvs and not cur.whole_table:
            continue
        place = wc.placements.get(p) if wc is not None else None
        if place is not None:
            if change is None and p not in cur.remove_pvs:
                continue  # read only: a compaction changes no row
            if change is None or not follow_compaction(cur, w, p, place, change):
                remaining.add(p)
            continue
        if cur.whole_table or not cur.row_level or not _resolves_rows(cur):
            remaining.add(p)
            continue
        if change is None and p not in cur.remove_pvs:
            continue  # read only: the winner changed rows this transaction did not select
        wu = w.dv_updates.get(p)
        w_rows = changed_rows(wu) if wu is not None else None
        if (wu is None or w_rows is None or change is None or change.add is None or change.rows is None
                or not same_vector(change.remove.deletion_vector, wu.old)):
            remaining.add(p)
            continue
        both = np.intersect1d(change.rows, w_rows, assume_unique=True)
        if len(both):
            raise _same_rows(cur, w, p, both, table)
        base = decoded(wu.new)
        if base is None:
            remaining.add(p)
            continue
        change.remove = replace(change.remove, deletion_vector=wu.new, stats=wu.add.stats)
        change.add = replace(change.add, deletion_vector=inline_descriptor(np.union1d(base, change.rows)))
        cur.rewritten = True
    return frozenset(remaining)


def _check_winner(cur: CheckedTransaction, w: WinningCommit, table: str) -> None:
    v = w.version
    op = w.operation
    check_table_level(cur, w, table)
    # 5. appends
    if cur.row_level and not w.partition_schema:
        _check_new_rows(cur, w, table)
    elif w.partition_rows and cur.checks_appends and (not w.is_blind_append or cur.checks_blind_appends):
        schema = cur.read_schema
        hit: Row | None = None
        rows = w.partition_rows
        if w.partition_schema != schema:
            # Unreachable: the partitioning changes only with a metaData action, which fails
            # check 2 on that winner first. Were it reached, a conflict is the safe answer.
            raise Conflict(ConcurrentAppendException(winning_version=v, winning_operation=op, table=table), v)
        if cur.whole_table or not schema:
            hit = rows[0]
        else:
            matcher = cur.matcher  # None: no read predicates, nothing matches (Spark)
            if matcher is not None and not matcher.matches_none:
                for row in rows:
                    if matcher(row):
                        hit = row
                        break
        if hit is not None:
            raise Conflict(
                ConcurrentAppendException(
                    winning_version=v, winning_operation=op, partition=_row_hint(hit, schema), table=table
                ),
                v,
            )
    removed = w.removed_paths
    if removed and cur.dv_table:
        removed = _resolve_rows(cur, w, removed, table)
    if removed:
        # 6. delete-read
        if cur.read_paths and not removed.isdisjoint(cur.read_paths):
            first = next(f for f in cur.read_files if f.path in removed)
            raise Conflict(
                ConcurrentDeleteReadException(
                    winning_version=v,
                    winning_operation=op,
                    partition=_hint(first.partition_values, cur.read_schema),
                    table=table,
                ),
                v,
            )
        if cur.whole_table:
            raise Conflict(ConcurrentDeleteReadException(winning_version=v, winning_operation=op, table=table), v)
        # 7. delete-delete
        if cur.remove_pvs and not removed.isdisjoint(cur.remove_pvs):
            path = next(p for p in cur.remove_pvs if p in removed)
            raise Conflict(
                ConcurrentDeleteDeleteException(
                    winning_version=v,
                    winning_operation=op,
                    partition=_hint(cur.remove_pvs[path], cur.read_schema),
                    table=table,
                ),
                v,
            )


def _relevant(cur: CheckedTransaction, winners: Sequence[WinningCommit]) -> Sequence[WinningCommit]:
    """The winners that can fail `cur`, in version order.

    A quiet winner (see `WinningCommit.quiet`) passes checks 1-3, 6 and 7 by
    construction, and check 5 too unless `cur` checks its reads against blind
    appends. Skipping quiet winners keeps a long-lived appender's proposal,
    whose read version falls far behind the head, from costing one Python call
    per intervening commit; the first conflict found is unchanged.
    """
    if cur.checks_blind_appends:
        return winners
    # The window's index holds every winner that is not quiet or names app ids (`Winners.marked`): the
    # others pass both filters below, so they are not visited at all.
    candidates = winners.marked() if isinstance(winners, Winners) else winners
    if cur.read_app_ids:
        ids = cur.read_app_ids
        return [w for w in candidates if not w.quiet or not w.app_ids.isdisjoint(ids)]
    return [w for w in candidates if not w.quiet]


def check(state: TableState, winners: Sequence[WinningCommit], proposal: Proposal, now_ms: int) -> Accepted | Rejected:
    """Check `proposal` against `winners` (versions read_version+1..head) and rebase it.

    Pure: `state` is not modified. Input errors (a predicate that does not
    compile) are returned as Rejected, never raised.
    """
    table = state.table_uri or state.table_id
    if proposal.read_version < 0 and state.version >= 0:
        # Two writers created the table: the loser saw no table, the winner wrote version 0.
        err = ProtocolChangedException(winning_version=0, winning_operation=state.creation_operation, table=table)
        return Rejected(err, 0)
    try:
        cur = CheckedTransaction(state, winners, proposal)
        for w in _relevant(cur, winners):
            _check_winner(cur, w, table)
    except Conflict as c:
        return Rejected(c.error, c.version)
    except InvalidProposalError as e:
        return Rejected(e, None)
    stale = check_txn_versions(state, proposal)
    if stale is not None:
        return Rejected(stale, None)
    return Accepted(state.version + 1, rebase(state, proposal, cur, now_ms))


# ---------------------------------------------------------------------------
# Rebase
# ---------------------------------------------------------------------------

_CONTROLLED_KEYS = frozenset(
    {
        "timestamp",
        "inCommitTimestamp",
        "operation",
        "operationParameters",
        "readVersion",
        "isolationLevel",
        "isBlindAppend",
        "txnId",
    }
)


def _ict_enabled(metadata: Metadata | None) -> bool:
    return TableProperties.of(metadata).in_commit_timestamps


def _rebased_actions(actions: Sequence[Action], cur: CheckedTransaction) -> tuple[Action, ...]:
    """The proposal's actions with its row-level changes as rebased (`_resolve_rows`).

    A compaction's removes of merged files are replaced (or dropped) and its outputs get the vectors of
    the rows concurrent commits deleted (an output with no row left is not added). Otherwise the
    proposal's deletion-vector updates and whole-file removes are replaced by the changes as they now
    stand, which may name other files (the outputs of a concurrent compaction).
    """
    out: list[Action] = []
    if cur.own is not None:
        sizes = cur.own.sizes
        for a in actions:
            if isinstance(a, RemoveFile) and a.path in cur.inputs:
                r = cur.inputs[a.path]
                if r is not None:
                    out.append(r)
                continue
            if isinstance(a, AddFile) and a.path in cur.out_deleted:
                gone = cur.out_deleted[a.path]
                if len(gone) < sizes[a.path]:
                    out.append(replace(a, deletion_vector=inline_descriptor(gone), stats=loose_stats(a.stats)))
                continue
            out.append(a)
        return tuple(out)
    original = cur.original_changes
    for a in actions:
        if isinstance(a, RemoveFile) and a.path in original:
            continue
        if isinstance(a, AddFile) and a.path in original and a.deletion_vector is not None:
            continue
        out.append(a)
    for c in cur.changes.values():
        out.append(c.remove)
        if c.add is not None:
            out.append(c.add)
    return tuple(out)


def rebase(state: TableState, proposal: Proposal, cur: CheckedTransaction, now_ms: int) -> tuple[Action, ...]:
    version = state.version + 1
    new_md = cur.new_metadata
    effective_md = new_md if new_md is not None else state.metadata
    ict: int | None = None
    if _ict_enabled(effective_md):
        previous = state.last_ict if state.last_ict is not None else state.last_commit_timestamp
        ict = now_ms if previous is None else max(now_ms, previous + 1)

    written = proposal.commit_info.values
    params: Any = dict(proposal.operation_parameters)
    if not params and isinstance(written.get("operationParameters"), Mapping):
        params = dict(written["operationParameters"])
    values: dict[str, Any] = {"timestamp": now_ms}
    if ict is not None:
        values["inCommitTimestamp"] = ict
    values["operation"] = proposal.operation
    values["operationParameters"] = params
    for k, val in written.items():
        if k not in _CONTROLLED_KEYS:
            values[k] = val
    if proposal.read_version >= 0:
        values["readVersion"] = proposal.read_version
    values["isolationLevel"] = cur.level
    values["isBlindAppend"] = cur.blind
    values["txnId"] = proposal.proposal_id
    commit_info = CommitInfo(values)

    actions = proposal.actions
    if cur.rewritten:
        actions = _rebased_actions(actions, cur)
    if row_tracking_supported(_new_protocol(proposal) or state.protocol):
        actions = assign_row_ids(actions, high_water_mark(state.domains), version)
    needs_fixup = new_md is not None and ict is not None and Property.ICT_ENABLEMENT_VERSION in new_md.configuration
    has_txn = False
    for a in actions:
        if isinstance(a, SetTransaction):
            has_txn = True
            break
    if not needs_fixup and not has_txn:
        return (commit_info, *actions)

    out: list[Action] = [commit_info]
    seen_txn: set[tuple[str, int]] = set()
    for a in actions:
        if isinstance(a, SetTransaction):
            key = (a.app_id, a.version)
            if key in seen_txn:
                continue  # identical duplicates are de-duplicated, as Delta Spark does
            seen_txn.add(key)
        elif needs_fixup and isinstance(a, Metadata) and not _ict_enabled(state.metadata):
            conf = dict(a.configuration)
            conf[Property.ICT_ENABLEMENT_VERSION.value] = str(version)
            conf[Property.ICT_ENABLEMENT_TIMESTAMP.value] = str(ict)
            a = Metadata(
                id=a.id,
                schema_string=a.schema_string,
                partition_columns=a.partition_columns,
                configuration=conf,
                name=a.name,
                description=a.description,
                format_provider=a.format_provider,
                format_options=a.format_options,
                created_time=a.created_time,
            )
        out.append(a)
    return tuple(out)


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


#: A conflict check: (state, winners, proposal, now) -> the decision (`check`, or another profile's).
Checker = Callable[[TableState, Sequence[WinningCommit], Proposal, int], "Accepted | Rejected"]


def decide(state: TableState, proposal: Proposal, now_ms: int, checker: Checker | None = None) -> Accepted | Rejected | Duplicate:
    """Decide one proposal. Never raises for bad input; does not modify `state`.

    Anything else it raises is a bug of this code and is left to propagate: it
    must stop the coordinator, not be reported as the writer's bad input.

    The caller publishes an Accepted commit and then calls
    `state.apply(accepted.version, accepted.actions)`.
    """
    committed = state.committed_version_of(proposal.proposal_id)
    if committed is not None:
        return Duplicate(committed)
    try:
        validate_proposal(state, proposal)
    except InvalidProposalError as e:
        return Rejected(e, None)
    if proposal.read_version < 0:
        winners: Sequence[WinningCommit] = ()
    else:
        try:
            winners = state.winners_since(proposal.read_version)
        except WindowExceededError as e:
            err = ConcurrentWriteException(
                f"ConcurrentWriteException: {e}",
                winning_version=None,
                table=state.table_uri or state.table_id,
            )
            return Rejected(err, None)
    return (checker or check)(state, winners, proposal, now_ms)


__all__ = [
    "SERIALIZABLE",
    "SNAPSHOT_ISOLATION",
    "WRITE_SERIALIZABLE",
    "Accepted",
    "Checker",
    "Duplicate",
    "Rejected",
    "can_downgrade_to_snapshot_isolation",
    "check",
    "decide",
    "isolation_level_to_use",
]
