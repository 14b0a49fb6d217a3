"""The live `add` actions a snapshot takes from its checkpoint, held in as little memory as the caller allows.

A snapshot of a 100k-file table keeps its checkpoint's live adds as Arrow chunks
(about a third of a KiB per file) until Python `AddFile`s are asked for; then the
chunks are converted one by one and dropped, so the snapshot never holds both
forms. Arrow asked for after that is rebuilt from the objects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.reader.checkpoint import CheckpointReadError, iter_checkpoint_batches
from deltacoord.schemas.action_arrow import (
    adds_from_struct,
    adds_to_struct,
    file_key_strings,
    key_string,
    string_array,
)
from deltacoord.schemas.actions import AddFile, without_cyclic_gc
from deltacoord.storage.table import StorageError, StoredObject

#: Rows of the checkpoint's `add` column decoded at a time.
ADD_BATCH_ROWS = 16_384


def read_live_adds(paths: Sequence[StoredObject], superseded: Iterable[str]) -> CheckpointAdds:
    """The checkpoint's adds that no later commit touched (`superseded`: their `key_string`s).

    Decoding the whole `add` column at once, then dropping its null rows and the superseded
    files, held three copies of it and the decoder's garbage at the peak. Batch by batch on
    this thread, only the kept rows accumulate and the allocator returns the freed pages
    between batches (Parquet's own threads keep theirs in per-thread heaps).
    """
    ks = list(superseded)
    value_set = string_array(ks) if ks else None
    pool = pa.default_memory_pool()
    chunks: list[pa.Array] = []
    try:
        for batch in iter_checkpoint_batches(paths, ["add"], ADD_BATCH_ROWS, use_threads=False):
            col = batch.column(0)
            keep = col.is_valid()
            if value_set is not None:
                keep = pc.and_(keep, pc.invert(pc.is_in(file_key_strings(col), value_set=value_set)))
            kept = col.filter(keep)
            if len(kept):
                chunks.append(kept)
            del batch, col, keep, kept
            pool.release_unused()
    except (OSError, pa.ArrowException, StorageError) as e:
        raise CheckpointReadError(f"cannot read the adds of checkpoint {paths[0] if paths else '?'}: {e}") from e
    return CheckpointAdds(chunks)


class CheckpointAdds:
    """Live checkpoint adds: Arrow chunks until `adds()` converts them (once) into AddFiles.

    Made `on_demand`, the chunks are read on first use: a blind append needs the table's protocol,
    metadata and version, never its files, and a checkpoint's `add` column is most of its bytes.
    """

    __slots__ = ("_adds", "_chunks", "_lock", "_reader")

    def __init__(self, chunks: Sequence[pa.Array] = (), adds: Sequence[AddFile] | None = None) -> None:
        self._chunks: list[pa.Array] = list(chunks)
        self._adds: tuple[AddFile, ...] | None = None if adds is None else tuple(adds)
        self._reader: Callable[[], CheckpointAdds] | None = None
        self._lock = threading.Lock()

    @classmethod
    def on_demand(cls, read: Callable[[], CheckpointAdds]) -> CheckpointAdds:
        """Adds that `read()` gives when first asked for (its CheckpointReadError then reaches the caller)."""
        out = cls()
        out._reader = read
        return out

    def _loaded(self) -> None:
        """Read the adds if they were left on demand (the caller holds the lock)."""
        if self._reader is not None:
            read = self._reader()
            self._chunks, self._adds, self._reader = read._chunks, read._adds, None

    @property
    def in_memory(self) -> bool:
        """Whether the adds are in memory (False while they are left on demand)."""
        with self._lock:
            return self._reader is None

    def __len__(self) -> int:
        with self._lock:  # not halfway through a conversion
            self._loaded()
            return len(self._adds) if self._adds is not None else sum(len(c) for c in self._chunks)

    def arrow_chunks(self) -> list[pa.Array]:
        """The adds as StructArrays of the checkpoint `add` type (rebuilt when converted already)."""
        with self._lock:
            self._loaded()
            if self._adds is None:
                return list(self._chunks)
            return [adds_to_struct(self._adds)] if self._adds else []

    def adds(self) -> tuple[AddFile, ...]:
        """The adds as AddFiles, converted on first call; the Arrow chunks are dropped as they go."""
        with self._lock:
            self._loaded()
            if self._adds is None:
                out: list[AddFile] = []
                try:
                    with without_cyclic_gc():  # one pause for all chunks: no full collection between them
                        pool = pa.default_memory_pool()
                        while self._chunks:
                            out.extend(adds_from_struct(self._chunks[0]))
                            del self._chunks[0]
                            pool.release_unused()  # the chunk's pages back to the OS, for the objects to come
                except BaseException:
                    if out:  # give back what was converted, as Arrow, so nothing is lost
                        self._chunks.insert(0, adds_to_struct(out))
                    raise
                self._adds = tuple(out)
            return self._adds

    def parts(self) -> list[pa.Array | tuple[AddFile, ...]]:
        """The adds in the form held: the Arrow chunks, or (once converted) one tuple of AddFiles."""
        with self._lock:
            self._loaded()
            if self._adds is None:
                return list(self._chunks)
            return [self._adds] if self._adds else []

    def paths(self) -> list[str]:
        with self._lock:
            self._loaded()
            if self._adds is not None:
                return [a.path for a in self._adds]
            return [p for c in self._chunks for p in c.field("path").to_pylist()]

    def without(self, keys: Iterable[str]) -> CheckpointAdds:
        """These adds less the files with the given `key_string`s (self when none is given)."""
        ks = list(keys)
        if not ks:
            return self
        with self._lock:
            if self._reader is not None:  # still on demand: so are these
                earlier = self._reader
                return CheckpointAdds.on_demand(lambda: earlier().without(ks))
            if self._adds is not None:
                gone = set(ks)
                return CheckpointAdds(adds=[a for a in self._adds if key_string(*a.key()) not in gone])
            value_set = string_array(ks)
            return CheckpointAdds([c.filter(pc.invert(pc.is_in(file_key_strings(c), value_set=value_set))) for c in self._chunks])
