"""The Arrow form of Delta actions: the classic checkpoint schema and the codec between actions and Arrow.

`CHECKPOINT_SCHEMA` is the schema Delta Spark writes in a classic (V1) checkpoint (all fields nullable, maps of
string to nullable string, lists of nullable strings). Actions become record batches of it
(`actions_to_record_batch`, the coordinator's checkpoints) and batches become actions again
(`actions_from_batch`, `adds_from_struct`, the reader); `conform_batch` gives a batch another writer's
checkpoint produced (Spark's extra `add.stats_parsed`, delta-rs's non-null fields) exactly this schema. Part of
the Delta model, so that reader, writer and coordinator share it; reading checkpoint files is the reader's
(`deltacoord.reader.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.schemas import arrow_types
from deltacoord.schemas.actions import (
    Action,
    AddFile,
    DeletionVector,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    without_cyclic_gc,
)

_STR_MAP = pa.map_(pa.string(), pa.string())
_STR_LIST = pa.list_(pa.string())

DV_TYPE = pa.struct(
    [
        ("storageType", pa.string()),
        ("pathOrInlineDv", pa.string()),
        ("offset", pa.int32()),
        ("sizeInBytes", pa.int32()),
        ("cardinality", pa.int64()),
        ("maxRowIndex", pa.int64()),
    ]
)
TXN_TYPE = pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])
ADD_TYPE = pa.struct(
    [
        ("path", pa.string()),
        ("partitionValues", _STR_MAP),
        ("size", pa.int64()),
        ("modificationTime", pa.int64()),
        ("dataChange", pa.bool_()),
        ("tags", _STR_MAP),
        ("deletionVector", DV_TYPE),
        ("baseRowId", pa.int64()),
        ("defaultRowCommitVersion", pa.int64()),
        ("stats", pa.string()),
    ]
)
REMOVE_TYPE = pa.struct(
    [
        ("path", pa.string()),
        ("deletionTimestamp", pa.int64()),
        ("dataChange", pa.bool_()),
        ("extendedFileMetadata", pa.bool_()),
        ("partitionValues", _STR_MAP),
        ("size", pa.int64()),
        ("deletionVector", DV_TYPE),
        ("baseRowId", pa.int64()),
        ("defaultRowCommitVersion", pa.int64()),
    ]
)
METADATA_TYPE = pa.struct(
    [
        ("id", pa.string()),
        ("name", pa.string()),
        ("description", pa.string()),
        ("format", pa.struct([("provider", pa.string()), ("options", _STR_MAP)])),
        ("schemaString", pa.string()),
        ("partitionColumns", _STR_LIST),
        ("configuration", _STR_MAP),
        ("createdTime", pa.int64()),
    ]
)
PROTOCOL_TYPE = pa.struct(
    [
        ("minReaderVersion", pa.int32()),
        ("minWriterVersion", pa.int32()),
        ("readerFeatures", _STR_LIST),
        ("writerFeatures", _STR_LIST),
    ]
)
DOMAIN_METADATA_TYPE = pa.struct([("domain", pa.string()), ("configuration", pa.string()), ("removed", pa.bool_())])

#: The classic checkpoint schema, column order as Delta Spark writes it.
CHECKPOINT_SCHEMA = pa.schema(
    [
        ("txn", TXN_TYPE),
        ("add", ADD_TYPE),
        ("remove", REMOVE_TYPE),
        ("metaData", METADATA_TYPE),
        ("protocol", PROTOCOL_TYPE),
        ("domainMetadata", DOMAIN_METADATA_TYPE),
    ]
)
ACTION_COLUMNS: tuple[str, ...] = tuple(CHECKPOINT_SCHEMA.names)
SMALL_ACTION_COLUMNS: tuple[str, ...] = ("txn", "metaData", "protocol", "domainMetadata")

DEFAULT_BATCH_ROWS = 65_536


# --------------------------------------------------------------------------- Spark schema JSON


def checkpoint_schema_json(schema: pa.Schema = CHECKPOINT_SCHEMA) -> dict[str, Any]:
    """Spark StructType JSON of a checkpoint schema (`_last_checkpoint.checkpointSchema`)."""
    return arrow_types.arrow_schema_to_delta(schema, all_nullable=True)


# --------------------------------------------------------------------------- conforming


def conform_array(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Project/cast `arr` to `target`: struct fields by name (missing ones null, extra ones dropped)."""
    if arr.type == target:
        return arr
    if pa.types.is_struct(target) and pa.types.is_struct(arr.type):
        names = {arr.type.field(i).name: i for i in range(arr.type.num_fields)}
        children = []
        for f in target:
            idx = names.get(f.name)
            children.append(pa.nulls(len(arr), f.type) if idx is None else conform_array(arr.field(idx), f.type))
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), target)
    return arr.cast(target)


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A batch with exactly `schema`'s columns (absent ones all-null)."""
    cols = []
    for f in schema:
        idx = batch.schema.get_field_index(f.name)
        cols.append(pa.nulls(batch.num_rows, f.type) if idx < 0 else conform_array(batch.column(idx), f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def conform_chunked(col: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    if col.type == target:
        return col
    return pa.chunked_array([conform_array(c, target) for c in col.chunks], type=target)


def non_null(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The non-null rows of a struct column as one StructArray."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if col.null_count == 0:
        return col
    if col.null_count == len(col):
        return col.slice(0, 0)
    return col.filter(col.is_valid())


# --------------------------------------------------------------------------- keys


def string_array(values: Sequence[str]) -> pa.Array:
    """A StringArray built from raw buffers (no per-value Python->Arrow conversion, no pandas import)."""
    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    if encoded:
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
    data = b"".join(encoded)
    return pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def key_string(path: str, dv_unique_id: str | None) -> str:
    """Logical file key as one string (paths never contain NUL)."""
    return path if dv_unique_id is None else f"{path}\x00{dv_unique_id}"


def dv_unique_ids(dv: pa.Array) -> pa.Array:
    """Delta's DV unique id per row (`<storageType><pathOrInlineDv>[@<offset>]`), null without a DV."""
    st = dv.field("storageType")
    p = dv.field("pathOrInlineDv")
    off = dv.field("offset")
    base = pc.binary_join_element_wise(st, p, "")
    with_off = pc.binary_join_element_wise(base, off.cast(pa.string()), "@")
    uid = pc.if_else(off.is_valid(), with_off, base)
    return pc.if_else(dv.is_valid(), uid, pa.scalar(None, pa.string()))


def file_key_strings(files: pa.Array) -> pa.Array:
    """`key_string` of every row of an add/remove StructArray."""
    path = files.field("path")
    dv = files.field("deletionVector")
    if dv.null_count == len(dv):
        return path
    uid = dv_unique_ids(dv)
    joined = pc.binary_join_element_wise(path, uid, "\x00")
    return pc.if_else(uid.is_valid(), joined, path)


# --------------------------------------------------------------------------- actions -> Arrow, from buffers
#
# `pa.array` on Python lists imports pandas (to ask whether the list is a pandas object): 30 MiB and
# a third of a second in a process that reads a snapshot as Arrow. The live adds of a snapshot's
# commits are built from buffers instead.


def _validity(valid: Sequence[bool]) -> tuple[pa.Buffer | None, int]:
    nulls = len(valid) - sum(valid)
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(np.asarray(valid, dtype=bool), bitorder="little").tobytes()), nulls


def _strings(values: Sequence[str | None]) -> pa.Array:
    validity, nulls = _validity([v is not None for v in values])
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    if encoded:
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(encoded)),
                                       validity, nulls)


def _numbers(values: Sequence[int | None], t: pa.DataType) -> pa.Array:
    validity, nulls = _validity([v is not None for v in values])
    data = np.asarray([0 if v is None else v for v in values], dtype=np.int32 if t == pa.int32() else np.int64)
    return pa.Array.from_buffers(t, len(values), [validity, pa.py_buffer(data.tobytes())], null_count=nulls)


def _bools(values: Sequence[bool]) -> pa.Array:
    bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little").tobytes()
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])


