"""Column mapping on write (PROTOCOL.md "Column Mapping", modes `name` and `id`).

A table with column mapping names its columns twice: the logical name people use and a physical name
(`delta.columnMapping.physicalName`) with an id (`delta.columnMapping.id`) in each schema field, at every
nesting level. Writers store data under the physical names, give each Parquet field its id (`field_id`;
readers in id mode resolve columns by it, and Delta writes it in both modes), and key statistics and
partition values by physical names. Renaming a column then changes only the schema, never a file.

`Layout` is what the writer needs of a table to write a file: the logical Arrow schema, and how each
column is stored. Creating a table with a mapping mode assigns ids and physical names
(`assign_ids`) and records the highest id as `delta.columnMapping.maxColumnId`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from deltacoord.schemas.actions import Metadata, Protocol
from deltacoord.schemas.properties import PHYSICAL_NAME_KEY, TableProperties
from deltacoord.writer import protocols

ID_KEY = "delta.columnMapping.id"
MAX_ID_PROPERTY = "delta.columnMapping.maxColumnId"
MODES = ("none", "name", "id")
_FIELD_ID = b"PARQUET:field_id"
_FEATURE = "columnMapping"


def check_mode(mode: str) -> str:
    m = mode.lower()
    if m not in MODES:
        raise ValueError(f"delta.columnMapping.mode={mode!r}: give one of {', '.join(MODES)}")
    return m


def _nested_fields(t: Any) -> Sequence[dict[str, Any]]:
    """The struct fields directly inside a Delta type (through arrays and maps)."""
    if not isinstance(t, dict):
        return []
    if t.get("type") == "struct":
        return list(t.get("fields", []))
    if t.get("type") == "array":
        return _nested_fields(t.get("elementType"))
    if t.get("type") == "map":
        return [*_nested_fields(t.get("keyType")), *_nested_fields(t.get("valueType"))]
    return []


def max_id(schema: Mapping[str, Any]) -> int:
    """The highest `delta.columnMapping.id` in a Delta schema (0 when none)."""
    best = 0
    for f in schema.get("fields", []):
        v = (f.get("metadata") or {}).get(ID_KEY)
        if isinstance(v, int):
            best = max(best, v)
        best = max(best, max_id({"fields": _nested_fields(f.get("type"))}))
    return best


def assign_ids(fields: Sequence[dict[str, Any]], next_id: int, *, physical_names: bool = True) -> int:
    """Give every field without one (nested fields too) an id and a physical name, in place, from `next_id` on;
    returns the next free id. Physical names are `col-<uuid>`, as Delta assigns them to new columns, or (with
    `physical_names=False`, when mapping is turned on for a table with files) the field's own name."""
    for f in fields:
        meta = f.setdefault("metadata", {})
        if ID_KEY not in meta:
            meta[ID_KEY] = next_id
            next_id += 1
        if PHYSICAL_NAME_KEY not in meta:
            meta[PHYSICAL_NAME_KEY] = f"col-{uuid.uuid4()}" if physical_names else f["name"]
        next_id = assign_ids(_nested_fields(f.get("type")), next_id, physical_names=physical_names)
    return next_id


def with_feature(p: Protocol) -> Protocol:
    """`p` able to hold a column-mapping table: reader 2 / writer 5 at least, or the feature listed at (3, 7)."""
    return protocols.with_feature(p, _FEATURE)


def _physical_type(t: pa.DataType, delta: Any, field_ids: bool) -> pa.DataType:
    if pa.types.is_struct(t) and isinstance(delta, dict) and delta.get("type") == "struct":
        by_name = {f["name"]: f for f in delta.get("fields", [])}
        return pa.struct([_physical_field(t.field(i), by_name.get(t.field(i).name), field_ids) for i in range(t.num_fields)])
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and isinstance(delta, dict) and delta.get("type") == "array":
        v = t.value_field
        inner = v.with_type(_physical_type(v.type, delta.get("elementType"), field_ids))
        return pa.list_(inner) if pa.types.is_list(t) else pa.large_list(inner)
    if pa.types.is_map(t) and isinstance(delta, dict) and delta.get("type") == "map":
        return pa.map_(t.key_field.with_type(_physical_type(t.key_type, delta.get("keyType"), field_ids)),
                       t.item_field.with_type(_physical_type(t.item_type, delta.get("valueType"), field_ids)))
    return t


def _physical_field(f: pa.Field, delta: Mapping[str, Any] | None, field_ids: bool) -> pa.Field:
    if delta is None:
        return f
    meta = delta.get("metadata") or {}
    name = meta.get(PHYSICAL_NAME_KEY, f.name)
    ident = meta.get(ID_KEY)
    extra = {_FIELD_ID: str(ident).encode()} if field_ids and isinstance(ident, int) else None
    return pa.field(name, _physical_type(f.type, delta.get("type"), field_ids), f.nullable, metadata=extra)


@dataclass(frozen=True)
class Layout:
    """How a table's rows are stored: its logical Arrow schema, partition columns and column mapping."""

    schema: pa.Schema
    partition_columns: tuple[str, ...]
    mode: str
    fields: Mapping[str, Mapping[str, Any]]  # logical top-level name -> Delta field JSON

    @staticmethod
    def of(metadata: Metadata, arrow_schema: pa.Schema) -> Layout:
        schema_json = metadata.schema()
        return Layout(arrow_schema, tuple(metadata.partition_columns), TableProperties.of(metadata).column_mapping_mode,
                      {f["name"]: f for f in schema_json.get("fields", [])})

    @property
    def mapped(self) -> bool:
        return self.mode in ("name", "id")

    def physical_name(self, column: str) -> str:
        """The name a top-level column is stored under (in files, stats and partition values)."""
        if not self.mapped:
            return column
        f = self.fields.get(column)
        name = (f.get("metadata") or {}).get(PHYSICAL_NAME_KEY) if f is not None else None
        return name if isinstance(name, str) else column

    def to_physical(self, data: pa.Table) -> pa.Table:
        """`data` (logical names) as it is stored: physical names at every level, with Parquet field ids."""
        if not self.mapped:
            return data
        fields = [_physical_field(f, self.fields.get(f.name), field_ids=True) for f in data.schema]
        cols = [pa.chunked_array([chunk.view(f.type) for chunk in c.chunks], type=f.type)
                for c, f in zip(data.columns, fields, strict=True)]
        return pa.Table.from_arrays(cols, schema=pa.schema(fields))


__all__ = ["ID_KEY", "MAX_ID_PROPERTY", "MODES", "Layout", "assign_ids", "check_mode", "max_id", "with_feature"]
