"""Write coordinated Delta tables from Spark: the `deltacoord` PySpark data source (read and write).

Register once per session with `register(spark)` (or start one with `deltacoord.spark.session()`); then

* batch, as with Delta: ``df.write.format("deltacoord")[.partitionBy("date")]
  [.mode("errorifexists" | "append" | "overwrite" | "ignore")][.option("replaceWhere", ...)].save(uri)``;
* streaming: ``df.writeStream.format("deltacoord").option("checkpointLocation", ...).start(uri)``;
* reads: everything `deltacoord.reader.spark_source.DeltaCoordSource` does.

Save modes mean what they mean for Delta: `errorifexists` (the default) fails with DELTA_PATH_EXISTS when the
table exists, `ignore` then writes nothing (and computes nothing), `append` adds, `overwrite` replaces the
content (only the rows matching `replaceWhere` when given). `.partitionBy(...)` partitions a new table; on an
existing one, columns other than the table's fail with DELTA_METADATA_MISMATCH. Spark's Python data source
API hands a source only an overwrite flag and drops `.partitionBy`: `register` therefore also teaches classic
PySpark's DataFrameWriter and DataStreamWriter to pass both on for this format
(`deltacoord.writer.spark_save_modes`). Spark Connect clients are not taught: there Spark refuses `errorifexists`
and `ignore` with UNSUPPORTED_DATA_SOURCE_SAVE_MODE, and `.option("partitionBy", "a,b")` names the columns.

Options are checked on the driver before any task stages a file (`deltacoord.writer.spark_options`): an unknown name
(with the closest known one), a missing or malformed `bootstrap.servers`, Kafka that does not answer, or no
proposals topic under `topic.prefix` fail the write at once.

How a micro-batch commits (exactly once):

1. Executor tasks (`DataSourceStreamArrowWriter.write`) get Arrow batches,
   conform them to the table schema and stage Parquet files under the table
   root; each returns a commit message carrying its `add` actions as JSON.
2. Spark calls `commit(messages, batchId)` in a fresh Python worker on the
   driver. It loads the published snapshot; if the query's app id already
   recorded a `txn` version >= batchId, the batch is skipped (its staged
   files that are not live are deleted). Otherwise it proposes ONE commit:
   the adds + `txn(appId, batchId)`, declaring `appId` as read, under a
   proposal id derived from (table, appId, batchId, checkpoint). A query
   killed after the coordinator's decision but before Spark's commit log
   re-runs the batch with the same batchId: the coordinator recognises the
   proposal id as already committed, the re-staged files are deleted and no
   row is written twice. Should the proposal id have left the coordinator's
   index, the replay fails with ConcurrentTransactionException and the next
   restart skips it by the published `txn` version.
3. Two queries writing with the same app id (an explicit ``appId`` option, or
   a copied checkpoint) at once get Delta's ConcurrentTransactionException.

The app id is the ``appId`` option, else Spark's query id from
``<checkpointLocation>/metadata`` (what Delta's own sink uses), else a hash
of the checkpoint path.

Staged files are deleted on every failure the sink sees: a task that fails, a
commit that cannot be proposed, a rejection. Only a commit whose outcome is
unknown (no decision in time) keeps them, because it may still commit and then
references them; the error names its proposal id and `deltacoord table lookup`,
and if it never commits, `deltacoord table vacuum` deletes them once they are
older than the table's retention. Never vacuum a coordinated table with another
tool: a VACUUM that writes to `_delta_log` writes around the coordinator.

Options (docs/settings.md names each setting across front doors): ``path``,
``bootstrap.servers`` (required to write; default ``DELTACOORD_BOOTSTRAP_SERVERS``),
``topic.prefix`` (default ``DELTACOORD_TOPIC_PREFIX``, else ``deltacoord``),
``checkpointLocation``, ``appId``, ``partitionBy`` (comma-separated, as ``.partitionBy``),
``replaceWhere``, ``txnAppId``/``txnVersion`` (idempotent batch writes, as in
Delta), ``decisionTimeoutS`` (default ``DELTACOORD_TIMEOUT``, else 60), ``writerName``, ``writerKey`` (a writer key file
that signs every proposal; default ``DELTACOORD_WRITER_KEY`` of the driver),
``metricsPath`` (a JSON-lines file the driver appends per-commit timings and its worker's process id to,
for benchmarks), ``kafka.<key>`` passed to the Kafka client and
``storage.<key>`` (the table's storage options, delta-rs's keys).

Python workers (the executors' and the driver's planner and commit workers)
run the driver's interpreter, `sys.executable`, unless `spark.pyspark.python` or
`PYSPARK_PYTHON` names another: PySpark's default, `python3` from
`PATH`, is not the virtual environment deltacoord is installed in. The driver's commit worker keeps one
coordinator client per Kafka settings across commits (`deltacoord.writer.spark_options.shared_client`): Spark runs
every micro-batch's commit in the same worker, and a new client would spend each commit on its start-up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import unquote

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from deltacoord.reader.log import TableNotFoundError, commit_object, read_commit
from deltacoord.reader.snapshot import Snapshot, delta_schema_to_arrow
from deltacoord.reader.spark_source import SOURCE_NAME, DeltaCoordSource
from deltacoord.schemas import arrow_types
from deltacoord.schemas.actions import AddFile, SetTransaction
from deltacoord.schemas.errors import CommitOutcomeUnknownError, ProtocolChangedException
from deltacoord.schemas.expressions import arrow as expressions
from deltacoord.schemas.expressions.syntax import columns_of, parse
from deltacoord.schemas.table_features import SPARK_SINK
from deltacoord.storage.table import TableStorage
from deltacoord.writer import spark_save_modes, staging
from deltacoord.writer.column_mapping import Layout
from deltacoord.writer.constraints import WriteRules, fill_and_check
from deltacoord.writer.operations import candidates, check_writable, conform_column
from deltacoord.writer.spark_options import SinkConfigError, SinkOptions, check_option_names
from deltacoord.writer.spark_save_modes import PartitioningMismatchError, PathExistsError, load_table, write_to_existing

log = logging.getLogger(__name__)

#: Rows buffered per task before a Parquet file is written.
ROWS_PER_FILE = 1_000_000


@dataclass
class DeltaCoordCommitMessage(WriterCommitMessage):
    """What one write task staged: its `add` actions (JSON) and row count."""

    adds: list[str]
    num_rows: int


def _record_metrics(opts: SinkOptions, entry: Mapping[str, Any]) -> None:
    if not opts.metrics_path:
        return
    with open(opts.metrics_path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(entry)) + "\n")


# --------------------------------------------------------------------------- staging (executors)


@dataclass(frozen=True)
class StagePlan:
    """What a write task needs: the table root, its Arrow schema and partition columns (picklable)."""

    root: str
    schema: pa.Schema
    partition_columns: tuple[str, ...]
    replace_where: str | None = None
    storage_options: tuple[tuple[str, str], ...] = ()
    #: How a column-mapping table stores its columns (physical names, field ids); None without column mapping.
    layout: Layout | None = None
    #: The table's NOT NULL columns, invariants, CHECK constraints and generated columns (`deltacoord.writer.constraints`).
    rules: WriteRules = field(default_factory=WriteRules)

    def conform(self, batch: pa.RecordBatch | pa.Table) -> pa.Table:
        t = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        extra = [n for n in t.column_names if self.schema.get_field_index(n) < 0]
        if extra:
            raise staging.SchemaError(f"columns {extra} are not in the table schema {self.schema.names}")
        cols = []
        for f in self.schema:
            if f.name in t.column_names:
                cols.append(conform_column(f.name, t.column(f.name), f.type))  # what Delta refuses, refused
            else:
                cols.append(pa.nulls(t.num_rows, f.type))
        return fill_and_check(self.rules, pa.Table.from_arrays(cols, schema=self.schema), t.column_names)

    def _check_replace_where(self, t: pa.Table) -> None:
        if self.replace_where is None or t.num_rows == 0:
            return
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        m = ds.dataset(t).to_table(columns={"m": expressions.compile_filter(self.replace_where, t.schema)}).column("m")
        bad = t.num_rows - pc.sum(pc.fill_null(m, False).cast(pa.int64())).as_py()
        if bad:
            raise ValueError(f"DELTA_REPLACE_WHERE_MISMATCH: {bad} written row(s) do not satisfy replaceWhere {self.replace_where!r}")

    def stage(self, batches: Iterator[pa.RecordBatch]) -> DeltaCoordCommitMessage:
        root = TableStorage(self.root, dict(self.storage_options), fsync=False)
        adds: list[AddFile] = []
        pending: list[pa.Table] = []
        rows = total = 0
        try:
            for b in batches:
                if b.num_rows == 0:
                    continue
                t = self.conform(b)
                self._check_replace_where(t)
                pending.append(t)
                rows += t.num_rows
                if rows >= ROWS_PER_FILE:
                    adds.extend(staging.write_data_files(root, pa.concat_tables(pending), self.partition_columns,
                                                             layout=self.layout))
                    total += rows
                    pending, rows = [], 0
            if pending:
                adds.extend(staging.write_data_files(root, pa.concat_tables(pending), self.partition_columns,
                                                             layout=self.layout))
                total += rows
        except BaseException:
            staging.delete_staged(root, adds)
            raise
        return DeltaCoordCommitMessage([json.dumps(a.to_json()["add"]) for a in adds], total)


def _adds_of(messages: Sequence[WriterCommitMessage | None]) -> list[AddFile]:
    out: list[AddFile] = []
    for m in messages:
        if isinstance(m, DeltaCoordCommitMessage):
            out.extend(AddFile.from_json(json.loads(s)) for s in m.adds)
    return out


def _rows_of(messages: Sequence[WriterCommitMessage | None]) -> int:
    return sum(m.num_rows for m in messages if isinstance(m, DeltaCoordCommitMessage))


def _check_staged_partitioning(opts: SinkOptions, snap: Snapshot, adds: Sequence[AddFile]) -> None:
    """Files staged for another partitioning than the table's (it changed while the write ran) cannot commit.
    Partition values are keyed by physical names on a column-mapping table."""
    layout = Layout.of(snap.metadata, delta_schema_to_arrow(snap.metadata.schema()))
    want = {layout.physical_name(c) for c in snap.partition_columns}
    for a in adds:
        if set(a.partition_values) != want:
            raise staging.SchemaError(
                f"the partitioning of {opts.uri} is {sorted(want)} but files were staged for {sorted(a.partition_values)}; "
                "it changed while the write ran: write again (restart the query)"
            )


def _delete_not_live(root: TableStorage, adds: Sequence[AddFile], live_paths: set[str]) -> None:
    staging.delete_staged(root, [a for a in adds if a.path not in live_paths])


def _delete_unless_in_commit(root: TableStorage, adds: Sequence[AddFile], version: int, wait_s: float = 30.0) -> None:
    """Delete staged files that are not part of commit `version` (waits for its publication; keeps all if it never shows)."""
    commit = commit_object(root, version)
    deadline = time.monotonic() + wait_s
    while not commit.exists():
        if time.monotonic() > deadline:
            log.warning("commit %s of %s not published within %.0fs; keeping the %d file(s) this replay staged: `deltacoord "
                        "table vacuum %s` deletes those the commit does not reference once they are older than the table's "
                        "retention", version, root.location, wait_s, len(adds), root.location)
            return
        time.sleep(0.05)
    committed = {a.path for a in read_commit(commit) if isinstance(a, AddFile)}
    _delete_not_live(root, adds, committed)


# --------------------------------------------------------------------------- table creation (driver)


def _arrow_schema_of(spark_schema: StructType) -> pa.Schema:
    s = to_arrow_schema(spark_schema, timezone="UTC")
    return pa.schema([pa.field(f.name, arrow_types.written_type(f.type), f.nullable) for f in s])


def _partition_columns(opts: SinkOptions, spark_schema: StructType) -> list[str]:
    """The new table's partition columns as the DataFrame spells them (Delta matches them without case)."""
    names = {n.lower(): n for n in spark_schema.fieldNames()}
    missing = [c for c in opts.partition_by if c.lower() not in names]
    if missing:
        raise SinkConfigError(f"partition column(s) {missing} are not columns of the DataFrame: {spark_schema.fieldNames()}")
    return [names[c.lower()] for c in opts.partition_by]


