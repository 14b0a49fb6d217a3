"""The transaction being checked, as every conflict profile (Delta's, MaxCompute's) sees it.

`CheckedTransaction` computes once what the checks ask of a proposal (its
isolation level, read partitions and predicates, its row changes on
deletion-vector tables); `check_table_level` is checks 1-4 (protocol,
metadata, domain metadata, app ids), the same under every profile; and
`follow_compaction`/`absorb_winner` move its row changes through a
compaction's row map, which both profiles use to rebase at the metadata level.

Isolation. The table's `delta.isolationLevel` (default WriteSerializable, as
the Databricks documentation states; Delta OSS defaults to Serializable) is
downgraded to SnapshotIsolation exactly as Delta's
`canDowngradeToSnapshotIsolation`: every own action is a file action with
dataChange=false (or there are none; a `delta.rowTracking` domainMetadata is
allowed), and at WriteSerializable the operation does not change data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from deltacoord.coordinator.rules.compaction import Compaction, Placement, compaction_of
from deltacoord.coordinator.rules.identity import only_marks_changed
from deltacoord.coordinator.rules.outcomes import Conflict
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
from deltacoord.coordinator.rules.state import TableState, WinningCommit
from deltacoord.coordinator.rules.validate import table_isolation_level
from deltacoord.schemas.actions import (
    Action,
    AddCDCFile,
    AddFile,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
)
from deltacoord.schemas.deletion_vectors import inline_descriptor
from deltacoord.schemas.errors import (
    ConcurrentTransactionException,
    ConcurrentWriteException,
    MetadataChangedException,
    ProtocolChangedException,
)
from deltacoord.schemas.expressions.partitions import PartitionSchema, compile_read_predicates, partition_schema
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.properties import SERIALIZABLE, SNAPSHOT_ISOLATION, WRITE_SERIALIZABLE
from deltacoord.schemas.row_tracking import DOMAIN
from deltacoord.schemas.row_tracking import supported as row_tracking_supported

#: The domain whose metadata assigns row ids (row tracking).
ROW_TRACKING_DOMAIN = DOMAIN


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


def new_protocol(proposal: Proposal) -> Protocol | None:
    """The protocol action the proposal commits, if any."""
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
        if row_tracking_supported(new_protocol(proposal) or state.protocol):
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

    def resolves_rows(self) -> bool:
        """Whether this transaction's concurrent row changes are resolved row by row (simple conditions only)."""
        if self.row_rules is None:
            predicates, md = self._predicates
            self.row_rules = md is not None and simple_conditions(predicates, md)
        return self.row_rules


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


def union(a: Rows | None, b: Rows) -> Rows:
    """The rows of both (`a` None: none yet)."""
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
        cur.out_deleted[target] = union(cur.out_deleted.get(target), rows)
    cur.rewritten = True
    return True


__all__ = [
    "ROW_TRACKING_DOMAIN",
    "CheckedTransaction",
    "absorb_winner",
    "can_downgrade_to_snapshot_isolation",
    "check_table_level",
    "follow_compaction",
    "isolation_level_to_use",
    "new_protocol",
    "union",
]
