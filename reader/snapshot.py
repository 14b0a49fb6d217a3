"""Snapshots of a Delta table reconstructed from `_delta_log` (log replay and time travel).

`Snapshot.load(table_uri, version=None, timestamp=None)` picks the newest
complete checkpoint at or before the target version, reads it with Arrow
(only the columns needed) and applies the JSON commits after it, reconciling
per PROTOCOL.md "Action Reconciliation":

* the latest `protocol` and `metaData` win;
* the latest `txn` per appId wins;
* the latest `domainMetadata` per domain wins, `removed=true` drops it;
* files are keyed by (path, deletion-vector unique id); the newest action for
  a key decides whether it is live (`add`) or a tombstone (`remove`).

Live files from the checkpoint stay Arrow (`deltacoord.reader.checkpoint_adds`) until
`files()` asks for Python `AddFile` objects, which then replace them; with `files_on_demand`
they are not read at all until asked for (a blind append needs none). `to_pyarrow()`
reads the data with partition pruning, partition columns restored with their
Delta types, deletion vectors applied, and column mapping (name or id mode)
resolved at every nesting level; a `variant` column reads as its binary
encoding (struct of `metadata` and `value`), as delta-rs returns it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.reader.checkpoint import CheckpointReadError, iter_checkpoint_batches, read_checkpoint_table
from deltacoord.reader.checkpoint_adds import CheckpointAdds, read_live_adds
from deltacoord.reader.deletion_vectors import keep_mask, read_deletion_vector
from deltacoord.reader.log import (
    CorruptLogError,
    LogListing,
    LogSegment,
    TableLocation,
    VersionNotFoundError,
    check_schema_string,
    commit_key,
    commit_object,
    data_object,
    iter_commits,
    list_log,
    list_log_from_hint,
    log_segment,
    read_commit,
    read_commit_info,
    table_storage,
)
from deltacoord.schemas import arrow_types
from deltacoord.schemas.action_arrow import (
    ADD_TYPE,
    SMALL_ACTION_COLUMNS,
    adds_to_struct,
    file_key_strings,
    key_string,
    non_null,
    removes_from_struct,
    small_actions_from_table,
    string_array,
)
from deltacoord.schemas.actions import (
    Action,
    AddFile,
    CommitInfo,
    DeletionVector,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.expressions.types import parse_text, to_bool, to_date, to_timestamp
from deltacoord.schemas.jobs import is_time_version
from deltacoord.schemas.properties import PHYSICAL_NAME_KEY, TableProperties
from deltacoord.schemas.table_features import reader_problems
from deltacoord.storage.table import StorageError, StoredObject, TableStorage

if TYPE_CHECKING:
    from deltacoord.reader.ratified import RatifiedSource
    from deltacoord.schemas.expressions.arrow import Filter

FileAction: TypeAlias = AddFile | RemoveFile
TimestampLike: TypeAlias = dt.datetime | dt.date | int | float | str



class UnsupportedTableFeatureError(DeltaCoordError, NotImplementedError):
    """The table uses a feature this reader cannot honour."""


#: How a `variant` column reads: its binary encoding (Parquet's `metadata` and `value`), as delta-rs
#: returns it; Arrow has no variant type of its own to decode it into.
VARIANT_ARROW_TYPE = arrow_types.VARIANT_ARROW_TYPE


# --------------------------------------------------------------------------- Delta schema -> Arrow


def delta_type_to_arrow(t: Any) -> pa.DataType:
    """Arrow type of a Delta schema type (primitive name or complex JSON object), by `deltacoord.schemas.arrow_types`."""
    try:
        return arrow_types.delta_to_arrow(t)
    except arrow_types.DeltaTypeError as e:
        raise UnsupportedTableFeatureError(str(e)) from None


def delta_schema_to_arrow(schema: Mapping[str, Any]) -> pa.Schema:
    """Arrow schema of a Delta struct type (logical column names)."""
    try:
        return arrow_types.delta_schema_to_arrow(schema)
    except arrow_types.DeltaTypeError as e:
        raise UnsupportedTableFeatureError(str(e)) from None


def physical_name(f: Mapping[str, Any], mode: str) -> str:
    if mode in ("name", "id"):
        meta = f.get("metadata") or {}
        name = meta.get(PHYSICAL_NAME_KEY)
        if isinstance(name, str):
            return name
    return str(f["name"])


# --------------------------------------------------------------------------- partition values


def _parse_timestamp(s: str, tz: bool) -> dt.datetime:
    """A timestamp partition value: aware UTC for `timestamp`, naive wall time for `timestamp_ntz`."""
    value = to_timestamp(s)
    return value.astimezone(dt.UTC) if tz else value.replace(tzinfo=None)


def parse_partition_value(s: str | None, t: pa.DataType) -> Any:
    """The typed value of one serialised partition value (None and '' are null), by `types.py`'s rules."""
    if s is None or s == "":
        return None
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return s
    if pa.types.is_integer(t):
        return parse_text(s, "long")
    if pa.types.is_floating(t):
        return parse_text(s, "double")
    if pa.types.is_boolean(t):
        try:
            return to_bool(s)
        except ValueError:
            raise ValueError(f"bad boolean partition value {s!r}") from None
    if pa.types.is_date(t):
        return to_date(s)
    if pa.types.is_timestamp(t):
        return _parse_timestamp(s, tz=t.tz is not None)
    if pa.types.is_decimal(t):
        return decimal.Decimal(s.strip())
    if pa.types.is_binary(t):
        return s.encode("utf-8")
    if pa.types.is_null(t):
        return None
    raise UnsupportedTableFeatureError(f"partition column type {t} is not supported")


