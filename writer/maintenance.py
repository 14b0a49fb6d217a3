"""OPTIMIZE, REORG ... APPLY (PURGE) and MaxCompute's compactions: rewrite files without changing data.

They declare only the files they compacted (dataChange=false) and record where each row went, so on a
deletion-vector table they do not conflict with DELETE/UPDATE/MERGE.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Literal

import pyarrow as pa

from deltacoord.reader.snapshot import (
    Snapshot,
    delta_schema_to_arrow,
)
from deltacoord.schemas.actions import AddFile
from deltacoord.schemas.jobs import COMPACTION_PARAMETER
from deltacoord.schemas.row_map import ROW_MAP_KEY, RowGroup, Source, Target, encode_row_map
from deltacoord.writer import row_tracking
from deltacoord.writer.operations import (
    OperationTable,
    abandoned_on_error,
    candidates,
    check_writable,
    deleted_ratio,
    noop,
    read_file,
    write,
)
from deltacoord.writer.transaction import CommitResult
from deltacoord.writer.zorder import zorder

#: A larger row map (a compaction of very many files, or of files with large inline vectors) is not recorded:
#: that OPTIMIZE then keeps the file-level rules (commitInfo is bounded; `deltacoord.coordinator.rules.validate`).
ROW_MAP_MAX_CHARS = 32 * 1024


def optimize(table: OperationTable, where: str | None = None, target_file_size: int = 128 * 1024 * 1024, min_files: int = 2,
             *, zorder_by: Sequence[str] = (), max_deleted_rows_ratio: float = 0.05,
             snapshot: Snapshot | None = None, proposal_id: str | None = None) -> CommitResult:
    """`Table.optimize` (documented there, where users read it)."""
    zorder_by = list(zorder_by)
    if zorder_by:
        snap = snapshot or table.snapshot()
        bad = [c for c in zorder_by if c not in delta_schema_to_arrow(snap.metadata.schema()).names
               or c in snap.partition_columns]
        if bad:
            raise ValueError(f"ZORDER BY {bad}: name data columns of the table (not partition columns)")
        return compact_files(table, where, lambda files: files, 1, None, snap, proposal_id, zorder_by)
    return compact_files(table, where, lambda files: [a for a in files if a.size < target_file_size
                                               or deleted_ratio(a) > max_deleted_rows_ratio], min_files, None,
                         snapshot, proposal_id, max_deleted_rows_ratio=max_deleted_rows_ratio)


def purge(table: OperationTable, where: str | None = None, *, snapshot: Snapshot | None = None,
          proposal_id: str | None = None) -> CommitResult:
    """`Table.purge` (documented there, where users read it)."""
    return compact_files(table, where, lambda files: [a for a in files if a.deletion_vector is not None], 1, None,
                         snapshot, proposal_id, operation="REORG")


def compact(table: OperationTable, kind: Literal["minor", "major"] = "minor", where: str | None = None, *,
            small_file_size: int = 128 * 1024 * 1024, snapshot: Snapshot | None = None,
            proposal_id: str | None = None) -> CommitResult:
    """`Table.compact` (documented there, where users read it)."""
    if kind == "minor":
        return compact_files(table, where, lambda files: [a for a in files if a.size < small_file_size], 2, kind, snapshot,
                             proposal_id)
    if kind == "major":
        def every(files: list[AddFile]) -> list[AddFile]:
            return files if len(files) > 1 or any(a.deletion_vector is not None for a in files) else []

        return compact_files(table, where, every, 1, kind, snapshot, proposal_id)
    raise ValueError(f"compaction kind {kind!r}: give 'minor' or 'major'")


def compact_files(table: OperationTable, where: str | None, select: Callable[[list[AddFile]], list[AddFile]], min_files: int,
                  kind: str | None, snapshot: Snapshot | None, proposal_id: str | None,
                  zorder_by: Sequence[str] = (), *, operation: str = "OPTIMIZE",
                  max_deleted_rows_ratio: float | None = None) -> CommitResult:
    """Merge, per partition, the files `select` picks (when at least `min_files`, or when one deletes more
    than `max_deleted_rows_ratio` of its rows) into new files, in Z-order of `zorder_by` or else in order,
    recording the row map."""
    snap = snapshot or table.snapshot()
    check_writable(snap, operation)
    schema = delta_schema_to_arrow(snap.metadata.schema())
    tx = table.begin_operation(snap.version, proposal_id)
    with abandoned_on_error(tx):
        if where is not None:
            tx.read_predicate(where)
        by_part: dict[tuple[tuple[str, str | None], ...], list[AddFile]] = {}
        for a in candidates(snap, where):
            by_part.setdefault(tuple(sorted(a.partition_values.items())), []).append(a)
        compacted = 0
        groups: list[RowGroup] = []
        for part_files in by_part.values():
            files = select(part_files)
            heavy = max_deleted_rows_ratio is not None and any(deleted_ratio(a) > max_deleted_rows_ratio for a in files)
            if not files or (len(files) < min_files and not heavy):
                continue
            tx.read_files_from(files)
            hidden = row_tracking.hidden_columns(snap)
            parts = [read_file(table.storage, snap, a, schema, hidden) for a in files]
            merged = pa.concat_tables(parts)
            if zorder_by:
                merged = zorder(merged, zorder_by)
            tx.remove_all([files], data_change=False)
            out = write(table.storage, snap, merged, data_change=False) \
                if merged.num_rows else []
            tx.stage(out)
            groups.append(RowGroup(tuple(Source(a.path, p.num_rows, a.deletion_vector) for a, p in zip(files, parts, strict=True)),
                                   tuple(Target(a.path, json.loads(a.stats or "{}")["numRecords"]) for a in out)))
            compacted += len(files)
        if not compacted:
            return noop(snap, tx, operation, {"numRemovedFiles": 0, "numAddedFiles": 0})
        row_map = encode_row_map(groups)
        if not zorder_by and len(json.dumps(row_map)) <= ROW_MAP_MAX_CHARS:
            tx.info[ROW_MAP_KEY] = row_map
        params = {"predicate": json.dumps([where] if where else []), "zOrderBy": json.dumps(list(zorder_by)),
                  "filesCompacted": str(compacted)}
        if operation == "REORG":
            params = {"predicate": params["predicate"], "applyPurge": "true", "filesCompacted": str(compacted)}
        if kind is not None:
            params[COMPACTION_PARAMETER] = kind
        return tx.commit(operation, changes_data=False, parameters=params)

