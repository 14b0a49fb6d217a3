"""MERGE INTO: the one implementation behind `Table.merge`'s keyword form and its builder (`TableMerger`).

MERGE declares its target-only conjuncts and the target files it scanned (pruned and skipped as DELETE
and UPDATE are). Its clauses are ordered lists: for each row the first clause whose condition holds acts,
as in Delta.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.reader.snapshot import (
    Snapshot,
    delta_schema_to_arrow,
)
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.expressions import arrow as expressions
from deltacoord.schemas.expressions.scan import files_read
from deltacoord.schemas.expressions.syntax import ExpressionError, split_merge_condition
from deltacoord.schemas.identity import identity_columns
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.writer import identity, row_tracking, staging
from deltacoord.writer.constraints import WriteRules, fill_and_check
from deltacoord.writer.operations import (
    OperationTable,
    abandoned_on_error,
    advance_identity,
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

#: A MERGE clause: "*" (all columns from the source) or target column -> SQL expression over `s.`/`t.` columns.
Assignments = Mapping[str, str] | Literal["*"]


class MergeError(InvalidProposalError):
    """A MERGE that Delta would refuse (e.g. several source rows matching one target row)."""


@dataclass(frozen=True)
class WhenMatched:
    """`WHEN MATCHED [AND predicate] THEN UPDATE SET assignments | DELETE`."""

    action: Literal["update", "delete"]
    #: A SQL condition over s./t. columns; None: every matched row this clause sees.
    predicate: str | None = None
    #: The update's assignments (None for a delete).
    assignments: Assignments | None = None


@dataclass(frozen=True)
class WhenNotMatched:
    """`WHEN NOT MATCHED [AND predicate] THEN INSERT assignments`."""

    assignments: Assignments
    #: A SQL condition over source columns; None: every unmatched source row this clause sees.
    predicate: str | None = None


def check_clauses(matched: Sequence[WhenMatched], not_matched: Sequence[WhenNotMatched]) -> None:
    """Refuse clause lists Delta refuses: none at all, or a clause without a condition before another of its kind
    (it would leave nothing for the later one)."""
    if not matched and not not_matched:
        raise ValueError("a MERGE needs at least one clause: add when_matched_update(...), when_matched_delete(...) "
                         "or when_not_matched_insert(...) (or their _all forms) before execute()")
    for clauses, kind in ((matched, "WHEN MATCHED"), (not_matched, "WHEN NOT MATCHED")):
        for c in clauses[:-1]:
            if c.predicate is None:
                raise ValueError(f"only the last {kind} clause may omit its predicate (as in Delta): an earlier one "
                                 "without a predicate takes every row and leaves none for the clauses after it; give "
                                 "it a predicate, or move it last")


def keyword_clauses(when_matched_update: Assignments | None, when_not_matched_insert: Assignments | None,
                    when_matched_delete: bool | str, when_not_matched_insert_if: str | None,
                    ) -> tuple[list[WhenMatched], list[WhenNotMatched]]:
    """The clause lists `Table.merge`'s keyword form stands for: the delete (if any) before the update, one insert."""
    if when_matched_update is None and when_not_matched_insert is None and when_matched_delete is False:
        raise ValueError("give when_matched_update, when_matched_delete and/or when_not_matched_insert")
    if when_not_matched_insert_if is not None and when_not_matched_insert is None:
        raise ValueError("when_not_matched_insert_if needs when_not_matched_insert")
    if when_matched_delete is True and when_matched_update is not None:
        # As in Delta: only the last WHEN MATCHED clause may omit its condition, and the delete comes first.
        raise ValueError("an unconditional when_matched_delete leaves nothing for when_matched_update; give it a condition")
    matched: list[WhenMatched] = []
    if when_matched_delete is not False:
        matched.append(WhenMatched("delete", when_matched_delete if isinstance(when_matched_delete, str) else None))
    if when_matched_update is not None:
        matched.append(WhenMatched("update", None, when_matched_update))
    not_matched = ([WhenNotMatched(when_not_matched_insert, when_not_matched_insert_if)]
                   if when_not_matched_insert is not None else [])
    return matched, not_matched


