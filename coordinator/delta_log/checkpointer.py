"""Writing Parquet checkpoints (classic V1, or V2 with sidecars when the table asks) and `_last_checkpoint`.

* `write_checkpoint(table_uri, version, items)` writes `<v>.checkpoint.parquet`
  from an iterable of reconciled actions and/or Arrow record batches in
  checkpoint schema, in bounded row groups (ParquetWriter), to a local
  temporary file that `files.put_if_absent` puts in place (linked on a local
  table, one conditional PUT on an object store): an existing checkpoint is
  never overwritten (if one exists with different content it is kept and ours
  is discarded). Then `_last_checkpoint` is updated unless it
  already points at a newer version.

A table is any location `deltacoord.reader.log` accepts: a path, a URI, or a
`TableStorage` built with the coordinator's storage options.
* `checkpoint_actions(table_uri, version)` builds the checkpoint's contents from
  the previous checkpoint (streamed in batches, filtered with Arrow) plus the
  JSON commits since it, so memory is bounded by the commits since the last
  checkpoint, not by the table.
* `create_checkpoint(table_uri, version)` does both (the daemon's `checkpoint_fn`).

Checkpoint contents per PROTOCOL.md: one protocol, one metaData, live adds,
unexpired remove tombstones (kept until `deletionTimestamp +
delta.deletedFileRetentionDuration`, default one week), txns (dropped after
`delta.setTransactionRetentionDuration` when set), non-removed domainMetadata;
never commitInfo or cdc. Adds and removes are written with dataChange=false.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltacoord.coordinator.delta_log.checkpoint_v2 import DEFAULT_SIDECAR_ROWS, wants_v2, write_v2_checkpoint
from deltacoord.coordinator.delta_log.files import Put, put_if_absent, replace_file, temp_file_for
from deltacoord.coordinator.faults import fault_point
from deltacoord.reader.checkpoint import iter_checkpoint_batches
from deltacoord.reader.log import (
    LAST_CHECKPOINT_KEY,
    LastCheckpoint,
    TableLocation,
    checkpoint_key,
    commit_file_name,
    commit_key,
    list_log,
    list_log_from_hint,
    log_segment,
    read_last_checkpoint,
    segment_from_last_checkpoint,
    stream_commit_actions,
    table_storage,
)
from deltacoord.reader.snapshot import LogReplayState, Snapshot
from deltacoord.schemas.action_arrow import (
    CHECKPOINT_SCHEMA,
    DEFAULT_BATCH_ROWS,
    SMALL_ACTION_COLUMNS,
    actions_to_record_batch,
    checkpoint_schema_json,
    conform_batch,
    file_key_strings,
    key_string,
    small_actions_from_table,
)
from deltacoord.schemas.actions import (
    Action,
    AddFile,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from deltacoord.schemas.properties import TableProperties, parse_interval_ms
from deltacoord.storage.table import StoredObject, TableStorage

DEFAULT_ROW_GROUP_ROWS = 10_000  # bounds peak memory: ~270 MB checkpointing 1M files
#: Python actions are converted to Arrow in small chunks (Arrow rows are far smaller than dicts).
_ACTIONS_PER_CONVERSION = 8_192

CheckpointItem: TypeAlias = Action | pa.RecordBatch

@dataclass(frozen=True, slots=True)
class CheckpointResult:
    version: int
    #: The checkpoint file (its storage and key).
    file: StoredObject
    size: int  # rows (actions) in the checkpoint file
    size_in_bytes: int
    num_of_add_files: int | None  # None when an existing checkpoint was kept
    written: bool  # False: a checkpoint for this version already existed and was kept
    last_checkpoint_updated: bool

    @property
    def path(self) -> Path:
        """The checkpoint's local file (tables on a local filesystem only)."""
        return Path(self.file.storage.local_path(self.file.key))


# --------------------------------------------------------------------------- writing


def _with_data_change_false(col: pa.Array) -> pa.Array:
    idx = col.type.get_field_index("dataChange")
    if idx < 0 or len(col) == 0:
        return col
    children = [col.field(i) for i in range(col.type.num_fields)]
    children[idx] = pa.array([False] * len(col), type=pa.bool_())
    return pa.StructArray.from_arrays(children, fields=list(col.type), mask=col.is_null() if col.null_count else None)


def _normalise_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = conform_batch(batch, CHECKPOINT_SCHEMA)
    cols = list(b.columns)
    for name in ("add", "remove"):
        i = CHECKPOINT_SCHEMA.get_field_index(name)
        if cols[i].null_count < len(cols[i]):
            cols[i] = _with_data_change_false(cols[i])
    return pa.RecordBatch.from_arrays(cols, schema=CHECKPOINT_SCHEMA)


