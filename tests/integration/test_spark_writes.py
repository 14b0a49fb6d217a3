"""Spark writes as Delta users write them: save modes, `.partitionBy`, options checked before staging, staged files.

Against a real broker, a coordinator in this process and Spark with Delta Lake
(which reads what the sink wrote). Every refused write is shown to leave no
staged file behind and the table's version unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
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
from deltacoord.schemas.errors import CommitOutcomeUnknownError
from deltacoord.writer import spark_sink
from deltacoord.writer.spark_options import BOOTSTRAP_ENV, TOPIC_PREFIX_ENV, SinkConfigError
from deltacoord.writer.spark_save_modes import CatalogTableError, PartitioningMismatchError, PathExistsError
from deltacoord.writer.spark_sink import DeltaCoordBatchWriter, DeltaCoordCommitMessage, DeltaCoordDataSource
from deltacoord.writer.transaction import Transaction
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.spark_harness import shared_session

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SCHEMA = StructType([StructField("id", LongType()), StructField("date", StringType()), StructField("kind", StringType())])
REPO = Path(__file__).resolve().parents[2]


class Env:
    def __init__(self, bootstrap: str, prefix: str, coord: Coordinator) -> None:
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.coord = coord

    def options(self, **extra: str) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap, "topic.prefix": self.prefix, **extra}


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    topics = fresh_topics(kafka_bootstrap)
    roots = (str(tmp_path_factory.getbasetemp()),)
    with coordinator_thread(kafka_bootstrap, topics, table_roots=roots) as coord:
        yield Env(kafka_bootstrap, topics.proposals.removesuffix(".proposals"), coord)


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    s = shared_session()
    spark_sink.register(s)
    return s


@pytest.fixture(autouse=True)
def _no_deltacoord_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The options the tests give are the only ones (a developer's DELTACOORD_* must not leak in)."""
    monkeypatch.delenv(BOOTSTRAP_ENV, raising=False)
    monkeypatch.delenv(TOPIC_PREFIX_ENV, raising=False)


def _events(spark: SparkSession, rows: list[tuple[int, str, str]]) -> DataFrame:
    return spark.createDataFrame(rows, SCHEMA)


def _parquet(table: Path) -> set[str]:
    """Every data file under the table root, staged or committed."""
    return {str(p.relative_to(table)) for p in table.rglob("*.parquet") if "_delta_log" not in p.parts} if table.exists() else set()


def _rows(path: Path) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["date"], r["kind"]) for r in Snapshot.load(str(path)).to_pyarrow().to_pylist())


def _save(df: DataFrame, path: Path, options: dict[str, str], mode: str | None = None, partition_by: list[str] | None = None) -> None:
    w = df.write.format("deltacoord").options(**options)
    if mode is not None:
        w = w.mode(mode)
    if partition_by is not None:
        w = w.partitionBy(*partition_by)
    w.save(str(path))


# --------------------------------------------------------------------------- .partitionBy


def test_partition_by_partitions_a_new_table_and_must_match_an_existing_one(spark: SparkSession, env: Env,
                                                                           tmp_path: Path) -> None:
    path = tmp_path / "events"
    first = [(1, "2024-01-01", "click"), (2, "2024-01-02", "view")]
    _save(_events(spark, first), path, env.options(), partition_by=["date"])  # the default mode: a new table
    snap = Snapshot.load(str(path))
    assert snap.partition_columns == ["date"]
    assert {p.split("/")[0] for p in _parquet(path)} == {"date=2024-01-01", "date=2024-01-02"}
    delta = sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).select("id", "date", "kind").collect())
    assert delta == sorted(first)

    _save(_events(spark, [(3, "2024-01-03", "click")]), path, env.options(), "append", ["DATE"])  # the same, any case
    _save(_events(spark, [(4, "2024-01-03", "view")]), path, env.options(), "append")  # none: the table's
    assert _rows(path) == sorted([*first, (3, "2024-01-03", "click"), (4, "2024-01-03", "view")])

    version, files = Snapshot.load(str(path)).version, _parquet(path)
    for mode in ("append", "overwrite"):
        with pytest.raises(PartitioningMismatchError) as ei:
            _save(_events(spark, [(5, "2024-01-04", "x")]), path, env.options(), mode, ["kind"])
        assert "[DELTA_METADATA_MISMATCH]" in str(ei.value) and "Given: ['kind']; table: ['date']" in str(ei.value)
    with pytest.raises(PartitioningMismatchError):
        _save(_events(spark, [(5, "2024-01-04", "x")]), path, env.options(partitionBy="kind"), "append")
    assert Snapshot.load(str(path)).version == version and _parquet(path) == files  # nothing staged, nothing committed


