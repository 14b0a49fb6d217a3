"""The object-store backend: S3, Azure Blob/ADLS Gen2 and GCS through obstore.

obstore binds object_store, the Rust crate delta-rs itself uses, so a URI and its storage_options mean
the same here as in delta-rs, and it has the conditional create (If-None-Match / generation 0) pyarrow.fs lacks.
One obstore client (and connection pool) per bucket and options is shared by every table in it.

obstore (like delta-rs) runs a tokio runtime that does not survive `fork()`: a child forked after
the parent touched an object store would hang, so it gets a `StorageError` instead.
"""

from __future__ import annotations

import builtins
import datetime
import io
import os
import random
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

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

from deltacoord.storage.backend import Data, ObjectInfo, ObjectNotFoundError, ObjectWriter
from deltacoord.storage.options import StorageConfigError, UnknownStorageOptionError, obstore_options, suggestion
from deltacoord.storage.uri import StorageError, TableUri

if TYPE_CHECKING:
    from obstore.store import ObjectStore

#: S3 answers 409 ConditionalRequestConflict while another conditional write of the key is in flight.
_CONFLICT_RETRIES = 20
#: Parquet objects up to this size are fetched in one GET rather than footer-then-columns ranges.
WHOLE_OBJECT_BYTES = 8 * 1024 * 1024
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


class ObjectStoreBackend:
    """The objects of one table root in a bucket (Azure: container)."""

    local_root: str | None = None

    def __init__(self, uri: TableUri, storage_options: Mapping[str, str] | None) -> None:
        self.uri = uri
        self.location = str(uri)
        self._store = _bucket_store(uri, storage_options)

    def _path(self, key: str) -> str:
        """The object's path inside its bucket."""
        return f"{self.uri.path}/{key}" if self.uri.path else key

    def _key(self, path: str) -> str:
        return path[len(self.uri.path) + 1 :] if self.uri.path else path

    def _obj(self) -> ObjectStore:
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
        try:
            return bytes(obstore.get(self._obj(), self._path(key)).bytes())
        except (NotFoundError, FileNotFoundError) as e:
            raise self._not_found(key, e) from e
        except ObstoreError as e:
            raise self._error("reading", key, e) from e

    def get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            return bytes(obstore.get_range(self._obj(), self._path(key), start=start, length=length))
        except (NotFoundError, FileNotFoundError) as e:
            raise self._not_found(key, e) from e
        except ObstoreError as e:
            raise self._error("reading", key, e) from e

    def open_input(self, key: str) -> RangeReader:
        info = self.head(key)
        return RangeReader(self._obj(), self._path(key), info.size, f"{self.location}/{key}")

    def parquet_source(self, key: str, size: int | None) -> Any:
        """One GET for an object up to `WHOLE_OBJECT_BYTES`, ranged reads for a larger one."""
        import pyarrow as pa

        if size is None:
            size = self.head(key).size
        if size <= WHOLE_OBJECT_BYTES:
            return pa.BufferReader(self.get(key))
        return RangeReader(self._obj(), self._path(key), size, f"{self.location}/{key}")

    def head(self, key: str) -> ObjectInfo:
        try:
            meta = obstore.head(self._obj(), self._path(key))
        except (NotFoundError, FileNotFoundError) as e:
            raise self._not_found(key, e) from e
        except ObstoreError as e:
            raise self._error("reading metadata of", key, e) from e
        return ObjectInfo(key, int(meta["size"]), meta["last_modified"], meta.get("e_tag"), meta.get("version"))

    def list(self, prefix: str, start_after: str | None) -> builtins.list[ObjectInfo]:
        """S3 skips the keys up to `start_after` server-side (StartAfter); other stores filter while listing."""
        list_prefix = self._path(prefix) if prefix else (self.uri.path or None)
        offset = self._path(start_after) if start_after is not None else None
        out: builtins.list[ObjectInfo] = []
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

    def list_keys(self, prefix: str, start_after: str | None) -> builtins.list[tuple[str, datetime.datetime | None]]:
        depth = prefix.count("/") + 1 if prefix else 0
        return [(o.key, o.last_modified) for o in self.list(prefix, start_after) if o.key.count("/") == depth]

    # -- writes -----------------------------------------------------------------------------------
    def put(self, key: str, data: Data) -> None:
        try:
            obstore.put(self._obj(), self._path(key), data, mode="overwrite", use_multipart=False)
        except (ObstoreError, NotFoundError, FileNotFoundError) as e:  # not found on a write: no bucket
            raise self._error("writing", key, e) from e

    def put_if_absent(self, key: str, data: Data) -> bool:
        path = self._path(key)
        for attempt in range(_CONFLICT_RETRIES):
            try:
                obstore.put(self._obj(), path, data, mode="create", use_multipart=False)
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
        """One conditional PUT each, in order, stopping after the first key that is taken."""
        results: builtins.list[bool] = []
        for key, data in items:
            results.append(self.put_if_absent(key, data))
            if not results[-1]:
                break
        return results

    def put_file_if_absent(self, key: str, path: str) -> bool:
        """The file's bytes are sent from a memory map."""
        import pyarrow as pa

        with pa.memory_map(path) as mm:
            return self.put_if_absent(key, memoryview(mm.read_buffer()).cast("B"))

    def temp_for(self, key: str) -> str:
        fd, name = tempfile.mkstemp(prefix="deltacoord-", suffix=".tmp")
        os.close(fd)
        return name

    def delete(self, key: str) -> None:
        try:
            obstore.delete(self._obj(), self._path(key))
        except (NotFoundError, FileNotFoundError):
            return
        except ObstoreError as e:
            raise self._error("deleting", key, e) from e

    def open_output(self, key: str) -> ObjectWriter:
        """Buffered in memory and stored with one PUT when it closes."""
        buffer = io.BytesIO()

        def publish() -> None:
            self.put(key, buffer.getbuffer())

        return ObjectWriter(buffer, publish, lambda: None)  # an aborted buffer is simply dropped
