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

Every operation accepts `snapshot=` so callers can run several operations
from one snapshot (as concurrent writers would) and see Delta's conflicts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.reader.claim import CLAIM_KEY, read_claim
from deltacoord.reader.deletion_vectors import (
    DEFAULT_INLINE_MAX_BYTES,
    dv_object,
    keep_mask,
    read_deletion_vector,
    write_deletion_vector,
)
from deltacoord.reader.log import TableNotFoundError, commit_key, data_object, list_log_from_hint, newest_commit_version
from deltacoord.reader.snapshot import (
    Snapshot,
    UnsupportedTableFeatureError,
    delta_schema_to_arrow,
    parse_partition_value,
    to_logical,
)
from deltacoord.schemas import client_settings
from deltacoord.schemas.actions import AddFile, Metadata, Protocol, SetTransaction
from deltacoord.schemas.errors import DeltaCoordError, InvalidProposalError, ProtocolChangedException
from deltacoord.schemas.expressions import arrow as expressions
from deltacoord.schemas.expressions.partitions import prune
from deltacoord.schemas.expressions.scan import files_read
from deltacoord.schemas.expressions.syntax import ExpressionError, columns_of, parse, split_merge_condition
from deltacoord.schemas.identity import identity_columns, with_high_water_marks
from deltacoord.schemas.jobs import COMPACTION_PARAMETER
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.properties import Property, TableProperties
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import (
    ADOPTED_ERROR_TYPE,
    CONTROL_ADOPT,
    CONTROL_DROP,
    CONTROL_PREFIX,
    CONTROL_RELEASE,
    DROP_DELETE_FILES,
    DROPPED_ERROR_TYPE,
    RELEASED_ERROR_TYPE,
    Topics,
)
from deltacoord.schemas.row_map import ROW_MAP_KEY, RowGroup, Source, Target, encode_row_map
from deltacoord.schemas.row_tracking import MaterializedColumns, new_materialized_columns
from deltacoord.schemas.row_tracking import supported as row_tracking_supported
from deltacoord.schemas.signing import WriterKey, resolve_writer_key
from deltacoord.schemas.table_features import (
    COORDINATED,
    coordinated,
    with_coordinated,
    without_coordinated,
    writer_features,
    writer_problems,
)
from deltacoord.storage.table import StorageError, TableStorage
from deltacoord.writer import column_mapping, identity, protocols, row_tracking, staging
from deltacoord.writer.client import CoordinatorClient, check_kafka_keywords
from deltacoord.writer.column_mapping import Layout
from deltacoord.writer.constraints import CONSTRAINT_PREFIX, WriteRules, fill_and_check
from deltacoord.writer.decimals import is_decimal_source, to_decimal
from deltacoord.writer.table_protocol import ProtocolRequestError, new_table, with_column_mapping
from deltacoord.writer.transaction import CommitResult, Transaction, WaitFor, check_wait, error_from_decision
from deltacoord.writer.vacuum import VacuumResult, vacuum
from deltacoord.writer.zorder import zorder

#: A larger row map (a compaction of very many files, or of files with large inline vectors) is not recorded:
#: that OPTIMIZE then keeps the file-level rules (commitInfo is bounded; `deltacoord.coordinator.rules.validate`).
ROW_MAP_MAX_CHARS = 32 * 1024

#: A MERGE clause: "*" (all columns from the source) or target column -> SQL expression over `s.`/`t.` columns.
Assignments = Mapping[str, str] | Literal["*"]


log = logging.getLogger(__name__)


class PublicationLagError(DeltaCoordError):
    """A version this handle committed is not in `_delta_log` in time: the publisher is behind or halted."""


class TableExistsError(ProtocolChangedException):
    """`create` on a location that already holds a Delta table.

    A ProtocolChangedException because it is the creators' race lost before
    proposing: code that tolerates a concurrent creator catches both.
    """

    def __init__(self, uri: str, hint: str = "") -> None:
        super().__init__(hint or f"a Delta table already exists at {uri}; append to it, or create the new table at "
                         "another location", winning_version=0, table=uri)


class MergeError(InvalidProposalError):
    """A MERGE that Delta would refuse (e.g. several source rows matching one target row)."""


#: The table property that turns the change data feed on.
CDF_PROPERTY = "delta.enableChangeDataFeed"


def _cdf_on(properties: Mapping[str, str]) -> bool:
    return str(properties.get(CDF_PROPERTY, "false")).lower() == "true"


def _changed(rows: pa.Table, kind: str) -> pa.Table:
    """`rows` as change data: with the `_change_type` column (delete, insert, update_preimage, update_postimage)."""
    return rows.append_column(staging.CHANGE_TYPE, pa.array([kind] * rows.num_rows, pa.string()))


#: The table feature deletion vectors need (reader 3 / writer 7 protocols list it on both sides).
DV_FEATURE = "deletionVectors"
def _with_dv_feature(p: Protocol) -> Protocol | None:
    """`p` upgraded to support deletion vectors (None when it already does)."""
    if DV_FEATURE in (p.writer_features or ()) and DV_FEATURE in (p.reader_features or ()):
        return None
    writer = list(writer_features(p))
    reader = list(p.reader_features or ())
    if p.min_reader_version == 2:
        reader = ["columnMapping"]
    return Protocol(3, 7, reader_features=(*dict.fromkeys([*reader, DV_FEATURE]),),
                    writer_features=(*dict.fromkeys([*writer, DV_FEATURE]),))


def check_writable(snap: Snapshot, operation: str = "WRITE") -> None:
    """Refuse tables whose declared writer features this writer cannot honour for `operation`
    (`deltacoord.schemas.table_features`): writing them anyway would break the table for every other engine."""
    problems = writer_problems(snap.protocol, snap.metadata, operation)
    if problems:
        feature, why = problems[0]
        more = "" if len(problems) == 1 else f" (and {', '.join(f for f, _ in problems[1:])})"
        raise UnsupportedTableFeatureError(
            f"{snap.table_uri}: cannot {operation} this table: writer feature {feature}: {why}{more}. Write it with "
            "an engine that supports the feature, or change the table so it no longer needs it."
        )


def _deleted_ratio(a: AddFile) -> float:
    """The share of the file's rows its deletion vector deletes (0 without one or without numRecords)."""
    n = a.num_records()
    return a.deletion_vector.cardinality / n if a.deletion_vector is not None and n is not None and n > 0 else 0.0


def _loose_stats(stats: str | None) -> str | None:
    """A file's stats once some of its rows are deleted by a DV: numRecords stays the physical count and the
    min/max bounds may no longer be reached (`tightBounds: false`)."""
    if stats is None:
        return None
    d = json.loads(stats)
    d["tightBounds"] = False
    return json.dumps(d, separators=(",", ":"))


#: Called with the rows, files and bytes staged so far.
Progress = Callable[[int, int, int], None]
#: Rows read at a time from a RecordBatchReader (then gathered into files of the table's target size).
CHUNK_ROWS = 1_000_000


def _chunks(data: Any) -> Iterator[Any]:
    """The data to append in chunks: a RecordBatchReader as tables of at most CHUNK_ROWS rows, an iterator
    (a generator of tables or batches) item by item, anything else whole."""
    if isinstance(data, Iterator):
        yield from data
        return
    if not isinstance(data, pa.RecordBatchReader):
        yield data
        return
    pending: list[pa.RecordBatch] = []
    count = 0
    chunks = 0
    for batch in data:
        pending.append(batch)
        count += batch.num_rows
        if count >= CHUNK_ROWS:
            yield pa.Table.from_batches(pending, schema=data.schema)
            pending, count, chunks = [], 0, chunks + 1
    if pending or not chunks:
        yield pa.Table.from_batches(pending, schema=data.schema)


