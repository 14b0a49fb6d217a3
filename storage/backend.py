"""What a table's storage needs from the place its objects live: one protocol, two backends.

`TableStorage` (`table.py`) checks keys and converts payloads, then hands every call to a `Backend`:
`LocalBackend` (`local.py`: files, atomic put-if-absent by link or `renameat2`) or `ObjectStoreBackend`
(`object_store.py`: S3, Azure, GCS through obstore with conditional puts). Keys reach a backend already
checked; payloads as bytes or unsigned-byte views.
"""

from __future__ import annotations

import builtins
import datetime
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, BinaryIO, Protocol

from deltacoord.storage.uri import StorageError

#: A payload as backends take it.
Data = bytes | memoryview


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """No object under that key."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: datetime.datetime
    e_tag: str | None = None
    version: str | None = None


class ObjectWriter(io.RawIOBase):
    """A write-only file whose bytes become one object when it closes without error.

    Nothing is visible before `close()`; leaving a `with` block by an exception (or `abort()`)
    writes nothing. The backend gives the file to write to, what makes it the object, and what
    discards it: a local temp file renamed into place, or a buffer stored with one PUT.
    """

    def __init__(self, fh: BinaryIO, publish: Callable[[], None], discard: Callable[[], None]) -> None:
        super().__init__()
        self._fh, self._publish, self._discard = fh, publish, discard
        self._pos = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        view = memoryview(data).cast("B")
        self._fh.write(view)
        self._pos += len(view)
        return len(view)

    def abort(self) -> None:
        """Discard what was written; nothing is stored."""
        if self.closed:
            return
        self._discard()
        super().close()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._publish()
        except BaseException:
            self.abort()
            raise
        super().close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


class Backend(Protocol):
    """The operations of one table root's store; see `TableStorage` for what each one promises."""

    @property
    def local_root(self) -> str | None:
        """The root directory on a local filesystem, None for an object store."""
        ...

    def get(self, key: str) -> bytes: ...

    def get_range(self, key: str, start: int, length: int) -> bytes: ...

    def open_input(self, key: str) -> BinaryIO | io.RawIOBase: ...

    def parquet_source(self, key: str, size: int | None) -> Any:
        """What `pyarrow.parquet.ParquetFile` reads the object from: a path, a buffer or a ranged reader."""
        ...

    def head(self, key: str) -> ObjectInfo: ...

    def list(self, prefix: str, start_after: str | None) -> builtins.list[ObjectInfo]: ...

    def list_keys(self, prefix: str, start_after: str | None) -> builtins.list[tuple[str, datetime.datetime | None]]: ...

    def put(self, key: str, data: Data) -> None: ...

    def put_if_absent(self, key: str, data: Data) -> bool: ...

    def put_many_if_absent(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[bool]: ...

    def put_file_if_absent(self, key: str, path: str) -> bool: ...

    def temp_for(self, key: str) -> str: ...

    def delete(self, key: str) -> None: ...

    def open_output(self, key: str) -> ObjectWriter: ...