def prepare_table(opts: SinkOptions, spark_schema: StructType) -> Snapshot | None:
    """The snapshot to write to, creating the table from the DataFrame's schema when the path has none; None when
    the save mode is `ignore` and the table exists. `errorifexists` on an existing table raises PathExistsError,
    partition columns other than the table's raise PartitioningMismatchError."""
    snap = load_table(opts)
    if snap is not None:
        return snap if write_to_existing(opts, snap) else None
    partition_by = _partition_columns(opts, spark_schema)
    with opts.table() as t:
        try:
            t.create(_arrow_schema_of(spark_schema), partition_by=partition_by)
        except ProtocolChangedException:  # someone else created it at the same time
            snap = _await_table(opts)
            return snap if write_to_existing(opts, snap) else None
    return _await_table(opts)


def _await_table(opts: SinkOptions) -> Snapshot:
    deadline = time.monotonic() + opts.decision_timeout_s
    while True:
        snap = load_table(opts)
        if snap is not None:
            return snap
        if time.monotonic() > deadline:
            raise TableNotFoundError(f"the table created at {opts.uri} was not published within {opts.decision_timeout_s:.0f}s")
        time.sleep(0.05)


def ensure_table(opts: SinkOptions, spark_schema: StructType) -> Snapshot:
    """The table's latest snapshot, creating the table from the DataFrame's schema when the path has none."""
    snap = prepare_table(opts, spark_schema)
    if snap is None:
        raise SinkConfigError("save mode ignore found an existing table; there is nothing to write to")
    return snap


