"""Reading Delta checkpoints (classic V1, and V2 with sidecars) as Arrow: batched, column-projected.

Every batch is conformed to `CHECKPOINT_SCHEMA` (`deltacoord.schemas.action_arrow`, with the codec between
actions and Arrow), so checkpoints written by Spark (extra `add.partitionValues_parsed`, `add.stats_parsed`,
...), delta-rs (extra `sidecar`, `clusteringProvider`, non-null fields) or this project all look the same to
callers.

V2 checkpoints (UUID-named `.parquet`/`.json` with `_sidecars/`) are read too:
their `sidecar` actions are followed and the sidecar files' rows are yielded
after the checkpoint's own rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from deltacoord.reader.log import LogFile, data_object, parse_commit_lines
from deltacoord.schemas.action_arrow import (
    ACTION_COLUMNS,
    CHECKPOINT_SCHEMA,
    DEFAULT_BATCH_ROWS,
    actions_from_batch,
    actions_to_record_batch,
    conform_batch,
    conform_chunked,
)
from deltacoord.schemas.actions import Action
from deltacoord.storage.table import StorageError, StoredObject, stored_object

#: A leaf that is non-null whenever its action is present: all-null in a row group's
#: statistics means no row of that group holds the action.
_PRESENCE_LEAF = {
    "txn": "txn.appId",
    "add": "add.path",
    "remove": "remove.path",
    "metaData": "metaData.id",
    "protocol": "protocol.minReaderVersion",
    "domainMetadata": "domainMetadata.domain",
}


class CheckpointReadError(ValueError):
    """A checkpoint file exists but cannot be read as a Delta checkpoint."""


# --------------------------------------------------------------------------- reading


def _projection(schema: pa.Schema, columns: Sequence[str]) -> tuple[list[str], pa.Schema]:
    target = pa.schema([CHECKPOINT_SCHEMA.field(c) for c in columns])
    present = [c for c in columns if schema.get_field_index(c) >= 0]
    return present, target


def _sidecar_paths_from_parquet(pf: pq.ParquetFile, ckpt: StoredObject) -> list[StoredObject]:
    if pf.schema_arrow.get_field_index("sidecar") < 0:
        return []
    col = pf.read(columns=["sidecar"]).column("sidecar")
    out: list[StoredObject] = []
    for row in col.to_pylist():
        if row and row.get("path"):
            out.append(_resolve_sidecar(ckpt, row["path"]))
    return out


def _resolve_sidecar(ckpt: StoredObject, p: str) -> StoredObject:
    """A sidecar named by a V2 checkpoint: relative to `_delta_log/_sidecars/`, or absolute."""
    if "://" in p or p.startswith("file:") or unquote(p).startswith("/"):
        return data_object(ckpt.storage, p)
    prefix = f"{ckpt.parent_key}/_sidecars" if ckpt.parent_key else "_sidecars"
    return StoredObject(ckpt.storage, f"{prefix}/{unquote(p)}")


def _json_checkpoint_batches(ckpt: StoredObject, columns: Sequence[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Rows of a V2 JSON checkpoint (then its sidecars)."""
    sidecars: list[StoredObject] = []
    lines: list[str] = []
    for line in ckpt.read_bytes().decode("utf-8").splitlines(keepends=True):
        if '"sidecar"' in line:
            obj = json.loads(line)
            if "sidecar" in obj:
                sidecars.append(_resolve_sidecar(ckpt, obj["sidecar"]["path"]))
                continue
        lines.append(line)
        if len(lines) >= batch_rows:
            yield actions_to_record_batch(parse_commit_lines("".join(lines), source=str(ckpt)), columns=columns)
            lines = []
    if lines:
        yield actions_to_record_batch(parse_commit_lines("".join(lines), source=str(ckpt)), columns=columns)
    for sc in sidecars:
        yield from _parquet_batches(sc, columns, batch_rows, follow_sidecars=False)


def _row_groups_holding(pf: pq.ParquetFile, columns: Sequence[str]) -> list[int] | None:
    """Row groups that may hold a row of any of `columns`, by their null-count statistics.

    None (read everything) when a column has no presence leaf in this file; a row group
    without statistics for a presence leaf is read.
    """
    md = pf.metadata
    leaves = {md.schema.column(j).path: j for j in range(md.num_columns)}
    idx: list[int] = []
    for c in columns:
        leaf = _PRESENCE_LEAF.get(c)
        if leaf is None or leaf not in leaves:
            return None
        idx.append(leaves[leaf])
    groups: list[int] = []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for j in idx:
            st = rg.column(j).statistics
            if st is None or not st.has_null_count or st.null_count < rg.num_rows:
                groups.append(g)
                break
    return groups