def _mask(nullness: Sequence[bool]) -> pa.Array | None:
    return _bools(nullness) if any(nullness) else None


def _string_maps(maps: Sequence[Mapping[str, str | None] | None]) -> pa.Array:
    offsets = np.zeros(len(maps) + 1, dtype=np.int32)
    if maps:
        np.cumsum([0 if m is None else len(m) for m in maps], out=offsets[1:])
    keys = [k for m in maps if m is not None for k in m]
    items = [v for m in maps if m is not None for v in m.values()]
    return pa.MapArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets.tobytes())]),
                                   _strings(keys), _strings(items), type=_STR_MAP, mask=_mask([m is None for m in maps]))


def _deletion_vectors(dvs: Sequence[DeletionVector | None]) -> pa.Array:
    def col(get: Any) -> list[Any]:
        return [None if d is None else get(d) for d in dvs]

    children = [
        _strings(col(lambda d: d.storage_type)),
        _strings(col(lambda d: d.path_or_inline_dv)),
        _numbers(col(lambda d: d.offset), pa.int32()),
        _numbers(col(lambda d: d.size_in_bytes), pa.int32()),
        _numbers(col(lambda d: d.cardinality), pa.int64()),
        _numbers(col(lambda d: d.max_row_index), pa.int64()),
    ]
    return pa.StructArray.from_arrays(children, fields=list(DV_TYPE), mask=_mask([d is None for d in dvs]))


