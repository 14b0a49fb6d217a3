"""The one SQL parser (sqlglot, Spark dialect) and what every evaluator reads from its trees.

`parse` bounds the text (length, nesting) before sqlglot sees it, since
predicates come from writers and are compiled on the coordinator's single
deciding thread, and refuses statements. `literal` is the one reading of a
SQL literal as a Python value; `is_partition_only` the one rule for which
conjuncts may prune files by partition (every evaluator uses the same, so the
writer's pruning and the coordinator's matching cannot disagree);
`is_simple_condition` the one rule for which conditions keep row-level
concurrency.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Collection, Sequence
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp

from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.expressions.types import number
from deltacoord.schemas.reasons import ReasonCode

#: Longest expression text accepted (a guard against pathological input).
#: Compiling is linear in the text (~0.1 s per 16 KB with sqlglot) and runs on the
#: single deciding thread, so predicates are bounded in size and count per proposal.
MAX_PREDICATE_CHARS = 16_384
MAX_PREDICATES = 64
MAX_TOTAL_PREDICATE_CHARS = 65_536
#: Parsing recurses per nesting level; an explicit bound keeps the outcome
#: deterministic instead of depending on how deep Python's stack already is.
MAX_PREDICATE_NESTING = 64
_NOT_TOKEN = re.compile(r"\bNOT\b", re.IGNORECASE)
#: Terminal escape sequences (sqlglot underlines the offending token): never in a message.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class ExpressionError(InvalidProposalError, ValueError):
    """SQL text this engine cannot parse or evaluate; the message names the text and the problem.

    `reason` is BAD_PREDICATE for a proposal's read predicate (the coordinator
    rejects the proposal), BAD_EXPRESSION for a writer's or reader's expression.
    """

    def __init__(self, text: str, problem: str, *, reason: ReasonCode = ReasonCode.BAD_EXPRESSION,
                 what: str = "expression") -> None:
        shown = text if len(text) <= 200 else text[:200] + "..."
        self.text = text
        super().__init__(reason, f"{what} {shown!r}: {problem}")


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


#: sqlglot's node classes, as the SQL a user wrote.
_OPERATORS = {"EQ": "=", "NEQ": "<>", "NullSafeEQ": "<=>", "GT": ">", "GTE": ">=", "LT": "<", "LTE": "<=",
              "And": "AND", "Or": "OR", "Not": "NOT", "Like": "LIKE", "ILike": "ILIKE", "In": "IN", "Is": "IS",
              "Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Mod": "%", "Between": "BETWEEN", "DPipe": "||"}
_MISSING = re.compile(r"Required keyword: '(?P<part>\w+)' missing for <class '[\w.]*\.(?P<node>\w+)'>\.?"
                      r"(?: Line (?P<line>\d+), Col: (?P<col>\d+)\.?)?")


def _plain(message: str) -> str:
    """sqlglot's message in the words of the SQL written: 'Required keyword: 'expression' missing for
    <class 'sqlglot.expressions.core.EQ'>' names a class of the parser, not what is wrong."""
    m = _MISSING.search(message)
    if m is None:
        return message
    op = _OPERATORS.get(m["node"], m["node"].upper())
    where = f" (column {m['col']})" if m["col"] else ""
    if m["node"] == "Between":
        return f"BETWEEN needs both bounds: x BETWEEN low AND high{where}"
    return f"{op} has nothing after it{where}: give the value or expression it applies to"


def _refused_unparsed(text: str, reason: ReasonCode = ReasonCode.BAD_EXPRESSION,
                      what: str = "expression") -> ExpressionError | None:
    """Why `text` is refused before sqlglot sees it (empty, too long, nested too deep), or None."""
    if not isinstance(text, str) or not text.strip():
        return ExpressionError(str(text), "empty predicate" if reason is ReasonCode.BAD_PREDICATE else "empty expression",
                               reason=reason, what=what)
    if len(text) > MAX_PREDICATE_CHARS:
        return ExpressionError(text, f"longer than {MAX_PREDICATE_CHARS} characters", reason=reason, what=what)
    if _nesting(text) > MAX_PREDICATE_NESTING:
        return ExpressionError(text, f"nests deeper than {MAX_PREDICATE_NESTING} levels", reason=reason, what=what)
    return None