def test_the_sink_refuses_what_delta_refuses_instead_of_casting_silently(spark: SparkSession, env: Env,
                                                                         tmp_path: Path) -> None:
    path = tmp_path / "events"
    _save(_events(spark, [(1, "2024-01-01", "click")]), path, env.options())
    version = Snapshot.load(str(path)).version
    text_ids = spark.createDataFrame([("5", "2024-01-02", "view")], "id string, date string, kind string")
    with pytest.raises(Exception, match=r"column 'id' is int64 in the table but the data has string"):
        _save(text_ids, path, env.options(), "append")
    assert Snapshot.load(str(path)).version == version and _rows(path) == [(1, "2024-01-01", "click")]


def test_save_as_table_is_refused_with_the_way_to_name_a_path_table(spark: SparkSession, env: Env,
                                                                    tmp_path: Path) -> None:
    df = _events(spark, [(1, "2024-01-01", "click")])
    for write in (lambda: df.write.format("deltacoord").options(**env.options()).saveAsTable("events"),
                  lambda: df.write.options(**env.options()).saveAsTable("events", format="deltacoord"),
                  lambda: df.write.format("deltacoord").insertInto("events")):
        with pytest.raises(CatalogTableError) as ei:
            write()
        assert "CREATE TABLE events USING delta LOCATION '<path>'" in str(ei.value) and "\n" not in str(ei.value)
    assert not spark.catalog.tableExists("events")


def test_partition_by_naming_no_column_is_refused_before_the_table_exists(spark: SparkSession, env: Env,
                                                                          tmp_path: Path) -> None:
    path = tmp_path / "events"
    with pytest.raises(Exception, match=r"partition column\(s\) \['day'\] are not columns of the DataFrame"):
        _save(_events(spark, [(1, "2024-01-01", "click")]), path, env.options(), partition_by=["day"])
    assert not (path / "_delta_log").exists() and _parquet(path) == set()


def test_stream_partition_by_partitions_a_new_table(spark: SparkSession, env: Env, tmp_path: Path) -> None:
    src, path = tmp_path / "in", tmp_path / "events"
    src.mkdir()
    for day in ("2024-01-01", "2024-01-02"):
        (src / f"{day}.json").write_text("".join(json.dumps({"id": i, "date": day, "kind": "s"}) + "\n" for i in range(3)))
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
    q = (df.writeStream.format("deltacoord").options(**env.options()).partitionBy("date")
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start(str(path)))
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    snap = Snapshot.load(str(path))
    assert snap.partition_columns == ["date"]
    assert len(_rows(path)) == 6 and {p.split("/")[0] for p in _parquet(path)} == {"date=2024-01-01", "date=2024-01-02"}


# --------------------------------------------------------------------------- save modes


def test_save_modes_mean_what_they_mean_for_delta(spark: SparkSession, env: Env, tmp_path: Path) -> None:
    path = tmp_path / "events"
    a, b, c = [(1, "2024-01-01", "a")], [(2, "2024-01-01", "b")], [(3, "2024-01-02", "c")]
    _save(_events(spark, a), path, env.options(), "ignore")  # no table yet: ignore writes
    assert _rows(path) == a
    version, files = Snapshot.load(str(path)).version, _parquet(path)

    with pytest.raises(PathExistsError) as ei:
        _save(_events(spark, b), path, env.options())  # the default, errorifexists
    assert f"[DELTA_PATH_EXISTS] Cannot write to already existent path {path}" in str(ei.value)
    with pytest.raises(PathExistsError):
        _save(_events(spark, b), path, env.options(), "error")  # Spark's other spelling
    df_b = _events(spark, b)
    spark.sparkContext.setJobGroup("save-mode-ignore", "an ignored write")
    _save(df_b, path, env.options(), "ignore")  # exists: nothing written, and no Spark job run
    assert spark.sparkContext.statusTracker().getJobIdsForGroup("save-mode-ignore") == []
    spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert Snapshot.load(str(path)).version == version and _parquet(path) == files and _rows(path) == a

    _save(_events(spark, b), path, env.options(), "append")
    assert _rows(path) == sorted(a + b)
    _save(_events(spark, c), path, env.options(), "overwrite")
    assert _rows(path) == c
    ops = [h["operation"] for h in reversed(Snapshot.load(str(path)).history())]
    assert ops == ["CREATE TABLE", "WRITE", "WRITE", "WRITE"]
    delta = sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).select("id", "date", "kind").collect())
    assert delta == c