def adds_to_struct(adds: Sequence[AddFile]) -> pa.Array:
    """AddFiles as one StructArray of `ADD_TYPE` (what `actions_to_record_batch` gives for its `add`
    column with `checkpoint_form=False`), built from buffers."""
    children = [
        _strings([a.path for a in adds]),
        _string_maps([a.partition_values for a in adds]),
        _numbers([a.size for a in adds], pa.int64()),
        _numbers([a.modification_time for a in adds], pa.int64()),
        _bools([a.data_change for a in adds]),
        _string_maps([a.tags for a in adds]),
        _deletion_vectors([a.deletion_vector for a in adds]),
        _numbers([a.base_row_id for a in adds], pa.int64()),
        _numbers([a.default_row_commit_version for a in adds], pa.int64()),
        _strings([a.stats for a in adds]),
    ]
    return pa.StructArray.from_arrays(children, fields=list(ADD_TYPE))


# --------------------------------------------------------------------------- Arrow -> actions


def _map_list(values: list[Any]) -> list[dict[str, Any] | None]:  # map rows arrive as lists of pairs
    return [None if v is None else dict(v) for v in values]


def _shared_string_maps(arr: pa.Array, name: str) -> list[dict[str, str | None]]:
    """The rows of a map<string, string> child as dicts, one dict object per distinct map ({} for null).

    A table has few distinct partition values and many files: sharing the dicts (read-only
    `Mapping`s in the actions) saved a third of the memory of 100k AddFiles. Slicing the
    map's flat key and value lists was faster than Arrow's row-by-row conversion, and than
    finding the distinct rows with Arrow compute.
    """
    idx = arr.type.get_field_index(name)
    empty: dict[str, str | None] = {}
    if idx < 0:
        return [empty] * len(arr)
    col = arr.field(idx)
    if col.null_count == len(col):
        return [empty] * len(col)
    offsets = col.offsets.to_pylist()
    keys = col.keys.to_pylist()
    items = col.items.to_pylist()
    valid = col.is_valid().to_pylist() if col.null_count else None
    seen: dict[tuple[str | None, ...], dict[str, str | None]] = {(): empty}
    width = offsets[1] - offsets[0] if len(col) else 0
    if valid is None and width and offsets == list(range(offsets[0], offsets[0] + width * len(col) + 1, width)):
        # Every file has the same number of partition columns (the usual case): no per-row slicing.
        lo, hi = offsets[0], offsets[-1]
        parts = [keys[lo + j:hi:width] for j in range(width)] + [items[lo + j:hi:width] for j in range(width)]
        shared: list[dict[str, str | None]] = []
        for ident in zip(*parts, strict=True):
            d = seen.get(ident)
            if d is None:
                d = seen[ident] = dict(zip(ident[:width], ident[width:], strict=True))
            shared.append(d)
        return shared
    out: list[dict[str, str | None]] = []
    append = out.append
    for i in range(len(col)):
        if valid is not None and not valid[i]:
            append(empty)
            continue
        lo, hi = offsets[i], offsets[i + 1]
        ident = (*keys[lo:hi], *items[lo:hi])
        d = seen.get(ident)
        if d is None:
            d = seen[ident] = dict(zip(keys[lo:hi], items[lo:hi], strict=True))
        append(d)
    return out


def _dv_list(dv: pa.Array) -> list[DeletionVector | None]:
    if dv.null_count == len(dv):
        return [None] * len(dv)
    out: list[DeletionVector | None] = []
    for d in dv.to_pylist():
        out.append(
            None
            if d is None
            else DeletionVector(
                storage_type=d["storageType"],
                path_or_inline_dv=d["pathOrInlineDv"],
                size_in_bytes=d["sizeInBytes"],
                cardinality=d["cardinality"],
                offset=d.get("offset"),
                max_row_index=d.get("maxRowIndex"),
            )
        )
    return out


