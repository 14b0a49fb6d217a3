"""Time versions and incremental reads by them, as MaxCompute offers them.

Every Delta version is an *ID version*; only commits that change logical data
make a *time version* (`deltacoord.schemas.jobs`): compaction and clustering rewrite
files without changing a row, so an incremental read by time never returns
their files (it would return every compacted row a second time).

    time_versions(uri)                          -> [TimeVersion(version, timestamp_ms), ...]
    incremental_read(uri, start_version=v)      -> rows added by the time versions after v
    incremental_read(uri, start_timestamp=t)    -> the same, after the time version at t

Timestamps are those `Snapshot.load(timestamp=...)` resolves (in-commit
timestamps when enabled, else the commit files' modification times);
`Snapshot.load(uri, timestamp=t, time_version=True)` is the snapshot of the
time version at t. The change feed (`deltacoord.reader.stream.CommitStream`) skips
commits without a data change, so it delivers time versions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from deltacoord.reader.log import TableLocation, list_log, read_commit, table_storage
from deltacoord.reader.snapshot import Snapshot, TimestampLike
from deltacoord.schemas.actions import AddFile, CommitInfo, RemoveFile
from deltacoord.schemas.jobs import is_time_version


@dataclass(frozen=True, slots=True)
class TimeVersion:
    """A version that made a new time version, and its commit timestamp (ms)."""

    version: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class IncrementalRead:
    """What the time versions in (start, end] added: their versions, data files and rows."""

    start_version: int
    end_version: int
    versions: tuple[int, ...]
    files: tuple[AddFile, ...]
    data: pa.Table


def _commit_ts(ci: CommitInfo | None, mtime_ms: int) -> int:
    if ci is not None and ci.in_commit_timestamp is not None:
        return ci.in_commit_timestamp
    return mtime_ms


def time_versions(location: TableLocation, *, storage_options: Mapping[str, str] | None = None) -> list[TimeVersion]:
    """Every available commit that made a time version, oldest first."""
    storage = table_storage(location, storage_options)
    listing = list_log(storage)
    out: list[TimeVersion] = []
    for v in sorted(listing.commits):
        actions = read_commit(listing.commit(v))
        ci = next((a for a in actions if isinstance(a, CommitInfo)), None)
        if is_time_version(ci, actions):
            out.append(TimeVersion(v, _commit_ts(ci, listing.commit_mtime_ms(v))))
    return out


def incremental_read(location: TableLocation, *, start_version: int | None = None,
                     start_timestamp: TimestampLike | None = None, end_version: int | None = None,
                     storage_options: Mapping[str, str] | None = None) -> IncrementalRead:
    """The rows the time versions after the start (exclusive) up to `end_version` (default latest) added.

    The start is a version, or a timestamp resolved to the time version at it.
    Rows come from the data files those commits added with dataChange=true
    (appends, and the rewritten files of UPDATE/DELETE/MERGE/overwrite), not
    from a file a commit only re-added with a new deletion vector (its rows are
    not new: on a `maxcompute` table it may be a compaction's output); the
    files of compaction and clustering commits are never returned.
    """
    if (start_version is None) == (start_timestamp is None):
        raise ValueError("give start_version or start_timestamp (one of them)")
    storage = table_storage(location, storage_options)
    if start_timestamp is not None:
        start_version = Snapshot.load(storage, timestamp=start_timestamp, time_version=True).version
    assert start_version is not None
    end = Snapshot.load(storage, version=end_version)
    listing = list_log(storage)
    versions: list[int] = []
    files: list[AddFile] = []
    for v in sorted(v for v in listing.commits if start_version < v <= end.version):
        actions = read_commit(listing.commit(v))
        ci = next((a for a in actions if isinstance(a, CommitInfo)), None)
        if not is_time_version(ci, actions):
            continue
        versions.append(v)
        # A file removed and added again in one commit only gained a deletion vector: it holds no new row.
        revectored = {a.path for a in actions if isinstance(a, RemoveFile)}
        files.extend(a for a in actions if isinstance(a, AddFile) and a.data_change and a.path not in revectored)
    return IncrementalRead(start_version, end.version, tuple(versions), tuple(files), end.read_adds(files))


__all__ = ["IncrementalRead", "TimeVersion", "incremental_read", "time_versions"]
