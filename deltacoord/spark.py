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

from coordinator.tooling.jars import classpath
from writer.spark_sink import register, worker_python

#: The settings Delta Lake on Spark needs besides its jars.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_jars() -> str:
    """Delta Lake's jars for `spark.jars` (comma-separated; fetched with Maven on first use)."""
    return classpath("delta").replace(os.pathsep, ",")


def session(app_name: str = "deltacoord", master: str = "local[*]", conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession (`getOrCreate`) with Delta Lake's jars and settings and the `deltacoord` source registered.

    `conf` adds or overrides Spark settings (e.g. ``{"spark.driver.memory": "2g"}``). Jars reach a JVM only when
    it starts: in a process that already runs Spark, start that session with `delta_jars()` in `spark.jars`."""
    settings = {"spark.jars": delta_jars(), **DELTA_CONF, **(conf or {})}
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


__all__ = ["DELTA_CONF", "delta_jars", "register", "session"]
