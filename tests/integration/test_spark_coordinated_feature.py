"""Delta on Spark refuses to write a coordinated table by itself, reads it, and writes it again once released.

Against a real broker and coordinator. deltacoord's Spark data source creates and appends to the table (its
protocol then names the project's writer feature `deltacoord-coordinated`); Delta on Spark's own
`df.write.format("delta").mode("append")` is refused by Delta (DELTA_UNSUPPORTED_FEATURES_FOR_WRITE, naming the
feature) while `spark.read.format("delta")` reads every row. After `release` the same append succeeds; after
adopting the table again it is refused again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import Protocol
from deltacoord.schemas.table_features import COORDINATED
from deltacoord.writer import spark_sink
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.spark_harness import shared_session

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

DDL = "id BIGINT, s STRING"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    s = shared_session()
    spark_sink.register(s)
    return s


@pytest.fixture
def env(kafka_bootstrap: str) -> Iterator[tuple[str, Any]]:
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics):
        yield kafka_bootstrap, topics


def _spark_rows(spark: SparkSession, path: Path) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["s"]) for r in spark.read.format("delta").load(str(path)).collect())


def _delta_append(spark: SparkSession, path: Path, rows: list[tuple[int, str]]) -> None:
    spark.createDataFrame(rows, DDL).write.format("delta").mode("append").save(str(path))


def _log_versions(path: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))


def _delta_append_refused(spark: SparkSession, path: Path) -> None:
    versions = _log_versions(path)
    with pytest.raises(Py4JJavaError) as e:  # Delta's DeltaUnsupportedTableFeatureException
        _delta_append(spark, path, [(99, "spark")])
    assert "DELTA_UNSUPPORTED_FEATURES_FOR_WRITE" in str(e.value), str(e.value)[:2000]
    assert "requires writer table feature(s) that are unsupported by Delta Lake" in str(e.value)
    assert COORDINATED in str(e.value)
    assert _log_versions(path) == versions, "Delta on Spark committed nothing"


def test_delta_on_spark_refuses_to_append_to_a_coordinated_table_until_it_is_released(
        spark: SparkSession, env: tuple[str, Any], tmp_path: Path) -> None:
    bootstrap, topics = env
    prefix = topics.proposals.removesuffix(".proposals")
    path = tmp_path / "t"
    # deltacoord's Spark data source creates the table (errorifexists) and appends to it: both go through the coordinator.
    for mode, rows in (("errorifexists", [(1, "sink")]), ("append", [(2, "sink")])):
        (spark.createDataFrame(rows, DDL).write.format("deltacoord").option("bootstrap.servers", bootstrap)
         .option("topic.prefix", prefix).mode(mode).save(str(path)))
    snap = Snapshot.load(str(path))  # the sink's creation commits the table (0), then the rows (1); its append: 2
    assert (snap.version, snap.protocol) == (2, Protocol(1, 7, writer_features=("appendOnly", "invariants", COORDINATED)))
    assert _spark_rows(spark, path) == [(1, "sink"), (2, "sink")]  # Delta on Spark reads it
    _delta_append_refused(spark, path)

    with Table(path, bootstrap, topics=topics) as t:
        assert t.release().version == 3  # version 3 drops the feature
        assert Snapshot.load(str(path)).protocol == Protocol(1, 2)
        _delta_append(spark, path, [(3, "spark")])
        assert Snapshot.load(str(path)).version == 4
        assert _spark_rows(spark, path) == [(1, "sink"), (2, "sink"), (3, "spark")]

        assert t.adopt().version == 4  # and version 5 adds the feature again
        assert Snapshot.load(str(path)).protocol.writer_features == ("appendOnly", "invariants", COORDINATED)
        _delta_append_refused(spark, path)
        assert t.append(spark.createDataFrame([(4, "dc")], DDL).toArrow()).version == 6
        assert _spark_rows(spark, path) == [(1, "sink"), (2, "sink"), (3, "spark"), (4, "dc")]
        assert t.release().version == 7
    _delta_append(spark, path, [(5, "spark")])
    assert _spark_rows(spark, path) == [(1, "sink"), (2, "sink"), (3, "spark"), (4, "dc"), (5, "spark")]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "operation").collect()
    assert sorted((r[0], r[1]) for r in history if r[0] >= 3) == [
        (3, "DROP FEATURE"), (4, "WRITE"), (5, "UPGRADE PROTOCOL"), (6, "WRITE"), (7, "DROP FEATURE"), (8, "WRITE")]
