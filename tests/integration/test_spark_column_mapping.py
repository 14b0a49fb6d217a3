"""Tables written by Delta on Spark with column mapping (name and id modes, structs nested in arrays,
maps and arrays of arrays, renamed nested fields) and with the variant type: every version read by our
reader equals what Delta on Spark reads (and delta-rs, for the variant table)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from deltacoord.reader.snapshot import Snapshot

pytestmark = [pytest.mark.spark]

DDL = ("id BIGINT, s STRUCT<a: INT, b: STRING>, arr ARRAY<STRUCT<x: INT, y: STRING>>, "
       "m MAP<STRING, STRUCT<p: INT, q: ARRAY<STRUCT<r: STRING>>>>, mk MAP<STRUCT<k1: INT>, STRING>, "
       "aa ARRAY<ARRAY<STRUCT<z: INT>>>, part STRING")
ROWS_1 = """(1, named_struct('a', 1, 'b', 'one'),
              array(named_struct('x', 10, 'y', 'ten'), NULL, named_struct('x', NULL, 'y', 'n')),
              map('k', named_struct('p', 5, 'q', array(named_struct('r', 'rr'), NULL)), 'n', NULL),
              map(named_struct('k1', 7), 'seven'), array(array(named_struct('z', 1)), NULL, array()), 'p1'),
             (2, NULL, NULL, NULL, NULL, NULL, 'p2')"""
ROWS_2 = """(3, named_struct('a', 3, 'b', 't'), array(named_struct('x', 4, 'y', 'four')),
              map('j', named_struct('p', 6, 'q', array())), map(), array(array(named_struct('z', 2), NULL)), 'p1', 'e')"""
MODES = ("name", "id")


@pytest.fixture(scope="module")
def tables(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One table per column mapping mode, each renamed at top level and inside an array's structs, then
    grown by a column; and one variant table. Built once: Spark's DDL is slow."""
    base = tmp_path_factory.mktemp("spark-cm")
    out: dict[str, Path] = {}
    for mode in MODES:
        t = base / mode
        q = f"delta.`{t}`"
        spark.sql(f"CREATE TABLE {q} ({DDL}) USING delta PARTITIONED BY (part) "
                  f"TBLPROPERTIES ('delta.columnMapping.mode' = '{mode}')")
        spark.sql(f"INSERT INTO {q} VALUES {ROWS_1}")
        spark.sql(f"ALTER TABLE {q} RENAME COLUMN s TO s2")
        spark.sql(f"ALTER TABLE {q} RENAME COLUMN arr.element.x TO x2")
        spark.sql(f"ALTER TABLE {q} ADD COLUMNS (extra STRING)")
        spark.sql(f"INSERT INTO {q} VALUES {ROWS_2}")
        out[mode] = t
    v = base / "variant"
    spark.sql(f"CREATE TABLE delta.`{v}` (id BIGINT, v VARIANT) USING delta")
    spark.sql(f"""INSERT INTO delta.`{v}` SELECT 1, parse_json('{{"a": 1, "b": [1, "two", null]}}')
                  UNION ALL SELECT 2, NULL UNION ALL SELECT 3, parse_json('"just a string"')""")
    out["variant"] = v
    return out


def _sorted_rows(t: pa.Table) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = t.sort_by([("id", "ascending")]).to_pylist()
    return rows


@pytest.mark.parametrize("mode", MODES)
def test_nested_column_mapping_reads_what_delta_spark_reads(spark: SparkSession, tables: dict[str, Path], mode: str) -> None:
    t = tables[mode]
    latest = Snapshot.load(t).version
    assert latest == 5
    assert Snapshot.load(t).metadata.configuration["delta.columnMapping.mode"] == mode
    for v in range(1, latest + 1):
        snap = Snapshot.load(t, version=v)
        ours = _sorted_rows(snap.to_pyarrow())
        theirs = _sorted_rows(spark.read.format("delta").option("versionAsOf", v).load(str(t)).toArrow())
        assert ours == theirs, f"version {v} of the {mode}-mode table differs between Delta on Spark and deltacoord"
    final = _sorted_rows(Snapshot.load(t).to_pyarrow())
    # The values come back (not all-NULL fields), under the renamed logical names.
    assert final[0]["arr"] == [{"x2": 10, "y": "ten"}, None, {"x2": None, "y": "n"}]
    assert final[0]["m"] == [("k", {"p": 5, "q": [{"r": "rr"}, None]}), ("n", None)]
    assert final[0]["mk"] == [({"k1": 7}, "seven")]
    assert final[0]["aa"] == [[{"z": 1}], None, []]
    assert final[0]["s2"] == {"a": 1, "b": "one"} and final[0]["extra"] is None
    assert final[2]["aa"] == [[{"z": 2}, None]] and final[2]["extra"] == "e"
    # A column selection and a filter over a nested-mapped table.
    picked = Snapshot.load(t).to_pyarrow(columns=["id", "arr"], filter="part = 'p1' AND id > 1")
    assert picked.to_pylist() == [{"id": 3, "arr": [{"x2": 4, "y": "four"}]}]


def test_variant_reads_as_its_binary_encoding_like_delta_rs_and_spark(spark: SparkSession, tables: dict[str, Path]) -> None:
    t = tables["variant"]
    snap = Snapshot.load(t)
    assert "variantType" in (snap.protocol.reader_features or ())
    ours = _sorted_rows(snap.to_pyarrow())
    assert [r["id"] for r in ours] == [1, 2, 3] and ours[1]["v"] is None
    spark_rows = sorted(spark.read.format("delta").load(str(t)).collect(), key=lambda r: r["id"])
    theirs = [{"id": r["id"], "v": None if r["v"] is None else {"metadata": bytes(r["v"].metadata), "value": bytes(r["v"].value)}}
              for r in spark_rows]
    assert ours == theirs
    assert ours == _sorted_rows(DeltaTable(str(t)).to_pyarrow_table())
    # The encoding decodes to what was written (Spark's own decoder).
    assert spark_rows[0]["v"].toPython() == {"a": 1, "b": [1, "two", None]}