def _typed_partition_array(values: pa.Array, t: pa.DataType) -> pa.Array:
    """Parse a string array of partition values into type `t` (unique values parsed once)."""
    if pa.types.is_string(t):
        return pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)
    enc = pc.dictionary_encode(values)
    uniq = [parse_partition_value(v, t) for v in enc.dictionary.to_pylist()]
    typed_dict = pa.array(uniq, type=t)
    return typed_dict.take(enc.indices)


def _parses(s: str | None, t: pa.DataType) -> bool:
    try:
        parse_partition_value(s, t)
    except (ValueError, ArithmeticError):
        return False
    return True


def _pruned(indices: list[int], where: str, metadata: Metadata,
            written: Callable[[int], Mapping[str, str | None]]) -> list[int]:
    """The files (by index) a read with condition `where` (over partition columns) cannot skip: the
    coordinator's own pruning (`partitions.prune`), so a file whose partition value cannot be evaluated is
    kept, never silently dropped. A condition the matcher cannot evaluate prunes nothing."""
    from deltacoord.schemas.expressions.partitions import prune
    from deltacoord.schemas.expressions.syntax import ExpressionError

    try:
        return prune(indices, where, metadata, written)
    except ExpressionError:
        return indices


# --------------------------------------------------------------------------- timestamps


#: Numbers in this range are refused as timestamps: as seconds they are 2001 to 5138, as milliseconds the
#: first weeks of 1970, when no Delta table was written.
SECONDS_LOOKALIKE = (1e9, 1e11)


def _ms_text(ms: int | None) -> str:
    """`ms` with its unit and as UTC time, for messages."""
    if ms is None:
        return "unknown"
    try:
        return f"{ms} ms ({dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec='milliseconds')})"
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"


def to_epoch_ms(ts: TimestampLike) -> int:
    """Milliseconds since the epoch of a datetime (naive = UTC), a date, an ISO string or ms."""
    if isinstance(ts, bool):
        raise TypeError("a timestamp cannot be a bool")
    if isinstance(ts, (int, float)):
        if SECONDS_LOOKALIKE[0] <= ts < SECONDS_LOOKALIKE[1]:
            raise ValueError(f"timestamp {ts!r} looks like seconds since the epoch (what time.time() gives), but a "
                             f"number is read as milliseconds: pass {int(ts * 1000)}, a datetime or an ISO string")
        return int(ts)
    if isinstance(ts, str):
        ts = _parse_timestamp(ts, tz=True)
    if isinstance(ts, dt.datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=dt.UTC)
        return int(ts.timestamp() * 1000)
    if isinstance(ts, dt.date):
        return int(dt.datetime(ts.year, ts.month, ts.day, tzinfo=dt.UTC).timestamp() * 1000)
    raise TypeError(f"unsupported timestamp {ts!r}")


# --------------------------------------------------------------------------- replay


@dataclass
class LogReplayState:
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    txns: dict[str, SetTransaction] = field(default_factory=dict)
    domains: dict[str, DomainMetadata] = field(default_factory=dict)
    files: dict[str, FileAction] = field(default_factory=dict)  # key string -> newest action

    def apply(self, actions: Iterable[Action]) -> None:
        for a in actions:
            if isinstance(a, AddFile | RemoveFile):
                self.files[key_string(*a.key())] = a
            elif isinstance(a, Metadata):
                self.metadata = a
            elif isinstance(a, Protocol):
                self.protocol = a
            elif isinstance(a, SetTransaction):
                self.txns[a.app_id] = a
            elif isinstance(a, DomainMetadata):
                self.domains[a.domain] = a


def _filter_out_keys(files: pa.ChunkedArray, keys: Iterable[str]) -> pa.ChunkedArray:
    ks = list(keys)
    if not ks or len(files) == 0:
        return files
    value_set = string_array(ks)
    return pa.chunked_array([c.filter(pc.invert(pc.is_in(file_key_strings(c), value_set=value_set))) for c in files.chunks],
                            type=files.type)


