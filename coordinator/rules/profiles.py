"""Which rules decide a table's commits: its conflict profile (`deltacoord.conflictProfile`).

`delta` (the default) is Delta Lake's ConflictChecker (`conflicts.check`);
`maxcompute` is MaxCompute's job-by-job table (`maxcompute.check`). The
profile in force is the table's current metadata: a proposal that changes it
wins or loses by the table-level checks both profiles share.
"""

from __future__ import annotations

from deltacoord.coordinator.rules import conflicts, maxcompute, pipeline
from deltacoord.coordinator.rules.outcomes import Accepted, Duplicate, Rejected
from deltacoord.coordinator.rules.pipeline import Checker
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
    """`pipeline.decide` with the table's profile (redelivery, validation and the window are the same for every
    profile): never raises for bad input; anything else it raises is a bug, contained by `batch.decide_batch`."""
    return pipeline.decide(state, proposal, now_ms, checker_for(state, proposal))


__all__ = ["checker_for", "decide"]
