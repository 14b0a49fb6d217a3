"""Which tables are halted, why and since when: the one record of halts in a coordinator process.

A table halts when deciding or publishing it cannot go on safely (a version written around the coordinator,
a location it may not write, a fault of this code on that table, a failed checkpoint). The publisher, the
partition loops and the checkpoint thread halt tables through this object; admission, publication, `/healthz`
and the metrics read it. A halt is persisted as a halt record on the table's commits partition
(`deltacoord.coordinator.kafka.control`) so that recovery restores it: until a partition loop has recorded it
there, the halt is `unrecorded` (the first cause is the one recorded; a later cause only changes what is shown).
Thread-safe: the publisher's lanes and the checkpoint thread halt tables while the deciding thread reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Halt:
    """One halted table: why, and since when (wall clock, ms)."""

    table_id: str
    table_uri: str
    why: str
    since_ms: int
    #: The table's newest ratified version when the halt is recorded (None: the recording partition fills it in).
    head: int | None = None


class Halts:
    """The halted tables of this process and the halts not yet on the commits topic."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._halted: dict[str, Halt] = {}
        self._unrecorded: dict[str, Halt] = {}

    def halt(self, table_id: str, table_uri: str, why: str, *, recorded: bool = False, head: int | None = None) -> bool:
        """Halt `table_id` (again: `why` replaces the shown cause). `recorded`: the halt is already on the commits
        topic (recovery read it). True when the table was not halted before."""
        now = int(time.time() * 1000)
        with self._lock:
            before = self._halted.get(table_id)
            self._halted[table_id] = Halt(table_id, table_uri, why, before.since_ms if before else now, head)
            if not recorded and table_id not in self._unrecorded:
                self._unrecorded[table_id] = Halt(table_id, table_uri, why, now, head)
        return before is None

    def lift(self, table_id: str) -> None:
        """A resumption was recorded: the table decides and publishes again."""
        with self._lock:
            self._halted.pop(table_id, None)
            self._unrecorded.pop(table_id, None)

    def forget(self, table_ids: Iterable[str]) -> None:
        """Another coordinator (or a rebuild of the partition) decides these tables now: their halts are no longer
        shown here. Halts not yet recorded stay to be recorded."""
        with self._lock:
            for tid in table_ids:
                self._halted.pop(tid, None)

    def reset(self, table_id: str) -> None:
        """The table was dropped: nothing of its halt is kept, nor recorded."""
        with self._lock:
            self._halted.pop(table_id, None)
            self._unrecorded.pop(table_id, None)

    def why(self, table_id: str) -> str | None:
        with self._lock:
            h = self._halted.get(table_id)
            return None if h is None else h.why

    def tables(self) -> dict[str, str]:
        """Table id -> why it is halted (a copy: admission reads it once per batch)."""
        with self._lock:
            return {tid: h.why for tid, h in self._halted.items()}

    def all(self) -> list[Halt]:
        with self._lock:
            return list(self._halted.values())

    def count(self) -> int:
        with self._lock:
            return len(self._halted)

    def unrecorded(self) -> list[Halt]:
        """Halts not yet on the commits topic, oldest first."""
        with self._lock:
            return list(self._unrecorded.values())

    def fix_head(self, table_id: str, head: int) -> Halt | None:
        """The unrecorded halt of `table_id` with the head its record names (set once, by the recording partition)."""
        with self._lock:
            h = self._unrecorded.get(table_id)
            if h is not None and h.head is None:
                h = self._unrecorded[table_id] = replace(h, head=head)
            return h

    def recorded(self, halts: Iterable[Halt]) -> None:
        """These halts' records were committed on the commits topic."""
        with self._lock:
            for h in halts:
                if self._unrecorded.get(h.table_id) == h:
                    del self._unrecorded[h.table_id]

    def drop_unrecorded(self, table_id: str) -> None:
        """Nobody here can record the halt (its partition is not owned) or it must not be (a resumption follows)."""
        with self._lock:
            self._unrecorded.pop(table_id, None)