def _checkpoint_small_actions(paths: Sequence[StoredObject]) -> list[Action]:
    """protocol, metaData, txn and domainMetadata of a checkpoint, reading only row groups that hold them."""
    out: list[Action] = []
    try:
        for batch in iter_checkpoint_batches(paths, list(SMALL_ACTION_COLUMNS), skip_absent=True, use_threads=False):
            out.extend(small_actions_from_table(batch))
    except (OSError, pa.ArrowException, StorageError) as e:
        raise CheckpointReadError(f"cannot read checkpoint {paths[0] if paths else ''}: {e}") from e
    return out


def _adds_on_demand(uri: str, version: int, paths: Sequence[StoredObject], superseded: Iterable[str]) -> CheckpointAdds:
    """The live adds of a snapshot loaded with `files_on_demand`, read at their first use."""
    try:
        return read_live_adds(paths, superseded)
    except CheckpointReadError as e:
        raise CheckpointReadError(f"the files of {uri} at version {version} were left to read when first asked for, and "
                                  f"now: {e}; load the snapshot again") from e


@dataclass(eq=False)
class Snapshot:
    """The state of a table at one version."""

    table_uri: str
    storage: TableStorage = field(repr=False)
    version: int
    protocol: Protocol
    metadata: Metadata
    txns: Mapping[str, SetTransaction]
    domain_metadata: Mapping[str, DomainMetadata]
    segment: LogSegment = field(repr=False)
    _checkpoint_adds: CheckpointAdds = field(repr=False)  # live adds from the checkpoint
    _commit_files: Mapping[str, FileAction] = field(repr=False)  # newest action per key from later commits

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        table_uri: TableLocation,
        version: int | None = None,
        timestamp: TimestampLike | None = None,
        *,
        storage_options: Mapping[str, str] | None = None,
        time_version: bool = False,
        ratified: RatifiedSource | None = None,
        files_on_demand: bool = False,
    ) -> Snapshot:
        """Reconstruct the table at `version` (default latest) or as of `timestamp`.

        `time_version=True` (with a timestamp) resolves it to the newest *time version*
        at or before it: compaction and clustering commits make none (`deltacoord.schemas.jobs`),
        so the snapshot is the last commit that changed data, as MaxCompute reads by time.

        `table_uri` is a path, a URI (`s3://...`, `abfss://...`, `gs://...`) or a
        `TableStorage`; `storage_options` are delta-rs's keys (endpoint, region,
        credentials, ...). With a timestamp, the snapshot is the newest version whose
        commit timestamp is <= it (in-commit timestamps when enabled, else
        monotonised commit-file modification times); a timestamp after the latest
        commit gives the latest version, one before the earliest commit is an error.
        The latest version (or one at or after `_last_checkpoint`) is found by listing
        the log from the hinted checkpoint on; older versions list the whole log.

        With `ratified` (the table's deployment and id), the latest snapshot also holds the
        versions ratified in Kafka but not yet published to `_delta_log` (read-your-writes for
        `wait="ratified"` commits); its `history()` and `timestamp` still describe published versions.

        With `files_on_demand`, the checkpoint's live files are read when first asked for (`files()`,
        `num_files`, ...), not now: a blind append needs the protocol, metadata, app versions and version, which
        come from the checkpoint's small columns, and not its `add` column, most of its bytes. A checkpoint that
        cannot be read then raises CheckpointReadError there instead of falling back to an older one here.
        """
        if version is not None and timestamp is not None:
            raise ValueError("give a version or a timestamp, not both")
        if ratified is not None:
            if version is not None or timestamp is not None:
                raise ValueError("ratified versions are read for the latest snapshot only: give no version or timestamp")
            published = cls.load(table_uri, storage_options=storage_options, files_on_demand=files_on_demand)
            return published.with_commits(ratified.after(published.version, published._commit_info_ms(),
                                                         storage=table_storage(table_uri, storage_options)))
        storage = table_storage(table_uri, storage_options)
        uri = storage.location if isinstance(table_uri, TableStorage) else str(table_uri)
        if timestamp is not None:
            listing = list_log(storage)
            version = _version_at_timestamp(storage, listing, to_epoch_ms(timestamp))
            if time_version:
                version = _time_version_at_or_before(listing, version)
            return cls._load_from_listing(uri, storage, listing, version, files_on_demand=files_on_demand)
        if time_version:
            raise ValueError("time_version=True resolves a timestamp: give timestamp=")
        listing = list_log_from_hint(storage, at_most=version)
        if listing.listed_from is not None:
            try:
                return cls._load_from_listing(uri, storage, listing, version, files_on_demand=files_on_demand)
            except (VersionNotFoundError, CorruptLogError):
                listing = list_log(storage)  # the hinted part of the log cannot build it: read everything
        return cls._load_from_listing(uri, storage, listing, version, files_on_demand=files_on_demand)

    @classmethod
    def _load_from_listing(cls, uri: str, storage: TableStorage, listing: LogListing, version: int | None, *,
                           with_files: bool = True, files_on_demand: bool = False) -> Snapshot:
        target = listing.latest_version if version is None else version
        candidates = listing.checkpoint_candidates(target if target is not None else 0)
        errors: list[str] = []
        for cp in [*candidates, None]:
            try:
                if cp is None:
                    segment = log_segment(listing, version, use_checkpoint=False)
                else:
                    segment = log_segment(listing, version, checkpoint=cp)
            except (VersionNotFoundError, CorruptLogError):
                if cp is None and errors:
                    raise CorruptLogError(f"cannot load {uri}: " + "; ".join(errors)) from None
                if cp is None:
                    raise
                continue
            try:
                return cls._replay(uri, storage, segment, with_files=with_files, files_on_demand=files_on_demand)
            except CheckpointReadError as e:
                errors.append(str(e))
                continue
        raise CorruptLogError(f"cannot load {uri}: " + "; ".join(errors))

    @classmethod
    def _replay(cls, uri: str, storage: TableStorage, segment: LogSegment, *, with_files: bool = True,
                files_on_demand: bool = False) -> Snapshot:
        state = LogReplayState()
        for _v, actions in iter_commits(segment):
            state.apply(actions)
        ckpt_adds = CheckpointAdds()
        if segment.checkpoint is not None:
            for a in _checkpoint_small_actions(segment.checkpoint.paths):
                if isinstance(a, Protocol):
                    state.protocol = state.protocol or a
                elif isinstance(a, Metadata):
                    if state.metadata is None:
                        try:
                            check_schema_string(a, f"checkpoint {segment.checkpoint.paths[0]} (version {segment.checkpoint.version})")
                        except CorruptLogError as e:
                            raise CheckpointReadError(str(e)) from None
                    state.metadata = state.metadata or a
                elif isinstance(a, SetTransaction):
                    state.txns.setdefault(a.app_id, a)
                elif isinstance(a, DomainMetadata):
                    state.domains.setdefault(a.domain, a)
            if with_files:
                paths, superseded = segment.checkpoint.paths, list(state.files)
                ckpt_adds = (CheckpointAdds.on_demand(lambda: _adds_on_demand(uri, segment.version, paths, superseded))
                             if files_on_demand else read_live_adds(paths, superseded))
        if state.protocol is None:
            raise CorruptLogError(f"{uri}: no protocol action found up to version {segment.version}")
        if state.metadata is None:
            raise CorruptLogError(f"{uri}: no metaData action found up to version {segment.version}")
        return cls(
            table_uri=uri,
            storage=storage,
            version=segment.version,
            protocol=state.protocol,
            metadata=state.metadata,
            txns=dict(state.txns),
            domain_metadata={k: d for k, d in state.domains.items() if not d.removed},
            segment=segment,
            _checkpoint_adds=ckpt_adds,
            _commit_files=dict(state.files),
        )

    def _commit_info_ms(self) -> int:
        """This version's commitInfo timestamp (0 when its commit file or timestamp is not there)."""
        try:
            ci = read_commit_info(StoredObject(self.storage, commit_key(self.version)))
        except (OSError, StorageError, CorruptLogError):
            return 0
        ts = ci.values.get("timestamp") if ci is not None else None
        return int(ts) if isinstance(ts, int) else 0

    def with_commits(self, commits: Sequence[tuple[int, Sequence[Action]]]) -> Snapshot:
        """This snapshot moved forward by the given commits (each version's actions, in order from version + 1)."""
        if not commits:
            return self
        for i, (v, _a) in enumerate(commits):
            if v != self.version + 1 + i:
                raise ValueError(f"commits after version {self.version} must follow it one by one; got version {v}")
        state = LogReplayState(self.protocol, self.metadata, dict(self.txns), dict(self.domain_metadata), dict(self._commit_files))
        touched: set[str] = set()
        for _v, actions in commits:
            state.apply(actions)
            touched.update(key_string(*a.key()) for a in actions if isinstance(a, AddFile | RemoveFile))
        assert state.protocol is not None and state.metadata is not None
        return dataclasses.replace(
            self, version=commits[-1][0], protocol=state.protocol, metadata=state.metadata, txns=dict(state.txns),
            domain_metadata={k: d for k, d in state.domains.items() if not d.removed},
            _checkpoint_adds=self._checkpoint_adds.without(touched), _commit_files=state.files)

    @property
    def root(self) -> Path:
        """The table's local directory (tables on a local filesystem only; see `storage`)."""
        return Path(self.storage.local_path())

    @property
    def location(self) -> str:
        """The table root's normalised URI."""
        return self.storage.location

    # ------------------------------------------------------------------ table state

    @property
    def partition_columns(self) -> list[str]:
        return list(self.metadata.partition_columns)

    def properties(self) -> dict[str, str]:
        return dict(self.metadata.configuration)

    @property
    def app_versions(self) -> dict[str, int]:
        """Latest `txn` version per appId."""
        return {k: t.version for k, t in self.txns.items()}

    @property
    def domains(self) -> dict[str, str]:
        """Configuration of every live (non-removed) metadata domain."""
        return {k: d.configuration for k, d in self.domain_metadata.items()}

    def schema_json(self) -> dict[str, Any]:
        return self.metadata.schema()

    def schema(self) -> pa.Schema:
        """The table schema (logical names, partition columns included) as Arrow."""
        return delta_schema_to_arrow(self.metadata.schema())

    @property
    def num_files(self) -> int:
        return len(self._checkpoint_adds) + sum(1 for a in self._commit_files.values() if isinstance(a, AddFile))

    def add_files_struct(self) -> pa.Array:
        """All live files as one Arrow StructArray (checkpoint `add` column type)."""
        chunks = self._checkpoint_adds.arrow_chunks()
        commit_adds = [a for a in self._commit_files.values() if isinstance(a, AddFile)]
        if commit_adds:
            chunks.append(adds_to_struct(commit_adds))
        if not chunks:
            return pa.nulls(0, ADD_TYPE)
        return chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)

    def files(self) -> list[AddFile]:
        """The live AddFiles (the checkpoint's are built once, on first call, and replace its Arrow form)."""
        out = list(self._checkpoint_adds.adds())
        out.extend(a for a in self._commit_files.values() if isinstance(a, AddFile))
        return out

    def file_parts(self) -> list[pa.Array | Sequence[AddFile]]:
        """The live files in `files()`'s order, as held: the checkpoint's as `add` StructArrays until `files()`
        converts them, the later commits' as AddFiles (what `Transaction.remove_all` takes, with no object built
        for a checkpoint row)."""
        parts: list[pa.Array | Sequence[AddFile]] = list(self._checkpoint_adds.parts())
        commit_adds = [a for a in self._commit_files.values() if isinstance(a, AddFile)]
        if commit_adds:
            parts.append(commit_adds)
        return parts

    def file_paths(self) -> list[str]:
        """`add.path` of every live file (no Python objects built for checkpoint rows)."""
        paths = self._checkpoint_adds.paths()
        paths.extend(a.path for a in self._commit_files.values() if isinstance(a, AddFile))
        return paths

    def tombstones(self) -> list[RemoveFile]:
        """Remove tombstones of this version (unexpired or not; expiry is the checkpointer's call)."""
        out: list[RemoveFile] = []
        if self.segment.checkpoint is not None:
            t = read_checkpoint_table(self.segment.checkpoint.paths, ["remove"])
            removes = _filter_out_keys(pa.chunked_array([non_null(t.column("remove"))]), self._commit_files.keys())
            for chunk in removes.chunks:
                out.extend(removes_from_struct(chunk))
        out.extend(a for a in self._commit_files.values() if isinstance(a, RemoveFile))
        return out

    # ------------------------------------------------------------------ timestamps and history

    @functools.cached_property
    def timestamp(self) -> int:
        """Commit timestamp (ms) of this version: in-commit timestamp when enabled, else the commit file's mtime."""
        return _commit_timestamp(self.storage, self.version, self.protocol, self.metadata, self.segment)

    @property
    def timestamp_datetime(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.timestamp / 1000, tz=dt.UTC)

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """commitInfo of each available commit up to this version, newest first, with `version` added."""
        listing = list_log(self.storage)
        out: list[dict[str, Any]] = []
        for v in sorted((v for v in listing.commits if v <= self.version), reverse=True):
            if limit is not None and len(out) >= limit:
                break
            ci = read_commit_info(listing.commit(v))
            entry: dict[str, Any] = dict(ci.values) if ci is not None else {"timestamp": listing.commit_mtime_ms(v)}
            entry["version"] = v
            out.append(entry)
        return out

    # ------------------------------------------------------------------ data

    def check_readable(self) -> None:
        """Raise if the protocol needs reader features this reader lacks."""
        problems = reader_problems(self.protocol)  # what it reads: the table of features' `read` column
        if problems:
            raise UnsupportedTableFeatureError(f"{self.table_uri}: {problems[0]}")

    def _column_mapping_mode(self) -> str:
        return TableProperties.of(self.metadata).column_mapping_mode

    def read_adds(self, adds: Sequence[AddFile]) -> pa.Table:
        """The rows of the given data files (of this table, e.g. added by some commit) in this snapshot's schema."""
        self.check_readable()
        schema_json = self.metadata.schema()
        schema = delta_schema_to_arrow(schema_json)
        mode = self._column_mapping_mode()
        fields_json = {f["name"]: f for f in schema_json["fields"]}
        part_cols = set(self.metadata.partition_columns)
        data_fields = [(n, fields_json[n]) for n in schema.names if n not in part_cols]
        pieces = []
        for a in adds:
            pv = {c: parse_partition_value(a.partition_values.get(c), schema.field(c).type) for c in part_cols}
            pieces.append(read_data_file(data_object(self.storage, a.path), data_fields, mode, schema, pv,
                                          a.deletion_vector, self.storage, a.size))
        return pa.concat_tables(pieces) if pieces else schema.empty_table()

    def to_pyarrow(self, columns: Sequence[str] | None = None, filter: Filter | None = None) -> pa.Table:
        """Read the table's rows as one Arrow table.

        `columns`: logical column names (default all, in schema order).
        `filter`: a SQL predicate string (`"p = 'a' AND x > 3"`) or DNF tuples
        (`[("p", "=", "a")]`, or a list of such lists OR-ed together). Conjuncts
        over partition columns prune files, as the writer and the coordinator
        prune them (`partitions.prune`); the whole filter is then applied to
        the rows. A kept file whose partition value is not of its column's type
        raises ValueError naming it.
        """
        self.check_readable()
        schema_json = self.metadata.schema()
        full_schema = delta_schema_to_arrow(schema_json)
        mode = self._column_mapping_mode()
        fields_json = {f["name"]: f for f in schema_json["fields"]}
        part_cols = list(self.metadata.partition_columns)

        # The SQL engine is imported here, not with the module: the checkpoint process reads
        # snapshots without filters and should not carry sqlglot.
        from deltacoord.schemas.expressions.arrow import (
            evaluating,
            filter_text,
            filter_tree,
            implied,
            resolve_column,
            to_arrow,
        )
        from deltacoord.schemas.expressions.syntax import columns_of

        tree = filter_tree(filter) if filter is not None else None
        text = filter_text(filter) if filter is not None else ""
        filter_cols: set[str] = set()
        if tree is not None:
            filter_cols = {resolve_column(full_schema, c, text) for c in columns_of(tree)}

        out_names = list(full_schema.names) if columns is None else [resolve_column(full_schema, c, text) for c in columns]
        read_names = list(out_names) + [c for c in full_schema.names if c in filter_cols and c not in out_names]
        read_schema = pa.schema([full_schema.field(n) for n in read_names])

        adds = self.add_files_struct()
        n_files = len(adds)
        # ---- partition values as written (text, by physical name), then pruning by the coordinator's matcher
        pv_map = adds.field("partitionValues") if n_files else None
        written: dict[str, list[str | None]] = {}
        for c in part_cols:
            phys = physical_name(fields_json[c], mode) if c in fields_json else c
            written[phys] = (pc.map_lookup(pv_map, pa.scalar(phys), "first").cast(pa.string()).to_pylist()
                             if n_files and pv_map is not None else [])
        selected = list(range(n_files))
        if tree is not None and part_cols and n_files:
            pruning = implied(tree, part_cols)
            if pruning is not None:
                selected = _pruned(selected, pruning.sql(dialect="spark"), self.metadata,
                                   lambda i: {k: v[i] for k, v in written.items()})

        # ---- the kept files' partition values, typed, to materialise their columns
        paths = adds.field("path").to_pylist() if n_files else []
        sizes = adds.field("size").to_pylist() if n_files else []
        part_values: dict[str, list[Any]] = {}
        for c in part_cols:
            phys = physical_name(fields_json[c], mode) if c in fields_json else c
            t = full_schema.field(c).type if full_schema.get_field_index(c) >= 0 else pa.string()
            raw = written[phys]
            try:
                part_values[c] = _typed_partition_array(pa.array([raw[i] for i in selected], pa.string()), t).to_pylist()
            except (ValueError, ArithmeticError) as e:
                bad = next(i for i in selected if not _parses(raw[i], t))
                raise ValueError(
                    f"file {paths[bad]} has partition value {raw[bad]!r} for column {c!r}, which is not a valid "
                    f"{t}: its rows cannot be read (a filter on other partition columns that excludes the file "
                    f"skips it); fix the file's partitionValues in the table's log") from e
        dv_col = adds.field("deletionVector") if n_files else None
        has_dvs = dv_col is not None and dv_col.null_count < len(dv_col)
        dv_list: list[Any] = dv_col.to_pylist() if has_dvs and dv_col is not None else []
        data_fields = [(n, fields_json[n]) for n in read_names if n not in part_cols]

        def read_one(j: int) -> pa.Table:
            i = selected[j]
            dv = dv_list[i] if has_dvs else None
            return read_data_file(
                data_object(self.storage, paths[i]),
                data_fields,
                mode,
                read_schema,
                {c: part_values[c][j] for c in part_cols},
                None if dv is None else DeletionVector.from_json(dv),
                self.storage,
                sizes[i],
            )

        idx = range(len(selected))
        if len(idx) > 1:
            with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) * 2)) as ex:
                pieces = list(ex.map(read_one, idx))
        else:
            pieces = [read_one(j) for j in idx]
        result = pa.concat_tables(pieces) if pieces else read_schema.empty_table()
        if tree is not None:
            with evaluating(text):
                result = result.filter(to_arrow(tree, result.schema, text))
        return result.select(out_names)


