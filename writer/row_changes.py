"""DELETE and UPDATE: rewrite the files holding matching rows (or mark the rows deleted by vector).

They declare their condition and the files they scanned after partition pruning (with the coordinator's own
matcher) and min/max data skipping (files skipped were never read): `deltacoord.schemas.expressions.files_read`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.reader.snapshot import (
    Snapshot,
    delta_schema_to_arrow,
)
from deltacoord.schemas.expressions import arrow as expressions
from deltacoord.schemas.expressions.scan import files_read
from deltacoord.schemas.identity import identity_columns
from deltacoord.writer import identity, row_tracking, staging
from deltacoord.writer.constraints import WriteRules, fill_and_check
from deltacoord.writer.operations import (
    OperationTable,
    abandoned_on_error,
    change_feed,
    changed,
    check_writable,
    delete_rows,
    noop,
    rows_where,
    scan,
    stage_changes,
    write,
    writes_dvs,
)
from deltacoord.writer.transaction import CommitResult


def rewrite(table: OperationTable, where: str | None, operation: str, change: Callable[[pa.Table, pa.Array], pa.Table],
            snapshot: Snapshot | None, count_name: str, proposal_id: str | None) -> CommitResult:
    """DELETE/UPDATE: scan files surviving partition pruning, rewrite those with matching rows."""
    snap = snapshot or table.snapshot()
    check_writable(snap, operation)
    schema = delta_schema_to_arrow(snap.metadata.schema())
    tx = table.begin_operation(snap.version, proposal_id)
    with abandoned_on_error(tx):
        if where is None:
            tx.read_whole()
            cond: Any = pc.scalar(True)
        else:
            cond = expressions.compile_filter(where, schema)
            tx.read_predicate(where)
        candidates = files_read(snap.files(), where, snap.metadata, schema)
        tx.read_files_from(candidates)
        touched = copied = 0
        dvs = writes_dvs(snap)
        cdf = change_feed(snap)
        changes: list[pa.Table] = []
        whole_files = True  # every touched file removed whole (no vector before or after): no change data owed
        hidden = row_tracking.hidden_columns(snap)
        for add in candidates:
            t, positions = scan(table.storage, snap, add, schema, hidden)
            mask = rows_where(t, cond, where or "TRUE")
            hits = pc.sum(mask.cast(pa.int64())).as_py() or 0
            if not hits:
                continue
            touched += hits
            whole_files = whole_files and operation == "DELETE" and hits == t.num_rows and add.deletion_vector is None
            if dvs:
                # Mark the matching rows deleted; an UPDATE writes their new values to a new file.
                delete_rows(table, tx, add, positions, positions[mask.to_numpy(zero_copy_only=False)])
                out = change(t, mask).filter(mask) if operation == "UPDATE" else t.slice(0, 0)
            else:
                copied += t.num_rows - hits
                tx.remove(add)
                out = change(t, mask)
            if hidden is not None and operation == "UPDATE":
                out = row_tracking.changed(out, hidden, None if dvs else mask)
            if cdf and operation == "UPDATE":
                changes += [changed(t.filter(mask), "update_preimage"),
                            changed((out if dvs else out.filter(mask)), "update_postimage")]
            elif cdf:
                changes.append(changed(t.filter(mask), "delete"))
            if out.num_rows:
                tx.stage(write(table.storage, snap, out))
        metrics = {count_name: touched, "numCopiedRows": copied}
        if not touched:
            return noop(snap, tx, operation, metrics)
        if not whole_files:
            stage_changes(table.storage, tx, snap, changes)
        return tx.commit(operation, changes_data=True, parameters={"predicate": json.dumps([where] if where else [])},
                         metrics=metrics)


def delete(table: OperationTable, where: str | None = None, *, snapshot: Snapshot | None = None,
           proposal_id: str | None = None) -> CommitResult:
    """`Table.delete` (documented there, where users read it)."""
    return rewrite(table, where, "DELETE", lambda t, mask: t.filter(pc.invert(mask)), snapshot, "numDeletedRows",
                         proposal_id)


def update(table: OperationTable, where: str | None, set: Mapping[str, str], *, snapshot: Snapshot | None = None,
           proposal_id: str | None = None) -> CommitResult:
    """`Table.update` (documented there, where users read it)."""
    snap = snapshot or table.snapshot()
    rules = WriteRules.of(snap.protocol, snap.metadata)

    snap = snapshot or table.snapshot()
    identity.check_update(identity_columns(snap.metadata.schema()), list(set))

    def change(t: pa.Table, mask: pa.Array) -> pa.Table:
        before = t
        for col, value_sql in set.items():
            if col not in t.column_names:
                raise staging.SchemaError(f"UPDATE sets unknown column {col!r}")
            new = expressions.evaluate(value_sql, before).cast(t.schema.field(col).type)
            t = t.set_column(t.column_names.index(col), col, pc.if_else(mask, new, t.column(col).combine_chunks()))
        if rules:
            updated = fill_and_check(rules, t.filter(mask), set.keys())
            for g in rules.generated:
                if g.column not in set:
                    i = t.column_names.index(g.column)
                    values = pc.replace_with_mask(t.column(i).combine_chunks(), mask, updated.column(g.column).combine_chunks())
                    t = t.set_column(i, t.schema.field(i), values)
        return t

    return rewrite(table, where, "UPDATE", change, snap, "numUpdatedRows", proposal_id)

