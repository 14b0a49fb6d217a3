"""Partition predicates: parse once with sqlglot, evaluate many times as closures.

A writer records what it read as SQL boolean expressions (`read_predicates`),
e.g. ``date > '2010-01-01' AND country IN ('US', 'DE')``. The conflict checker
asks one question of them: *could this transaction have read a file with these
partition values?* The answer follows Delta Spark's append check:

* Each top-level conjunct that references a column that is not a partition
  column is a *data* filter and is dropped (widened to TRUE), exactly as Delta
  splits a scan's filters into partition-only and data filters. ``part = 1 OR
  year > 2019`` is one conjunct that mentions a data column, so it is dropped
  whole. If no conjunct remains the predicate is TRUE and matches every file.
* Partition values are strings (or None) in ``AddFile.partitionValues``; they
  are typed with the partition column's type from the table schema (``'10' >
  '9'`` on an integer column is numeric; the rules are `types.py`'s). An empty
  string or None is NULL.
* Evaluation is SQL three-valued logic; a file matches only when the predicate
  is TRUE (NULL/unknown does not match).
* A partition value that cannot be parsed as its column type makes the
  predicate match (conservative: a possible conflict is reported rather than
  missed). Delta Spark would cast it to NULL (no match) or fail the query.
  This is the one pruning semantics: the writer's and the reader's pruning
  (`prune`) keep such a file too, so the writer reads what the coordinator
  guards and the reader never drops a file it cannot evaluate (reading it
  then fails naming the value, rather than returning fewer rows).
* Which conjuncts count is `syntax.is_partition_only`: column names match
  case-insensitively (Spark's default), a qualified column ``t.date`` is
  accepted, and a conjunct that mixes qualifiers (``s.date = t.date``, a MERGE
  join condition between source and target) is a data filter.

The writer prunes files with this same matcher before it scans them, so the
files a DELETE or UPDATE reads are never in a partition the coordinator's
append check would not guard; the reader prunes with it too.

Anything this module does not understand in a partition-only conjunct (a
function call, arithmetic, a subquery) raises ``InvalidProposalError`` with
reason ``BAD_PREDICATE``; nothing else escapes.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from sqlglot import exp

from deltacoord.schemas.actions import Metadata
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.expressions.syntax import (
    MAX_PREDICATE_CHARS,
    MAX_PREDICATES,
    MAX_TOTAL_PREDICATE_CHARS,
    ExpressionError,
    NotALiteral,
    cast_type,
    conjuncts,
    is_partition_only,
    literal,
    parse,
)
from deltacoord.schemas.expressions.types import (
    BOOL,
    DATE,
    FROM_TEXT,
    STR,
    TS,
    category_of,
    category_of_value,
    coerce_literal,
    parse_text,
)
from deltacoord.schemas.properties import PHYSICAL_NAME_KEY, Property, TableProperties
from deltacoord.schemas.reasons import ReasonCode

Row = tuple["str | None", ...]
_Eval = Callable[[Row], Any]
F = TypeVar("F")


# ---------------------------------------------------------------------------
# Partition schema
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionColumn:
    """One partition column: logical name, key used in partitionValues, Delta type."""

    name: str
    physical_name: str
    type_name: str  # Delta primitive type name, e.g. "integer", "date", "decimal(10,2)"

    @property
    def category(self) -> str:
        return category_of(self.type_name)


PartitionSchema = tuple[PartitionColumn, ...]


@lru_cache(maxsize=1024)
def _schema_from_parts(schema_string: str, partition_columns: tuple[str, ...], mapping_mode: str | None) -> PartitionSchema:
    if not partition_columns:
        return ()
    mapping_mode = TableProperties({Property.COLUMN_MAPPING_MODE: mapping_mode} if mapping_mode else None).column_mapping_mode
    try:
        schema = json.loads(schema_string)
        fields = schema["fields"]
        by_name = {f["name"]: f for f in fields}
        if not all(isinstance(k, str) and isinstance(f, dict) for k, f in by_name.items()):
            raise TypeError("field names must be strings and fields objects")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InvalidProposalError(ReasonCode.BAD_SCHEMA, f"schemaString is not a Delta struct type: {e}") from e
    lower = {k.lower(): v for k, v in by_name.items()}
    out: list[PartitionColumn] = []
    for col in partition_columns:
        field = by_name.get(col) or lower.get(col.lower())
        if field is None:
            raise InvalidProposalError(ReasonCode.BAD_SCHEMA, f"partition column {col!r} is not in the table schema")
        ftype = field.get("type")
        if not isinstance(ftype, str):
            raise InvalidProposalError(ReasonCode.BAD_SCHEMA, f"partition column {col!r} has a non-primitive type")
        physical = col
        if mapping_mode in ("name", "id"):
            meta = field.get("metadata") or {}
            physical = meta.get(PHYSICAL_NAME_KEY, col)
        out.append(PartitionColumn(name=col, physical_name=physical, type_name=ftype))
    return tuple(out)


def partition_schema(metadata: Metadata | None) -> PartitionSchema:
    """The partition schema of a table (empty when unpartitioned or unknown)."""
    if metadata is None or not metadata.partition_columns:
        return ()
    # The raw property, normalised inside the cached function: this runs several times per proposal.
    mode = metadata.configuration.get(Property.COLUMN_MAPPING_MODE)
    return _schema_from_parts(metadata.schema_string, tuple(metadata.partition_columns), mode)


def row_of(partition_values: Mapping[str, str | None] | None, schema: PartitionSchema) -> Row:
    """A file's partition values as a tuple in schema order (missing => None).

    Values are looked up by the column's physical name (its logical name unless
    column mapping is on), as Delta keys `partitionValues`.
    """
    if not schema:
        return ()
    if not partition_values:
        return (None,) * len(schema)
    get = partition_values.get
    if len(schema) == 1:
        return (get(schema[0].physical_name),)
    return tuple([get(c.physical_name) for c in schema])


def row_to_mapping(row: Row, schema: PartitionSchema) -> dict[str, str | None]:
    """Logical column name -> raw value, for `format_partition` hints."""
    return {c.name: v for c, v in zip(schema, row, strict=True)}



# ---------------------------------------------------------------------------
# Typed reading of raw partition strings
# ---------------------------------------------------------------------------


class _Unparsable(Exception):
    """A partition value that does not parse as its column type."""


_CACHE_LIMIT = 4_096


def _column_reader(index: int, type_name: str) -> _Eval:
    """Closure reading column `index` of a row as a typed value (None for NULL)."""
    if category_of(type_name) == STR:

        def read_str(row: Row) -> Any:
            return row[index] or None

        return read_str
    cache: dict[str, Any] = {}

    def read(row: Row) -> Any:
        raw = row[index]
        if not raw:
            return None
        v = cache.get(raw)
        if v is None:
            try:
                v = parse_text(raw, type_name)
            except (ValueError, ArithmeticError) as e:
                raise _Unparsable(raw) from e
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[raw] = v
        return v

    return read


# ---------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Val:
    """A compiled value expression."""

    cat: str | None  # None: the NULL literal
    fn: _Eval
    const: bool = False
    value: Any = None
    string_literal: bool = False  # an untyped string literal, coercible to the other side


def _const(cat: str | None, value: Any, string_literal: bool = False) -> _Val:
    return _Val(cat, lambda row: value, True, value, string_literal)


_CMP_OPS: dict[type[exp.Expr], Callable[[Any, Any], bool]] = {
    exp.EQ: operator.eq,
    exp.NEQ: operator.ne,
    exp.GT: operator.gt,
    exp.GTE: operator.ge,
    exp.LT: operator.lt,
    exp.LTE: operator.le,
}


class _Compiler:
    def __init__(self, text: str, schema: PartitionSchema) -> None:
        self.text = text
        self.schema = schema
        self.index = {c.name.lower(): i for i, c in enumerate(schema)}

    def bad(self, problem: str) -> ExpressionError:
        return _bad(self.text, problem)

    # -- boolean expressions -------------------------------------------------

    def boolean(self, node: exp.Expr) -> _Eval:
        if isinstance(node, exp.Paren):
            return self.boolean(node.this)
        if isinstance(node, exp.And):
            return _and(self.boolean(node.left), self.boolean(node.right))
        if isinstance(node, exp.Or):
            return _or(self.boolean(node.left), self.boolean(node.right))
        if isinstance(node, exp.Not):
            return _not(self.boolean(node.this))
        op = _CMP_OPS.get(type(node))
        if op is not None:
            return self.compare(op, self.value(node.this), self.value(node.expression))
        if isinstance(node, exp.NullSafeEQ):
            return self.null_safe_eq(self.value(node.left), self.value(node.right))
        if isinstance(node, exp.In):
            return self.in_list(node)
        if isinstance(node, exp.Between):
            v = self.value(node.this)
            lo = self.compare(operator.ge, v, self.value(node.args["low"]))
            hi = self.compare(operator.le, v, self.value(node.args["high"]))
            return _and(lo, hi)
        if isinstance(node, exp.Is):
            return self.is_test(node)
        if isinstance(node, (exp.Boolean, exp.Null, exp.Column, exp.Cast, exp.TryCast)):
            v = self.value(node)
            if v.cat not in (BOOL, None):
                raise self.bad(f"{node.sql(dialect='spark')!r} is not a boolean expression")
            return v.fn
        raise self.bad(f"unsupported construct {type(node).__name__} ({node.sql(dialect='spark')!r})")

    def is_test(self, node: exp.Is) -> _Eval:
        v = self.value(node.this)
        target = node.expression
        f = v.fn
        if isinstance(target, exp.Null):
            return lambda row: f(row) is None
        if isinstance(target, exp.Boolean):
            want = bool(target.this)
            return lambda row: f(row) is want
        raise self.bad(f"unsupported IS test {node.sql(dialect='spark')!r}")

    # -- values --------------------------------------------------------------

    def value(self, node: exp.Expr) -> _Val:
        if isinstance(node, exp.Paren):
            return self.value(node.this)
        if isinstance(node, exp.Column):
            i = self.index.get(node.name.lower())
            if i is None:  # cannot happen for partition-only conjuncts; kept for safety
                raise self.bad(f"column {node.name!r} is not a partition column")
            col = self.schema[i]
            return _Val(col.category, _column_reader(i, col.type_name))
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return self.cast(node)
        try:
            v = literal(node)
        except NotALiteral as e:
            if isinstance(node, (exp.Literal, exp.Neg, exp.Boolean, exp.Null)):
                raise self.bad(str(e)) from e
            raise self.bad(f"unsupported construct {type(node).__name__} ({node.sql(dialect='spark')!r})") from e
        if isinstance(node, exp.Literal) and node.is_string:
            return _const(STR, v, string_literal=True)
        return _const(category_of_value(v), v)

    def cast(self, node: exp.Cast) -> _Val:
        type_name = cast_type(node)
        if type_name is None:
            to = node.args.get("to")
            raise self.bad(f"unsupported cast target {to.sql(dialect='spark') if to else '?'}")
        cat = category_of(type_name)
        inner_node = node.this
        inner = self.value(inner_node)
        if inner.const:
            if inner.value is None:
                return _const(cat, None)
            raw = inner.value if isinstance(inner.value, str) else _literal_text(inner)
            try:
                return _const(cat, parse_text(raw, type_name) if cat != STR else raw)
            except (ValueError, ArithmeticError) as e:
                raise self.bad(f"cannot cast {raw!r} to {type_name}") from e
        if isinstance(inner_node, exp.Column):
            i = self.index[inner_node.name.lower()]
            return _Val(cat, _column_reader(i, type_name))
        raise self.bad(f"unsupported cast of {inner_node.sql(dialect='spark')!r}")

    # -- coercion and comparison ----------------------------------------------

    def coerce(self, a: _Val, b: _Val) -> tuple[_Val, _Val]:
        """Bring two values to one comparable category (`types.py`'s rules)."""
        if a.cat is None or b.cat is None or a.cat == b.cat:
            return a, b
        if a.string_literal:
            return self._literal_as(a, b.cat), b
        if b.string_literal:
            return a, self._literal_as(b, a.cat)
        cats = {a.cat, b.cat}
        if cats == {DATE, TS}:
            return (_promote_date(a) if a.cat == DATE else a), (_promote_date(b) if b.cat == DATE else b)
        # A string column against a typed value: Spark casts the string side (e.g. `country = 1`).
        if a.cat == STR and not a.const:
            return _cast_runtime(a, b.cat), b
        if b.cat == STR and not b.const:
            return a, _cast_runtime(b, a.cat)
        raise self.bad(f"cannot compare a {a.cat} value with a {b.cat} value")

    def _literal_as(self, lit: _Val, cat: str) -> _Val:
        try:
            return _const(cat, coerce_literal(lit.value, cat))
        except (ValueError, ArithmeticError) as e:
            raise self.bad(f"literal {lit.value!r} is not a valid {cat}") from e

    def compare(self, op: Callable[[Any, Any], bool], left: _Val, right: _Val) -> _Eval:
        a, b = self.coerce(left, right)
        if a.cat is None or b.cat is None:
            return lambda row: None
        if a.const and b.const:
            r = op(a.value, b.value)
            return lambda row: r
        fa, fb = a.fn, b.fn
        if b.const:
            c = b.value

            def cmp_right_const(row: Row) -> Any:
                v = fa(row)
                return None if v is None else op(v, c)

            return cmp_right_const
        if a.const:
            c = a.value

            def cmp_left_const(row: Row) -> Any:
                v = fb(row)
                return None if v is None else op(c, v)

            return cmp_left_const

        def cmp_both(row: Row) -> Any:
            x = fa(row)
            if x is None:
                return None
            y = fb(row)
            return None if y is None else op(x, y)

        return cmp_both

    def null_safe_eq(self, left: _Val, right: _Val) -> _Eval:
        a, b = self.coerce(left, right)
        fa, fb = a.fn, b.fn

        def nseq(row: Row) -> Any:
            x, y = fa(row), fb(row)
            if x is None or y is None:
                return x is None and y is None
            return x == y

        return nseq

    def in_list(self, node: exp.In) -> _Eval:
        if node.args.get("query") is not None or node.args.get("unnest") is not None:
            raise self.bad("IN with a subquery is not supported")
        v = self.value(node.this)
        values: list[Any] = []
        has_null = False
        for item in node.expressions:
            iv = self.value(item)
            if not iv.const:
                raise self.bad("IN list items must be literals")
            if iv.cat is None:
                has_null = True
                continue
            if v.cat is not None and iv.cat != v.cat:
                if iv.string_literal or (v.cat == TS and iv.cat == DATE):
                    iv = self._literal_as(iv, v.cat)
                else:
                    raise self.bad(f"IN list value {iv.value!r} ({iv.cat}) does not match the {v.cat} column")
            values.append(iv.value)
        if v.cat is None:
            return lambda row: None
        members = frozenset(values)
        f = v.fn

        def in_set(row: Row) -> Any:
            x = f(row)
            if x is None:
                return None
            if x in members:
                return True
            return None if has_null else False

        return in_set


def _literal_text(v: _Val) -> str:
    if v.cat == BOOL:
        return "true" if v.value else "false"
    return str(v.value)


def _cast_runtime(v: _Val, cat: str) -> _Val:
    """Convert a string-valued expression to `cat` per row (unparsable => conservative match)."""
    conv = FROM_TEXT[cat]
    f = v.fn

    def cast(row: Row) -> Any:
        x = f(row)
        if x is None:
            return None
        try:
            return conv(x)
        except (ValueError, ArithmeticError) as e:
            raise _Unparsable(x) from e

    return _Val(cat, cast)


def _promote_date(v: _Val) -> _Val:
    if v.const:
        return _const(TS, coerce_literal(v.value, TS))
    f = v.fn

    def as_ts(row: Row) -> Any:
        x = f(row)
        return None if x is None else coerce_literal(x, TS)

    return _Val(TS, as_ts)


def _and(a: _Eval, b: _Eval) -> _Eval:
    def f(row: Row) -> Any:
        x = a(row)
        if x is False:
            return False
        y = b(row)
        if y is False:
            return False
        if x is None or y is None:
            return None
        return True

    return f


def _or(a: _Eval, b: _Eval) -> _Eval:
    def f(row: Row) -> Any:
        x = a(row)
        if x is True:
            return True
        y = b(row)
        if y is True:
            return True
        if x is None or y is None:
            return None
        return False

    return f


def _not(a: _Eval) -> _Eval:
    def f(row: Row) -> Any:
        x = a(row)
        return None if x is None else not x

    return f


def _bad(text: str, problem: str) -> ExpressionError:
    return ExpressionError(text, problem, reason=ReasonCode.BAD_PREDICATE, what="read predicate")


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


class CompiledPredicate:
    """One read predicate, compiled for one partition schema.

    Call it with a partition row (see `row_of`); it returns True when the
    transaction could have read a file with those partition values.
    """

    __slots__ = ("_fn", "dropped_conjuncts", "matches_all", "text")

    def __init__(self, text: str, fn: _Eval | None, dropped_conjuncts: int) -> None:
        self.text = text
        self._fn = fn
        #: The predicate was widened to TRUE (no partition-only conjunct left).
        self.matches_all = fn is None
        self.dropped_conjuncts = dropped_conjuncts

    def __call__(self, row: Row) -> bool:
        fn = self._fn
        if fn is None:
            return True
        try:
            return fn(row) is True
        except _Unparsable:
            return True

    def __repr__(self) -> str:
        return f"CompiledPredicate({self.text!r}, matches_all={self.matches_all})"


@lru_cache(maxsize=1024)
def compile_predicate(text: str, schema: PartitionSchema) -> CompiledPredicate:
    """Compile `text` for `schema` (cached per (text, schema)).

    Raises InvalidProposalError("BAD_PREDICATE") for text that does not parse
    or a partition-only conjunct this module cannot evaluate.
    """
    node = parse(text, reason=ReasonCode.BAD_PREDICATE, what="read predicate")
    compiler = _Compiler(text, schema)
    names = [c.name for c in schema]
    kept: list[_Eval] = []
    dropped = 0
    try:
        for conj in conjuncts(node):
            if is_partition_only(conj, names):
                kept.append(compiler.boolean(conj))
            else:
                dropped += 1
    except RecursionError as e:
        raise _bad(text, "expression nested too deeply") from e
    if not kept:
        return CompiledPredicate(text, None, dropped)
    fn = kept[0]
    for k in kept[1:]:
        fn = _and(fn, k)
    return CompiledPredicate(text, fn, dropped)


class PartitionMatcher:
    """The union of a transaction's read predicates, with a per-row memo.

    A file conflicts when ANY read predicate matches it (Spark checks each
    recorded predicate separately). No predicates at all matches nothing.
    """

    __slots__ = ("_memo", "_preds", "matches_all", "matches_none")

    def __init__(self, predicates: Sequence[CompiledPredicate]) -> None:
        self.matches_all = any(p.matches_all for p in predicates)
        self._preds = tuple(p for p in predicates if not p.matches_all)
        self.matches_none = not self.matches_all and not self._preds
        self._memo: dict[Row, bool] = {}

    def __call__(self, row: Row) -> bool:
        if self.matches_all:
            return True
        hit = self._memo.get(row)
        if hit is None:
            hit = False
            for p in self._preds:
                if p(row):
                    hit = True
                    break
            self._memo[row] = hit
        return hit


def compile_read_predicates(texts: Sequence[str], schema: PartitionSchema) -> PartitionMatcher:
    """Compile every read predicate of a proposal (each cached) into one matcher."""
    return PartitionMatcher([compile_predicate(t, schema) for t in texts])


def matches(text: str, partition_values: Mapping[str, str | None], metadata: Metadata) -> bool:
    """Convenience: does predicate `text` match a file with `partition_values`?"""
    schema = partition_schema(metadata)
    return compile_predicate(text, schema)(row_of(partition_values, schema))


def prune(files: Sequence[F], where: str | None, metadata: Metadata,
          partition_values: Callable[[F], Mapping[str, str | None] | None]) -> list[F]:
    """The files whose partition a scan with condition `where` cannot skip, in order.

    This is the coordinator's append matching applied to existing files: a
    writer that prunes with it reads exactly the partitions a concurrent append
    into would conflict with, and a reader skips only files no row of which can
    match. A file whose partition value cannot be evaluated is kept. Raises
    BAD_PREDICATE for what the coordinator would refuse too.
    """
    if where is None or not files:
        return list(files)
    schema = partition_schema(metadata)
    pred = compile_predicate(where, schema)
    if pred.matches_all:
        return list(files)
    matcher = PartitionMatcher([pred])
    return [f for f in files if matcher(row_of(partition_values(f), schema))]


__all__ = [
    "MAX_PREDICATES",
    "MAX_PREDICATE_CHARS",
    "MAX_TOTAL_PREDICATE_CHARS",
    "CompiledPredicate",
    "PartitionColumn",
    "PartitionMatcher",
    "PartitionSchema",
    "Row",
    "compile_predicate",
    "compile_read_predicates",
    "matches",
    "partition_schema",
    "prune",
    "row_of",
    "row_to_mapping",
]