def read_predicates_problem(texts: Sequence[str]) -> str | None:
    """Why a proposal's read predicates are refused as a whole (too many, too long in all), or None."""
    if len(texts) > MAX_PREDICATES:
        return f"{len(texts)} read predicates; at most {MAX_PREDICATES} are accepted"
    if sum(len(t) for t in texts) > MAX_TOTAL_PREDICATE_CHARS:
        return f"read predicates longer than {MAX_TOTAL_PREDICATE_CHARS} characters in total"
    return None


def parsed_chars(texts: Sequence[str]) -> int:
    """How many characters of a proposal's read predicates sqlglot would parse (the costly part of deciding them, about
    0.1 s per 16 KB) before the rules accept or refuse them: none when they are refused as a whole, and none from the
    first one refused unparsed on (the rules compile them in order and stop at the first refused)."""
    if read_predicates_problem(texts) is not None:
        return 0
    n = 0
    for text in texts:
        if _refused_unparsed(text) is not None:
            break
        n += len(text)
    return n


def parse(text: str, *, reason: ReasonCode = ReasonCode.BAD_EXPRESSION, what: str = "expression") -> exp.Expr:
    """One SQL expression (Spark dialect), or ExpressionError saying why not."""
    refused = _refused_unparsed(text, reason, what)
    if refused is not None:
        raise refused
    try:
        parsed = sqlglot.parse(text, read="spark")
    except Exception as e:  # sqlglot raises ParseError, TokenError and others
        first = _ANSI.sub("", str(e).splitlines()[0]) if str(e) else type(e).__name__
        raise ExpressionError(text, f"does not parse: {_plain(first)}", reason=reason, what=what) from e
    if len(parsed) != 1 or parsed[0] is None:
        raise ExpressionError(text, "must be exactly one expression", reason=reason, what=what)
    node = parsed[0]
    if isinstance(node, (exp.Query, exp.Block, exp.Command, exp.DDL, exp.DML)):
        raise ExpressionError(text, f"is a statement ({type(node).__name__}), not a boolean expression", reason=reason, what=what)
    return node


