"""Identity columns on a table Delta on Spark created: values generated at write, never handed out twice.

Spark creates a GENERATED ALWAYS identity column and inserts; the coordinator adopts the table; our appends
and MERGE inserts continue Spark's sequence (the high-water mark in the metaData action); a second append
from the same snapshot loses with MetadataChangedException (an identity column disables concurrent writes,
as the seeds say) and hands out nothing; given values and UPDATEs of the column are refused; after the
table is released Spark's own inserts continue after our values.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.errors import MetadataChangedException
from deltacoord.schemas.identity import identity_columns
from deltacoord.writer.identity import IdentityColumnError
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _values(path: Path) -> pa.Table:
    return Snapshot.load(str(path)).to_pyarrow().sort_by("id")


def test_identity_values_continue_spark_s_sequence_and_are_never_reused(spark: SparkSession, kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "t"
    where = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {where} (id BIGINT GENERATED ALWAYS AS IDENTITY (START WITH 10 INCREMENT BY 5), "
              "v STRING) USING delta")
    spark.sql(f"INSERT INTO {where} (v) VALUES ('sp1'), ('sp2')")
    assert [c.high_water_mark for c in identity_columns(Snapshot.load(str(path)).metadata.schema())] == [15]

    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics) as _, Table(path, kafka_bootstrap, topics=topics) as t, \
            Table(path, kafka_bootstrap, topics=topics) as other:
        t.adopt()
        snap = t.snapshot()
        t.append(pa.table({"v": ["dc1", "dc2", "dc3"]}), snapshot=snap)
        with pytest.raises(MetadataChangedException):
            other.append(pa.table({"v": ["lost"]}), snapshot=snap)  # read the same mark: it would reuse 20
        t.merge(pa.table({"id": pa.array([10, 99], pa.int64()), "v": ["merged", "new"]}), ["id"],
                when_matched_update={"v": "s.v"}, when_not_matched_insert={"v": "s.v"})
        with pytest.raises(IdentityColumnError, match="GENERATED ALWAYS"):
            t.append(pa.table({"id": pa.array([1], pa.int64()), "v": ["given"]}))
        with pytest.raises(IdentityColumnError, match="UPDATE cannot set identity"):
            t.update("v = 'sp1'", {"id": "0"})
        t.wait_published(t.last_committed_version or 0)
        ours = _values(path)
        assert ours.to_pylist() == [{"id": 10, "v": "merged"}, {"id": 15, "v": "sp2"}, {"id": 20, "v": "dc1"},
                                    {"id": 25, "v": "dc2"}, {"id": 30, "v": "dc3"}, {"id": 35, "v": "new"}]
        assert [c.high_water_mark for c in identity_columns(Snapshot.load(str(path)).metadata.schema())] == [35]
        t.release()

    theirs = sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).collect())
    assert theirs == [(r["id"], r["v"]) for r in ours.to_pylist()]
    spark.sql(f"INSERT INTO {where} (v) VALUES ('sp3')")  # Spark goes on after our mark
    after = sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).collect())
    assert after[-1] == (40, "sp3")