def _type_family(t: pa.DataType) -> str:
    """Types that cast into each other without changing what a value means (as delta-rs and Spark's
    ANSI store assignment allow): numbers, text, binary, dates and timestamps, booleans, and nested types."""
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "numeric"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return "datetime"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_null(t):
        return "null"
    return str(t)  # nested: the cast itself checks the fields


def _check_assignable(column: str, given: pa.DataType, target: pa.DataType) -> None:
    """Refuse data whose type means something else in the column (an int written into a string column).

    Within a family the cast is Arrow's safe cast: an overflow or a truncation fails instead of changing a value.
    """
    g, want = _type_family(given), _type_family(target)
    if g == "null" or g == want or (g.startswith(("struct", "list", "large_list", "map")) and want == g.split("<")[0]):
        return
    if g.split("<")[0] == want.split("<")[0]:
        return
    if (g, want) == ("string", "datetime"):
        return  # ISO dates and timestamps given as text (JSON has no date type); a value that does not parse fails
    raise staging.SchemaError(f"column {column!r} is {target} in the table but the data has {given}: deltacoord does not "
                              f"cast between {g.split('<')[0]} and {want.split('<')[0]} (it would change the values' meaning); "
                              f"convert the column in the data first, e.g. pyarrow.compute.cast(..., {target})")


