"""Admission: may this proposal be decided on this table at all, whatever it contains?

Checked before validation and the conflict checks, against what this
coordinator knows of the table rather than what the proposal says:

* the table lives where the proposal says (`TABLE_URI_MISMATCH`): the
  coordinator's record of the location is authoritative;
* the writer is on the table's allow-list, when it has one
  (`deltacoord.allowedWriters`, `WRITER_NOT_ALLOWED`). On a table with
  writer keys the name was proved by a signature (`authentication.py`, checked
  first); otherwise it is only declared. Kafka ACLs decide who may propose at
  all, the list narrows it per table;
* the table is not halted (`TABLE_HALTED`): `halted` maps a table id to why
  (publication failed, a version was written around the coordinator, a fault
  of this code on that table). Checked first, also for a table this
  coordinator does not know yet: a creation onto a foreign `_delta_log` is
  refused too.

An unknown table is not refused here: validation reports `UNKNOWN_TABLE` for a
proposal that neither finds the table nor creates it.
"""

from __future__ import annotations

from collections.abc import Mapping

from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.properties import Property, TableProperties
from deltacoord.schemas.reasons import ReasonCode


def allowed_writers(state: TableState) -> frozenset[str] | None:
    """The table's writer allow-list at its head, or None when every writer may commit."""
    return TableProperties.of(state.metadata).allowed_writers


def admission_error(state: TableState | None, proposal: Proposal, halted: Mapping[str, str]) -> InvalidProposalError | None:
    """Why `proposal` may not be decided on `state` (None: the table is unknown here), or None."""
    p = proposal
    why = halted.get(p.table_id)
    if why is not None:
        return InvalidProposalError(ReasonCode.TABLE_HALTED, why)
    if state is None:
        return None
    if state.table_uri != p.table_uri:
        return InvalidProposalError(
            ReasonCode.TABLE_URI_MISMATCH, f"table {p.table_id} lives at {state.table_uri}, not {p.table_uri}"
        )
    allowed = allowed_writers(state)
    if allowed is not None and p.writer not in allowed:
        return InvalidProposalError(
            ReasonCode.WRITER_NOT_ALLOWED,
            f"writer {p.writer!r} is not in the allow-list of table {p.table_id} ({Property.ALLOWED_WRITERS})",
        )
    return None


__all__ = ["admission_error", "allowed_writers"]
