"""Readers: snapshots from _delta_log and the live change feed on the commits topic.

    from deltacoord.reader import Snapshot, CommitStream

The names are loaded on first use, so `import deltacoord.reader.log` (what the
coordinator reads `_delta_log` with) stays free of Arrow and Kafka imports.
The Spark source (`deltacoord.reader.spark_source`) needs the `spark` extra and is
never imported from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deltacoord.reader.snapshot import Snapshot, UnsupportedTableFeatureError, load_snapshot
    from deltacoord.reader.stream import CommitEvent, CommitStream
    from deltacoord.reader.time_versions import IncrementalRead, TimeVersion, incremental_read, time_versions

_PUBLIC = {
    "Snapshot": "deltacoord.reader.snapshot",
    "UnsupportedTableFeatureError": "deltacoord.reader.snapshot",
    "load_snapshot": "deltacoord.reader.snapshot",
    "CommitEvent": "deltacoord.reader.stream",
    "CommitStream": "deltacoord.reader.stream",
    "IncrementalRead": "deltacoord.reader.time_versions",
    "TimeVersion": "deltacoord.reader.time_versions",
    "incremental_read": "deltacoord.reader.time_versions",
    "time_versions": "deltacoord.reader.time_versions",
}

__all__ = ["CommitEvent", "CommitStream", "IncrementalRead", "Snapshot", "TimeVersion", "UnsupportedTableFeatureError",
           "incremental_read", "load_snapshot", "time_versions"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'reader' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
