"""Column mapping at every nesting level (name and id modes), the variant type, and metaData actions whose
schemaString is null, not a string or not JSON: on hand-written logs and Parquet files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltacoord.reader.log import CorruptLogError, checkpoint_file_name, commit_file_name
from deltacoord.reader.snapshot import VARIANT_ARROW_TYPE, Snapshot, UnsupportedTableFeatureError, delta_type_to_arrow
from deltacoord.schemas.action_arrow import actions_to_record_batch
from deltacoord.schemas.actions import AddFile, Metadata, Protocol, commit_to_json_lines


def _field(name: str, t: Any, *, fid: int | None = None, phys: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if fid is not None:
        meta["delta.columnMapping.id"] = fid
    if phys is not None:
        meta["delta.columnMapping.physicalName"] = phys
    return {"name": name, "type": t, "nullable": True, "metadata": meta}


def _struct(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "struct", "fields": list(fields)}


#: id BIGINT, arr ARRAY<STRUCT<x INT>>, m MAP<STRING, STRUCT<p INT>>, aa ARRAY<ARRAY<STRUCT<z INT>>>,
#: mk MAP<STRUCT<k INT>, STRING>: every struct field has an id and a physical name.
SCHEMA = _struct(
    _field("id", "long", fid=1, phys="c-id"),
    _field("arr", {"type": "array", "elementType": _struct(_field("x", "integer", fid=3, phys="c-x")), "containsNull": True},
           fid=2, phys="c-arr"),
    _field("m", {"type": "map", "keyType": "string", "valueType": _struct(_field("p", "integer", fid=5, phys="c-p")),
                 "valueContainsNull": True}, fid=4, phys="c-m"),
    _field("aa", {"type": "array", "elementType": {"type": "array", "elementType": _struct(_field("z", "integer", fid=7, phys="c-z")),
                                                   "containsNull": True}, "containsNull": True}, fid=6, phys="c-aa"),
    _field("mk", {"type": "map", "keyType": _struct(_field("k", "integer", fid=9, phys="c-k")), "valueType": "string",
                  "valueContainsNull": True}, fid=8, phys="c-mk"),
)
EXPECTED = [
    {"id": 1, "arr": [{"x": 10}, None, {"x": None}], "m": [("a", {"p": 5}), ("b", None)], "aa": [[{"z": 1}], None, []],
     "mk": [({"k": 7}, "seven")]},
    {"id": 2, "arr": None, "m": None, "aa": None, "mk": None},
]


def _file_field(name: str, t: pa.DataType, fid: int | None) -> pa.Field:
    return pa.field(name, t, metadata=None if fid is None else {b"PARQUET:field_id": str(fid).encode()})


def _file_schema(names: dict[str, str], ids: bool) -> pa.Schema:
    """The Parquet schema of SCHEMA's data under the given column names, with field ids or without."""
    def f(key: str, t: pa.DataType, fid: int) -> pa.Field:
        return _file_field(names[key], t, fid if ids else None)

    return pa.schema([
        f("id", pa.int64(), 1),
        f("arr", pa.list_(pa.struct([f("x", pa.int32(), 3)])), 2),
        f("m", pa.map_(pa.string(), pa.struct([f("p", pa.int32(), 5)])), 4),
        f("aa", pa.list_(pa.list_(pa.struct([f("z", pa.int32(), 7)]))), 6),
        f("mk", pa.map_(pa.struct([f("k", pa.int32(), 9)]), pa.string()), 8),
    ])


def _file_rows(n: dict[str, str]) -> list[dict[str, Any]]:
    """EXPECTED's rows under the file's names (top-level keys stay logical; `_write_table` renames them)."""
    return [
        {"id": 1, "arr": [{n["x"]: 10}, None, {n["x"]: None}], "m": [("a", {n["p"]: 5}), ("b", None)],
         "aa": [[{n["z"]: 1}], None, []], "mk": [({n["k"]: 7}, "seven")]},
        {"id": 2, "arr": None, "m": None, "aa": None, "mk": None},
    ]


