"""The rules' pipeline, the same under every conflict profile (Delta's, MaxCompute's).

`decide(state, proposal, now_ms, checker)` = redelivery check + validation +
the winners window + the profile's `checker`. A checker is usually
`run_checks` with the profile's own walk of the winners (`WinnerChecks`):

    table created concurrently? -> CheckedTransaction -> the profile's checks
        -> stale SetTransaction versions -> rebase at head+1

A profile's checks stop at the first winner that fails the proposal by raising
`Conflict` (or `InvalidProposalError` for input they cannot use); both become
a `Rejected` here. Anything else raised is a bug of this code, not bad input:
it propagates out of `decide`, and the batch (`batch.decide_batch`) contains
it to the proposal's table, which it halts so that the other tables go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from deltacoord.coordinator.rules.checked import CheckedTransaction
from deltacoord.coordinator.rules.outcomes import Accepted, Conflict, Duplicate, Rejected
from deltacoord.coordinator.rules.rebase import rebase
from deltacoord.coordinator.rules.state import TableState, WindowExceededError, WinningCommit
from deltacoord.coordinator.rules.validate import check_txn_versions, validate_proposal
from deltacoord.schemas.errors import ConcurrentWriteException, InvalidProposalError, ProtocolChangedException
from deltacoord.schemas.messages import Proposal

#: A conflict check: (state, winners, proposal, now) -> the decision (a profile's `check`).
Checker = Callable[[TableState, Sequence[WinningCommit], Proposal, int], Accepted | Rejected]

#: A profile's walk of the winners (versions read_version+1..head, in order): raises `Conflict` at the first
#: that fails the transaction, else returns the proposal to rebase (itself, or as the profile rewrote it).
WinnerChecks = Callable[[CheckedTransaction, Sequence[WinningCommit], Proposal, str], Proposal]


def run_checks(state: TableState, winners: Sequence[WinningCommit], proposal: Proposal, now_ms: int,
               checks: WinnerChecks) -> Accepted | Rejected:
    """Check `proposal` against `winners` with a profile's `checks` and rebase it.

    Pure: `state` is not modified. Input errors (a predicate that does not
    compile) are returned as Rejected, never raised.
    """
    table = state.table_uri or state.table_id
    if proposal.read_version < 0 and state.version >= 0:
        # Two writers created the table: the loser saw no table, the winner wrote version 0.
        err = ProtocolChangedException(winning_version=0, winning_operation=state.creation_operation, table=table)
        return Rejected(err, 0)
    try:
        cur = CheckedTransaction(state, winners, proposal)
        rebased = checks(cur, winners, proposal, table)
    except Conflict as c:
        return Rejected(c.error, c.version)
    except InvalidProposalError as e:
        return Rejected(e, None)
    stale = check_txn_versions(state, proposal)
    if stale is not None:
        return Rejected(stale, None)
    return Accepted(state.version + 1, rebase(state, rebased, cur, now_ms))


def decide(state: TableState, proposal: Proposal, now_ms: int, checker: Checker) -> Accepted | Rejected | Duplicate:
    """Decide one proposal with a profile's `checker`. Never raises for bad input; does not modify `state`.

    Anything else it raises is a bug of this code, left to propagate: the
    batch (`batch.decide_batch`) contains it to this proposal's table, which
    it halts (the other tables go on), rather than report it as the writer's
    bad input.

    The caller publishes an Accepted commit and then calls
    `state.apply(accepted.version, accepted.actions)`.
    """
    committed = state.committed_version_of(proposal.proposal_id)
    if committed is not None:
        return Duplicate(committed)
    try:
        validate_proposal(state, proposal)
    except InvalidProposalError as e:
        return Rejected(e, None)
    if proposal.read_version < 0:
        winners: Sequence[WinningCommit] = ()
    else:
        try:
            winners = state.winners_since(proposal.read_version)
        except WindowExceededError as e:
            err = ConcurrentWriteException(
                f"ConcurrentWriteException: {e}",
                winning_version=None,
                table=state.table_uri or state.table_id,
            )
            return Rejected(err, None)
    return checker(state, winners, proposal, now_ms)


__all__ = ["Checker", "WinnerChecks", "decide", "run_checks"]
