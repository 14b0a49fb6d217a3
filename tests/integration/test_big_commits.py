"""Commits of any size: actions too large for a Kafka message travel by reference (`deltacoord.schemas.staged`).

Real files throughout (copies of one written Parquet file under new names, so that writing tens of thousands
costs seconds), read back by delta-rs and by Delta on Spark.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import checkpoint_exists, read_last_checkpoint
from deltacoord.schemas.actions import AddFile, parse_commit
from deltacoord.schemas.errors import ConcurrentDeleteReadException, InvalidProposalError
from deltacoord.schemas.routing import Topics
from deltacoord.schemas.staged import STAGED_DIR
from deltacoord.storage.table import TableStorage
from deltacoord.writer import staging
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import Transaction
from tests.integration.coord_harness import coordinator_thread, fresh_topics, start_coordinator_process

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

COLUMNS = 20
SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()),
                    *[(f"c{i:02d}", pa.float64()) for i in range(COLUMNS - 2)]])


def one_row(i: int) -> pa.Table:
    return pa.table({"id": [i], "date": ["2026-11-27"], **{f"c{j:02d}": [i + j / 10] for j in range(COLUMNS - 2)}},
                    schema=SCHEMA)


def file_copies(t: Table, n: int, tag: str) -> list[AddFile]:
    """`n` real one-row Parquet files: one written, copied under `n` names; their adds (stats of all 20 columns)."""
    root = Path(t.storage.local_path())
    (first,) = staging.write_data_files(t.storage, one_row(7), [])
    data = (root / unquote(first.path)).read_bytes()
    (root / unquote(first.path)).unlink()
    adds = []
    for i in range(n):
        path = f"part-{tag}-{i:06d}.parquet"
        (root / path).write_bytes(data)
        adds.append(replace(first, path=path))
    return adds


def delta_rs_count(root: Path, version: int | None = None) -> tuple[int, int]:
    """(rows, sum of ids) as delta-rs's query engine reads the files of the table (or of one version)."""
    t = pa.table(QueryBuilder().register("t", DeltaTable(str(root), version=version))
                 .execute("SELECT count(*) AS n, sum(id) AS s FROM t").read_all())
    return t.column("n")[0].as_py(), t.column("s")[0].as_py() or 0


def _staged_files(root: Path) -> list[str]:
    d = root / STAGED_DIR
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def _decisions(bootstrap: str, topics: Topics) -> list:  # type: ignore[type-arg]
    return list(read_decisions(CoordinatorSettings(bootstrap_servers=bootstrap, topics=topics, group_id="verify"), 0))


@pytest.fixture
def topics(kafka_bootstrap: str) -> Topics:
    return fresh_topics(kafka_bootstrap)


@pytest.fixture
def served(kafka_bootstrap: str, topics: Topics) -> Iterator[None]:
    with coordinator_thread(kafka_bootstrap, topics):
        yield


@pytest.mark.spark
def test_a_20000_file_append_of_a_20_column_table_commits_by_reference(
        kafka_bootstrap: str, topics: Topics, served: None, tmp_path: Path, spark: SparkSession) -> None:
    root = tmp_path / "wide"
    with Table(root, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA)
        tx = t.begin()
        tx.stage(file_copies(t, 20_000, "a"))
        result = tx.commit("WRITE", parameters={"mode": "Append"})
    assert result.version == 1
    (create, append) = [d for d in _decisions(kafka_bootstrap, topics)]
    assert create.staged is None, "a small commit stays inline"
    assert append.staged is not None and append.staged.count == 20_001, "the whole commit, commitInfo first, by reference"
    assert len(append.actions) == 1, "only the commitInfo is inline on the commits topic"
    published = (root / "_delta_log" / f"{1:020d}.json").read_bytes()
    assert hashlib.sha256(published).hexdigest() == append.staged.sha256, "the version holds the ratified bytes"
    assert sum(1 for a in parse_commit(published) if isinstance(a, AddFile)) == 20_000
    assert _staged_files(root) == [], "the writer's and the coordinator's staged files are gone once published"
    assert delta_rs_count(root) == (20_000, 7 * 20_000)
    assert spark.read.format("delta").load(str(root)).count() == 20_000


@pytest.mark.spark
def test_an_overwrite_removing_50000_live_files_commits(kafka_bootstrap: str, topics: Topics, served: None,
                                                        tmp_path: Path, spark: SparkSession) -> None:
    root = tmp_path / "big"
    with Table(root, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA)
        tx = t.begin()
        tx.stage(file_copies(t, 50_000, "b"))
        assert tx.commit("WRITE", parameters={"mode": "Append"}).version == 1
        assert t.overwrite(pa.concat_tables([one_row(1), one_row(2), one_row(3)])).version == 2
    removes = [a for a in parse_commit((root / "_delta_log" / f"{2:020d}.json").read_bytes()) if a.__class__.__name__ == "RemoveFile"]
    assert len(removes) == 50_000, "every live file is removed"
    assert sorted(DeltaTable(str(root)).to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]
    assert sorted(r["id"] for r in spark.read.format("delta").load(str(root)).select("id").collect()) == [1, 2, 3]
    assert len(DeltaTable(str(root), version=1).file_uris()) == 50_000
    assert _staged_files(root) == []