def _field_list(arr: pa.Array, name: str) -> list[Any]:
    idx = arr.type.get_field_index(name)
    if idx < 0:
        return [None] * len(arr)
    child = arr.field(idx)
    if child.null_count == len(child):
        return [None] * len(arr)
    if child.null_count == 0 and pa.types.is_int64(child.type):
        # numpy's tolist is several times faster than Arrow's per-value conversion (no pandas import either)
        data = child.buffers()[1]
        ints: list[Any] = np.frombuffer(data, dtype=np.int64, count=len(child), offset=child.offset * 8).tolist()
        return ints
    values: list[Any] = child.to_pylist()
    return values


@without_cyclic_gc()
def adds_from_struct(arr: pa.Array) -> list[AddFile]:
    """AddFiles of a non-null `add` StructArray, built column-wise (fast)."""
    n = len(arr)
    if n == 0:
        return []
    paths = _field_list(arr, "path")
    pvs = _shared_string_maps(arr, "partitionValues")
    sizes = _field_list(arr, "size")
    mtimes = _field_list(arr, "modificationTime")
    dcs = _field_list(arr, "dataChange")
    stats = _field_list(arr, "stats")
    tags = _map_list(_field_list(arr, "tags"))
    dvs = _dv_list(arr.field("deletionVector")) if arr.type.get_field_index("deletionVector") >= 0 else [None] * n
    brid = _field_list(arr, "baseRowId")
    drcv = _field_list(arr, "defaultRowCommitVersion")
    cprov = _field_list(arr, "clusteringProvider")
    # Positional arguments through map(): no per-row indexing or keyword matching (a third faster).
    return list(map(AddFile, paths, pvs, sizes, mtimes, map(bool, dcs), stats, tags, dvs, brid, drcv, cprov))


@without_cyclic_gc()
def removes_from_struct(arr: pa.Array) -> list[RemoveFile]:
    """RemoveFiles of a non-null `remove` StructArray."""
    n = len(arr)
    if n == 0:
        return []
    paths = _field_list(arr, "path")
    dts = _field_list(arr, "deletionTimestamp")
    dcs = _field_list(arr, "dataChange")
    efm = _field_list(arr, "extendedFileMetadata")
    pvs = _shared_string_maps(arr, "partitionValues")
    sizes = _field_list(arr, "size")
    stats = _field_list(arr, "stats")
    tags = _map_list(_field_list(arr, "tags"))
    dvs = _dv_list(arr.field("deletionVector")) if arr.type.get_field_index("deletionVector") >= 0 else [None] * n
    brid = _field_list(arr, "baseRowId")
    drcv = _field_list(arr, "defaultRowCommitVersion")
    return [
        RemoveFile(
            path=paths[i],
            deletion_timestamp=dts[i],
            data_change=bool(dcs[i]),
            extended_file_metadata=efm[i],
            partition_values=pvs[i],
            size=sizes[i],
            stats=stats[i],
            tags=tags[i],
            deletion_vector=dvs[i],
            base_row_id=brid[i],
            default_row_commit_version=drcv[i],
        )
        for i in range(n)
    ]


def _metadata_from_row(d: dict[str, Any]) -> Metadata:
    fmt = d.get("format") or {}
    return Metadata(
        id=d["id"],
        name=d.get("name"),
        description=d.get("description"),
        format_provider=fmt.get("provider") or "parquet",
        format_options=dict(fmt.get("options") or []),
        schema_string=d["schemaString"],
        partition_columns=tuple(d.get("partitionColumns") or ()),
        configuration=dict(d.get("configuration") or []),
        created_time=d.get("createdTime"),
    )


def small_actions_from_table(t: pa.Table | pa.RecordBatch) -> list[Action]:
    """protocol, metaData, txn and domainMetadata actions of a checkpoint table (few rows)."""
    out: list[Action] = []
    names = t.schema.names
    if "protocol" in names:
        out.extend(Protocol.from_json(d) for d in non_null(t.column("protocol")).to_pylist())
    if "metaData" in names:
        out.extend(_metadata_from_row(d) for d in non_null(t.column("metaData")).to_pylist())
    if "txn" in names:
        out.extend(
            SetTransaction(app_id=d["appId"], version=d["version"], last_updated=d.get("lastUpdated"))
            for d in non_null(t.column("txn")).to_pylist()
        )
    if "domainMetadata" in names:
        out.extend(
            DomainMetadata(domain=d["domain"], configuration=d.get("configuration") or "", removed=bool(d.get("removed")))
            for d in non_null(t.column("domainMetadata")).to_pylist()
        )
    return out


