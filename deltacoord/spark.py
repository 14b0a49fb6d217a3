"""A SparkSession that writes and reads coordinated tables, and reads them with Delta Lake too.

    import deltacoord.spark
    spark = deltacoord.spark.session()
    df.write.format("deltacoord").partitionBy("date").save("/data/events")
    spark.read.format("delta").load("/data/events")

`session()` is a local session with what both formats need: Delta Lake's jars (`deltacoord jars fetch
delta`, resolved once from Maven Central into `~/.cache/deltacoord`), Delta's SQL extension and catalog,
and the `deltacoord` data source registered (`register`). Its Python workers, for every
Python task of the session, run this interpreter unless `spark.pyspark.python` or `PYSPARK_PYTHON` names
another (`session()` sets `PYSPARK_PYTHON` when unset): PySpark's default is `python3` from `PATH`, which
outside an activated virtual environment has neither deltacoord nor the same packages. A session built another way needs the same three settings,
``spark.jars.packages=io.delta:delta-spark_4.2_2.13:4.4.0`` (or ``spark.jars``),
``spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension`` and
``spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog``, then
`deltacoord.spark.register(spark)`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from deltacoord.tooling.jars import classpath
from deltacoord.writer.spark_sink import register, worker_python
from deltacoord.writer.spark_tables import MultiTableBatchWriter

#: The settings Delta Lake on Spark needs besides its jars.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_jars() -> str:
    """Delta Lake's jars for `spark.jars` (comma-separated; fetched with Maven on first use)."""
    return classpath("delta").replace(os.pathsep, ",")


def s3a_settings(storage_options: Mapping[str, str]) -> dict[str, str]:
    """Hadoop's S3A settings (`fs.s3a.*`) that reach the store delta-rs-style `storage_options` name, so Delta
    Lake on Spark reads (`s3a://bucket/path`) the tables deltacoord writes at `s3://bucket/path`: the endpoint
    (with path-style access, as local and S3-compatible servers need), the region, and the credentials when
    given (else S3A's own chain: environment, profile, instance role). Give each to Spark as
    `spark.hadoop.<key>`; `session(storage_options=...)` does."""
    opts = {k.lower(): v for k, v in storage_options.items()}
    out: dict[str, str] = {}
    endpoint = opts.get("aws_endpoint_url") or opts.get("aws_endpoint") or opts.get("endpoint")
    if endpoint:
        out["fs.s3a.endpoint"] = endpoint
        out["fs.s3a.path.style.access"] = "false" if opts.get("aws_virtual_hosted_style_request") == "true" else "true"
        out["fs.s3a.connection.ssl.enabled"] = str(not endpoint.startswith("http://")).lower()
    region = opts.get("aws_region") or opts.get("region") or opts.get("aws_default_region")
    if region:
        out["fs.s3a.endpoint.region"] = region
    key, secret = opts.get("aws_access_key_id"), opts.get("aws_secret_access_key")
    if key and secret:
        out["fs.s3a.access.key"], out["fs.s3a.secret.key"] = key, secret
        token = opts.get("aws_session_token") or opts.get("aws_token")
        if token:
            out["fs.s3a.session.token"] = token
            out["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            out["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return out


def s3a_jars() -> str:
    """Hadoop's S3A jars (hadoop-aws and the AWS SDK bundle) as a class path (fetched with Maven on first use):
    for `spark.driver.extraClassPath`, since Hadoop finds file systems only on the JVM's class path."""
    return classpath("s3a")


def session(app_name: str = "deltacoord", master: str = "local[*]", conf: Mapping[str, str] | None = None,
            storage_options: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession (`getOrCreate`) with Delta Lake's jars and settings and the `deltacoord` source registered.

    `conf` adds or overrides Spark settings (e.g. ``{"spark.driver.memory": "2g"}``). With `storage_options`
    (delta-rs's S3 keys, as the tables' writers take them) the session also reads `s3a://` tables: Hadoop's
    S3A jars on the driver's class path and `s3a_settings`. Jars reach a JVM only when it starts: in a process
    that already runs Spark, start that session with `delta_jars()` in `spark.jars`."""
    settings = {"spark.jars": delta_jars(), **DELTA_CONF}
    if storage_options is not None:
        settings["spark.driver.extraClassPath"] = s3a_jars()
        settings.update({f"spark.hadoop.{k}": v for k, v in s3a_settings(storage_options).items()})
    settings.update(conf or {})
    # PySpark and the JVM it launches both read PYSPARK_PYTHON (the JVM for its own Python calls, such as its
    # lookup of installed Python data sources); spark.pyspark.python alone reaches neither outside spark-submit.
    os.environ.setdefault("PYSPARK_PYTHON", settings.get("spark.pyspark.python") or sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.pythonExec = worker_python(spark)  # also when this process already ran a SparkContext
    register(spark)
    return spark


__all__ = ["DELTA_CONF", "MultiTableBatchWriter", "delta_jars", "register", "s3a_jars", "s3a_settings", "session"]