def _write_table(root: Path, mode: str, file_schema: pa.Schema, rows: list[dict[str, Any]], schema: dict[str, Any] = SCHEMA,
                 protocol: Protocol | None = None) -> None:
    """A one-commit table of one data file whose columns carry the given (file-side) names."""
    root.mkdir(parents=True)
    renamed = [{file_schema.field(i).name: r[k] for i, k in enumerate(r)} for r in rows]
    pq.write_table(pa.Table.from_pylist(renamed, schema=file_schema), root / "part-0.parquet")
    md = Metadata(id="t", schema_string=json.dumps(schema),
                  configuration={"delta.columnMapping.mode": mode} if mode != "none" else {})
    proto = protocol or Protocol(2, 5)
    add = AddFile("part-0.parquet", {}, (root / "part-0.parquet").stat().st_size, 1, True)
    (root / "_delta_log").mkdir()
    (root / "_delta_log" / commit_file_name(0)).write_bytes(commit_to_json_lines([proto, md, add]))


PHYSICAL = {k: f"c-{k}" for k in ("id", "arr", "x", "m", "p", "aa", "z", "mk", "k")}


def test_name_mode_maps_physical_names_inside_arrays_and_maps(tmp_path: Path) -> None:
    _write_table(tmp_path / "t", "name", _file_schema(PHYSICAL, ids=False), _file_rows(PHYSICAL))
    assert Snapshot.load(tmp_path / "t").to_pyarrow().to_pylist() == EXPECTED


def test_id_mode_matches_columns_by_parquet_field_id_at_every_level(tmp_path: Path) -> None:
    # Names in the file differ from the physical names (as after a rewrite by another engine): only ids match.
    other = {k: f"other-{k}" for k in PHYSICAL}
    _write_table(tmp_path / "t", "id", _file_schema(other, ids=True), _file_rows(other))
    assert Snapshot.load(tmp_path / "t").to_pyarrow().to_pylist() == EXPECTED
    # The same names under name mode find nothing: the ids are what matched.
    _write_table(tmp_path / "n", "name", _file_schema(other, ids=True), _file_rows(other))
    assert Snapshot.load(tmp_path / "n").to_pyarrow().column("arr").to_pylist() == [None, None]


def test_id_mode_falls_back_to_physical_names_without_field_ids(tmp_path: Path) -> None:
    _write_table(tmp_path / "t", "id", _file_schema(PHYSICAL, ids=False), _file_rows(PHYSICAL))
    assert Snapshot.load(tmp_path / "t").to_pyarrow().to_pylist() == EXPECTED


def test_id_mode_prefers_the_field_id_over_a_name_that_also_matches(tmp_path: Path) -> None:
    # Column "c-id" (by name) holds another id than the field whose id is 1.
    schema = pa.schema([_file_field("c-id", pa.int64(), 99), _file_field("renamed", pa.int64(), 1)])
    table_schema = _struct(_field("id", "long", fid=1, phys="c-id"))
    _write_table(tmp_path / "t", "id", schema, [{"a": 5, "b": 6}], table_schema)
    assert Snapshot.load(tmp_path / "t").to_pyarrow().to_pylist() == [{"id": 6}]


def test_variant_reads_as_metadata_and_value_binaries(tmp_path: Path) -> None:
    assert delta_type_to_arrow("variant") == VARIANT_ARROW_TYPE
    parquet_variant = pa.struct([pa.field("value", pa.binary(), nullable=False), pa.field("metadata", pa.binary(), nullable=False)])
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("v", parquet_variant)])
    proto = Protocol(3, 7, ("variantType",), ("variantType",))
    table_schema = _struct(_field("id", "long"), _field("v", "variant"))
    _write_table(tmp_path / "t", "none", schema, [{"id": 1, "v": {"value": b"\x0c\x01", "metadata": b"\x01\x00\x00"}},
                                                  {"id": 2, "v": None}], table_schema, proto)
    got = Snapshot.load(tmp_path / "t").to_pyarrow()
    assert got.schema.field("v").type == VARIANT_ARROW_TYPE
    assert got.to_pylist() == [{"id": 1, "v": {"metadata": b"\x01\x00\x00", "value": b"\x0c\x01"}}, {"id": 2, "v": None}]


