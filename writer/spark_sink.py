"""Write coordinated Delta tables from Spark: the `deltacoord` PySpark data source (read and write).

Register once per session with `register(spark)`; then

* streaming: ``df.writeStream.format("deltacoord").option("path", uri)
  .option("bootstrap.servers", ...).option("topic.prefix", ...)
  .option("checkpointLocation", ...).start()``;
* batch: ``df.write.format("deltacoord").mode("append" | "overwrite")
  [.option("replaceWhere", "<partition predicate>")].save(uri)``;
* reads: everything `reader.spark_source.DeltaCoordSource` does.

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
of the checkpoint path. `abort` deletes staged files when the commit was never
attempted; it keeps them when the commit's outcome is unknown (they may be
committed), leaving at worst orphans for VACUUM.

Options (docs/settings.md names each setting across front doors): ``path``, ``bootstrap.servers``
(required to write; default ``DELTACOORD_BOOTSTRAP_SERVERS`` of the driver), ``topic.prefix``
(default ``DELTACOORD_TOPIC_PREFIX``, else ``deltacoord``), ``checkpointLocation``, ``appId``, ``partitionBy``
(comma-separated, used when the sink creates the table), ``replaceWhere``,
``txnAppId``/``txnVersion`` (idempotent batch writes, as in Delta),
``decisionTimeoutS`` (default ``DELTACOORD_TIMEOUT``, else 60), ``writerName``, ``writerKey`` (a writer key file that signs
every proposal; default ``DELTACOORD_WRITER_KEY`` of the driver), ``metricsPath`` (a JSON-lines file the
driver appends per-commit timings to, for benchmarks), and ``kafka.<key>``
passed to the Kafka client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

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

from reader.log import TableNotFoundError, commit_object, read_commit
from reader.snapshot import Snapshot, delta_schema_to_arrow
from reader.spark_source import SOURCE_NAME, DeltaCoordSource, storage_options_of
from reader.storage import TableStorage
from schemas import client_settings
from schemas.actions import AddFile, SetTransaction
from schemas.errors import ProtocolChangedException
from schemas.expressions import arrow as expressions
from schemas.expressions.syntax import columns_of, parse
from schemas.routing import Topics
from schemas.signing import resolve_writer_key
from writer import staging
from writer.table import Table

log = logging.getLogger(__name__)

#: Rows buffered per task before a Parquet file is written.
ROWS_PER_FILE = 1_000_000
_PROPOSAL_NS = uuid.UUID("5b0c3f4e-8a57-4c1e-9d59-2f6c8e0a7d11")


class SinkConfigError(ValueError):
    """An option the sink needs is missing or wrong."""


@dataclass
class DeltaCoordCommitMessage(WriterCommitMessage):
    """What one write task staged: its `add` actions (JSON) and row count."""

    adds: list[str]
    num_rows: int


# --------------------------------------------------------------------------- options


def _path_of(location: str) -> Path:
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    return Path(location)


@dataclass(frozen=True)
class SinkOptions:
    """Parsed write options (picklable; travels to executors and commit workers)."""

    uri: str
    bootstrap_servers: str | None
    topic_prefix: str
    checkpoint: str | None
    app_id_option: str | None
    partition_by: tuple[str, ...]
    replace_where: str | None
    txn_app_id: str | None
    txn_version: int | None
    decision_timeout_s: float
    writer_name: str | None
    writer_key: str | None
    metrics_path: str | None
    kafka: tuple[tuple[str, str], ...]
    #: The table's storage options (`storage.<key>` options, delta-rs's keys).
    storage_options: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def parse(options: Mapping[str, str]) -> SinkOptions:
        o = {k.lower(): v for k, v in options.items()}
        path = o.get("path")
        if not path:
            raise SinkConfigError("the deltacoord sink needs a table path: .option('path', ...) or .save(path)")
        pb = o.get("partitionby") or ""
        tv = o.get("txnversion")
        storage_options = storage_options_of(options)
        storage = TableStorage(path, storage_options, fsync=False)
        return SinkOptions(
            uri=storage.local_path() if storage.is_local else storage.location,
            bootstrap_servers=(o.get("bootstrap.servers") or o.get("kafka.bootstrap.servers")
                               or os.environ.get(client_settings.BOOTSTRAP_SERVERS_ENV)),
            topic_prefix=client_settings.topic_prefix(o.get("topic.prefix")),
            checkpoint=o.get("checkpointlocation"),
            app_id_option=o.get("appid"),
            partition_by=tuple(c.strip() for c in pb.split(",") if c.strip()),
            replace_where=o.get("replacewhere"),
            txn_app_id=o.get("txnappid"),
            txn_version=int(tv) if tv is not None else None,
            decision_timeout_s=client_settings.decision_timeout(float(o["decisiontimeouts"]) if o.get("decisiontimeouts")
                                                                else None),
            writer_name=o.get("writername"),
            writer_key=o.get("writerkey"),
            metrics_path=o.get("metricspath"),
            kafka=tuple(sorted((k[len("kafka."):], v) for k, v in o.items()
                               if k.startswith("kafka.") and k != "kafka.bootstrap.servers")),
            storage_options=tuple(sorted(storage_options.items())),
        )

    @property
    def root(self) -> TableStorage:
        """The table's storage (built in the process that asks: obstore does not travel)."""
        return TableStorage(self.uri, dict(self.storage_options), fsync=False)

    def table(self) -> Table:
        if not self.bootstrap_servers:
            raise SinkConfigError("the deltacoord sink needs option 'bootstrap.servers' (the Kafka cluster of the "
                                  f"coordinator), or {client_settings.BOOTSTRAP_SERVERS_ENV} set for the driver")
        kafka_config: dict[str, Any] = dict(self.kafka)
        key = resolve_writer_key(self.writer_key)
        return Table(self.uri, self.bootstrap_servers, topics=Topics.with_prefix(self.topic_prefix),
                     writer_name=self.writer_name or (None if key is not None else "spark"), writer_key=key,
                     decision_timeout_s=self.decision_timeout_s, storage_options=dict(self.storage_options), **kafka_config)

    def app_id(self) -> str:
        """The streaming query's app id: option, else Spark's query id from the checkpoint, else a hash of its path."""
        if self.app_id_option:
            return self.app_id_option
        if not self.checkpoint:
            raise SinkConfigError("a streaming write to deltacoord needs option 'checkpointLocation' (or 'appId')")
        ckpt = _path_of(self.checkpoint)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            first = (ckpt / "metadata").read_text().splitlines()[0]
            qid = json.loads(first)["id"]
            if isinstance(qid, str) and qid:
                return qid
        return str(uuid.uuid5(_PROPOSAL_NS, str(ckpt.resolve())))

    def proposal_id(self, table_id: str, app_id: str, batch_id: int, read_version: int) -> str:
        """Deterministic per (table, app id, batch, checkpoint, read version): a batch re-run on the same snapshot
        is the same proposal (answered with its first decision). The coordinator decides each proposal id once,
        so a re-run after a rejection must read a newer snapshot to be decided again; the batch's SetTransaction
        keeps a re-run from committing twice whatever its id."""
        ckpt = str(_path_of(self.checkpoint).resolve()) if self.checkpoint else ""
        return str(uuid.uuid5(_PROPOSAL_NS, f"{table_id}\x00{app_id}\x00{batch_id}\x00{ckpt}\x00{read_version}"))


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

    def conform(self, batch: pa.RecordBatch | pa.Table) -> pa.Table:
        t = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        extra = [n for n in t.column_names if self.schema.get_field_index(n) < 0]
        if extra:
            raise staging.SchemaError(f"columns {extra} are not in the table schema {self.schema.names}")
        cols = []
        for f in self.schema:
            if f.name in t.column_names:
                col = t.column(f.name)
                cols.append(col if col.type == f.type else col.cast(f.type))
            else:
                cols.append(pa.nulls(t.num_rows, f.type))
        return pa.Table.from_arrays(cols, schema=self.schema)

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
                    adds.extend(staging.write_data_files(root, pa.concat_tables(pending), self.partition_columns))
                    total += rows
                    pending, rows = [], 0
            if pending:
                adds.extend(staging.write_data_files(root, pa.concat_tables(pending), self.partition_columns))
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