@pytest.mark.spark
def test_a_large_version_is_checkpointed_and_read_from_its_checkpoint(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, spark: SparkSession) -> None:
    """A version of at least `checkpoint_after_actions` actions is checkpointed whatever its number (here 1, the
    interval 10): the overwrite after it reads the table's files from the checkpoint, and delta-rs and Delta on
    Spark read the table with the JSON versions up to it deleted, from the checkpoint alone."""
    root = tmp_path / "checkpointed"
    with coordinator_thread(kafka_bootstrap, topics, checkpoint_fn=create_checkpoint,
                            settings_overrides={"checkpoint_after_actions": 10_000}), \
            Table(root, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA)
        tx = t.begin()
        tx.stage(file_copies(t, 12_000, "k"))
        assert tx.commit("WRITE", parameters={"mode": "Append"}).version == 1
        deadline = time.monotonic() + 120
        while read_last_checkpoint(TableStorage(root.as_uri())) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        last = read_last_checkpoint(TableStorage(root.as_uri()))
        assert last is not None and last.version == 1, "version 1 is checkpointed, though the interval is 10"
        assert not checkpoint_exists(TableStorage(root.as_uri()), 0)
        snapshot = t.snapshot()
        assert snapshot.num_files == 12_000 and any(isinstance(p, pa.Array) for p in snapshot.file_parts()), \
            "the writer reads the files from the checkpoint's Arrow column"
        assert t.overwrite(pa.concat_tables([one_row(1), one_row(2)])).version == 2
    added = pq.read_table(root / "_delta_log" / f"{1:020d}.checkpoint.parquet", columns=["add"]).column("add")
    assert added.drop_null().length() == 12_000
    for v in (0, 1):
        (root / "_delta_log" / f"{v:020d}.json").unlink()
    assert sorted(DeltaTable(str(root)).to_pyarrow_table().column("id").to_pylist()) == [1, 2]
    assert sorted(r["id"] for r in spark.read.format("delta").load(str(root)).select("id").collect()) == [1, 2]
    assert len(DeltaTable(str(root), version=1).file_uris()) == 12_000, "version 1 from its checkpoint alone"


