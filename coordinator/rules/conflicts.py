"""Delta's conflict profile: check a proposal against the commits it did not see, purely.

`check` (a `pipeline.Checker`) follows Delta Spark's ConflictChecker, winner
by winner in version order, first failure wins:

    protocol -> metadata -> domain metadata -> app ids -> appends
             -> delete-read -> delete-delete

Isolation (`checked.isolation_level_to_use`), checks 1-4
(`checked.check_table_level`) and the rebase (`rebase`) are shared with the
other profiles; the pipeline around them (redelivery, validation, the winners
window) is `pipeline`.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from deltacoord.coordinator.rules.checked import CheckedTransaction, absorb_winner, check_table_level, follow_compaction
from deltacoord.coordinator.rules.outcomes import Accepted, Conflict, Duplicate, Rejected
from deltacoord.coordinator.rules.pipeline import decide as pipeline_decide
from deltacoord.coordinator.rules.pipeline import run_checks
from deltacoord.coordinator.rules.row_level import Rows, changed_rows, decoded, same_vector
from deltacoord.coordinator.rules.state import TableState, Winners, WinningCommit
from deltacoord.schemas.deletion_vectors import inline_descriptor
from deltacoord.schemas.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    format_partition,
)
from deltacoord.schemas.expressions.partitions import PartitionSchema, Row, row_of, row_to_mapping
from deltacoord.schemas.messages import Proposal


def _hint(pv: Mapping[str, str | None] | None, schema: PartitionSchema) -> str | None:
    if not schema:
        return None
    return format_partition(row_to_mapping(row_of(pv, schema), schema), [c.name for c in schema])


def _row_hint(row: Row, schema: PartitionSchema) -> str | None:
    if not schema:
        return None
    return format_partition(row_to_mapping(row, schema), [c.name for c in schema])


def _check_new_rows(cur: CheckedTransaction, w: WinningCommit, table: str) -> None:
    """Check 5 on a row-level table: the winner's files holding new rows, matched by their statistics."""
    if not w.new_files or not cur.checks_appends or (w.is_blind_append and not cur.checks_blind_appends):
        return
    hit = w.new_files[0] if cur.whole_table or cur.row_matcher is None else cur.row_matcher.first_match(w.new_files)
    if hit is not None:
        raise Conflict(ConcurrentAppendException(winning_version=w.version, winning_operation=w.operation, table=table),
                        w.version)


def _same_rows(cur: CheckedTransaction, w: WinningCommit, path: str, both: Rows, table: str) -> Conflict:
    return Conflict(
        ConcurrentDeleteDeleteException(
            f"ConcurrentDeleteDeleteException: This transaction attempted to delete or update {len(both)} row(s) "
            f"of file {path} (row {int(both[0])} first) that a concurrent update ({w.operation or 'TRANSACTION'} "
            f"committed at version {w.version}) also deleted or updated. Please try the operation again.",
            winning_version=w.version, winning_operation=w.operation, table=table),
        w.version)


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
        if cur.whole_table or not cur.row_level or not cur.resolves_rows():
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


def check_winners(cur: CheckedTransaction, winners: Sequence[WinningCommit], proposal: Proposal, table: str) -> Proposal:
    """Delta's checks of `winners` (a `pipeline.WinnerChecks`): raises `Conflict` at the first that fails."""
    for w in _relevant(cur, winners):
        _check_winner(cur, w, table)
    return proposal


def check(state: TableState, winners: Sequence[WinningCommit], proposal: Proposal, now_ms: int) -> Accepted | Rejected:
    """Check `proposal` against `winners` (versions read_version+1..head) by Delta's rules and rebase it.

    Pure: `state` is not modified. Input errors (a predicate that does not
    compile) are returned as Rejected, never raised.
    """
    return run_checks(state, winners, proposal, now_ms, check_winners)


def decide(state: TableState, proposal: Proposal, now_ms: int) -> Accepted | Rejected | Duplicate:
    """`pipeline.decide` by Delta's rules (`check`): never raises for bad input; anything else it raises is a
    bug of this code, which the batch contains by halting the proposal's table (`batch.decide_batch`)."""
    return pipeline_decide(state, proposal, now_ms, check)


__all__ = ["check", "check_winners", "decide"]