class _BoundedWriter:
    """Buffers rows and writes row groups of `row_group_rows` to a ParquetWriter."""

    def __init__(self, path: Path, row_group_rows: int) -> None:
        self.writer = pq.ParquetWriter(str(path), CHECKPOINT_SCHEMA, compression="snappy")
        self.row_group_rows = row_group_rows
        self.batches: list[pa.RecordBatch] = []
        self.buffered = 0
        self.rows = 0
        self.adds = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.adds += batch.num_rows - batch.column(CHECKPOINT_SCHEMA.get_field_index("add")).null_count
        self.batches.append(batch)
        self.buffered += batch.num_rows
        while self.buffered >= self.row_group_rows:
            self._write(self.row_group_rows)

    def _write(self, n: int) -> None:
        table = pa.Table.from_batches(self.batches, schema=CHECKPOINT_SCHEMA)
        head = table.slice(0, n)
        self.writer.write_table(head, row_group_size=n)
        self.rows += head.num_rows
        rest = table.slice(n)
        self.batches = rest.combine_chunks().to_batches() if rest.num_rows else []
        self.buffered = rest.num_rows

    def close(self) -> None:
        try:
            if self.buffered:
                self._write(self.buffered)
        finally:
            self.writer.close()


def write_checkpoint(
    table_uri: TableLocation,
    version: int,
    items: Iterable[CheckpointItem],
    *,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    update_last_checkpoint: bool = True,
    include_checkpoint_schema: bool = True,
    sidecar_rows: int = DEFAULT_SIDECAR_ROWS,
) -> CheckpointResult:
    """Write `<version>.checkpoint.parquet` from reconciled actions (and/or checkpoint-schema batches), or, on a
    table that asks for V2 checkpoints (`delta.checkpointPolicy=v2`), a UUID-named one with sidecar files of
    at most `sidecar_rows` file actions (`deltacoord.coordinator.delta_log.checkpoint_v2`).

    Items may be schema actions (commitInfo/cdc and removed domainMetadata are
    dropped; adds/removes get dataChange=false) or `pyarrow.RecordBatch`es with
    checkpoint columns (conformed to the classic schema). The stream must hold
    exactly one protocol and one metaData. Memory is bounded by
    `row_group_rows` buffered rows.
    """
    if row_group_rows <= 0:
        raise ValueError("row_group_rows must be positive")
    storage = table_storage(table_uri)
    if not storage.exists(commit_key(version)):
        raise FileNotFoundError(
            f"cannot checkpoint version {version} of {storage.location}: {commit_file_name(version)} does not exist")
    final = StoredObject(storage, checkpoint_key(version))
    tmp = temp_file_for(final)
    writer = _BoundedWriter(tmp, row_group_rows)
    protocols = metadatas = 0
    # The table's protocol and metaData as they stream by: whether it asks for a V2 checkpoint is known
    # without reading the written file again (its two struct columns are a million nulls on a large table).
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    pending: list[Action] = []
    try:
        try:
            for item in items:
                if isinstance(item, pa.RecordBatch):
                    if pending:
                        writer.add(actions_to_record_batch(pending))
                        pending = []
                    b = _normalise_batch(item)
                    p_rows = b.num_rows - b.column(CHECKPOINT_SCHEMA.get_field_index("protocol")).null_count
                    m_rows = b.num_rows - b.column(CHECKPOINT_SCHEMA.get_field_index("metaData")).null_count
                    if p_rows or m_rows:
                        for a in small_actions_from_table(b.select(["protocol", "metaData"])):
                            if isinstance(a, Protocol):
                                protocol = a
                            elif isinstance(a, Metadata):
                                metadata = a
                    protocols += p_rows
                    metadatas += m_rows
                    writer.add(b)
                    continue
                if isinstance(item, Protocol):
                    protocols += 1
                    protocol = item
                elif isinstance(item, Metadata):
                    metadatas += 1
                    metadata = item
                elif isinstance(item, DomainMetadata) and item.removed:
                    continue
                elif not isinstance(item, (AddFile, RemoveFile, SetTransaction, DomainMetadata)):
                    continue  # commitInfo, cdc
                pending.append(item)
                if len(pending) >= _ACTIONS_PER_CONVERSION:
                    writer.add(actions_to_record_batch(pending))
                    pending = []
            if pending:
                writer.add(actions_to_record_batch(pending))
                pending = []
        finally:
            writer.close()
        if protocols != 1 or metadatas != 1:
            raise ValueError(
                f"a checkpoint needs exactly one protocol and one metaData action, got {protocols} and {metadatas}"
            )
        size_in_bytes = tmp.stat().st_size
        fault_point("checkpoint_before_publish")
        if wants_v2(protocol, metadata):
            v2 = write_v2_checkpoint(storage, version, tmp, sidecar_rows=sidecar_rows)
            return _finish(storage, version, v2.top_level, v2.rows, v2.size_in_bytes, v2.adds, True,
                           update_last_checkpoint, include_checkpoint_schema=False)
        # Never replaces a checkpoint: an identical file counts as ours, a different one is kept as it is.
        # Not fsynced (as Delta does not): a checkpoint torn by a host crash is unreadable, and readers
        # then replay the JSON commits instead.
        written = put_if_absent(final, tmp, fsync=False) is not Put.DIFFERENT
    finally:
        tmp.unlink(missing_ok=True)

    if written:
        rows, nbytes, nadds = writer.rows, size_in_bytes, writer.adds
    else:
        rows, nbytes, nadds = final.read_parquet_file().metadata.num_rows, storage.head(final.key).size, None
    return _finish(storage, version, final, rows, nbytes, nadds, written, update_last_checkpoint,
                   include_checkpoint_schema=include_checkpoint_schema)


