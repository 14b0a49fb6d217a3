"""Every write to `_delta_log`: one put-if-absent, one replace, and the sweep of temp files.

Delta's log is only safe if a version file is never overwritten. `put_if_absent`
creates a file only if its name is free, through the storage edge
(`deltacoord.storage.table.TableStorage`): a conditional write on object stores (S3 and
Azure `If-None-Match: *`, GCS `ifGenerationMatch=0`), a hard link of a temp file
(or `renameat2(RENAME_NOREPLACE)`) on local filesystems. When the name is taken
it compares bytes: the same content is a re-publication (`Put.IDENTICAL`),
other content was written around the coordinator (`Put.DIFFERENT`). Both the
publisher (`<v>.json`) and the checkpointer (`<v>.checkpoint.parquet`) go
through it. `_last_checkpoint`, a hint that may be rewritten, is replaced
atomically (`replace_file`). Reads of `_delta_log` are in `deltacoord.reader.log`.

A local filesystem that offers neither hard links nor RENAME_NOREPLACE cannot
give put-if-absent; `put_if_absent` then raises `HardLinksRefusedError` at once
instead of falling back to something that could overwrite a version.

A target is a `StoredObject` (a table's storage and a key) or, for local tables,
a plain `Path`.
"""

from __future__ import annotations

import contextlib
import filecmp
import os
import re
import uuid
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import TypeAlias

from deltacoord.reader.log import LOG_DIR_NAME, TableLocation, table_storage
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.staged import STAGED_DIR
from deltacoord.storage.local import TMP_PREFIX
from deltacoord.storage.table import AtomicPutUnsupportedError, StoredObject, TableStorage

#: Where `put_if_absent` and `replace_file` write.
Target: TypeAlias = StoredObject | Path

_TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")


class Put(Enum):
    """What `put_if_absent` found."""

    WRITTEN = "written"
    #: The name already held the same bytes (a re-publication after a crash, or by a fenced peer).
    IDENTICAL = "identical"
    #: The name already held other bytes; they were kept.
    DIFFERENT = "different"


class HardLinksRefusedError(DeltaCoordError, OSError):
    """A local `_delta_log`'s filesystem refuses hard links and RENAME_NOREPLACE, so put-if-absent cannot be done there."""


def _resolve(target: Target, fsync: bool) -> StoredObject:
    if isinstance(target, StoredObject):
        return StoredObject(target.storage.with_fsync(fsync), target.key)
    path = Path(os.path.abspath(target))
    return StoredObject(TableStorage(path.parent, fsync=fsync), path.name)


def temp_path(final: Path) -> Path:
    """A fresh temporary name next to a local `final` (`.<name>.<32 hex>.tmp`, which `sweep_temp_files` removes)."""
    return final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"


def temp_file_for(target: Target) -> Path:
    """A fresh local file to stream `target`'s content into before `put_if_absent(target, that_file)`:
    next to it on a local table (so it is linked into place), in the temp directory for an object store."""
    if isinstance(target, Path):
        target.parent.mkdir(parents=True, exist_ok=True)
        return temp_path(target)
    if target.storage.is_local:
        final = Path(target.storage.local_path(target.key))
        final.parent.mkdir(parents=True, exist_ok=True)
        return temp_path(final)
    return Path(target.storage.temp_for(target.key))


def put_if_absent(target: Target, data: bytes | Path, *, fsync: bool = True) -> Put:
    """Make `target` hold `data` unless the name exists; never overwrites.

    `data` is the content, or a local file holding it (a streamed checkpoint; see
    `temp_file_for`), which is consumed. Raises HardLinksRefusedError when a local
    filesystem cannot create a name atomically; other errors (a full disk,
    missing permissions, a store that does not answer) are raised as they are.
    """
    obj = _resolve(target, fsync)
    try:
        try:
            if isinstance(data, Path):
                created = obj.storage.put_file_if_absent(obj.key, data)
            else:
                created = obj.storage.put_if_absent(obj.key, data)
        except AtomicPutUnsupportedError as e:
            code = e.link_errno or 0
            raise HardLinksRefusedError(
                code, f"the filesystem of {obj.storage.location}/{obj.key.rsplit('/', 1)[0]} refuses hard links "
                f"({os.strerror(code)}), so a version file cannot be created without the risk of overwriting one; "
                "put _delta_log on a filesystem with hard links or RENAME_NOREPLACE (local disks, NFS) or on an object store"
            ) from e
        if created:
            return Put.WRITTEN
        return Put.IDENTICAL if _same(obj, data) else Put.DIFFERENT
    finally:
        if isinstance(data, Path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(data)


def put_many_if_absent(storage: TableStorage, items: Sequence[tuple[str, bytes]], *, fsync: bool = True) -> list[Put]:
    """`put_if_absent` of several objects of one directory, in order, flushed together on a local filesystem.

    Stops after the first name that is taken (its `Put` says whether it holds the same bytes), so the
    result may be shorter than `items`; the caller goes on from there.
    """
    st = storage.with_fsync(fsync)
    try:
        created = st.put_many_if_absent(items)
    except AtomicPutUnsupportedError as e:
        code = e.link_errno or 0
        raise HardLinksRefusedError(
            code, f"the filesystem of {st.location} refuses hard links ({os.strerror(code)}), so a version file cannot "
            "be created without the risk of overwriting one; put _delta_log on a filesystem with hard links or "
            "RENAME_NOREPLACE (local disks, NFS) or on an object store") from e
    out = [Put.WRITTEN] * len(created)
    if created and not created[-1]:
        key, data = items[len(created) - 1]
        out[-1] = Put.IDENTICAL if _same(StoredObject(st, key), data) else Put.DIFFERENT
    return out


def _same(obj: StoredObject, data: bytes | Path) -> bool:
    if isinstance(data, Path) and obj.storage.is_local:
        return filecmp.cmp(data, obj.storage.local_path(obj.key), shallow=False)
    expected = data.read_bytes() if isinstance(data, Path) else data
    try:
        return obj.read_bytes() == expected
    except FileNotFoundError:
        return False  # deleted between the refused create and the read: not ours either


def replace_file(target: Target, data: bytes, *, fsync: bool = True) -> None:
    """Atomically make `target` hold `data`, replacing what is there (for `_last_checkpoint`, a hint)."""
    obj = _resolve(target, fsync)
    obj.storage.put(obj.key, data)


def sweep_temp_files(location: TableLocation) -> int:
    """Delete temp files a killed writer of a local `_delta_log` (or of its staged commits, written a piece at a
    time) left behind; returns how many.

    Only names `temp_path` and the storage edge create are touched. A zombie
    publisher whose temp file disappears just retries with a new one. Object
    stores have no temp objects (a PUT is all or nothing): nothing to do.
    """
    storage = table_storage(location)
    if not storage.is_local:
        return 0
    removed = 0
    for d in (storage.local_path(LOG_DIR_NAME), storage.local_path(STAGED_DIR.rstrip("/"))):
        try:
            names = os.listdir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if _TEMP_NAME.match(name) or name.startswith(TMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(d, name))
                    removed += 1
    return removed


__all__ = ["HardLinksRefusedError", "Put", "Target", "put_if_absent", "put_many_if_absent", "replace_file", "sweep_temp_files", "temp_file_for",
           "temp_path"]
