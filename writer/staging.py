"""Stage data as Parquet files under the table root, with Delta's per-file statistics.

Files land in Hive-style partition directories with unique names, on whatever
store the table lives (`deltacoord.storage.table.TableStorage`: a local directory, S3,
Azure, GCS); each yields an `add` action carrying partition values serialised
as Delta specifies and a stats JSON (numRecords, minValues, maxValues, nullCount).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import math
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.schemas import arrow_types
from deltacoord.schemas.actions import AddCDCFile, AddFile
from deltacoord.storage.table import TableStorage
from deltacoord.writer.column_mapping import Layout

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
#: Where change data files live (PROTOCOL.md "Change Data Files").
CHANGE_DATA_DIR = "_change_data"
#: The column of a change data file naming the change of each row.
CHANGE_TYPE = "_change_type"
#: Bytes of data per written file unless the table sets `delta.targetFileSize`: measured as Arrow holds the rows
#: in memory, so Parquet's encoding and compression make the files at most this size (delta-rs's
#: `target_file_size` is 100 MiB; Delta's OPTIMIZE aims at 1 GiB).
TARGET_FILE_SIZE = 128 * 1024 * 1024
#: Delta truncates string statistics to this many characters.
STRING_STATS_PREFIX = 32
_HIVE_ESCAPE = set('"#%\'*/:=?\\\x7f{[]}^')


class SchemaError(ValueError):
    """Data whose schema this writer cannot express in Delta, or that does not match the table."""


# -- schema ---------------------------------------------------------------------------
def delta_type(t: pa.DataType) -> Any:
    """The Delta (Spark JSON) type of an Arrow type (`deltacoord.schemas.arrow_types`)."""
    try:
        return arrow_types.arrow_to_delta(t)
    except arrow_types.DeltaTypeError as e:
        raise SchemaError(str(e)) from None


def schema_string(schema: pa.Schema) -> str:
    """Delta's `schemaString` for an Arrow schema."""
    try:
        struct = arrow_types.arrow_schema_to_delta(schema)
    except arrow_types.DeltaTypeError as e:
        raise SchemaError(str(e)) from None
    return json.dumps(struct, separators=(",", ":"))