def _finish(storage: TableStorage, version: int, file: StoredObject, rows: int, nbytes: int, nadds: int | None,
            written: bool, update_last_checkpoint: bool, *, include_checkpoint_schema: bool) -> CheckpointResult:
    updated = False
    if update_last_checkpoint:
        lc = LastCheckpoint(
            version=version,
            size=rows,
            size_in_bytes=nbytes,
            num_of_add_files=nadds,
            checkpoint_schema=checkpoint_schema_json() if (include_checkpoint_schema and written) else None,
        )
        updated = write_last_checkpoint(storage, lc)
    return CheckpointResult(
        version=version,
        file=file,
        size=rows,
        size_in_bytes=nbytes,
        num_of_add_files=nadds,
        written=written,
        last_checkpoint_updated=updated,
    )


def write_last_checkpoint(table_uri: TableLocation, lc: LastCheckpoint) -> bool:
    """Atomically replace `_last_checkpoint` unless it already names a newer version."""
    storage = table_storage(table_uri)
    current = read_last_checkpoint(storage)
    if current is not None and current.version > lc.version:
        return False
    # json.dumps has the C encoder; json.dump does not.
    replace_file(StoredObject(storage, LAST_CHECKPOINT_KEY), json.dumps(lc.to_json(), separators=(",", ":")).encode())
    return True


# --------------------------------------------------------------------------- building the contents