def _check_partitioning(opts: SinkOptions, snap: Snapshot, adds: Sequence[AddFile]) -> None:
    """Files staged for another partitioning than the table's (it changed while the write ran) cannot commit."""
    want = set(snap.partition_columns)
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
            log.warning("commit %s of %s not published within %.0fs; keeping %d staged file(s)", version, root.location, wait_s,
                        len(adds))
            return
        time.sleep(0.05)
    committed = {a.path for a in read_commit(commit) if isinstance(a, AddFile)}
    _delete_not_live(root, adds, committed)


# --------------------------------------------------------------------------- table creation (driver)


def _arrow_schema_of(spark_schema: StructType) -> pa.Schema:
    s = to_arrow_schema(spark_schema, timezone="UTC")
    return pa.schema([pa.field(f.name, staging.normalize_arrow_type(f.type), f.nullable) for f in s])


def ensure_table(opts: SinkOptions, spark_schema: StructType) -> Snapshot:
    """The table's latest snapshot, creating the table from the DataFrame's schema when the path has none."""
    try:
        return Snapshot.load(opts.uri, storage_options=dict(opts.storage_options))
    except TableNotFoundError:
        pass
    with opts.table() as t:
        with contextlib.suppress(ProtocolChangedException):  # someone else created it at the same time
            t.create(_arrow_schema_of(spark_schema), partition_by=opts.partition_by)
        deadline = time.monotonic() + opts.decision_timeout_s
        while True:
            try:
                return Snapshot.load(opts.uri, storage_options=dict(opts.storage_options))
            except TableNotFoundError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def _stage_plan(opts: SinkOptions, snap: Snapshot, replace_where: str | None = None) -> StagePlan:
    schema = delta_schema_to_arrow(snap.metadata.schema())
    return StagePlan(opts.uri, schema, tuple(snap.partition_columns), replace_where, opts.storage_options)


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
                snap = table.snapshot()
                _check_partitioning(opts, snap, adds)
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
            result = tx.commit(
                "STREAMING UPDATE",
                changes_data=bool(adds) or self.overwrite,
                parameters={"outputMode": "Complete" if self.overwrite else "Append", "queryId": app_id, "epochId": str(batchId)},
            )
            t_decided = time.monotonic()
            if result.already_committed:
                log.info("batch %s of app %s was already committed at version %s (re-run after a failure)", batchId, app_id, result.version)
                _delete_unless_in_commit(opts.root, adds, result.version)
            _record_metrics(opts, {
                **entry, "version": result.version, "duplicate": result.already_committed,
                "setup_ms": (t_propose - t_start) * 1000, "propose_to_decision_ms": (t_decided - t_propose) * 1000,
                "commit_ms": (time.monotonic() - t_start) * 1000,
            })

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.opts, messages)


