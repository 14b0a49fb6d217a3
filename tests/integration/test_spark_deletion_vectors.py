"""Delta Lake on Spark reads deletion-vector tables written by deltacoord (inline and file vectors,
a coordinator-rebased union vector), every version equal to our reader's rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from deltacoord.reader.snapshot import Snapshot
from tests.conftest import TablePlace
from tests.integration.test_deletion_vectors import DV, delta_rs_agrees
from tests.integration.test_writer_operations import SCHEMA, Env, data, rows, running_env

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def test_delta_spark_reads_every_version_of_a_deletion_vector_table(spark: SparkSession, env: Env, tmp_path: Path) -> None:
    small = env.table(tmp_path / "t")
    small.create(SCHEMA, properties=DV)
    small.append(data(list(range(3000)), "2024-01-01", "v"))
    small.append(data([5000, 5001], "2024-01-02", "w"))
    snap = small.snapshot()
    small.delete("id = 10", snapshot=snap)  # two DELETEs of one file from one snapshot: the second is rebased
    small.delete("id = 20", snapshot=snap)
    small.update("id = 30", {"value": "'u'"})
    small.merge(pa.table({"id": [40, 5000, 9000], "date": ["2024-01-01", "2024-01-02", "2024-01-03"],
                          "value": ["m", "d", "new"]}, schema=SCHEMA),
                ["id"], when_matched_update="*", when_matched_delete="s.value = 'd'", when_not_matched_insert="*")
    env.settle()
    big = env.table(tmp_path / "t", dv_inline_max_bytes=0)  # vectors in deletion_vector_<uuid>.bin files
    big.delete("id >= 100 AND id < 2000")
    env.settle()
    latest = Snapshot.load(str(small.root)).version
    assert latest == 7
    final = rows(Snapshot.load(str(small.root)).to_pyarrow())
    assert len(final) == 3000 - 2 - 1900 + 1 + 1
    assert (30, "2024-01-01", "u") in final and (40, "2024-01-01", "m") in final and (9000, "2024-01-03", "new") in final
    for v in range(latest + 1):
        ours = rows(Snapshot.load(str(small.root), version=v).to_pyarrow())
        theirs = sorted(tuple(r) for r in spark.read.format("delta").option("versionAsOf", v).load(str(small.root))
                        .select("id", "date", "value").collect())
        assert theirs == ours, f"version {v} differs between Delta on Spark and deltacoord"
    delta_rs_agrees(env, small)