def _now_ms(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def _keep_txn(t: SetTransaction, cutoff: int | None) -> bool:
    return cutoff is None or t.last_updated is None or t.last_updated >= cutoff


def _unexpired(r: RemoveFile, cutoff: int) -> bool:
    return (r.deletion_timestamp or 0) > cutoff


def checkpoint_actions(
    table_uri: TableLocation,
    version: int | None = None,
    *,
    now_ms: int | None = None,
    from_checkpoint: bool = True,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[CheckpointItem]:
    """The contents of a checkpoint for `version` (default latest), streamed.

    Starts from the newest checkpoint <= version (unless `from_checkpoint` is
    False: full JSON replay from version 0), applies the commits after it, and
    yields protocol, metaData, txns and domains as actions, then the previous
    checkpoint's adds/unexpired removes not superseded by later commits as
    Arrow batches of at most `batch_rows` rows, then the commits' live adds and
    unexpired removes.
    """
    storage = table_storage(table_uri)
    hinted = segment_from_last_checkpoint(storage, version) if (from_checkpoint and version is not None) else None
    segment = hinted or log_segment(list_log(storage), version, use_checkpoint=from_checkpoint)
    now = _now_ms(now_ms)
    replay = _CommitReplay([obj for _v, obj in segment.commits])
    state = replay.others

    ckpt_protocol: Protocol | None = None
    ckpt_metadata: Metadata | None = None
    ckpt_txns: dict[str, SetTransaction] = {}
    ckpt_domains: dict[str, DomainMetadata] = {}
    if segment.checkpoint is not None:
        for batch in iter_checkpoint_batches(segment.checkpoint.paths, SMALL_ACTION_COLUMNS, batch_rows, skip_absent=True):
            for a in small_actions_from_table(batch):
                if isinstance(a, Protocol):
                    ckpt_protocol = a
                elif isinstance(a, Metadata):
                    ckpt_metadata = a
                elif isinstance(a, SetTransaction):
                    ckpt_txns[a.app_id] = a
                elif isinstance(a, DomainMetadata):
                    ckpt_domains[a.domain] = a
    protocol = state.protocol or ckpt_protocol
    metadata = state.metadata or ckpt_metadata
    if protocol is None or metadata is None:
        raise ValueError(f"{storage.location}: no protocol/metaData up to version {segment.version}")
    tomb_cutoff = now - TableProperties.of(metadata).tombstone_retention_ms
    txn_ret = TableProperties.of(metadata).txn_retention_ms
    txn_cutoff = None if txn_ret is None else now - txn_ret

    yield protocol
    yield metadata
    txns = {**ckpt_txns, **state.txns}
    for t in txns.values():
        if _keep_txn(t, txn_cutoff):
            yield t
    domains = {**ckpt_domains, **state.domains}
    for d in domains.values():
        if not d.removed:
            yield d

    touched = pa.array(list(replay.files.keys()), type=pa.string())
    if segment.checkpoint is not None:
        for batch in iter_checkpoint_batches(segment.checkpoint.paths, ["add", "remove"], batch_rows):
            add, rem = batch.column(0), batch.column(1)
            keep_add = pc.and_(add.is_valid(), pc.invert(pc.is_in(file_key_strings(add), value_set=touched)))
            keep_rem = pc.and_(
                pc.and_(rem.is_valid(), pc.invert(pc.is_in(file_key_strings(rem), value_set=touched))),
                pc.greater(rem.field("deletionTimestamp"), pa.scalar(tomb_cutoff, pa.int64())),
            )
            mask = pc.fill_null(pc.or_(pc.fill_null(keep_add, False), pc.fill_null(keep_rem, False)), False)
            out = batch.filter(mask)
            if out.num_rows:
                yield out
    for a in replay.newest_file_actions():
        if isinstance(a, AddFile) or (isinstance(a, RemoveFile) and _unexpired(a, tomb_cutoff)):
            yield a


class _CommitReplay:
    """The commits after a checkpoint, replayed without keeping their file actions.

    Per file key it keeps only where the newest action sits (commit, line), and
    reads those lines again when the checkpoint is written: about 150 bytes per
    touched file instead of a Python AddFile (over 1 KB with its dicts), which
    was the largest part of a checkpoint's peak memory. Commit files never
    change once published, so the second read sees the same lines.
    """

    def __init__(self, commits: list[StoredObject]) -> None:
        self.commits = commits
        #: protocol, metaData, txns and domains (its `files` stay empty)
        self.others = LogReplayState()
        #: key string -> commit index << 32 | line number of the key's newest add/remove
        self.files: dict[str, int] = {}
        for i, path in enumerate(commits):
            for lineno, a in stream_commit_actions(path):
                if isinstance(a, AddFile | RemoveFile):
                    self.files[key_string(*a.key())] = i << 32 | lineno
                else:
                    self.others.apply((a,))

    def newest_file_actions(self) -> Iterator[AddFile | RemoveFile]:
        """The newest add or remove of each touched key, one commit file in memory at a time."""
        files = self.files
        for i, path in enumerate(self.commits):
            for lineno, a in stream_commit_actions(path):
                if isinstance(a, AddFile | RemoveFile) and files.get(key_string(*a.key())) == i << 32 | lineno:
                    yield a


def checkpoint_actions_from_snapshot(snapshot: Snapshot, *, now_ms: int | None = None, batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[CheckpointItem]:
    """Checkpoint contents of an already-loaded snapshot (live adds streamed as Arrow slices)."""
    now = _now_ms(now_ms)
    md = snapshot.metadata
    tomb_cutoff = now - TableProperties.of(md).tombstone_retention_ms
    txn_ret = TableProperties.of(md).txn_retention_ms
    txn_cutoff = None if txn_ret is None else now - txn_ret
    yield snapshot.protocol
    yield md
    for t in snapshot.txns.values():
        if _keep_txn(t, txn_cutoff):
            yield t
    yield from snapshot.domain_metadata.values()
    adds = snapshot.add_files_struct()
    for start in range(0, len(adds), batch_rows):
        chunk = adds.slice(start, batch_rows)
        yield pa.RecordBatch.from_arrays([chunk], names=["add"])
    for r in snapshot.tombstones():
        if _unexpired(r, tomb_cutoff):
            yield r


def create_checkpoint(
    table_uri: TableLocation,
    version: int | None = None,
    *,
    now_ms: int | None = None,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
) -> CheckpointResult:
    """Checkpoint `version` (default latest) from the previous checkpoint + commits, then update `_last_checkpoint`."""
    storage = table_storage(table_uri)
    if version is None:
        latest = list_log_from_hint(storage).latest_commit_version
        if latest is None:
            raise FileNotFoundError(f"no commits in {storage.location}")
        version = latest
    items = checkpoint_actions(storage, version, now_ms=now_ms, batch_rows=min(row_group_rows, DEFAULT_BATCH_ROWS))
    return write_checkpoint(storage, version, items, row_group_rows=row_group_rows)


__all__ = [
    "CheckpointResult",
    "checkpoint_actions",
    "checkpoint_actions_from_snapshot",
    "create_checkpoint",
    "parse_interval_ms",
    "write_checkpoint",
    "write_last_checkpoint",
]
