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


class ExpressionError(InvalidProposalError):
    def __init__(self, text: str, problem: str) -> None:
        super().__init__("BAD_EXPRESSION", f"{problem} in {text!r}")


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


def _literal(node: exp.Expr, text: str) -> Any:
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
        v = _literal(node.this, text)
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
        values = [_literal(v, text) for v in node.expressions]
        col = to_arrow(node.this, schema, text)
        typ = schema.field(node.this.name).type if isinstance(node.this, exp.Column) else None
        return col.isin(pa.array(values, type=typ) if typ is not None else values)
    if isinstance(node, exp.Between):
        col = node.this
        return to_arrow(exp.GTE(this=col, expression=node.args["low"]), schema, text) & to_arrow(
            exp.LTE(this=col, expression=node.args["high"]), schema, text
        )
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        return to_arrow(node.this, schema, text).is_null()
    if isinstance(node, (exp.Literal, exp.Null, exp.Boolean, exp.Neg, exp.Cast)):
        return pc.scalar(_literal(node, text))
    raise ExpressionError(text, f"unsupported construct {node.key.upper()} ({node.sql()})")


def _operand(node: exp.Expr, schema: pa.Schema, text: str) -> Any:
    if isinstance(node, (exp.Literal, exp.Null, exp.Boolean, exp.Neg, exp.Cast)):
        return ("lit", _literal(node, text))
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
        return pa.array([_literal(node, text)] * table.num_rows)
    expr = to_arrow(node, table.schema, text)
    import pyarrow.dataset as ds

    return ds.dataset(table).to_table(columns={"v": expr}).column("v").combine_chunks()
