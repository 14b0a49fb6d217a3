"""Delta's save modes and `.partitionBy` for the `deltacoord` source, and the PySpark calls that carry them.

Spark's Python data source API hands a source one flag, overwrite, and nothing of `.partitionBy`. In
`DataFrameWriter.save` Spark itself refuses `errorifexists` (the default) and `ignore` for every Python
data source (UNSUPPORTED_DATA_SOURCE_SAVE_MODE) and fails `.partitionBy(...)`, since a Python table
declares no partitioning; `DataStreamWriter` drops `.partitionBy` silently. `install()` wraps classic
PySpark's `DataFrameWriter.save` and `DataStreamWriter.start` (with `format` and `partitionBy`, which
`start` needs to see) so that for the `deltacoord` format, and no other:

* the save mode travels as option `__save_mode` while Spark is asked to append; `ignore` on an existing
  table returns at once without running the DataFrame's job, as Delta does;
* `.partitionBy(...)` travels as option `__partition_columns` (a JSON list) and Spark's own partitioning
  is cleared;
* this process's `DELTACOORD_BOOTSTRAP_SERVERS` and `DELTACOORD_TOPIC_PREFIX` travel as defaults, so a
  variable set after Spark started still counts;
* a batch write's options, Kafka and the existing table are checked before Spark runs anything, so a
  mistake is a plain Python exception from `save()`.

The source checks everything again (it is the authority: a Spark Connect client is not wrapped, and a
table may appear in between). The batch wrapper reads the JVM writer's state through its Scala accessors
(`source()`, `curmode()`, `extraOptions()`, `partitioningColumns()`); on a Spark without them it passes the
call through unchanged and Spark's own error stands.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from deltacoord.reader.log import TableNotFoundError
from deltacoord.reader.snapshot import Snapshot
from deltacoord.reader.spark_source import SOURCE_NAME
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.writer.spark_options import (
    ENV_DEFAULT_KEYS,
    PARTITION_COLUMNS_KEY,
    SAVE_MODE_KEY,
    SinkConfigError,
    SinkOptions,
    check_option_names,
)

log = logging.getLogger(__name__)
#: Option names registered subclasses of the source accept besides the sink's own.
_extra_options: frozenset[str] = frozenset()


class PathExistsError(DeltaCoordError):
    """Delta's DELTA_PATH_EXISTS: a write in the default save mode, errorifexists, to a table that exists."""

    error_class: ClassVar[str] = "DELTA_PATH_EXISTS"

    def __init__(self, uri: str) -> None:
        super().__init__(f"[DELTA_PATH_EXISTS] Cannot write to already existent path {uri} without setting OVERWRITE = "
                         "'true': use .mode('append') to add to the table, .mode('overwrite') to replace its content, "
                         "or .mode('ignore') to leave it as it is")


class PartitioningMismatchError(SinkConfigError):
    """Delta's DELTA_METADATA_MISMATCH for partition columns other than the existing table's."""

    error_class: ClassVar[str] = "DELTA_METADATA_MISMATCH"

    def __init__(self, uri: str, given: Sequence[str], table: Sequence[str]) -> None:
        super().__init__(
            f"[DELTA_METADATA_MISMATCH] A metadata mismatch was detected when writing to the Delta table at {uri}: "
            f"partition columns do not match the partition columns of the table. Given: {list(given)}; table: "
            f"{list(table)}. Leave .partitionBy out to write with the table's partitioning; another partitioning "
            "needs a new table"
        )


def load_table(opts: SinkOptions) -> Snapshot | None:
    """The table's latest published snapshot, or None when the path holds no table."""
    try:
        return Snapshot.load(opts.uri, storage_options=dict(opts.storage_options))
    except TableNotFoundError:
        return None


def check_partitioning(opts: SinkOptions, snap: Snapshot) -> None:
    """`.partitionBy` on an existing table must name the table's partition columns (Delta compares without case)."""
    if opts.partition_by and [c.lower() for c in opts.partition_by] != [c.lower() for c in snap.partition_columns]:
        raise PartitioningMismatchError(opts.uri, opts.partition_by, snap.partition_columns)


def write_to_existing(opts: SinkOptions, snap: Snapshot) -> bool:
    """Whether a write goes on to the existing table: errorifexists raises, ignore says no, others check partitioning."""
    if opts.save_mode == "errorifexists":
        raise PathExistsError(opts.uri)
    if opts.save_mode == "ignore":
        log.info("save mode ignore: %s exists, nothing written", opts.uri)
        return False
    check_partitioning(opts, snap)
    return True


# --------------------------------------------------------------------------- PySpark's writers


def _env_defaults() -> dict[str, str]:
    """This process's DELTACOORD_* defaults as internal options (the source's own environment may predate them)."""
    return {key: v for var, key in ENV_DEFAULT_KEYS.items() if (v := os.environ.get(var))}


def _is_ours(source: str | None) -> bool:
    return (source or "").lower() == SOURCE_NAME


