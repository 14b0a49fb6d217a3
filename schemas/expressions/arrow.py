"""SQL expressions as Arrow compute expressions: a writer's WHERE and SET, MERGE conditions, reader filters.

Parsed by `syntax.parse`, typed by `types.py`'s rules, and translated into
`pyarrow.compute` expressions, so rows are filtered and computed by Arrow's
kernels. A literal compared with a column becomes a value of the column's
type (`d > '2024-01-01'` on a date column compares dates); a string column
compared with a typed value is cast to that type (Spark's rule). Column names
resolve case-insensitively when they are not exact.

Filters given as DNF tuples (`[("p", "=", "a")]`, the form delta-rs and
pyarrow take) are turned into the same SQL trees first; `implied` finds the
part of a filter over partition columns alone, which the reader prunes files
with through `partitions.prune` (one pruning semantics for reader, writer and
coordinator).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from deltacoord.schemas.expressions.syntax import (
    ExpressionError,
    NotALiteral,
    cast_type,
    columns_of,
    conjuncts,
    literal,
    literal_node,
    parse,
    unparen,
)
from deltacoord.schemas.expressions.types import BOOL, DATE, NUM, STR, TS, category_of_value, coerce_literal

FilterTuple: TypeAlias = tuple[str, str, Any]
#: A SQL condition, or DNF tuples: one list ANDed, or a list of such lists ORed.
Filter: TypeAlias = str | Sequence[FilterTuple] | Sequence[Sequence[FilterTuple]]

_LITERALS = (exp.Literal, exp.Null, exp.Boolean, exp.Neg, exp.Cast, exp.TryCast)


def _is_literal(node: exp.Expr) -> bool:
    """A literal, a negated one or a CAST of one (a CAST of a column is a value, not a literal)."""
    return isinstance(unparen(node), _LITERALS) and node.find(exp.Column) is None
_CMP: dict[type[exp.Expr], str] = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.GT: "greater", exp.GTE: "greater_equal", exp.LT: "less",
        exp.LTE: "less_equal"}
_ARITH = {exp.Add: "add", exp.Sub: "subtract", exp.Mul: "multiply", exp.Div: "divide"}
_TUPLE_OPS: dict[str, type[exp.Expr]] = {"=": exp.EQ, "==": exp.EQ, "!=": exp.NEQ, "<>": exp.NEQ, "<": exp.LT,
                                         "<=": exp.LTE, ">": exp.GT, ">=": exp.GTE}


def category_of_arrow(t: pa.DataType) -> str:
    """The `types.py` category of an Arrow type."""
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return NUM
    if pa.types.is_date(t):
        return DATE
    if pa.types.is_timestamp(t):
        return TS
    if pa.types.is_boolean(t):
        return BOOL
    return STR


#: CAST targets (Delta type names, `syntax.CAST_TYPES`) as Arrow types.
_ARROW_OF_CAST = {"string": pa.string(), "integer": pa.int32(), "long": pa.int64(), "short": pa.int16(), "byte": pa.int8(),
                  "double": pa.float64(), "float": pa.float32(), "date": pa.date32(), "boolean": pa.bool_(),
                  "timestamp": pa.timestamp("us", tz="UTC")}

#: The Arrow type a string column is cast to when compared with a value of a category.
_CAST_TARGET = {NUM: pa.float64(), DATE: pa.date32(), TS: pa.timestamp("us", tz="UTC"), BOOL: pa.bool_()}


def resolve_column(schema: pa.Schema, name: str, text: str) -> str:
    """The schema's name for a column: exact, else the one that matches ignoring case."""
    if schema.get_field_index(name) >= 0:
        return name
    lowered = [n for n in schema.names if n.lower() == name.lower()]
    if len(lowered) != 1:
        raise ExpressionError(text, f"unknown column {name!r}" if not lowered else f"ambiguous column {name!r}")
    return str(lowered[0])


