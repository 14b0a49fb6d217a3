"""Appends, overwrites and TRUNCATE: operations that add or replace whole files.

A blind append reads nothing (it conflicts only with metadata changes); OVERWRITE with `replace_where`
declares that predicate and the files it replaces, a full overwrite reads the whole table; TRUNCATE
removes every file of the table or of the partitions it names.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.reader.snapshot import (
    Snapshot,
)
from deltacoord.schemas.actions import SetTransaction
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.expressions import arrow as expressions
from deltacoord.schemas.expressions.syntax import columns_of, parse
from deltacoord.schemas.properties import TableProperties
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.writer import staging
from deltacoord.writer.operations import (
    OperationTable,
    Progress,
    abandoned_on_error,
    advance_identity,
    candidates,
    check_writable,
    chunks,
    conform,
    rows_where,
    write,
)
from deltacoord.writer.transaction import CommitResult


def append(table: OperationTable, data: Any, *, app_id: str | None = None, app_version: int | None = None,
           snapshot: Snapshot | None = None, progress: Progress | None = None,
           proposal_id: str | None = None) -> CommitResult:
    """`Table.append` (documented there, where users read it)."""
    if (app_id is None) != (app_version is None):
        raise ValueError("give both app_id and app_version, or neither")
    # Neither needs the table's files: the app versions come with the protocol and metadata.
    snap = snapshot or (table.snapshot(files_on_demand=True) if app_id is not None else table.cached_snapshot())
    if snapshot is None and app_id is None and TableProperties.of(snap.metadata).maxcompute:
        # MaxCompute's rules fail an INSERT INTO that finishes after another one it did not see.
        snap = table.snapshot()
    check_writable(snap, "WRITE")
    tx = table.begin_operation(snap.version, proposal_id)
    with abandoned_on_error(tx):
        if app_id is not None and app_version is not None:
            recorded = snap.app_versions.get(app_id, -1)
            if app_version <= recorded:
                return CommitResult(snap.version, tx.proposal_id, "WRITE", already_committed=True)
            tx.read_app_id(app_id)
            tx.add(SetTransaction(app_id, app_version, int(time.time() * 1000)))
        rows = files = size = 0
        marks: dict[str, int] = {}
        target = staging.target_file_size(snap.metadata.configuration)

        def stage(piece: pa.Table) -> None:
            nonlocal rows, files, size
            adds = write(table.storage, snap, piece, target_file_size=max(target, piece.nbytes))  # sized here already
            tx.stage(adds)
            rows, files, size = rows + piece.num_rows, files + len(adds), size + sum(a.size for a in adds)
            if progress is not None:
                progress(rows, files, size)

        pending: pa.Table | None = None
        for chunk in chunks(data):  # rows gathered until a file's worth: small batches make no small files
            conformed = conform(chunk, snap, marks)
            pending = conformed if pending is None else pa.concat_tables([pending, conformed])
            while pending.num_rows and pending.nbytes >= target:
                per_file = max(1, pending.num_rows * target // pending.nbytes)
                stage(pending.slice(0, per_file))
                pending = pending.slice(per_file)
        if pending is not None and pending.num_rows:
            stage(pending)
        advance_identity(tx, snap, marks)
        return tx.commit("WRITE", changes_data=True, parameters={"mode": "Append", "partitionBy": snap.partition_columns},
                         metrics={"numOutputRows": rows})


def _partition_only(snap: Snapshot, where: str, what: str) -> None:
    """Refuse a condition naming anything but partition columns: a replace or truncate removes whole files."""
    cols = columns_of(parse(where))
    part = set(snap.partition_columns)
    if not cols or not cols <= part:
        raise InvalidProposalError(ReasonCode.BAD_REPLACE_WHERE,
                                   f"{what} {where!r} must name partition columns only ({sorted(part)})")


def overwrite(table: OperationTable, data: Any, replace_where: str | None = None, *, snapshot: Snapshot | None = None,
              proposal_id: str | None = None) -> CommitResult:
    """`Table.overwrite` (documented there, where users read it)."""
    snap = snapshot or table.snapshot()
    check_writable(snap, "WRITE")
    marks: dict[str, int] = {}
    rows = conform(data, snap, marks)
    tx = table.begin_operation(snap.version, proposal_id)
    advance_identity(tx, snap, marks)
    with abandoned_on_error(tx):
        if replace_where is None:
            tx.read_whole()
            replaced = tx.remove_all(snap.file_parts())
        else:
            _partition_only(snap, replace_where, "replace_where")
            ok = rows_where(rows, expressions.compile_filter(replace_where, rows.schema), replace_where)
            bad = rows.num_rows - pc.sum(ok.cast(pa.int64())).as_py() if rows.num_rows else 0
            if bad:
                raise InvalidProposalError(
                    ReasonCode.REPLACE_WHERE_MISMATCH,
                    f"{bad} written row(s) do not satisfy replace_where {replace_where!r}; nothing was written")
            tx.read_predicate(replace_where)
            files = candidates(snap, replace_where)
            tx.read_files_from(files)
            replaced = tx.remove_all([files])
        tx.stage(write(table.storage, snap, rows))
        params: dict[str, Any] = {"mode": "Overwrite", "partitionBy": snap.partition_columns}
        if replace_where is not None:
            params["predicate"] = json.dumps([replace_where])
        return tx.commit("WRITE", changes_data=True, parameters=params,
                         metrics={"numOutputRows": rows.num_rows, "numRemovedFiles": replaced})


def truncate(table: OperationTable, where: str | None = None, *, snapshot: Snapshot | None = None,
             proposal_id: str | None = None) -> CommitResult:
    """`Table.truncate` (documented there, where users read it)."""
    snap = snapshot or table.snapshot()
    check_writable(snap, "TRUNCATE")
    tx = table.begin_operation(snap.version, proposal_id)
    with abandoned_on_error(tx):
        if where is None:
            tx.read_whole()
            removed = tx.remove_all(snap.file_parts())
        else:
            _partition_only(snap, where, "truncate where")
            tx.read_predicate(where)
            files = candidates(snap, where)
            tx.read_files_from(files)
            removed = tx.remove_all([files])
        return tx.commit("TRUNCATE", changes_data=True, parameters={"predicate": json.dumps([where] if where else [])},
                         metrics={"numRemovedFiles": removed})

