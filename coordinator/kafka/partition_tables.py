"""The tables one proposals partition decides, as its loop, door, controls and state snapshots share them."""

from __future__ import annotations

from dataclasses import dataclass, field

from deltacoord.coordinator.rules.authentication import registers_writer_keys
from deltacoord.coordinator.rules.decided import DecidedIds
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.messages import Decision


@dataclass
class PartitionTables:
    """Each table's state, the released tables, the claims seen, and the decided-ids window (the deciding thread's own;
    recovery replaces them whole)."""

    decided: DecidedIds
    states: dict[str, TableState] = field(default_factory=dict)
    #: Tables released to uncoordinated writers -> (table uri, version released at); their proposals are refused.
    released: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: Tables whose location's claim (`deltacoord.reader.claim`) names them, as this process saw: the claim is checked
    #: once per table and process, so a table created or adopted before claims existed gets one at its next commit.
    claimed: set[str] = field(default_factory=set)

    def signed(self, table_id: str) -> bool:
        """Whether `table_id` registers writer keys (its ids are kept apart in the decided-ids window)."""
        return registers_writer_keys(self.states.get(table_id))

    def remember(self, d: Decision) -> None:
        """Remember `d` as its proposal id's first decision (`deltacoord.coordinator.rules.decided`)."""
        self.decided.remember(d, signed=self.signed(d.table_id))
