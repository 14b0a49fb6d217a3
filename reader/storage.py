"""The storage edge: one `TableStorage` per table root, on a local filesystem, S3, Azure Blob/ADLS Gen2 or GCS.

obstore binds object_store, the Rust crate delta-rs itself uses, so a URI and its storage_options mean
the same here as in delta-rs, and it has the conditional create (If-None-Match / generation 0) pyarrow.fs lacks.

obstore (like delta-rs) runs a tokio runtime that does not survive `fork()`: a child forked after
the parent touched an object store would hang, so it gets a `StorageError` instead. Worker
processes that use object stores must be started with `spawn` or `forkserver`.

Keys are '/'-separated and relative to the table root (`_delta_log/00000000000000000000.json`), plain
text (not URI-encoded). Local tables use plain files (`reader.storage_local`); object stores share one
obstore client per bucket and options, so a `TableStorage` is cheap to create, and every method is
safe to call from many threads.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import io
import os
import random
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    NotFoundError,
    NotSupportedError,
    PreconditionError,
    UnknownConfigurationKeyError,
)
from obstore.exceptions import BaseError as ObstoreError
from obstore.store import AzureStore, GCSStore, S3Store

from reader.storage_local import AtomicPutUnsupportedError, LocalBackend, ObjectNotFoundError
from reader.storage_options import StorageConfigError, UnknownStorageOptionError, obstore_options, suggestion
from reader.storage_uri import (
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
    import pyarrow as pa
    import pyarrow.parquet as pq
    from obstore.store import ObjectStore

# pyarrow is imported where Parquet is read or written, not with this module: the coordinator's
# deciding process publishes through this edge and must not carry Arrow (its memory budget).

__all__ = [
    "WHOLE_OBJECT_BYTES",
    "AtomicPutUnsupportedError",
    "BucketNotFoundError",
    "ObjectInfo",
    "ObjectNotFoundError",
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

#: S3 answers 409 ConditionalRequestConflict while another conditional write of the key is in flight.
_CONFLICT_RETRIES = 20
#: Parquet objects up to this size are fetched in one GET rather than footer-then-columns ranges.
WHOLE_OBJECT_BYTES = 8 * 1024 * 1024
#: Arrow tables up to this size are encoded as Parquet in memory and stored with one put.
BUFFERED_PARQUET_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: datetime.datetime
    e_tag: str | None = None
    version: str | None = None


_stores: dict[tuple[object, ...], ObjectStore] = {}
_stores_lock = threading.Lock()
#: Environment variables each cloud's credential chain reads; part of a shared client's identity.
_ENV_PREFIXES = {"s3": ("AWS_",), "az": ("AZURE_", "AZURITE_"), "gs": ("GOOGLE_",)}


_used_in_pid: int | None = None


def _guard_fork() -> None:
    """Refuse obstore in a child forked after the parent used it (it would deadlock)."""
    global _used_in_pid
    pid = os.getpid()
    if _used_in_pid is None:
        _used_in_pid = pid
    elif _used_in_pid != pid:
        raise StorageError(
            "object storage cannot be used in a process forked after its parent used it (obstore's runtime does "
            "not survive fork); start worker processes with multiprocessing's 'spawn' or 'forkserver' method"
        )


def _bucket_store(uri: TableUri, storage_options: Mapping[str, str] | None) -> ObjectStore:
    """One obstore client (and connection pool) per bucket and options, shared by its tables."""
    _guard_fork()
    opts = obstore_options(uri, storage_options)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES[uri.kind])))
    key = (uri.kind, uri.bucket, uri.account, env, *opts.cache_key())
    with _stores_lock:
        store = _stores.get(key)
        if store is not None:
            return store
        kwargs: dict[str, Any] = {"config": opts.config, "client_options": opts.client_options}
        if opts.retry_config:
            kwargs["retry_config"] = opts.retry_config
        try:
            if uri.kind == "s3":
                store = S3Store(uri.bucket, **kwargs)
            elif uri.kind == "az":
                store = AzureStore(uri.bucket, **kwargs)
            else:
                store = GCSStore(uri.bucket, **kwargs)
        except UnknownConfigurationKeyError as e:
            raise UnknownStorageOptionError(f"unknown storage option for {uri}: {_first_line(e).rstrip('.')}"
                                            + _did_you_mean(uri, opts.config)) from e
        except (ObstoreError, TypeError, ValueError) as e:
            raise StorageConfigError(f"storage_options cannot configure {uri}: {_first_line(e)}") from e
        _stores[key] = store
        return store


#: How each store says that the bucket or container is missing (S3, Azure, GCS).
_NO_BUCKET = ("NoSuchBucket", "ContainerNotFound", "The specified bucket does not exist", "bucket does not exist")


class BucketNotFoundError(ObjectNotFoundError):
    """The table's bucket (Azure: container) does not exist: nothing under it can be read or written."""


