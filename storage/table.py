"""One `TableStorage` per table root, on a local filesystem, S3, Azure Blob/ADLS Gen2 or GCS.

Keys are '/'-separated and relative to the table root (`_delta_log/00000000000000000000.json`), plain
text (not URI-encoded). `TableStorage` checks keys and hands each call to its backend (`backend.py`):
plain files (`local.py`) or an object store through obstore (`object_store.py`), which shares one client
per bucket and options, so a `TableStorage` is cheap to create, and every method is safe to call from
many threads. Object-store backends refuse to run in a child forked after the parent used them.
"""

from __future__ import annotations

import builtins
import datetime
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from deltacoord.storage.backend import Backend, ObjectInfo, ObjectNotFoundError, ObjectWriter
from deltacoord.storage.local import AtomicPutUnsupportedError, LocalBackend
from deltacoord.storage.object_store import WHOLE_OBJECT_BYTES, BucketNotFoundError, ObjectStoreBackend, RangeReader
from deltacoord.storage.options import StorageConfigError
from deltacoord.storage.uri import (
    StorageError,
    StorageUriError,
    TableUri,
    check_key,
    check_prefix,
    normalize_table_uri,
    parse_table_uri,
    uri_within_roots,
)

if TYPE_CHECKING:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

# pyarrow is imported where Parquet is read or written, not with this module: the coordinator's
# deciding process publishes through this edge and must not carry Arrow (its memory budget).

__all__ = [
    "WHOLE_OBJECT_BYTES",
    "AtomicPutUnsupportedError",
    "BucketNotFoundError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectWriter",
    "RangeReader",
    "StorageConfigError",
    "StorageError",
    "StorageUriError",
    "StoredObject",
    "TableStorage",
    "TableUri",
    "normalize_table_uri",
    "parse_table_uri",
    "stored_object",
    "uri_within_roots",
]

#: Arrow tables up to this size are encoded as Parquet in memory and stored with one put.
BUFFERED_PARQUET_BYTES = 8 * 1024 * 1024


def _as_bytes_view(data: bytes | bytearray | memoryview | pa.Buffer) -> bytes | memoryview:
    """obstore takes bytes or an unsigned-byte buffer; pyarrow buffers and other views are cast."""
    return data if isinstance(data, bytes) else memoryview(data).cast("B")