def test_the_source_itself_applies_errorifexists_and_ignore(env: Env, tmp_path: Path) -> None:
    """What a Spark Connect client or a table created after `save()` looked meets: the source decides again."""
    path = tmp_path / "events"
    first = DeltaCoordDataSource({"path": str(path), **env.options()}).writer(SCHEMA, overwrite=False)
    assert isinstance(first, DeltaCoordBatchWriter)  # append to a new table creates it
    files = _parquet(path)
    with pytest.raises(PathExistsError):
        DeltaCoordDataSource({"path": str(path), **env.options(), "__save_mode": "errorifexists"}).writer(SCHEMA, False)
    ignored = DeltaCoordDataSource({"path": str(path), **env.options(), "__save_mode": "ignore"}).writer(SCHEMA, False)
    assert not isinstance(ignored, DeltaCoordBatchWriter)
    ignored.commit([ignored.write(iter([pa.record_batch({"id": [1], "date": ["d"], "kind": ["k"]})]))])
    assert Snapshot.load(str(path)).version == 0 and _parquet(path) == files


# --------------------------------------------------------------------------- options checked before staging


BAD_OPTIONS = [
    pytest.param({"topic.prefix": "{prefix}"}, SinkConfigError, "needs option 'bootstrap.servers'", id="missing-bootstrap"),
    pytest.param({"bootstrap.servers": "localhost", "topic.prefix": "{prefix}"}, SinkConfigError, "'localhost' is not host:port",
                 id="malformed-bootstrap"),
    pytest.param({"bootstrap.servers": "127.0.0.1:1", "topic.prefix": "{prefix}"}, SinkConfigError,
                 "cannot reach Kafka at 127.0.0.1:1", id="unreachable-bootstrap"),
    pytest.param({"bootstrap.servers": "{bootstrap}", "topic.prefix": "no-such-prefix"}, SinkConfigError,
                 "has no topic no-such-prefix.proposals", id="wrong-topic-prefix"),
    pytest.param({"bootstrap.server": "{bootstrap}", "topic.prefix": "{prefix}"}, SinkConfigError,
                 "unknown option 'bootstrap.server' for the deltacoord sink; did you mean 'bootstrap.servers'?",
                 id="misspelt-option"),
    pytest.param({"bootstrap.servers": "{bootstrap}", "topic.prefix": "{prefix}", "mergeSchema": "true"}, SinkConfigError,
                 "'mergeSchema' is a Delta Lake option the deltacoord sink does not take", id="unsupported-delta-option"),
]


def _fill(options: dict[str, str], env: Env) -> dict[str, str]:
    return {k: v.format(bootstrap=env.bootstrap, prefix=env.prefix) for k, v in options.items()}


@pytest.mark.parametrize("existing", [False, True], ids=["new-table", "existing-table"])
@pytest.mark.parametrize(("options", "error", "message"), BAD_OPTIONS)
def test_bad_options_fail_on_the_driver_before_anything_is_staged(spark: SparkSession, env: Env, tmp_path: Path,
                                                                  existing: bool, options: dict[str, str],
                                                                  error: type[Exception], message: str) -> None:
    path = tmp_path / "events"
    if existing:
        _save(_events(spark, [(1, "2024-01-01", "a")]), path, env.options())
    version = Snapshot.load(str(path)).version if existing else None
    files = _parquet(path)
    with pytest.raises(error) as ei:  # through PySpark's writer: a plain Python exception from save()
        _save(_events(spark, [(2, "2024-01-01", "b")]), path, _fill(options, env), "append")
    assert message in str(ei.value)
    with pytest.raises(error) as ei:  # the source on its own (as a Spark Connect server runs it)
        DeltaCoordDataSource({"path": str(path), **_fill(options, env)}).writer(SCHEMA, overwrite=False)
    assert message in str(ei.value)
    assert _parquet(path) == files
    if existing:
        assert Snapshot.load(str(path)).version == version
    else:
        assert not (path / "_delta_log").exists()


def test_a_stream_with_bad_options_stops_before_its_first_batch_is_staged(spark: SparkSession, env: Env,
                                                                           tmp_path: Path) -> None:
    src, path = tmp_path / "in", tmp_path / "events"
    src.mkdir()
    (src / "a.json").write_text(json.dumps({"id": 1, "date": "2024-01-01", "kind": "s"}) + "\n")
    df = spark.readStream.schema(SCHEMA).json(str(src))
    q = (df.writeStream.format("deltacoord").option("bootstrap.servers", "127.0.0.1:1").option("topic.prefix", env.prefix)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start(str(path)))
    with pytest.raises(StreamingQueryException) as ei:
        q.awaitTermination(180)
    assert "cannot reach Kafka at 127.0.0.1:1" in str(ei.value)
    assert _parquet(path) == set() and not (path / "_delta_log").exists()