#: Delta field metadata key of a column's id (column mapping).
COLUMN_ID_KEY = "delta.columnMapping.id"
#: Parquet field metadata key carrying a column's field id (Delta column mapping id mode).
_PARQUET_FIELD_ID = b"PARQUET:field_id"


def _field_id(f: Mapping[str, Any] | None, mode: str) -> int | None:
    """The column mapping id of a Delta field (id mode only)."""
    if mode != "id" or not f:
        return None
    value = (f.get("metadata") or {}).get(COLUMN_ID_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parquet_field_id(f: pa.Field) -> int | None:
    raw = (f.metadata or {}).get(_PARQUET_FIELD_ID)
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def _file_child_index(fields: Sequence[pa.Field], f: Mapping[str, Any] | None, logical: str, mode: str) -> int:
    """Index of a Delta field's column among a file's sibling fields, -1 when the file lacks it.

    As Delta does: by Parquet field id in id mode, else (and as a fallback) by physical name.
    """
    fid = _field_id(f, mode)
    if fid is not None:
        for i, pf in enumerate(fields):
            if _parquet_field_id(pf) == fid:
                return i
    name = physical_name(f, mode) if f else logical
    for i, pf in enumerate(fields):
        if pf.name == name:
            return i
    return -1


def _variant_to_arrow(arr: pa.Array, column: str) -> pa.Array:
    """A Parquet variant group (`value`, `metadata` binaries) as the reader's variant struct."""
    names = [f.name for f in arr.type] if pa.types.is_struct(arr.type) else []
    if "typed_value" in names or "metadata" not in names or "value" not in names:
        raise UnsupportedTableFeatureError(
            f"column {column!r} is a variant stored as {arr.type}: only unshredded variants (a struct of "
            "`metadata` and `value` binaries) can be read; rewrite the table without variant shredding "
            "(e.g. with Delta on Spark) to read it here")
    children = [arr.field(names.index("metadata")).cast(pa.binary()), arr.field(names.index("value")).cast(pa.binary())]
    return pa.StructArray.from_arrays(children, fields=list(VARIANT_ARROW_TYPE),
                                      mask=arr.is_null() if arr.null_count else None)


def to_logical(arr: pa.Array, type_json: Any, target: pa.DataType, mode: str, column: str = "") -> pa.Array:
    """Cast a file column to its logical type, renaming physical fields at every level (column mapping).

    `type_json` is the Delta type of the column; structs are matched field by field (by field id in
    id mode, else by physical name), and arrays and maps are rebuilt around their converted children,
    so structs nested in lists and maps get their values, not nulls.
    """
    if type_json == "variant":
        return _variant_to_arrow(arr, column)
    kind = type_json.get("type") if isinstance(type_json, dict) else None
    if kind == "struct" and pa.types.is_struct(target) and pa.types.is_struct(arr.type):
        nested = {f["name"]: f for f in type_json["fields"]}
        file_fields = list(arr.type)
        children = []
        for f in target:
            fj = nested.get(f.name)
            idx = _file_child_index(file_fields, fj, f.name, mode)
            children.append(pa.nulls(len(arr), f.type) if idx < 0
                            else to_logical(arr.field(idx), fj["type"] if fj else None, f.type, mode, f"{column}.{f.name}"))
        return pa.StructArray.from_arrays(children, fields=list(target), mask=arr.is_null() if arr.null_count else None)
    if kind == "array" and pa.types.is_list(target) and (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        values = to_logical(arr.values, type_json.get("elementType"), target.value_type, mode, f"{column}.element")
        offsets = arr.offsets.cast(pa.int32()) if pa.types.is_large_list(arr.type) else arr.offsets
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=arr.is_null() if arr.null_count else None)
    if kind == "map" and pa.types.is_map(target) and pa.types.is_map(arr.type):
        keys = to_logical(arr.keys, type_json.get("keyType"), target.key_type, mode, f"{column}.key")
        items = to_logical(arr.items, type_json.get("valueType"), target.item_type, mode, f"{column}.value")
        return pa.MapArray.from_arrays(arr.offsets, keys, items, type=target, mask=arr.is_null() if arr.null_count else None)
    if arr.type == target:
        return arr
    if pa.types.is_timestamp(target) and pa.types.is_timestamp(arr.type):
        if arr.type.tz is None and target.tz is not None:
            arr = pc.assume_timezone(arr, "UTC") if arr.type.unit == target.unit else pc.assume_timezone(arr.cast(pa.timestamp(target.unit)), "UTC")
        return arr.cast(target, safe=False)
    return arr.cast(target)


def read_data_file(
    path: StoredObject,
    data_fields: Sequence[tuple[str, Mapping[str, Any]]],
    mode: str,
    read_schema: pa.Schema,
    partition_values: Mapping[str, Any],
    dv: DeletionVector | None,
    storage: TableStorage,
    size: int | None = None,
) -> pa.Table:
    try:
        pf = path.storage.read_parquet_file(path.key, size=size, coerce_int96_timestamp_unit="us")
    except FileNotFoundError:
        raise CorruptLogError(f"data file {path} of the snapshot does not exist") from None
    file_fields = list(pf.schema_arrow)
    file_cols: dict[str, str] = {}  # logical name -> the file's column
    for name, fj in data_fields:
        idx = _file_child_index(file_fields, fj, name, mode)
        if idx >= 0:
            file_cols[name] = file_fields[idx].name
    t = pf.read(columns=sorted(set(file_cols.values())), use_threads=False)
    n = pf.metadata.num_rows
    mask: Any = None
    if dv is not None:
        mask = pa.array(keep_mask(n, read_deletion_vector(storage, dv)))
    fields_json = dict(data_fields)
    cols: list[pa.Array] = []
    for f in read_schema:
        if f.name in partition_values:
            v = partition_values[f.name]
            cols.append(pa.nulls(n, f.type) if v is None else pa.nulls(n, f.type).fill_null(pa.scalar(v, f.type)))
            continue
        file_col = file_cols.get(f.name)
        if file_col is not None:
            col = t.column(file_col)
            arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            cols.append(to_logical(arr, fields_json[f.name]["type"], f.type, mode, f.name))
        else:
            cols.append(pa.nulls(n, f.type))
    out = pa.Table.from_arrays(cols, schema=read_schema)
    if mask is not None:
        out = out.filter(mask)
    return out


# --------------------------------------------------------------------------- commit timestamps


def _commit_timestamp(storage: TableStorage, version: int, protocol: Protocol, metadata: Metadata,
                      segment: LogSegment | None = None) -> int:
    commit = commit_object(storage, version)
    props = TableProperties.of(metadata)
    if props.in_commit_timestamps:
        ev, _et = props.ict_enablement
        if version >= ev:
            try:
                ci = read_commit_info(commit)
            except FileNotFoundError:
                ci = None
            if ci is not None and ci.in_commit_timestamp is not None:
                return ci.in_commit_timestamp
    try:
        return commit.mtime_ms()
    except FileNotFoundError:
        if segment is not None and segment.checkpoint is not None and segment.checkpoint.version == version:
            return segment.checkpoint.paths[0].mtime_ms()
        raise VersionNotFoundError(f"commit {version} of {storage.location} is not available to read its timestamp") from None


def _time_version_at_or_before(listing: LogListing, version: int) -> int:
    """The newest version <= `version` that made a time version (the earliest commit when none did)."""
    for v in sorted((v for v in listing.commits if v <= version), reverse=True):
        actions = read_commit(listing.commit(v))
        ci = next((a for a in actions if isinstance(a, CommitInfo)), None)
        if is_time_version(ci, actions):
            return v
    return version


def _version_at_timestamp(storage: TableStorage, listing: LogListing, ts_ms: int) -> int:
    """Newest version whose commit timestamp is <= ts_ms."""
    where = storage.location
    latest = Snapshot._load_from_listing(where, storage, listing, None, with_files=False)
    versions = sorted(listing.commits)
    if not versions:
        raise VersionNotFoundError(f"{where}: no commit files to resolve a timestamp against")
    props = TableProperties.of(latest.metadata)
    use_ict = props.in_commit_timestamps
    ev, et = props.ict_enablement if use_ict else (versions[-1] + 1, None)
    if use_ict and (et is None or ts_ms >= et or ev <= versions[0]):
        cands = [v for v in versions if v >= ev]

        def ict(v: int) -> int:
            ci = read_commit_info(listing.commit(v))
            if ci is None or ci.in_commit_timestamp is None:
                return listing.commit_mtime_ms(v)
            return ci.in_commit_timestamp

        lo, hi = 0, len(cands)
        while lo < hi:  # first candidate with ts > ts_ms
            mid = (lo + hi) // 2
            if ict(cands[mid]) <= ts_ms:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            if ev > versions[0]:
                # before ICT enablement: fall through to file times of the older commits
                pass
            else:
                raise VersionNotFoundError(
                    f"timestamp {_ms_text(ts_ms)} is before the earliest available commit (version {cands[0]}, "
                    f"at {_ms_text(ict(cands[0]))})"
                )
        else:
            return cands[lo - 1]
    older = [v for v in versions if v < ev]
    best: int | None = None
    prev = -(2**63)
    earliest_ts: int | None = None
    for v in older:
        t = max(listing.commit_mtime_ms(v), prev + 1)  # monotonise like Delta's history manager
        prev = t
        if earliest_ts is None:
            earliest_ts = t
        if t <= ts_ms:
            best = v
        else:
            break
    if best is None:
        raise VersionNotFoundError(f"timestamp {_ms_text(ts_ms)} is before the earliest available commit "
                                   f"(at {_ms_text(earliest_ts)})")
    return best


def load_snapshot(table_uri: TableLocation, version: int | None = None, timestamp: TimestampLike | None = None, *,
                  storage_options: Mapping[str, str] | None = None) -> Snapshot:
    """Alias of `Snapshot.load`."""
    return Snapshot.load(table_uri, version=version, timestamp=timestamp, storage_options=storage_options)


__all__ = [
    "Snapshot",
    "UnsupportedTableFeatureError",
    "delta_schema_to_arrow",
    "delta_type_to_arrow",
    "load_snapshot",
    "parse_partition_value",
    "to_epoch_ms",
]