def _scalar(value: Any, t: pa.DataType | None) -> pa.Scalar:
    """`value` as an Arrow scalar of type `t` when it is one, else as what Arrow infers."""
    if t is None:
        return pa.scalar(value)
    try:
        return pa.scalar(value, type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError, OverflowError):
        pass
    try:
        return pa.scalar(value).cast(t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pa.scalar(value)


class _Translator:
    def __init__(self, schema: pa.Schema, text: str) -> None:
        self.schema = schema
        self.text = text

    def bad(self, problem: str) -> ExpressionError:
        return ExpressionError(self.text, problem)

    def literal(self, node: exp.Expr) -> Any:
        try:
            return literal(node)
        except NotALiteral as e:
            raise self.bad(str(e)) from e

    def column(self, node: exp.Column) -> tuple[pc.Expression, pa.DataType]:
        name = resolve_column(self.schema, node.name, self.text)
        return pc.field(name), self.schema.field(name).type

    def typed_of(self, node: exp.Expr) -> pa.DataType | None:
        """The Arrow type of a column reference (None for anything else)."""
        node = unparen(node)
        return self.column(node)[1] if isinstance(node, exp.Column) else None

    def literal_for(self, value: Any, t: pa.DataType | None) -> pc.Expression:
        """A literal as a value of the column type `t` it meets (types.py's coercion)."""
        if t is None or value is None:
            return pc.scalar(_scalar(value, t))
        cat = category_of_arrow(t)
        try:
            v = coerce_literal(value, cat)
        except (ValueError, ArithmeticError) as e:
            raise self.bad(f"literal {value!r} is not a valid {cat} for a {t} column") from e
        if isinstance(v, Decimal) and not pa.types.is_decimal(t):
            v = float(v)
        return pc.scalar(_scalar(v, t))

    def category(self, node: exp.Expr) -> str | None:
        """The value category of a column, a column arithmetic or a comparison (None: a literal or unknown)."""
        node = unparen(node)
        if isinstance(node, exp.Column):
            return category_of_arrow(self.column(node)[1])
        if isinstance(node, tuple(_ARITH)):
            return NUM
        if isinstance(node, (exp.And, exp.Or, exp.Not, exp.In, exp.Between, exp.Is, *_CMP)):
            return BOOL
        return None

    def mismatch(self, node: exp.Expr, problem: str, kind: str = "BINARY_OP_DIFF_TYPES") -> ExpressionError:
        """Spark's DATATYPE_MISMATCH, naming the sub-expression, the operand types and the way out."""
        return self.bad(f"[DATATYPE_MISMATCH.{kind}] cannot resolve {node.sql(dialect='spark')!r}: {problem}")

    def _describe(self, node: exp.Expr) -> str:
        node = unparen(node)
        if isinstance(node, exp.Column):
            return f"{node.sql(dialect='spark')} ({_type_name(self.column(node)[1])})"
        return f"{node.sql(dialect='spark')} ({self.category(node)})"

    def check_operands(self, node: exp.Expr, left: exp.Expr, right: exp.Expr, arithmetic: bool) -> None:
        """Refuse operands Spark would refuse (or silently cast away) before Arrow meets them."""
        lc, rc = self.category(left), self.category(right)
        if arithmetic:
            for side, c in ((left, lc), (right, rc)):
                if c not in (None, NUM):
                    raise self.mismatch(node, f"the operator needs numeric operands, but {self._describe(side)} is not "
                                              "numeric", "BINARY_OP_WRONG_TYPE")
            return
        if lc is not None and rc is not None and lc != rc:
            raise self.mismatch(node, f"{self._describe(left)} and {self._describe(right)} have incompatible types; "
                                      "compare values of one type")

    def operands(self, left: exp.Expr, right: exp.Expr) -> tuple[pc.Expression, pc.Expression]:
        """Both sides of a comparison or an arithmetic operation, brought to comparable types."""
        lt, rt = self.typed_of(left), self.typed_of(right)
        l_lit, r_lit = _is_literal(left), _is_literal(right)
        if l_lit and r_lit:
            return pc.scalar(self.literal(left)), pc.scalar(self.literal(right))
        if r_lit:
            return self.value(left), self._against(self.literal(right), lt, left)
        if l_lit:
            return self._against(self.literal(left), rt, right), self.value(right)
        return self.value(left), self.value(right)

    def _against(self, value: Any, t: pa.DataType | None, other: exp.Expr) -> pc.Expression:
        if t is not None and category_of_arrow(t) == STR and category_of_value(value) not in (STR, None):
            return pc.scalar(value)  # the string column is cast instead (see `value_as`)
        return self.literal_for(value, t)

    def value(self, node: exp.Expr) -> pc.Expression:
        node = unparen(node)
        if isinstance(node, exp.Column):
            return self.column(node)[0]
        if isinstance(node, (exp.Cast, exp.TryCast)) and self._has_column(node):
            return self.cast(node)
        if isinstance(node, exp.Neg) and self._has_column(node):
            return pc.negate(self.value(node.this))
        if isinstance(node, exp.Func) and not isinstance(node, exp.Cast | exp.TryCast):
            fn = self.function(node)
            if fn is not None:
                return fn
        if isinstance(node, _LITERALS):
            return pc.scalar(self.literal(node))
        for cls, fn in _ARITH.items():
            if isinstance(node, cls):
                assert isinstance(node, exp.Binary)
                self.check_operands(node, node.left, node.right, arithmetic=True)
                a, b = self.operands(node.left, node.right)
                return getattr(pc, fn)(a, b)
        return self.boolean(node)

    @staticmethod
    def _has_column(node: exp.Expr) -> bool:
        return node.find(exp.Column) is not None

    def cast(self, node: exp.Cast) -> pc.Expression:
        """CAST(<column expression> AS <type>) for the primitive types Delta's generated columns use."""
        target = _ARROW_OF_CAST.get(cast_type(node) or "")
        if target is None:
            raise self.bad(f"unsupported CAST target in {node.sql(dialect='spark')}")
        return self.value(node.this).cast(target)

    def _date_part(self, node: exp.Expr) -> pc.Expression:
        """The argument of year()/month()/day(): a date or timestamp (a string is read as a date, as Spark)."""
        inner = unparen(node)
        if isinstance(inner, exp.TsOrDsToDate):
            inner = unparen(inner.this)
        t = self.typed_of(inner)
        value = self.value(inner)
        return value.cast(pa.date32()) if t is not None and category_of_arrow(t) == STR else value

    def function(self, node: exp.Func) -> pc.Expression | None:
        """The SQL functions CHECK constraints and generation expressions commonly use, on Arrow kernels."""
        if isinstance(node, exp.Upper):
            return pc.utf8_upper(self.value(node.this))
        if isinstance(node, exp.Lower):
            return pc.utf8_lower(self.value(node.this))
        if isinstance(node, exp.Length):
            return pc.utf8_length(self.value(node.this)).cast(pa.int32())
        if isinstance(node, exp.Trim) and not node.args.get("expression") and not node.args.get("position"):
            return pc.utf8_trim_whitespace(self.value(node.this))
        if isinstance(node, exp.Abs):
            return pc.abs(self.value(node.this))
        if isinstance(node, exp.Concat):
            return pc.binary_join_element_wise(*(self.value(a).cast(pa.string()) for a in node.expressions), pc.scalar(""))
        if isinstance(node, exp.Coalesce):
            args = [node.this, *node.expressions]
            t = next((x for x in (self.typed_of(a) for a in args) if x is not None), None)
            return pc.coalesce(*(self.literal_for(self.literal(a), t) if _is_literal(a)
                                 else self.value(a) for a in args))
        if isinstance(node, exp.Substring):
            start, length = node.args.get("start"), node.args.get("length")
            first = int(self.literal(start)) if start is not None else 1
            if first < 1:
                raise self.bad("substring positions below 1 are not supported")
            stop = None if length is None else first - 1 + int(self.literal(length))
            return pc.utf8_slice_codeunits(self.value(node.this), first - 1, stop)
        for cls, fn in ((exp.Year, pc.year), (exp.Month, pc.month), (exp.Day, pc.day)):
            if isinstance(node, cls):
                return fn(self._date_part(node.this)).cast(pa.int32())
        if isinstance(node, exp.Hour):
            return pc.hour(self.value(node.this)).cast(pa.int32())
        if isinstance(node, exp.Case):
            out: pc.Expression = pc.scalar(None) if node.args.get("default") is None else self.value(node.args["default"])
            for branch in reversed(node.args.get("ifs") or []):
                out = pc.if_else(pc.coalesce(self.boolean(branch.this), pc.scalar(False)), self.value(branch.args["true"]), out)
            return out
        return None

    def compare(self, fn: str, left: exp.Expr, right: exp.Expr) -> pc.Expression:
        a, b = self.operands(left, right)
        a, b = self._cast_string_column(left, right, a), self._cast_string_column(right, left, b)
        return getattr(pc, fn)(a, b)

    def _cast_string_column(self, node: exp.Expr, other: exp.Expr, expr: pc.Expression) -> pc.Expression:
        """A string column compared with a typed literal is cast to the literal's type (Spark)."""
        t = self.typed_of(node)
        o = unparen(other)
        if t is None or category_of_arrow(t) != STR or not _is_literal(o):
            return expr
        cat = category_of_value(self.literal(o))
        if cat in (STR, None):
            return expr
        return expr.cast(_CAST_TARGET[cat])

    def boolean(self, node: exp.Expr) -> pc.Expression:
        node = unparen(node)
        if isinstance(node, exp.And):
            return self.boolean(node.left) & self.boolean(node.right)
        if isinstance(node, exp.Or):
            return self.boolean(node.left) | self.boolean(node.right)
        if isinstance(node, exp.Not):
            return ~self.boolean(node.this)
        if isinstance(node, exp.Like) and isinstance(unparen(node.expression), exp.Literal):
            return pc.match_like(self.value(node.this), pattern=str(self.literal(node.expression)))
        if isinstance(node, exp.NullSafeEQ):
            a, b = self.operands(node.left, node.right)
            return pc.if_else(a.is_null() | b.is_null(), a.is_null() & b.is_null(), pc.equal(a, b))
        fn = _CMP.get(type(node))
        if fn is not None:
            assert isinstance(node, exp.Binary)
            self.check_operands(node, node.left, node.right, arithmetic=False)
            return self.compare(fn, node.left, node.right)
        if isinstance(node, exp.In):
            if node.args.get("query") is not None:
                raise self.bad("IN with a subquery is not supported")
            return self.in_list(node)
        if isinstance(node, exp.Between):
            low = self.compare("greater_equal", node.this, node.args["low"])
            high = self.compare("less_equal", node.this, node.args["high"])
            return low & high
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            return self.value(node.this).is_null()
        if isinstance(node, (exp.Column, *_LITERALS)):
            return self.value(node)
        fn = self.function(node) if isinstance(node, exp.Func) else None
        if fn is not None:
            return fn
        raise self.bad(f"unsupported construct {node.key.upper()} ({node.sql(dialect='spark')})")

    def in_list(self, node: exp.In) -> pc.Expression:
        """SQL's IN: NULL when the value is NULL, or when it is not found and the list holds a NULL."""
        col = self.value(node.this)
        values = [self.literal(v) for v in node.expressions]
        present = [v for v in values if v is not None]
        unknown = pc.scalar(pa.scalar(None, pa.bool_()))
        found = pc.if_else(col.is_null(), unknown, col.isin(self._in_values(present, self.typed_of(node.this))))
        return pc.if_else(found, True, unknown) if len(present) < len(values) else found

    def _in_values(self, values: list[Any], t: pa.DataType | None) -> pa.Array:
        """IN-list literals as the column's type (strings cast as Spark casts them: '2024-01-01' to a date)."""
        if t is None:
            return pa.array(values)
        cat = category_of_arrow(t)
        try:
            typed = [coerce_literal(v, cat) for v in values]
        except (ValueError, ArithmeticError) as e:
            raise self.bad(f"IN values {values!r} are not of the column's type {t}: {e}") from e
        typed = [float(v) if isinstance(v, Decimal) and not pa.types.is_decimal(t) else v for v in typed]
        try:
            return pa.array(typed, type=t)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
            raise self.bad(f"IN values {values!r} are not of the column's type {t}: {e}") from e


def _type_name(t: pa.DataType) -> str:
    """An Arrow type as Spark names it in messages (bigint, string, date, ...)."""
    names = {pa.int64(): "bigint", pa.int32(): "int", pa.int16(): "smallint", pa.int8(): "tinyint", pa.float64(): "double",
             pa.float32(): "float", pa.string(): "string", pa.large_string(): "string", pa.bool_(): "boolean",
             pa.date32(): "date", pa.binary(): "binary"}
    if t in names:
        return names[t]
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    return str(t)


@contextmanager
def evaluating(text: str) -> Iterator[None]:
    """Arrow's errors while evaluating `text` over rows, as an ExpressionError naming the expression: a value
    that does not cast (a string column compared with a number) is Spark's CAST_INVALID_INPUT."""
    try:
        yield
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExpressionError(text, f"[CAST_INVALID_INPUT] cannot be evaluated over the rows: {first}") from e


def to_arrow(node: exp.Expr, schema: pa.Schema, text: str) -> Any:
    """Translate a parsed SQL expression into a pyarrow.compute Expression over `schema`."""
    return _Translator(schema, text).value(node)


def compile_filter(text: str, schema: pa.Schema) -> Any:
    """A WHERE condition as an Arrow expression over `schema`."""
    return to_arrow(parse(text), schema, text)


def evaluate(text: str, table: pa.Table) -> pa.Array:
    """Evaluate a SQL value expression (an UPDATE's SET value) over a table."""
    node = parse(text)
    if _is_literal(node):
        return pa.array([_Translator(table.schema, text).literal(node)] * table.num_rows)
    expr = to_arrow(node, table.schema, text)
    import pyarrow.dataset as ds  # here: the module costs memory the checkpoint process does not need

    with evaluating(text):
        return ds.dataset(table).to_table(columns={"v": expr}).column("v").combine_chunks()


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


# -- filters given as a SQL string or as DNF tuples (the reader's `filter=`) --------------------------


def filter_tree(flt: Filter) -> exp.Expr:
    """A filter as a SQL tree: parsed text, or DNF tuples `(column, op, value)` turned into SQL."""
    if isinstance(flt, str):
        return parse(flt)
    if not flt:
        return exp.Boolean(this=True)
    groups: list[Sequence[FilterTuple]] = list(flt) if isinstance(flt[0], list) else [flt]  # type: ignore[arg-type, list-item]
    ors: list[exp.Expr] = []
    for group in groups:
        ands: list[exp.Expr] = []
        for item in group:
            if len(item) != 3:
                raise ValueError(f"a filter predicate is (column, op, value), got {item!r}")
            col, op, value = item
            column = exp.column(str(col), quoted=True)
            op_l = str(op).lower().strip()
            if op_l in _TUPLE_OPS:
                ands.append(_TUPLE_OPS[op_l](this=column, expression=literal_node(value)))
            elif op_l in ("in", "not in"):
                # As pyarrow's and delta-rs's `filters`: a NULL value is "not in" any list
                # (and "in" one that holds None), where SQL would say NULL.
                values = list(value)
                member = exp.In(this=column, expressions=[literal_node(v) for v in values if v is not None])
                is_null = exp.Is(this=column.copy(), expression=exp.Null())
                with_none = any(v is None for v in values)
                if op_l == "in":
                    ands.append(exp.or_(member, is_null) if with_none else member)
                else:
                    ands.append(exp.and_(exp.Not(this=member), exp.Not(this=is_null)) if with_none
                                else exp.or_(exp.Not(this=member), is_null))
            elif op_l in ("is", "is not") and value is None:
                test = exp.Is(this=column, expression=exp.Null())
                ands.append(exp.Not(this=test) if op_l == "is not" else test)
            else:
                raise ValueError(f"unsupported filter operator {op!r}")
        ors.append(exp.and_(*ands) if ands else exp.Boolean(this=True))
    return exp.or_(*ors) if len(ors) > 1 else ors[0]


def filter_text(flt: Filter) -> str:
    return flt if isinstance(flt, str) else filter_tree(flt).sql(dialect="spark")


def implied(node: exp.Expr, columns: Collection[str]) -> exp.Expr | None:
    """A condition over `columns` only that is TRUE whenever `node` is (None: there is none), for pruning
    (with `partitions.prune`: a file whose partition value cannot be evaluated is kept)."""
    allowed = {c.lower() for c in columns}
    node = unparen(node)
    if {c.lower() for c in columns_of(node)} <= allowed:
        return node
    if isinstance(node, exp.And):
        parts = [p for p in (implied(c, columns) for c in conjuncts(node)) if p is not None]
        return exp.and_(*parts) if parts else None
    if isinstance(node, exp.Or):
        left, right = implied(node.left, columns), implied(node.right, columns)
        return None if left is None or right is None else exp.or_(left, right)
    return None


__all__ = [
    "Filter",
    "FilterTuple",
    "category_of_arrow",
    "compile_filter",
    "evaluate",
    "evaluate_qualified",
    "evaluating",
    "filter_text",
    "filter_tree",
    "implied",
    "resolve_column",
    "to_arrow",
]