# -- values ------------------------------------------------------------------------------
def serialize_partition_value(v: Any) -> str | None:
    """Delta's partition value serialisation (PROTOCOL.md "Partition Value Serialization")."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        return str(v.isoformat(sep=" ", timespec="microseconds"))
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.decode("latin-1")
    return str(v)  # numbers and strings: their decimal / literal text


def _hive_escape(s: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _HIVE_ESCAPE or ord(c) < 0x20 else c for c in s)


def _dir_value(v: str | None) -> str:
    return HIVE_NULL if v is None else _hive_escape(v)


def _stat_value(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:  # timestamp_ntz: a wall time, written without a zone as Delta Spark writes it
            return v.isoformat(timespec="milliseconds")
        return v.astimezone(dt.UTC).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    return v


def file_stats(table: pa.Table, columns: Iterable[str]) -> str:
    """Delta stats JSON for the given (non-partition) columns of one file."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in columns:
        col = table.column(name)
        nulls[name] = col.null_count
        t = col.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_decimal(t)):
            continue
        if col.null_count == len(col):
            continue
        mm = pc.min_max(col)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if isinstance(lo, str):
            lo = lo[:STRING_STATS_PREFIX]
            if len(hi) > STRING_STATS_PREFIX:
                hi = None  # a truncated max would not bound the data
        # NaN bounds are meaningless, and JSON has no NaN or Infinity (Delta readers refuse them): a bound that
        # is not a finite number is left out, which any reader takes as "unknown".
        if not (isinstance(lo, float) and not math.isfinite(lo)):
            mins[name] = _stat_value(lo)
        if hi is not None and not (isinstance(hi, float) and not math.isfinite(hi)):
            maxs[name] = _stat_value(hi)
    return json.dumps({"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}, separators=(",", ":"))


# -- files --------------------------------------------------------------------------------
def _storage(root: Path | TableStorage) -> TableStorage:
    # Data files are not fsynced (as before the storage edge, and as Spark does not): a torn
    # staged file is never committed, and the log is what must be durable.
    return root if isinstance(root, TableStorage) else TableStorage(root, fsync=False)


def write_data_files(
    root: Path | TableStorage,
    data: pa.Table,
    partition_by: Sequence[str] = (),
    *,
    data_change: bool = True,
    target_file_size: int = TARGET_FILE_SIZE,
    max_rows_per_file: int | None = None,
    layout: Layout | None = None,
) -> list[AddFile]:
    """Write `data` as Parquet under the table `root` (a local path or its `TableStorage`): per partition,
    as few files of about equal size as keep each within `target_file_size` (and `max_rows_per_file`);
    returns their adds. With a column-mapping `layout` the files, stats and partition values carry
    physical names (`deltacoord.writer.column_mapping`)."""
    now_ms = int(time.time() * 1000)
    written = _write_files(root, data, partition_by, layout, "", "part", target_file_size, max_rows_per_file)
    with _deleted_on_error(_storage(root), [unquote(path) for path, _p, _s, _c in written]):
        return [
            AddFile(path=path, partition_values=pvals, size=size, modification_time=now_ms, data_change=data_change,
                    stats=file_stats(chunk, chunk.column_names))
            for path, pvals, size, chunk in written
        ]


def write_cdc_files(root: Path | TableStorage, changes: pa.Table, partition_by: Sequence[str] = (), *,
                    layout: Layout | None = None) -> list[AddCDCFile]:
    """Write change rows (the table's columns and `_change_type`) as Parquet under `_change_data/`, one file
    per partition, as Delta's change data feed stores them; returns their `cdc` actions."""
    return [AddCDCFile(path=path, partition_values=pvals, size=size, data_change=False)
            for path, pvals, size, _chunk in _write_files(root, changes, partition_by, layout, CHANGE_DATA_DIR, "cdc",
                                                         TARGET_FILE_SIZE, None)]


def _write_files(root: Path | TableStorage, data: pa.Table, partition_by: Sequence[str], layout: Layout | None,
                 prefix: str, kind: str, target_file_size: int,
                 max_rows_per_file: int | None) -> list[tuple[str, dict[str, str | None], int, pa.Table]]:
    """Write `data` per partition; (escaped path, partitionValues, size, the stored rows) of each file."""
    for c in partition_by:
        if c not in data.column_names:
            raise SchemaError(f"partition column {c!r} is missing from the data (columns: {data.column_names})")
    data_cols = [c for c in data.column_names if c not in partition_by]
    out: list[tuple[str, dict[str, str | None], int, pa.Table]] = []
    if data.num_rows == 0:
        return out
    groups: list[tuple[dict[str, Any], pa.Table]]
    if partition_by:
        keys = data.select(list(partition_by)).group_by(list(partition_by)).aggregate([]).to_pylist()
        groups = []
        for key in keys:
            mask = None
            for c, v in key.items():
                m = pc.is_null(data.column(c)) if v is None else pc.equal(data.column(c), pa.scalar(v, data.schema.field(c).type))
                mask = m if mask is None else pc.and_(mask, m)
            groups.append((key, data.filter(mask)))
    else:
        groups = [({}, data)]
    storage = _storage(root)
    physical = layout.physical_name if layout is not None else (lambda c: c)
    # Each key is listed before its object is written, so an error or Ctrl-C at any moment (the object
    # stored, its entry not yet made) deletes every file this call wrote: nobody else knows of them yet.
    stored: list[str] = []
    with _deleted_on_error(storage, stored):
        for key, part in groups:
            pvals = {physical(c): serialize_partition_value(key[c]) for c in partition_by}
            dirs = [f"{_hive_escape(physical(c))}={_dir_value(pvals[physical(c)])}" for c in partition_by]
            rel_dir = "/".join([prefix, *dirs] if prefix else dirs)
            rows_per_file = _rows_per_file(part, target_file_size, max_rows_per_file)
            for start in range(0, part.num_rows, rows_per_file):
                chunk = part.slice(start, rows_per_file).select(data_cols)
                if layout is not None:
                    chunk = layout.to_physical(chunk)
                name = f"{kind}-00000-{uuid.uuid4()}-c000.snappy.parquet"
                rel = f"{rel_dir}/{name}" if rel_dir else name
                stored.append(rel)
                size = storage.write_parquet(rel, chunk, compression="snappy")
                out.append((quote(rel, safe="/=-_.~"), pvals, size, chunk))
    return out


@contextlib.contextmanager
def _deleted_on_error(storage: TableStorage, keys: Sequence[str]) -> Iterator[None]:
    """Delete `keys` (best effort; missing ones are fine) when the block raises anything, Ctrl-C included."""
    try:
        yield
    except BaseException:
        for k in keys:
            with contextlib.suppress(Exception):
                storage.delete(k)
        raise


def _rows_per_file(part: pa.Table, target_file_size: int, max_rows_per_file: int | None) -> int:
    """Rows per file splitting `part` into the fewest files of about equal size within both bounds."""
    rows, size = int(part.num_rows), int(part.nbytes)
    files = max(1, math.ceil(size / max(1, target_file_size)))
    if max_rows_per_file is not None:
        files = max(files, math.ceil(rows / max_rows_per_file))
    return max(1, math.ceil(rows / files))


def target_file_size(configuration: Mapping[str, str] | None) -> int:
    """The table's `delta.targetFileSize` in bytes (a number, or with a unit: 64mb, 1gb), else TARGET_FILE_SIZE."""
    text = (configuration or {}).get("delta.targetFileSize")
    if text is None:
        return TARGET_FILE_SIZE
    m = re.fullmatch(r"\s*(\d+)\s*(b|k|kb|m|mb|g|gb)?\s*", text.lower())
    if m is None or int(m.group(1)) <= 0:
        raise SchemaError(f"the table property delta.targetFileSize={text!r} is not a size in bytes "
                          f"(for example 134217728 or 128mb)")
    unit = {"k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}
    return int(m.group(1)) * unit.get(m.group(2) or "b", 1)


def delete_staged(root: Path | TableStorage, adds: Iterable[AddFile | AddCDCFile]) -> None:
    """Remove files staged for a proposal that did not commit (relative paths only: never a file
    outside the table)."""
    storage = _storage(root)
    for a in adds:
        key = unquote(a.path)
        if "://" in a.path or key.startswith("/"):
            continue
        with contextlib.suppress(FileNotFoundError):
            storage.delete(key)


def to_arrow(data: Any) -> pa.Table:
    """Accept a pyarrow Table, RecordBatchReader, RecordBatch or pandas DataFrame."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(data, pd.DataFrame):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise TypeError(f"expected a pyarrow Table, RecordBatchReader or pandas DataFrame, got {type(data).__name__}")
