"""What deciding a proposal comes to, under every conflict profile: accepted, rejected, or a redelivery.

`Conflict` is how a profile's checks stop at the first winner that fails the
proposal; the pipeline (`deltacoord.coordinator.rules.pipeline`) turns it into a `Rejected`.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltacoord.schemas.actions import Action, CommitInfo
from deltacoord.schemas.errors import DeltaConcurrentModificationException, DeltaCoordError, InvalidProposalError


@dataclass(frozen=True, slots=True)
class Accepted:
    """The proposal commits as `version`; `actions` is the commit, commitInfo first."""

    version: int
    actions: tuple[Action, ...]

    @property
    def commit_info(self) -> CommitInfo:
        ci = self.actions[0]
        assert isinstance(ci, CommitInfo)
        return ci


@dataclass(frozen=True, slots=True)
class Rejected:
    """The proposal does not commit: a Delta conflict or an InvalidProposalError."""

    error: DeltaCoordError
    winning_version: int | None

    @property
    def retryable(self) -> bool:
        return bool(getattr(self.error, "retryable", False))

    @property
    def reason(self) -> str:
        """Delta's exception name for a conflict, the reason code for invalid input."""
        if isinstance(self.error, InvalidProposalError):
            return self.error.reason
        return type(self.error).__name__


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The proposal id already committed at `version` (a redelivery)."""

    version: int


class Conflict(Exception):
    """A winner fails the proposal being checked: Delta's exception and the winner's version."""

    def __init__(self, error: DeltaConcurrentModificationException, version: int | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.version = version


__all__ = ["Accepted", "Conflict", "Duplicate", "Rejected"]
