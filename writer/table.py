"""`Table`: the batch writer people call.

Each operation reads the snapshot it needs from `_delta_log`, stages Parquet
files, and proposes one commit declaring precisely what it read, because the
coordinator can only be as permissive as the declarations are narrow:

* a blind append reads nothing (it conflicts only with metadata changes);
* DELETE/UPDATE declare their condition and the files they scanned after
  partition pruning (with the coordinator's own matcher) and min/max data
  skipping (files skipped were never read): `deltacoord.schemas.expressions.files_read`;
* MERGE declares its target-only conjuncts and the target files it scanned
  (pruned and skipped the same way);
* OVERWRITE with `replace_where` declares that predicate and the files it
  replaces; a full overwrite reads the whole table;
* OPTIMIZE (and `compact`, minor or major) declares only the files it
  compacted and changes no data;
* TRUNCATE removes every file of the table or of the partitions it names.

Each kind of operation lives in a module of its own, which `Table` delegates to: appends, overwrites and
TRUNCATE (`table_writes`), DELETE and UPDATE (`row_changes`), MERGE and its builder (`merge`), OPTIMIZE,
REORG and compactions (`maintenance`), CREATE and ALTER (`table_ddl`), adopt, release and drop
(`table_control`), and what they share (`operations`).

Every operation accepts `snapshot=` so callers can run several operations
from one snapshot (as concurrent writers would) and see Delta's conflicts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import pyarrow as pa

from deltacoord.reader.deletion_vectors import DEFAULT_INLINE_MAX_BYTES
from deltacoord.reader.log import TableNotFoundError, commit_key, list_log_from_hint, newest_commit_version
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas import client_settings
from deltacoord.schemas.actions import Protocol
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.routing import Topics
from deltacoord.schemas.signing import WriterKey, resolve_writer_key
from deltacoord.storage.table import TableStorage
from deltacoord.writer import maintenance, merge, row_changes, table_control, table_ddl, table_writes
from deltacoord.writer.client import CoordinatorClient, check_kafka_keywords
from deltacoord.writer.merge import Assignments, MergeError, TableMerger
from deltacoord.writer.operations import Progress, check_writable, conform_column
from deltacoord.writer.table_ddl import TableExistsError
from deltacoord.writer.transaction import CommitResult, Transaction, WaitFor, check_wait
from deltacoord.writer.vacuum import VacuumResult, vacuum

__all__ = ["Assignments", "MergeError", "Progress", "PublicationLagError", "Table", "TableExistsError", "TableMerger",
           "check_writable", "conform_column"]


class PublicationLagError(DeltaCoordError):
    """A version this handle committed is not in `_delta_log` in time: the publisher is behind or halted."""


class Table:
    """A handle on one coordinated Delta table.

    `uri` is a local path or an object-store URI (`s3://`, `s3a://`, `az://`,
    `abfss://`, `gs://`); `storage_options` are delta-rs's keys (endpoint, region,
    credentials, `AWS_ALLOW_HTTP`, ...), else each cloud's environment chain.
    The writer writes data files only; `_delta_log` is the coordinator's.

    Every operation returns once its version is published in `_delta_log`
    (`wait="published"`, the default), so Spark, delta-rs and any Delta reader
    see it; with `wait="ratified"` it returns once the decision is recorded in
    Kafka, a few milliseconds earlier, and `snapshot(ratified=True)` reads it.
    A ratified version not published within `publish_timeout_s` raises
    `CommitNotPublishedError` (it is committed all the same). A handle reads its
    own writes: after it commits version v, published snapshots wait (up to
    `publish_timeout_s`) until v is in `_delta_log`.

    `writer_key` (a `WriterKey`, a key file's path, or the key text; default:
    `DELTACOORD_WRITER_KEY`) signs every proposal, and the writer name is the
    key's name: tables with registered writer keys accept nothing else.

    The settings carry the CLI's names (docs/settings.md): `bootstrap_servers`
    defaults to DELTACOORD_BOOTSTRAP_SERVERS, `topic_prefix` to
    DELTACOORD_TOPIC_PREFIX (else `deltacoord`; `topics=` names the topics one by
    one instead), `decision_timeout_s` to DELTACOORD_TIMEOUT (else 60). Before anything is staged, the handle checks that a live
    coordinator holds the table's proposals partition and raises
    `NoCoordinatorError` at once when none does (`coordinator_group`,
    `coordinator_check`: see `CoordinatorClient`). `relay` (default DELTACOORD_RELAY)
    is the Unix socket of the host's relay (`deltacoord relay run`, `deltacoord.writer.relay`):
    proposals and their answers then go through it, not Kafka clients of this process.

    Every write operation takes `proposal_id`: after an unknown outcome
    (`CommitOutcomeUnknownError`, or an interrupt while waiting), repeating the
    operation with the proposal id it named commits at most once.

    One handle may be shared by threads, and their calls run at the same time. Each call is a transaction of its
    own over the handle's one producer and reply reader, which routes answers by proposal id. A lock guards only
    the newest version committed and the cached snapshot, and no call waits for another's commit. The costs:
    blind appends of several threads may share a version (coalesced); a delivery wait also waits for the other
    threads' proposals in flight on the shared producer; a conflict or a metadata change in one thread makes
    the handle's next blind appends read the log again (docs/python.md, "One table from several threads").
    """


    def __init__(self, uri: str | Path, bootstrap_servers: str | None = None, *, table_id: str | None = None,
                 topic_prefix: str | None = None, topics: Topics | None = None, writer_name: str | None = None,
                 decision_timeout_s: float | None = None, publish_timeout_s: float = 60.0,
                 client: CoordinatorClient | None = None,
                 storage_options: Mapping[str, str] | None = None, writer_key: WriterKey | str | Path | None = None,
                 dv_inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES, wait: WaitFor = "published",
                 coordinator_group: str | None = None, coordinator_check: bool | None = None,
                 relay: str | None = None, **kafka_config: Any) -> None:
        check_kafka_keywords(Table.__init__, kafka_config)
        self.storage = TableStorage(uri, storage_options, fsync=False)
        # Local tables keep the absolute file:// URI of their directory as location and id.
        self.uri = Path(self.storage.local_path()).as_uri() if self.storage.is_local else self.storage.location
        self.table_id = table_id or self.uri
        self.writer_key = resolve_writer_key(writer_key)
        if self.writer_key is not None:
            if writer_name is not None and writer_name != self.writer_key.name:
                raise ValueError(f"writer_name {writer_name!r} differs from the name of the writer key, "
                                 f"{self.writer_key.name!r}: a signed proposal's writer is its key's name")
            writer_name = self.writer_key.name
        self.writer_name = writer_name
        self.decision_timeout_s = client_settings.decision_timeout(decision_timeout_s)
        self.publish_timeout_s = publish_timeout_s
        self.wait: WaitFor = check_wait(wait)
        self._own_client = client is None
        #: Deletion vectors whose bitmap is at most this size are stored in the log, larger ones in files.
        self.dv_inline_max_bytes = dv_inline_max_bytes
        self.client = client or CoordinatorClient(bootstrap_servers, topics=topics, topic_prefix=topic_prefix,
                                                  coordinator_group=coordinator_group,
                                                  coordinator_check=coordinator_check, relay=relay, **kafka_config)
        # Shared by the threads committing through this handle: each commit is its own `Transaction` with its own
        # proposal id and answer (`CoordinatorClient` routes answers by id), so only these two need the lock.
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._floor = -1  # newest version this handle committed
        #: Counts drops of the cached snapshot: one loaded before a drop is not cached after it (`_keep`).
        self._generation = 0

    @property
    def root(self) -> Path:
        """The table's local directory (local tables only; any table has `storage`)."""
        return Path(self.storage.local_path())

    @property
    def storage_options(self) -> dict[str, str]:
        return self.storage.storage_options

    # -- snapshots ------------------------------------------------------------------
    def committed(self, version: int, *, changed_metadata: bool = False) -> None:
        """Called by Transaction on success: later snapshots must include `version`."""
        with self._lock:
            self._floor = max(self._floor, version)  # another thread's commit may be newer, and told first
            if changed_metadata:
                self._drop_cached()  # a cached pre-change snapshot would make our own appends conflict

    @property
    def last_committed_version(self) -> int | None:
        """The newest version this handle committed (None before its first commit)."""
        return self._floor if self._floor >= 0 else None

    def invalidate(self) -> None:
        """Forget the cached snapshot (after a conflict, so a retry reads a fresh one)."""
        with self._lock:
            self._drop_cached()

    def _drop_cached(self) -> None:
        """Forget the cached snapshot, and any being loaded meanwhile by another thread (the caller holds `_lock`)."""
        self._snapshot = None
        self._generation += 1

    def _keep(self, snap: Snapshot, generation: int) -> None:
        """Cache `snap`, loaded from cache generation `generation`, unless the cache was dropped since it began
        loading or another thread cached a newer one: a slow load finishing last must not bring back a snapshot
        from before a conflict or a metadata change of this handle."""
        with self._lock:
            if generation == self._generation and (self._snapshot is None or snap.version >= self._snapshot.version):
                self._snapshot = snap

    def wait_published(self, version: int, timeout_s: float | None = None) -> None:
        """Block until `_delta_log` holds `version` (publication follows the decision).

        Polls for the version's own commit file (one HEAD on an object store); now and
        then it also asks for the newest version, in case log cleanup already removed it.
        """
        timeout = self.publish_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        delay = 0.002
        polls = 0
        latest: int | None = None
        while True:
            if self.storage.exists(commit_key(version)):
                return
            polls += 1
            if polls % 10 == 0:
                latest = newest_commit_version(self.storage)
                if latest >= version:
                    return
            if time.monotonic() >= deadline:
                raise PublicationLagError(
                    f"version {version} of {self.uri} was committed but is not in _delta_log after {timeout:.1f}s "
                    f"(published: {latest}); the coordinator's publisher is behind or the table is halted"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def snapshot(self, version: int | None = None, *, ratified: bool = False,
                 files_on_demand: bool = False) -> Snapshot:
        """The published snapshot (latest by default), never older than this handle's own commits.

        With `ratified=True`, the latest snapshot including versions ratified in Kafka but not yet
        in `_delta_log` (read from the commits topic): it never waits on publication. With
        `files_on_demand=True`, the checkpoint's live files are read when first asked for (`Snapshot.load`).
        """
        generation = self._generation
        if ratified:
            if version is not None:
                raise ValueError("snapshot(ratified=True) reads the latest version: give no version")
            snap = Snapshot.load(self.uri, storage_options=self.storage_options,
                                 ratified=self.client.ratified_source(self.table_id), files_on_demand=files_on_demand)
            self._keep(snap, generation)
            return snap
        if version is not None:
            if version <= self._floor:
                self.wait_published(version)
            return Snapshot.load(self.uri, version=version, storage_options=self.storage_options,
                                 files_on_demand=files_on_demand)
        if self._floor >= 0:
            self.wait_published(self._floor)
        snap = Snapshot.load(self.uri, storage_options=self.storage_options, files_on_demand=files_on_demand)
        self._keep(snap, generation)
        return snap

    def cached_snapshot(self) -> Snapshot:
        """For blind appends: any recent snapshot will do (they conflict only with metadata changes), and its
        files are read only if asked for (an append reads none)."""
        return self._snapshot or self.snapshot(files_on_demand=True)

    def restart_at(self, version: int) -> None:
        """A table (re)created (or dropped, -1) at this location: versions this handle committed to an earlier
        table there are no floor for later snapshots."""
        with self._lock:
            self._floor = version
            self._drop_cached()

    def begin(self, snapshot: Snapshot | None = None, *, proposal_id: str | None = None) -> Transaction:
        """Start a low-level transaction at the given (default: latest) snapshot."""
        snap = snapshot or self.snapshot()
        return Transaction(self, snap.version, proposal_id)

    def begin_operation(self, read_version: int, proposal_id: str | None) -> Transaction:
        """A write operation's transaction, once a coordinator is known to serve the table (NoCoordinatorError
        before anything is staged otherwise; the answer is cached, see `deltacoord.writer.serving`)."""
        tx = Transaction(self, read_version, proposal_id)
        self.client.ensure_coordinator(self.table_id)
        return tx

    def exists(self) -> bool:
        try:
            return list_log_from_hint(self.storage).latest_version is not None
        except TableNotFoundError:
            return False

    def begin_create(self, schema: pa.Schema, partition_by: Sequence[str] = (), properties: Mapping[str, str] | None = None,
                     name: str | None = None, *, features: Sequence[str] = (), protocol: Protocol | None = None,
                     constraints: Mapping[str, str] | None = None, proposal_id: str | None = None) -> Transaction:
        """A transaction creating the table (read version -1); `create` = existence check + this + commit.

        The protocol is the least one that has `features`, the features the properties and the schema
        need, and `protocol`'s (`deltacoord.writer.table_protocol`), plus the project's own writer feature
        `deltacoord-coordinated` (`deltacoord.schemas.table_features.COORDINATED`, so at writer version 7: Delta writers
        that follow the protocol refuse to write the table around the coordinator); a feature this writer cannot honour is refused
        here, naming it (UnsupportedTableFeatureError). `constraints` are CHECK constraints {name: SQL}
        (the properties `delta.constraints.<name>`). The schema's fields carry NOT NULL (`nullable=False`)
        and Delta column metadata as Arrow field metadata: `{"delta.generationExpression": "<SQL>"}` makes a
        generated column, `{"delta.invariants": ...}` a legacy invariant.
        """
        return table_ddl.begin_create(self, schema, partition_by, properties, name, features=features,
                                      protocol=protocol, constraints=constraints, proposal_id=proposal_id)

    def create(self, schema: pa.Schema, partition_by: Sequence[str] = (), properties: Mapping[str, str] | None = None,
               name: str | None = None, *, features: Sequence[str] = (), protocol: Protocol | None = None,
               constraints: Mapping[str, str] | None = None, proposal_id: str | None = None) -> CommitResult:
        """CREATE TABLE (`begin_create` says what the arguments give). Two writers racing on an empty directory:
        the loser gets ProtocolChangedException.

        An existing table is TableExistsError whether it is seen in `_delta_log`
        or only by the coordinator (version 0 ratified, not yet published). A location another table id
        holds is InvalidProposalError(TABLE_LOCATION_TAKEN); a Delta table the coordinator does not decide,
        appearing after the check here, is refused by the coordinator (TABLE_EXISTS_UNCOORDINATED).
        """
        return table_ddl.create(self, schema, partition_by, properties, name, features=features, protocol=protocol,
                                constraints=constraints, proposal_id=proposal_id)

    def adopt(self, *, timeout_s: float | None = None) -> CommitResult:
        """Put this existing Delta table (written by Spark, delta-rs, any Delta writer) under the coordinator,
        from its current version N: the coordinator reads the table's checkpoint and commits through its own
        storage, records the adoption on the commits topic and decides every commit from N + 1 on.

        Stop the table's other writers first: a version written around the coordinator after the adoption
        halts the table. Right after the adoption, version N + 1 (an UPGRADE PROTOCOL commit through the
        coordinator) adds the project's own writer feature `deltacoord-coordinated` to the protocol, so that
        Delta on Spark and delta-rs refuse to write the table from then on; readers read it as before.
        Returns N (`already_committed` when the table was adopted before: its version is then the one the
        coordinator is at). Adopting again after a failed upgrade commit retries the upgrade. Refusals are
        `InvalidProposalError`s: UNKNOWN_TABLE (no table there), UNSUPPORTED_TABLE_FEATURE (a writer feature
        deltacoord cannot honour), TABLE_OUTSIDE_ROOTS, TABLE_ALREADY_COORDINATED, UNREADABLE_TABLE, TABLE_LOCATION_TAKEN
        (another table id holds the location, `deltacoord.reader.claim`: checked here before sending, and by the coordinator).
        """
        return table_control.adopt(self, timeout_s=timeout_s)

    def release(self, *, timeout_s: float | None = None) -> CommitResult:
        """Hand this table back to uncoordinated writers: once every version it ratified is in `_delta_log`,
        the coordinator records the release and stops deciding the table; later proposals are refused
        (TABLE_RELEASED, naming `adopt`). Returns the last coordinated version.

        Stop the writers that commit through deltacoord first (docs/operations.md, "Adopt and release").
        Just before the release, a DROP FEATURE commit through the coordinator removes the project's writer
        feature `deltacoord-coordinated` from the protocol (back to the legacy protocol the features left
        imply, as Delta does), so that Delta on Spark and delta-rs write the released table again; if the
        release is then refused, the feature is put back (when the coordinator still takes commits).
        """
        return table_control.release(self, timeout_s=timeout_s)

    def drop(self, *, delete_files: bool = False, timeout_s: float | None = None) -> CommitResult:
        """DROP TABLE for a path table: the coordinator forgets this table for good (recorded on the commits topic,
        so neither a restart, recovery nor a state snapshot brings it back) and frees its location; a table created
        there afterwards starts from version 0 under a new Delta table id. Returns the version it was dropped at
        (`already_committed` when this drop was answered before).

        `delete_files=True` is Delta's DROP TABLE of a path table: the coordinator deletes every file under the
        table's root first (its log, data files and claim). Without it the files stay as an uncoordinated Delta
        table (as `release` leaves it: a DROP FEATURE commit first removes the `deltacoord-coordinated` writer
        feature, so Delta writers may write it again, and `adopt` takes it back). A halted table may be dropped
        (one whose files were deleted around the coordinator is halted, naming this); a halted table whose log is
        still there is dropped with `delete_files=True`, or resumed first. Stop the table's writers first.
        """
        return table_control.drop(self, delete_files=delete_files, timeout_s=timeout_s)

    def _control(self, kind: str, operation: str, timeout_s: float | None,
                 parameters: Mapping[str, str] | None = None) -> CommitResult:
        """An adopt, release or drop request (a proposal without actions, `deltacoord.schemas.routing.CONTROL_ADOPT`) and its
        answer."""
        return table_control.control(self, kind, operation, timeout_s, parameters)

    def set_properties(self, properties: Mapping[str, str], *, snapshot: Snapshot | None = None,
                       proposal_id: str | None = None) -> CommitResult:
        """ALTER TABLE SET TBLPROPERTIES (a metaData action: concurrent writers get MetadataChangedException)."""
        return table_ddl.set_properties(self, properties, snapshot=snapshot, proposal_id=proposal_id)

    def add_columns(self, fields: Sequence[pa.Field], *, snapshot: Snapshot | None = None,
                    proposal_id: str | None = None) -> CommitResult:
        """ALTER TABLE ADD COLUMNS (nullable, as Delta requires for existing rows)."""
        return table_ddl.add_columns(self, fields, snapshot=snapshot, proposal_id=proposal_id)

    def append(self, data: Any, *, app_id: str | None = None, app_version: int | None = None,
               snapshot: Snapshot | None = None, progress: Progress | None = None,
               proposal_id: str | None = None) -> CommitResult:
        """A blind append (reads nothing). With app_id/app_version, exactly once per app version.

        On a `maxcompute` table it starts from the latest snapshot (an INSERT INTO
        fails against one committed after its read version).

        An app version <= the recorded one is skipped (`already_committed=True`);
        two pipelines with one app id racing get ConcurrentTransactionException.
        A `pyarrow.RecordBatchReader` (or an iterator of tables or batches) is staged as it is read, in
        files of about the table's target size (`delta.targetFileSize`, else 128 MiB of data as Arrow holds
        it), so memory stays bounded by about one file; `progress(rows, files, bytes)` is called after each
        staged file's worth.
        """
        return table_writes.append(self, data, app_id=app_id, app_version=app_version, snapshot=snapshot,
                                   progress=progress, proposal_id=proposal_id)

    def overwrite(self, data: Any, replace_where: str | None = None, *, snapshot: Snapshot | None = None,
                  proposal_id: str | None = None) -> CommitResult:
        """INSERT OVERWRITE: replace the whole table, or only the partitions `replace_where` selects.

        `replace_where` may name partition columns only; every written row must
        satisfy it (else REPLACE_WHERE_MISMATCH, as Delta's
        DELTA_REPLACE_WHERE_MISMATCH). It declares the predicate and the
        replaced files as read, so overwrites of disjoint partitions commit
        concurrently; a full overwrite reads the whole table.
        """
        return table_writes.overwrite(self, data, replace_where, snapshot=snapshot, proposal_id=proposal_id)

    def delete(self, where: str | None = None, *, snapshot: Snapshot | None = None,
               proposal_id: str | None = None) -> CommitResult:
        """DELETE FROM table [WHERE `where`], reading `snapshot` (default: latest)."""
        return row_changes.delete(self, where, snapshot=snapshot, proposal_id=proposal_id)

    def update(self, where: str | None, set: Mapping[str, str], *, snapshot: Snapshot | None = None,
               proposal_id: str | None = None) -> CommitResult:
        """UPDATE table SET col = <SQL expression> ... [WHERE `where`], reading `snapshot` (default: latest).

        Generated columns the SET omits are recomputed for the updated rows; the updated rows are checked
        against the table's constraints before anything is staged (`deltacoord.writer.constraints`)."""
        return row_changes.update(self, where, set, snapshot=snapshot, proposal_id=proposal_id)

    @overload
    def merge(self, source: Any, on: str | Sequence[str], *, source_alias: str = "s", target_alias: str = "t",
              snapshot: Snapshot | None = None, proposal_id: str | None = None) -> TableMerger: ...

    @overload
    def merge(self, source: Any, on: str | Sequence[str], *, when_matched_update: Assignments,
              when_not_matched_insert: Assignments | None = None, when_matched_delete: bool | str = False,
              when_not_matched_insert_if: str | None = None, source_alias: str = "s", target_alias: str = "t",
              snapshot: Snapshot | None = None, proposal_id: str | None = None) -> CommitResult: ...

    @overload
    def merge(self, source: Any, on: str | Sequence[str], *, when_matched_update: Assignments | None = None,
              when_not_matched_insert: Assignments, when_matched_delete: bool | str = False,
              when_not_matched_insert_if: str | None = None, source_alias: str = "s", target_alias: str = "t",
              snapshot: Snapshot | None = None, proposal_id: str | None = None) -> CommitResult: ...

    @overload
    def merge(self, source: Any, on: str | Sequence[str], *, when_matched_update: Assignments | None = None,
              when_not_matched_insert: Assignments | None = None, when_matched_delete: bool | str,
              when_not_matched_insert_if: str | None = None, source_alias: str = "s", target_alias: str = "t",
              snapshot: Snapshot | None = None, proposal_id: str | None = None) -> CommitResult: ...

    def merge(self, source: Any, on: str | Sequence[str], *, when_matched_update: Assignments | None = None,
              when_not_matched_insert: Assignments | None = None, when_matched_delete: bool | str = False,
              when_not_matched_insert_if: str | None = None, source_alias: str = "s", target_alias: str = "t",
              snapshot: Snapshot | None = None, proposal_id: str | None = None) -> CommitResult | TableMerger:
        """MERGE INTO table t USING source s ON `on` (an upsert by equi-join keys).

        `on` is key column names (same on both sides) or SQL such as
        ``s.id = t.id AND t.date = '2024-01-01'``. Target-only conjuncts prune
        files and are declared as the read predicate, so merges into disjoint
        partitions commit concurrently; without them MERGE reads the whole
        table. Clauses: "*" or {target column: SQL over s./t. columns}.

        `when_matched_delete` (True, or a SQL condition over s./t. columns) is
        `WHEN MATCHED [AND cond] THEN DELETE` listed before the update clause:
        matched rows it selects are deleted, the other matched rows updated.
        `when_not_matched_insert_if` is `WHEN NOT MATCHED AND cond THEN INSERT`
        (a condition over source columns). Together they apply a change feed:
        delete on ``s.op = 'D'``, update the rest, insert unless ``s.op = 'D'``.

        Without any clause keyword it returns delta-rs's builder (`deltacoord.writer.merge.TableMerger`):
        ``t.merge(src, "s.id = t.id").when_matched_update_all().when_not_matched_insert_all().execute()``,
        with clauses in any order and number (the first whose predicate holds acts on a row), run by the
        same implementation; `execute()` returns this form's result.
        """
        if when_matched_update is None and when_not_matched_insert is None and when_matched_delete is False \
                and when_not_matched_insert_if is None:
            return TableMerger(self, source, on, source_alias=source_alias, target_alias=target_alias,
                               snapshot=snapshot, proposal_id=proposal_id)
        return merge.merge(self, source, on, when_matched_update=when_matched_update,
                           when_not_matched_insert=when_not_matched_insert, when_matched_delete=when_matched_delete,
                           when_not_matched_insert_if=when_not_matched_insert_if, source_alias=source_alias,
                           target_alias=target_alias, snapshot=snapshot, proposal_id=proposal_id)

    def optimize(self, where: str | None = None, target_file_size: int = 128 * 1024 * 1024, min_files: int = 2,
                 *, zorder_by: Sequence[str] = (), max_deleted_rows_ratio: float = 0.05,
                 snapshot: Snapshot | None = None, proposal_id: str | None = None) -> CommitResult:
        """Compact small files per partition; data does not change (dataChange=false).

        A file whose deletion vector deletes more than `max_deleted_rows_ratio` of its rows is rewritten too,
        even alone, as Delta's OPTIMIZE does (`purge` rewrites every file with a vector).

        Declares only the compacted files as read. Without `zorder_by` it keeps the rows' order and
        records where each row went (`deltacoord.schemas.row_map`), so on a deletion-vector table it does not
        conflict with DELETE/UPDATE/MERGE; otherwise it loses (ConcurrentDeleteReadException) only to a
        concurrent removal of a file it read. `zorder_by` (OPTIMIZE ... ZORDER BY) rewrites every file
        of each partition in Z-order of those columns (`deltacoord.writer.zorder`) and keeps the file-level rules.
        It is a minor compaction (`compact`).
        """
        return maintenance.optimize(self, where, target_file_size, min_files, zorder_by=zorder_by,
                                    max_deleted_rows_ratio=max_deleted_rows_ratio, snapshot=snapshot,
                                    proposal_id=proposal_id)

    def purge(self, where: str | None = None, *, snapshot: Snapshot | None = None,
              proposal_id: str | None = None) -> CommitResult:
        """REORG TABLE ... APPLY (PURGE): rewrite every file with a deletion vector (of the partitions `where`
        selects) without its deleted rows, so they are gone from storage once VACUUM removes the old files.

        Data does not change (dataChange=false, checked at snapshot isolation) and the rows keep their order,
        recorded in a row map: a concurrent DELETE, UPDATE or MERGE of the same files does not conflict.
        """
        return maintenance.purge(self, where, snapshot=snapshot, proposal_id=proposal_id)

    def compact(self, kind: Literal["minor", "major"] = "minor", where: str | None = None, *,
                small_file_size: int = 128 * 1024 * 1024, snapshot: Snapshot | None = None,
                proposal_id: str | None = None) -> CommitResult:
        """MaxCompute's compactions, per partition (only those `where` selects), changing no data.

        `minor` merges the partition's small files (smaller than `small_file_size`, at
        least two); `major` merges every file of the partition into one (when it has
        more than one, or files with deletion vectors). Both are `OPTIMIZE` commits
        with parameter `compaction` naming the kind, which the `maxcompute` conflict
        profile reads (`deltacoord.schemas.jobs`); neither makes a new time version.
        """
        return maintenance.compact(self, kind, where, small_file_size=small_file_size, snapshot=snapshot,
                                   proposal_id=proposal_id)

    def truncate(self, where: str | None = None, *, snapshot: Snapshot | None = None,
                 proposal_id: str | None = None) -> CommitResult:
        """TRUNCATE TABLE [PARTITION]: remove every file (or those of the partitions `where` selects).

        `where` may name partition columns only. Like an overwrite with no rows, it
        declares the predicate and the removed files as read (the whole table without
        `where`); the `maxcompute` profile treats it as INSERT OVERWRITE.
        """
        return table_writes.truncate(self, where, snapshot=snapshot, proposal_id=proposal_id)

    def vacuum(self, retention_hours: float | None = None, *, dry_run: bool = False,
               enforce_retention: bool = True) -> VacuumResult:
        """VACUUM: delete files no retained version references and older than the retention (see `deltacoord.writer.vacuum`)."""
        return vacuum(self.storage, retention_hours=retention_hours, dry_run=dry_run, enforce_retention=enforce_retention)

    # -- reads ----------------------------------------------------------------------
    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """commitInfo of each version, newest first (includes this handle's own commits)."""
        return self.snapshot().history(limit)

    def to_pyarrow(self, version: int | None = None, **kwargs: Any) -> pa.Table:
        return self.snapshot(version).to_pyarrow(**kwargs)

    def lookup_decision(self, proposal_id: str, timeout_s: float = 30.0) -> Decision | None:
        """The decision of a proposal whose outcome was unknown (None if none is recorded yet)."""
        return self.client.lookup_decision(self.table_id, proposal_id, timeout_s)

    def close(self) -> None:
        if self._own_client:
            self.client.close()

    def __enter__(self) -> Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