def _stage_plan(opts: SinkOptions, snap: Snapshot, replace_where: str | None = None) -> StagePlan:
    check_writable(snap, SPARK_SINK)  # executors stage rows as they are: refuse what they cannot honour
    schema = delta_schema_to_arrow(snap.metadata.schema())
    layout = Layout.of(snap.metadata, schema)
    return StagePlan(opts.uri, schema, tuple(snap.partition_columns), replace_where, opts.storage_options,
                     layout if layout.mapped else None, WriteRules.of(snap.protocol, snap.metadata))


# --------------------------------------------------------------------------- streaming writer


class _StagingWriter:
    """What the streaming and batch writers share: executors stage files per the plan."""

    def __init__(self, opts: SinkOptions, plan: StagePlan, overwrite: bool) -> None:
        self.opts = opts
        self.plan = plan
        self.overwrite = overwrite

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCoordCommitMessage:
        return self.plan.stage(iterator)


class DeltaCoordStreamWriter(_StagingWriter, DataSourceStreamArrowWriter):
    """Micro-batch writer: executors stage files, the driver proposes one commit per batch."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        t_start = time.monotonic()
        opts = self.opts
        adds = _adds_of(messages)
        app_id = opts.app_id()
        entry: dict[str, Any] = {"batchId": batchId, "appId": app_id, "files": len(adds), "rows": _rows_of(messages)}
        try:
            table = opts.table()
        except BaseException:
            staging.delete_staged(opts.root, adds)
            raise
        with table:
            try:
                snap = table.snapshot(files_on_demand=True)  # an appending batch reads none of the table's files
                _check_staged_partitioning(opts, snap, adds)
                recorded = snap.app_versions.get(app_id, -1)
                if batchId <= recorded:
                    _delete_not_live(opts.root, adds, set(snap.file_paths()))
                    log.info("batch %s of app %s already committed (txn version %s); skipped", batchId, app_id, recorded)
                    _record_metrics(opts, {**entry, "skipped": True, "recorded": recorded})
                    return
                tx = table.begin(snap)
                tx.proposal_id = opts.proposal_id(table.table_id, app_id, batchId, snap.version)
                tx.read_app_id(app_id)
                tx.add(SetTransaction(app_id, batchId, int(time.time() * 1000)))
                if self.overwrite:  # Complete output mode: replace the table's content
                    live = snap.files()
                    tx.read_whole()
                    tx.read_files_from(live)
                    for a in live:
                        tx.remove(a)
                tx.stage(adds)
            except BaseException:
                staging.delete_staged(opts.root, adds)
                raise
            t_propose = time.monotonic()
            with _naming_unknown_outcome(opts, adds):
                result = tx.commit(
                    "STREAMING UPDATE",
                    changes_data=bool(adds) or self.overwrite,
                    parameters={"outputMode": "Complete" if self.overwrite else "Append", "queryId": app_id,
                                "epochId": str(batchId)},
                )
            t_decided = time.monotonic()
            if result.already_committed:
                log.info("batch %s of app %s was already committed at version %s (re-run after a failure)", batchId, app_id, result.version)
                _delete_unless_in_commit(opts.root, adds, result.version)
            _record_metrics(opts, {
                **entry, "version": result.version, "duplicate": result.already_committed,
                "pid": os.getpid(), "setup_ms": (t_propose - t_start) * 1000, "propose_to_decision_ms": (t_decided - t_propose) * 1000,
                "commit_ms": (time.monotonic() - t_start) * 1000,
            })

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.opts, messages)


def _vacuum_hint(uri: str) -> str:
    return (f"if it never commits, `deltacoord table vacuum {uri}` deletes them once they are older than the table's "
            "retention (not a VACUUM of another tool: one that writes _delta_log writes around the coordinator)")


@contextlib.contextmanager
def _naming_unknown_outcome(opts: SinkOptions, adds: Sequence[AddFile]) -> Iterator[None]:
    """A commit whose outcome is unknown keeps its staged files: say how to learn the outcome and clean up after."""
    try:
        yield
    except CommitOutcomeUnknownError as e:
        e.add_note(f"`deltacoord table lookup {opts.uri} {e.proposal_id}` tells whether it committed. Its {len(adds)} "
                   f"staged file(s) are kept because it may still commit; {_vacuum_hint(opts.uri)}.")
        raise


def _abort(opts: SinkOptions, messages: Sequence[WriterCommitMessage | None]) -> None:
    """Delete staged files when the commit cannot have been proposed (some task failed, so Spark never called commit).

    When every task succeeded, the failure came from `commit`, which already deleted
    the files of a rejection or of a proposal that never left. Files still there
    belong to a commit whose outcome is unknown (or that committed): they stay, and
    the ones no published version references are reported with the way to clean up.
    """
    adds = _adds_of(messages)
    if any(m is None for m in messages) or not messages:
        staging.delete_staged(opts.root, adds)
        return
    root = opts.root
    left = [a for a in adds if "://" not in a.path and root.exists(unquote(a.path))]
    if not left:
        return
    snap = load_table(opts)
    live = set(snap.file_paths()) if snap is not None else set()
    orphans = [a for a in left if a.path not in live]
    if orphans:
        log.warning("%d staged file(s) of %s are kept: the failed commit may still reference them (its outcome is "
                    "unknown, or its version is not published yet: its error says which, with the proposal id for "
                    "`deltacoord table lookup`); %s", len(orphans), opts.uri, _vacuum_hint(opts.uri))


# --------------------------------------------------------------------------- batch writer


class DeltaCoordBatchWriter(_StagingWriter, DataSourceArrowWriter):
    """`df.write.format("deltacoord")`: append, overwrite, or overwrite with replaceWhere."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        opts = self.opts
        adds = _adds_of(messages)
        try:
            table = opts.table()
        except BaseException:
            staging.delete_staged(opts.root, adds)
            raise
        with table:
            try:
                snap = table.snapshot(files_on_demand=True)  # an append reads none of the table's files
                _check_staged_partitioning(opts, snap, adds)
                tx = table.begin(snap)
                if opts.txn_app_id is not None and opts.txn_version is not None:
                    if opts.txn_version <= snap.app_versions.get(opts.txn_app_id, -1):
                        _delete_not_live(opts.root, adds, set(snap.file_paths()))
                        return
                    tx.read_app_id(opts.txn_app_id)
                    tx.add(SetTransaction(opts.txn_app_id, opts.txn_version, int(time.time() * 1000)))
                params: dict[str, Any] = {"mode": "Overwrite" if self.overwrite else "Append",
                                          "partitionBy": json.dumps(list(snap.partition_columns))}
                if self.overwrite:
                    where = opts.replace_where
                    if where is not None:
                        if not _only_partition_columns(where, snap):
                            raise ValueError(f"replaceWhere must be a predicate on partition columns {snap.partition_columns}: {where!r}")
                        tx.read_predicate(where)
                        victims = candidates(snap, where)
                        params["predicate"] = json.dumps([where])
                    else:
                        tx.read_whole()
                        victims = snap.files()
                    tx.read_files_from(victims)
                    for a in victims:
                        tx.remove(a)
                tx.stage(adds)
            except BaseException:
                staging.delete_staged(opts.root, adds)
                raise
            with _naming_unknown_outcome(opts, adds):
                tx.commit("WRITE", changes_data=True, parameters=params)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.opts, messages)


