"""Read coordinated Delta tables from Spark through PySpark's Python Data Source API.

`DeltaCoordSource` (format name `deltacoord`) serves

* batch reads: ``spark.read.format("deltacoord").option("versionAsOf", n).load(path)``
  (or ``timestampAsOf``), one Spark task per group of data files, each reading
  Parquet with Arrow (partition values restored, deletion vectors applied);
* streaming reads: ``spark.readStream.format("deltacoord").load(path)``, with
  Delta's streaming-source semantics (`delta-semantics.md` §6): offsets are
  table versions (plus a file index inside a version); without a starting
  point the first batch is the snapshot at the latest version and later batches
  are the data-changing `add`s of each following commit. Options:
  ``startingVersion`` (number or ``latest``), ``startingTimestamp``,
  ``maxFilesPerTrigger`` (default 1000), ``ignoreDeletes``, ``ignoreChanges``,
  ``skipChangeCommits``. A commit whose schema or partitioning the stream's
  read schema cannot read ends the stream with `MetadataChangedException`
  (after every row before that version was delivered); a restart reads the
  new schema and continues from that version.

Versions come from `_delta_log` (what the coordinator has published), not from
the Kafka commits topic: `deltacoord.reader.stream.CommitStream` did not exist when this
was written. A stream therefore sees a commit once it is published.

`deltacoord.writer.spark_sink.DeltaCoordDataSource` extends this class with the write
side; register that one (``deltacoord.writer.spark_sink.register(spark)``) to get both.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxFiles, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from deltacoord.reader.log import (
    TableNotFoundError,
    VersionNotFoundError,
    commit_object,
    data_object,
    list_log,
    list_log_from_hint,
    read_commit,
)
from deltacoord.reader.snapshot import (
    Snapshot,
    delta_schema_to_arrow,
    parse_partition_value,
    physical_name,
    read_data_file,
)
from deltacoord.schemas import client_settings
from deltacoord.schemas.actions import Action, AddFile, CommitInfo, DeletionVector, Metadata, RemoveFile
from deltacoord.schemas.errors import DeltaCoordError, MetadataChangedException
from deltacoord.schemas.properties import TableProperties
from deltacoord.storage.table import TableStorage

SOURCE_NAME = "deltacoord"
DEFAULT_MAX_FILES_PER_TRIGGER = 1000
#: Files are packed into one Spark partition up to about this many bytes.
TARGET_PARTITION_BYTES = 64 * 1024 * 1024


class DeltaSourceDataChangeError(DeltaCoordError):
    """A source commit updated or deleted data and the stream's options do not allow it (Delta's 0A000 errors)."""


class DifferentTableError(DeltaCoordError):
    """The table at the path is not the one the stream started on (its metaData id changed)."""


def _bool_opt(options: Mapping[str, str], key: str) -> bool:
    v = options.get(key)
    return v is not None and str(v).strip().lower() == "true"


def _path_option(options: Mapping[str, str]) -> str:
    path = options.get("path")
    if not path:
        raise ValueError("the deltacoord data source needs a table path: .load(path) or .option('path', ...)")
    return str(path)


#: Data source options with this prefix are the table's storage options (delta-rs's keys):
#: ``.option("storage.AWS_ENDPOINT_URL", "http://...")``.
STORAGE_OPTION_PREFIX = "storage."


def storage_options_of(options: Mapping[str, str]) -> dict[str, str]:
    """The `storage.<key>` options, without the prefix (keys are case-insensitive, as in delta-rs)."""
    n = len(STORAGE_OPTION_PREFIX)
    return {k[n:]: str(v) for k, v in options.items() if k.lower().startswith(STORAGE_OPTION_PREFIX) and len(k) > n}


def _storage(options: Mapping[str, str]) -> TableStorage:
    return TableStorage(_path_option(options), storage_options_of(options), fsync=False)


def spark_schema_of(snapshot: Snapshot) -> StructType:
    """The Spark schema of a table (partition columns included, in table order)."""
    return from_arrow_schema(delta_schema_to_arrow(snapshot.metadata.schema()), prefer_timestamp_ntz=True)


# --------------------------------------------------------------------------- reading files (executors)


@dataclass(frozen=True)
class ReadPlan:
    """Everything an executor needs to turn data files into Arrow batches of the Spark schema (picklable)."""

    uri: str
    schema_string: str
    partition_columns: tuple[str, ...]
    column_mapping_mode: str
    target: pa.Schema
    storage_options: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(storage: TableStorage, metadata: Metadata, spark_schema: StructType) -> ReadPlan:
        mode = TableProperties.of(metadata).column_mapping_mode
        target = to_arrow_schema(spark_schema, timezone="UTC")
        return ReadPlan(storage.location, metadata.schema_string, tuple(metadata.partition_columns), mode, target,
                        tuple(sorted(storage.storage_options.items())))

    def read(self, files: Sequence[Mapping[str, Any]]) -> Iterator[pa.RecordBatch]:
        schema_json = json.loads(self.schema_string)
        fields_json = {f["name"]: f for f in schema_json["fields"]}
        full = delta_schema_to_arrow(schema_json)
        names = [f.name for f in self.target if full.get_field_index(f.name) >= 0]
        read_schema = pa.schema([full.field(n) for n in names])
        data_fields = [(n, fields_json[n]) for n in names if n not in self.partition_columns]
        # Built here, in the executor's worker process (obstore's runtime does not travel).
        storage = TableStorage(self.uri, dict(self.storage_options), fsync=False)
        for f in files:
            raw_pv: Mapping[str, str | None] = f.get("partitionValues") or {}
            pvals: dict[str, Any] = {}
            for c in self.partition_columns:
                if c not in names:
                    continue
                phys = physical_name(fields_json[c], self.column_mapping_mode) if c in fields_json else c
                pvals[c] = parse_partition_value(raw_pv.get(phys), full.field(c).type)
            dv_json = f.get("deletionVector")
            dv = DeletionVector.from_json(dv_json) if dv_json else None
            t = read_data_file(data_object(storage, f["path"]), data_fields, self.column_mapping_mode, read_schema, pvals, dv,
                                storage, f.get("size"))
            if t.num_rows == 0:
                continue
            yield from self._conform(t).to_batches()

    def _conform(self, t: pa.Table) -> pa.Table:
        cols = []
        for f in self.target:
            if f.name in t.column_names:
                cols.append(t.column(f.name).cast(f.type))
            else:
                cols.append(pa.nulls(t.num_rows, f.type))
        return pa.Table.from_arrays(cols, schema=self.target)


def _file_entry(add: AddFile) -> dict[str, Any]:
    """The JSON-primitive description of one file to read (travels in partitions and offsets' planning)."""
    return {
        "path": add.path,
        "partitionValues": dict(add.partition_values),
        "size": add.size,
        "deletionVector": add.deletion_vector.to_json() if add.deletion_vector is not None else None,
    }


class FilesPartition(InputPartition):
    """One Spark task: a list of file entries."""

    def __init__(self, files: list[dict[str, Any]]) -> None:
        super().__init__(files)
        self.files = files


def pack_files(files: Sequence[dict[str, Any]], target_bytes: int = TARGET_PARTITION_BYTES) -> list[FilesPartition]:
    out: list[FilesPartition] = []
    cur: list[dict[str, Any]] = []
    size = 0
    for f in files:
        cur.append(f)
        size += int(f.get("size") or 0)
        if size >= target_bytes:
            out.append(FilesPartition(cur))
            cur, size = [], 0
    if cur:
        out.append(FilesPartition(cur))
    return out


# --------------------------------------------------------------------------- batch reads


def _resolve_snapshot(options: Mapping[str, str]) -> Snapshot:
    storage = _storage(options)
    v = options.get("versionAsOf")
    ts = options.get("timestampAsOf")
    if v is not None and ts is not None:
        raise ValueError("give versionAsOf or timestampAsOf, not both")
    if v is not None:
        return Snapshot.load(storage, version=int(v))
    if ts is not None:
        return Snapshot.load(storage, timestamp=ts)
    return Snapshot.load(storage)


class DeltaCoordBatchReader(DataSourceReader):
    """A batch read of one snapshot."""

    def __init__(self, plan: ReadPlan, files: list[dict[str, Any]]) -> None:
        self.plan = plan
        self.files = files

    def partitions(self) -> Sequence[InputPartition]:
        return pack_files(self.files)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, FilesPartition):  # Spark reads one empty partition when there are none
            yield from self.plan.read(partition.files)