def test_a_staged_file_altered_after_proposing_is_refused_by_digest(
        kafka_bootstrap: str, topics: Topics, served: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "altered"
    stage = Transaction._by_reference

    def altered(self: Transaction, p):  # type: ignore[no-untyped-def]
        out = stage(self, p)
        assert self.staged_commit is not None
        path = root / self.staged_commit
        path.write_bytes(path.read_bytes().replace(b"part-c-000001.parquet", b"part-c-999999.parquet"))
        return out

    with Table(root, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA)
        monkeypatch.setattr(Transaction, "_by_reference", altered)
        tx = t.begin()
        adds = file_copies(t, 2_000, "c")
        tx.stage(adds)
        with pytest.raises(InvalidProposalError) as e:
            tx.commit("WRITE", parameters={"mode": "Append"})
        assert e.value.reason == "STAGED_COMMIT_INVALID"
        assert "SHA-256" in str(e.value)
        monkeypatch.undo()
        assert t.snapshot().version == 0, "nothing committed"
    assert _staged_files(root) == [], "the rejected proposal's staged actions are deleted"
    assert not any((root / a.path).exists() for a in adds), "and so are its data files"


def test_a_rejected_proposal_by_reference_leaves_no_staged_file(kafka_bootstrap: str, topics: Topics, served: None,
                                                                tmp_path: Path) -> None:
    root = tmp_path / "rejected"
    with Table(root, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA)
        t.append(one_row(1))
        (old,) = t.snapshot().files()
        tx = t.begin()  # rewrites the file into 2,000 ...
        tx.read_file(old)
        tx.remove(old)
        adds = file_copies(t, 2_000, "d")
        tx.stage(adds)
        t.delete("id = 1")  # ... but a DELETE removes it first
        with pytest.raises(ConcurrentDeleteReadException):
            tx.commit("UPDATE", parameters={"predicate": "[]"})
    assert _staged_files(root) == []
    assert not any((root / a.path).exists() for a in adds)
    assert DeltaTable(str(root)).to_pyarrow_table().num_rows == 0


def test_a_crash_between_ratifying_and_publishing_republishes_the_identical_version(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    root = tmp_path / "crash"
    # The second transaction the coordinator records is the large commit: it is killed right after it.
    first = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0",
                                      env={"DELTACOORD_FAULT": "after_kafka_commit:2"})
    second = None
    try:
        with Table(root, kafka_bootstrap, topics=topics, decision_timeout_s=180, coordinator_check=False) as t:
            t.create(SCHEMA)
            tx = t.begin()
            tx.stage(file_copies(t, 5_000, "e"))
            out: dict[str, object] = {}
            th = threading.Thread(target=lambda: out.update(r=tx.commit("WRITE", parameters={"mode": "Append"})))
            th.start()
            first.proc.wait(120)
            assert first.proc.returncode == -9, "the fault point was reached"
            assert not (root / "_delta_log" / f"{1:020d}.json").exists(), "ratified, not published"
            staged = _staged_files(root)
            assert [n[:2] for n in staged].count("d-") == 1, "the coordinator staged the commit before ratifying it"
            second = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
            th.join(180)
            assert getattr(out.get("r"), "version", None) == 1
    finally:
        if second is not None:
            second.kill(15)
        if first.alive():
            first.kill()
    (_create, append) = _decisions(kafka_bootstrap, topics)
    assert append.staged is not None
    published = (root / "_delta_log" / f"{1:020d}.json").read_bytes()
    assert hashlib.sha256(published).hexdigest() == append.staged.sha256, "republished byte for byte"
    assert _staged_files(root) == []
    assert delta_rs_count(root) == (5_000, 7 * 5_000)


@pytest.mark.spark
def test_a_spark_batch_write_of_5000_files_commits_through_the_sink(
        kafka_bootstrap: str, topics: Topics, served: None, tmp_path: Path, spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    from deltacoord.writer import spark_sink

    spark_sink.register(spark)
    root = tmp_path / "spark"
    n = 5_000
    # One row per partition value: two tasks write 5,000 files (one per partition directory).
    df = spark.range(n, numPartitions=2).select(
        F.col("id"), (F.col("id") % n).cast("string").alias("part"),
        *[(F.col("id") + j / 10).alias(f"c{j:02d}") for j in range(COLUMNS - 2)])
    (df.write.format("deltacoord").options(**{"bootstrap.servers": kafka_bootstrap,
                                              "topic.prefix": topics.proposals.removesuffix(".proposals")})
     .partitionBy("part").mode("append").save(str(root)))
    decisions = _decisions(kafka_bootstrap, topics)
    assert any(d.staged is not None for d in decisions), "the sink's commit went by reference"
    adds = [a for a in parse_commit((root / "_delta_log" / f"{decisions[-1].version:020d}.json").read_bytes())
            if isinstance(a, AddFile)]
    assert len(adds) == n
    assert delta_rs_count(root) == (n, n * (n - 1) // 2)
    assert spark.read.format("delta").load(str(root)).count() == n
    assert _staged_files(root) == []


@pytest.mark.spark
def test_an_optimize_rewriting_20000_files_commits(kafka_bootstrap: str, topics: Topics, served: None,
                                                   tmp_path: Path, spark: SparkSession) -> None:
    root = tmp_path / "optimize"
    n = 20_000
    with Table(root, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA)
        tx = t.begin()
        tx.stage(file_copies(t, n, "f"))
        assert tx.commit("WRITE", parameters={"mode": "Append"}).version == 1
        result = t.optimize()
        assert result.version == 2
        assert len(t.snapshot().files()) == 1
    commit = parse_commit((root / "_delta_log" / f"{2:020d}.json").read_bytes())
    assert sum(1 for a in commit if a.__class__.__name__ == "RemoveFile") == n
    assert delta_rs_count(root) == (n, 7 * n)
    assert spark.read.format("delta").load(str(root)).count() == n
    assert _staged_files(root) == []


def test_the_change_feed_verify_and_ratified_reads_resolve_a_commit_by_reference(
        kafka_bootstrap: str, topics: Topics, served: None, tmp_path: Path) -> None:
    from deltacoord.coordinator.delta_log.verify import verify_table
    from deltacoord.reader.stream import CommitStream

    root = tmp_path / "feed"
    with Table(root, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA)
        tx = t.begin()
        adds = file_copies(t, 2_000, "g")
        tx.stage(adds)
        assert tx.commit("WRITE", parameters={"mode": "Append"}, wait="ratified").version == 1
        assert len(t.snapshot(ratified=True).files()) == 2_000, "read-your-writes through the commits topic"
        events = []
        with CommitStream(str(root), kafka_bootstrap, topics=topics, include_all_commits=True) as stream:
            for _ in range(120):  # a minute at most, then the assertion below says what came
                events.extend(stream.poll(0.5))
                if len(events) >= 2:
                    break
        assert [e.version for e in events] == [0, 1]
        assert {a.path for a in events[1].added} == {a.path for a in adds}, "the feed carries the whole commit"
        t.append(one_row(1))
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    rep = verify_table(settings, str(root), t.table_id)
    assert rep.ok, rep.problems
    assert rep.topic_versions == 3 and rep.published_versions == 3
