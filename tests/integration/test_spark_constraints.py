"""A Delta on Spark table with generated columns, a NOT NULL column and a CHECK constraint, written by deltacoord.

Spark creates the table (its DDL: GENERATED ALWAYS AS, NOT NULL, ADD CONSTRAINT ... CHECK); the coordinator
adopts it; our writer appends rows without the generated columns (computed), is refused a row that breaks
the constraint, and updates a row (its generated column follows). After the release Spark reads the same
rows, and its own writes still find the constraint and the generated columns as they were.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from deltacoord.writer.constraints import ConstraintViolationError
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _rows(ids: list[int], ts: list[dt.datetime], s: list[str | None]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                     "s": pa.array(s, pa.string())})


@pytest.mark.check
def test_spark_reads_our_generated_columns_and_its_constraints_still_hold(spark: SparkSession, kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "t"
    where = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {where} (id BIGINT NOT NULL, ts TIMESTAMP, s STRING, "
              "day DATE GENERATED ALWAYS AS (CAST(ts AS DATE)), up STRING GENERATED ALWAYS AS (upper(s))) USING delta")
    spark.sql(f"ALTER TABLE {where} ADD CONSTRAINT id_positive CHECK (id > 0)")
    spark.sql(f"INSERT INTO {where} (id, ts, s) VALUES (1, TIMESTAMP '2024-01-01 10:00:00', 'sp')")

    t0 = dt.datetime(2024, 2, 3, 23, 30, tzinfo=dt.UTC)
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics), Table(path, kafka_bootstrap, topics=topics) as t:
        t.adopt()
        t.append(_rows([2, 3], [t0, t0 + dt.timedelta(hours=1)], ["dc", None]))
        with pytest.raises(ConstraintViolationError, match="CHECK constraint id_positive"):
            t.append(_rows([-4], [t0], ["bad"]))
        with pytest.raises(ConstraintViolationError, match="NOT NULL constraint violated for column: id"):
            t.append(pa.table({"id": pa.array([None], pa.int64()), "s": ["n"]}))
        t.update("id = 1", {"s": "'sp-up'"})
        t.release()

    got = sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).select("id", "day", "s", "up").collect())
    assert got == [(1, dt.date(2024, 1, 1), "sp-up", "SP-UP"), (2, dt.date(2024, 2, 3), "dc", "DC"),
                   (3, dt.date(2024, 2, 4), None, None)]
    # Spark's own writes: the constraint and the generation expressions are still the table's.
    with pytest.raises(Exception, match="id_positive"):
        spark.sql(f"INSERT INTO {where} (id, ts, s) VALUES (-1, TIMESTAMP '2024-01-01 00:00:00', 'x')")
    with pytest.raises(Exception, match=r"Generated Column|DELTA_VIOLATE_CONSTRAINT"):
        spark.sql(f"INSERT INTO {where} VALUES (5, TIMESTAMP '2024-01-01 00:00:00', 'x', DATE '2020-01-01', 'X')")
    spark.sql(f"INSERT INTO {where} (id, ts, s) VALUES (6, TIMESTAMP '2024-03-01 00:00:00', 'y')")
    assert spark.read.format("delta").load(str(path)).where("id = 6").select("day", "up").collect()[0] == (
        dt.date(2024, 3, 1), "Y")
