"""Table properties (`metaData.configuration`) this project reads: keys, defaults and types in one place.

Delta stores every property as a string. `TableProperties.of(metadata)` reads
them typed, with the defaults Delta (or this project) applies when a key is
absent; the coordinator, the checkpointer, the reader and the writer all read
them through it, so each property has one meaning everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum

from deltacoord.schemas.actions import Metadata


class Property(StrEnum):
    """The property keys this project reads or writes."""

    ISOLATION_LEVEL = "delta.isolationLevel"
    APPEND_ONLY = "delta.appendOnly"
    CHECKPOINT_INTERVAL = "delta.checkpointInterval"
    ENABLE_IN_COMMIT_TIMESTAMPS = "delta.enableInCommitTimestamps"
    ICT_ENABLEMENT_VERSION = "delta.inCommitTimestampEnablementVersion"
    ICT_ENABLEMENT_TIMESTAMP = "delta.inCommitTimestampEnablementTimestamp"
    COLUMN_MAPPING_MODE = "delta.columnMapping.mode"
    ENABLE_DELETION_VECTORS = "delta.enableDeletionVectors"
    ENABLE_ROW_TRACKING = "delta.enableRowTracking"
    #: Hidden columns that keep a row's id and commit version when the row is copied to a new file.
    MATERIALIZED_ROW_ID = "delta.rowTracking.materializedRowIdColumnName"
    MATERIALIZED_ROW_COMMIT_VERSION = "delta.rowTracking.materializedRowCommitVersionColumnName"
    DELETED_FILE_RETENTION = "delta.deletedFileRetentionDuration"
    SET_TRANSACTION_RETENTION = "delta.setTransactionRetentionDuration"
    #: The writers allowed to propose commits to the table (comma-separated names).
    ALLOWED_WRITERS = "deltacoord.allowedWriters"
    #: Public keys of the writers (`name:base64key, ...`, see `deltacoord.schemas.signing`); when set, every
    #: proposal must be signed by one of them and its writer name is the key's name.
    WRITER_KEYS = "deltacoord.writerKeys"
    #: `true`: the coordinator checks that every added file exists with its declared size before ratifying.
    VERIFY_ADDED_FILES = "deltacoord.verifyAddedFiles"
    #: Which transaction rules decide the table's commits: `delta` (default) or `maxcompute`.
    CONFLICT_PROFILE = "deltacoord.conflictProfile"
    #: `false`: every commit keeps a Delta version of its own, even while the table's store lags (no coalescing).
    COALESCE = "deltacoord.coalesce"


#: Key in a schema field's metadata (not a table property) naming its physical column.
PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"

SERIALIZABLE = "Serializable"
WRITE_SERIALIZABLE = "WriteSerializable"
SNAPSHOT_ISOLATION = "SnapshotIsolation"
#: Levels a table may declare (SnapshotIsolation is only ever a per-commit downgrade).
TABLE_ISOLATION_LEVELS = frozenset({SERIALIZABLE, WRITE_SERIALIZABLE})
DEFAULT_CHECKPOINT_INTERVAL = 10
#: Delta Lake's ConflictChecker (the default profile).
DELTA_PROFILE = "delta"
#: MaxCompute's job-by-job conflict table (`deltacoord.coordinator.rules.maxcompute`).
MAXCOMPUTE_PROFILE = "maxcompute"
CONFLICT_PROFILES = frozenset({DELTA_PROFILE, MAXCOMPUTE_PROFILE})
DEFAULT_TOMBSTONE_RETENTION = "interval 1 week"

_UNIT_MS = {
    "nanosecond": 1e-6,
    "microsecond": 1e-3,
    "millisecond": 1,
    "second": 1_000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}
_INTERVAL_PART = re.compile(r"(-?\d+(?:\.\d+)?)\s*([a-zA-Z]+)")


def parse_interval_ms(text: str) -> int:
    """Milliseconds of a Delta/Spark interval string such as `interval 1 week` or `7 days 12 hours`."""
    s = text.strip().lower()
    if s.startswith("interval"):
        s = s[len("interval") :]
    total = 0.0
    matched = False
    for num, unit in _INTERVAL_PART.findall(s):
        u = unit.rstrip("s") if unit not in ("ms",) else "millisecond"
        u = {"sec": "second", "min": "minute", "msec": "millisecond", "usec": "microsecond"}.get(u, u)
        if u not in _UNIT_MS:
            raise ValueError(f"unknown interval unit {unit!r} in {text!r}")
        total += float(num) * _UNIT_MS[u]
        matched = True
    if not matched:
        raise ValueError(f"not an interval: {text!r}")
    return int(total)


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"


_NONE: Mapping[str, str] = {}


class TableProperties:
    """A table's configuration read with types and defaults (see `Property`).

    A plain class, not a dataclass: the rules build one several times per
    proposal, so construction is kept to one attribute store.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, str] | None = None) -> None:
        self.raw: Mapping[str, str] = _NONE if raw is None else raw

    @classmethod
    def of(cls, metadata: Metadata | None) -> TableProperties:
        """The properties of a table's metadata (an unknown table has none)."""
        return cls(None if metadata is None else metadata.configuration)

    def __repr__(self) -> str:
        return f"TableProperties({dict(self.raw)!r})"

    def get(self, key: Property) -> str | None:
        return self.raw.get(key)

    @property
    def isolation_level(self) -> str:
        """`delta.isolationLevel` as written; WriteSerializable when unset (the documented default).

        Not checked here: validation rejects a level outside `TABLE_ISOLATION_LEVELS`.
        """
        return self.raw.get(Property.ISOLATION_LEVEL, WRITE_SERIALIZABLE)

    @property
    def append_only(self) -> bool:
        return _true(self.raw.get(Property.APPEND_ONLY))

    @property
    def checkpoint_interval(self) -> int:
        """Versions between checkpoints (at least 1); a value that is not a number counts as the default."""
        try:
            return max(1, int(self.raw.get(Property.CHECKPOINT_INTERVAL, str(DEFAULT_CHECKPOINT_INTERVAL))))
        except ValueError:
            return DEFAULT_CHECKPOINT_INTERVAL

    @property
    def in_commit_timestamps(self) -> bool:
        """In-commit timestamps are on: the coordinator writes them and readers order versions by them.

        The one rule for both sides is the table property. (Delta also lists the
        `inCommitTimestamp` writer feature in the protocol; this project's writer
        adds both together.)
        """
        return _true(self.raw.get(Property.ENABLE_IN_COMMIT_TIMESTAMPS))

    @property
    def ict_enablement(self) -> tuple[int, int | None]:
        """(first version, its timestamp) with in-commit timestamps; (0, None) when enabled at creation."""
        v = self.raw.get(Property.ICT_ENABLEMENT_VERSION)
        t = self.raw.get(Property.ICT_ENABLEMENT_TIMESTAMP)
        return (int(v) if v else 0), (int(t) if t else None)

    @property
    def deletion_vectors(self) -> bool:
        """DELETE, UPDATE and MERGE mark removed rows in deletion vectors instead of rewriting files."""
        return _true(self.raw.get(Property.ENABLE_DELETION_VECTORS))

    @property
    def row_tracking(self) -> bool:
        """`delta.enableRowTracking`: readers may rely on row ids (writers assign them whenever the protocol
        supports the feature, enabled or not)."""
        return _true(self.raw.get(Property.ENABLE_ROW_TRACKING))

    @property
    def column_mapping_mode(self) -> str:
        """`none`, `name` or `id` (lower case)."""
        return (self.raw.get(Property.COLUMN_MAPPING_MODE) or "none").lower()

    @property
    def tombstone_retention_ms(self) -> int:
        """How long remove tombstones stay in checkpoints (`delta.deletedFileRetentionDuration`, one week)."""
        return parse_interval_ms(self.raw.get(Property.DELETED_FILE_RETENTION) or DEFAULT_TOMBSTONE_RETENTION)

    @property
    def txn_retention_ms(self) -> int | None:
        """How long app-id versions stay in checkpoints (`delta.setTransactionRetentionDuration`); None: forever."""
        v = self.raw.get(Property.SET_TRANSACTION_RETENTION)
        return None if not v else parse_interval_ms(v)

    @property
    def allowed_writers(self) -> frozenset[str] | None:
        """The writer allow-list (`deltacoord.allowedWriters`), or None when every writer may commit."""
        raw = self.raw.get(Property.ALLOWED_WRITERS)
        if raw is None:
            return None
        return frozenset(w.strip() for w in raw.split(",") if w.strip())

    @property
    def writer_keys(self) -> str | None:
        """`deltacoord.writerKeys` as written (parsed by `deltacoord.schemas.signing.parse_writer_keys`), None when unset or blank."""
        raw = self.raw.get(Property.WRITER_KEYS)
        return raw if raw is not None and raw.strip() else None

    @property
    def verify_added_files(self) -> bool:
        return _true(self.raw.get(Property.VERIFY_ADDED_FILES))

    @property
    def coalesce(self) -> bool:
        """Whether compatible appends may share a version while the table's store lags (`deltacoord.coalesce`,
        default true); see `deltacoord.coordinator.rules.coalesce`."""
        raw = self.raw.get(Property.COALESCE)
        return raw is None or raw.strip().lower() != "false"

    @property
    def conflict_profile(self) -> str:
        """`deltacoord.conflictProfile` in lower case; `delta` when unset.

        Not checked here: validation rejects a profile outside `CONFLICT_PROFILES`.
        """
        return (self.raw.get(Property.CONFLICT_PROFILE) or DELTA_PROFILE).strip().lower()

    @property
    def maxcompute(self) -> bool:
        """The table follows MaxCompute's transaction rules (and records time versions)."""
        return self.conflict_profile == MAXCOMPUTE_PROFILE


__all__ = [
    "CONFLICT_PROFILES",
    "DEFAULT_CHECKPOINT_INTERVAL",
    "DELTA_PROFILE",
    "MAXCOMPUTE_PROFILE",
    "PHYSICAL_NAME_KEY",
    "SERIALIZABLE",
    "SNAPSHOT_ISOLATION",
    "TABLE_ISOLATION_LEVELS",
    "WRITE_SERIALIZABLE",
    "Property",
    "TableProperties",
    "parse_interval_ms",
]
