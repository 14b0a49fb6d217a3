"""Every write to `_delta_log`: one put-if-absent, one atomic replace, temp files and their sweep.

Delta's log is only safe if a version file is never overwritten. Here a file
is first written under a temporary name in `_delta_log` and then hard-linked
to its final name, which fails if that name exists: `put_if_absent`. Both the
publisher (`<v>.json`) and the checkpointer (`<v>.checkpoint.parquet`) go
through it. `_last_checkpoint`, a hint that may be rewritten, is replaced
atomically (`replace_file`). Reads of `_delta_log` are in `reader.log`.

A filesystem that refuses hard links cannot give put-if-absent this way;
`put_if_absent` then raises `HardLinksRefusedError` at once instead of
falling back to something that could overwrite a version.
"""

from __future__ import annotations

import contextlib
import errno
import filecmp
import os
import uuid
from enum import Enum
from pathlib import Path

from reader.log import log_dir, table_root
from schemas.errors import DeltaCoordError

#: errno values with which link(2) says the filesystem does not do hard links.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


class Put(Enum):
    """What `put_if_absent` found."""

    WRITTEN = "written"
    #: The name already held the same bytes (a re-publication after a crash, or by a fenced peer).
    IDENTICAL = "identical"
    #: The name already held other bytes; they were kept.
    DIFFERENT = "different"


class HardLinksRefusedError(DeltaCoordError, OSError):
    """The filesystem of a `_delta_log` refuses hard links, so put-if-absent cannot be done there."""


def temp_path(final: Path) -> Path:
    """A fresh temporary name next to `final` (`.<name>.<32 hex>.tmp`, which `sweep_temp_files` removes)."""
    return final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(final: Path, data: bytes, fsync: bool) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def put_if_absent(path: Path, data: bytes | Path, *, fsync: bool = True) -> Put:
    """Make `path` hold `data` unless the name exists; never overwrites.

    `data` is the content, or a temporary file the caller wrote next to `path`
    (a streamed checkpoint; see `temp_path`), which is consumed. Raises
    HardLinksRefusedError when the filesystem does not do hard links; other
    OSErrors (a full disk, missing permissions) are raised as they are.
    """
    tmp = data if isinstance(data, Path) else _write_temp(path, data, fsync)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            same = filecmp.cmp(tmp, path, shallow=False) if isinstance(data, Path) else path.read_bytes() == data
            return Put.IDENTICAL if same else Put.DIFFERENT
        except OSError as e:
            if e.errno in _NO_HARD_LINKS:
                raise HardLinksRefusedError(
                    e.errno, f"the filesystem of {path.parent} refuses hard links ({os.strerror(e.errno or 0)}), so a "
                    "version file cannot be created without the risk of overwriting one; put _delta_log on a "
                    "filesystem with hard links (local disks, NFS)"
                ) from e
            raise
        if fsync:
            _fsync_dir(path.parent)
        return Put.WRITTEN
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def replace_file(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Atomically make `path` hold `data`, replacing what is there (for `_last_checkpoint`, a hint)."""
    tmp = _write_temp(path, data, fsync)
    try:
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def sweep_temp_files(table_uri: str) -> int:
    """Delete temp files a killed writer of `_delta_log` left behind; returns how many.

    Only names `temp_path` creates (`.<name>.<32 hex>.tmp`) are touched. A
    zombie publisher whose temp file disappears just retries with a new one.
    """
    d = log_dir(table_root(table_uri))
    removed = 0
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(".") and name.endswith(".tmp") and len(name.rsplit(".", 2)[-2]) == 32:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(d / name)
                removed += 1
    return removed


__all__ = ["HardLinksRefusedError", "Put", "put_if_absent", "replace_file", "sweep_temp_files", "temp_path"]
