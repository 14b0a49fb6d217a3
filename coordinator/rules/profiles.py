"""Which rules decide a table's commits: its conflict profile (`deltacoord.conflictProfile`).

`delta` (the default) is Delta Lake's ConflictChecker (`conflicts.check`);
`maxcompute` is MaxCompute's job-by-job table (`maxcompute.check`). The
profile in force is the table's current metadata: a proposal that changes it
wins or loses by the table-level checks both profiles share.
"""

from __future__ import annotations

from deltacoord.coordinator.rules import conflicts, maxcompute
from deltacoord.coordinator.rules.conflicts import Accepted, Checker, Duplicate, Rejected
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import Metadata
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.properties import TableProperties


def checker_for(state: TableState, proposal: Proposal) -> Checker:
    """The conflict check of the table's profile (for a table being created: the profile it is created with)."""
    md = state.metadata
    if md is None:
        md = next((a for a in proposal.actions if isinstance(a, Metadata)), None)
    return maxcompute.check if TableProperties.of(md).maxcompute else conflicts.check


def decide(state: TableState, proposal: Proposal, now_ms: int) -> Accepted | Rejected | Duplicate:
    """`conflicts.decide` with the table's profile (redelivery and validation are the same for every profile)."""
    return conflicts.decide(state, proposal, now_ms, checker_for(state, proposal))


__all__ = ["checker_for", "decide"]
