"""SQL expressions (WHERE conditions, SET values) as Arrow compute expressions.

Parsed with sqlglot and translated into `pyarrow.compute` expressions, so a
DELETE or UPDATE filters rows with Arrow's kernels. The top-level conjuncts
that name only partition columns also prune files before any is read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from schemas.errors import InvalidProposalError
from schemas.reasons import ReasonCode


class ExpressionError(InvalidProposalError):
    def __init__(self, text: str, problem: str) -> None:
        super().__init__(ReasonCode.BAD_EXPRESSION, f"{problem} in {text!r}")


def parse(text: str) -> exp.Expr:
    try:
        tree = sqlglot.parse_one(text, read="spark")
    except sqlglot.errors.ParseError as e:
        raise ExpressionError(text, f"cannot parse: {e}") from None
    if tree is None:
        raise ExpressionError(text, "empty expression")
    return tree


def conjuncts(tree: exp.Expr) -> list[exp.Expr]:
    """Top-level AND terms."""
    if isinstance(tree, exp.Paren):
        return conjuncts(tree.this)
    if isinstance(tree, exp.And):
        return conjuncts(tree.left) + conjuncts(tree.right)
    return [tree]


def columns_of(tree: exp.Expr) -> set[str]:
    return {c.name for c in tree.find_all(exp.Column)}


def partition_only(text: str, partition_columns: Sequence[str]) -> str | None:
    """The conjuncts of `text` that name only partition columns, as SQL (None if none)."""
    parts = [c for c in conjuncts(parse(text)) if columns_of(c) and columns_of(c) <= set(partition_columns)]
    if not parts:
        return None
    return " AND ".join(f"({p.sql(dialect='spark')})" for p in parts)


def literal(node: exp.Expr, text: str) -> Any:
    """The Python value of a SQL literal (also used by data skipping); ExpressionError otherwise."""
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return node.this is True or str(node.this).lower() == "true"
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        s = node.this
        return float(s) if any(ch in s for ch in ".eE") else int(s)
    if isinstance(node, exp.Neg):
        v = literal(node.this, text)
        return -v
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal):
        to = node.to.sql().upper()
        if to == "DATE":
            return dt.date.fromisoformat(node.this.this)
        if to.startswith("TIMESTAMP"):
            return dt.datetime.fromisoformat(node.this.this).replace(tzinfo=dt.UTC)
    raise ExpressionError(text, f"unsupported literal {node.sql()}")


def to_arrow(node: exp.Expr, schema: pa.Schema, text: str) -> Any:
    """Translate a parsed SQL expression into a pyarrow.compute Expression."""
    if isinstance(node, exp.Paren):
        return to_arrow(node.this, schema, text)
    if isinstance(node, exp.Column):
        if node.name not in schema.names:
            raise ExpressionError(text, f"unknown column {node.name!r}")
        return pc.field(node.name)
    if isinstance(node, exp.And):
        return to_arrow(node.left, schema, text) & to_arrow(node.right, schema, text)
    if isinstance(node, exp.Or):
        return to_arrow(node.left, schema, text) | to_arrow(node.right, schema, text)
    if isinstance(node, exp.Not):
        return ~to_arrow(node.this, schema, text)
    ops = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.GT: "greater", exp.GTE: "greater_equal", exp.LT: "less", exp.LTE: "less_equal",
           exp.Add: "add", exp.Sub: "subtract", exp.Mul: "multiply", exp.Div: "divide"}
    for cls, fn in ops.items():
        if isinstance(node, cls):
            left, right = _operand(node.left, schema, text), _operand(node.right, schema, text)
            left, right = _coerce(left, right, schema), _coerce(right, left, schema)
            return getattr(pc, fn)(left, right)
    if isinstance(node, exp.In):
        values = [literal(v, text) for v in node.expressions]
        col = to_arrow(node.this, schema, text)
        typ = schema.field(node.this.name).type if isinstance(node.this, exp.Column) else None
        return col.isin(_in_values(values, typ, text) if typ is not None else values)
    if isinstance(node, exp.Between):
        col = node.this
        return to_arrow(exp.GTE(this=col, expression=node.args["low"]), schema, text) & to_arrow(
            exp.LTE(this=col, expression=node.args["high"]), schema, text
        )
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        return to_arrow(node.this, schema, text).is_null()
    if isinstance(node, (exp.Literal, exp.Null, exp.Boolean, exp.Neg, exp.Cast)):
        return pc.scalar(literal(node, text))
    raise ExpressionError(text, f"unsupported construct {node.key.upper()} ({node.sql()})")


def _in_values(values: list[Any], typ: pa.DataType, text: str) -> pa.Array:
    """IN-list literals as the column's type; strings are cast as Spark casts them ('2024-01-01' to a date)."""
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        pass
    try:
        return pa.array(values).cast(typ)
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ExpressionError(text, f"IN values {values!r} are not of the column's type {typ}: {e}") from None