def _only_partition_columns(where: str, snap: Snapshot) -> bool:
    """True when every column `where` names is a partition column."""
    try:
        cols = {c.lower() for c in columns_of(parse(where))}
    except ValueError:
        return False
    return cols <= {c.lower() for c in snap.partition_columns}


# --------------------------------------------------------------------------- the data source


class _NothingToWrite(DataSourceArrowWriter):
    """Save mode `ignore` on a table that exists: tasks drain their input, nothing is staged or committed."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        return None


class DeltaCoordDataSource(DeltaCoordSource):
    """The `deltacoord` data source: reads (`DeltaCoordSource`) plus batch and streaming writes."""

    #: Lower-case write option names a subclass accepts besides the sink's own.
    extra_write_options: ClassVar[frozenset[str]] = frozenset()

    def _sink_options(self) -> SinkOptions:
        """The write options, checked before any task stages a file: names, values, Kafka and the proposals topic."""
        options = dict(self.options.items())
        check_option_names(options, self.extra_write_options)
        opts = SinkOptions.parse(options)
        opts.check_kafka()
        return opts

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = self._sink_options()
        if overwrite and opts.save_mode is not None:
            raise SinkConfigError(f"save mode {opts.save_mode} and overwrite exclude each other")
        snap = prepare_table(opts, schema)
        if snap is None:
            return _NothingToWrite()
        replace_where = opts.replace_where if overwrite else None
        return DeltaCoordBatchWriter(opts, _stage_plan(opts, snap, replace_where), overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts = self._sink_options()
        opts.app_id()  # checkpointLocation or appId, before a batch is staged
        snap = ensure_table(opts, schema)
        return DeltaCoordStreamWriter(opts, _stage_plan(opts, snap), overwrite)


def worker_python(spark: Any) -> str:
    """The interpreter of this source's Python workers: `spark.pyspark.python`, else `PYSPARK_PYTHON` (Spark's order),
    else this one.

    PySpark's own default is `python3` from `PATH`, which is not the virtual environment deltacoord is
    installed in unless that is activated: the workers then fail with "No module named 'writer'".
    """
    return spark.sparkContext.getConf().get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or sys.executable


def register(spark: Any, source: type[DeltaCoordDataSource] = DeltaCoordDataSource) -> None:
    """Register the `deltacoord` data source with a SparkSession, its Python workers running `worker_python(spark)`,
    and teach PySpark's writers Delta's save modes and `.partitionBy` for it (`deltacoord.writer.spark_save_modes`).

    On Spark Connect the server registers and runs the workers; only the registration happens here."""
    spark_save_modes.install(source.extra_write_options)
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect has no SparkContext
        spark.dataSource.register(source)
        return
    # PySpark captures `sc.pythonExec` in the registered source; every worker of the source runs it.
    default, sc.pythonExec = sc.pythonExec, worker_python(spark)
    try:
        spark.dataSource.register(source)
    finally:
        sc.pythonExec = default


__all__ = [
    "SOURCE_NAME",
    "DeltaCoordBatchWriter",
    "DeltaCoordCommitMessage",
    "DeltaCoordDataSource",
    "DeltaCoordStreamWriter",
    "PartitioningMismatchError",
    "PathExistsError",
    "SinkConfigError",
    "SinkOptions",
    "StagePlan",
    "ensure_table",
    "prepare_table",
    "register",
    "worker_python",
]
