"""Column mapping on write, name and id modes: tables deltacoord creates get ids and physical names at
every level, files carry physical names and Parquet field ids, stats and partition values physical keys;
delta-rs and Delta on Spark read what deltacoord wrote, on tables it created and on a name-mode table
Delta on Spark created (adopted, then appended, updated, deleted and merged by deltacoord, and appended to
through deltacoord's Spark sink)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.table_features import COORDINATED
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.test_writer_operations import Env, running_env

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.kafka

ID = "delta.columnMapping.id"
PHYSICAL = "delta.columnMapping.physicalName"
S = pa.struct([("a", pa.int64()), ("b", pa.string())])
SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("value", pa.string()), ("s", S)])
Row = tuple[Any, ...]


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def delta_rs(path: Path) -> pa.Table:
    """The table as delta-rs's query engine reads it (its pyarrow-dataset path ignores column mapping)."""
    return pa.table(QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT * FROM t").read_all())


def rows_of(t: pa.Table) -> list[Row]:
    return sorted((r["id"], r["date"], r["value"], None if r["s"] is None else (r["s"]["a"], r["s"]["b"]))
                  for r in t.select(["id", "date", "value", "s"]).to_pylist())


def batch(ids: list[int], date: str, value: str) -> pa.Table:
    return pa.table({"id": ids, "date": [date] * len(ids), "value": [value] * len(ids),
                     "s": [{"a": i * 10, "b": f"n{i}"} for i in ids]}, schema=SCHEMA)


def write_operations(t: Table) -> list[Row]:
    """Append, UPDATE, DELETE, MERGE; returns the rows the table must hold."""
    t.append(batch([1, 2, 3], "d1", "a"))
    t.append(batch([4, 5], "d2", "b"))
    t.update("id = 2", {"value": "'u'"})
    t.update("id = 3", {"value": "'v'"})  # the nested column of the rewritten rows is carried over
    t.delete("id = 4")
    t.merge(batch([5, 6], "d2", "m"), ["id"], when_matched_update="*", when_not_matched_insert="*")
    return [(1, "d1", "a", (10, "n1")), (2, "d1", "u", (20, "n2")), (3, "d1", "v", (30, "n3")),
            (5, "d2", "m", (50, "n5")), (6, "d2", "m", (60, "n6"))]


def fields_of(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for f in schema["fields"]:
        yield f
        if isinstance(f["type"], dict) and f["type"].get("type") == "struct":
            yield from fields_of(f["type"])


def parquet_ids(root: Path, path: str) -> dict[str, int]:
    """Column path (physical names) -> Parquet field id, for every leaf and group of a data file."""
    schema = pq.ParquetFile(root / path).schema_arrow
    out: dict[str, int] = {}

    def walk(f: pa.Field, prefix: str) -> None:
        meta = f.metadata or {}
        out[prefix + f.name] = int(meta.get(b"PARQUET:field_id", b"-1"))
        if pa.types.is_struct(f.type):
            for i in range(f.type.num_fields):
                walk(f.type.field(i), prefix + f.name + ".")

    for f in schema:
        walk(f, "")
    return out


@pytest.mark.parametrize("mode", ["name", "id"])
def test_a_table_created_with_column_mapping_is_written_with_physical_names_and_ids(env: Env, tmp_path: Path,
                                                                                   mode: str) -> None:
    t = env.table(tmp_path / "t")
    t.create(SCHEMA, partition_by=["date"], properties={"delta.columnMapping.mode": mode})
    expected = write_operations(t)
    env.settle()
    snap = Snapshot.load(str(t.root))
    schema = snap.metadata.schema()
    fields = list(fields_of(schema))
    assert sorted(f["metadata"][ID] for f in fields) == list(range(1, 7))  # id, date, value, s, s.a, s.b
    assert snap.metadata.configuration["delta.columnMapping.maxColumnId"] == "6"
    assert all(f["metadata"][PHYSICAL].startswith("col-") for f in fields)
    assert (snap.protocol.min_reader_version, snap.protocol.min_writer_version) >= (2, 5)
    phys = {f["name"]: f["metadata"][PHYSICAL] for f in schema["fields"]}
    nested = {f["name"]: f["metadata"] for f in schema["fields"][3]["type"]["fields"]}
    ids = {f["metadata"][PHYSICAL]: f["metadata"][ID] for f in fields}
    files = snap.files()
    assert files
    for a in files:
        assert set(a.partition_values) == {phys["date"]}
        stats = json.loads(a.stats or "{}")
        assert set(stats["nullCount"]) == {phys["id"], phys["value"], phys["s"]}
        assert phys["id"] in stats["minValues"]
        in_file = parquet_ids(t.root, a.path)
        s_phys = phys["s"]
        assert in_file == {phys["id"]: ids[phys["id"]], phys["value"]: ids[phys["value"]], s_phys: ids[s_phys],
                           f"{s_phys}.{nested['a'][PHYSICAL]}": nested["a"][ID],
                           f"{s_phys}.{nested['b'][PHYSICAL]}": nested["b"][ID]}
    assert rows_of(delta_rs(t.root)) == expected
    if mode == "name":
        assert rows_of(snap.to_pyarrow()) == expected
    # A column added later gets the next id and a physical name, and its values land under it.
    t.add_columns([pa.field("extra", pa.int64())])
    t.append(pa.table({"id": [7], "date": ["d3"], "value": ["x"], "extra": [70]}))
    env.settle()
    snap = Snapshot.load(str(t.root))
    extra = next(f for f in snap.metadata.schema()["fields"] if f["name"] == "extra")
    assert extra["metadata"][ID] == 7 and snap.metadata.configuration["delta.columnMapping.maxColumnId"] == "7"
    got = delta_rs(t.root).to_pylist()
    assert [r["extra"] for r in got if r["id"] == 7] == [70]
    assert {r["id"] for r in got if r["extra"] is None} == {1, 2, 3, 5, 6}


@pytest.mark.spark
def test_delta_spark_reads_column_mapping_tables_deltacoord_wrote(spark: SparkSession, env: Env, tmp_path: Path) -> None:
    from deltacoord.writer import spark_sink

    ours = {}
    for mode in ("name", "id"):
        t = env.table(tmp_path / mode)
        t.create(SCHEMA, partition_by=["date"], properties={"delta.columnMapping.mode": mode})
        ours[mode] = (t.root, write_operations(t))
    env.settle()
    for mode, (root, expected) in ours.items():
        got = sorted((r["id"], r["date"], r["value"], (r["s"]["a"], r["s"]["b"]))
                     for r in spark.read.format("delta").load(str(root)).collect())
        assert got == expected, mode

    # A name-mode table Delta on Spark created and wrote, adopted and written by deltacoord.
    path = tmp_path / "spark"
    where = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {where} (id BIGINT, date STRING, value STRING, s STRUCT<a: BIGINT, b: STRING>) "
              "USING delta PARTITIONED BY (date) TBLPROPERTIES ('delta.columnMapping.mode' = 'name')")
    spark.sql(f"INSERT INTO {where} VALUES (10, 'd1', 'sp', named_struct('a', 100, 'b', 'x')), "
              "(11, 'd2', 'sp', named_struct('a', 110, 'b', 'y'))")
    spark.sql(f"ALTER TABLE {where} RENAME COLUMN value TO val")
    t = env.table(path)
    assert t.adopt().version == 2
    t.append(pa.table({"id": [12], "date": ["d1"], "val": ["dc"], "s": [{"a": 120, "b": "z"}]}))
    t.update("id = 10", {"val": "'dc-up'"})
    t.delete("id = 11")
    t.merge(pa.table({"id": [12, 13], "date": ["d1", "d3"], "val": ["mm", "mi"]}), ["id"],
            when_matched_update={"val": "s.val"}, when_not_matched_insert={"id": "s.id", "date": "s.date", "val": "s.val"})
    env.settle()
    # deltacoord's Spark sink appends to it too (physical names, from executors).
    spark_sink.register(spark)
    prefix = env.topics.proposals.removesuffix(".proposals")
    (spark.createDataFrame([(14, "d1", "sk", (140, "w"))], "id BIGINT, date STRING, val STRING, s STRUCT<a: BIGINT, b: STRING>")
     .write.format("deltacoord").option("bootstrap.servers", env.bootstrap).option("topic.prefix", prefix)
     .mode("append").save(str(path)))
    expected = [(10, "d1", "dc-up", (100, "x")), (12, "d1", "mm", (120, "z")), (13, "d3", "mi", None),
                (14, "d1", "sk", (140, "w"))]
    got = sorted((r["id"], r["date"], r["val"], None if r["s"] is None else (r["s"]["a"], r["s"]["b"]))
                 for r in spark.read.format("delta").load(str(path)).collect())
    assert got == expected
    theirs = delta_rs(path).to_pylist()
    assert sorted((r["id"], r["date"], r["val"], None if r["s"] is None else (r["s"]["a"], r["s"]["b"]))
                  for r in theirs) == expected


def test_column_mapping_turned_on_for_a_table_with_files(env: Env, tmp_path: Path) -> None:
    """As in Delta: existing columns keep their names as physical names and get ids; later writes go on."""
    t = env.table(tmp_path / "t")
    t.create(SCHEMA, partition_by=["date"])
    t.append(batch([1, 2], "d1", "a"))
    t.set_properties({"delta.columnMapping.mode": "name"})
    t.append(batch([3], "d2", "b"))
    t.update("id = 1", {"value": "'u'"})
    t.add_columns([pa.field("extra", pa.int64())])
    t.append(pa.table({"id": [4], "date": ["d2"], "value": ["c"], "extra": [40]}))
    env.settle()
    snap = Snapshot.load(str(t.root))
    fields = {f["name"]: f["metadata"] for f in snap.metadata.schema()["fields"]}
    assert {n: m[PHYSICAL] for n, m in fields.items() if n != "extra"} == {"id": "id", "date": "date", "value": "value", "s": "s"}
    assert fields["extra"][PHYSICAL].startswith("col-") and fields["extra"][ID] == 7
    assert snap.metadata.configuration["delta.columnMapping.maxColumnId"] == "7"
    # Reader 2 for column mapping, as Delta; writer 7 (the table carries deltacoord's own writer feature) listing it.
    assert (snap.protocol.min_reader_version, snap.protocol.min_writer_version) == (2, 7)
    assert snap.protocol.writer_features == ("appendOnly", "invariants", COORDINATED, "columnMapping")
    expected = [(1, "d1", "u", (10, "n1")), (2, "d1", "a", (20, "n2")), (3, "d2", "b", (30, "n3")), (4, "d2", "c", None)]
    assert rows_of(delta_rs(t.root)) == expected and rows_of(snap.to_pyarrow()) == expected
    with pytest.raises(ValueError, match="from name to id is not supported"):
        t.set_properties({"delta.columnMapping.mode": "id"})
