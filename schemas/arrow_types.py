"""The one mapping between Delta's schema types (PROTOCOL.md "Schema Serialization Format") and Arrow's.

Reader (table schema to Arrow), writer (Arrow data to a Delta schema), the checkpoint writer (its own
schema as Spark JSON) and the row-level rules (statistics of primitive columns) all use it, so a type
added here reaches every one of them. The variant type has no Arrow type of its own: it is read as
delta-rs and Spark return it, a struct of its two binary parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

VARIANT_ARROW_TYPE = pa.struct([pa.field("metadata", pa.binary(), nullable=False),
                                pa.field("value", pa.binary(), nullable=False)])

#: Delta's primitive type names with one Arrow type each (decimal(p,s) is parsed).
PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
    "variant": VARIANT_ARROW_TYPE,
}

#: The Delta name of each primitive Arrow type this project writes (variant and void are never written as such).
_PRIMITIVE_NAMES = {arrow: name for name, arrow in PRIMITIVES.items() if name not in ("variant", "void")}

#: Arrow field metadata kept in a Delta schema: Delta's own column metadata (a generation expression, an
#: invariant, ...) and a column comment.
_KEPT_METADATA = ("delta.", "comment")


class DeltaTypeError(ValueError):
    """A Delta type with no Arrow form, or an Arrow type with no Delta form."""


def delta_to_arrow(t: Any) -> pa.DataType:
    """The Arrow type of a Delta schema type (a primitive name or a complex type's JSON object)."""
    if isinstance(t, str):
        if t in PRIMITIVES:
            return PRIMITIVES[t]
        if t.startswith("decimal(") and t.endswith(")"):
            try:
                p, s = (int(x) for x in t[len("decimal("):-1].split(","))
            except ValueError:
                raise DeltaTypeError(f"unsupported Delta type {t!r}") from None
            return pa.decimal128(p, s)
        raise DeltaTypeError(f"unsupported Delta type {t!r}")
    kind = t.get("type") if isinstance(t, Mapping) else None
    if kind == "struct":
        return pa.struct([delta_field_to_arrow(f) for f in t["fields"]])
    if kind == "array":
        return pa.list_(pa.field("element", delta_to_arrow(t["elementType"]), nullable=t.get("containsNull", True)))
    if kind == "map":
        return pa.map_(delta_to_arrow(t["keyType"]),
                       pa.field("value", delta_to_arrow(t["valueType"]), nullable=t.get("valueContainsNull", True)))
    raise DeltaTypeError(f"unsupported Delta type {t!r}")


def delta_field_to_arrow(f: Mapping[str, Any]) -> pa.Field:
    return pa.field(f["name"], delta_to_arrow(f["type"]), nullable=f.get("nullable", True))


def delta_schema_to_arrow(schema: Mapping[str, Any]) -> pa.Schema:
    """The Arrow schema of a Delta struct type (logical column names)."""
    return pa.schema([delta_field_to_arrow(f) for f in schema["fields"]])


def arrow_to_delta(t: pa.DataType, *, all_nullable: bool = False) -> Any:
    """The Delta (Spark JSON) type of an Arrow type. `all_nullable` marks every nested field nullable with no
    metadata (a checkpoint's own schema); otherwise nested fields keep their nullability and Delta metadata."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if t in _PRIMITIVE_NAMES:
        return _PRIMITIVE_NAMES[t]
    if pa.types.is_struct(t):
        return {"type": "struct",
                "fields": [arrow_field_to_delta(t.field(i), all_nullable=all_nullable) for i in range(t.num_fields)]}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "elementType": arrow_to_delta(t.value_type, all_nullable=all_nullable),
                "containsNull": True}
    if pa.types.is_map(t):
        return {"type": "map", "keyType": arrow_to_delta(t.key_type, all_nullable=all_nullable),
                "valueType": arrow_to_delta(t.item_type, all_nullable=all_nullable), "valueContainsNull": True}
    raise DeltaTypeError(f"Arrow type {t} has no Delta equivalent")


def written_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type data of Arrow type `t` is written as: strings, binaries and timestamps take their Delta
    type's one Arrow type (large variants, other units and time zones unified); other types stay as they are."""
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_timestamp(t):
        return delta_to_arrow(arrow_to_delta(t))
    return t


def arrow_field_to_delta(f: pa.Field, *, all_nullable: bool = False) -> dict[str, Any]:
    """One field of a Delta struct type."""
    meta: dict[str, Any] = {}
    if not all_nullable:
        for k, v in (f.metadata or {}).items():
            key = k.decode() if isinstance(k, bytes) else str(k)
            if key.startswith(_KEPT_METADATA):
                meta[key] = v.decode() if isinstance(v, bytes) else str(v)
    return {"name": f.name, "type": arrow_to_delta(f.type, all_nullable=all_nullable),
            "nullable": True if all_nullable else f.nullable, "metadata": meta}


def arrow_schema_to_delta(schema: pa.Schema, *, all_nullable: bool = False) -> dict[str, Any]:
    """The Delta struct type of an Arrow schema."""
    return {"type": "struct", "fields": [arrow_field_to_delta(f, all_nullable=all_nullable) for f in schema]}
