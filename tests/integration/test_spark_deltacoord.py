"""The `deltacoord` PySpark data source against a real broker, a real coordinator and Spark with Delta Lake.

One Spark session for the module (child driver processes start their own), one
coordinator serving both a local directory and a bucket of the local S3 server.
The sink's exactly-once restart, its commit protocol and Delta Lake on Spark
reading every version run on both; on S3 the sink takes `storage.<key>` options
and Delta on Spark reads the table as `s3a://`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.errors import ConcurrentTransactionException
from deltacoord.schemas.routing import Topics
from deltacoord.writer import spark_sink
from deltacoord.writer.spark_sink import DeltaCoordStreamWriter, SinkOptions, StagePlan, ensure_table
from deltacoord.writer.table import Table
from tests.conftest import StoreServer, TablePlace
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.spark_harness import REPO, shared_session, spark_environ

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ROW_SCHEMA = StructType([StructField("id", LongType()), StructField("value", StringType())])


@pytest.fixture(scope="module")
def spark(s3_server: StoreServer) -> SparkSession:
    s = shared_session(s3=s3_server.storage_options)
    spark_sink.register(s)
    return s


class Env:
    def __init__(self, bootstrap: str, topics: Topics, coord: Coordinator, s3: TablePlace) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.prefix = topics.proposals.removesuffix(".proposals")
        self.coord = coord
        self.s3 = s3

    def place(self, kind: str, tmp_path: Path) -> TablePlace:
        """Where a test's tables live: its own directory, or (a test's own prefix of) the module's bucket."""
        return TablePlace("local", str(tmp_path)) if kind == "local" else \
            TablePlace("s3", f"{self.s3.root}/{tmp_path.name}", self.s3.storage_options)

    def published(self) -> None:
        assert self.coord.wait_published(30)

    def table(self, path: Path | str, storage_options: dict[str, str] | None = None) -> Table:
        return Table(path, self.bootstrap, topics=self.topics, storage_options=storage_options)

    def sink(self, df: DataFrame, path: Path | str, checkpoint: Path, storage_options: dict[str, str] | None = None,
             **options: str) -> Any:
        w = (df.writeStream.format("deltacoord").option("path", str(path)).option("bootstrap.servers", self.bootstrap)
             .option("topic.prefix", self.prefix).option("checkpointLocation", str(checkpoint)))
        for k, v in {**{f"storage.{k}": v for k, v in (storage_options or {}).items()}, **options}.items():
            w = w.option(k, v)
        return w.trigger(availableNow=True).start()


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, s3_server: StoreServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    topics = fresh_topics(kafka_bootstrap)
    bucket = s3_server.new_bucket()
    s3 = TablePlace("s3", bucket.root, bucket.storage_options)
    roots = (str(tmp_path_factory.getbasetemp()), bucket.root)
    with coordinator_thread(kafka_bootstrap, topics, table_roots=roots, storage_options=bucket.storage_options) as coord:
        yield Env(kafka_bootstrap, topics, coord, s3)


def _rows(t: pa.Table, cols: list[str] | None = None) -> list[tuple[Any, ...]]:
    cols = cols or t.column_names
    return sorted(tuple(r[c] for c in cols) for r in t.to_pylist())


def _spark_rows(df: DataFrame, cols: list[str]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in cols) for r in df.collect())


def _json_files(d: Path, files: int, rows: int) -> list[int]:
    d.mkdir(parents=True)
    ids = []
    for f in range(files):
        lines = []
        for j in range(rows):
            i = f * rows + j
            ids.append(i)
            lines.append(json.dumps({"id": i, "value": f"v{i}"}))
        (d / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    return ids


# --------------------------------------------------------------------------- (1) SIGKILL and restart


def _run_child(args: dict[str, Any], log: Path, timeout: float = 240) -> int:
    code = "from tests.integration.spark_harness import child_main; child_main()"
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(args)], cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                env=spark_environ(), start_new_session=True)
        try:
            return proc.wait(timeout)
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: its JVM and workers
            proc.wait(10)