def _parquet_batches(
    path: StoredObject, columns: Sequence[str], batch_rows: int, *, follow_sidecars: bool = True, skip_absent: bool = False,
    use_threads: bool = True,
) -> Iterator[pa.RecordBatch]:
    try:
        # pre_buffer (on by default) coalesces reads ahead and its buffers grew RSS by ~60 MB
        # streaming a 900k-row checkpoint; these batches are read once, in order, from one file.
        pf = path.read_parquet_file(pre_buffer=False)
    except (OSError, pa.ArrowException, StorageError) as e:
        raise CheckpointReadError(f"cannot read checkpoint file {path}: {e}") from e
    present, target = _projection(pf.schema_arrow, columns)
    sidecars = _sidecar_paths_from_parquet(pf, path) if follow_sidecars else []
    groups = _row_groups_holding(pf, present) if (skip_absent and present) else None
    if present and groups != []:
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=present, use_threads=use_threads):
            yield conform_batch(batch, target)
    elif not present and not skip_absent:
        # none of the requested columns exist: all-null rows keep row counts honest
        remaining = pf.metadata.num_rows
        while remaining > 0:
            n = min(remaining, batch_rows)
            yield pa.RecordBatch.from_arrays([pa.nulls(n, f.type) for f in target], schema=target)
            remaining -= n
    for sc in sidecars:
        yield from _parquet_batches(sc, columns, batch_rows, follow_sidecars=False, skip_absent=skip_absent,
                                    use_threads=use_threads)


def iter_checkpoint_batches(
    paths: Iterable[LogFile],
    columns: Sequence[str] = ACTION_COLUMNS,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    *,
    skip_absent: bool = False,
    use_threads: bool = True,
) -> Iterator[pa.RecordBatch]:
    """Record batches (at most `batch_rows` rows) of a checkpoint's parts, conformed to `columns`.

    Memory is bounded by one batch (plus Parquet's row-group buffers). With
    `skip_absent`, Parquet row groups whose statistics show none of `columns`
    are not read (so rows are missing, not all-null): reading a table's few
    protocol/metaData/txn rows then costs one row group, not the whole file.
    `use_threads=False` decodes on the calling thread: slower, but the allocator
    then reuses and returns the decoder's freed buffers instead of keeping them in
    other threads' heaps.
    """
    for c in columns:
        if c not in ACTION_COLUMNS:
            raise ValueError(f"unknown checkpoint column {c!r}")
    for ref in paths:
        p = stored_object(ref)
        if p.name.endswith(".json"):
            yield from _json_checkpoint_batches(p, columns, batch_rows)
        else:
            yield from _parquet_batches(p, columns, batch_rows, skip_absent=skip_absent, use_threads=use_threads)


def read_checkpoint_table(paths: Iterable[LogFile], columns: Sequence[str] = ACTION_COLUMNS) -> pa.Table:
    """A whole checkpoint (selected columns) as one Arrow table, read with Parquet's threads."""
    target = pa.schema([CHECKPOINT_SCHEMA.field(c) for c in columns])
    tables: list[pa.Table] = []
    for ref in paths:
        p = stored_object(ref)
        if p.name.endswith(".json"):
            tables.append(pa.Table.from_batches(list(_json_checkpoint_batches(p, columns, DEFAULT_BATCH_ROWS)), schema=target))
            continue
        try:
            pf = p.read_parquet_file()
            present, _ = _projection(pf.schema_arrow, columns)
            t = pf.read(columns=present, use_threads=True) if present else None
            sidecars = _sidecar_paths_from_parquet(pf, p)
        except (OSError, pa.ArrowException, StorageError) as e:
            raise CheckpointReadError(f"cannot read checkpoint file {p}: {e}") from e
        n = pf.metadata.num_rows
        cols = []
        for f in target:
            if t is not None and t.schema.get_field_index(f.name) >= 0:
                cols.append(conform_chunked(t.column(f.name), f.type))
            else:
                cols.append(pa.chunked_array([pa.nulls(n, f.type)], type=f.type))
        tables.append(pa.Table.from_arrays(cols, schema=target))
        for sc in sidecars:
            tables.append(pa.Table.from_batches(list(_parquet_batches(sc, columns, DEFAULT_BATCH_ROWS, follow_sidecars=False)), schema=target))
    if not tables:
        return target.empty_table()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def read_checkpoint_actions(
    paths: Iterable[LogFile], columns: Sequence[str] = ACTION_COLUMNS, batch_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[Action]:
    """All actions of a checkpoint, converted batch by batch (bounded memory)."""
    for batch in iter_checkpoint_batches(paths, columns, batch_rows):
        yield from actions_from_batch(batch)