def _prepare_save(writer: Any, path: str | None, extra_options: frozenset[str]) -> bool:
    """Carry mode, partitioning and defaults to the source on the JVM writer; False when nothing is to be written."""
    j = writer._jwrite
    jvm = writer._spark._jvm
    scala = jvm.scala.jdk.javaapi.CollectionConverters
    mode = str(j.curmode().name()).lower()
    options = {str(k): str(v) for k, v in dict(scala.asJava(j.extraOptions().originalMap())).items()}
    parts = j.partitioningColumns()
    carried = _env_defaults()
    if parts.isDefined():
        carried[PARTITION_COLUMNS_KEY] = json.dumps([str(c) for c in scala.asJava(parts.get())])
        getattr(j, "partitioningColumns_$eq")(jvm.scala.Option.empty())
    if mode in ("errorifexists", "ignore"):
        carried[SAVE_MODE_KEY] = mode
        j = j.mode("append")
    for k, v in carried.items():
        j = j.option(k, v)
    writer._jwrite = j
    merged = {**options, **carried, **({"path": path} if path is not None else {})}
    check_option_names(merged, extra_options)
    opts = SinkOptions.parse(merged)
    opts.check_kafka()
    snap = load_table(opts)
    return snap is None or write_to_existing(opts, snap)


def _wrap_save(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def save(self: Any, path: str | None = None, format: str | None = None, mode: str | None = None,
             partitionBy: str | list[str] | None = None, **options: Any) -> None:
        self.mode(mode).options(**options)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        if format is not None:
            self.format(format)
        try:
            ours = _is_ours(str(self._jwrite.source()))
        except Exception:  # a Spark whose writer has no such accessor: Spark decides alone
            ours = False
        if ours and not _prepare_save(self, path, _extra_options):
            return None
        return original(self, path)

    save.__deltacoord_wrapped__ = True  # type: ignore[attr-defined]
    return save


class CatalogTableError(ValueError):
    """`saveAsTable` / `insertInto` with the deltacoord format: Spark's Python data sources write paths, not
    catalog tables (Spark fails deep inside with a NullPointerException in `BestEffortStagedTable`)."""


def _wrap_catalog_write(original: Callable[..., Any], what: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def write(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = args[0] if args else kwargs.get("name", kwargs.get("tableName"))
        fmt = kwargs.get("format") or (args[1] if what == "saveAsTable" and len(args) > 1 else None)
        try:
            ours = _is_ours(str(fmt)) if fmt else _is_ours(str(self._jwrite.source()))
        except Exception:  # a Spark whose writer has no such accessor: Spark decides alone
            ours = False
        if ours:
            raise CatalogTableError(
                f"{what}({name!r}) with format('deltacoord'): Spark's Python data sources write to a path, not to a "
                f"catalog table. Write with .save('<path>'), then name it in the catalog: "
                f"spark.sql(\"CREATE TABLE {name} USING delta LOCATION '<path>'\") (reads go through Delta; "
                f"writes keep using format('deltacoord').save('<path>'))")
        return original(self, *args, **kwargs)

    write.__deltacoord_wrapped__ = True  # type: ignore[attr-defined]
    return write


def _wrap_stream_format(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def format(self: Any, source: str) -> Any:
        self._deltacoord_format = source
        return original(self, source)

    return format


def _wrap_stream_partition_by(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def partitionBy(self: Any, *cols: Any) -> Any:
        names = cols[0] if len(cols) == 1 and isinstance(cols[0], (list, tuple)) else cols
        self._deltacoord_partition_by = [str(c) for c in names]
        return original(self, *cols)

    return partitionBy


def _wrap_stream_start(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def start(self: Any, path: str | None = None, format: str | None = None, outputMode: str | None = None,
              partitionBy: str | list[str] | None = None, queryName: str | None = None, **options: Any) -> Any:
        if format is not None:
            self.format(format)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        if _is_ours(getattr(self, "_deltacoord_format", None)):
            carried = _env_defaults()
            cols = getattr(self, "_deltacoord_partition_by", None)
            if cols:
                carried[PARTITION_COLUMNS_KEY] = json.dumps(cols)
            for k, v in carried.items():
                self._jwrite = self._jwrite.option(k, v)
        return original(self, path, None, outputMode, None, queryName, **options)

    return start


def install(extra_options: frozenset[str] = frozenset()) -> None:
    """Wrap classic PySpark's writers once per process (see the module docstring); other formats are untouched.

    `extra_options`: lower-case option names a registered subclass of the source accepts besides the sink's own."""
    from pyspark.sql.readwriter import DataFrameWriter
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    global _extra_options
    _extra_options = _extra_options | extra_options
    if getattr(DataFrameWriter.save, "__deltacoord_wrapped__", False):
        return
    DataFrameWriter.save = _wrap_save(DataFrameWriter.save)  # type: ignore[method-assign]
    DataFrameWriter.saveAsTable = _wrap_catalog_write(DataFrameWriter.saveAsTable, "saveAsTable")  # type: ignore[method-assign]
    DataFrameWriter.insertInto = _wrap_catalog_write(DataFrameWriter.insertInto, "insertInto")  # type: ignore[method-assign]
    DataStreamWriter.format = _wrap_stream_format(DataStreamWriter.format)  # type: ignore[method-assign]
    DataStreamWriter.partitionBy = _wrap_stream_partition_by(DataStreamWriter.partitionBy)  # type: ignore[method-assign]
    DataStreamWriter.start = _wrap_stream_start(DataStreamWriter.start)  # type: ignore[method-assign]


__all__ = ["CatalogTableError", "PartitioningMismatchError", "PathExistsError", "check_partitioning", "install",
           "load_table", "write_to_existing"]