# --------------------------------------------------------------------------- where versions come from


class _LogFeed:
    """Committed versions as published in `_delta_log`."""

    def __init__(self, storage: TableStorage, uri: str) -> None:
        self.storage = storage
        self.uri = uri

    def latest(self) -> int | None:
        return list_log_from_hint(self.storage).latest_commit_version

    def actions(self, version: int) -> list[Action] | None:
        try:
            return read_commit(commit_object(self.storage, version))
        except FileNotFoundError:
            pass
        latest = self.latest()
        if latest is not None and latest > version:
            raise VersionNotFoundError(
                f"commit {version} of {self.uri} is gone (log cleanup?) while later commits exist; "
                "the stream cannot continue without losing data: restart it from a later startingVersion "
                "with a new checkpoint"
            )
        return None

    def close(self) -> None:
        pass


class _KafkaFeed:
    """Committed versions read from the coordinator's commits topic (`deltacoord.reader.stream.CommitStream`).

    Sees a version as soon as the coordinator ratified it, before `_delta_log`
    publication (the data files already exist: writers stage them before proposing).
    """

    def __init__(self, uri: str, bootstrap_servers: str, topic_prefix: str, kafka_config: Mapping[str, str],
                 storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.bootstrap_servers = bootstrap_servers
        self.topic_prefix = topic_prefix
        self.kafka_config: dict[str, Any] = dict(kafka_config)
        #: Opens the table's store for versions the commits topic records by reference (large commits).
        self.storage_options = dict(storage_options or {})
        self._stream: Any = None
        self._start = 0
        self._actions: dict[int, list[Action]] = {}
        self._seen = -1

    def _open(self, version: int) -> None:
        from deltacoord.reader.stream import CommitStream
        from deltacoord.schemas.routing import Topics

        self.close()
        self._stream = CommitStream(self.uri, self.bootstrap_servers, topics=Topics.with_prefix(self.topic_prefix),
                                    starting_version=version, include_all_commits=True,
                                    storage_options=self.storage_options, **self.kafka_config)
        self._start = version
        self._seen = version - 1

    def _drain(self, timeout_s: float) -> None:
        if self._stream is None:
            self._open(0)
        deadline = time.monotonic() + timeout_s
        while True:
            events = self._stream.poll(max(0.0, min(0.2, deadline - time.monotonic())))
            for e in events:
                self._actions[e.version] = list(e.actions)
                self._seen = max(self._seen, e.version)
            if not events or time.monotonic() >= deadline:
                return

    def latest(self) -> int | None:
        self._drain(0.5)
        return None if self._seen < 0 else self._seen

    def actions(self, version: int) -> list[Action] | None:
        if self._stream is None or version < self._start:
            self._actions.clear()
            self._open(version)
        if version not in self._actions and version > self._seen:
            self._drain(0.5)
        return self._actions.get(version)

    def forget_before(self, version: int) -> None:
        self._actions = {v: a for v, a in self._actions.items() if v >= version}

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


# --------------------------------------------------------------------------- streaming reads


def _offset(version: int, index: int, snapshot: bool, table_id: str) -> dict[str, Any]:
    return {"reservoirId": table_id, "reservoirVersion": version, "index": index, "isStartingVersion": snapshot}


def _read_compatible(read_schema: Mapping[str, Any], read_parts: Sequence[str], md: Metadata) -> bool:
    """Can a stream with this read schema read data written under `md`? (Additive, nullable changes only.)"""
    if tuple(read_parts) != tuple(md.partition_columns):
        return False
    read_fields = {f["name"]: f for f in read_schema["fields"]}
    data_fields = {f["name"]: f for f in md.schema()["fields"]}
    for name, f in data_fields.items():
        rf = read_fields.get(name)
        if rf is None or rf["type"] != f["type"]:
            return False
    return all(f.get("nullable", True) for name, f in read_fields.items() if name not in data_fields)


@dataclass
class _Commit:
    """What a stream takes from one commit: the file entries it emits and its metaData, if any."""

    files: list[dict[str, Any]]
    metadata: Metadata | None
    timestamp: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class DeltaCoordStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Delta-like streaming source over `_delta_log`. Lives in one long-lived driver worker."""

    def __init__(self, options: Mapping[str, str], metadata: Metadata, spark_schema: StructType) -> None:
        self.uri = _path_option(options)
        self.storage = _storage(options)
        self.read_metadata = metadata
        # The schema the query was defined with: the table's columns that are in the DataFrame's schema.
        names = set(spark_schema.fieldNames())
        table_schema = metadata.schema()
        self.read_schema = {**table_schema, "fields": [f for f in table_schema["fields"] if f["name"] in names]}
        self.read_parts = tuple(metadata.partition_columns)
        self.plan = ReadPlan.of(self.storage, metadata, spark_schema)
        self.table_id = metadata.id
        self.starting_version = options.get("startingVersion")
        self.starting_timestamp = options.get("startingTimestamp")
        if self.starting_version is not None and self.starting_timestamp is not None:
            raise ValueError("Please either provide 'startingVersion' or 'startingTimestamp'")
        mfpt = options.get("maxFilesPerTrigger")
        self.max_files = int(mfpt) if mfpt is not None else DEFAULT_MAX_FILES_PER_TRIGGER
        if self.max_files <= 0:
            raise ValueError(f"maxFilesPerTrigger must be a positive integer, got {mfpt!r}")
        self.ignore_deletes = _bool_opt(options, "ignoreDeletes")
        self.ignore_changes = _bool_opt(options, "ignoreChanges") or _bool_opt(options, "ignoreFileDeletion")
        self.skip_change_commits = _bool_opt(options, "skipChangeCommits")
        bootstrap = options.get("bootstrap.servers") or options.get("kafka.bootstrap.servers")
        self.feed: _LogFeed | _KafkaFeed
        if bootstrap:
            kafka = {k[len("kafka."):]: v for k, v in options.items()
                     if k.lower().startswith("kafka.") and k.lower() != "kafka.bootstrap.servers"}
            self.feed = _KafkaFeed(self.uri, bootstrap, client_settings.topic_prefix(options.get("topic.prefix")), kafka,
                                   storage_options_of(options))
        else:
            self.feed = _LogFeed(self.storage, self.uri)
        self._commits: dict[int, _Commit] = {}
        self._snapshot_files: dict[int, list[dict[str, Any]]] = {}
        self._target: int | None = None  # Trigger.AvailableNow: the last version to read

    # ---- log access
    def _latest_version(self) -> int:
        latest = self.feed.latest()
        if latest is None:
            raise TableNotFoundError(f"no Delta table at {self.uri}")
        return latest if self._target is None else min(latest, self._target)

    def _snapshot_entries(self, version: int) -> list[dict[str, Any]]:
        cached = self._snapshot_files.get(version)
        if cached is None:
            snap = Snapshot.load(self.storage, version=version)
            self._check_table(snap.metadata, version)
            if not _read_compatible(self.read_schema, self.read_parts, snap.metadata):
                raise self._schema_changed(version, snap.metadata)
            adds = sorted(snap.files(), key=lambda a: (a.modification_time, a.path))
            cached = [_file_entry(a) for a in adds]
            self._snapshot_files = {version: cached}
        return cached

    def _commit(self, version: int) -> _Commit | None:
        """The commit at `version`, None when it is not published yet."""
        c = self._commits.get(version)
        if c is not None:
            return c
        actions = self.feed.actions(version)
        if actions is None:
            return None
        md: Metadata | None = None
        adds: list[AddFile] = []
        removes: list[RemoveFile] = []
        ts = 0
        for a in actions:
            if isinstance(a, Metadata):
                md = a
            elif isinstance(a, AddFile) and a.data_change:
                adds.append(a)
            elif isinstance(a, RemoveFile) and a.data_change:
                removes.append(a)
            elif isinstance(a, CommitInfo):
                ts = a.in_commit_timestamp or a.timestamp or 0
        files: list[dict[str, Any]]
        if removes and self.skip_change_commits:
            files = []
        elif removes and adds and not self.ignore_changes:
            raise DeltaSourceDataChangeError(
                f"Detected a data update (for example {removes[0].path}) in the source table at version {version}. "
                "This is currently not supported. If this is going to happen regularly and you are okay to skip "
                "changes, set the option 'skipChangeCommits' to 'true'. If you would like the data update to be "
                "reflected, please restart this query with a fresh checkpoint directory."
            )
        elif removes and not adds and not (self.ignore_deletes or self.ignore_changes):
            raise DeltaSourceDataChangeError(
                f"Detected deleted data (for example {removes[0].path}) from streaming source at version {version}. "
                "This is currently not supported. If you'd like to ignore deletes, set the option 'ignoreDeletes' to 'true'."
            )
        else:
            files = [_file_entry(a) for a in adds]
        c = _Commit(files, md, ts)
        if len(self._commits) > 256:
            self._commits.clear()
        self._commits[version] = c
        return c

    def _check_table(self, md: Metadata, version: int) -> None:
        if md.id != self.table_id:
            raise DifferentTableError(
                f"the table at {self.uri} has id {md.id} at version {version}, but this stream reads table {self.table_id}; "
                "use a new checkpoint location to read a different table"
            )

    def _schema_changed(self, version: int, md: Metadata) -> MetadataChangedException:
        return MetadataChangedException(
            f"MetadataChangedException: Detected schema change in version {version}: streaming source schema: "
            f"{json.dumps(self.read_schema, separators=(',', ':'))} (partitioned by {list(self.read_parts)}), "
            f"data file schema: {md.schema_string} (partitioned by {list(md.partition_columns)}). Please try restarting "
            "the query. If this issue repeats across query restarts without making progress, you have made an "
            "incompatible schema change and need to start your query from scratch using a new checkpoint directory.",
            winning_version=version,
            table=self.uri,
        )

    # ---- offsets
    def _starting_version_from_timestamp(self, ts: str) -> int:
        from deltacoord.reader.snapshot import to_epoch_ms

        want = to_epoch_ms(ts)
        latest = self.feed.latest()
        if latest is None:
            return 0
        listing = list_log(self.storage)
        for v in range(0, latest + 1):
            c = self._commit(v)
            t = c.timestamp if c is not None else 0
            if not t and v in listing.commits:
                t = listing.commit_mtime_ms(v)
            if t >= want:
                return v
        return latest + 1

    def initialOffset(self) -> dict[str, Any]:
        if self.starting_version is not None:
            sv = str(self.starting_version).strip().lower()
            if sv == "latest":
                latest = self.feed.latest()
                v = 0 if latest is None else latest + 1
            else:
                v = int(sv)
            if v < 0:
                raise ValueError(f"startingVersion must be >= 0 or 'latest', got {self.starting_version!r}")
            return _offset(v, 0, False, self.table_id)
        if self.starting_timestamp is not None:
            return _offset(self._starting_version_from_timestamp(str(self.starting_timestamp)), 0, False, self.table_id)
        # The initial snapshot is read from `_delta_log`: the newest published version.
        published = list_log_from_hint(self.storage).latest_commit_version
        if published is None:
            raise TableNotFoundError(f"no Delta table at {self.uri}")
        return _offset(published, 0, True, self.table_id)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_files)

    def prepareForTriggerAvailableNow(self) -> None:
        latest = self.feed.latest()
        self._target = -1 if latest is None else latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if start.get("reservoirId") not in (None, self.table_id):
            raise DifferentTableError(
                f"the stream's checkpoint is for table {start.get('reservoirId')}, but {self.uri} is table {self.table_id}"
            )
        budget: float = limit.max_files if isinstance(limit, ReadMaxFiles) else math.inf
        version, index, snap = int(start["reservoirVersion"]), int(start["index"]), bool(start["isStartingVersion"])
        latest = self._latest_version()
        progressed = False
        while True:
            if snap:
                files = self._snapshot_entries(version)
            else:
                if version > latest:
                    break
                c = self._commit(version)
                if c is None:
                    break
                if index == 0 and c.metadata is not None:
                    self._check_table(c.metadata, version)
                    if not _read_compatible(self.read_schema, self.read_parts, c.metadata):
                        if progressed:
                            break  # deliver everything before the change first
                        raise self._schema_changed(version, c.metadata)
                files = c.files
            remaining = len(files) - index
            if remaining > 0:
                if budget <= 0:
                    break
                take = int(min(budget, remaining))
                budget -= take
                index += take
                progressed = True
                if index < len(files):
                    break
            version, index, snap = version + 1, 0, False
        return _offset(version, index, snap, self.table_id)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if not isinstance(self.feed, _LogFeed):
            return None
        latest = self.feed.latest()
        return None if latest is None else _offset(latest + 1, 0, False, self.table_id)

    def _entries_between(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> list[dict[str, Any]]:
        version, index, snap = int(start["reservoirVersion"]), int(start["index"]), bool(start["isStartingVersion"])
        ev, ei, es = int(end["reservoirVersion"]), int(end["index"]), bool(end["isStartingVersion"])
        out: list[dict[str, Any]] = []
        while (version, 0 if snap else 1) < (ev, 0 if es else 1) or ((version, snap) == (ev, es) and index < ei):
            if snap:
                files = self._snapshot_entries(version)
            else:
                c = self._commit(version)
                if c is None:
                    raise VersionNotFoundError(f"commit {version} of {self.uri} is not available")
                files = c.files
            stop = ei if (version, snap) == (ev, es) else len(files)
            out.extend(files[index:stop])
            if (version, snap) == (ev, es):
                break
            version, index, snap = version + 1, 0, False
        return out

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return pack_files(self._entries_between(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, FilesPartition):  # Spark reads one empty partition when there are none
            yield from self.plan.read(partition.files)

    def commit(self, end: dict[str, Any]) -> None:
        v = int(end["reservoirVersion"])
        self._commits = {k: c for k, c in self._commits.items() if k >= v}
        if isinstance(self.feed, _KafkaFeed):
            self.feed.forget_before(v)

    def stop(self) -> None:
        self.feed.close()


# --------------------------------------------------------------------------- the data source


class DeltaCoordSource(DataSource):
    """Read-only `deltacoord` data source (batch and streaming). See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _table_metadata(self) -> tuple[Snapshot, StructType]:
        snap = _resolve_snapshot(self.options)
        snap.check_readable()
        return snap, spark_schema_of(snap)

    def schema(self) -> StructType:
        return self._table_metadata()[1]

    def reader(self, schema: StructType) -> DataSourceReader:
        snap = _resolve_snapshot(self.options)
        snap.check_readable()
        plan = ReadPlan.of(snap.storage, snap.metadata, schema)
        return DeltaCoordBatchReader(plan, [_file_entry(a) for a in snap.files()])

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = {k: v for k, v in self.options.items() if k.lower() not in ("versionasof", "timestampasof")}
        snap = Snapshot.load(_storage(opts))
        snap.check_readable()
        return DeltaCoordStreamReader(_CaseInsensitive(opts), snap.metadata, schema)


class _CaseInsensitive(dict[str, str]):
    """Option lookup ignoring case (PySpark hands options over in a case-insensitive dict)."""

    def __init__(self, d: Mapping[str, str]) -> None:
        super().__init__({k.lower(): v for k, v in d.items()})

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)