class TableStorage:
    """Read and write the objects of one table root.

    `uri` is any accepted table URI or local path; `storage_options` are delta-rs's keys (see
    `deltacoord.storage.options`). `fsync=False` skips fsyncs on local filesystems.
    """

    def __init__(self, uri: str | os.PathLike[str] | TableUri, storage_options: Mapping[str, str] | None = None,
                 *, fsync: bool = True) -> None:
        self.uri = uri if isinstance(uri, TableUri) else parse_table_uri(uri)
        #: The options the store was built with (kept to reach other locations the same way).
        self.storage_options: dict[str, str] = dict(storage_options or {})
        self.fsync = fsync
        self._backend: Backend = (LocalBackend(self.uri.path, fsync=fsync) if self.uri.kind == "file"
                                  else ObjectStoreBackend(self.uri, storage_options))

    def __repr__(self) -> str:
        return f"TableStorage({str(self.uri)!r})"

    @property
    def location(self) -> str:
        """The table root's normalised URI."""
        return str(self.uri)

    @property
    def is_local(self) -> bool:
        return self._backend.local_root is not None

    def local_path(self, key: str = "") -> str:
        """The local file of `key` ('' = the root); only for tables on a local filesystem."""
        root = self._backend.local_root
        if root is None:
            raise StorageUriError(f"{self.location} is not on a local filesystem")
        return os.path.join(root, *check_key(key).split("/")) if key else root

    def with_fsync(self, fsync: bool) -> TableStorage:
        """The same location with local fsyncs on or off (object stores ignore it)."""
        if fsync == self.fsync:
            return self
        return TableStorage(self.uri, self.storage_options, fsync=fsync)

    def at(self, uri: str | os.PathLike[str] | TableUri) -> TableStorage:
        """Another location reached with this one's options (an absolute data path, a sidecar)."""
        return TableStorage(uri, self.storage_options, fsync=self.fsync)

    def key_of(self, uri: TableUri) -> str | None:
        """The key of an absolute location below this root, or None when it is elsewhere."""
        if not uri.is_under(self.uri) or uri.path == self.uri.path:
            return None
        rest = uri.path[len(self.uri.path):].lstrip("/") if self.uri.path else uri.path
        return rest or None

    # -- reads ------------------------------------------------------------------------------------
    def get(self, key: str) -> bytes:
        """The object's bytes; `ObjectNotFoundError` when there is none."""
        return self._backend.get(check_key(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes from `start` (fewer at the object's end)."""
        check_key(key)
        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length}")
        if length == 0:
            return b""
        return self._backend.get_range(key, start, length)

    def open_input(self, key: str) -> BinaryIO | io.RawIOBase:
        """A seekable file for the object; on an object store reads fetch only the ranges they ask for (one
        HEAD first)."""
        return self._backend.open_input(check_key(key))

    def read_pieces(self, key: str, piece_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The object's bytes a piece at a time (an object store gets ranged GETs of 16 pieces): a large file is
        never held whole. `ObjectNotFoundError` when there is none."""
        size = piece_bytes if self.is_local else 16 * piece_bytes
        with self.open_input(key) as f:
            while piece := f.read(size):
                yield piece

    def read_parquet_file(self, key: str, *, size: int | None = None, **options: Any) -> pq.ParquetFile:
        """A ParquetFile that reads row groups on demand (`options` as for `pyarrow.parquet.ParquetFile`).

        Local files are opened by path (Arrow's own reader); an object no larger than
        `WHOLE_OBJECT_BYTES` is fetched in one GET, a larger one through ranged reads.
        `size`, when the caller knows it (an `add` action's size), saves a HEAD.
        """
        import pyarrow.parquet as pq

        source = self._backend.parquet_source(check_key(key), size)
        try:
            return pq.ParquetFile(source, **options)
        except FileNotFoundError as e:
            raise ObjectNotFoundError(f"no object {key!r} under {self.location}") from e

    def head(self, key: str) -> ObjectInfo:
        return self._backend.head(check_key(key))

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except ObjectNotFoundError:
            return False
        return True

    def list(self, prefix: str = "", *, start_after: str | None = None) -> list[ObjectInfo]:
        """Objects below the directory `prefix` ('' = the whole table), sorted by key.

        With `start_after` only keys after it are returned; S3 skips the rest server-side
        (StartAfter), other stores filter while listing.
        """
        prefix = check_prefix(prefix)
        if start_after is not None:
            check_key(start_after)
        return self._backend.list(prefix, start_after)

    def list_keys(self, prefix: str, *, start_after: str | None = None) -> builtins.list[tuple[str, datetime.datetime | None]]:
        """(key, modification time) of the objects directly below the directory `prefix`, sorted by key.

        Local directories are read without a stat per file (the time is None); object stores
        return the time with the listing. Deeper keys (`prefix/a/b`) are left out.
        """
        prefix = check_prefix(prefix)
        if start_after is not None:
            check_key(start_after)
        return self._backend.list_keys(prefix, start_after)

    # -- writes -----------------------------------------------------------------------------------
    def put(self, key: str, data: bytes | bytearray | memoryview | pa.Buffer) -> None:
        """Create or replace the object atomically (readers see the old or the new bytes)."""
        self._backend.put(check_key(key), _as_bytes_view(data))

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview | pa.Buffer) -> bool:
        """Create the object only if the key is free: True when this call created it, False when an
        object was already there (the caller compares bytes to tell a re-publication from a conflict)."""
        return self._backend.put_if_absent(check_key(key), _as_bytes_view(data))

    def put_many_if_absent(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[bool]:
        """`put_if_absent` of several objects, in order, stopping after the first key that is taken (so the
        result may be shorter than `items`). On a local filesystem the objects (of one directory) are
        flushed together; an object store gets one conditional PUT each."""
        for key, _ in items:
            check_key(key)
        return self._backend.put_many_if_absent(items)

    def put_file_if_absent(self, key: str, path: str | os.PathLike[str]) -> bool:
        """`put_if_absent` of a file already written locally (a streamed checkpoint); the file stays.

        On a local table `path` must be in the target's directory (see `temp_for`): it is linked
        into place, never copied. For an object store its bytes are sent from a memory map.
        """
        return self._backend.put_file_if_absent(check_key(key), os.fspath(path))

    def temp_for(self, key: str) -> str:
        """A fresh local file name for writing `key` before it is put: next to the target on a local
        table (so it can be linked into place), in the system's temp directory otherwise."""
        return self._backend.temp_for(check_key(key))

    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error (as on S3)."""
        self._backend.delete(check_key(key))

    def open_output(self, key: str) -> ObjectWriter:
        """A file to write one object through (use as a context manager); see `ObjectWriter`."""
        return self._backend.open_output(check_key(key))

    def write_parquet(self, key: str, table: pa.Table, **write_options: Any) -> int:
        """Write `table` as one Parquet object (options as for `pyarrow.parquet.write_table`); returns its size.

        A small table is encoded into an Arrow buffer and stored with one `put`: pyarrow then writes
        to C++ memory instead of calling a Python file object once per page. A large one goes through
        `open_output`: on a local filesystem it streams to a temp file, so its encoding never has to
        fit in memory twice."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if table.nbytes <= BUFFERED_PARQUET_BYTES:
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink, **write_options)
            buf = sink.getvalue()
            self.put(key, buf)
            return int(buf.size)
        with self.open_output(key) as out:
            pq.write_table(table, out, **write_options)
            size = out.tell()
        return size


class StoredObject:
    """One object of a table: its `TableStorage` and key (what `_delta_log` listings hold).

    Equal objects are the same key under the same normalised location, whichever
    `TableStorage` instance reached them. `name` is the key's last segment.
    """

    __slots__ = ("key", "storage")

    def __init__(self, storage: TableStorage, key: str) -> None:
        self.storage = storage
        self.key = key

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent_key(self) -> str:
        """The key of the directory holding this object ('' at the root)."""
        return self.key.rsplit("/", 1)[0] if "/" in self.key else ""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredObject):
            return NotImplemented
        return (self.storage.location, self.key) == (other.storage.location, other.key)

    def __hash__(self) -> int:
        return hash((self.storage.location, self.key))

    def __str__(self) -> str:
        return f"{self.storage.location}/{self.key}"

    def __repr__(self) -> str:
        return f"StoredObject({str(self)!r})"

    def read_bytes(self) -> bytes:
        return self.storage.get(self.key)

    def exists(self) -> bool:
        return self.storage.exists(self.key)

    def mtime_ms(self) -> int:
        return int(self.storage.head(self.key).last_modified.timestamp() * 1000)

    def read_parquet_file(self, **options: Any) -> pq.ParquetFile:
        return self.storage.read_parquet_file(self.key, **options)


def stored_object(ref: StoredObject | str | os.PathLike[str]) -> StoredObject:
    """`ref` as a `StoredObject`; a local path becomes the file under its directory."""
    if isinstance(ref, StoredObject):
        return ref
    path = os.path.abspath(os.fspath(ref))
    directory, name = os.path.split(path)
    return StoredObject(TableStorage(directory or "/", fsync=False), name)
