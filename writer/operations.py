"""What every `Table` operation shares: the handle it works on, reading a data file's rows, conforming
data to the table schema, staging files and change data, and marking rows deleted.

Each kind of operation lives in its own module (`table_writes`, `row_changes`, `merge`, `maintenance`,
`table_ddl`, `table_control`); `deltacoord.writer.table.Table` delegates to them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.reader.deletion_vectors import (
    dv_object,
    keep_mask,
    read_deletion_vector,
    write_deletion_vector,
)
from deltacoord.reader.log import data_object
from deltacoord.reader.snapshot import (
    Snapshot,
    UnsupportedTableFeatureError,
    delta_schema_to_arrow,
    parse_partition_value,
    to_logical,
)
from deltacoord.schemas.actions import AddFile, Metadata
from deltacoord.schemas.expressions import arrow as expressions
from deltacoord.schemas.expressions.partitions import prune
from deltacoord.schemas.identity import identity_columns, with_high_water_marks
from deltacoord.schemas.properties import TableProperties
from deltacoord.schemas.row_tracking import MaterializedColumns
from deltacoord.schemas.table_features import (
    writer_problems,
)
from deltacoord.storage.table import TableStorage
from deltacoord.writer import identity, row_tracking, staging
from deltacoord.writer.column_mapping import Layout
from deltacoord.writer.constraints import WriteRules, fill_and_check
from deltacoord.writer.decimals import is_decimal_source, to_decimal
from deltacoord.writer.transaction import CommitResult, TableHandle, Transaction


class OperationTable(TableHandle, Protocol):
    """What an operation needs of its table beyond a transaction's needs (`deltacoord.writer.table.Table` is one).

    `begin_operation` is the hook a multi-table transaction's part overrides (`deltacoord.writer.multi_table`), so every
    operation opens its transaction through it.
    """

    #: Deletion vectors whose bitmap is at most this size are stored in the log, larger ones in files.
    dv_inline_max_bytes: int

    @property
    def last_committed_version(self) -> int | None: ...

    def snapshot(self, version: int | None = None, *, ratified: bool = False,
                 files_on_demand: bool = False) -> Snapshot: ...

    def cached_snapshot(self) -> Snapshot: ...

    def exists(self) -> bool: ...

    def restart_at(self, version: int) -> None: ...

    def begin_operation(self, read_version: int, proposal_id: str | None) -> Transaction: ...


#: The table property that turns the change data feed on.
CDF_PROPERTY = "delta.enableChangeDataFeed"


def cdf_on(properties: Mapping[str, str]) -> bool:
    """Whether `properties` turn the change data feed on."""
    return str(properties.get(CDF_PROPERTY, "false")).lower() == "true"


def changed(rows: pa.Table, kind: str) -> pa.Table:
    """`rows` as change data: with the `_change_type` column (delete, insert, update_preimage, update_postimage)."""
    return rows.append_column(staging.CHANGE_TYPE, pa.array([kind] * rows.num_rows, pa.string()))


#: The table feature deletion vectors need (reader 3 / writer 7 protocols list it on both sides).
DV_FEATURE = "deletionVectors"


def check_writable(snap: Snapshot, operation: str = "WRITE") -> None:
    """Refuse tables whose declared writer features this writer cannot honour for `operation`
    (`deltacoord.schemas.table_features`): writing them anyway would break the table for every other engine."""
    problems = writer_problems(snap.protocol, snap.metadata, operation)
    if problems:
        feature, why = problems[0]
        more = "" if len(problems) == 1 else f" (and {', '.join(f for f, _ in problems[1:])})"
        raise UnsupportedTableFeatureError(
            f"{snap.table_uri}: cannot {operation} this table: writer feature {feature}: {why}{more}. Write it with "
            "an engine that supports the feature, or change the table so it no longer needs it."
        )


def deleted_ratio(a: AddFile) -> float:
    """The share of the file's rows its deletion vector deletes (0 without one or without numRecords)."""
    n = a.num_records()
    return a.deletion_vector.cardinality / n if a.deletion_vector is not None and n is not None and n > 0 else 0.0