def merge(table: OperationTable, source: Any, on: str | Sequence[str], *, when_matched_update: Assignments | None = None,
          when_not_matched_insert: Assignments | None = None, when_matched_delete: bool | str = False,
          when_not_matched_insert_if: str | None = None, source_alias: str = "s", target_alias: str = "t",
          snapshot: Snapshot | None = None, proposal_id: str | None = None) -> CommitResult:
    """`Table.merge`'s keyword form (its docstring says what the arguments mean)."""
    matched, not_matched = keyword_clauses(when_matched_update, when_not_matched_insert, when_matched_delete,
                                           when_not_matched_insert_if)
    return merge_clauses(table, source, on, matched, not_matched, source_alias=source_alias,
                         target_alias=target_alias, snapshot=snapshot, proposal_id=proposal_id)


def first_match(clauses: Sequence[WhenMatched] | Sequence[WhenNotMatched], source_rows: pa.Table,
                target_rows: pa.Table | None, aliases: tuple[str, str]) -> list[pa.Array]:
    """For each clause, the rows it acts on: those its predicate selects that no earlier clause took (Delta's
    first matching clause wins)."""
    remaining = pa.array([True] * source_rows.num_rows, pa.bool_())
    chosen = []
    for c in clauses:
        sel = remaining if c.predicate is None else pc.and_(remaining, condition(c.predicate, source_rows, target_rows,
                                                                                 aliases))
        remaining = pc.and_(remaining, pc.invert(sel))
        chosen.append(sel)
    return chosen


