"""The rebase: what an accepted proposal commits, under every conflict profile.

Rebase never re-runs the query: the accepted commit is the proposal's actions
at head+1 with commitInfo first (readVersion, isolationLevel, isBlindAppend,
txnId, operation, operationParameters, timestamp, and inCommitTimestamp when
in-commit timestamps are enabled), identical SetTransactions de-duplicated,
the ICT enablement version/timestamp moved to the real version, and row ids
assigned on row-tracking tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from deltacoord.coordinator.rules.checked import CheckedTransaction, new_protocol
from deltacoord.coordinator.rules.row_ids import assign_row_ids
from deltacoord.coordinator.rules.row_level import loose_stats
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import Action, AddFile, CommitInfo, Metadata, RemoveFile, SetTransaction
from deltacoord.schemas.deletion_vectors import inline_descriptor
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.properties import Property, TableProperties
from deltacoord.schemas.row_tracking import high_water_mark
from deltacoord.schemas.row_tracking import supported as row_tracking_supported

_CONTROLLED_KEYS = frozenset(
    {
        "timestamp",
        "inCommitTimestamp",
        "operation",
        "operationParameters",
        "readVersion",
        "isolationLevel",
        "isBlindAppend",
        "txnId",
    }
)


def _ict_enabled(metadata: Metadata | None) -> bool:
    return TableProperties.of(metadata).in_commit_timestamps


def _rebased_actions(actions: Sequence[Action], cur: CheckedTransaction) -> tuple[Action, ...]:
    """The proposal's actions with its row-level changes as the checks rebased them (`checked.CheckedTransaction.changes`).

    A compaction's removes of merged files are replaced (or dropped) and its outputs get the vectors of
    the rows concurrent commits deleted (an output with no row left is not added). Otherwise the
    proposal's deletion-vector updates and whole-file removes are replaced by the changes as they now
    stand, which may name other files (the outputs of a concurrent compaction).
    """
    out: list[Action] = []
    if cur.own is not None:
        sizes = cur.own.sizes
        for a in actions:
            if isinstance(a, RemoveFile) and a.path in cur.inputs:
                r = cur.inputs[a.path]
                if r is not None:
                    out.append(r)
                continue
            if isinstance(a, AddFile) and a.path in cur.out_deleted:
                gone = cur.out_deleted[a.path]
                if len(gone) < sizes[a.path]:
                    out.append(replace(a, deletion_vector=inline_descriptor(gone), stats=loose_stats(a.stats)))
                continue
            out.append(a)
        return tuple(out)
    original = cur.original_changes
    for a in actions:
        if isinstance(a, RemoveFile) and a.path in original:
            continue
        if isinstance(a, AddFile) and a.path in original and a.deletion_vector is not None:
            continue
        out.append(a)
    for c in cur.changes.values():
        out.append(c.remove)
        if c.add is not None:
            out.append(c.add)
    return tuple(out)


def rebase(state: TableState, proposal: Proposal, cur: CheckedTransaction, now_ms: int) -> tuple[Action, ...]:
    """The accepted commit: `proposal`'s actions (as its checks rebased them) at head+1, commitInfo first."""
    version = state.version + 1
    new_md = cur.new_metadata
    effective_md = new_md if new_md is not None else state.metadata
    ict: int | None = None
    if _ict_enabled(effective_md):
        previous = state.last_ict if state.last_ict is not None else state.last_commit_timestamp
        ict = now_ms if previous is None else max(now_ms, previous + 1)

    written = proposal.commit_info.values
    params: Any = dict(proposal.operation_parameters)
    if not params and isinstance(written.get("operationParameters"), Mapping):
        params = dict(written["operationParameters"])
    values: dict[str, Any] = {"timestamp": now_ms}
    if ict is not None:
        values["inCommitTimestamp"] = ict
    values["operation"] = proposal.operation
    values["operationParameters"] = params
    for k, val in written.items():
        if k not in _CONTROLLED_KEYS:
            values[k] = val
    if proposal.read_version >= 0:
        values["readVersion"] = proposal.read_version
    values["isolationLevel"] = cur.level
    values["isBlindAppend"] = cur.blind
    values["txnId"] = proposal.proposal_id
    commit_info = CommitInfo(values)

    actions = proposal.actions
    if cur.rewritten:
        actions = _rebased_actions(actions, cur)
    if row_tracking_supported(new_protocol(proposal) or state.protocol):
        actions = assign_row_ids(actions, high_water_mark(state.domains), version)
    needs_fixup = new_md is not None and ict is not None and Property.ICT_ENABLEMENT_VERSION in new_md.configuration
    has_txn = False
    for a in actions:
        if isinstance(a, SetTransaction):
            has_txn = True
            break
    if not needs_fixup and not has_txn:
        return (commit_info, *actions)

    out: list[Action] = [commit_info]
    seen_txn: set[tuple[str, int]] = set()
    for a in actions:
        if isinstance(a, SetTransaction):
            key = (a.app_id, a.version)
            if key in seen_txn:
                continue  # identical duplicates are de-duplicated, as Delta Spark does
            seen_txn.add(key)
        elif needs_fixup and isinstance(a, Metadata) and not _ict_enabled(state.metadata):
            conf = dict(a.configuration)
            conf[Property.ICT_ENABLEMENT_VERSION.value] = str(version)
            conf[Property.ICT_ENABLEMENT_TIMESTAMP.value] = str(ict)
            a = Metadata(
                id=a.id,
                schema_string=a.schema_string,
                partition_columns=a.partition_columns,
                configuration=conf,
                name=a.name,
                description=a.description,
                format_provider=a.format_provider,
                format_options=a.format_options,
                created_time=a.created_time,
            )
        out.append(a)
    return tuple(out)


__all__ = ["rebase"]