def test_deltacoord_variables_are_the_defaults_of_bootstrap_servers_and_topic_prefix(
        spark: SparkSession, env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Set after Spark started, as in a notebook: the writer carries this process's values to the source."""
    monkeypatch.setenv(BOOTSTRAP_ENV, env.bootstrap)
    monkeypatch.setenv(TOPIC_PREFIX_ENV, env.prefix)
    path = tmp_path / "events"
    _save(_events(spark, [(1, "2024-01-01", "a")]), path, {})
    assert _rows(path) == [(1, "2024-01-01", "a")]


# --------------------------------------------------------------------------- staged files on failure


def _staged_writer(env: Env, path: Path) -> tuple[DeltaCoordBatchWriter, DeltaCoordCommitMessage]:
    w = DeltaCoordDataSource({"path": str(path), **env.options()}).writer(SCHEMA, overwrite=False)
    assert isinstance(w, DeltaCoordBatchWriter)
    msg = w.write(iter([pa.record_batch({"id": [1, 2], "date": ["2024-01-01"] * 2, "kind": ["a", "b"]})]))
    assert msg.adds
    return w, msg


def test_a_failed_task_deletes_what_the_other_tasks_staged(env: Env, tmp_path: Path) -> None:
    path = tmp_path / "events"
    w, msg = _staged_writer(env, path)
    assert _parquet(path)
    w.abort([msg, None])  # one task failed: Spark never called commit
    assert _parquet(path) == set()


def test_an_unknown_outcome_keeps_its_files_and_names_lookup_and_the_coordinated_vacuum(
        env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "events"
    w, msg = _staged_writer(env, path)
    staged = _parquet(path)

    def no_decision(tx: Transaction, *args: Any, **kwargs: Any) -> Any:
        tx.proposed = True  # as if it reached Kafka and no decision came back in time
        raise CommitOutcomeUnknownError(tx.proposal_id, tx.table.table_id, 0.1)

    monkeypatch.setattr(Transaction, "commit", no_decision)
    with pytest.raises(CommitOutcomeUnknownError) as ei:
        w.commit([msg])
    note = "\n".join(getattr(ei.value, "__notes__", []))
    assert f"`deltacoord table lookup {path} {ei.value.proposal_id}`" in note
    assert f"`deltacoord table vacuum {path}`" in note and "kept because it may still commit" in note
    assert _parquet(path) == staged  # it may still commit: the files stay

    with caplog.at_level(logging.WARNING, logger="deltacoord.writer.spark_sink"):
        w.abort([msg])  # Spark's abort after the failed commit
    text = caplog.text
    assert f"{len(staged)} staged file(s) of {path} are kept" in text and f"`deltacoord table vacuum {path}`" in text
    assert "deltacoord table lookup" in text and "VACUUM removes" not in text
    assert _parquet(path) == staged


def test_a_commit_that_cannot_be_proposed_deletes_its_files_and_abort_reports_nothing(
        env: Env, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "events"
    w, msg = _staged_writer(env, path)
    w.opts = dataclasses.replace(w.opts, bootstrap_servers="no-port")  # the commit cannot even reach Kafka
    with pytest.raises(SinkConfigError, match="not host:port"):
        w.commit([msg])
    with caplog.at_level(logging.WARNING, logger="deltacoord.writer.spark_sink"):
        w.abort([msg])
    assert _parquet(path) == set() and "vacuum" not in caplog.text


# --------------------------------------------------------------------------- the workers' Python


def test_register_runs_the_workers_on_the_drivers_python_without_pyspark_python(env: Env, tmp_path: Path) -> None:
    """A session built by hand, started from the virtual environment's interpreter with no PYSPARK_PYTHON and no
    PYTHONPATH, and a `python3` first on PATH that is not it: the source's workers still import `writer`."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python3", "python"):
        (fake / name).write_text("#!/bin/sh\necho \"python3 from PATH ran: $*\" >&2\nexit 97\n")
        (fake / name).chmod(0o755)
    path = tmp_path / "events"
    code = f"""
from pyspark.sql import SparkSession
from deltacoord.writer.spark_sink import register
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
register(spark)
spark.range(5).selectExpr("id", "'2024-01-01' AS date", "'r' AS kind").write.format("deltacoord").save({str(path)!r})
spark.stop()
"""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    environ.update({"PATH": f"{fake}{os.pathsep}{environ.get('PATH', '')}", BOOTSTRAP_ENV: env.bootstrap,
                    TOPIC_PREFIX_ENV: env.prefix})
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environ, capture_output=True, text=True,
                         timeout=420)
    assert res.returncode == 0, res.stderr[-6000:]
    assert _rows(path) == [(i, "2024-01-01", "r") for i in range(5)]