def merge_clauses(table: OperationTable, source: Any, on: str | Sequence[str], matched: Sequence[WhenMatched],
                  not_matched: Sequence[WhenNotMatched], *, source_alias: str = "s", target_alias: str = "t",
                  snapshot: Snapshot | None = None, proposal_id: str | None = None) -> CommitResult:
    """MERGE INTO table USING source ON `on` with ordered WHEN MATCHED and WHEN NOT MATCHED clauses: each
    row is acted on by the first clause of its kind whose predicate holds (rows no clause takes stay)."""
    check_clauses(matched, not_matched)
    snap = snapshot or table.snapshot()
    check_writable(snap, "MERGE")
    schema = delta_schema_to_arrow(snap.metadata.schema())
    rules = WriteRules.of(snap.protocol, snap.metadata)
    src = staging.to_arrow(source)
    if isinstance(on, str):
        keys, target_filter = split_merge_condition(on, source_alias, target_alias)
    else:
        keys, target_filter = [(k, k) for k in on], None
    for s_col, t_col in keys:
        if s_col not in src.column_names:
            raise staging.SchemaError(f"MERGE key {s_col!r} is not a source column ({src.column_names})")
        if t_col not in schema.names:
            raise staging.SchemaError(f"MERGE key {t_col!r} is not a target column ({schema.names})")

    tx = table.begin_operation(snap.version, proposal_id)
    with abandoned_on_error(tx):
        if target_filter is None:
            tx.read_whole()
            cond: Any = pc.scalar(True)
        else:
            tx.read_predicate(target_filter)
            cond = expressions.compile_filter(target_filter, schema)
        candidates = files_read(snap.files(), target_filter, snap.metadata, schema)
        tx.read_files_from(candidates)

        # Source keys, typed as the target's, with their row numbers; NULL keys never match (SQL equality).
        src_keys = pa.table({f"__k{i}": src.column(s).cast(schema.field(t).type) for i, (s, t) in enumerate(keys)})
        src_keys = src_keys.append_column("__src", pa.array(range(src.num_rows), pa.int64()))
        src_keys = src_keys.filter(all_valid(src_keys, len(keys)))
        aliases = (source_alias, target_alias)

        matched_src: set[int] = set()
        updated = deleted = copied = 0
        # As in Delta: several source rows may match one target row only when the one WHEN MATCHED clause is
        # an unconditional DELETE.
        one_to_one = any(c.action == "update" or c.predicate is not None for c in matched)
        dvs = writes_dvs(snap)
        cdf = change_feed(snap)
        changes: list[pa.Table] = []
        hidden = row_tracking.hidden_columns(snap)
        for add in candidates:
            t, positions = scan(table.storage, snap, add, schema, hidden)
            tk = pa.table({f"__k{i}": t.column(tc) for i, (_s, tc) in enumerate(keys)})
            tk = tk.append_column("__row", pa.array(range(t.num_rows), pa.int64()))
            tk = tk.filter(pc.and_(rows_where(t, cond, target_filter or "TRUE"), all_valid(tk, len(keys))))
            if not tk.num_rows:
                continue
            joined = tk.join(src_keys, [f"__k{i}" for i in range(len(keys))], join_type="inner")
            if not joined.num_rows:
                continue
            rows = joined.column("__row").to_numpy()
            srcs = joined.column("__src").to_numpy()
            matched_src.update(int(i) for i in srcs)
            if not matched:
                continue
            target_rows = t.take(pa.array(rows))
            source_rows = src.take(pa.array(srcs))
            chosen = first_match(matched, source_rows, target_rows, aliases)
            delete = pa.array([False] * len(rows), pa.bool_())
            update = pa.array([False] * len(rows), pa.bool_())
            updates: list[tuple[WhenMatched, pa.Array]] = []
            for c, sel in zip(matched, chosen, strict=True):
                if c.action == "delete":
                    delete = pc.or_(delete, sel)
                else:
                    update = pc.or_(update, sel)
                    updates.append((c, sel))
            if one_to_one:
                # A matched-only MERGE counts just the pairs that some WHEN MATCHED clause selects.
                counted = rows if not_matched else pc.filter(pa.array(rows), pc.or_(delete, update)).to_numpy()
                if len(set(counted.tolist())) != len(counted):
                    raise MergeError(
                        ReasonCode.MULTIPLE_SOURCE_ROWS_MATCHED,
                        "several source rows matched the same target row; MERGE cannot decide which to apply")
            n_del = len(set(pc.filter(pa.array(rows), delete).to_pylist()))
            n_upd = pc.sum(update.cast(pa.int64())).as_py() or 0
            if not n_del and not n_upd:
                continue
            touched = pc.filter(pa.array(rows), pc.or_(delete, update))
            is_touched = pc.is_in(pa.array(range(t.num_rows), pa.int64()), value_set=touched)
            # With deletion vectors the touched rows are marked deleted and only the updated ones rewritten.
            parts = [t.slice(0, 0) if dvs else t.filter(pc.invert(is_touched))]
            if cdf:
                gone = np.unique(pc.filter(pa.array(rows), delete).to_numpy(zero_copy_only=False))
                changes.append(changed(t.take(pa.array(gone, pa.int64())), "delete"))
            for c, sel in updates:
                if not pc.any(sel).as_py():
                    continue
                assert c.assignments is not None
                new = assign(c.assignments, schema, source_rows.filter(sel), target_rows.filter(sel), aliases,
                             "UPDATE SET *", rules)
                if hidden is not None:  # updated rows keep their ids and change now
                    new = row_tracking.carried(new, target_rows.filter(sel).column(hidden.row_id), hidden)
                parts.append(new)
                if cdf:
                    changes += [changed(target_rows.filter(sel), "update_preimage"), changed(new, "update_postimage")]
            out = pa.concat_tables(parts)
            updated += n_upd
            deleted += n_del
            copied += parts[0].num_rows
            if dvs:
                delete_rows(table, tx, add, positions, positions[is_touched.to_numpy(zero_copy_only=False)])
            else:
                tx.remove(add)
            if out.num_rows:
                tx.stage(write(table.storage, snap, out))

        inserted = 0
        todo = [i for i in range(src.num_rows) if i not in matched_src] if not_matched else []
        if todo:
            pending = src.take(pa.array(todo, pa.int64()))
            id_columns = identity_columns(snap.metadata.schema())
            marks: dict[str, int] = {}
            inserts: list[pa.Table] = []
            for ins, sel in zip(not_matched, first_match(not_matched, pending, None, aliases), strict=True):
                source_rows = pending.filter(sel)
                if id_columns and source_rows.num_rows:
                    # Identity values first (NOT NULL and CHECKs may name the column), then the table's rules.
                    new_rows = assign(ins.assignments, schema, source_rows, None, aliases, "INSERT *", WriteRules())
                    new_rows = identity.fill(new_rows, id_columns, marks)
                    given = set(source_rows.column_names) if ins.assignments == "*" else set(ins.assignments)
                    new_rows = fill_and_check(rules, new_rows, given | {col.name for col in id_columns})
                else:
                    new_rows = assign(ins.assignments, schema, source_rows, None, aliases, "INSERT *", rules)
                inserts.append(new_rows)
            advance_identity(tx, snap, marks)
            new_rows = inserts[0] if len(inserts) == 1 else pa.concat_tables(inserts)
            inserted = new_rows.num_rows
            if cdf:
                changes.append(changed(new_rows, "insert"))
            if inserted:
                tx.stage(write(table.storage, snap, new_rows))
        metrics = {"numSourceRows": src.num_rows, "numTargetRowsUpdated": updated, "numTargetRowsDeleted": deleted,
                   "numTargetRowsInserted": inserted, "numTargetRowsCopied": copied}
        if not updated and not inserted and not deleted:
            return noop(snap, tx, "MERGE", metrics)
        stage_changes(table.storage, tx, snap, changes)
        params = {
            "predicate": json.dumps([on if isinstance(on, str) else " AND ".join(f"s.{k} = t.{k}" for k in on)]),
            "matchedPredicates": json.dumps([{"actionType": c.action, **({"predicate": c.predicate} if c.predicate else {})}
                                             for c in matched]),
            "notMatchedPredicates": json.dumps([{"actionType": "insert", **({"predicate": c.predicate} if c.predicate else {})}
                                                for c in not_matched]),
        }
        return tx.commit("MERGE", changes_data=True, parameters=params, metrics=metrics)


