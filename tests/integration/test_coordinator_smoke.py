"""End to end through the real broker: create, append, conflict, publish, read with delta-rs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltacoord.schemas.errors import ConcurrentAppendException
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("value", pa.string())])


@pytest.mark.check
def test_create_append_conflict_and_delta_rs_reads(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics):
        t = Table(tmp_path / "t", kafka_bootstrap, topics=topics)
        assert t.create(SCHEMA, partition_by=["date"]).version == 0
        r1 = t.append(pa.table({"id": [1, 2], "date": ["2024-01-01", "2024-01-02"], "value": ["a", "b"]}))
        assert r1.version == 1
        # An UPDATE that read version 1 of partition 2024-01-01 ...
        tx = t.begin()
        tx.read_predicate("date = '2024-01-01'")
        # ... loses against a non-blind write that added a file in that partition.
        other = t.begin()
        other.read_predicate("date = '2024-01-01'")
        other.stage(__import__("deltacoord.writer.staging", fromlist=["x"]).write_data_files(
            t.root, pa.table({"id": [3], "date": ["2024-01-01"], "value": ["c"]}), ["date"]))
        assert other.commit("MERGE").version == 2
        tx.stage(__import__("deltacoord.writer.staging", fromlist=["x"]).write_data_files(
            t.root, pa.table({"id": [4], "date": ["2024-01-01"], "value": ["d"]}), ["date"]))
        with pytest.raises(ConcurrentAppendException) as ei:
            tx.commit("UPDATE")
        assert ei.value.winning_version == 2
        # Publication follows the Kafka commit; wait for the version this handle committed.
        t.wait_published(2)
        t.close()
    dt = DeltaTable(str(tmp_path / "t"))
    assert dt.version() == 2
    ids = sorted(dt.to_pyarrow_table().column("id").to_pylist())
    assert ids == [1, 2, 3]
