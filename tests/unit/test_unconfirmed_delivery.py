"""A proposal whose delivery fails after it was handed to Kafka has an unknown outcome, never a raw error:
only a refusal (nothing written) says the proposal cannot commit."""

from __future__ import annotations

import pytest

from deltacoord.schemas.actions import CommitInfo
from deltacoord.schemas.errors import CommitOutcomeUnknownError, ConcurrentAppendException, ProposalNotSentError
from deltacoord.schemas.messages import Proposal
from deltacoord.writer.client import DELIVERY_WAIT_S, _unconfirmed
from deltacoord.writer.transaction import retry


@pytest.fixture
def proposal() -> Proposal:
    return Proposal(table_id="file:///lake/t", table_uri="file:///lake/t", proposal_id="p-1", read_version=0,
                    operation="WRITE", changes_data=True, actions=(), commit_info=CommitInfo({"txnId": "p-1"}))


def test_a_delivery_not_confirmed_in_time_is_an_unknown_outcome_with_its_id(proposal: Proposal) -> None:
    e = _unconfirmed(proposal, TimeoutError())
    assert isinstance(e, CommitOutcomeUnknownError) and e.proposal_id == "p-1" and e.table_id == "file:///lake/t"
    text = str(e)
    assert f"did not confirm its delivery within {DELIVERY_WAIT_S:.0f}s" in text
    assert "the outcome is unknown" in text and "proposal_id='p-1'" in text and "deltacoord table lookup" in text


def test_a_failed_delivery_is_an_unknown_outcome_naming_the_failure(proposal: Proposal) -> None:
    e = _unconfirmed(proposal, RuntimeError("the relay at /run/r.sock closed before confirming proposal p-1"))
    assert isinstance(e, CommitOutcomeUnknownError)
    assert "delivery failed after it was sent (the relay at /run/r.sock closed" in str(e)


def test_a_refusal_stays_a_refusal(proposal: Proposal) -> None:
    refused = ProposalNotSentError("proposal p-1 was refused by Kafka: MSG_SIZE_TOO_LARGE")
    assert _unconfirmed(proposal, refused) is refused


def test_retry_never_repeats_a_call_whose_outcome_is_unknown() -> None:
    """A repeat would propose under a new id and could commit twice: retry() raises the unknown outcome at once,
    with the id to look up or retry with, while it does re-run a retryable conflict."""
    calls: list[int] = []

    def unknown() -> None:
        calls.append(1)
        raise CommitOutcomeUnknownError("p-1", "file:///lake/t", 30.0)

    with pytest.raises(CommitOutcomeUnknownError) as raised:
        retry(unknown, attempts=5, base_delay_s=0)
    assert calls == [1] and raised.value.proposal_id == "p-1"

    def conflict_once() -> str:
        calls.append(2)
        if calls.count(2) == 1:
            raise ConcurrentAppendException("a concurrent append", winning_version=3)
        return "committed"

    assert retry(conflict_once, attempts=5, base_delay_s=0) == "committed" and calls.count(2) == 2