@pytest.mark.parametrize("kind", ["local", "s3"])
@pytest.mark.slow
def test_stream_killed_between_decision_and_spark_commit_log_restarts_exactly_once(env: Env, tmp_path: Path,
                                                                                   kind: str) -> None:
    place = env.place(kind, tmp_path)
    opts = place.storage_options
    ids = _json_files(tmp_path / "src", files=6, rows=25)
    table, metrics = place.uri("table"), tmp_path / "metrics.jsonl"
    args = {"source": str(tmp_path / "src"), "table": table, "bootstrap": env.bootstrap, "prefix": env.prefix,
            "checkpoint": str(tmp_path / "ckpt"), "metrics": str(metrics), "marker": str(tmp_path / "crashed"),
            "crash_after_batch": 2, "storage_options": opts}
    log = tmp_path / "child.log"
    rc = _run_child(args, log)
    assert rc == -signal.SIGKILL, f"the first run should have been SIGKILLed (rc={rc}); log:\n{log.read_text()[-4000:]}"
    assert (tmp_path / "crashed").exists()
    env.published()
    snap = Snapshot.load(table, storage_options=opts)
    assert max(snap.app_versions.values()) == 2  # batches 0..2 committed in Kafka, Spark recorded only 0..1
    assert not (tmp_path / "ckpt" / "commits" / "2").exists()

    rc = _run_child({**args, "crash_after_batch": -1}, log)
    assert rc == 0, log.read_text()[-4000:]
    env.published()
    snap = Snapshot.load(table, storage_options=opts)
    got = sorted(snap.to_pyarrow().column("id").to_pylist())
    assert got == ids  # every row exactly once
    assert list(snap.app_versions.values()) == [5]
    entries = [json.loads(line) for line in metrics.read_text().splitlines()]
    second = [e for e in entries if e["batchId"] == 2]
    assert len(second) == 2 and (second[1].get("skipped") or second[1].get("duplicate")), entries
    # No staged file of the replayed batch is left behind as an orphan.
    data_files = {o.key for o in place.storage(table).list() if o.key.endswith(".parquet") and "_delta_log" not in o.key}
    assert data_files == set(snap.file_paths())


# --------------------------------------------------------------------------- (2) table -> transform -> table


@pytest.mark.slow
def test_pipeline_between_two_coordinated_tables(spark: SparkSession, env: Env, tmp_path: Path) -> None:
    src_path, dst_path = tmp_path / "src", tmp_path / "dst"
    src = env.table(src_path)
    src.create(pa.schema([("id", pa.int64()), ("grp", pa.string()), ("value", pa.string())]), partition_by=["grp"])
    for k in range(3):
        src.append(pa.table({"id": list(range(k * 10, k * 10 + 10)), "grp": [f"g{i % 2}" for i in range(10)],
                             "value": [f"v{k}"] * 10}))
    env.published()

    def run() -> None:
        # The source follows the commits topic (bootstrap.servers given): versions as soon as they are decided.
        df = (spark.readStream.format("deltacoord").option("bootstrap.servers", env.bootstrap).option("topic.prefix", env.prefix)
              .option("maxFilesPerTrigger", "2").load(str(src_path)))
        out = df.where("id % 3 != 0").selectExpr("id", "id * 10 AS id10", "upper(value) AS value", "grp")
        q = env.sink(out, dst_path, tmp_path / "ckpt", partitionBy="grp")
        q.awaitTermination(180)
        assert q.exception() is None, q.exception()

    def expected() -> list[tuple[Any, ...]]:
        rows = Snapshot.load(str(src_path)).to_pyarrow().to_pylist()
        return sorted((r["id"], r["id"] * 10, r["value"].upper(), r["grp"]) for r in rows if r["id"] % 3 != 0)

    run()
    env.published()
    cols = ["id", "id10", "value", "grp"]
    assert _rows(Snapshot.load(str(dst_path)).to_pyarrow(), cols) == expected()
    src.append(pa.table({"id": list(range(30, 40)), "grp": ["g2"] * 10, "value": ["late"] * 10}))
    run()  # the same checkpoint: only the new version flows
    env.published()
    dst = Snapshot.load(str(dst_path))
    assert _rows(dst.to_pyarrow(), cols) == expected()
    assert dst.partition_columns == ["grp"]
    src.close()