def loose_stats(stats: str | None) -> str | None:
    """A file's stats once some of its rows are deleted by a DV: numRecords stays the physical count and the
    min/max bounds may no longer be reached (`tightBounds: false`)."""
    if stats is None:
        return None
    d = json.loads(stats)
    d["tightBounds"] = False
    return json.dumps(d, separators=(",", ":"))


#: Called with the rows, files and bytes staged so far.
Progress = Callable[[int, int, int], None]


#: Rows read at a time from a RecordBatchReader (then gathered into files of the table's target size).
CHUNK_ROWS = 1_000_000


def chunks(data: Any) -> Iterator[Any]:
    """The data to append in chunks: a RecordBatchReader as tables of at most CHUNK_ROWS rows, an iterator
    (a generator of tables or batches) item by item, anything else whole."""
    if isinstance(data, Iterator):
        yield from data
        return
    if not isinstance(data, pa.RecordBatchReader):
        yield data
        return
    pending: list[pa.RecordBatch] = []
    count = 0
    made = 0
    for batch in data:
        pending.append(batch)
        count += batch.num_rows
        if count >= CHUNK_ROWS:
            yield pa.Table.from_batches(pending, schema=data.schema)
            pending, count, made = [], 0, made + 1
    if pending or not made:
        yield pa.Table.from_batches(pending, schema=data.schema)


def type_family(t: pa.DataType) -> str:
    """Types that cast into each other without changing what a value means (as delta-rs and Spark's
    ANSI store assignment allow): numbers, text, binary, dates and timestamps, booleans, and nested types."""
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "numeric"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return "datetime"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_null(t):
        return "null"
    return str(t)  # nested: the cast itself checks the fields


def check_assignable(column: str, given: pa.DataType, target: pa.DataType) -> None:
    """Refuse data whose type means something else in the column (an int written into a string column).

    Within a family the cast is Arrow's safe cast: an overflow or a truncation fails instead of changing a value.
    """
    g, want = type_family(given), type_family(target)
    if g == "null" or g == want or (g.startswith(("struct", "list", "large_list", "map")) and want == g.split("<")[0]):
        return
    if g.split("<")[0] == want.split("<")[0]:
        return
    if (g, want) == ("string", "datetime"):
        return  # ISO dates and timestamps given as text (JSON has no date type); a value that does not parse fails
    raise staging.SchemaError(f"column {column!r} is {target} in the table but the data has {given}: deltacoord does not "
                              f"cast between {g.split('<')[0]} and {want.split('<')[0]} (it would change the values' meaning); "
                              f"convert the column in the data first, e.g. pyarrow.compute.cast(..., {target})")


