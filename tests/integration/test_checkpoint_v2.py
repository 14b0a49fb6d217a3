"""V2 checkpoints with sidecars on a table created with `delta.checkpointPolicy=v2`.

The coordinator checkpoints it as Delta does (a UUID-named top-level file and `_delta_log/_sidecars/`), a
small sidecar size spreads the file actions over several sidecars, and with the JSON commits before the
checkpoint removed (log cleanup) our reader, delta-rs and Delta on Spark all read the table from it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from deltacoord.coordinator.delta_log.checkpointer import checkpoint_actions, create_checkpoint, write_checkpoint
from deltacoord.reader.log import checkpoint_exists, list_log
from deltacoord.reader.snapshot import Snapshot
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.test_adopt import _wait_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

UUID_NAMED = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-f-]{36}\.parquet$")


def _v2_checkpoints(path: Path) -> dict[int, str]:
    return {int(m.group(1)): p.name for p in (path / "_delta_log").iterdir() if (m := UUID_NAMED.match(p.name))}


def test_v2_checkpoints_with_sidecars_are_read_by_every_reader(spark: SparkSession, kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "t"
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics, checkpoint_fn=create_checkpoint), \
            Table(path, kafka_bootstrap, topics=topics) as t:
        t.create(pa.schema([("id", pa.int64()), ("s", pa.string())]),
                 properties={"delta.checkpointPolicy": "v2", "delta.checkpointInterval": "4"})
        snap = Snapshot.load(str(path))
        assert "v2Checkpoint" in (snap.protocol.reader_features or ()) and "v2Checkpoint" in (snap.protocol.writer_features or ())
        for i in range(5):
            t.append(pa.table({"id": pa.array([i], pa.int64()), "s": [f"r{i}"]}))
        t.delete("id = 0")
        t.wait_published(t.last_committed_version or 0)
        _wait_for(lambda: 4 in _v2_checkpoints(path) and checkpoint_exists(str(path), 4), "the coordinator's V2 checkpoint at 4")
    assert not (path / "_delta_log" / f"{4:020d}.checkpoint.parquet").exists(), "a V2 table gets no classic checkpoint"

    # Version 6 by hand with two file actions per sidecar: 4 adds and the DELETE's remove in 3 sidecars.
    result = write_checkpoint(str(path), 6, checkpoint_actions(str(path), 6), sidecar_rows=2)
    top = pq.read_table(path / "_delta_log" / _v2_checkpoints(path)[6])
    assert result.file.key.endswith(_v2_checkpoints(path)[6])
    assert top.column("checkpointMetadata").drop_null().to_pylist() == [{"version": 6, "tags": None}]
    sidecars = [r["path"] for r in top.column("sidecar").drop_null().to_pylist()]
    assert len(sidecars) == 3 and top.column("add").null_count == top.num_rows
    side_rows = [pq.read_table(path / "_delta_log" / "_sidecars" / s) for s in sidecars]
    assert sum(x.num_rows for x in side_rows) == 5 and all(x.schema.names == ["add", "remove"] for x in side_rows)
    assert max(list_log(str(path)).checkpoints) == 6

    expected = [(i, f"r{i}") for i in range(1, 5)]
    for v in range(6):  # log cleanup keeps the checkpoint's own commit (PROTOCOL.md "Metadata Cleanup")
        (path / "_delta_log" / f"{v:020d}.json").unlink()
    ours = Snapshot.load(str(path))
    assert ours.version == 6 and sorted(tuple(r.values()) for r in ours.to_pyarrow().to_pylist()) == expected
    theirs = DeltaTable(str(path))
    assert theirs.version() == 6
    rs = pa.table(QueryBuilder().register("t", theirs).execute("SELECT id, s FROM t").read_all())
    assert sorted(tuple(r.values()) for r in rs.to_pylist()) == expected
    got = sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).collect())
    assert got == expected
