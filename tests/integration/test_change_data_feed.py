"""The change data feed of a coordinated table, read by delta-rs (`load_cdf`) and by Delta on Spark
(`readChangeFeed`), equals what the operations did: an append, DELETE, UPDATE, MERGE with all its clauses,
and a DELETE of a whole file (whose changes readers infer from the remove, with no `_change_data` file),
on an unpartitioned table, a partitioned one, one with deletion vectors, and one with column mapping (change data files under physical names)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from deltacoord.reader.snapshot import Snapshot
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.test_writer_operations import SCHEMA, Env, data, running_env

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.kafka

CDF = {"delta.enableChangeDataFeed": "true"}
PHYSICAL = "delta.columnMapping.physicalName"
LAYOUTS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "unpartitioned": ((), CDF),
    "partitioned": (("date",), CDF),
    "deletion vectors": (("date",), {**CDF, "delta.enableDeletionVectors": "true"}),
    "column mapping": (("date",), {**CDF, "delta.columnMapping.mode": "name"}),
}
Change = tuple[Any, ...]  # (id, date, value, _change_type, _commit_version)

#: What the operations of `run_operations` change, version by version.
EXPECTED: list[Change] = sorted([
    *[(i, d, v, "insert", 1) for i, d, v in [(1, "d1", "a"), (2, "d1", "b"), (3, "d1", "c"), (4, "d2", "d"),
                                              (5, "d2", "e"), (6, "d2", "f")]],
    (2, "d1", "b", "delete", 2),
    (3, "d1", "c", "update_preimage", 3), (3, "d1", "u", "update_postimage", 3),
    (4, "d2", "d", "update_preimage", 3), (4, "d2", "u", "update_postimage", 3),
    (1, "d1", "a", "update_preimage", 4), (1, "d1", "M", "update_postimage", 4),
    (5, "d2", "e", "delete", 4), (7, "d3", "g", "insert", 4),
    (7, "d3", "g", "delete", 5),
])


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def run_operations(t: Table, partition_by: tuple[str, ...], properties: dict[str, str]) -> None:
    """Versions 0-5: create, append, DELETE, UPDATE, MERGE (delete, update, conditional insert), whole-file DELETE."""
    t.create(SCHEMA, partition_by=partition_by, properties=properties)
    t.append(data([1, 2, 3, 4, 5, 6], ["d1", "d1", "d1", "d2", "d2", "d2"], ["a", "b", "c", "d", "e", "f"]))
    t.delete("id = 2")
    t.update("id IN (3, 4)", {"value": "'u'"})
    source = pa.table({"id": [1, 5, 7, 8], "date": ["d1", "d2", "d3", "d3"], "value": ["M", None, "g", None],
                       "op": ["U", "D", "I", "D"]})
    t.merge(source, "s.id = t.id", when_matched_delete="s.op = 'D'", when_matched_update={"value": "s.value"},
            when_not_matched_insert={"id": "s.id", "date": "s.date", "value": "s.value"},
            when_not_matched_insert_if="s.op != 'D'")
    t.delete("id = 7")  # the file MERGE inserted, removed whole


def cdc_actions(root: Path, version: int) -> list[dict[str, Any]]:
    lines = (root / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    return [json.loads(x)["cdc"] for x in lines if "cdc" in json.loads(x)]


def changes(table: pa.Table) -> list[Change]:
    return sorted((r["id"], r["date"], r["value"], r["_change_type"], r["_commit_version"]) for r in table.to_pylist())


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_delta_rs_reads_the_change_feed_the_operations_made(env: Env, tmp_path: Path, layout: str) -> None:
    partition_by, properties = LAYOUTS[layout]
    t = env.table(tmp_path / "t")
    run_operations(t, partition_by, properties)
    env.settle()
    root = t.root
    # DELETE, UPDATE and MERGE carry cdc actions for files under _change_data (one per partition touched)...
    for v, parts in ((2, [{"date": "d1"}]), (3, [{"date": "d1"}, {"date": "d2"}]),
                     (4, [{"date": "d1"}, {"date": "d2"}, {"date": "d3"}])):
        cdc = cdc_actions(root, v)
        assert cdc, f"version {v} has no cdc action"
        for c in cdc:
            assert c["path"].startswith("_change_data/") and c["dataChange"] is False
            assert c["size"] == (root / c["path"]).stat().st_size
        if partition_by:
            key = Snapshot.load(str(root)).metadata.schema()["fields"][1]["metadata"].get(PHYSICAL, "date")
            assert sorted(c["partitionValues"][key] for c in cdc) == [p["date"] for p in parts]
            assert all(c["path"].startswith(f"_change_data/{key}={c['partitionValues'][key]}/") for c in cdc)
        else:
            assert [c["partitionValues"] for c in cdc] == [{}]
    # ...the whole-file DELETE none: readers infer its change from the remove.
    assert cdc_actions(root, 5) == []
    if "delta.columnMapping.mode" in properties:
        # delta-rs refuses change data feed scans of column-mapping tables (Spark reads this one, below): the
        # change data files hold the data columns under their physical names.
        fields = Snapshot.load(str(root)).metadata.schema()["fields"]
        stored = pq.read_table(root / cdc_actions(root, 4)[0]["path"]).column_names
        assert stored == [fields[0]["metadata"][PHYSICAL], fields[2]["metadata"][PHYSICAL], "_change_type"]
        return
    feed = pa.table(DeltaTable(str(root)).load_cdf(starting_version=0).read_all())
    assert changes(feed) == EXPECTED


@pytest.mark.spark
def test_delta_spark_reads_the_change_feed_the_operations_made(spark: SparkSession, env: Env, tmp_path: Path) -> None:
    roots = {}
    for i, (layout, (partition_by, properties)) in enumerate(LAYOUTS.items()):
        t = env.table(tmp_path / f"t{i}")
        run_operations(t, partition_by, properties)
        roots[layout] = t.root
    env.settle()
    for layout, root in roots.items():
        df = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(str(root))
        got = sorted((r["id"], r["date"], r["value"], r["_change_type"], r["_commit_version"]) for r in df.collect())
        assert got == EXPECTED, layout
