"""Delta on Spark reads `maxcompute` tables with deletion vectors, where the coordinator moved an UPDATE/DELETE's
rows through a compaction's row map (either order), with the rows our reader sees.

The cells where rows move (an UPDATE/DELETE and a compaction of the same files, both orders, and the
seed's own UPDATE/compaction cells) are played as in `test_maxcompute_profile`, which has delta-rs read
every version of all 25 cells and their variants; the other cells make ordinary Delta commits that Spark
reads in other tests. Spark reads every version of the first table, and of each other table the
versions the two jobs made (the versions before are the same seeding, written alone): a Spark read
costs about two seconds here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from deltacoord.reader.snapshot import Snapshot
from tests.conftest import TablePlace
from tests.integration.test_maxcompute_profile import MA, MI, SHARED, UD, run_cell
from tests.integration.test_writer_operations import Env, rows, running_env

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

#: The cells whose rows move through a compaction's row map: the seed's UPDATE/compaction cells and the
#: variants sharing files.
CELLS = [(UD, MI), (MI, UD), (MA, UD), *SHARED]


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "one-partition"])
def test_delta_spark_reads_every_version_of_every_cell(spark: SparkSession, env: Env, tmp_path: Path,
                                                       partitioned: bool) -> None:
    for i, (earlier, later) in enumerate(CELLS):
        s = run_cell(env, tmp_path / f"t{i}", partitioned, earlier, later, "2024-01-01", dvs=True)  # delta-rs too
        root = str(s.t.root)
        latest = Snapshot.load(root).version
        for v in range(latest + 1 if i == 0 else latest - 1, latest + 1):
            ours = rows(Snapshot.load(root, version=v).to_pyarrow())
            theirs = sorted(tuple(r) for r in spark.read.format("delta").option("versionAsOf", v).load(root)
                            .select("id", "date", "value").collect())
            assert theirs == ours, f"{earlier} then {later}: version {v} differs between Delta on Spark and deltacoord"