def conform_column(name: str, values: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """`values` as the column's type `target`: decimals exactly (`deltacoord.writer.decimals`), others by Arrow's safe cast
    within a family of types (`_check_assignable`); SchemaError naming the column otherwise."""
    if values.type == target:
        return values
    if pa.types.is_decimal(target) and is_decimal_source(values.type):
        return to_decimal(name, values, target)
    _check_assignable(name, values.type, target)
    try:
        return values.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise staging.SchemaError(f"column {name!r}: cannot write {values.type} as {target}: {e}") from e


@contextlib.contextmanager
def _abandoned_on_error(tx: Transaction) -> Iterator[None]:
    """Files staged for `tx` are deleted if preparing it fails before it is proposed."""
    try:
        yield
    except BaseException:
        tx.abandon()
        raise


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
        self._snapshot: Snapshot | None = None
        self._floor = -1  # newest version this handle committed

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
        self._floor = max(self._floor, version)
        if changed_metadata:
            self._snapshot = None  # a cached pre-change snapshot would make our own appends conflict

    @property
    def last_committed_version(self) -> int | None:
        """The newest version this handle committed (None before its first commit)."""
        return self._floor if self._floor >= 0 else None

    def invalidate(self) -> None:
        """Forget the cached snapshot (after a conflict, so a retry reads a fresh one)."""
        self._snapshot = None

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

    def snapshot(self, version: int | None = None, *, ratified: bool = False) -> Snapshot:
        """The published snapshot (latest by default), never older than this handle's own commits.

        With `ratified=True`, the latest snapshot including versions ratified in Kafka but not yet
        in `_delta_log` (read from the commits topic): it never waits on publication.
        """
        if ratified:
            if version is not None:
                raise ValueError("snapshot(ratified=True) reads the latest version: give no version")
            snap = Snapshot.load(self.uri, storage_options=self.storage_options,
                                 ratified=self.client.ratified_source(self.table_id))
            self._snapshot = snap
            return snap
        if version is not None:
            if version <= self._floor:
                self.wait_published(version)
            return Snapshot.load(self.uri, version=version, storage_options=self.storage_options)
        if self._floor >= 0:
            self.wait_published(self._floor)
        snap = Snapshot.load(self.uri, storage_options=self.storage_options)
        self._snapshot = snap
        return snap

    def _cached(self) -> Snapshot:
        """For blind appends: any recent snapshot will do (they conflict only with metadata changes)."""
        return self._snapshot or self.snapshot()

    def begin(self, snapshot: Snapshot | None = None, *, proposal_id: str | None = None) -> Transaction:
        """Start a low-level transaction at the given (default: latest) snapshot."""
        snap = snapshot or self.snapshot()
        return Transaction(self, snap.version, proposal_id)

    def _begin(self, read_version: int, proposal_id: str | None) -> Transaction:
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

    # -- DDL ------------------------------------------------------------------------
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
        props = dict(properties or {})
        for cname, text in (constraints or {}).items():
            props[f"{CONSTRAINT_PREFIX}{cname}"] = text
        for c in partition_by:
            if c not in schema.names:
                raise staging.SchemaError(f"partition column {c!r} is not in the schema {schema.names}")
        if TableProperties(props).row_tracking:
            props = {**new_materialized_columns(), **props}  # where copied rows keep their ids, as Delta names them
        schema_string, props = with_column_mapping(staging.schema_string(schema), props)
        try:
            new = new_table(schema_string, props, features, protocol)
        except ProtocolRequestError as e:
            raise UnsupportedTableFeatureError(f"{self.uri}: cannot create this table: {e}") from e
        md = Metadata(
            id=str(uuid.uuid4()), name=name, schema_string=schema_string, partition_columns=tuple(partition_by),
            configuration=new.configuration, created_time=int(time.time() * 1000),
        )
        # The project's own writer feature: Delta writers that follow the protocol refuse to write around the coordinator.
        protocol = with_coordinated(new.protocol)
        self._check_creatable(protocol, md)
        tx = self._begin(-1, proposal_id)
        tx.add(protocol, md)
        return tx

    def _check_creatable(self, protocol: Protocol, md: Metadata) -> None:
        """Refuse, naming them, the features this writer could not honour on the table it would create, and
        constraints or generation expressions it could not evaluate."""
        problems = writer_problems(protocol, md, "CREATE TABLE")
        if problems:
            listed = "; ".join(f"writer feature {f}: {why}" for f, why in problems)
            raise UnsupportedTableFeatureError(
                f"{self.uri}: cannot create this table: {listed}. Create it without the feature, or with an engine "
                "that supports it.")
        rules = WriteRules.of(protocol, md)
        if rules:
            empty = delta_schema_to_arrow(md.schema()).empty_table()
            for check in rules.checks:
                expressions.compile_filter(check.expression, empty.schema)
            for g in rules.generated:
                expressions.compile_filter(g.expression, empty.schema)

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
        exists = self.exists()
        if self._floor >= 0 or exists:
            raise TableExistsError(self.uri, "" if exists else self._held_hint())
        self._check_location_free("create")
        tx = self.begin_create(schema, partition_by, properties, name, features=features, protocol=protocol,
                               constraints=constraints, proposal_id=proposal_id)
        props = next(dict(a.configuration) for a in tx.actions if isinstance(a, Metadata))
        try:
            created = tx.commit("CREATE TABLE", changes_data=False,
                                parameters={"partitionBy": list(partition_by), "properties": props, "isManaged": "false"})
        except ProtocolChangedException as e:
            if e.winning_version == 0 and not isinstance(e, TableExistsError):
                raise TableExistsError(self.uri, "" if self.exists() else self._held_hint()) from e
            raise
        # A new table: versions this handle committed to a table dropped at this location before are no floor.
        self._floor, self._snapshot = created.version, None
        return created

    def _held_hint(self) -> str:
        """Why a creation on a location without a log is refused: the coordinator still holds a table there."""
        table_opt = "" if self.table_id == self.uri else f" --table-id {self.table_id}"
        return (f"the coordinator still holds table {self.table_id} at {self.uri}, though the location has no "
                "_delta_log (were its files deleted?). Deleting a coordinated table's files does not drop it: drop it "
                f"with `deltacoord table drop {self.uri}{table_opt}` (Python: Table(uri).drop()), then create it again")

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
        self._check_location_free("adopt")
        adopted = self._control(CONTROL_ADOPT, "ADOPT TABLE", timeout_s)
        self._set_coordinated(True, timeout_s)
        return adopted

    def _check_location_free(self, doing: str) -> None:
        """Before a create or adopt is sent: refuse at once (TABLE_LOCATION_TAKEN) a location whose claim
        (`deltacoord.reader.claim`) names another table id. The coordinator checks it again when it decides; a claim this
        writer cannot read is left to it."""
        try:
            holder = read_claim(self.storage)
        except (StorageError, OSError):  # the coordinator decides
            return
        if holder is not None and holder.table_id != self.table_id:
            raise InvalidProposalError(ReasonCode.TABLE_LOCATION_TAKEN, (
                f"{self.uri} is the location of table id {holder.table_id!r} ({CLAIM_KEY}), so table id "
                f"{self.table_id!r} may not {doing} it: two table ids over one _delta_log would both ratify the same "
                f"versions. Open the table under its own id: Table(uri, table_id={holder.table_id!r}) (CLI: "
                f"--table-id {holder.table_id!r}). Nothing was sent"))

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
        dropped = self._set_coordinated(False, timeout_s)
        try:
            return self._control(CONTROL_RELEASE, "RELEASE TABLE", timeout_s)
        except DeltaCoordError:
            if dropped:
                self._put_coordinated_back("release", timeout_s)
            raise

    def _put_coordinated_back(self, what: str, timeout_s: float | None) -> None:
        """After a refused release or drop that had removed the `deltacoord-coordinated` feature: add it again
        (a failure to is logged; the refusal is what the caller raises)."""
        try:
            self._set_coordinated(True, timeout_s)
        except DeltaCoordError as e:
            log.warning("%s: the %s was refused and the %s writer feature could not be put back: %s",
                        self.uri, what, COORDINATED, e)

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
        dropped = False
        if not delete_files:
            try:
                dropped = self._set_coordinated(False, timeout_s)
            except TableNotFoundError:
                pass  # no log left: nothing carries the feature
            except InvalidProposalError as e:
                if e.reason not in (ReasonCode.TABLE_HALTED, ReasonCode.UNKNOWN_TABLE, ReasonCode.TABLE_RELEASED):
                    raise
                # The coordinator decides the drop of a halted, released or unknown table (and says why not).
        try:
            result = self._control(CONTROL_DROP, "DROP TABLE", timeout_s,
                                   parameters={DROP_DELETE_FILES: "true" if delete_files else "false"})
        except DeltaCoordError:
            if dropped:
                self._put_coordinated_back("drop", timeout_s)
            raise
        self._floor = -1
        return result

    def _set_coordinated(self, on: bool, timeout_s: float | None) -> bool:
        """Add (`on`) or remove the `deltacoord-coordinated` writer feature in a protocol-only commit through the
        coordinator, at the latest ratified version; False when the protocol is already as asked."""
        snap = self.snapshot(ratified=True)
        if coordinated(snap.protocol) == on:
            return False
        protocol = with_coordinated(snap.protocol) if on else without_coordinated(snap.protocol)
        tx = self._begin(snap.version, None)
        tx.add(protocol)
        if on:
            operation, parameters = "UPGRADE PROTOCOL", {"newProtocol": json.dumps(protocol.to_json()["protocol"])}
        else:
            operation, parameters = "DROP FEATURE", {"featureName": COORDINATED, "truncateHistory": "false"}
        tx.commit(operation, changes_data=False, parameters=parameters, timeout_s=timeout_s)
        return True

    def _control(self, kind: str, operation: str, timeout_s: float | None,
                 parameters: Mapping[str, str] | None = None) -> CommitResult:
        """An adopt, release or drop request (a proposal without actions, `deltacoord.schemas.routing.CONTROL_ADOPT`) and its
        answer."""
        tx = Transaction(self, newest_commit_version(self.storage))
        tx.proposal_id = f"{CONTROL_PREFIX}{kind}:{uuid.uuid4()}"
        p = tx.proposal(operation, changes_data=False, parameters=parameters)
        pending = self.client.propose(p, key=self.writer_key, wait="ratified", control=kind)
        try:
            d = self.client.decided(pending, p.table_id, timeout_s or self.decision_timeout_s)
        finally:
            self.client.forget(p.proposal_id)
        self.invalidate()
        done = {CONTROL_ADOPT: ADOPTED_ERROR_TYPE, CONTROL_DROP: DROPPED_ERROR_TYPE}.get(kind, RELEASED_ERROR_TYPE)
        if d.error_type != done or d.winning_version is None:
            raise error_from_decision(d)
        return CommitResult(d.winning_version, p.proposal_id, operation, already_committed=d.duplicate_of is not None)

    def _replace_metadata(self, md: Metadata, *, schema_string: str | None = None,
                          configuration: Mapping[str, str] | None = None) -> Metadata:
        return Metadata(id=md.id, schema_string=schema_string or md.schema_string, partition_columns=md.partition_columns,
                        configuration=dict(md.configuration if configuration is None else configuration), name=md.name,
                        description=md.description, created_time=md.created_time)

    def set_properties(self, properties: Mapping[str, str], *, snapshot: Snapshot | None = None,
                       proposal_id: str | None = None) -> CommitResult:
        """ALTER TABLE SET TBLPROPERTIES (a metaData action: concurrent writers get MetadataChangedException)."""
        snap = snapshot or self.snapshot()
        if TableProperties(properties).row_tracking and not row_tracking_supported(snap.protocol):
            raise UnsupportedTableFeatureError(
                f"{snap.table_uri}: enabling row tracking on an existing table needs every file's row ids backfilled, "
                "which this writer does not do; create the table with delta.enableRowTracking=true, or enable it "
                "with Delta on Spark (ALTER TABLE ... SET TBLPROPERTIES) and adopt the table")
        config = {**snap.metadata.configuration, **properties}
        schema_text = None
        old_mode = TableProperties.of(snap.metadata).column_mapping_mode
        new_mode = column_mapping.check_mode(config.get(Property.COLUMN_MAPPING_MODE, "none"))
        if new_mode != old_mode:
            if (old_mode, new_mode) != ("none", "name"):
                raise ValueError(f"changing the column mapping mode from {old_mode} to {new_mode} is not supported; as in "
                                 "Delta, an existing table can only go from none to name (create the table in id mode)")
            # As Delta does: existing columns keep their names as physical names (no file changes) and get ids.
            schema_json = snap.metadata.schema()
            config[column_mapping.MAX_ID_PROPERTY] = str(
                column_mapping.assign_ids(schema_json["fields"], 1, physical_names=False) - 1)
            schema_text = json.dumps(schema_json, separators=(",", ":"))
        tx = self._begin(snap.version, proposal_id)
        protocol = snap.protocol
        if TableProperties(properties).deletion_vectors:
            protocol = _with_dv_feature(protocol) or protocol
        if _cdf_on(properties):
            protocol = protocols.with_change_data_feed(protocol)
        if new_mode != "none":
            protocol = column_mapping.with_feature(protocol)
        if protocol != snap.protocol:
            tx.add(protocol)
        tx.add(self._replace_metadata(snap.metadata, schema_string=schema_text, configuration=config))
        return tx.commit("SET TBLPROPERTIES", changes_data=False, parameters={"properties": dict(properties)})

    def add_columns(self, fields: Sequence[pa.Field], *, snapshot: Snapshot | None = None,
                    proposal_id: str | None = None) -> CommitResult:
        """ALTER TABLE ADD COLUMNS (nullable, as Delta requires for existing rows)."""
        snap = snapshot or self.snapshot()
        schema = json.loads(snap.metadata.schema_string)
        existing = {f["name"].lower() for f in schema["fields"]}
        added = []
        for f in fields:
            if f.name.lower() in existing:
                raise staging.SchemaError(f"column {f.name!r} already exists")
            existing.add(f.name.lower())
            added.append({"name": f.name, "type": staging.delta_type(f.type), "nullable": True, "metadata": {}})
        schema["fields"].extend(added)
        config = dict(snap.metadata.configuration)
        if self._layout(snap).mapped:
            # New columns get the next ids and fresh physical names (PROTOCOL.md "Column Mapping").
            first = max(int(config.get(column_mapping.MAX_ID_PROPERTY, "0")), column_mapping.max_id(schema)) + 1
            config[column_mapping.MAX_ID_PROPERTY] = str(column_mapping.assign_ids(added, first) - 1)
        tx = self._begin(snap.version, proposal_id)
        tx.add(self._replace_metadata(snap.metadata, schema_string=json.dumps(schema, separators=(",", ":")),
                                      configuration=config))
        return tx.commit("ADD COLUMNS", changes_data=False, parameters={"columns": [f.name for f in fields]})

    # -- helpers --------------------------------------------------------------------
    def _advance_identity(self, tx: Transaction, snap: Snapshot, marks: Mapping[str, int]) -> None:
        """Record the identity values this transaction handed out: the new high-water marks, in a metaData action."""
        if marks:
            tx.add(self._replace_metadata(snap.metadata, schema_string=with_high_water_marks(snap.metadata.schema_string, marks)))

    @staticmethod
    def _check_writable(snap: Snapshot, operation: str = "WRITE") -> None:
        check_writable(snap, operation)

    def _conform(self, data: Any, snap: Snapshot, identity_marks: dict[str, int] | None = None) -> pa.Table:
        """Data cast to the table schema (missing columns as nulls, extra columns refused), the identity values
        it lacks generated (`identity_marks`: the marks this transaction advanced so far), generated columns it
        omits computed, and every row checked against the table's constraints (`deltacoord.writer.constraints`)."""
        t = staging.to_arrow(data)
        columns = identity_columns(snap.metadata.schema())
        if columns:
            t = identity.fill(t, columns, identity_marks if identity_marks is not None else {})
        target = delta_schema_to_arrow(snap.metadata.schema())
        missing = [n for n in t.column_names if n not in target.names]
        if missing:
            raise staging.SchemaError(f"columns {missing} are not in the table schema {target.names}; add them first")
        cols = []
        for f in target:
            if f.name in t.column_names:
                col = conform_column(f.name, t.column(f.name), f.type)
            else:
                col = pa.chunked_array([pa.nulls(t.num_rows, f.type)], type=f.type)
            cols.append(col)
        return fill_and_check(WriteRules.of(snap.protocol, snap.metadata), pa.Table.from_arrays(cols, schema=target),
                              t.column_names)

    def _read_file(self, snap: Snapshot, add: AddFile, schema: pa.Schema,
                   identity: MaterializedColumns | None = None) -> pa.Table:
        """The rows of one data file in the table schema, deletion vector applied."""
        return self._scan(snap, add, schema, identity)[0]

    def _scan(self, snap: Snapshot, add: AddFile, schema: pa.Schema,
              identity: MaterializedColumns | None = None) -> tuple[pa.Table, npt.NDArray[np.int64]]:
        """The rows of one data file (deletion vector applied) and the physical row index of each; columns are
        found by their physical names on a column-mapping table. With `identity` (a row-tracking table), each
        row's id and commit version in those hidden columns."""
        layout = self._layout(snap, schema)
        t = data_object(self.storage, add.path).read_parquet_file().read()
        n = t.num_rows
        cols = []
        for f in schema:
            phys = layout.physical_name(f.name)
            if f.name in snap.partition_columns:
                v = parse_partition_value(add.partition_values.get(phys), f.type)
                cols.append(pa.array([v] * n, type=f.type))
            elif phys in t.column_names:
                col = t.column(phys)
                field_json = layout.fields.get(f.name)
                cols.append(to_logical(col.combine_chunks() if col.num_chunks != 1 else col.chunk(0),
                                        field_json.get("type") if field_json is not None else None, f.type, layout.mode,
                                        f.name))
            else:
                cols.append(pa.nulls(n, f.type))
        out = pa.Table.from_arrays(cols, schema=schema)
        positions = np.arange(n, dtype=np.int64)
        if identity is not None:
            out = row_tracking.with_identity(out, identity, add, t, positions)
        if add.deletion_vector is not None:
            keep = keep_mask(n, read_deletion_vector(self.storage, add.deletion_vector))
            out = out.filter(pa.array(keep))
            positions = positions[keep]
        return out, positions

    @staticmethod
    def _layout(snap: Snapshot, schema: pa.Schema | None = None) -> Layout:
        return Layout.of(snap.metadata, schema if schema is not None else delta_schema_to_arrow(snap.metadata.schema()))

    def _write(self, snap: Snapshot, data: pa.Table, *, data_change: bool = True,
               target_file_size: int | None = None) -> list[AddFile]:
        """Stage `data` (logical names, the table schema) as the table stores it (`deltacoord.writer.column_mapping`), in
        files of at most `target_file_size` (else the table's target size)."""
        layout = self._layout(snap, data.schema)
        if target_file_size is None:
            target_file_size = staging.target_file_size(snap.metadata.configuration)
        return staging.write_data_files(self.storage, data, snap.partition_columns, data_change=data_change,
                                        target_file_size=target_file_size,
                                        layout=layout if layout.mapped else None)

    @staticmethod
    def _change_feed(snap: Snapshot) -> bool:
        """DELETE, UPDATE and MERGE write `_change_data` files (`delta.enableChangeDataFeed`)."""
        return _cdf_on(snap.metadata.configuration)

    def _stage_changes(self, tx: Transaction, snap: Snapshot, changes: list[pa.Table]) -> None:
        """Write the changed rows (each table with its `_change_type`) as the commit's change data files."""
        names = [*delta_schema_to_arrow(snap.metadata.schema()).names, staging.CHANGE_TYPE]
        changes = [c.select(names) for c in changes if c.num_rows]  # without row tracking's hidden columns
        if not changes:
            return
        layout = self._layout(snap)
        tx.stage_cdc(staging.write_cdc_files(self.storage, pa.concat_tables(changes), snap.partition_columns,
                                             layout=layout if layout.mapped else None))

    @staticmethod
    def _writes_dvs(snap: Snapshot) -> bool:
        """DELETE, UPDATE and MERGE write deletion vectors: the property is on and the protocol has the feature."""
        return TableProperties.of(snap.metadata).deletion_vectors and DV_FEATURE in (snap.protocol.writer_features or ())

    def _delete_rows(self, tx: Transaction, add: AddFile, kept: npt.NDArray[np.int64], deleted: npt.NDArray[np.int64]) -> None:
        """Mark the physical rows `deleted` of `add` as deleted: the file is removed and re-added with a deletion
        vector holding its earlier deleted rows and these (removed for good when no row is left).

        `kept` are the file's rows alive before (its deletion vector holds the others).
        """
        tx.remove(add)
        if len(kept) <= len(np.unique(deleted)):
            return
        before = (read_deletion_vector(self.storage, add.deletion_vector) if add.deletion_vector is not None
                  else np.zeros(0, dtype=np.uint64))
        gone = np.union1d(before, deleted.astype(np.uint64))
        dv = write_deletion_vector(self.storage, gone.astype(np.uint64), inline_max_bytes=self.dv_inline_max_bytes)
        if dv.storage_type == "u":  # a file: deleted with the staged files if the proposal does not commit
            tx.staged_keys.append(dv_object(self.storage, dv).key)
        tx.add(dataclasses.replace(add, deletion_vector=dv, stats=_loose_stats(add.stats), data_change=True))

    def _candidates(self, snap: Snapshot, where: str | None) -> list[AddFile]:
        """Files that may hold matching rows by partition (the coordinator's own matcher, `partitions.prune`)."""
        return prune(snap.files(), where, snap.metadata, lambda a: a.partition_values)

    @staticmethod
    def _mask(t: pa.Table, cond: Any, text: str = "condition") -> pa.Array:
        """Rows where `cond` (the SQL `text`) is TRUE (NULL counts as false, as in SQL WHERE)."""
        import pyarrow.dataset as ds  # here: it imports pandas, a quarter second of every fresh process

        with expressions.evaluating(text):
            m = ds.dataset(t).to_table(columns={"m": cond}).column("m")
        return pc.fill_null(m.combine_chunks(), False)

    @staticmethod
    def _noop(snap: Snapshot, tx: Transaction, operation: str, metrics: Mapping[str, int]) -> CommitResult:
        return CommitResult(snap.version, tx.proposal_id, operation, metrics=dict(metrics), noop=True)

    # -- writes ---------------------------------------------------------------------
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
        if (app_id is None) != (app_version is None):
            raise ValueError("give both app_id and app_version, or neither")
        snap = snapshot or (self.snapshot() if app_id is not None else self._cached())
        if snapshot is None and app_id is None and TableProperties.of(snap.metadata).maxcompute:
            # MaxCompute's rules fail an INSERT INTO that finishes after another one it did not see.
            snap = self.snapshot()
        self._check_writable(snap, "WRITE")
        tx = self._begin(snap.version, proposal_id)
        with _abandoned_on_error(tx):
            if app_id is not None and app_version is not None:
                recorded = snap.app_versions.get(app_id, -1)
                if app_version <= recorded:
                    return CommitResult(snap.version, tx.proposal_id, "WRITE", already_committed=True)
                tx.read_app_id(app_id)
                tx.add(SetTransaction(app_id, app_version, int(time.time() * 1000)))
            rows = files = size = 0
            marks: dict[str, int] = {}
            target = staging.target_file_size(snap.metadata.configuration)

            def stage(piece: pa.Table) -> None:
                nonlocal rows, files, size
                adds = self._write(snap, piece, target_file_size=max(target, piece.nbytes))  # sized here already
                tx.stage(adds)
                rows, files, size = rows + piece.num_rows, files + len(adds), size + sum(a.size for a in adds)
                if progress is not None:
                    progress(rows, files, size)

            pending: pa.Table | None = None
            for chunk in _chunks(data):  # rows gathered until a file's worth: small batches make no small files
                conformed = self._conform(chunk, snap, marks)
                pending = conformed if pending is None else pa.concat_tables([pending, conformed])
                while pending.num_rows and pending.nbytes >= target:
                    per_file = max(1, pending.num_rows * target // pending.nbytes)
                    stage(pending.slice(0, per_file))
                    pending = pending.slice(per_file)
            if pending is not None and pending.num_rows:
                stage(pending)
            self._advance_identity(tx, snap, marks)
            return tx.commit("WRITE", changes_data=True, parameters={"mode": "Append", "partitionBy": snap.partition_columns},
                             metrics={"numOutputRows": rows})

    def overwrite(self, data: Any, replace_where: str | None = None, *, snapshot: Snapshot | None = None,
                  proposal_id: str | None = None) -> CommitResult:
        """INSERT OVERWRITE: replace the whole table, or only the partitions `replace_where` selects.

        `replace_where` may name partition columns only; every written row must
        satisfy it (else REPLACE_WHERE_MISMATCH, as Delta's
        DELTA_REPLACE_WHERE_MISMATCH). It declares the predicate and the
        replaced files as read, so overwrites of disjoint partitions commit
        concurrently; a full overwrite reads the whole table.
        """
        snap = snapshot or self.snapshot()
        self._check_writable(snap, "WRITE")
        marks: dict[str, int] = {}
        table = self._conform(data, snap, marks)
        tx = self._begin(snap.version, proposal_id)
        self._advance_identity(tx, snap, marks)
        with _abandoned_on_error(tx):
            if replace_where is None:
                tx.read_whole()
                replaced = snap.files()
            else:
                cols = columns_of(parse(replace_where))
                part = set(snap.partition_columns)
                if not cols or not cols <= part:
                    raise InvalidProposalError(ReasonCode.BAD_REPLACE_WHERE, f"replace_where {replace_where!r} must name partition columns only ({sorted(part)})")
                ok = self._mask(table, expressions.compile_filter(replace_where, table.schema), replace_where)
                bad = table.num_rows - pc.sum(ok.cast(pa.int64())).as_py() if table.num_rows else 0
                if bad:
                    raise InvalidProposalError(
                        ReasonCode.REPLACE_WHERE_MISMATCH,
                        f"{bad} written row(s) do not satisfy replace_where {replace_where!r}; nothing was written")
                tx.read_predicate(replace_where)
                replaced = self._candidates(snap, replace_where)
                tx.read_files_from(replaced)
            for a in replaced:
                tx.remove(a)
            tx.stage(self._write(snap, table))
            params: dict[str, Any] = {"mode": "Overwrite", "partitionBy": snap.partition_columns}
            if replace_where is not None:
                params["predicate"] = json.dumps([replace_where])
            return tx.commit("WRITE", changes_data=True, parameters=params,
                             metrics={"numOutputRows": table.num_rows, "numRemovedFiles": len(replaced)})

    def _rewrite(self, where: str | None, operation: str, change: Callable[[pa.Table, pa.Array], pa.Table],
                 snapshot: Snapshot | None, count_name: str, proposal_id: str | None) -> CommitResult:
        """DELETE/UPDATE: scan files surviving partition pruning, rewrite those with matching rows."""
        snap = snapshot or self.snapshot()
        self._check_writable(snap, operation)
        schema = delta_schema_to_arrow(snap.metadata.schema())
        tx = self._begin(snap.version, proposal_id)
        with _abandoned_on_error(tx):
            if where is None:
                tx.read_whole()
                cond: Any = pc.scalar(True)
            else:
                cond = expressions.compile_filter(where, schema)
                tx.read_predicate(where)
            candidates = files_read(snap.files(), where, snap.metadata, schema)
            tx.read_files_from(candidates)
            touched = copied = 0
            dvs = self._writes_dvs(snap)
            cdf = self._change_feed(snap)
            changes: list[pa.Table] = []
            whole_files = True  # every touched file removed whole (no vector before or after): no change data owed
            hidden = row_tracking.hidden_columns(snap)
            for add in candidates:
                t, positions = self._scan(snap, add, schema, hidden)
                mask = self._mask(t, cond, where or "TRUE")
                hits = pc.sum(mask.cast(pa.int64())).as_py() or 0
                if not hits:
                    continue
                touched += hits
                whole_files = whole_files and operation == "DELETE" and hits == t.num_rows and add.deletion_vector is None
                if dvs:
                    # Mark the matching rows deleted; an UPDATE writes their new values to a new file.
                    self._delete_rows(tx, add, positions, positions[mask.to_numpy(zero_copy_only=False)])
                    out = change(t, mask).filter(mask) if operation == "UPDATE" else t.slice(0, 0)
                else:
                    copied += t.num_rows - hits
                    tx.remove(add)
                    out = change(t, mask)
                if hidden is not None and operation == "UPDATE":
                    out = row_tracking.changed(out, hidden, None if dvs else mask)
                if cdf and operation == "UPDATE":
                    changes += [_changed(t.filter(mask), "update_preimage"),
                                _changed((out if dvs else out.filter(mask)), "update_postimage")]
                elif cdf:
                    changes.append(_changed(t.filter(mask), "delete"))
                if out.num_rows:
                    tx.stage(self._write(snap, out))
            metrics = {count_name: touched, "numCopiedRows": copied}
            if not touched:
                return self._noop(snap, tx, operation, metrics)
            if not whole_files:
                self._stage_changes(tx, snap, changes)
            return tx.commit(operation, changes_data=True, parameters={"predicate": json.dumps([where] if where else [])},
                             metrics=metrics)

    def delete(self, where: str | None = None, *, snapshot: Snapshot | None = None,
               proposal_id: str | None = None) -> CommitResult:
        """DELETE FROM table [WHERE `where`], reading `snapshot` (default: latest)."""
        return self._rewrite(where, "DELETE", lambda t, mask: t.filter(pc.invert(mask)), snapshot, "numDeletedRows",
                             proposal_id)

    def update(self, where: str | None, set: Mapping[str, str], *, snapshot: Snapshot | None = None,
               proposal_id: str | None = None) -> CommitResult:
        """UPDATE table SET col = <SQL expression> ... [WHERE `where`], reading `snapshot` (default: latest).

        Generated columns the SET omits are recomputed for the updated rows; the updated rows are checked
        against the table's constraints before anything is staged (`deltacoord.writer.constraints`)."""
        snap = snapshot or self.snapshot()
        rules = WriteRules.of(snap.protocol, snap.metadata)

        snap = snapshot or self.snapshot()
        identity.check_update(identity_columns(snap.metadata.schema()), list(set))

        def change(t: pa.Table, mask: pa.Array) -> pa.Table:
            before = t
            for col, value_sql in set.items():
                if col not in t.column_names:
                    raise staging.SchemaError(f"UPDATE sets unknown column {col!r}")
                new = expressions.evaluate(value_sql, before).cast(t.schema.field(col).type)
                t = t.set_column(t.column_names.index(col), col, pc.if_else(mask, new, t.column(col).combine_chunks()))
            if rules:
                updated = fill_and_check(rules, t.filter(mask), set.keys())
                for g in rules.generated:
                    if g.column not in set:
                        i = t.column_names.index(g.column)
                        values = pc.replace_with_mask(t.column(i).combine_chunks(), mask, updated.column(g.column).combine_chunks())
                        t = t.set_column(i, t.schema.field(i), values)
            return t

        return self._rewrite(where, "UPDATE", change, snap, "numUpdatedRows", proposal_id)

    def merge(self, source: Any, on: str | Sequence[str], *, when_matched_update: Assignments | None = None,
              when_not_matched_insert: Assignments | None = None, when_matched_delete: bool | str = False,
              when_not_matched_insert_if: str | None = None, source_alias: str = "s", target_alias: str = "t",
              snapshot: Snapshot | None = None, proposal_id: str | None = None) -> CommitResult:
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
        """
        if when_matched_update is None and when_not_matched_insert is None and when_matched_delete is False:
            raise ValueError("give when_matched_update, when_matched_delete and/or when_not_matched_insert")
        if when_not_matched_insert_if is not None and when_not_matched_insert is None:
            raise ValueError("when_not_matched_insert_if needs when_not_matched_insert")
        if when_matched_delete is True and when_matched_update is not None:
            # As in Delta: only the last WHEN MATCHED clause may omit its condition, and the delete comes first.
            raise ValueError("an unconditional when_matched_delete leaves nothing for when_matched_update; give it a condition")
        snap = snapshot or self.snapshot()
        self._check_writable(snap, "MERGE")
        schema = delta_schema_to_arrow(snap.metadata.schema())
        rules = WriteRules.of(snap.protocol, snap.metadata)
        src = staging.to_arrow(source)
        if isinstance(on, str):
            keys, target_filter = split_merge_condition(on, source_alias, target_alias)
        else:
            keys, target_filter = [(k, k) for k in on], None
        for s_col, t_col in keys:
            if s_col not in src.column_names:
                raise staging.SchemaError(f"MERGE key {s_col!r} is not a source column ({src.column_names})")
            if t_col not in schema.names:
                raise staging.SchemaError(f"MERGE key {t_col!r} is not a target column ({schema.names})")

        tx = self._begin(snap.version, proposal_id)
        with _abandoned_on_error(tx):
            if target_filter is None:
                tx.read_whole()
                cond: Any = pc.scalar(True)
            else:
                tx.read_predicate(target_filter)
                cond = expressions.compile_filter(target_filter, schema)
            candidates = files_read(snap.files(), target_filter, snap.metadata, schema)
            tx.read_files_from(candidates)

            # Source keys, typed as the target's, with their row numbers; NULL keys never match (SQL equality).
            src_keys = pa.table({f"__k{i}": src.column(s).cast(schema.field(t).type) for i, (s, t) in enumerate(keys)})
            src_keys = src_keys.append_column("__src", pa.array(range(src.num_rows), pa.int64()))
            src_keys = src_keys.filter(_all_valid(src_keys, len(keys)))
            aliases = (source_alias, target_alias)

            matched_src: set[int] = set()
            updated = deleted = copied = 0
            conditional_delete = isinstance(when_matched_delete, str)
            dvs = self._writes_dvs(snap)
            cdf = self._change_feed(snap)
            changes: list[pa.Table] = []
            hidden = row_tracking.hidden_columns(snap)
            for add in candidates:
                t, positions = self._scan(snap, add, schema, hidden)
                tk = pa.table({f"__k{i}": t.column(tc) for i, (_s, tc) in enumerate(keys)})
                tk = tk.append_column("__row", pa.array(range(t.num_rows), pa.int64()))
                tk = tk.filter(pc.and_(self._mask(t, cond, target_filter or "TRUE"), _all_valid(tk, len(keys))))
                if not tk.num_rows:
                    continue
                joined = tk.join(src_keys, [f"__k{i}" for i in range(len(keys))], join_type="inner")
                if not joined.num_rows:
                    continue
                rows = joined.column("__row").to_numpy()
                srcs = joined.column("__src").to_numpy()
                matched_src.update(int(i) for i in srcs)
                if when_matched_update is None and when_matched_delete is False:
                    continue
                target_rows = t.take(pa.array(rows))
                source_rows = src.take(pa.array(srcs))
                if isinstance(when_matched_delete, str):
                    delete = self._condition(when_matched_delete, source_rows, target_rows, aliases)
                else:
                    delete = pa.array([bool(when_matched_delete)] * len(rows))
                update = pc.invert(delete) if when_matched_update is not None else pa.array([False] * len(rows))
                if when_matched_update is not None or conditional_delete:
                    # As in Delta: several source rows may match one target row only under an unconditional
                    # DELETE; a matched-only MERGE counts just the pairs that some WHEN MATCHED clause selects.
                    counted = rows if when_not_matched_insert is not None else pc.filter(pa.array(rows), pc.or_(delete, update)).to_numpy()
                    if len(set(counted.tolist())) != len(counted):
                        raise MergeError(
                            ReasonCode.MULTIPLE_SOURCE_ROWS_MATCHED,
                                         "several source rows matched the same target row; MERGE cannot decide which to apply")
                n_del = len(set(pc.filter(pa.array(rows), delete).to_pylist()))
                n_upd = pc.sum(update.cast(pa.int64())).as_py() or 0
                if not n_del and not n_upd:
                    continue
                touched = pc.filter(pa.array(rows), pc.or_(delete, update))
                is_touched = pc.is_in(pa.array(range(t.num_rows), pa.int64()), value_set=touched)
                # With deletion vectors the touched rows are marked deleted and only the updated ones rewritten.
                parts = [t.slice(0, 0) if dvs else t.filter(pc.invert(is_touched))]
                if n_upd:
                    assert when_matched_update is not None
                    new = self._assign(when_matched_update, schema, source_rows.filter(update), target_rows.filter(update),
                                       aliases, "UPDATE SET *", rules)
                    if hidden is not None:  # updated rows keep their ids and change now
                        new = row_tracking.carried(new, target_rows.filter(update).column(hidden.row_id), hidden)
                    parts.append(new)
                if cdf:
                    gone = np.unique(pc.filter(pa.array(rows), delete).to_numpy(zero_copy_only=False))
                    changes.append(_changed(t.take(pa.array(gone, pa.int64())), "delete"))
                    if n_upd:
                        changes += [_changed(target_rows.filter(update), "update_preimage"),
                                    _changed(parts[1], "update_postimage")]
                out = pa.concat_tables(parts)
                updated += n_upd
                deleted += n_del
                copied += parts[0].num_rows
                if dvs:
                    self._delete_rows(tx, add, positions, positions[is_touched.to_numpy(zero_copy_only=False)])
                else:
                    tx.remove(add)
                if out.num_rows:
                    tx.stage(self._write(snap, out))

            inserted = 0
            if when_not_matched_insert is not None:
                todo = [i for i in range(src.num_rows) if i not in matched_src]
                if todo:
                    source_rows = src.take(pa.array(todo, pa.int64()))
                    if when_not_matched_insert_if is not None:
                        source_rows = source_rows.filter(self._condition(when_not_matched_insert_if, source_rows, None, aliases))
                    id_columns = identity_columns(snap.metadata.schema())
                    if id_columns and source_rows.num_rows:
                        # Identity values first (NOT NULL and CHECKs may name the column), then the table's rules.
                        new_rows = self._assign(when_not_matched_insert, schema, source_rows, None, aliases, "INSERT *",
                                                WriteRules())
                        marks: dict[str, int] = {}
                        new_rows = identity.fill(new_rows, id_columns, marks)
                        self._advance_identity(tx, snap, marks)
                        given = set(source_rows.column_names) if when_not_matched_insert == "*" else set(when_not_matched_insert)
                        new_rows = fill_and_check(rules, new_rows, given | {c.name for c in id_columns})
                    else:
                        new_rows = self._assign(when_not_matched_insert, schema, source_rows, None, aliases, "INSERT *", rules)
                    inserted = new_rows.num_rows
                    if cdf:
                        changes.append(_changed(new_rows, "insert"))
                    if inserted:
                        tx.stage(self._write(snap, new_rows))
            metrics = {"numSourceRows": src.num_rows, "numTargetRowsUpdated": updated, "numTargetRowsDeleted": deleted,
                       "numTargetRowsInserted": inserted, "numTargetRowsCopied": copied}
            if not updated and not inserted and not deleted:
                return self._noop(snap, tx, "MERGE", metrics)
            self._stage_changes(tx, snap, changes)
            matched: list[dict[str, str]] = []
            if when_matched_delete is not False:
                matched.append({"actionType": "delete",
                                **({"predicate": when_matched_delete} if isinstance(when_matched_delete, str) else {})})
            if when_matched_update is not None:
                matched.append({"actionType": "update"})
            not_matched: list[dict[str, str]] = []
            if when_not_matched_insert is not None:
                not_matched.append({"actionType": "insert",
                                    **({"predicate": when_not_matched_insert_if} if when_not_matched_insert_if else {})})
            params = {
                "predicate": json.dumps([on if isinstance(on, str) else " AND ".join(f"s.{k} = t.{k}" for k in on)]),
                "matchedPredicates": json.dumps(matched),
                "notMatchedPredicates": json.dumps(not_matched),
            }
            return tx.commit("MERGE", changes_data=True, parameters=params, metrics=metrics)

    @staticmethod
    def _condition(text: str, source_rows: pa.Table, target_rows: pa.Table | None, aliases: tuple[str, str]) -> pa.Array:
        """A MERGE clause condition per joined row; NULL counts as false, as in SQL."""
        joined, prefixes, sides = _merge_view(source_rows, target_rows, aliases)
        if not joined.num_columns:
            return pa.array([], pa.bool_())
        m = expressions.evaluate_qualified(text, joined, prefixes, sides)
        if isinstance(m, pa.ChunkedArray):
            m = m.combine_chunks()
        if not pa.types.is_boolean(m.type):
            raise ExpressionError(text, f"a MERGE condition must be boolean, not {m.type}")
        return pc.fill_null(m, False)

    @staticmethod
    def _assign(clause: Assignments, schema: pa.Schema, source_rows: pa.Table, target_rows: pa.Table | None,
                aliases: tuple[str, str], star: str, rules: WriteRules) -> pa.Table:
        """The rows a MERGE clause produces, in the table schema (an INSERT sees no target columns), with the
        generated columns it does not assign computed and the table's constraints checked."""
        n = source_rows.num_rows
        generated = {g.column for g in rules.generated}
        if clause == "*":
            absent = [f.name for f in schema if f.name not in source_rows.column_names and f.name not in generated]
            if absent:
                raise staging.SchemaError(f"{star} needs every target column in the source; missing {absent}")
            given = [f.name for f in schema if f.name in source_rows.column_names]
            star_rows = pa.Table.from_arrays([source_rows.column(f.name).cast(f.type) if f.name in given else pa.nulls(n, f.type)
                                              for f in schema], schema=schema)
            return fill_and_check(rules, star_rows, given)
        unknown = [c for c in clause if c not in schema.names]
        if unknown:
            raise staging.SchemaError(f"MERGE assigns unknown column(s) {unknown}")
        joined, prefixes, sides = _merge_view(source_rows, target_rows, aliases)
        cols = []
        for f in schema:
            if f.name in clause:
                cols.append(expressions.evaluate_qualified(clause[f.name], joined, prefixes, sides).cast(f.type))
            elif target_rows is not None:
                cols.append(target_rows.column(f.name).combine_chunks())
            else:
                cols.append(pa.nulls(n, f.type))
        return fill_and_check(rules, pa.Table.from_arrays(cols, schema=schema), clause.keys())

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
        zorder_by = list(zorder_by)
        if zorder_by:
            snap = snapshot or self.snapshot()
            bad = [c for c in zorder_by if c not in delta_schema_to_arrow(snap.metadata.schema()).names
                   or c in snap.partition_columns]
            if bad:
                raise ValueError(f"ZORDER BY {bad}: name data columns of the table (not partition columns)")
            return self._compact(where, lambda files: files, 1, None, snap, proposal_id, zorder_by)
        return self._compact(where, lambda files: [a for a in files if a.size < target_file_size
                                                   or _deleted_ratio(a) > max_deleted_rows_ratio], min_files, None,
                             snapshot, proposal_id, max_deleted_rows_ratio=max_deleted_rows_ratio)

    def purge(self, where: str | None = None, *, snapshot: Snapshot | None = None,
              proposal_id: str | None = None) -> CommitResult:
        """REORG TABLE ... APPLY (PURGE): rewrite every file with a deletion vector (of the partitions `where`
        selects) without its deleted rows, so they are gone from storage once VACUUM removes the old files.

        Data does not change (dataChange=false, checked at snapshot isolation) and the rows keep their order,
        recorded in a row map: a concurrent DELETE, UPDATE or MERGE of the same files does not conflict.
        """
        return self._compact(where, lambda files: [a for a in files if a.deletion_vector is not None], 1, None,
                             snapshot, proposal_id, operation="REORG")

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
        if kind == "minor":
            return self._compact(where, lambda files: [a for a in files if a.size < small_file_size], 2, kind, snapshot,
                                 proposal_id)
        if kind == "major":
            def every(files: list[AddFile]) -> list[AddFile]:
                return files if len(files) > 1 or any(a.deletion_vector is not None for a in files) else []

            return self._compact(where, every, 1, kind, snapshot, proposal_id)
        raise ValueError(f"compaction kind {kind!r}: give 'minor' or 'major'")

    def _compact(self, where: str | None, select: Callable[[list[AddFile]], list[AddFile]], min_files: int,
                 kind: str | None, snapshot: Snapshot | None, proposal_id: str | None,
                 zorder_by: Sequence[str] = (), *, operation: str = "OPTIMIZE",
                 max_deleted_rows_ratio: float | None = None) -> CommitResult:
        """Merge, per partition, the files `select` picks (when at least `min_files`, or when one deletes more
        than `max_deleted_rows_ratio` of its rows) into new files, in Z-order of `zorder_by` or else in order,
        recording the row map."""
        snap = snapshot or self.snapshot()
        self._check_writable(snap, operation)
        schema = delta_schema_to_arrow(snap.metadata.schema())
        tx = self._begin(snap.version, proposal_id)
        with _abandoned_on_error(tx):
            if where is not None:
                tx.read_predicate(where)
            by_part: dict[tuple[tuple[str, str | None], ...], list[AddFile]] = {}
            for a in self._candidates(snap, where):
                by_part.setdefault(tuple(sorted(a.partition_values.items())), []).append(a)
            compacted = 0
            groups: list[RowGroup] = []
            for part_files in by_part.values():
                files = select(part_files)
                heavy = max_deleted_rows_ratio is not None and any(_deleted_ratio(a) > max_deleted_rows_ratio for a in files)
                if not files or (len(files) < min_files and not heavy):
                    continue
                tx.read_files_from(files)
                hidden = row_tracking.hidden_columns(snap)
                parts = [self._read_file(snap, a, schema, hidden) for a in files]
                merged = pa.concat_tables(parts)
                if zorder_by:
                    merged = zorder(merged, zorder_by)
                for a in files:
                    tx.remove(a, data_change=False)
                out = self._write(snap, merged, data_change=False) \
                    if merged.num_rows else []
                tx.stage(out)
                groups.append(RowGroup(tuple(Source(a.path, p.num_rows, a.deletion_vector) for a, p in zip(files, parts, strict=True)),
                                       tuple(Target(a.path, json.loads(a.stats or "{}")["numRecords"]) for a in out)))
                compacted += len(files)
            if not compacted:
                return self._noop(snap, tx, operation, {"numRemovedFiles": 0, "numAddedFiles": 0})
            row_map = encode_row_map(groups)
            if not zorder_by and len(json.dumps(row_map)) <= ROW_MAP_MAX_CHARS:
                tx.info[ROW_MAP_KEY] = row_map
            params = {"predicate": json.dumps([where] if where else []), "zOrderBy": json.dumps(list(zorder_by)),
                      "filesCompacted": str(compacted)}
            if operation == "REORG":
                params = {"predicate": params["predicate"], "applyPurge": "true", "filesCompacted": str(compacted)}
            if kind is not None:
                params[COMPACTION_PARAMETER] = kind
            return tx.commit(operation, changes_data=False, parameters=params)

    def truncate(self, where: str | None = None, *, snapshot: Snapshot | None = None,
                 proposal_id: str | None = None) -> CommitResult:
        """TRUNCATE TABLE [PARTITION]: remove every file (or those of the partitions `where` selects).

        `where` may name partition columns only. Like an overwrite with no rows, it
        declares the predicate and the removed files as read (the whole table without
        `where`); the `maxcompute` profile treats it as INSERT OVERWRITE.
        """
        snap = snapshot or self.snapshot()
        self._check_writable(snap, "TRUNCATE")
        tx = self._begin(snap.version, proposal_id)
        with _abandoned_on_error(tx):
            if where is None:
                tx.read_whole()
                removed = snap.files()
            else:
                cols = columns_of(parse(where))
                part = set(snap.partition_columns)
                if not cols or not cols <= part:
                    raise InvalidProposalError(ReasonCode.BAD_REPLACE_WHERE,
                                               f"truncate where {where!r} must name partition columns only ({sorted(part)})")
                tx.read_predicate(where)
                removed = self._candidates(snap, where)
                tx.read_files_from(removed)
            for a in removed:
                tx.remove(a)
            return tx.commit("TRUNCATE", changes_data=True, parameters={"predicate": json.dumps([where] if where else [])},
                             metrics={"numRemovedFiles": len(removed)})

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


def _merge_view(source_rows: pa.Table, target_rows: pa.Table | None,
                aliases: tuple[str, str]) -> tuple[pa.Table, dict[str, str], dict[str, set[str]]]:
    """Joined MERGE rows with s__/t__ column prefixes, for `expressions.evaluate_qualified`."""
    s_alias, t_alias = aliases
    view = {f"s__{c}": source_rows.column(c) for c in source_rows.column_names}
    if target_rows is not None:
        view.update({f"t__{c}": target_rows.column(c) for c in target_rows.column_names})
    sides = {s_alias: set(source_rows.column_names), t_alias: set(target_rows.column_names if target_rows is not None else ())}
    return pa.table(view), {s_alias: "s__", t_alias: "t__"}, sides


def _all_valid(t: pa.Table, n_keys: int) -> pa.Array:
    """Rows whose n key columns (`__k0..`) are all non-null."""
    m = pc.is_valid(t.column("__k0"))
    for i in range(1, n_keys):
        m = pc.and_(m, pc.is_valid(t.column(f"__k{i}")))
    return m