def actions_from_batch(batch: pa.RecordBatch | pa.Table) -> Iterator[Action]:
    """Every action of a checkpoint batch (column by column, not in row order)."""
    yield from small_actions_from_table(batch)
    names = batch.schema.names
    if "add" in names:
        yield from adds_from_struct(non_null(batch.column("add")))
    if "remove" in names:
        yield from removes_from_struct(non_null(batch.column("remove")))


# --------------------------------------------------------------------------- actions -> Arrow


def _dv_dict(dv: DeletionVector | None) -> dict[str, Any] | None:
    return None if dv is None else dv.fields()


def _row(action: Action, checkpoint_form: bool) -> tuple[str, dict[str, Any]] | None:
    if isinstance(action, AddFile):
        return "add", {
            "path": action.path,
            "partitionValues": dict(action.partition_values),
            "size": action.size,
            "modificationTime": action.modification_time,
            "dataChange": False if checkpoint_form else action.data_change,
            "tags": None if action.tags is None else dict(action.tags),
            "deletionVector": _dv_dict(action.deletion_vector),
            "baseRowId": action.base_row_id,
            "defaultRowCommitVersion": action.default_row_commit_version,
            "stats": action.stats,
        }
    if isinstance(action, RemoveFile):
        return "remove", {
            "path": action.path,
            "deletionTimestamp": action.deletion_timestamp,
            "dataChange": False if checkpoint_form else action.data_change,
            "extendedFileMetadata": action.extended_file_metadata,
            "partitionValues": None if action.partition_values is None else dict(action.partition_values),
            "size": action.size,
            "deletionVector": _dv_dict(action.deletion_vector),
            "baseRowId": action.base_row_id,
            "defaultRowCommitVersion": action.default_row_commit_version,
        }
    if isinstance(action, Metadata):
        return "metaData", {
            "id": action.id,
            "name": action.name,
            "description": action.description,
            "format": {"provider": action.format_provider, "options": dict(action.format_options)},
            "schemaString": action.schema_string,
            "partitionColumns": list(action.partition_columns),
            "configuration": dict(action.configuration),
            "createdTime": action.created_time,
        }
    if isinstance(action, Protocol):
        rf, wf = action.reader_features, action.writer_features
        if checkpoint_form:
            # table-features protocols must carry non-null feature lists in checkpoints
            if action.min_reader_version >= 3 and rf is None:
                rf = ()
            if action.min_writer_version >= 7 and wf is None:
                wf = ()
        return "protocol", {
            "minReaderVersion": action.min_reader_version,
            "minWriterVersion": action.min_writer_version,
            "readerFeatures": None if rf is None else list(rf),
            "writerFeatures": None if wf is None else list(wf),
        }
    if isinstance(action, SetTransaction):
        return "txn", {"appId": action.app_id, "version": action.version, "lastUpdated": action.last_updated}
    if isinstance(action, DomainMetadata):
        return "domainMetadata", {"domain": action.domain, "configuration": action.configuration, "removed": action.removed}
    return None  # commitInfo and cdc never go into a checkpoint


def actions_to_record_batch(
    actions: Sequence[Action], *, columns: Sequence[str] = ACTION_COLUMNS, checkpoint_form: bool = True
) -> pa.RecordBatch:
    """One checkpoint row per action (commitInfo/cdc dropped).

    `checkpoint_form` writes dataChange=false for adds/removes and non-null
    feature lists for table-features protocols, as checkpoints require.
    """
    per_col: dict[str, list[dict[str, Any] | None]] = {c: [] for c in columns}
    n = 0
    for a in actions:
        r = _row(a, checkpoint_form)
        if r is None:
            continue
        name, value = r
        if name not in per_col:
            continue
        for c, lst in per_col.items():
            lst.append(value if c == name else None)
        n += 1
    schema = pa.schema([CHECKPOINT_SCHEMA.field(c) for c in columns])
    if n == 0:
        return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)
    arrays = [pa.array(per_col[f.name], type=f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