# --------------------------------------------------------------------------- (3) schema change stops the source


def test_source_stops_at_add_columns_and_continues_after_restart(spark: SparkSession, env: Env, tmp_path: Path) -> None:
    src_path, dst_path, ckpt = tmp_path / "src", tmp_path / "dst", tmp_path / "ckpt"
    src = env.table(src_path)
    src.create(pa.schema([("id", pa.int64()), ("value", pa.string())]))
    src.append(pa.table({"id": list(range(10)), "value": ["a"] * 10}))
    src.append(pa.table({"id": list(range(10, 20)), "value": ["b"] * 10}))
    env.published()
    stale = spark.readStream.format("deltacoord").option("startingVersion", "0").load(str(src_path))
    q = env.sink(stale, dst_path, ckpt)
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()

    change = src.add_columns([pa.field("extra", pa.string())])
    src.append(pa.table({"id": list(range(20, 30)), "value": ["c"] * 10, "extra": [f"x{i}" for i in range(20, 30)]}))
    env.published()
    q = env.sink(stale, dst_path, ckpt)  # the running query's schema has no `extra`
    with pytest.raises(StreamingQueryException) as ei:
        q.awaitTermination(180)
    assert "MetadataChangedException" in str(ei.value), ei.value
    assert f"schema change in version {change.version}" in str(ei.value)
    env.published()
    assert Snapshot.load(str(dst_path)).to_pyarrow().num_rows == 20  # everything before the change was delivered

    dst = env.table(dst_path)
    dst.add_columns([pa.field("extra", pa.string())])
    env.published()
    fresh = spark.readStream.format("deltacoord").option("startingVersion", "0").load(str(src_path))
    assert "extra" in fresh.columns
    q = env.sink(fresh, dst_path, ckpt)  # restart: same checkpoint, new schema
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    env.published()
    rows = _rows(Snapshot.load(str(dst_path)).to_pyarrow(), ["id", "value", "extra"])
    assert rows == sorted([(i, "a" if i < 10 else "b", None) for i in range(20)] + [(i, "c", f"x{i}") for i in range(20, 30)])
    src.close()
    dst.close()


