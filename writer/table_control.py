"""Adopt, release and drop: control requests the coordinator answers, and the `deltacoord-coordinated`
writer feature commits around them."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping

from deltacoord.reader.claim import CLAIM_KEY, read_claim
from deltacoord.reader.log import TableNotFoundError, newest_commit_version
from deltacoord.schemas.errors import DeltaCoordError, InvalidProposalError
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import (
    ADOPTED_ERROR_TYPE,
    CONTROL_ADOPT,
    CONTROL_DROP,
    CONTROL_PREFIX,
    CONTROL_RELEASE,
    DROP_DELETE_FILES,
    DROPPED_ERROR_TYPE,
    RELEASED_ERROR_TYPE,
)
from deltacoord.schemas.table_features import (
    COORDINATED,
    coordinated,
    with_coordinated,
    without_coordinated,
)
from deltacoord.storage.table import StorageError
from deltacoord.writer.operations import (
    OperationTable,
)
from deltacoord.writer.transaction import CommitResult, Transaction, error_from_decision

log = logging.getLogger(__name__)


def adopt(table: OperationTable, *, timeout_s: float | None = None) -> CommitResult:
    """`Table.adopt` (documented there, where users read it)."""
    check_location_free(table, "adopt")
    adopted = control(table, CONTROL_ADOPT, "ADOPT TABLE", timeout_s)
    set_coordinated(table, True, timeout_s)
    return adopted


def check_location_free(table: OperationTable, doing: str) -> None:
    """Before a create or adopt is sent: refuse at once (TABLE_LOCATION_TAKEN) a location whose claim
    (`deltacoord.reader.claim`) names another table id. The coordinator checks it again when it decides; a claim this
    writer cannot read is left to it."""
    try:
        holder = read_claim(table.storage)
    except (StorageError, OSError):  # the coordinator decides
        return
    if holder is not None and holder.table_id != table.table_id:
        raise InvalidProposalError(ReasonCode.TABLE_LOCATION_TAKEN, (
            f"{table.uri} is the location of table id {holder.table_id!r} ({CLAIM_KEY}), so table id "
            f"{table.table_id!r} may not {doing} it: two table ids over one _delta_log would both ratify the same "
            f"versions. Open the table under its own id: Table(uri, table_id={holder.table_id!r}) (CLI: "
            f"--table-id {holder.table_id!r}). Nothing was sent"))


def release(table: OperationTable, *, timeout_s: float | None = None) -> CommitResult:
    """`Table.release` (documented there, where users read it)."""
    dropped = set_coordinated(table, False, timeout_s)
    try:
        return control(table, CONTROL_RELEASE, "RELEASE TABLE", timeout_s)
    except DeltaCoordError:
        if dropped:
            put_coordinated_back(table, "release", timeout_s)
        raise


def put_coordinated_back(table: OperationTable, what: str, timeout_s: float | None) -> None:
    """After a refused release or drop that had removed the `deltacoord-coordinated` feature: add it again
    (a failure to is logged; the refusal is what the caller raises)."""
    try:
        set_coordinated(table, True, timeout_s)
    except DeltaCoordError as e:
        log.warning("%s: the %s was refused and the %s writer feature could not be put back: %s",
                    table.uri, what, COORDINATED, e)


def drop(table: OperationTable, *, delete_files: bool = False, timeout_s: float | None = None) -> CommitResult:
    """`Table.drop` (documented there, where users read it)."""
    dropped = False
    if not delete_files:
        try:
            dropped = set_coordinated(table, False, timeout_s)
        except TableNotFoundError:
            pass  # no log left: nothing carries the feature
        except InvalidProposalError as e:
            if e.reason not in (ReasonCode.TABLE_HALTED, ReasonCode.UNKNOWN_TABLE, ReasonCode.TABLE_RELEASED):
                raise
            # The coordinator decides the drop of a halted, released or unknown table (and says why not).
    try:
        result = control(table, CONTROL_DROP, "DROP TABLE", timeout_s,
                               parameters={DROP_DELETE_FILES: "true" if delete_files else "false"})
    except DeltaCoordError:
        if dropped:
            put_coordinated_back(table, "drop", timeout_s)
        raise
    table.restart_at(-1)
    return result


def set_coordinated(table: OperationTable, on: bool, timeout_s: float | None) -> bool:
    """Add (`on`) or remove the `deltacoord-coordinated` writer feature in a protocol-only commit through the
    coordinator, at the latest ratified version; False when the protocol is already as asked."""
    snap = table.snapshot(ratified=True)
    if coordinated(snap.protocol) == on:
        return False
    protocol = with_coordinated(snap.protocol) if on else without_coordinated(snap.protocol)
    tx = table.begin_operation(snap.version, None)
    tx.add(protocol)
    if on:
        operation, parameters = "UPGRADE PROTOCOL", {"newProtocol": json.dumps(protocol.to_json()["protocol"])}
    else:
        operation, parameters = "DROP FEATURE", {"featureName": COORDINATED, "truncateHistory": "false"}
    tx.commit(operation, changes_data=False, parameters=parameters, timeout_s=timeout_s)
    return True


def control(table: OperationTable, kind: str, operation: str, timeout_s: float | None,
            parameters: Mapping[str, str] | None = None) -> CommitResult:
    """An adopt, release or drop request (a proposal without actions, `deltacoord.schemas.routing.CONTROL_ADOPT`) and its
    answer."""
    tx = Transaction(table, newest_commit_version(table.storage))
    tx.proposal_id = f"{CONTROL_PREFIX}{kind}:{uuid.uuid4()}"
    p = tx.proposal(operation, changes_data=False, parameters=parameters)
    pending = table.client.propose(p, key=table.writer_key, wait="ratified", control=kind)
    try:
        d = table.client.decided(pending, p.table_id, timeout_s or table.decision_timeout_s)
    finally:
        table.client.forget(p.proposal_id)
    table.invalidate()
    done = {CONTROL_ADOPT: ADOPTED_ERROR_TYPE, CONTROL_DROP: DROPPED_ERROR_TYPE}.get(kind, RELEASED_ERROR_TYPE)
    if d.error_type != done or d.winning_version is None:
        raise error_from_decision(d)
    return CommitResult(d.winning_version, p.proposal_id, operation, already_committed=d.duplicate_of is not None)