def _abort(opts: SinkOptions, messages: Sequence[WriterCommitMessage | None]) -> None:
    """Delete staged files when the commit cannot have been proposed (some task failed, so Spark never called commit).

    When every task succeeded, the failure came from `commit`: a rejection already
    deleted its files, and an unknown outcome may still commit them, so they stay.
    """
    adds = _adds_of(messages)
    if any(m is None for m in messages) or not messages:
        staging.delete_staged(opts.root, adds)
    elif adds:
        log.warning("commit of %d staged file(s) failed with an unknown outcome; keeping them (VACUUM removes orphans)", len(adds))


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
                snap = table.snapshot()
                _check_partitioning(opts, snap, adds)
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
                        victims = table._candidates(snap, where)
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


class DeltaCoordDataSource(DeltaCoordSource):
    """The `deltacoord` data source: reads (`DeltaCoordSource`) plus batch and streaming writes."""

    def _sink_options(self) -> SinkOptions:
        return SinkOptions.parse(dict(self.options.items()))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = self._sink_options()
        snap = ensure_table(opts, schema)
        replace_where = opts.replace_where if overwrite else None
        return DeltaCoordBatchWriter(opts, _stage_plan(opts, snap, replace_where), overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts = self._sink_options()
        snap = ensure_table(opts, schema)
        return DeltaCoordStreamWriter(opts, _stage_plan(opts, snap), overwrite)


def register(spark: Any) -> None:
    """Register the `deltacoord` data source with a SparkSession (`spark.dataSource.register`)."""
    spark.dataSource.register(DeltaCoordDataSource)


__all__ = [
    "SOURCE_NAME",
    "DeltaCoordBatchWriter",
    "DeltaCoordCommitMessage",
    "DeltaCoordDataSource",
    "DeltaCoordStreamWriter",
    "SinkConfigError",
    "SinkOptions",
    "StagePlan",
    "ensure_table",
    "register",
]