def conform_column(name: str, values: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """`values` as the column's type `target`: decimals exactly (`deltacoord.writer.decimals`), others by Arrow's safe cast
    within a family of types (`check_assignable`); SchemaError naming the column otherwise."""
    if values.type == target:
        return values
    if pa.types.is_decimal(target) and is_decimal_source(values.type):
        return to_decimal(name, values, target)
    check_assignable(name, values.type, target)
    try:
        return values.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise staging.SchemaError(f"column {name!r}: cannot write {values.type} as {target}: {e}") from e


@contextlib.contextmanager
def abandoned_on_error(tx: Transaction) -> Iterator[None]:
    """Files staged for `tx` are deleted if preparing it fails before it is proposed."""
    try:
        yield
    except BaseException:
        tx.abandon()
        raise


def replace_metadata(md: Metadata, *, schema_string: str | None = None,
                     configuration: Mapping[str, str] | None = None) -> Metadata:
    """`md` with a new schema and/or configuration (same table id, name and creation time)."""
    return Metadata(id=md.id, schema_string=schema_string or md.schema_string, partition_columns=md.partition_columns,
                    configuration=dict(md.configuration if configuration is None else configuration), name=md.name,
                    description=md.description, created_time=md.created_time)


def advance_identity(tx: Transaction, snap: Snapshot, marks: Mapping[str, int]) -> None:
    """Record the identity values this transaction handed out: the new high-water marks, in a metaData action."""
    if marks:
        tx.add(replace_metadata(snap.metadata, schema_string=with_high_water_marks(snap.metadata.schema_string, marks)))


def conform(data: Any, snap: Snapshot, identity_marks: dict[str, int] | None = None) -> pa.Table:
    """Data cast to the table schema (missing columns as nulls, extra columns refused), the identity values
    it lacks generated (`identity_marks`: the marks this transaction advanced so far), generated columns it
    omits computed, and every row checked against the table's constraints (`deltacoord.writer.constraints`)."""
    t = staging.to_arrow(data)
    columns = identity_columns(snap.metadata.schema())
    if columns:
        t = identity.fill(t, columns, identity_marks if identity_marks is not None else {})
    target = delta_schema_to_arrow(snap.metadata.schema())
    missing = [n for n in t.column_names if n not in target.names]
    if missing:
        raise staging.SchemaError(f"columns {missing} are not in the table schema {target.names}; add them first")
    cols = []
    for f in target:
        if f.name in t.column_names:
            col = conform_column(f.name, t.column(f.name), f.type)
        else:
            col = pa.chunked_array([pa.nulls(t.num_rows, f.type)], type=f.type)
        cols.append(col)
    return fill_and_check(WriteRules.of(snap.protocol, snap.metadata), pa.Table.from_arrays(cols, schema=target),
                          t.column_names)


def read_file(storage: TableStorage, snap: Snapshot, add: AddFile, schema: pa.Schema,
              identity: MaterializedColumns | None = None) -> pa.Table:
    """The rows of one data file in the table schema, deletion vector applied."""
    return scan(storage, snap, add, schema, identity)[0]


def scan(storage: TableStorage, snap: Snapshot, add: AddFile, schema: pa.Schema,
         identity: MaterializedColumns | None = None) -> tuple[pa.Table, npt.NDArray[np.int64]]:
    """The rows of one data file (deletion vector applied) and the physical row index of each; columns are
    found by their physical names on a column-mapping table. With `identity` (a row-tracking table), each
    row's id and commit version in those hidden columns."""
    layout = layout_of(snap, schema)
    t = data_object(storage, add.path).read_parquet_file().read()
    n = t.num_rows
    cols = []
    for f in schema:
        phys = layout.physical_name(f.name)
        if f.name in snap.partition_columns:
            v = parse_partition_value(add.partition_values.get(phys), f.type)
            cols.append(pa.array([v] * n, type=f.type))
        elif phys in t.column_names:
            col = t.column(phys)
            field_json = layout.fields.get(f.name)
            cols.append(to_logical(col.combine_chunks() if col.num_chunks != 1 else col.chunk(0),
                                    field_json.get("type") if field_json is not None else None, f.type, layout.mode,
                                    f.name))
        else:
            cols.append(pa.nulls(n, f.type))
    out = pa.Table.from_arrays(cols, schema=schema)
    positions = np.arange(n, dtype=np.int64)
    if identity is not None:
        out = row_tracking.with_identity(out, identity, add, t, positions)
    if add.deletion_vector is not None:
        keep = keep_mask(n, read_deletion_vector(storage, add.deletion_vector))
        out = out.filter(pa.array(keep))
        positions = positions[keep]
    return out, positions


def layout_of(snap: Snapshot, schema: pa.Schema | None = None) -> Layout:
    """How the table names its columns in files (`deltacoord.writer.column_mapping`)."""
    return Layout.of(snap.metadata, schema if schema is not None else delta_schema_to_arrow(snap.metadata.schema()))


def write(storage: TableStorage, snap: Snapshot, data: pa.Table, *, data_change: bool = True,
          target_file_size: int | None = None) -> list[AddFile]:
    """Stage `data` (logical names, the table schema) as the table stores it (`deltacoord.writer.column_mapping`), in
    files of at most `target_file_size` (else the table's target size)."""
    layout = layout_of(snap, data.schema)
    if target_file_size is None:
        target_file_size = staging.target_file_size(snap.metadata.configuration)
    return staging.write_data_files(storage, data, snap.partition_columns, data_change=data_change,
                                    target_file_size=target_file_size,
                                    layout=layout if layout.mapped else None)


def change_feed(snap: Snapshot) -> bool:
    """DELETE, UPDATE and MERGE write `_change_data` files (`delta.enableChangeDataFeed`)."""
    return cdf_on(snap.metadata.configuration)


def stage_changes(storage: TableStorage, tx: Transaction, snap: Snapshot, changes: list[pa.Table]) -> None:
    """Write the changed rows (each table with its `_change_type`) as the commit's change data files."""
    names = [*delta_schema_to_arrow(snap.metadata.schema()).names, staging.CHANGE_TYPE]
    changes = [c.select(names) for c in changes if c.num_rows]  # without row tracking's hidden columns
    if not changes:
        return
    layout = layout_of(snap)
    tx.stage_cdc(staging.write_cdc_files(storage, pa.concat_tables(changes), snap.partition_columns,
                                         layout=layout if layout.mapped else None))


def writes_dvs(snap: Snapshot) -> bool:
    """DELETE, UPDATE and MERGE write deletion vectors: the property is on and the protocol has the feature."""
    return TableProperties.of(snap.metadata).deletion_vectors and DV_FEATURE in (snap.protocol.writer_features or ())


def delete_rows(table: OperationTable, tx: Transaction, add: AddFile, kept: npt.NDArray[np.int64], deleted: npt.NDArray[np.int64]) -> None:
    """Mark the physical rows `deleted` of `add` as deleted: the file is removed and re-added with a deletion
    vector holding its earlier deleted rows and these (removed for good when no row is left).

    `kept` are the file's rows alive before (its deletion vector holds the others).
    """
    tx.remove(add)
    if len(kept) <= len(np.unique(deleted)):
        return
    before = (read_deletion_vector(table.storage, add.deletion_vector) if add.deletion_vector is not None
              else np.zeros(0, dtype=np.uint64))
    gone = np.union1d(before, deleted.astype(np.uint64))
    dv = write_deletion_vector(table.storage, gone.astype(np.uint64), inline_max_bytes=table.dv_inline_max_bytes)
    if dv.storage_type == "u":  # a file: deleted with the staged files if the proposal does not commit
        tx.staged_keys.append(dv_object(table.storage, dv).key)
    tx.add(dataclasses.replace(add, deletion_vector=dv, stats=loose_stats(add.stats), data_change=True))


def candidates(snap: Snapshot, where: str | None) -> list[AddFile]:
    """Files that may hold matching rows by partition (the coordinator's own matcher, `partitions.prune`)."""
    return prune(snap.files(), where, snap.metadata, lambda a: a.partition_values)


def rows_where(t: pa.Table, cond: Any, text: str = "condition") -> pa.Array:
    """Rows where `cond` (the SQL `text`) is TRUE (NULL counts as false, as in SQL WHERE)."""
    import pyarrow.dataset as ds  # here: it imports pandas, a quarter second of every fresh process

    with expressions.evaluating(text):
        m = ds.dataset(t).to_table(columns={"m": cond}).column("m")
    return pc.fill_null(m.combine_chunks(), False)


def noop(snap: Snapshot, tx: Transaction, operation: str, metrics: Mapping[str, int]) -> CommitResult:
    """An operation with nothing to change makes no commit (as Delta's commitIfNeeded)."""
    return CommitResult(snap.version, tx.proposal_id, operation, metrics=dict(metrics), noop=True)

