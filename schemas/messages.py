"""The two messages on the wire: a writer's commit proposal and the coordinator's decision.

A proposal carries exactly what Delta's conflict checker needs about a
transaction: what it read (version, partition predicates, files, whole table,
app ids) and what it changes (actions plus commitInfo).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from deltacoord.schemas.actions import Action, AddCDCFile, AddFile, CommitInfo, PartitionValues, RemoveFile


@dataclass(frozen=True, slots=True)
class StagedActions:
    """Actions carried by reference: a file of newline-delimited Delta JSON in the table's store.

    Kafka is made for small messages; a commit of 100,000 files is not one. Its actions are staged as a
    file (`deltacoord.schemas.staged`) and the message carries this: the file's digest, which names the file and is
    checked before its content is used, its action count and its size.
    """

    sha256: str
    count: int
    size: int


#: The commitInfo key recording a version's multi-table transaction: {"id": ..., "tables": [table ids]}.
TRANSACTION_KEY = "deltacoord.transaction"
#: How the rejection of a multi-table transaction's part begins when another part was the one refused.
SIBLING_REJECTED = "rejected with multi-table transaction"


@dataclass(frozen=True, slots=True)
class MultiTable:
    """The multi-table transaction a proposal is part of: its id and its tables (the carrying proposal's first).

    One message carries every part (`parts`, on the carrying proposal only), so the coordinator sees the whole
    transaction at one point of its partition's order: nothing waits for a sibling message.
    """

    id: str
    tables: tuple[str, ...]
    parts: tuple[Proposal, ...] = ()

    def without_parts(self) -> MultiTable:
        return MultiTable(self.id, self.tables)


@dataclass(frozen=True, slots=True)
class FileRead:
    """A data file the transaction scanned, with its partition values."""

    path: str
    partition_values: PartitionValues = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Proposal:
    """A writer's request to commit `actions` on top of `read_version`.

    `read_version` is -1 when the proposal creates the table. `read_predicates`
    are SQL boolean expressions over partition columns. `actions` never holds
    the commitInfo: that travels in `commit_info`, whose `txnId` equals
    `proposal_id`.
    """

    table_id: str
    table_uri: str
    proposal_id: str
    read_version: int
    operation: str
    changes_data: bool
    actions: tuple[Action, ...]
    commit_info: CommitInfo
    read_predicates: tuple[str, ...] = ()
    read_files: tuple[FileRead, ...] = ()
    read_whole_table: bool = False
    read_app_ids: tuple[str, ...] = ()
    writer: str | None = None
    operation_parameters: Mapping[str, str] = field(default_factory=dict)
    #: Set when the actions travel by reference (a large commit). On the wire `actions` is then empty; the
    #: coordinator loads them from the staged file (checking the digest) before deciding.
    staged: StagedActions | None = None
    #: Set when the proposal is one part of a multi-table transaction (`MultiTable`).
    transaction: MultiTable | None = None

    @property
    def parts(self) -> tuple[Proposal, ...]:
        """Every part this message carries, itself first (itself alone for a single-table commit)."""
        if self.transaction is None or not self.transaction.parts:
            return (self,)
        return (self, *self.transaction.parts)

    @property
    def is_blind_append(self) -> bool:
        """Delta's rule: every file action is an add, and nothing was read.

        Non-file actions (txn, metaData) and app-id reads do not count.
        """
        only_adds = all(isinstance(a, AddFile) for a in self.actions if isinstance(a, (AddFile, RemoveFile, AddCDCFile)))
        return only_adds and not (self.read_predicates or self.read_files or self.read_whole_table)


class Outcome(StrEnum):
    COMMITTED = "COMMITTED"
    REJECTED = "REJECTED"


@dataclass(frozen=True, slots=True)
class Decision:
    """The coordinator's ruling on one proposal, recorded on the commits topic.

    A committed decision holds the full commit (commitInfo first) exactly as
    published to `_delta_log/<version>.json`. A rejection names the conflict
    class (Delta's exception name) or an invalid-input reason code.
    """

    table_id: str
    table_uri: str
    proposal_id: str
    outcome: Outcome
    version: int | None = None
    actions: tuple[Action, ...] = ()
    error_type: str | None = None
    error_message: str | None = None
    reason_code: str | None = None
    winning_version: int | None = None
    #: For an already-committed proposal (redelivery), the original version.
    duplicate_of: int | None = None
    decided_at_ms: int = 0
    #: Set for a committed version recorded by reference: on the wire `actions` then holds the commitInfo
    #: alone and the whole commit is in the staged file (`deltacoord.schemas.staged`); resolved, `actions` is complete.
    staged: StagedActions | None = None
    #: Set for a commit coalesced into a version shared with other proposals: the proposal id whose decision
    #: holds the version's whole commit (`actions` is then empty here). See `deltacoord.coordinator.rules.coalesce`.
    coalesced_into: str | None = None

    @property
    def committed(self) -> bool:
        return self.outcome is Outcome.COMMITTED

    @property
    def holds_version(self) -> bool:
        """A commit that records its version's actions: committed, not a redelivery's answer, not coalesced
        into another decision of the same version (one such decision per version)."""
        return (self.outcome is Outcome.COMMITTED and self.duplicate_of is None and self.coalesced_into is None
                and self.version is not None)