def _did_you_mean(uri: TableUri, config: Mapping[str, str]) -> str:
    """'; did you mean AWS_REGION?' for the given key closest to a known one, else ''."""
    own = {"s3": "aws_", "az": "azure_", "gs": "google_"}[uri.kind]
    for key in config:
        meant = suggestion(uri.kind, key if key.startswith(own) else own + key)
        if meant is not None and meant.lower() != (key if key.startswith(own) else own + key):
            return f"; did you mean {meant}?"
    return ""


def _as_bytes_view(data: bytes | bytearray | memoryview | pa.Buffer) -> bytes | memoryview:
    """obstore takes bytes or an unsigned-byte buffer; pyarrow buffers and other views are cast."""
    return data if isinstance(data, bytes) else memoryview(data).cast("B")


def _first_line(e: BaseException) -> str:
    return str(e).strip().split("\n", 1)[0]


def _is_s3_conflict(e: BaseException) -> bool:
    text = str(e)
    return "409" in text and "ConditionalRequestConflict" in text


class RangeReader(io.RawIOBase):
    """A seekable read-only file over one object that fetches only the byte ranges asked for.

    pyarrow's Parquet reader takes it as a file (footer first, then the column chunks of the row
    groups it reads). `bytes_fetched`/`requests` count what was transferred.
    """

    def __init__(self, store: ObjectStore, path: str, size: int, name: str) -> None:
        super().__init__()
        self._store, self._path, self._size, self.name = store, path, size, name
        self._pos = 0
        self.bytes_fetched = 0
        self.requests = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        pos = base + offset
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def read(self, size: int = -1) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        if end <= self._pos:
            return b""
        _guard_fork()
        data = bytes(obstore.get_range(self._store, self._path, start=self._pos, end=end))
        self.requests += 1
        self.bytes_fetched += len(data)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)


class ObjectWriter(io.RawIOBase):
    """A write-only file whose bytes become one object when it closes without error.

    Nothing is visible before `close()`; leaving a `with` block by an exception (or `abort()`)
    writes nothing. Local files go to a temp file renamed into place; object stores get one PUT.
    """

    def __init__(self, storage: TableStorage, key: str) -> None:
        super().__init__()
        self._storage, self._key = storage, key
        self._pos = 0
        self._aborted = False
        self._local_tmp: str | None = None
        self._fh: BinaryIO | None = None
        self._buffer: io.BytesIO | None = None
        local = storage._local
        if local is not None:
            self._local_tmp = local.temp_for(key)
            self._fh = open(self._local_tmp, "xb")  # noqa: SIM115 - closed in close()/abort()
        else:
            self._buffer = io.BytesIO()

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        view = memoryview(data).cast("B")
        if self._fh is not None:
            self._fh.write(view)
        else:
            assert self._buffer is not None
            self._buffer.write(view)
        self._pos += len(view)
        return len(view)

    def abort(self) -> None:
        """Discard what was written; nothing is stored."""
        if self.closed:
            return
        self._aborted = True
        if self._fh is not None:
            self._fh.close()
            if self._local_tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._local_tmp)
        self._buffer = None
        super().close()

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._fh is not None:
                local = self._storage._local
                assert local is not None and self._local_tmp is not None
                if local.fsync:
                    self._fh.flush()
                    os.fsync(self._fh.fileno())
                self._fh.close()
                local.put_file(self._key, self._local_tmp)
            elif self._buffer is not None:
                self._storage.put(self._key, self._buffer.getbuffer())
                self._buffer = None
        except BaseException:
            self.abort()
            raise
        super().close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


