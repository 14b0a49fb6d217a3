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
  '9'`` on an integer column is numeric). An empty string or None is NULL.
* Evaluation is SQL three-valued logic; a file matches only when the predicate
  is TRUE (NULL/unknown does not match).
* A partition value that cannot be parsed as its column type makes the
  predicate match (conservative: a possible conflict is reported rather than
  missed). Delta Spark would cast it to NULL (no match) or fail the query.
* Column names are matched case-insensitively (Spark's default). A qualified
  column ``t.date`` is accepted; a conjunct that mixes qualifiers (``s.date =
  t.date``, a MERGE join condition between source and target) is a data filter.

Anything this module does not understand in a partition-only conjunct (a
function call, arithmetic, a subquery) raises ``InvalidProposalError`` with
reason ``BAD_PREDICATE``; nothing else escapes.
"""

from __future__ import annotations

import datetime as _dt
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

import sqlglot
from sqlglot import exp

from schemas.actions import Metadata
from schemas.errors import InvalidProposalError
from schemas.properties import PHYSICAL_NAME_KEY, TableProperties
from schemas.reasons import ReasonCode

#: Longest predicate text accepted (a guard against pathological input).
#: Compiling is linear in the text (~0.1 s per 16 KB with sqlglot) and runs on the
#: single deciding thread, so predicates are bounded in size and count per proposal.
MAX_PREDICATE_CHARS = 16_384
MAX_PREDICATES = 64
MAX_TOTAL_PREDICATE_CHARS = 65_536
#: Parsing recurses per nesting level; an explicit bound keeps the outcome
#: deterministic instead of depending on how deep Python's stack already is.
MAX_PREDICATE_NESTING = 64
_NOT_TOKEN = re.compile(r"\bNOT\b", re.IGNORECASE)


def _nesting(text: str) -> int:
    """Deepest parenthesis nesting outside string literals, plus the count of NOTs."""
    depth = deepest = 0
    quote: str | None = None
    for ch in text:
        if quote is not None:
            if ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest + len(_NOT_TOKEN.findall(text))

Row = tuple["str | None", ...]
_Eval = Callable[[Row], Any]

# Value categories used for comparisons.
STR, NUM, DATE, TS, BOOL = "string", "numeric", "date", "timestamp", "boolean"

_INTEGRAL = frozenset({"byte", "short", "integer", "int", "long", "bigint", "tinyint", "smallint"})
_FLOATING = frozenset({"float", "double", "real"})
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()
_MICROS_PER_DAY = 86_400_000_000
_UTC = _dt.UTC


def _bad(text: str, problem: str) -> InvalidProposalError:
    shown = text if len(text) <= 200 else text[:200] + "..."
    return InvalidProposalError(ReasonCode.BAD_PREDICATE, f"read predicate {shown!r}: {problem}")


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
        return _category_of(self.type_name)


PartitionSchema = tuple[PartitionColumn, ...]


def _category_of(type_name: str) -> str:
    t = type_name.lower()
    if t in _INTEGRAL or t in _FLOATING or t.startswith("decimal"):
        return NUM
    if t == "date":
        return DATE
    if t in ("timestamp", "timestamp_ntz"):
        return TS
    if t == "boolean":
        return BOOL
    return STR  # string, binary and anything else compare as text


@lru_cache(maxsize=1024)
def _schema_from_parts(schema_string: str, partition_columns: tuple[str, ...], mapping_mode: str) -> PartitionSchema:
    if not partition_columns:
        return ()
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
    mode = TableProperties.of(metadata).column_mapping_mode
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
# Typed conversion of raw partition strings and literals
# ---------------------------------------------------------------------------


class _Unparsable(Exception):
    """A partition value that does not parse as its column type."""


def _to_num(s: str) -> int | float | Decimal:
    s = s.strip()
    try:
        return int(s)
    except ValueError:
        pass
    try:
        d = Decimal(s)
    except InvalidOperation:
        d = None
    if d is not None:
        if d.is_nan() or d.is_infinite():
            return float(d)
        if d == d.to_integral_value() and "e" not in s.lower() and "." not in s:
            return int(d)
        return d
    raise ValueError(f"not a number: {s!r}")


def _to_float(s: str) -> float:
    return float(s.strip())


def _to_date(s: str) -> int:
    s = s.strip()
    try:
        return _dt.date.fromisoformat(s[:10] if len(s) > 10 and s[10] in " T" else s).toordinal()
    except ValueError as e:
        raise ValueError(f"not a date: {s!r}") from e


def _to_ts(s: str) -> int:
    """Microseconds since the epoch; a value without a zone is taken as UTC."""
    s = s.strip()
    try:
        d = _dt.datetime.fromisoformat(s)
    except ValueError as e:
        raise ValueError(f"not a timestamp: {s!r}") from e
    if d.tzinfo is None:
        d = d.replace(tzinfo=_UTC)
    delta = d - _dt.datetime(1970, 1, 1, tzinfo=_UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _to_bool(s: str) -> bool:
    t = s.strip().lower()
    if t == "true":
        return True
    if t == "false":
        return False
    raise ValueError(f"not a boolean: {s!r}")


def _converter(type_name: str) -> Callable[[str], Any]:
    t = type_name.lower()
    if t in _INTEGRAL:
        return lambda s: int(s.strip())
    if t in _FLOATING:
        return _to_float
    if t.startswith("decimal"):
        return _to_num
    if t == "date":
        return _to_date
    if t in ("timestamp", "timestamp_ntz"):
        return _to_ts
    if t == "boolean":
        return _to_bool
    return str


_CATEGORY_CONVERTER: dict[str, Callable[[str], Any]] = {
    STR: str,
    NUM: _to_num,
    DATE: _to_date,
    TS: _to_ts,
    BOOL: _to_bool,
}

_CACHE_LIMIT = 4_096


def _column_reader(index: int, type_name: str) -> _Eval:
    """Closure reading column `index` of a row as a typed value (None for NULL)."""
    if _category_of(type_name) == STR:

        def read_str(row: Row) -> Any:
            return row[index] or None

        return read_str
    conv = _converter(type_name)
    cache: dict[str, Any] = {}

    def read(row: Row) -> Any:
        raw = row[index]
        if not raw:
            return None
        v = cache.get(raw)
        if v is None:
            try:
                v = conv(raw)
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


def _date_to_ts(v: int) -> int:
    return (v - _EPOCH_ORDINAL) * _MICROS_PER_DAY


_CMP_OPS: dict[type[exp.Expr], Callable[[Any, Any], bool]] = {
    exp.EQ: operator.eq,
    exp.NEQ: operator.ne,
    exp.GT: operator.gt,
    exp.GTE: operator.ge,
    exp.LT: operator.lt,
    exp.LTE: operator.le,
}

_CAST_TYPES: dict[str, str] = {
    "TEXT": "string",
    "VARCHAR": "string",
    "CHAR": "string",
    "NVARCHAR": "string",
    "INT": "integer",
    "BIGINT": "long",
    "SMALLINT": "short",
    "TINYINT": "byte",
    "DOUBLE": "double",
    "FLOAT": "float",
    "DECIMAL": "decimal",
    "DATE": "date",
    "TIMESTAMP": "timestamp",
    "TIMESTAMPTZ": "timestamp",
    "TIMESTAMPLTZ": "timestamp",
    "TIMESTAMPNTZ": "timestamp_ntz",
    "DATETIME": "timestamp",
    "BOOLEAN": "boolean",
}


class _Compiler:
    def __init__(self, text: str, schema: PartitionSchema) -> None:
        self.text = text
        self.schema = schema
        self.index = {c.name.lower(): i for i, c in enumerate(schema)}

    # -- classification ----------------------------------------------------

    def is_partition_only(self, node: exp.Expr) -> bool:
        """True if every column the conjunct names is a partition column (one qualifier at most)."""
        qualifiers: set[str] = set()
        for col in node.find_all(exp.Column):
            if col.name.lower() not in self.index:
                return False
            q = col.table
            if q:
                qualifiers.add(q.lower())
        return len(qualifiers) <= 1

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
                raise _bad(self.text, f"{node.sql(dialect='spark')!r} is not a boolean expression")
            return v.fn
        raise _bad(self.text, f"unsupported construct {type(node).__name__} ({node.sql(dialect='spark')!r})")

    def is_test(self, node: exp.Is) -> _Eval:
        v = self.value(node.this)
        target = node.expression
        f = v.fn
        if isinstance(target, exp.Null):
            return lambda row: f(row) is None
        if isinstance(target, exp.Boolean):
            want = bool(target.this)
            return lambda row: f(row) is want
        raise _bad(self.text, f"unsupported IS test {node.sql(dialect='spark')!r}")

    # -- values --------------------------------------------------------------

    def value(self, node: exp.Expr) -> _Val:
        if isinstance(node, exp.Paren):
            return self.value(node.this)
        if isinstance(node, exp.Column):
            i = self.index.get(node.name.lower())
            if i is None:  # cannot happen for partition-only conjuncts; kept for safety
                raise _bad(self.text, f"column {node.name!r} is not a partition column")
            col = self.schema[i]
            return _Val(col.category, _column_reader(i, col.type_name))
        if isinstance(node, exp.Literal):
            if node.is_string:
                return _const(STR, node.this, string_literal=True)
            try:
                return _const(NUM, _to_num(str(node.this)))
            except ValueError as e:
                raise _bad(self.text, f"bad number {node.this!r}") from e
        if isinstance(node, exp.Neg):
            inner = self.value(node.this)
            if inner.const and inner.cat == NUM:
                return _const(NUM, -inner.value)
            raise _bad(self.text, f"unsupported negation {node.sql(dialect='spark')!r}")
        if isinstance(node, exp.Boolean):
            return _const(BOOL, bool(node.this))
        if isinstance(node, exp.Null):
            return _const(None, None)
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return self.cast(node)
        raise _bad(self.text, f"unsupported construct {type(node).__name__} ({node.sql(dialect='spark')!r})")

    def cast(self, node: exp.Cast) -> _Val:
        to = node.args.get("to")
        dtype = to.this.name if isinstance(to, exp.DataType) else None
        type_name = _CAST_TYPES.get(dtype or "")
        if type_name is None:
            raise _bad(self.text, f"unsupported cast target {to.sql(dialect='spark') if to else '?'}")
        cat = _category_of(type_name)
        inner_node = node.this
        inner = self.value(inner_node)
        if inner.const:
            if inner.value is None:
                return _const(cat, None)
            raw = inner.value if isinstance(inner.value, str) else _literal_text(inner)
            try:
                return _const(cat, _converter(type_name)(raw) if cat != STR else raw)
            except (ValueError, ArithmeticError) as e:
                raise _bad(self.text, f"cannot cast {raw!r} to {type_name}") from e
        if isinstance(inner_node, exp.Column):
            i = self.index[inner_node.name.lower()]
            return _Val(cat, _column_reader(i, type_name))
        raise _bad(self.text, f"unsupported cast of {inner_node.sql(dialect='spark')!r}")

    # -- coercion and comparison ----------------------------------------------

    def coerce(self, a: _Val, b: _Val) -> tuple[_Val, _Val]:
        """Bring two values to one comparable category (Spark-like implicit casts)."""
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
        raise _bad(self.text, f"cannot compare a {a.cat} value with a {b.cat} value")

    def _literal_as(self, lit: _Val, cat: str) -> _Val:
        try:
            return _const(cat, _CATEGORY_CONVERTER[cat](lit.value))
        except (ValueError, ArithmeticError) as e:
            raise _bad(self.text, f"literal {lit.value!r} is not a valid {cat}") from e

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
            raise _bad(self.text, "IN with a subquery is not supported")
        v = self.value(node.this)
        values: list[Any] = []
        has_null = False
        for item in node.expressions:
            iv = self.value(item)
            if not iv.const:
                raise _bad(self.text, "IN list items must be literals")
            if iv.cat is None:
                has_null = True
                continue
            if v.cat is not None and iv.cat != v.cat:
                if iv.string_literal:
                    iv = self._literal_as(iv, v.cat)
                elif v.cat == TS and iv.cat == DATE:
                    iv = _promote_date(iv)
                else:
                    raise _bad(self.text, f"IN list value {iv.value!r} ({iv.cat}) does not match the {v.cat} column")
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
    conv = _CATEGORY_CONVERTER[cat]
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
        return _const(TS, None if v.value is None else _date_to_ts(v.value))
    f = v.fn

    def as_ts(row: Row) -> Any:
        x = f(row)
        return None if x is None else _date_to_ts(x)

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


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


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


def _parse(text: str) -> exp.Expr:
    if not isinstance(text, str) or not text.strip():
        raise _bad(str(text), "empty predicate")
    if len(text) > MAX_PREDICATE_CHARS:
        raise _bad(text, f"longer than {MAX_PREDICATE_CHARS} characters")
    if _nesting(text) > MAX_PREDICATE_NESTING:
        raise _bad(text, f"nests deeper than {MAX_PREDICATE_NESTING} levels")
    try:
        parsed = sqlglot.parse(text, read="spark")
    except Exception as e:  # sqlglot raises ParseError, TokenError and others
        raise _bad(text, f"does not parse: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    if len(parsed) != 1 or parsed[0] is None:
        raise _bad(text, "must be exactly one expression")
    node = parsed[0]
    if isinstance(node, (exp.Query, exp.Block, exp.Command, exp.DDL, exp.DML)):
        raise _bad(text, f"is a statement ({type(node).__name__}), not a boolean expression")
    return node


@lru_cache(maxsize=1024)
def compile_predicate(text: str, schema: PartitionSchema) -> CompiledPredicate:
    """Compile `text` for `schema` (cached per (text, schema)).

    Raises InvalidProposalError(ReasonCode.BAD_PREDICATE) for text that does not parse
    or a partition-only conjunct this module cannot evaluate.
    """
    node = _parse(text)
    compiler = _Compiler(text, schema)
    kept: list[_Eval] = []
    dropped = 0
    try:
        for conj in _conjuncts(node):
            if compiler.is_partition_only(conj):
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
