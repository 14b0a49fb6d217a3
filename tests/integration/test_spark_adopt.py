"""A table written by Delta Lake on Spark is adopted, decided by the coordinator, and read back by Spark.

Spark creates the table, writes, deletes and updates (its own checkpoint at version 3); the coordinator adopts
it at version 4, adds its own writer feature at 5, commits after it and checkpoints it; Delta on Spark, delta-rs and our reader then read every
version, before and after the adoption, alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.reader.log import checkpoint_exists
from deltacoord.reader.snapshot import Snapshot
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.test_adopt import _wait_for
from tests.integration.test_writer_operations import assert_delta_rs_agrees, data, rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_a_delta_spark_table_is_adopted_and_read_back_by_spark(spark: SparkSession, kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "t"
    where = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {where} (id BIGINT, date STRING, value STRING) USING delta PARTITIONED BY (date) "
              "TBLPROPERTIES ('delta.checkpointInterval' = '3')")
    spark.sql(f"INSERT INTO {where} VALUES (1, '2024-01-01', 'sp'), (2, '2024-01-01', 'sp'), (3, '2024-01-02', 'sp')")
    spark.sql(f"INSERT INTO {where} VALUES (4, '2024-01-02', 'sp'), (5, '2024-01-03', 'sp')")
    spark.sql(f"DELETE FROM {where} WHERE id = 2")
    spark.sql(f"UPDATE {where} SET value = 'sp-up' WHERE id = 4")
    storage = Snapshot.load(str(path)).storage
    assert Snapshot.load(str(path)).version == 4 and checkpoint_exists(storage, 3)

    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics, checkpoint_fn=create_checkpoint), \
            Table(path, kafka_bootstrap, topics=topics) as t:
        assert t.adopt().version == 4  # version 5 adds the deltacoord-coordinated writer feature
        assert t.append(data([6, 7], ["2024-01-03", "2024-01-04"], "dc")).version == 6
        assert t.delete("id = 1").version == 7  # a file Spark wrote
        assert t.update("id = 3", {"value": "'dc-up'"}).version == 8
        _wait_for(lambda: checkpoint_exists(storage, 6), "the coordinator's checkpoint at version 6")
        assert assert_delta_rs_agrees(t) == 9

    for v in range(9):
        ours = rows(Snapshot.load(str(path), version=v).to_pyarrow().select(["id", "date", "value"]))
        theirs = sorted(tuple(r) for r in spark.read.format("delta").option("versionAsOf", v).load(str(path))
                        .select("id", "date", "value").collect())
        assert theirs == ours, f"version {v} differs between Delta on Spark and deltacoord"
    latest = sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).select("id", "date", "value").collect())
    assert latest == [(3, "2024-01-02", "dc-up"), (4, "2024-01-02", "sp-up"), (5, "2024-01-03", "sp"),
                      (6, "2024-01-03", "dc"), (7, "2024-01-04", "dc")]
    # Spark goes on from the coordinator's checkpoint: its history sees every version.
    history = spark.sql(f"DESCRIBE HISTORY {where}").select("version", "operation").collect()
    assert sorted(r[0] for r in history) == list(range(9))