def condition(text: str, source_rows: pa.Table, target_rows: pa.Table | None, aliases: tuple[str, str]) -> pa.Array:
    """A MERGE clause condition per joined row; NULL counts as false, as in SQL."""
    joined, prefixes, sides = merge_view(source_rows, target_rows, aliases)
    if not joined.num_columns:
        return pa.array([], pa.bool_())
    m = expressions.evaluate_qualified(text, joined, prefixes, sides)
    if isinstance(m, pa.ChunkedArray):
        m = m.combine_chunks()
    if not pa.types.is_boolean(m.type):
        raise ExpressionError(text, f"a MERGE condition must be boolean, not {m.type}")
    return pc.fill_null(m, False)


def assign(clause: Assignments, schema: pa.Schema, source_rows: pa.Table, target_rows: pa.Table | None,
           aliases: tuple[str, str], star: str, rules: WriteRules) -> pa.Table:
    """The rows a MERGE clause produces, in the table schema (an INSERT sees no target columns), with the
    generated columns it does not assign computed and the table's constraints checked."""
    n = source_rows.num_rows
    generated = {g.column for g in rules.generated}
    if clause == "*":
        absent = [f.name for f in schema if f.name not in source_rows.column_names and f.name not in generated]
        if absent:
            raise staging.SchemaError(f"{star} needs every target column in the source; missing {absent}")
        given = [f.name for f in schema if f.name in source_rows.column_names]
        star_rows = pa.Table.from_arrays([source_rows.column(f.name).cast(f.type) if f.name in given else pa.nulls(n, f.type)
                                          for f in schema], schema=schema)
        return fill_and_check(rules, star_rows, given)
    unknown = [c for c in clause if c not in schema.names]
    if unknown:
        raise staging.SchemaError(f"MERGE assigns unknown column(s) {unknown}")
    joined, prefixes, sides = merge_view(source_rows, target_rows, aliases)
    cols = []
    for f in schema:
        if f.name in clause:
            cols.append(expressions.evaluate_qualified(clause[f.name], joined, prefixes, sides).cast(f.type))
        elif target_rows is not None:
            cols.append(target_rows.column(f.name).combine_chunks())
        else:
            cols.append(pa.nulls(n, f.type))
    return fill_and_check(rules, pa.Table.from_arrays(cols, schema=schema), clause.keys())


def merge_view(source_rows: pa.Table, target_rows: pa.Table | None,
               aliases: tuple[str, str]) -> tuple[pa.Table, dict[str, str], dict[str, set[str]]]:
    """Joined MERGE rows with s__/t__ column prefixes, for `expressions.evaluate_qualified`."""
    s_alias, t_alias = aliases
    view = {f"s__{c}": source_rows.column(c) for c in source_rows.column_names}
    if target_rows is not None:
        view.update({f"t__{c}": target_rows.column(c) for c in target_rows.column_names})
    sides = {s_alias: set(source_rows.column_names), t_alias: set(target_rows.column_names if target_rows is not None else ())}
    return pa.table(view), {s_alias: "s__", t_alias: "t__"}, sides