# --------------------------------------------------------------------------- (4) Delta Lake on Spark reads every version


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_delta_spark_reads_every_version_written_by_the_sink(spark: SparkSession, env: Env, tmp_path: Path,
                                                             kind: str) -> None:
    place = env.place(kind, tmp_path)
    opts = place.storage_options
    storage = {f"storage.{k}": v for k, v in opts.items()}
    _json_files(tmp_path / "in", files=3, rows=8)
    path = place.uri("t")
    # Delta Lake on Spark reads an S3 table through Hadoop's S3A filesystem.
    delta_path = path if place.is_local else "s3a://" + path.removeprefix("s3://")
    df = spark.readStream.schema(ROW_SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    df = df.selectExpr("id", "value", "CAST(id % 3 AS STRING) AS part")
    q = env.sink(df, path, tmp_path / "ckpt", opts, partitionBy="part")
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    batch = spark.createDataFrame([(100, "over", "1"), (101, "over", "1")], "id long, value string, part string")
    (batch.write.format("deltacoord").option("bootstrap.servers", env.bootstrap).option("topic.prefix", env.prefix)
     .options(**storage).option("replaceWhere", "part = '1'").mode("overwrite").save(path))
    more = spark.createDataFrame([(200, "more", "2")], "id long, value string, part string")
    (more.write.format("deltacoord").option("bootstrap.servers", env.bootstrap).option("topic.prefix", env.prefix)
     .options(**storage).mode("append").save(path))
    env.published()
    latest = Snapshot.load(path, storage_options=opts).version
    assert latest == 5  # create, 3 micro-batches, replaceWhere overwrite, append
    cols = ["id", "value", "part"]
    for v in range(latest + 1):
        ours = _rows(Snapshot.load(path, version=v, storage_options=opts).to_pyarrow(), cols)
        delta = _spark_rows(spark.read.format("delta").option("versionAsOf", v).load(delta_path), cols)
        via_source = _spark_rows(spark.read.format("deltacoord").options(**storage).option("versionAsOf", v).load(path), cols)
        assert delta == ours == via_source, f"version {v}"
    final = _rows(Snapshot.load(path, storage_options=opts).to_pyarrow(), cols)
    assert (100, "over", "1") in final and not any(r[2] == "1" and r[0] < 100 for r in final)
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{delta_path}`").select("version", "operation").collect()
    assert {r["operation"] for r in hist} >= {"STREAMING UPDATE", "WRITE", "CREATE TABLE"}


# --------------------------------------------------------------------------- commit protocol, without a query


def _writer(env: Env, path: Path | str, checkpoint: str, app_id: str | None = None,
            storage_options: dict[str, str] | None = None) -> DeltaCoordStreamWriter:
    opts = {"path": str(path), "bootstrap.servers": env.bootstrap, "topic.prefix": env.prefix, "checkpointLocation": checkpoint,
            **{f"storage.{k}": v for k, v in (storage_options or {}).items()}}
    if app_id:
        opts["appId"] = app_id
    so = SinkOptions.parse(opts)
    snap = ensure_table(so, ROW_SCHEMA)
    return DeltaCoordStreamWriter(so, StagePlan(so.uri, snap.schema(), tuple(snap.partition_columns), None,
                                                so.storage_options), overwrite=False)


def _stage(w: DeltaCoordStreamWriter, ids: list[int]) -> spark_sink.DeltaCoordCommitMessage:
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "value": [f"v{i}" for i in ids]})
    return w.write(iter([batch]))


class _Stale:
    """Make every sink commit read the given snapshot (as if publication lagged behind Kafka)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, snap: Snapshot, barrier: threading.Barrier | None = None) -> None:
        def snapshot(table: Table, version: int | None = None, **_: object) -> Snapshot:
            if barrier is not None:
                barrier.wait(30)
            return snap

        monkeypatch.setattr(Table, "snapshot", snapshot)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_replayed_batch_is_answered_by_its_proposal_id(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       kind: str) -> None:
    place = env.place(kind, tmp_path)
    opts = place.storage_options
    path = place.uri("t")
    w = _writer(env, path, str(tmp_path / "ckpt"), app_id="q1", storage_options=opts)
    before = Snapshot.load(path, storage_options=opts)
    w.commit([_stage(w, [1, 2])], 0)
    env.published()
    # The query died before Spark's commit log; publication lags, so the replay still sees the old snapshot.
    _Stale(monkeypatch, before)
    replay = _stage(w, [1, 2])
    w.commit([replay], 0)
    monkeypatch.undo()
    env.published()
    snap = Snapshot.load(path, storage_options=opts)
    assert sorted(snap.to_pyarrow().column("id").to_pylist()) == [1, 2]
    assert snap.version == before.version + 1
    for add in replay.adds:
        assert not place.exists(path, json.loads(add)["path"])  # the replay's staged files were deleted


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_two_queries_sharing_an_app_id_conflict(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    place = env.place(kind, tmp_path)
    opts = place.storage_options
    path = place.uri("t")
    a = _writer(env, path, str(tmp_path / "ckpt-a"), app_id="shared", storage_options=opts)
    b = _writer(env, path, str(tmp_path / "ckpt-b"), app_id="shared", storage_options=opts)
    a.commit([_stage(a, [1])], 0)
    env.published()
    base = Snapshot.load(path, storage_options=opts)
    ma, mb = _stage(a, [2]), _stage(b, [3])
    _Stale(monkeypatch, base, threading.Barrier(2))
    errors: list[BaseException] = []

    def commit(w: DeltaCoordStreamWriter, m: spark_sink.DeltaCoordCommitMessage) -> None:
        try:
            w.commit([m], 1)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=commit, args=(a, ma)), threading.Thread(target=commit, args=(b, mb))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    monkeypatch.undo()
    assert len(errors) == 1 and isinstance(errors[0], ConcurrentTransactionException), errors
    env.published()
    snap = Snapshot.load(path, storage_options=opts)
    assert snap.app_versions == {"shared": 1}
    assert len(snap.to_pyarrow().column("id").to_pylist()) == 2
