"""`deltacoord table status`: where a table stands with the coordinators, read from the commits topic (the
source of truth), so it answers whichever coordinator owns the table, or none.

The table's records on its commits partition are folded as recovery folds them (`deltacoord.coordinator.kafka.recovery`):
committed versions move the head; control records halt, resume, adopt, release or drop the table; a drop ends
the table, and versions after it belong to the table created afterwards at that location.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from deltacoord.coordinator.kafka.control import ADOPT, DROP, HALT, RELEASE, RESUME, control_kind
from deltacoord.schemas.messages import Decision

#: What the coordinators do with a table.
COORDINATED, HALTED, RELEASED, DROPPED, UNKNOWN = "coordinated", "halted", "released", "dropped", "unknown"


@dataclass
class TableStatus:
    """A table as its commits-topic records leave it."""

    table_id: str
    state: str = UNKNOWN
    #: The newest ratified version (for a released or dropped table: the version it was released or dropped at).
    version: int | None = None
    location: str | None = None
    #: Why the table is halted (None: it is not).
    halted: str | None = None
    #: How many times the table id was dropped (a table re-created after a drop starts again from version 0).
    drops: int = 0

    def fold(self, d: Decision) -> None:
        """One more record of the table, in commits-topic order."""
        kind = control_kind(d)
        if kind is None:
            if d.holds_version:
                if self.state in (UNKNOWN, DROPPED):
                    self.state, self.halted = COORDINATED, None
                self.version, self.location = d.version, d.table_uri or self.location
            return
        if kind in (ADOPT, RELEASE, DROP) and d.duplicate_of is not None:
            return  # answered again: nothing changed
        if kind == HALT:
            self.state, self.halted = HALTED, d.error_message or "halted"
        elif kind == RESUME and self.state == HALTED:
            self.state, self.halted = COORDINATED, None
        elif kind == ADOPT:
            self.state, self.halted, self.version = COORDINATED, None, d.winning_version
        elif kind == RELEASE:
            self.state, self.halted, self.version = RELEASED, None, d.winning_version
        elif kind == DROP:
            self.state, self.halted, self.version = DROPPED, None, d.winning_version
            self.drops += 1
        self.location = d.table_uri or self.location

    def to_json(self) -> dict[str, Any]:
        return {"tableId": self.table_id, "state": self.state, "version": self.version, "location": self.location,
                "halted": self.halted, "drops": self.drops}


def table_status(table_id: str, records: Iterable[Decision]) -> TableStatus:
    """The status of `table_id` after its records (others are skipped)."""
    status = TableStatus(table_id)
    for d in records:
        if d.table_id == table_id:
            status.fold(d)
    return status


__all__ = ["COORDINATED", "DROPPED", "HALTED", "RELEASED", "UNKNOWN", "TableStatus", "table_status"]
