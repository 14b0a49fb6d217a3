"""Row identity for rows this writer copies into new files on a row-tracking table.

A row keeps its id and commit version when UPDATE, MERGE, a file-rewriting DELETE or OPTIMIZE moves it to
a new file: the new file carries them in the table's two hidden (materialized) columns. A row changed by
UPDATE or MERGE keeps its id but gets a null commit version, so readers see the version that changed it;
inserted rows carry nulls in both, and the coordinator gives them fresh ids (`deltacoord.coordinator.rules.row_ids`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import AddFile
from deltacoord.schemas.row_tracking import MaterializedColumns, materialized_columns, supported


def hidden_columns(snap: Snapshot) -> MaterializedColumns | None:
    """The hidden columns to keep copied rows' identity in (None: the table tracks no row ids)."""
    if not supported(snap.protocol):
        return None
    return materialized_columns(snap.metadata)


def _column(raw: pa.Table, name: str, positions: npt.NDArray[np.int64], default: pa.Array) -> pa.Array:
    """The hidden column's values at `positions` where it has one, else `default`."""
    if name not in raw.column_names:
        return default
    stored = raw.column(name).take(pa.array(positions)).combine_chunks().cast(pa.int64())
    return pc.coalesce(stored, default)


def with_identity(t: pa.Table, cols: MaterializedColumns, add: AddFile, raw: pa.Table,
                  positions: npt.NDArray[np.int64]) -> pa.Table:
    """`t` (the file's rows at physical `positions`, read from `raw`) with each row's id and commit version."""
    n = len(positions)
    base, version = add.base_row_id, add.default_row_commit_version
    ids = pa.array(base + positions, pa.int64()) if base is not None else pa.nulls(n, pa.int64())
    versions = pa.array(np.full(n, version, np.int64)) if version is not None else pa.nulls(n, pa.int64())
    return (t.append_column(cols.row_id, _column(raw, cols.row_id, positions, ids))
            .append_column(cols.row_commit_version, _column(raw, cols.row_commit_version, positions, versions)))


def changed(t: pa.Table, cols: MaterializedColumns, mask: pa.Array | None = None) -> pa.Table:
    """`t` with the commit version cleared on the rows `mask` selects (all rows without a mask): they change."""
    i = t.column_names.index(cols.row_commit_version)
    old = t.column(i)
    new = pa.nulls(t.num_rows, pa.int64()) if mask is None else pc.if_else(mask, pa.scalar(None, pa.int64()), old)
    return t.set_column(i, cols.row_commit_version, new)


def carried(rows: pa.Table, ids: pa.ChunkedArray | pa.Array, cols: MaterializedColumns) -> pa.Table:
    """New rows (in the table schema) that keep the ids `ids` and change now (null commit version)."""
    return rows.append_column(cols.row_id, ids).append_column(cols.row_commit_version, pa.nulls(rows.num_rows, pa.int64()))


__all__ = ["carried", "changed", "hidden_columns", "with_identity"]
