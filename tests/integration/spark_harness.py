"""Spark helpers for the `deltacoord` data-source tests: a local session with the Delta jars, and a child driver.

A session built with `s3=` storage options also carries Hadoop's S3A filesystem
(hadoop-aws and the AWS SDK bundle, `deltacoord jars fetch s3a`) configured for
that S3 endpoint, so Delta Lake on Spark reads the tables there as `s3a://`.

`child_main` is the body of a separate driver process (``python -c "from
tests.integration.spark_harness import child_main; child_main()" <json>``)
that streams a directory of JSON files into a coordinated table. With
``crash_after_batch`` set it SIGKILLs its own process group (driver, JVM,
Python workers) right after the coordinator decided that batch and before
Spark wrote its commit log: the worst moment for exactly-once.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from deltacoord.spark import s3a_settings
from deltacoord.tooling.jars import classpath
from deltacoord.writer.spark_sink import (
    DeltaCoordDataSource,
    DeltaCoordStreamWriter,
    SinkOptions,
    _stage_plan,
    ensure_table,
    register,
)
from tests import cpu_priority

REPO = Path(__file__).resolve().parents[2]


def spark_environ() -> dict[str, str]:
    """This process's environment for a Spark JVM or a child driver: Python workers run this interpreter and find
    this repository (the test data sources live under `tests`)."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in paths:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])
    return env


@contextlib.contextmanager
def _spark_launch_env() -> Iterator[None]:
    """`spark_environ()` only while a session starts: the JVM keeps the environment it was launched with and
    hands it to its Python workers, while this process's later children (pip, CLI runs, writers) see the
    environment they had; a checkout on their PYTHONPATH would hide what an installed deltacoord does."""
    saved = dict(os.environ)
    os.environ.update(spark_environ())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def s3a_conf(storage_options: dict[str, str]) -> dict[str, str]:
    """Hadoop S3A settings for the local S3 server named by delta-rs-style storage options: what users get
    from `deltacoord.spark.s3a_settings`, so every Spark read of an S3 table here tests it."""
    return s3a_settings(storage_options)


_LOCAL_DIR: list[str] = []


def _local_dir() -> str:
    """One scratch directory per test process for Spark's temp files, removed when the process ends: Spark
    leaves `spark-<uuid>` directories behind whenever its JVM does not run its shutdown hooks."""
    if not _LOCAL_DIR:
        d = tempfile.mkdtemp(prefix="deltacoord-spark-")
        atexit.register(shutil.rmtree, d, True)
        _LOCAL_DIR.append(d)
    return _LOCAL_DIR[0]


_SHARED: list[SparkSession] = []


def shared_session(s3: dict[str, str] | None = None) -> SparkSession:
    """The test process's one Spark session, built at first use and stopped when the process ends: a session
    costs seconds of JVM and Delta start-up, and tests isolate themselves by table path, not by session.
    `s3` (the local S3 server's storage options) configures S3A on it: one server serves a test process."""
    if not _SHARED or _SHARED[0].sparkContext._jsc is None:  # type: ignore[attr-defined]
        cpu_priority.claim_spark()  # first: the JVM and its Python workers stay in the session they start in
        _SHARED[:] = [build_session()]
        atexit.register(_SHARED[0].stop)
    spark = _SHARED[0]
    if s3 is not None:
        conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        for k, v in s3a_conf(s3).items():
            conf.set(k, v)
    return spark


def build_session(app: str = "deltacoord-tests", s3: dict[str, str] | None = None) -> SparkSession:
    """A Spark session of this process's own (a child driver's); tests take `shared_session()`."""
    with _spark_launch_env():
        return _build_session(app, s3)


def _build_session(app: str, s3: dict[str, str] | None) -> SparkSession:
    # The Delta and S3A jars on the JVM's class path, always: a test process launches one JVM (local mode: the
    # executors are in it), Hadoop's FileSystem lookup sees only that class path, and `spark.jars` would copy
    # the ~650 MB of jars into a new temp directory for every session.
    jars = classpath("delta") + os.pathsep + classpath("s3a")
    builder = SparkSession.builder
    for k, v in s3a_conf(s3).items() if s3 is not None else ():
        builder = builder.config(f"spark.hadoop.{k}", v)
    spark = (
        builder.master("local[2]").appName(app)
        .config("spark.driver.extraClassPath", jars)
        .config("spark.local.dir", _local_dir())
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class _CrashingStreamWriter(DeltaCoordStreamWriter):
    def __init__(self, inner: DeltaCoordStreamWriter, crash_after_batch: int, marker: str, driver_pid: int) -> None:
        super().__init__(inner.opts, inner.plan, inner.overwrite)
        self.crash_after_batch = crash_after_batch
        self.marker = marker
        self.driver_pid = driver_pid

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        super().commit(messages, batchId)
        if batchId == self.crash_after_batch and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(batchId))
            # Decided in Kafka, not yet in Spark's commit log: kill the driver and its JVM (their process
            # group: the test starts the driver in a session of its own), then the Python workers' group.
            os.killpg(os.getpgid(self.driver_pid), signal.SIGKILL)
            os.killpg(os.getpgid(0), signal.SIGKILL)


class CrashingDataSource(DeltaCoordDataSource):
    """`deltacoord` whose stream commit kills the whole driver after one chosen batch (option `test.crashAfterBatch`)."""

    extra_write_options = frozenset({"test.crashafterbatch", "test.crashmarker", "test.driverpid"})

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        inner = super().streamWriter(schema, overwrite)
        crash = int(self.options.get("test.crashAfterBatch", "-1"))
        marker = self.options.get("test.crashMarker", "")
        if crash < 0:
            return inner
        assert isinstance(inner, DeltaCoordStreamWriter)
        return _CrashingStreamWriter(inner, crash, marker, int(self.options["test.driverPid"]))


def child_main() -> None:
    """Stream JSON files (`id long, value string`) from a directory into a coordinated table."""
    args: dict[str, Any] = json.loads(sys.argv[1])
    spark = build_session("deltacoord-child")
    register(spark, CrashingDataSource)
    df = spark.readStream.schema("id long, value string").option("maxFilesPerTrigger", 1).json(args["source"])
    w = df.writeStream.format("deltacoord")
    for k, v in args.get("storage_options", {}).items():
        w = w.option(f"storage.{k}", v)
    w = (
        w.option("path", args["table"])
        .option("bootstrap.servers", args["bootstrap"])
        .option("topic.prefix", args["prefix"])
        .option("checkpointLocation", args["checkpoint"])
        .option("metricsPath", args["metrics"])
        .option("test.crashAfterBatch", str(args.get("crash_after_batch", -1)))
        .option("test.crashMarker", args["marker"])
        .option("test.driverPid", str(os.getpid()))
    )
    q = w.trigger(availableNow=True).start()
    q.awaitTermination()
    spark.stop()


__all__ = ["CrashingDataSource", "SinkOptions", "_stage_plan", "build_session", "child_main", "ensure_table", "s3a_conf",
           "shared_session", "spark_environ"]
