"""The Spark `foreachBatch` helper: each micro-batch goes to several tables in one multi-table transaction,
exactly once across a restart of the query, across a query that died after its batch committed (restarted, Spark
runs the batch again) and across a replayed batch."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.messages import TRANSACTION_KEY
from deltacoord.spark import MultiTableBatchWriter
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.spark_harness import shared_session

SCHEMA = pa.schema([("id", pa.int64()), ("amount", pa.int64())])


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return shared_session()


def _files(src: Path, first: int, n: int) -> None:
    src.mkdir(exist_ok=True)
    for i in range(first, first + n):
        (src / f"part-{i}.json").write_text("\n".join(json.dumps({"id": i * 10 + j, "amount": j}) for j in range(5)))


def _ids(path: Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist())


@pytest.mark.slow
def test_each_micro_batch_goes_to_every_table_exactly_once(spark: SparkSession, kafka_bootstrap: str,
                                                            tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=4)
    with coordinator_thread(kafka_bootstrap, topics):
        paths = {n: tmp_path / n for n in ("small", "big")}
        for n, p in paths.items():
            with Table(p, kafka_bootstrap, topics=topics, table_id=f"pipe::{n}") as t:
                t.create(SCHEMA)
        writer = MultiTableBatchWriter({str(paths["small"]): lambda df: df.where("amount < 2"),
                                        str(paths["big"]): lambda df: df.where("amount >= 2")},
                                       app_id="test-pipeline", bootstrap_servers=kafka_bootstrap, topics=topics,
                                       table_ids={str(p): f"pipe::{n}" for n, p in paths.items()})
        src, ckpt = tmp_path / "src", tmp_path / "ckpt"

        def run(each: Any = writer) -> Any:
            q = (spark.readStream.schema("id LONG, amount LONG").option("maxFilesPerTrigger", 1).json(str(src))
                 .writeStream.foreachBatch(each).option("checkpointLocation", str(ckpt))
                 .trigger(availableNow=True).start())
            with contextlib.suppress(StreamingQueryException):  # a query that failed: its exception() says why
                q.awaitTermination(300)
            return q.exception()

        _files(src, 0, 3)
        assert run() is None
        assert writer.last is not None and set(writer.last.versions) == {"pipe::small", "pipe::big"}
        assert _ids(paths["small"]) == sorted(i * 10 + j for i in range(3) for j in range(2))
        assert _ids(paths["big"]) == sorted(i * 10 + j for i in range(3) for j in range(2, 5))
        # Spark replays a batch that committed when the query died before its commit log recorded it.
        replay = spark.read.schema("id LONG, amount LONG").json(str(src / "part-2.json"))
        writer(replay, 2)
        assert writer.last is not None and not writer.last.commits, "the replayed batch writes nothing"
        _files(src, 3, 2)
        assert run() is None  # the query restarted from its checkpoint: only the new files flow
        assert _ids(paths["small"]) == sorted(i * 10 + j for i in range(5) for j in range(2))
        assert _ids(paths["big"]) == sorted(i * 10 + j for i in range(5) for j in range(2, 5))

        # The query dies right after batch 5 committed in every table, before Spark's commit log records it.
        def dies_after_committing(df: Any, batch_id: int) -> None:
            writer(df, batch_id)
            raise RuntimeError(f"the driver dies after batch {batch_id} committed")

        _files(src, 5, 1)
        died = run(dies_after_committing)
        assert died is not None and "after batch 5 committed" in str(died), died
        assert writer.last is not None and set(writer.last.versions) == {"pipe::small", "pipe::big"}
        assert run() is None  # restarted: Spark runs batch 5 again, from its offset log; every table has it
        assert writer.last is not None and not writer.last.commits, "batch 5 is written once"
        assert _ids(paths["small"]) == sorted(i * 10 + j for i in range(6) for j in range(2))
        assert _ids(paths["big"]) == sorted(i * 10 + j for i in range(6) for j in range(2, 5))
        for p in paths.values():
            history = [h for h in DeltaTable(str(p)).history() if h["version"] > 0]
            assert len(history) == 6 and all(TRANSACTION_KEY in h for h in history), "one transaction per batch"
            assert Snapshot.load(str(p)).app_versions == {"test-pipeline": 5}
        writer.close()