class TableStorage:
    """Read and write the objects of one table root.

    `uri` is any accepted table URI or local path; `storage_options` are delta-rs's keys (see
    `reader.storage_options`). `fsync=False` skips fsyncs on local filesystems.
    """

    def __init__(self, uri: str | os.PathLike[str] | TableUri, storage_options: Mapping[str, str] | None = None,
                 *, fsync: bool = True) -> None:
        self.uri = uri if isinstance(uri, TableUri) else parse_table_uri(uri)
        #: The options the store was built with (kept to reach other locations the same way).
        self.storage_options: dict[str, str] = dict(storage_options or {})
        self.fsync = fsync
        self._local: LocalBackend | None = None
        self._store: ObjectStore | None = None
        if self.uri.kind == "file":
            self._local = LocalBackend(self.uri.path, fsync=fsync)
        else:
            self._store = _bucket_store(self.uri, storage_options)

    def __repr__(self) -> str:
        return f"TableStorage({str(self.uri)!r})"

    @property
    def location(self) -> str:
        """The table root's normalised URI."""
        return str(self.uri)

    @property
    def is_local(self) -> bool:
        return self._local is not None

    def local_path(self, key: str = "") -> str:
        """The local file of `key` ('' = the root); only for tables on a local filesystem."""
        if self._local is None:
            raise StorageUriError(f"{self.location} is not on a local filesystem")
        return self._local.path(check_key(key)) if key else self._local.root

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

    def _path(self, key: str) -> str:
        """The object's path inside its bucket."""
        return f"{self.uri.path}/{key}" if self.uri.path else key

    def _key(self, path: str) -> str:
        return path[len(self.uri.path) + 1 :] if self.uri.path else path

    def _obj(self) -> ObjectStore:
        assert self._store is not None
        _guard_fork()
        return self._store

    def _not_found(self, key: str, e: BaseException) -> ObjectNotFoundError:
        return self._no_bucket(e) or ObjectNotFoundError(f"no object {key!r} under {self.location}: {_first_line(e)}")

    def _error(self, what: str, key: str, e: BaseException) -> StorageError:
        return self._no_bucket(e) or StorageError(f"{what} {key!r} under {self.location} failed: {_first_line(e)}")

    def _no_bucket(self, e: BaseException) -> BucketNotFoundError | None:
        """The error to raise when the store answered that the bucket (container) itself does not exist."""
        if not any(m in str(e) for m in _NO_BUCKET):
            return None
        kind = {"s3": "s3", "az": "azure", "gs": "gcs"}.get(self.uri.kind, self.uri.kind)
        return BucketNotFoundError(f"the bucket {self.uri.bucket!r} of {self.location} does not exist: create it first "
                                   f"(on the local servers: deltacoord storage create-bucket {kind} {self.uri.bucket})")

    # -- reads ------------------------------------------------------------------------------------
    def get(self, key: str) -> bytes:
        """The object's bytes; `ObjectNotFoundError` when there is none."""
        check_key(key)
        if self._local is not None:
            return self._local.get(key)
        try:
            return bytes(obstore.get(self._obj(), self._path(key)).bytes())
        except (NotFoundError, FileNotFoundError) as e:
            raise self._not_found(key, e) from e
        except ObstoreError as e:
            raise self._error("reading", key, e) from e

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes from `start` (fewer at the object's end)."""
        check_key(key)
        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length}")
        if length == 0:
            return b""
        if self._local is not None:
            return self._local.get_range(key, start, length)
        try:
            return bytes(obstore.get_range(self._obj(), self._path(key), start=start, length=length))
        except (NotFoundError, FileNotFoundError) as e:
            raise self._not_found(key, e) from e
        except ObstoreError as e:
            raise self._error("reading", key, e) from e

    def open_input(self, key: str) -> BinaryIO | RangeReader:
        """A seekable file for the object; reads fetch only the ranges they ask for (one HEAD first)."""
        check_key(key)
        if self._local is not None:
            return self._local.open_input(key)
        info = self.head(key)
        return RangeReader(self._obj(), self._path(key), info.size, f"{self.location}/{key}")

    def read_pieces(self, key: str, piece_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The object's bytes a piece at a time (an object store gets ranged GETs of 16 pieces): a large file is
        never held whole. `ObjectNotFoundError` when there is none."""
        size = piece_bytes if self._local is not None else 16 * piece_bytes
        with self.open_input(key) as f:
            while piece := f.read(size):
                yield piece

    def read_parquet_file(self, key: str, *, size: int | None = None, **options: Any) -> pq.ParquetFile:
        """A ParquetFile that reads row groups on demand (`options` as for `pyarrow.parquet.ParquetFile`).

        Local files are opened by path (Arrow's own reader); an object no larger than
        `WHOLE_OBJECT_BYTES` is fetched in one GET, a larger one through ranged reads.
        `size`, when the caller knows it (an `add` action's size), saves a HEAD.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        check_key(key)
        if self._local is not None:
            try:
                return pq.ParquetFile(self._local.path(key), **options)
            except FileNotFoundError as e:
                raise ObjectNotFoundError(f"no object {key!r} under {self.location}") from e
        if size is None:
            size = self.head(key).size
        if size <= WHOLE_OBJECT_BYTES:
            return pq.ParquetFile(pa.BufferReader(self.get(key)), **options)
        return pq.ParquetFile(RangeReader(self._obj(), self._path(key), size, f"{self.location}/{key}"), **options)

    def head(self, key: str) -> ObjectInfo:
        check_key(key)
        if self._local is not None:
            size, mtime = self._local.stat(key)
            return ObjectInfo(key, size, mtime)
        try:
            meta = obstore.head(self._obj(), self._path(key))
        except (NotFoundError, FileNotFoundError) as e:
            raise self._not_found(key, e) from e
        except ObstoreError as e:
            raise self._error("reading metadata of", key, e) from e
        return ObjectInfo(key, int(meta["size"]), meta["last_modified"], meta.get("e_tag"), meta.get("version"))

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
        if self._local is not None:
            return [ObjectInfo(k, size, mtime) for k, size, mtime in self._local.list(prefix, start_after)]
        list_prefix = self._path(prefix) if prefix else (self.uri.path or None)
        offset = self._path(start_after) if start_after is not None else None
        out: list[ObjectInfo] = []
        try:
            for chunk in obstore.list(self._obj(), list_prefix, offset=offset, chunk_size=1000):
                for meta in chunk:
                    key = self._key(meta["path"])
                    if start_after is not None and key <= start_after:
                        continue
                    out.append(ObjectInfo(key, int(meta["size"]), meta["last_modified"], meta.get("e_tag"), meta.get("version")))
        except (ObstoreError, NotFoundError, FileNotFoundError) as e:
            raise self._no_bucket(e) or StorageError(
                f"listing {prefix or '/'} under {self.location} failed: {_first_line(e)}") from e
        out.sort(key=lambda o: o.key)
        return out

    def list_keys(self, prefix: str, *, start_after: str | None = None) -> builtins.list[tuple[str, datetime.datetime | None]]:
        """(key, modification time) of the objects directly below the directory `prefix`, sorted by key.

        Local directories are read without a stat per file (the time is None); object stores
        return the time with the listing. Deeper keys (`prefix/a/b`) are left out.
        """
        prefix = check_prefix(prefix)
        if self._local is not None:
            return [(k, None) for k in self._local.list_names(prefix, start_after)]
        depth = prefix.count("/") + 1 if prefix else 0
        return [(o.key, o.last_modified) for o in self.list(prefix, start_after=start_after) if o.key.count("/") == depth]

    # -- writes -----------------------------------------------------------------------------------
    def put(self, key: str, data: bytes | bytearray | memoryview | pa.Buffer) -> None:
        """Create or replace the object atomically (readers see the old or the new bytes)."""
        check_key(key)
        if self._local is not None:
            self._local.put(key, _as_bytes_view(data))
            return
        try:
            obstore.put(self._obj(), self._path(key), _as_bytes_view(data), mode="overwrite", use_multipart=False)
        except (ObstoreError, NotFoundError, FileNotFoundError) as e:  # not found on a write: no bucket
            raise self._error("writing", key, e) from e

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview | pa.Buffer) -> bool:
        """Create the object only if the key is free: True when this call created it, False when an
        object was already there (the caller compares bytes to tell a re-publication from a conflict)."""
        check_key(key)
        if self._local is not None:
            return self._local.put_if_absent(key, _as_bytes_view(data))
        path, payload = self._path(key), _as_bytes_view(data)
        for attempt in range(_CONFLICT_RETRIES):
            try:
                obstore.put(self._obj(), path, payload, mode="create", use_multipart=False)
                return True
            except (AlreadyExistsError, PreconditionError) as e:
                if self.uri.kind == "s3" and _is_s3_conflict(e):
                    # A concurrent conditional write of this key: S3 says retry.
                    time.sleep(min(1.0, 0.02 * 2**attempt) * random.uniform(0.5, 1.0))
                    continue
                return False
            except NotSupportedError as e:
                raise StorageError(
                    f"{self.location} does not allow conditional writes ({_first_line(e)}); "
                    "remove aws_conditional_put=disabled from storage_options"
                ) from e
            except (ObstoreError, NotFoundError, FileNotFoundError) as e:
                raise self._error("conditionally writing", key, e) from e
        raise StorageError(
            f"conditionally writing {key!r} under {self.location}: the store kept answering 409 "
            f"ConditionalRequestConflict after {_CONFLICT_RETRIES} attempts"
        )

    def put_many_if_absent(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[bool]:
        """`put_if_absent` of several objects, in order, stopping after the first key that is taken (so the
        result may be shorter than `items`). On a local filesystem the objects (of one directory) are
        flushed together; an object store gets one conditional PUT each."""
        for key, _ in items:
            check_key(key)
        if self._local is not None:
            return self._local.put_many_if_absent(items)
        results: builtins.list[bool] = []
        for key, data in items:
            results.append(self.put_if_absent(key, data))
            if not results[-1]:
                break
        return results

    def put_file_if_absent(self, key: str, path: str | os.PathLike[str]) -> bool:
        """`put_if_absent` of a file already written locally (a streamed checkpoint); the file stays.

        On a local table `path` must be in the target's directory (see `temp_for`): it is linked
        into place, never copied. For an object store its bytes are sent from a memory map.
        """
        check_key(key)
        if self._local is not None:
            return self._local.put_file_if_absent(key, os.fspath(path))
        import pyarrow as pa

        with pa.memory_map(os.fspath(path)) as mm:
            return self.put_if_absent(key, mm.read_buffer())

    def temp_for(self, key: str) -> str:
        """A fresh local file name for writing `key` before it is put: next to the target on a local
        table (so it can be linked into place), in the system's temp directory otherwise."""
        check_key(key)
        if self._local is not None:
            return self._local.temp_for(key)
        fd, name = tempfile.mkstemp(prefix="deltacoord-", suffix=".tmp")
        os.close(fd)
        return name

    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error (as on S3)."""
        check_key(key)
        if self._local is not None:
            self._local.delete(key)
            return
        try:
            obstore.delete(self._obj(), self._path(key))
        except (NotFoundError, FileNotFoundError):
            return
        except ObstoreError as e:
            raise self._error("deleting", key, e) from e

    def open_output(self, key: str) -> ObjectWriter:
        """A file to write one object through (use as a context manager); see `ObjectWriter`."""
        check_key(key)
        return ObjectWriter(self, key)

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
