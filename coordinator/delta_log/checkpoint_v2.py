"""V2 checkpoints (PROTOCOL.md "V2 Spec"): a UUID-named top-level file and `_delta_log/_sidecars/` files.

A table whose protocol has the `v2Checkpoint` feature and whose `delta.checkpointPolicy` is `v2` gets its
checkpoints in this form, as Delta writes them: the file actions (add and remove) go to sidecar Parquet
files of at most `sidecar_rows` rows each, and the top-level `<v>.checkpoint.<uuid>.parquet` holds a
`checkpointMetadata` action, the other actions (protocol, metaData, txn, domainMetadata) and one `sidecar`
action per sidecar. The input is the classic checkpoint the checkpointer streamed to a local file, read
back in batches, so memory stays bounded by one batch and one sidecar's row group.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltacoord.coordinator.delta_log.files import Put, put_if_absent, temp_file_for
from deltacoord.reader.log import LOG_DIR_NAME
from deltacoord.schemas.action_arrow import CHECKPOINT_SCHEMA, DEFAULT_BATCH_ROWS
from deltacoord.schemas.actions import Metadata, Protocol
from deltacoord.storage.table import StoredObject, TableStorage

FEATURE = "v2Checkpoint"
POLICY = "delta.checkpointPolicy"
SIDECAR_DIR = f"{LOG_DIR_NAME}/_sidecars"
#: Rows (file actions) per sidecar file.
DEFAULT_SIDECAR_ROWS = 1_000_000

_TAGS = pa.map_(pa.string(), pa.string())
# Fields nullable, as every column of a checkpoint: a row holds one action, the other columns are null.
CHECKPOINT_METADATA_TYPE = pa.struct([pa.field("version", pa.int64()), pa.field("tags", _TAGS)])
SIDECAR_TYPE = pa.struct([pa.field("path", pa.string()), pa.field("sizeInBytes", pa.int64()),
                          pa.field("modificationTime", pa.int64()), pa.field("tags", _TAGS)])
#: The top-level file: the classic columns (its add and remove columns stay empty) and the two V2 actions.
TOP_LEVEL_SCHEMA = pa.schema([*CHECKPOINT_SCHEMA, pa.field("checkpointMetadata", CHECKPOINT_METADATA_TYPE),
                              pa.field("sidecar", SIDECAR_TYPE)])
SIDECAR_SCHEMA = pa.schema([CHECKPOINT_SCHEMA.field("add"), CHECKPOINT_SCHEMA.field("remove")])


def wants_v2(protocol: Protocol | None, metadata: Metadata | None) -> bool:
    """The table asks for V2 checkpoints: the feature on both sides of the protocol and `delta.checkpointPolicy=v2`."""
    if protocol is None or metadata is None or protocol.min_writer_version < 7 or protocol.min_reader_version < 3:
        return False
    both = FEATURE in (protocol.writer_features or ()) and FEATURE in (protocol.reader_features or ())
    return both and str(metadata.configuration.get(POLICY, "classic")).lower() == "v2"


def checkpoint_file_name(version: int, ident: str) -> str:
    return f"{version:020d}.checkpoint.{ident}.parquet"


@dataclass(frozen=True)
class V2Checkpoint:
    top_level: StoredObject
    sidecars: tuple[StoredObject, ...]
    rows: int  # every action, the sidecars' included
    size_in_bytes: int  # the top-level file and the sidecars
    adds: int


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    pf = pq.ParquetFile(str(path))
    yield from pf.iter_batches(batch_size=DEFAULT_BATCH_ROWS)


def _file_rows(batch: pa.RecordBatch) -> pa.Array:
    add = batch.column(CHECKPOINT_SCHEMA.get_field_index("add"))
    remove = batch.column(CHECKPOINT_SCHEMA.get_field_index("remove"))
    return pc.or_(pc.is_valid(add), pc.is_valid(remove))


class _Sidecars:
    """Sidecar files of at most `rows_per_file` rows, each put in place once full."""

    def __init__(self, storage: TableStorage, rows_per_file: int) -> None:
        self.storage = storage
        self.rows_per_file = rows_per_file
        self.done: list[tuple[StoredObject, int, int]] = []  # (file, size, modification time)
        self._writer: pq.ParquetWriter | None = None
        self._target: StoredObject | None = None
        self._tmp: Path | None = None
        self._rows = 0

    def add(self, table: pa.Table) -> None:
        while table.num_rows:
            if self._writer is None:
                self._target = StoredObject(self.storage, f"{SIDECAR_DIR}/{uuid.uuid4()}.parquet")
                self._tmp = temp_file_for(self._target)
                self._writer = pq.ParquetWriter(str(self._tmp), SIDECAR_SCHEMA, compression="snappy")
            n = min(table.num_rows, self.rows_per_file - self._rows)
            self._writer.write_table(table.slice(0, n))
            self._rows += n
            table = table.slice(n)
            if self._rows >= self.rows_per_file:
                self.finish()

    def finish(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        assert self._tmp is not None and self._target is not None
        size = self._tmp.stat().st_size
        try:
            if put_if_absent(self._target, self._tmp, fsync=False) is Put.DIFFERENT:
                raise FileExistsError(f"{self._target.key} exists with other content (a UUID collision)")
        finally:
            self._tmp.unlink(missing_ok=True)
        self.done.append((self._target, size, int(time.time() * 1000)))
        self._writer, self._target, self._tmp, self._rows = None, None, None, 0

    def abandon(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
        for obj, _, _ in self.done:
            obj.storage.delete(obj.key)


def write_v2_checkpoint(storage: TableStorage, version: int, classic: Path, *,
                        sidecar_rows: int = DEFAULT_SIDECAR_ROWS) -> V2Checkpoint:
    """Rewrite the classic checkpoint in the local file `classic` as a V2 checkpoint of `version`."""
    if sidecar_rows <= 0:
        raise ValueError("sidecar_rows must be positive")
    sidecars = _Sidecars(storage, sidecar_rows)
    others: list[pa.RecordBatch] = []
    rows = adds = 0
    try:
        for batch in _batches(classic):
            rows += batch.num_rows
            is_file = _file_rows(batch)
            files = batch.filter(is_file)
            if files.num_rows:
                adds += files.num_rows - files.column(CHECKPOINT_SCHEMA.get_field_index("add")).null_count
                sidecars.add(pa.Table.from_batches([files]).select(["add", "remove"]).cast(SIDECAR_SCHEMA))
            rest = batch.filter(pc.invert(is_file))
            if rest.num_rows:
                others.append(rest)
        sidecars.finish()
        top = _top_level(version, others, sidecars.done)
        ident = str(uuid.uuid4())
        target = StoredObject(storage, f"{LOG_DIR_NAME}/{checkpoint_file_name(version, ident)}")
        tmp = temp_file_for(target)
        try:
            pq.write_table(top, str(tmp), compression="snappy")
            top_size = tmp.stat().st_size
            if put_if_absent(target, tmp, fsync=False) is Put.DIFFERENT:
                raise FileExistsError(f"{target.key} exists with other content (a UUID collision)")
        finally:
            tmp.unlink(missing_ok=True)
    except BaseException:
        sidecars.abandon()
        raise
    return V2Checkpoint(target, tuple(o for o, _, _ in sidecars.done), rows + 1 + len(sidecars.done),
                        top_size + sum(s for _, s, _ in sidecars.done), adds)


def _top_level(version: int, others: list[pa.RecordBatch], sidecars: list[tuple[StoredObject, int, int]]) -> pa.Table:
    body = pa.Table.from_batches(others, schema=CHECKPOINT_SCHEMA) if others else CHECKPOINT_SCHEMA.empty_table()
    n = body.num_rows
    body = body.append_column(TOP_LEVEL_SCHEMA.field("checkpointMetadata"), pa.nulls(n, CHECKPOINT_METADATA_TYPE))
    body = body.append_column(TOP_LEVEL_SCHEMA.field("sidecar"), pa.nulls(n, SIDECAR_TYPE))
    meta = pa.table({name: pa.nulls(1, CHECKPOINT_SCHEMA.field(name).type) for name in CHECKPOINT_SCHEMA.names}
                    | {"checkpointMetadata": pa.array([{"version": version, "tags": None}], CHECKPOINT_METADATA_TYPE),
                       "sidecar": pa.nulls(1, SIDECAR_TYPE)}, schema=TOP_LEVEL_SCHEMA)
    side_rows = [{"path": obj.key.rsplit("/", 1)[-1], "sizeInBytes": size, "modificationTime": mtime, "tags": None}
                 for obj, size, mtime in sidecars]
    side = pa.table({name: pa.nulls(len(side_rows), CHECKPOINT_SCHEMA.field(name).type) for name in CHECKPOINT_SCHEMA.names}
                    | {"checkpointMetadata": pa.nulls(len(side_rows), CHECKPOINT_METADATA_TYPE),
                       "sidecar": pa.array(side_rows, SIDECAR_TYPE)}, schema=TOP_LEVEL_SCHEMA)
    return pa.concat_tables([meta, body, side])


__all__ = ["DEFAULT_SIDECAR_ROWS", "FEATURE", "POLICY", "SIDECAR_DIR", "TOP_LEVEL_SCHEMA", "V2Checkpoint",
           "checkpoint_file_name", "wants_v2", "write_v2_checkpoint"]
