"""VACUUM: delete the data files a table no longer needs, with Delta's rules.

Delta's `VacuumCommand` decides, and so does this:

* the retention defaults to the table's `delta.deletedFileRetentionDuration`
  (one week); a shorter one is refused unless the check is turned off
  (`enforce_retention=False`, Delta's `retentionDurationCheck.enabled=false`),
  because a concurrent writer's staged files or a reader of an older version
  could lose theirs;
* a file is kept when the latest snapshot references it (live `add`s and their
  deletion vectors) or when a tombstone removed it less than the retention ago
  (`deletionTimestamp >= now - retention`): every version within the retention
  may still be read. Nothing a retained version references is deleted;
* a file is deleted only if it is also older than the retention (its
  modification time): files being staged by a writer right now are younger;
* only files under the table root are considered, and never in hidden
  directories (`_delta_log`, names starting with `_` or `.`), except partition
  directories (`_col=value`) and `_change_data`, whose files Delta vacuums too.
  Emptied directories of a local table are removed.

One exception in `_delta_log`: a writer's staged actions of a large commit
(`_delta_log/_staged_commits/w-*.json`, `deltacoord.schemas.staged`) older than the
retention. The coordinator deletes them once it decided; one is left only by a
crash, and a proposal still undecided after the retention is refused without it
(nothing commits). The coordinator's own staged commits (`d-<version>-*.json`)
are vacuumed only at or below the snapshot's version (published: nothing needs
them); a newer one may hold a ratified version a halted table has not published.

Vacuum only deletes data files; it writes nothing to `_delta_log` (the log is the
coordinator's), so it runs with the writers' credentials.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deltacoord.reader.deletion_vectors import dv_object
from deltacoord.reader.log import TableLocation, data_object, table_storage
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import DeletionVector
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.properties import TableProperties
from deltacoord.schemas.staged import STAGED_DIR, WRITER, decided_version, is_staged_key
from deltacoord.storage.table import StoredObject, TableStorage

_HOUR_MS = 3_600_000


class VacuumRetentionError(DeltaCoordError, ValueError):
    """A retention shorter than the table's `delta.deletedFileRetentionDuration`, with the check on."""


@dataclass(frozen=True)
class VacuumResult:
    """What a vacuum deleted (or, with `dry_run`, would delete)."""

    table: str
    version: int
    dry_run: bool
    retention_hours: float
    #: Files older than this (ms since the epoch) that nothing retained references are deleted.
    delete_before_ms: int
    deleted: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    #: Files kept because a retained version references them.
    kept_referenced: int = 0

    def to_json(self) -> dict[str, object]:
        return {"table": self.table, "version": self.version, "dryRun": self.dry_run,
                "retentionHours": self.retention_hours, "deleteBeforeMs": self.delete_before_ms,
                "numDeletedFiles": len(self.deleted), "deletedBytes": self.deleted_bytes,
                "keptReferencedFiles": self.kept_referenced, "deleted": list(self.deleted)}


def is_hidden(name: str, partition_columns: Sequence[str]) -> bool:
    """Delta's rule for a path segment VACUUM does not enter (`DeltaTableUtils.isHiddenDirectory`)."""
    if not name.startswith(("_", ".")):
        return False
    if name.startswith("_change_data"):
        return False
    return not any(name.startswith(f"{c}=") for c in partition_columns)


def _keys_of(storage: TableStorage, path: str, dv: DeletionVector | None) -> list[str]:
    """The keys (under this table's root) of a file action's data file and deletion vector."""
    refs: list[StoredObject] = []
    with contextlib.suppress(ValueError):  # a path this reader cannot name is none of the table's files
        refs.append(data_object(storage, path))
    if dv is not None and dv.storage_type in ("u", "p"):
        with contextlib.suppress(ValueError):
            refs.append(dv_object(storage, dv))
    return [r.key for r in refs if r.storage.location == storage.location]


def vacuum(table: TableLocation, *, retention_hours: float | None = None, dry_run: bool = False,
           enforce_retention: bool = True, storage_options: Mapping[str, str] | None = None,
           now_ms: int | None = None) -> VacuumResult:
    """Delete the files of `table` that no retained version references and that are older than the retention."""
    storage = table_storage(table, storage_options)
    snap = Snapshot.load(storage)
    configured_ms = TableProperties.of(snap.metadata).tombstone_retention_ms
    if retention_hours is not None and retention_hours < 0:
        raise VacuumRetentionError("the retention of a vacuum cannot be negative")
    retention_ms = configured_ms if retention_hours is None else round(retention_hours * _HOUR_MS)
    if enforce_retention and retention_ms < configured_ms:
        hours = -(-configured_ms // _HOUR_MS)
        raise VacuumRetentionError(
            f"a retention of {retention_ms / _HOUR_MS:g} hours is shorter than the table's "
            f"delta.deletedFileRetentionDuration: writers staging files now, or readers of an older version, could "
            f"lose files they need. Use at least {hours} hours, or turn the check off (--no-retention-check) only if "
            "nothing writes to or reads older versions of this table"
        )
    now = int(time.time() * 1000) if now_ms is None else now_ms
    delete_before = now - retention_ms

    valid: set[str] = set()
    for a in snap.files():
        valid.update(_keys_of(storage, a.path, a.deletion_vector))
    for r in snap.tombstones():
        if (r.deletion_timestamp or 0) >= delete_before:
            valid.update(_keys_of(storage, r.path, r.deletion_vector))

    parts = snap.partition_columns
    deleted: list[str] = []
    nbytes = kept = 0
    for info in storage.list():
        segments = info.key.split("/")
        if any(is_hidden(s, parts) for s in segments):
            continue
        if info.key in valid:
            kept += 1
            continue
        if int(info.last_modified.timestamp() * 1000) >= delete_before:
            continue
        deleted.append(info.key)
        nbytes += info.size
    for info in storage.list(STAGED_DIR):
        name = info.key[len(STAGED_DIR):]
        v = decided_version(info.key)
        if not is_staged_key(info.key) or int(info.last_modified.timestamp() * 1000) >= delete_before:
            continue
        if name.startswith(f"{WRITER}-") or (v is not None and v <= snap.version):
            deleted.append(info.key)
            nbytes += info.size
    if not dry_run:
        for key in deleted:
            storage.delete(key)
        if storage.is_local:
            _remove_empty_directories(storage, parts)
    return VacuumResult(storage.location, snap.version, dry_run, retention_ms / _HOUR_MS, delete_before, deleted, nbytes,
                        kept)


def _remove_empty_directories(storage: TableStorage, partition_columns: Sequence[str]) -> None:
    root = storage.local_path()
    for dirpath, _dirnames, _filenames in os.walk(root, topdown=False):
        rel = os.path.relpath(dirpath, root).split(os.sep)
        if dirpath == root or any(is_hidden(s, partition_columns) for s in rel):
            continue
        with contextlib.suppress(OSError):  # not empty (or not any more: a writer staged a file): kept
            os.rmdir(dirpath)


__all__ = ["VacuumResult", "VacuumRetentionError", "is_hidden", "vacuum"]