def test_a_shredded_variant_is_refused_naming_the_column(tmp_path: Path) -> None:
    shredded = pa.struct([pa.field("metadata", pa.binary()), pa.field("value", pa.binary()), pa.field("typed_value", pa.int64())])
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("v", shredded)])
    proto = Protocol(3, 7, ("variantType",), ("variantType",))
    _write_table(tmp_path / "t", "none", schema, [{"id": 1, "v": {"metadata": b"\x01\x00\x00", "value": None, "typed_value": 3}}],
                 _struct(_field("id", "long"), _field("v", "variant")), proto)
    with pytest.raises(UnsupportedTableFeatureError, match=r"column 'v' is a variant .*typed_value.*without variant shredding"):
        Snapshot.load(tmp_path / "t").to_pyarrow()


def test_variant_shredding_feature_is_refused(tmp_path: Path) -> None:
    proto = Protocol(3, 7, ("variantType", "variantShredding-preview"), ("variantType", "variantShredding-preview"))
    _write_table(tmp_path / "t", "none", pa.schema([pa.field("id", pa.int64())]), [{"id": 1}], _struct(_field("id", "long")), proto)
    with pytest.raises(UnsupportedTableFeatureError, match="variantShredding-preview"):
        Snapshot.load(tmp_path / "t").to_pyarrow()


def _metadata_line(schema_string: Any, *, drop: bool = False) -> bytes:
    body: dict[str, Any] = {"id": "t", "format": {"provider": "parquet", "options": {}}, "schemaString": schema_string,
                            "partitionColumns": [], "configuration": {}}
    if drop:
        del body["schemaString"]
    return json.dumps({"metaData": body}).encode() + b"\n"


@pytest.mark.parametrize(("schema_string", "drop", "message"), [
    (None, False, r"schemaString is NoneType None, not a JSON string"),
    (42, False, r"schemaString is int 42, not a JSON string"),
    ({"type": "struct", "fields": []}, False, r"schemaString is dict"),
    ('{"type": "struct", "fields": [', False, r"schemaString is not valid JSON"),
    ('["not", "a", "struct"]', False, r"schemaString is not a Delta struct type"),
    (None, True, r"missing or bad field 'schemaString'"),
])
def test_a_bad_schema_string_is_a_corrupt_log_naming_the_commit(tmp_path: Path, schema_string: Any, drop: bool, message: str) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    (log / commit_file_name(0)).write_bytes(commit_to_json_lines([Protocol(1, 2)]) + _metadata_line(schema_string, drop=drop))
    with pytest.raises(CorruptLogError, match=message) as err:
        Snapshot.load(tmp_path / "t")
    assert commit_file_name(0) in str(err.value) and "line 2" in str(err.value)


def test_a_null_schema_string_in_a_checkpoint_is_a_corrupt_log_naming_the_checkpoint(tmp_path: Path) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    bad = Metadata(id="t", schema_string=None)  # type: ignore[arg-type]  # what a corrupt checkpoint row holds
    batch = actions_to_record_batch([Protocol(1, 2), bad])
    pq.write_table(pa.Table.from_batches([batch]), log / checkpoint_file_name(3))
    with pytest.raises(CorruptLogError, match=rf"{checkpoint_file_name(3)}.*version 3.*schemaString is NoneType"):
        Snapshot.load(tmp_path / "t")
    # With the commits still there, the reader falls back from the bad checkpoint to them.
    good = Metadata(id="t", schema_string=json.dumps(_struct(_field("id", "long"))))
    (log / commit_file_name(0)).write_bytes(commit_to_json_lines([Protocol(1, 2), good]))
    for v in (1, 2, 3):
        (log / commit_file_name(v)).write_bytes(b'{"commitInfo":{"timestamp":1}}\n')
    assert Snapshot.load(tmp_path / "t").schema().names == ["id"]