def all_valid(t: pa.Table, n_keys: int) -> pa.Array:
    """Rows whose n key columns (`__k0..`) are all non-null."""
    m = pc.is_valid(t.column("__k0"))
    for i in range(1, n_keys):
        m = pc.and_(m, pc.is_valid(t.column(f"__k{i}")))
    return m


class TableMerger:
    """A MERGE built clause by clause, in delta-rs's form: `Table.merge(source, on)` without clause keywords
    returns one, and `execute()` runs it through the same implementation as the keyword form.

    Clauses apply in the order they are added: a matched (or unmatched) row is acted on by the first clause of
    its kind whose predicate holds, as in Delta; only the last clause of a kind may omit its predicate. A merger
    executes once.
    """

    def __init__(self, table: OperationTable, source: Any, on: str | Sequence[str], *, source_alias: str = "s",
                 target_alias: str = "t", snapshot: Snapshot | None = None, proposal_id: str | None = None) -> None:
        self.table = table
        self.source = source
        self.on = on
        self.source_alias = source_alias
        self.target_alias = target_alias
        self.snapshot = snapshot
        self.proposal_id = proposal_id
        self.matched: list[WhenMatched] = []
        self.not_matched: list[WhenNotMatched] = []
        self.executed = False

    def when_matched_update(self, updates: Mapping[str, str], predicate: str | None = None) -> TableMerger:
        """WHEN MATCHED [AND predicate] THEN UPDATE SET: `updates` maps target columns to SQL over s./t. columns."""
        self.matched.append(WhenMatched("update", predicate, _assignments(updates, "when_matched_update")))
        return self

    def when_matched_update_all(self, predicate: str | None = None) -> TableMerger:
        """WHEN MATCHED [AND predicate] THEN UPDATE SET *: every target column from the source column of its name."""
        self.matched.append(WhenMatched("update", predicate, "*"))
        return self

    def when_matched_delete(self, predicate: str | None = None) -> TableMerger:
        """WHEN MATCHED [AND predicate] THEN DELETE."""
        self.matched.append(WhenMatched("delete", predicate))
        return self

    def when_not_matched_insert(self, updates: Mapping[str, str], predicate: str | None = None) -> TableMerger:
        """WHEN NOT MATCHED [AND predicate] THEN INSERT: `updates` maps target columns to SQL over source columns
        (the others are NULL, or computed when generated)."""
        self.not_matched.append(WhenNotMatched(_assignments(updates, "when_not_matched_insert"), predicate))
        return self

    def when_not_matched_insert_all(self, predicate: str | None = None) -> TableMerger:
        """WHEN NOT MATCHED [AND predicate] THEN INSERT *: every target column from the source column of its name."""
        self.not_matched.append(WhenNotMatched("*", predicate))
        return self

    def execute(self) -> CommitResult:
        """Run the MERGE; the result is the keyword form's (`metrics` as delta-rs's numTargetRows* counts)."""
        if self.executed:
            raise ValueError("this MERGE was executed already; build a new one with Table.merge(source, on) to "
                             "merge again")
        check_clauses(self.matched, self.not_matched)
        self.executed = True
        return merge_clauses(self.table, self.source, self.on, self.matched, self.not_matched,
                             source_alias=self.source_alias, target_alias=self.target_alias, snapshot=self.snapshot,
                             proposal_id=self.proposal_id)


def _assignments(updates: Mapping[str, str], clause: str) -> Mapping[str, str]:
    """`updates` as a clause's assignments: a non-empty mapping of target column to SQL text."""
    if not isinstance(updates, Mapping) or not updates:
        raise TypeError(f"{clause}(updates=...) takes a non-empty dict of target column to SQL expression, "
                        f"e.g. {{'amount': 's.amount'}}, not {updates!r}; for every column use {clause}_all()")
    bad = [k for k, v in updates.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(f"{clause}: the assignments of {bad} are not column name -> SQL text")
    return dict(updates)
