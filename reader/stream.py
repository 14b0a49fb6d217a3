"""A change feed of one table's committed versions, read from the commits topic.

`CommitStream` follows one table the way Delta's streaming source
(`DeltaSource`) follows `_delta_log`, except that it reads the coordinator's
decisions from Kafka (read_committed), so it sees a version as soon as it is
ratified, before the coordinator has published `_delta_log/<v>.json`.

Semantics (Delta's streaming source, `DeltaSource.validateCommitAndDecideSkipping`):

* Versions arrive strictly in order, each at most once. Rejections and
  redeliveries (`duplicate_of` set: a re-sent proposal answered with its
  original version) are not versions and are skipped; a decision for a version
  already seen is ignored; a missing version is an error (`StreamGapError`).
* A data event holds the commit's `add`s with dataChange=true and its
  `remove`s with dataChange=true. Commits without any dataChange=true file
  action (CREATE TABLE, OPTIMIZE, SET TBLPROPERTIES, ADD COLUMNS ...) are not
  data events: they are skipped, and the stream advances past them.
* A commit with a dataChange=true `remove` fails the stream
  (`UnsupportedSourceChangeError`, Delta's `DELTA_SOURCE_IGNORE_DELETE` /
  `DELTA_SOURCE_TABLE_IGNORE_CHANGES` messages) unless `skip_change_commits`
  (every such commit is skipped, its adds included) or `ignore_deletes` (a
  commit that only removes data passes and is delivered with its removed files;
  a commit that removes and adds, e.g. UPDATE or MERGE, still fails).
* A commit that changes the schema (names, types, nullability; field metadata
  is ignored), the partition columns, the protocol or the table id raises
  `MetadataChangedException` after every earlier version was delivered. The
  stream's `position` is then that version, and a new stream started there
  continues with the new metadata: the first version a stream starts at never
  raises for its own metadata. Property-only changes do not fail the stream.
* Errors are sticky: once raised, every later `poll` raises the same error.

Starting point: `starting_version` (default 0, inclusive), `"latest"` (the
version after the newest one on the commits topic when the stream reaches its
end), or `starting_timestamp` (the earliest commit whose timestamp, the
in-commit timestamp when present else `commitInfo.timestamp`, is >= the given
one; if none exists yet, the first future commit that qualifies). A table
adopted at version N (`deltacoord table adopt`) has its versions up to N in
`_delta_log` only: a stream that would need them fails with `StreamGapError`
(start at N + 1 or "latest"), and since the metadata they set is not on the
topic either, the first metadata or protocol change after the adoption raises
`MetadataChangedException` (restart there, as for any metadata change).

How the start is found: decisions carry the table id and the version in
headers, so the table's partition is read from its beginning and every other
table's decision, every rejection and every redelivery is skipped by header,
without decoding. This table's commits before the start are decoded once, only
to know the schema and protocol the stream starts with. That is a linear scan
of the partition per stream start, acceptable while partitions hold up to a
few million decisions; an index (versions increase with offsets, so a binary
search over offsets, or a compacted version->offset topic) would make it
logarithmic.

Use `poll(timeout_s)` for a bounded wait, iterate the stream to block, or
`batches()` / `poll_batch(timeout_s)` for groups of whole commits holding at
most `max_files_per_batch` files (added + removed; a bigger commit is a batch
on its own; a batch holds what is available, so it may be smaller). Restart a
stream where another stopped with `starting_version=old.position`.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeAlias

from confluent_kafka import KafkaException, Message

from deltacoord.reader.log import table_root
from deltacoord.reader.snapshot import TimestampLike, to_epoch_ms
from deltacoord.reader.staged_commits import resolve_decision
from deltacoord.schemas import client_settings, kafka_logs
from deltacoord.schemas.actions import Action, AddFile, CommitInfo, Metadata, Protocol, RemoveFile
from deltacoord.schemas.codec import decode_decision
from deltacoord.schemas.commits_topic import CommitsTail, commits_partition, read_committed
from deltacoord.schemas.errors import ClientClosedError, DeltaCoordError, MetadataChangedException
from deltacoord.schemas.messages import Decision, Outcome
from deltacoord.schemas.routing import (
    ADOPTED_ERROR_TYPE,
    CONTROL_ADOPT,
    CONTROL_DROP,
    DROPPED_ERROR_TYPE,
    H_CONTROL,
    H_OUTCOME,
    H_TABLE_ID,
    H_VERSION,
    Topics,
    header,
)
from deltacoord.schemas.staged import StagedCommitError
from deltacoord.storage.table import StorageError, TableStorage
from deltacoord.storage.uri import StorageUriError, normalize_table_uri

log = logging.getLogger(__name__)

StartingVersion: TypeAlias = int | Literal["latest"] | None

__all__ = [
    "CommitEvent",
    "CommitStream",
    "StreamGapError",
    "UnsupportedSourceChangeError",
    "normalize_table_id",
]


class UnsupportedSourceChangeError(DeltaCoordError):
    """A commit deleted or rewrote data, which an append-only stream cannot express.

    `error_class` is Delta's (`DELTA_SOURCE_IGNORE_DELETE` or
    `DELTA_SOURCE_TABLE_IGNORE_CHANGES`, SQLSTATE 0A000).
    """

    sql_state: ClassVar[str] = "0A000"

    def __init__(self, error_class: str, message: str, *, version: int, table: str) -> None:
        self.error_class = error_class
        self.version = version
        self.table = table
        super().__init__(message)


class StreamGapError(DeltaCoordError):
    """The commits topic lacks a version the stream needs (records deleted from the topic?)."""


@dataclass(frozen=True, slots=True)
class CommitEvent:
    """One committed version of the table."""

    version: int
    #: Commit timestamp (ms): the in-commit timestamp when present, else commitInfo.timestamp.
    timestamp: int
    operation: str | None
    #: `add` actions with dataChange=true.
    added: tuple[AddFile, ...]
    #: `remove` actions with dataChange=true (only ever non-empty with `ignore_deletes`, or `include_all_commits`).
    removed: tuple[RemoveFile, ...]
    commit_info: Mapping[str, Any] = field(default_factory=dict)
    #: The whole commit, commitInfo first, exactly as published to `_delta_log/<version>.json`.
    actions: tuple[Action, ...] = ()
    proposal_id: str | None = None

    @property
    def num_files(self) -> int:
        return len(self.added) + len(self.removed)

    @property
    def data_change(self) -> bool:
        """Whether the commit changed data (any dataChange=true add or remove)."""
        return bool(self.added or self.removed)

    def to_json(self, *, with_actions: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.version,
            "timestamp": self.timestamp,
            "operation": self.operation,
            "operationParameters": self.commit_info.get("operationParameters", {}),
            "txnId": self.proposal_id,
            "dataChange": self.data_change,
            "numAddedFiles": len(self.added),
            "numRemovedFiles": len(self.removed),
            "added": [a.path for a in self.added],
            "removed": [r.path for r in self.removed],
        }
        if with_actions:
            out["actions"] = [a.to_json() for a in self.actions]
        return out


def normalize_table_id(table_uri_or_id: str | os.PathLike[str]) -> str:
    """The wire table id of a table given by path, `file://` URI or id.

    Paths and `file://` URIs become the absolute `file://` URI that
    `deltacoord.writer.table.Table` uses by default; object-store URIs (`s3://...`,
    `s3a://...`, `abfss://...`) their normal form, which `Table` uses too; a URI
    of another scheme is used as it is. A string that is neither a URI nor an
    existing path nor starts with `/`, `.` or `~` is taken as an explicit table id.
    """
    if isinstance(table_uri_or_id, os.PathLike):
        return Path(os.fspath(table_uri_or_id)).expanduser().resolve().as_uri()
    s = str(table_uri_or_id)
    if s.startswith("file:"):
        return table_root(s).resolve().as_uri()
    if "://" in s:
        try:
            return normalize_table_uri(s)
        except StorageUriError:
            return s
    if s.startswith(("/", ".", "~")) or os.path.exists(s):
        return Path(s).expanduser().resolve().as_uri()
    return s


def _strip_field_metadata(t: Any) -> Any:
    """A schema type without field metadata (comments, identity high-water marks, ...)."""
    if isinstance(t, dict):
        kind = t.get("type")
        if kind == "struct":
            return {
                "type": "struct",
                "fields": [
                    {"name": f.get("name"), "type": _strip_field_metadata(f.get("type")), "nullable": f.get("nullable", True)}
                    for f in t.get("fields", [])
                ],
            }
        return {k: _strip_field_metadata(v) for k, v in t.items() if k != "metadata"}
    return t


def _schema_key(md: Metadata) -> Any:
    try:
        return _strip_field_metadata(json.loads(md.schema_string))
    except ValueError:
        return md.schema_string


def _simple_schema(md: Metadata) -> str:
    try:
        fields = json.loads(md.schema_string).get("fields", [])
        return "struct<" + ", ".join(f"{f.get('name')}: {json.dumps(f.get('type'))}" for f in fields) + ">"
    except (ValueError, AttributeError):
        return md.schema_string


def _commit_timestamp(d: Decision) -> tuple[int, CommitInfo | None]:
    ci = next((a for a in d.actions if isinstance(a, CommitInfo)), None)
    if ci is not None:
        if ci.in_commit_timestamp is not None:
            return ci.in_commit_timestamp, ci
        if ci.timestamp is not None:
            return ci.timestamp, ci
    return d.decided_at_ms, ci


class CommitStream:
    """An iterator over the committed versions of one table, read from the commits topic.

    Not thread-safe: poll from one thread. Close it (or use it as a context
    manager) to release the Kafka consumer.
    """

    def __init__(
        self,
        table_uri_or_id: str | os.PathLike[str],
        bootstrap_servers: str | None = None,
        *,
        topic_prefix: str | None = None,
        topics: Topics | None = None,
        starting_version: StartingVersion = None,
        starting_timestamp: TimestampLike | None = None,
        max_files_per_batch: int = 1000,
        ignore_deletes: bool = False,
        skip_change_commits: bool = False,
        include_all_commits: bool = False,
        storage_options: Mapping[str, str] | None = None,
        **kafka_config: Any,
    ) -> None:
        """`include_all_commits` turns the data stream into a commit log (used by `deltacoord tail`):
        every committed version is delivered, including those that change no data, and neither
        deletes nor metadata changes raise. `bootstrap_servers` defaults to DELTACOORD_BOOTSTRAP_SERVERS and
        `topic_prefix` to DELTACOORD_TOPIC_PREFIX (else `deltacoord`), as for writers (docs/settings.md).
        `storage_options` (delta-rs's keys) open the table's store for large commits, which the commits topic
        records by reference (`deltacoord.reader.staged_commits`)."""
        if starting_version is not None and starting_timestamp is not None:
            raise ValueError("Please either provide 'starting_version' or 'starting_timestamp', not both")
        if isinstance(starting_version, bool) or not (
            starting_version is None or starting_version == "latest" or (isinstance(starting_version, int) and starting_version >= 0)
        ):
            raise ValueError(f"Invalid value {starting_version!r} for starting_version: must be a version >= 0 or 'latest'")
        if isinstance(max_files_per_batch, bool) or not isinstance(max_files_per_batch, int) or max_files_per_batch <= 0:
            raise ValueError(f"max_files_per_batch must be a positive integer, got {max_files_per_batch!r}")
        self.table_id = normalize_table_id(table_uri_or_id)
        self.topics = client_settings.topics_of(topic_prefix, topics)
        bootstrap_servers = client_settings.bootstrap_servers(bootstrap_servers)
        self.max_files_per_batch = max_files_per_batch
        self.ignore_deletes = ignore_deletes
        self.skip_change_commits = skip_change_commits
        self.include_all_commits = include_all_commits
        self.storage_options = dict(storage_options or {})
        self._storages: dict[str, TableStorage] = {}
        self._starting_ts_ms = None if starting_timestamp is None else to_epoch_ms(starting_timestamp)
        self._latest = starting_version == "latest"
        #: First version to deliver; None until resolved ("latest" / timestamp).
        self._deliver_from: int | None
        if self._latest or self._starting_ts_ms is not None:
            self._deliver_from = None
        else:
            self._deliver_from = starting_version if isinstance(starting_version, int) else 0
        #: Next version to process (versions before `_deliver_from` only update the tracked metadata).
        self._next = 0
        self._metadata: Metadata | None = None
        self._protocol: Protocol | None = None
        #: The table was adopted at a version the stream passed (its metadata before that is not on the topic).
        self._adopted = False
        self._ready: collections.deque[CommitEvent] = collections.deque()
        self._error: Exception | None = None
        self._closed = False

        conf = kafka_logs.kafka_config({
            "fetch.wait.max.ms": 10,
            **read_committed({"bootstrap.servers": bootstrap_servers, **kafka_config},
                             f"deltacoord-stream-{uuid.uuid4().hex}"),
            "enable.auto.offset.store": False,
        })
        # The table's partition from its beginning; only this table's records reach the stream.
        self._tail = CommitsTail(
            conf, self.topics.commits,
            lambda c: commits_partition(c, self.topics.commits, self.table_id, bootstrap_servers),
            headers={H_TABLE_ID: {self.table_id.encode()}})
        self.partition = self._tail.tp.partition

    # ------------------------------------------------------------------ public API

    @property
    def position(self) -> int | None:
        """The next version this stream will deliver (restart a stream there to continue).

        None while the start of a `"latest"` or `starting_timestamp` stream is not resolved yet.
        """
        if self._deliver_from is None:
            return None
        return max(self._next, self._deliver_from)

    def poll(self, timeout_s: float = 1.0) -> list[CommitEvent]:
        """The events available within `timeout_s` (returns early once there is at least one).

        Raises the stream's error (e.g. MetadataChangedException) once every
        event before it was returned.
        """
        self._check_open()
        if not self._ready:
            if self._error is not None:
                raise self._error
            self._fill(timeout_s)
        if not self._ready and self._error is not None:
            raise self._error
        out = list(self._ready)
        self._ready.clear()
        return out

    def poll_batch(self, timeout_s: float = 1.0) -> list[CommitEvent]:
        """Whole commits holding at most `max_files_per_batch` files (one bigger commit alone); [] on timeout."""
        self._check_open()
        if not self._ready:
            if self._error is not None:
                raise self._error
            self._fill(timeout_s)
            if not self._ready and self._error is not None:
                raise self._error
        # Take what is already buffered in Kafka too, without waiting.
        if self._ready and self._error is None and self._ready_files() < self.max_files_per_batch:
            self._fill(0.0, until_files=self.max_files_per_batch)
        batch: list[CommitEvent] = []
        files = 0
        while self._ready:
            n = self._ready[0].num_files
            if batch and files + n > self.max_files_per_batch:
                break
            batch.append(self._ready.popleft())
            files += n
        return batch

    def batches(self) -> Iterator[list[CommitEvent]]:
        """Block and yield batches forever (see `poll_batch`)."""
        while True:
            batch = self.poll_batch(1.0)
            if batch:
                yield batch

    def __iter__(self) -> Iterator[CommitEvent]:
        while True:
            yield from self.poll(1.0)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._tail.close()

    def __enter__(self) -> CommitStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CommitStream(table_id={self.table_id!r}, topic={self.topics.commits!r}, partition={self.partition}, position={self.position})"

    # ------------------------------------------------------------------ consuming

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the stream is closed")

    def _ready_files(self) -> int:
        return sum(e.num_files for e in self._ready)

    def _fill(self, timeout_s: float, *, until_files: int | None = None) -> None:
        """Read until an event is ready, an error occurs, or `timeout_s` passes."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while self._error is None:
            try:
                fetched = self._tail.poll(deadline - time.monotonic())
            except KafkaException as e:
                self._error = e
                return
            for m in fetched.records:
                self._on_message(m)
                if self._error is not None:
                    return
            if fetched.at_end and self._latest and self._deliver_from is None:
                self._deliver_from = self._next
                log.debug("stream of %s starts at the latest version + 1 = %d", self.table_id, self._next)
            if until_files is not None:
                if not fetched.count or self._ready_files() >= until_files:
                    return
                continue
            if self._ready or time.monotonic() >= deadline:
                return

    def _on_message(self, m: Message) -> None:
        """One of this table's records (the tail filtered the others out by header)."""
        if header(m, H_CONTROL) == CONTROL_ADOPT.encode():
            self._on_adoption(m)
            return
        if header(m, H_CONTROL) == CONTROL_DROP.encode():
            self._on_drop(m)
            return
        if header(m, H_OUTCOME) != Outcome.COMMITTED.value.encode():
            return
        raw_version = header(m, H_VERSION)
        if raw_version is None:
            return
        try:
            version = int(raw_version)
        except ValueError:
            return
        if version < self._next:
            return  # a redelivery's answer (duplicate_of), a commit coalesced into it, or a version seen already
        if version > self._next:
            self._error = StreamGapError(
                f"the commits topic {self.topics.commits}[{self.partition}] has version {version} of table {self.table_id} "
                f"at offset {m.offset()} but not version {self._next}: versions are missing from the topic"
            )
            return
        value = m.value()
        if value is None:
            return
        d = decode_decision(value)
        if not d.holds_version or d.version != version:
            return
        if d.staged is not None:
            try:
                storage = self._storages.get(d.table_uri) or self._storages.setdefault(
                    d.table_uri, TableStorage(d.table_uri, self.storage_options))
                d = resolve_decision(storage, d)
            except (StagedCommitError, StorageError, OSError, ValueError) as e:
                self._error = StreamGapError(f"version {version} of table {self.table_id} was recorded by reference and "
                                             f"cannot be read: {e}")
                return
        self._on_commit(d)

    def _on_adoption(self, m: Message) -> None:
        """An adoption record (`deltacoord table adopt`): the table's versions up to the adopted one were written by
        another engine and are in `_delta_log` only; the topic goes on from the next one."""
        value = m.value()
        if value is None:
            return
        d = decode_decision(value)
        n = d.winning_version
        if d.error_type != ADOPTED_ERROR_TYPE or n is None or n < self._next:
            return  # an adoption answered again, or nothing the stream still needs
        wanted = self._deliver_from
        if (wanted is not None and wanted <= n) or (
                wanted is None and self._starting_ts_ms is not None and self._starting_ts_ms < d.decided_at_ms):
            first = self._next if wanted is None else max(self._next, wanted)
            self._error = StreamGapError(
                f"table {self.table_id} was adopted by the coordinator at version {n}: versions {first}..{n} were written "
                f"before, by another engine, and are in _delta_log only, not on the commits topic "
                f"{self.topics.commits}. Start the stream after them (starting_version={n + 1}, or 'latest'), and read "
                "the earlier versions from _delta_log (Snapshot.load)")
            return
        self._next = n + 1
        self._metadata, self._protocol, self._adopted = None, None, True

    def _on_drop(self, m: Message) -> None:
        """A drop record (`deltacoord table drop`): the table ends, and versions after it belong to the table created
        afterwards under the same id, from version 0. A stream still finding its start follows that table; one
        that delivered versions of the dropped table stops (as Delta's streaming source stops when the table it
        reads is replaced)."""
        value = m.value()
        if value is None:
            return
        d = decode_decision(value)
        if d.error_type != DROPPED_ERROR_TYPE or d.duplicate_of is not None:
            return  # a drop answered again changed nothing
        if self._deliver_from is not None and self._next > self._deliver_from:
            self._error = StreamGapError(
                f"table {self.table_id} was dropped at version {d.winning_version} (`deltacoord table drop`) after this "
                "stream delivered versions of it: the versions that follow belong to a new table created under the same "
                "id, from version 0. To read that table, start a new stream after the drop: "
                f"starting_timestamp={d.decided_at_ms} (milliseconds), or starting_version='latest'")
            return
        self._next = 0
        self._metadata, self._protocol, self._adopted = None, None, False

    def _on_commit(self, d: Decision) -> None:
        assert d.version is not None
        v = d.version
        ts, ci = _commit_timestamp(d)
        if self._deliver_from is None and self._starting_ts_ms is not None and ts >= self._starting_ts_ms:
            self._deliver_from = v
        delivering = self._deliver_from is not None and v >= self._deliver_from
        md = next((a for a in d.actions if isinstance(a, Metadata)), None)
        proto = next((a for a in d.actions if isinstance(a, Protocol)), None)
        if delivering and v != self._deliver_from and not self.include_all_commits:
            change = self._metadata_change(md, proto)
            if change is not None:
                self._error = MetadataChangedException(
                    f"MetadataChangedException: Detected {change} in version {v} of the Delta table {d.table_uri or self.table_id} "
                    f"({ci.operation if ci else 'TRANSACTION'}). Every version before it was delivered. Please restart the "
                    f"stream from version {v} (CommitStream(..., starting_version={v})) to continue with the new metadata.",
                    winning_version=v, winning_operation=ci.operation if ci else None, table=d.table_uri or self.table_id,
                )
                return
        adds = tuple(a for a in d.actions if isinstance(a, AddFile) and a.data_change)
        removes = tuple(a for a in d.actions if isinstance(a, RemoveFile) and a.data_change)
        event: CommitEvent | None = None
        if delivering:
            if self.include_all_commits:
                event = self._event(d, ts, ci, adds, removes)
            elif removes and not self.skip_change_commits:
                if adds:
                    self._error = UnsupportedSourceChangeError(
                        "DELTA_SOURCE_TABLE_IGNORE_CHANGES",
                        f"[DELTA_SOURCE_TABLE_IGNORE_CHANGES] Detected a data update (for example {removes[0].path}) in the "
                        f"source table at version {v}. This is currently not supported. If this is going to happen regularly "
                        "and you are okay to skip changes, set the option 'skipChangeCommits' to 'true' "
                        "(skip_change_commits=True). If you would like the data update to be reflected, please restart this "
                        f"stream from scratch. The source table can be found at path {d.table_uri or self.table_id}.",
                        version=v, table=d.table_uri or self.table_id,
                    )
                    return
                if not self.ignore_deletes:
                    self._error = UnsupportedSourceChangeError(
                        "DELTA_SOURCE_IGNORE_DELETE",
                        f"[DELTA_SOURCE_IGNORE_DELETE] Detected deleted data (for example {removes[0].path}) from streaming "
                        f"source at version {v}. This is currently not supported. If you'd like to ignore deletes, set the "
                        "option 'ignoreDeletes' to 'true' (ignore_deletes=True). The source table can be found at path "
                        f"{d.table_uri or self.table_id}.",
                        version=v, table=d.table_uri or self.table_id,
                    )
                    return
                event = self._event(d, ts, ci, (), removes)
            elif not removes and adds:
                event = self._event(d, ts, ci, adds, ())
            # else: no data change (OPTIMIZE, DDL) or a change commit skipped with skip_change_commits
        if md is not None:
            self._metadata = md
        if proto is not None:
            self._protocol = proto
        self._next = v + 1
        if event is not None:
            self._ready.append(event)

    def _metadata_change(self, md: Metadata | None, proto: Protocol | None) -> str | None:
        if self._adopted and ((proto is not None and self._protocol is None) or (md is not None and self._metadata is None)):
            # The table's metadata before its adoption is not on the topic: any change after it may be one.
            return "a metadata or protocol change after the table's adoption (its metadata before it is in _delta_log only)"
        if proto is not None and self._protocol is not None and proto != self._protocol:
            old, new = self._protocol, proto
            return (
                f"a protocol change (reader {old.min_reader_version} -> {new.min_reader_version}, writer "
                f"{old.min_writer_version} -> {new.min_writer_version})"
            )
        if md is None or self._metadata is None:
            return None
        old_md = self._metadata
        if md.id != old_md.id:
            return f"a different Delta table (table id {old_md.id} -> {md.id})"
        if tuple(md.partition_columns) != tuple(old_md.partition_columns):
            return f"a partition change (partition columns {list(old_md.partition_columns)} -> {list(md.partition_columns)})"
        if _schema_key(md) != _schema_key(old_md):
            return f"a schema change (streaming source schema: {_simple_schema(old_md)}, new schema: {_simple_schema(md)})"
        return None

    @staticmethod
    def _event(d: Decision, ts: int, ci: CommitInfo | None, adds: tuple[AddFile, ...], removes: tuple[RemoveFile, ...]) -> CommitEvent:
        assert d.version is not None
        return CommitEvent(
            version=d.version, timestamp=ts, operation=ci.operation if ci else None, added=adds, removed=removes,
            commit_info=dict(ci.values) if ci else {}, actions=d.actions, proposal_id=d.proposal_id,
        )
