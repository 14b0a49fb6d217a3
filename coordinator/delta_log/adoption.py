"""A table's state as its `_delta_log` publishes it: what an adopted table is coordinated from.

Adoption (`deltacoord table adopt`) puts a table written by Spark, delta-rs or
any Delta writer under coordination at its current version N. The coordinator
trusts only what it reads itself, through its own storage edge: the newest
checkpoint at or before N and the commits after it (`deltacoord.reader.snapshot`), folded
into what the rules need (`TableState`): protocol, metadata, app-id versions,
domains, the last commit's timestamps and one 64-bit hash per live file. The
commits topic then records the adoption as a small control record (table, N),
never the state itself, whose size grows with the table; recovery rebuilds
the state by reading the published log at N again (`load_published_state`),
and state snapshots keep it as they keep every table (8 bytes per live file).

Reading a checkpoint takes Arrow, which the deciding process never imports
(`tests/unit/test_imports.py`: it counts against the coordinator's memory). The
daemon therefore loads through its checkpoint worker process
(`CheckpointWorker.load_state`), which returns a `PublishedState`: protocol,
metadata and the hash array, a few bytes per file. Without a worker (a
coordinator run in-process) `load_published_state` runs here.

`adoption_problems` says why a table cannot be coordinated: a writer feature
the coordinator and its writers cannot honour (`deltacoord.schemas.table_features`), or
protocol versions beyond what the rules know.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from deltacoord.coordinator.rules.state import TableState, TableStateExport, key_text_hash
from deltacoord.schemas.actions import DomainMetadata, Metadata, Protocol
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.table_features import MAX_READER_VERSION, writer_problems
from deltacoord.storage.table import TableStorage

#: Live-file keys hashed per slice of the snapshot's Arrow array (bounds the Python strings alive at once).
HASH_CHUNK = 65_536


@dataclass(frozen=True)
class PublishedState:
    """What the rules need of a table at `version`, read from its `_delta_log`."""

    version: int
    protocol: Protocol
    metadata: Metadata
    app_versions: Mapping[str, int]
    domains: tuple[DomainMetadata, ...]
    #: inCommitTimestamp and timestamp of version's commitInfo (None when absent or unreadable).
    last_ict: int | None
    last_commit_timestamp: int | None
    #: Sorted, unique `key_hash` of every live file.
    live_hashes: np.ndarray = field(repr=False)
    #: The checkpoint the state was read from (None: the JSON commits alone).
    checkpoint_version: int | None = None

    @property
    def num_files(self) -> int:
        return int(self.live_hashes.size)

    def table_state(self, table_id: str, table_uri: str) -> TableState:
        """The state the rules decide this table's next commit against (an empty winners window: a proposal
        that read an older version than `version` is too old to check, as after any restore)."""
        return TableState.from_export(TableStateExport(
            table_id=table_id, table_uri=table_uri, version=self.version, protocol=self.protocol, metadata=self.metadata,
            app_versions=dict(self.app_versions), domains=self.domains, last_ict=self.last_ict,
            last_commit_timestamp=self.last_commit_timestamp, creation_operation=None, live_hashes=self.live_hashes,
            txn_ids=()))


#: Loads a table's published state at a version (None: the latest): `load_published_state`, here or in a worker.
StateLoader = Callable[[TableStorage, "int | None"], PublishedState]


class StateLoadError(DeltaCoordError, RuntimeError):
    """The published state could not be loaded. `kind`: `missing` (no Delta table there), `unreadable` (the
    log cannot build the version: corrupt, cleaned up, a feature the reader refuses) or `unavailable` (the
    store or the loading process failed; asking again may work)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def load_published_state(storage: TableStorage, version: int | None = None) -> PublishedState:
    """The table at `version` (default: its latest) as its `_delta_log` publishes it; `StateLoadError` when not."""
    from deltacoord.reader.log import TableNotFoundError
    from deltacoord.storage.table import StorageError

    try:
        return _load(storage, version)
    except TableNotFoundError as e:
        raise StateLoadError("missing", f"no Delta table at {storage.location}: {e}") from e
    except (OSError, StorageError) as e:
        raise StateLoadError("unavailable", f"the store of {storage.location} failed: {type(e).__name__}: {e}") from e
    except (DeltaCoordError, ValueError) as e:
        at = "its latest version" if version is None else f"version {version}"
        raise StateLoadError("unreadable", f"_delta_log of {storage.location} cannot build {at}: {e}") from e


def _load(storage: TableStorage, version: int | None) -> PublishedState:
    from deltacoord.reader.log import CorruptLogError, commit_key, read_commit_info
    from deltacoord.reader.snapshot import Snapshot
    from deltacoord.schemas.action_arrow import file_key_strings  # Arrow: see the module docstring
    from deltacoord.storage.table import StorageError, StoredObject

    snap = Snapshot.load(storage, version=version)
    keys = file_key_strings(snap.add_files_struct())
    hashes = np.empty(len(keys), dtype=np.int64)
    for start in range(0, len(keys), HASH_CHUNK):
        chunk = keys.slice(start, HASH_CHUNK).to_pylist()
        hashes[start:start + len(chunk)] = [key_text_hash(k) for k in chunk]
    try:
        info = read_commit_info(StoredObject(storage, commit_key(snap.version)))
    except (OSError, StorageError, CorruptLogError):
        info = None  # a commit file log cleanup removed: the checkpoint alone describes the version
    cp = snap.segment.checkpoint
    return PublishedState(
        version=snap.version, protocol=snap.protocol, metadata=snap.metadata, app_versions=snap.app_versions,
        domains=tuple(snap.domain_metadata.values()), last_ict=info.in_commit_timestamp if info is not None else None,
        last_commit_timestamp=info.timestamp if info is not None else None, live_hashes=np.unique(hashes),
        checkpoint_version=cp.version if cp is not None else None)


def adoption_problems(protocol: Protocol, metadata: Metadata) -> list[str]:
    """Why a table with this protocol and metadata cannot be coordinated (empty: it can).

    Appends must be possible: a feature the writers cannot honour even for them (`writer_problems` of a
    `WRITE`) would break the table for every other engine. Features that refuse only some operations (the
    change data feed for DELETE, say) do not block adoption: the writers refuse those operations by name.
    """
    out = [f"writer feature {feature}: {why}" for feature, why in writer_problems(protocol, metadata, "WRITE")]
    if protocol.min_reader_version > MAX_READER_VERSION:  # writer versions: `writer_problems`
        out.append(f"reader version {protocol.min_reader_version} is newer than the coordinator knows ({MAX_READER_VERSION})")
    return out


__all__ = ["HASH_CHUNK", "PublishedState", "StateLoadError", "StateLoader", "adoption_problems", "load_published_state"]
