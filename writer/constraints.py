"""Delta's write-time rules on rows: NOT NULL columns, invariants, CHECK constraints and generated columns.

Delta writers enforce these on every row a write produces (appends, overwrites, the new rows of UPDATE
and MERGE, the rows a rewrite copies); a table other engines wrote with a constraint must not get rows
that break it from us. `WriteRules.of` reads them from the table's protocol and metadata:

* NOT NULL: a top-level field with `nullable: false`;
* invariants: column metadata `delta.invariants`, legacy JSON `{"expression": {"expression": "<SQL>"}}`,
  checked as the constraint `EXPRESSION(<SQL>)`, as Delta names it;
* CHECK constraints: table properties `delta.constraints.<name>` = SQL boolean;
* generated columns: column metadata `delta.generationExpression` = SQL value, honoured when the protocol
  has the generatedColumns feature (writer version 4+, or the feature listed), as Delta does. A write that
  omits the column gets it computed; one that supplies it must supply the computed value (checked as
  Delta's `Generated Column` constraint, `col <=> expr`).

As in Delta's `CheckDeltaInvariant`, a row violates a CHECK constraint when its expression is false OR
NULL (stricter than SQL's WHERE). Expressions are evaluated by `deltacoord.schemas.expressions` over Arrow; one it
cannot evaluate fails the write with an error naming the constraint, before anything is staged.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.schemas.actions import Metadata, Protocol
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.expressions.arrow import evaluate, resolve_column
from deltacoord.schemas.expressions.syntax import ExpressionError, columns_of, parse
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.table_features import CONSTRAINT_PREFIX, GENERATION_KEY, INVARIANTS_KEY, writer_features

#: The name Delta gives the check that a supplied generated column equals its expression.
GENERATED_CHECK = "Generated Column"


class ConstraintViolationError(InvalidProposalError):
    """A written row breaks a NOT NULL column, an invariant, a CHECK constraint or a generated column's
    expression (Delta's DeltaInvariantViolationException). Nothing was staged or committed."""

    def __init__(self, message: str, constraint: str, expression: str | None, row: Mapping[str, Any]) -> None:
        super().__init__(ReasonCode.CONSTRAINT_VIOLATED, message)
        self.constraint = constraint
        self.expression = expression
        self.row = dict(row)


@dataclass(frozen=True)
class Check:
    """One boolean rule every written row must satisfy (TRUE; FALSE and NULL violate it)."""

    name: str
    expression: str


@dataclass(frozen=True)
class Generated:
    """A generated column and the SQL expression that computes it from the row."""

    column: str
    expression: str


def _invariant(column: str, raw: Any) -> Check:
    """The legacy `delta.invariants` value: JSON `{"expression": {"expression": "<SQL>"}}`."""
    try:
        doc = json.loads(raw) if isinstance(raw, str) else raw
        text = doc["expression"]["expression"]
    except (ValueError, TypeError, KeyError) as e:
        raise ExpressionError(str(raw), f"column {column!r}: delta.invariants is not "
                                        '{"expression": {"expression": "<SQL>"}}') from e
    if not isinstance(text, str):
        raise ExpressionError(str(raw), f"column {column!r}: the invariant's expression is not text")
    return Check(f"EXPRESSION({text})", text)


def _not_null_paths(fields: Sequence[Mapping[str, Any]], prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """The NOT NULL fields of a Delta schema, into structs (Delta checks no array element or map value)."""
    for f in fields:
        path = (*prefix, str(f["name"]))
        if f.get("nullable", True) is False:
            yield path
        t = f.get("type")
        if isinstance(t, Mapping) and t.get("type") == "struct":
            yield from _not_null_paths(t.get("fields", []), path)


def _missing(table: pa.Table, path: tuple[str, ...]) -> pa.Array:
    """Rows where the field at `path` is NULL while every struct above it is not."""
    col = table.column(path[0]).combine_chunks()
    present = pa.array([True] * len(col))
    for name in path[1:]:
        present = pc.and_(present, col.is_valid())
        col = pc.struct_field(col, [name])
    return pc.and_(present, col.is_null())


@dataclass(frozen=True)
class WriteRules:
    """A table's rules on written rows, read from its protocol and metadata (picklable: Spark tasks carry it)."""

    #: Paths of NOT NULL fields: top-level columns, and fields of structs (checked where their struct is not NULL).
    not_null: tuple[tuple[str, ...], ...] = ()
    checks: tuple[Check, ...] = ()
    generated: tuple[Generated, ...] = ()

    @classmethod
    def of(cls, protocol: Protocol, metadata: Metadata) -> WriteRules:
        schema = metadata.schema()
        generation = "generatedColumns" in writer_features(protocol)
        not_null = list(_not_null_paths(schema.get("fields", []), ()))
        checks: list[Check] = []
        generated: list[Generated] = []
        for f in schema.get("fields", []):
            name = str(f["name"])
            meta = f.get("metadata") or {}
            if INVARIANTS_KEY in meta:
                checks.append(_invariant(name, meta[INVARIANTS_KEY]))
            if generation and isinstance(meta.get(GENERATION_KEY), str):
                generated.append(Generated(name, meta[GENERATION_KEY]))
        for key, text in sorted(metadata.configuration.items()):
            if key.lower().startswith(CONSTRAINT_PREFIX):
                checks.append(Check(key[len(CONSTRAINT_PREFIX):], str(text)))
        return cls(tuple(not_null), tuple(checks), tuple(generated))

    def __bool__(self) -> bool:
        return bool(self.not_null or self.checks or self.generated)

    def complete(self, table: pa.Table, supplied: Collection[str]) -> pa.Table:
        """`table` with every generated column not in `supplied` computed from the row (the others are
        left for `enforce` to verify)."""
        for g in self.generated:
            if g.column in supplied or table.num_rows == 0:
                continue
            i = table.schema.get_field_index(g.column)
            target = table.schema.field(i).type
            value = self._evaluate(g.expression, table, f"generated column {g.column!r}")
            try:
                table = table.set_column(i, table.schema.field(i), value.cast(target))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise ExpressionError(g.expression, f"generated column {g.column!r}: its value ({value.type}) does not "
                                                    f"fit the column's type {target}: {e}") from e
        return table

    def enforce(self, table: pa.Table, generated_supplied: Collection[str] = ()) -> None:
        """Raise ConstraintViolationError naming the first rule a row of `table` breaks. Generated columns
        in `generated_supplied` must equal their expression (null-safe)."""
        if table.num_rows == 0:
            return
        for path in self.not_null:
            missing = _missing(table, path)
            n = pc.sum(missing.cast(pa.int64())).as_py()
            if n:
                name = ".".join(path)
                row = self._row(table, missing, [path[0]])
                raise ConstraintViolationError(
                    f"[DELTA_NOT_NULL_CONSTRAINT_VIOLATED] NOT NULL constraint violated for column: {name}. "
                    f"{n} written row(s) have no value in it; nothing was written", name, None, row)
        checks = list(self.checks)
        checks += [Check(GENERATED_CHECK, f"`{g.column}` <=> ({g.expression})") for g in self.generated
                   if g.column in generated_supplied]
        for check in checks:
            result = self._evaluate(check.expression, table, f"CHECK constraint {check.name}")
            if not pa.types.is_boolean(result.type):
                raise ExpressionError(check.expression, f"CHECK constraint {check.name} is not a boolean expression "
                                                        f"(it gives {result.type})")
            bad = pc.invert(pc.fill_null(result, False))  # FALSE or NULL violates (Delta's CheckDeltaInvariant)
            if pc.any(bad).as_py():
                n = pc.sum(bad.cast(pa.int64())).as_py()
                row = self._row(table, bad, self._columns(check.expression, table))
                values = "\n".join(f" - {k} : {v}" for k, v in row.items())
                raise ConstraintViolationError(
                    f"[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint {check.name} ({check.expression}) violated "
                    f"by row with values:\n{values}\n({n} written row(s) violate it; nothing was written)",
                    check.name, check.expression, row)

    @staticmethod
    def _evaluate(text: str, table: pa.Table, what: str) -> pa.Array:
        try:
            value = evaluate(text, table)
        except ExpressionError as e:
            raise ExpressionError(text, f"{what} cannot be evaluated by this writer: {e}. Write the table with an "
                                        "engine that can (Delta on Spark), or change the expression") from e
        return value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value

    @staticmethod
    def _columns(text: str, table: pa.Table) -> list[str]:
        names = []
        for c in sorted(columns_of(parse(text))):
            try:
                names.append(resolve_column(table.schema, c, text))
            except ExpressionError:
                continue
        return names

    @staticmethod
    def _row(table: pa.Table, mask: pa.Array, columns: list[str]) -> dict[str, Any]:
        """The first offending row's values of `columns`."""
        first = pc.index(mask, True).as_py()
        return {c: table.column(c)[first].as_py() for c in columns}


def fill_and_check(rules: WriteRules, table: pa.Table, supplied: Collection[str]) -> pa.Table:
    """The rows a write stages: generated columns not in `supplied` computed, then every rule checked."""
    if not rules:
        return table
    table = rules.complete(table, supplied)
    rules.enforce(table, [g.column for g in rules.generated if g.column in supplied])
    return table


__all__ = ["CONSTRAINT_PREFIX", "GENERATED_CHECK", "GENERATION_KEY", "INVARIANTS_KEY", "Check", "ConstraintViolationError",
           "Generated", "WriteRules", "fill_and_check"]