def _operand(node: exp.Expr, schema: pa.Schema, text: str) -> Any:
    if isinstance(node, (exp.Literal, exp.Null, exp.Boolean, exp.Neg, exp.Cast)):
        return ("lit", literal(node, text))
    return to_arrow(node, schema, text)


def _coerce(value: Any, other: Any, schema: pa.Schema) -> Any:
    """Literals take the type of the column they are compared with (dates from strings, etc.)."""
    if not (isinstance(value, tuple) and value[0] == "lit"):
        return value
    lit = value[1]
    if isinstance(other, pc.Expression):
        name = _field_name(other)
        if name is not None and lit is not None:
            t = schema.field(name).type
            try:
                return pc.scalar(pa.scalar(lit).cast(t))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return pc.scalar(lit)
    return pc.scalar(lit)


def _field_name(e: pc.Expression) -> str | None:
    s = str(e)
    return s if s.isidentifier() else None


def compile_filter(text: str, schema: pa.Schema) -> Any:
    """A WHERE condition as an Arrow expression over `schema`."""
    return to_arrow(parse(text), schema, text)


def evaluate(text: str, table: pa.Table) -> pa.Array:
    """Evaluate a SQL value expression (an UPDATE's SET value) over a table."""
    node = parse(text)
    if isinstance(node, (exp.Literal, exp.Null, exp.Boolean, exp.Neg, exp.Cast)):
        return pa.array([literal(node, text)] * table.num_rows)
    expr = to_arrow(node, table.schema, text)
    import pyarrow.dataset as ds

    return ds.dataset(table).to_table(columns={"v": expr}).column("v").combine_chunks()


# -- MERGE ------------------------------------------------------------------------------
def strip_qualifiers(text: str) -> str:
    """`t.date = '2024-01-01'` -> `date = '2024-01-01'` (what a read predicate or a filter needs)."""
    tree = parse(text).transform(lambda n: exp.column(n.name) if isinstance(n, exp.Column) and n.table else n)
    return str(tree.sql(dialect="spark"))


def split_merge_condition(text: str, source_alias: str, target_alias: str) -> tuple[list[tuple[str, str]], str | None]:
    """A MERGE ON condition as key pairs (source column, target column) plus the target-only conjuncts.

    Supported: conjuncts `s.k = t.k` (equi-join keys) and conjuncts naming only
    target columns with literals (`t.date = '2024-01-01'`), which prune files
    and become the read predicate, so merges into disjoint partitions do not
    conflict. Anything else is rejected rather than evaluated loosely.
    """
    keys: list[tuple[str, str]] = []
    target_only: list[str] = []
    for c in conjuncts(parse(text)):
        cols = list(c.find_all(exp.Column))
        tables = {col.table for col in cols}
        if "" in tables:
            raise ExpressionError(text, f"qualify every column with {source_alias!r} or {target_alias!r}: {c.sql()}")
        unknown = tables - {source_alias, target_alias}
        if unknown:
            raise ExpressionError(text, f"unknown table alias(es) {sorted(unknown)}")
        if isinstance(c, exp.EQ) and isinstance(c.left, exp.Column) and isinstance(c.right, exp.Column) \
                and {c.left.table, c.right.table} == {source_alias, target_alias}:
            s, t = (c.left, c.right) if c.left.table == source_alias else (c.right, c.left)
            keys.append((s.name, t.name))
        elif cols and tables == {target_alias}:
            target_only.append(f"({strip_qualifiers(c.sql(dialect='spark'))})")
        else:
            raise ExpressionError(text, f"unsupported MERGE condition conjunct {c.sql()} (use s.k = t.k keys and target-only filters)")
    if not keys:
        raise ExpressionError(text, "a MERGE condition needs at least one source = target key equality")
    return keys, " AND ".join(target_only) or None


def evaluate_qualified(text: str, table: pa.Table, prefixes: dict[str, str], sides: dict[str, set[str]]) -> pa.Array:
    """Evaluate an expression over a joined table whose columns carry per-alias prefixes.

    `prefixes` maps an alias (`s`, `t`) to its column prefix in `table`;
    `sides` maps each alias to its column names, to resolve unqualified
    columns (an unqualified name present on both sides is ambiguous, as in Spark).
    """

    def rename(n: exp.Expr) -> exp.Expr:
        if not isinstance(n, exp.Column):
            return n
        if n.table:
            if n.table not in prefixes:
                raise ExpressionError(text, f"unknown table alias {n.table!r}")
            return exp.column(prefixes[n.table] + n.name)
        owners = [a for a, names in sides.items() if n.name in names]
        if len(owners) != 1:
            raise ExpressionError(text, f"column {n.name!r} is {'ambiguous' if owners else 'unknown'}; qualify it")
        return exp.column(prefixes[owners[0]] + n.name)

    return evaluate(parse(text).transform(rename).sql(dialect="spark"), table)