def unparen(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def conjuncts(node: exp.Expr) -> list[exp.Expr]:
    """The top-level AND terms."""
    node = unparen(node)
    if isinstance(node, exp.And):
        return conjuncts(node.left) + conjuncts(node.right)
    return [node]


def columns_of(node: exp.Expr) -> set[str]:
    """The column names an expression mentions (unqualified, as written)."""
    return {c.name for c in node.find_all(exp.Column)}


def is_partition_only(node: exp.Expr, partition_columns: Collection[str]) -> bool:
    """True if every column a conjunct names is a partition column (case-insensitive, one qualifier at most).

    A conjunct naming no column at all is a constant and counts as partition-only.
    A MERGE join condition (`s.date = t.date`) mixes qualifiers and is a data filter.
    """
    names = {c.lower() for c in partition_columns}
    qualifiers: set[str] = set()
    for col in node.find_all(exp.Column):
        if col.name.lower() not in names:
            return False
        if col.table:
            qualifiers.add(col.table.lower())
    return len(qualifiers) <= 1


#: The constructs a *simple* condition is made of: columns, literals, comparisons, boolean logic, IN lists,
#: BETWEEN, IS NULL, arithmetic and casts. Anything else (a function, a subquery) makes it complex.
SIMPLE_NODES: tuple[type[exp.Expr], ...] = (
    exp.Column, exp.Identifier, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Neg, exp.Not, exp.And, exp.Or,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.In, exp.Between, exp.Is, exp.Add, exp.Sub, exp.Mul,
    exp.Div, exp.Cast, exp.TryCast, exp.DataType,
)


def is_simple_condition(text: str, columns: Collection[str]) -> bool:
    """Whether `text` is a simple condition on `columns` (unqualified, case-insensitive): only `SIMPLE_NODES`,
    no subquery. Row-level concurrency holds only for such conditions: a complex one (a function, possibly
    non-deterministic, a subquery, a nested field) may select other rows once other rows change."""
    names = {c.lower() for c in columns}
    try:
        node = parse(text)
    except ExpressionError:
        return False
    for n in node.walk():
        if not isinstance(n, SIMPLE_NODES) or (isinstance(n, exp.In) and n.args.get("query") is not None):
            return False
        if isinstance(n, exp.Column) and (n.table or n.name.lower() not in names):
            return False
    return True


class NotALiteral(Exception):
    """The node is not a literal `literal` can read."""


#: SQL type names of CAST targets (and typed literals) -> Delta primitive type names.
CAST_TYPES: dict[str, str] = {
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


def cast_type(node: exp.Cast) -> str | None:
    """The Delta type name of a CAST's target, or None for a target this engine does not know."""
    to = node.args.get("to")
    dtype = to.this.name if isinstance(to, exp.DataType) else None
    return CAST_TYPES.get(dtype or "")


def literal(node: exp.Expr) -> Any:
    """The Python value of a SQL literal: None, bool, str, int, Decimal (float for NaN/inf), date or datetime.

    Typed literals (`DATE '2024-01-01'`, `TIMESTAMP '...'`, a CAST of a literal
    to a date or timestamp) give dates and datetimes (UTC when no zone is
    written); other CASTs of a literal give the literal. Raises NotALiteral.
    """
    node = unparen(node)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        try:
            return number(str(node.this))
        except ValueError as e:
            raise NotALiteral(f"bad number {node.this!r}") from e
    if isinstance(node, exp.Neg):
        v = literal(node.this)
        if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool):
            return -v
        raise NotALiteral(f"cannot negate {node.this.sql(dialect='spark')}")
    if isinstance(node, (exp.Cast, exp.TryCast)):
        inner = literal(node.this)
        target = cast_type(node)
        if inner is None or target not in ("date", "timestamp", "timestamp_ntz"):
            return inner
        try:
            if target == "date":
                return inner if isinstance(inner, _dt.date) else _dt.date.fromisoformat(str(inner).strip()[:10])
            value = inner if isinstance(inner, _dt.datetime) else _dt.datetime.fromisoformat(str(inner).strip())
        except ValueError as e:
            raise NotALiteral(f"{str(inner)!r} is not a valid {target}") from e
        return value.replace(tzinfo=_dt.UTC) if value.tzinfo is None else value
    raise NotALiteral(f"unsupported literal {node.sql(dialect='spark')}")


def literal_node(value: Any) -> exp.Expr:
    """A SQL literal for a Python value (the inverse of `literal`, for filters given as tuples)."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, (int, float, Decimal)):
        node: exp.Expr = exp.Literal.number(str(abs(value)))
        return exp.Neg(this=node) if value < 0 else node
    if isinstance(value, _dt.datetime):
        return exp.Cast(this=exp.Literal.string(value.isoformat(sep=" ")), to=exp.DataType.build("TIMESTAMP"))
    if isinstance(value, _dt.date):
        return exp.Cast(this=exp.Literal.string(value.isoformat()), to=exp.DataType.build("DATE"))
    raise TypeError(f"no SQL literal for {type(value).__name__} {value!r}")


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


__all__ = [
    "CAST_TYPES",
    "MAX_PREDICATES",
    "MAX_PREDICATE_CHARS",
    "MAX_PREDICATE_NESTING",
    "MAX_TOTAL_PREDICATE_CHARS",
    "SIMPLE_NODES",
    "ExpressionError",
    "NotALiteral",
    "cast_type",
    "columns_of",
    "conjuncts",
    "is_partition_only",
    "is_simple_condition",
    "literal",
    "literal_node",
    "number",
    "parse",
    "parsed_chars",
    "read_predicates_problem",
    "split_merge_condition",
    "strip_qualifiers",
    "unparen",
]
