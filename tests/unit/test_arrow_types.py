"""The one Delta/Arrow type mapping: each direction inverts the other, and what has no counterpart says so."""

from __future__ import annotations

import pyarrow as pa
import pytest

from deltacoord.schemas.arrow_types import (
    PRIMITIVES,
    DeltaTypeError,
    arrow_schema_to_delta,
    arrow_to_delta,
    delta_schema_to_arrow,
    delta_to_arrow,
    written_type,
)

NESTED = {"type": "struct", "fields": [
    {"name": "a", "type": {"type": "array", "elementType": "decimal(12,3)", "containsNull": True}, "nullable": False,
     "metadata": {}},
    {"name": "m", "type": {"type": "map", "keyType": "string", "valueType": "timestamp_ntz", "valueContainsNull": True},
     "nullable": True, "metadata": {"comment": "kept"}},
]}


@pytest.mark.parametrize("name", [*sorted(set(PRIMITIVES) - {"variant", "void"}), "decimal(38,0)"])
def test_every_primitive_maps_there_and_back(name: str) -> None:
    assert arrow_to_delta(delta_to_arrow(name)) == name


def test_a_nested_schema_maps_there_and_back_with_nullability_and_delta_metadata() -> None:
    schema = delta_schema_to_arrow(NESTED)
    assert schema.field("a").nullable is False
    schema = schema.set(1, schema.field("m").with_metadata({"comment": "kept", "spark.other": "dropped"}))
    assert arrow_schema_to_delta(schema) == NESTED


def test_a_checkpoint_schema_is_all_nullable_without_metadata() -> None:
    out = arrow_schema_to_delta(pa.schema([pa.field("s", pa.struct([pa.field("x", pa.int64(), nullable=False)]),
                                                    nullable=False, metadata={"comment": "c"})]), all_nullable=True)
    assert out == {"type": "struct", "fields": [{"name": "s", "nullable": True, "metadata": {}, "type": {
        "type": "struct", "fields": [{"name": "x", "type": "long", "nullable": True, "metadata": {}}]}}]}


def test_other_arrow_units_and_large_variants_take_the_delta_type() -> None:
    assert arrow_to_delta(pa.timestamp("ns", tz="Europe/Paris")) == "timestamp"
    assert arrow_to_delta(pa.timestamp("ms")) == "timestamp_ntz"
    assert arrow_to_delta(pa.large_string()) == "string" and arrow_to_delta(pa.large_binary()) == "binary"


def test_data_is_written_as_its_delta_types_one_arrow_type() -> None:
    assert written_type(pa.timestamp("ns", tz="Europe/Paris")) == pa.timestamp("us", tz="UTC")
    assert written_type(pa.timestamp("ms")) == pa.timestamp("us")
    assert written_type(pa.large_string()) == pa.string() and written_type(pa.large_binary()) == pa.binary()
    nested = pa.list_(pa.large_string())
    assert written_type(nested) == nested and written_type(pa.int16()) == pa.int16(), "other types stay as they are"


@pytest.mark.parametrize("bad", ["interval", "decimal(x,1)", {"type": "udt"}, 7])
def test_a_delta_type_without_an_arrow_form_is_named(bad: object) -> None:
    with pytest.raises(DeltaTypeError, match="unsupported Delta type"):
        delta_to_arrow(bad)


def test_an_arrow_type_without_a_delta_form_is_named() -> None:
    with pytest.raises(DeltaTypeError, match="has no Delta equivalent"):
        arrow_to_delta(pa.duration("s"))
