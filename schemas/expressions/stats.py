"""Data skipping: files whose min/max stats prove that no row satisfies a WHERE condition.

Delta declares as read only the files a scan could not skip, so a DELETE
`WHERE id = 5` conflicts with a concurrent change to another file only if that
file's id range contains 5. Skipping here narrows both the I/O and the files
the proposal declares, and with them the coordinator's conflicts.

Every rule is one-sided: a file is skipped only when its stats prove it holds
no matching row. Whatever cannot be proven (an unknown construct, a missing or
malformed stat, a type whose stats are lossy) keeps the file. Literals are
read and typed by the same rules as everywhere (`syntax.literal`,
`types.coerce_literal`). Partition columns are not looked at here: files are
pruned by partition with `partitions.prune`, the coordinator's own matcher.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from sqlglot import exp

from deltacoord.schemas.actions import AddFile, Metadata
from deltacoord.schemas.expressions.syntax import NotALiteral, literal, parse
from deltacoord.schemas.expressions.types import DATE, coerce_literal
from deltacoord.schemas.properties import PHYSICAL_NAME_KEY, TableProperties

#: Writers cut string stats to a 32-unit prefix (characters, UTF-16 units or bytes, with or
#: without a tie-breaker). A prefix is still a valid minimum; a maximum is trusted only when it
#: is shorter than 32 UTF-8 bytes, which rules out a cut under every one of those conventions.
_STRING_PREFIX_BYTES = 32

_Value = Any
_Bounds = tuple[_Value, _Value, int | None, int | None]  # min, max, nullCount, numRecords


def _convert(value: Any, typ: pa.DataType) -> Any:
    """A stat or literal as a Python value comparable for `typ`, or None when it is not one."""
    if value is None or isinstance(value, bool):
        return None
    if pa.types.is_integer(typ):
        return value if isinstance(value, int) else None
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return value if isinstance(value, str) else None
    if pa.types.is_date(typ):
        if isinstance(value, dt.datetime) or not isinstance(value, (dt.date, str)):
            return None
        try:
            return coerce_literal(value, DATE)
        except ValueError:
            return None
    return None  # floats (NaN), timestamps (truncated stats), decimals, ...: never skip


def _bounds(stats: dict[str, Any], name: str, typ: pa.DataType) -> _Bounds:
    lo = _convert((stats.get("minValues") or {}).get(name), typ)
    hi = _convert((stats.get("maxValues") or {}).get(name), typ)
    if isinstance(hi, str) and len(hi.encode("utf-8", "surrogatepass")) >= _STRING_PREFIX_BYTES:
        hi = None
    nulls = (stats.get("nullCount") or {}).get(name)
    rows = stats.get("numRecords")
    return (lo, hi, nulls if isinstance(nulls, int) else None, rows if isinstance(rows, int) else None)


def _cmp(op: type[exp.Expr], lo: Any, hi: Any, v: Any) -> bool:
    """May some value in [lo, hi] satisfy `value op v`? (None bounds are unknown.)"""
    try:
        if op is exp.EQ:
            return not ((lo is not None and lo > v) or (hi is not None and hi < v))
        if op is exp.LT:
            return lo is None or lo < v
        if op is exp.LTE:
            return lo is None or lo <= v
        if op is exp.GT:
            return hi is None or hi > v
        if op is exp.GTE:
            return hi is None or hi >= v
        if op is exp.NEQ:
            return not (lo is not None and hi is not None and lo == hi == v)
    except TypeError:
        return True
    return True


_FLIP: dict[type[exp.Expr], type[exp.Expr]] = {exp.EQ: exp.EQ, exp.NEQ: exp.NEQ, exp.LT: exp.GT, exp.GT: exp.LT,
                                               exp.LTE: exp.GTE, exp.GTE: exp.LTE}


class _Evaluator:
    def __init__(self, text: str, schema: pa.Schema, partition_columns: Sequence[str],
                 stats_names: Mapping[str, str] | None = None) -> None:
        self.text = text
        self.types = {f.name: f.type for f in schema if f.name not in partition_columns}
        self.stats_names = stats_names or {}

    def _column(self, node: exp.Expr) -> tuple[str, pa.DataType] | None:
        """The stats key (the physical name on a column-mapping table) and type of a column node."""
        if isinstance(node, exp.Paren):
            return self._column(node.this)
        if isinstance(node, exp.Column) and node.name in self.types:
            return self.stats_names.get(node.name, node.name), self.types[node.name]
        return None

    def _literal(self, node: exp.Expr, typ: pa.DataType) -> Any:
        try:
            return _convert(literal(node), typ)
        except (NotALiteral, ValueError):
            return None

    def may_match(self, node: exp.Expr, stats: dict[str, Any]) -> bool:
        if isinstance(node, exp.Paren):
            return self.may_match(node.this, stats)
        if isinstance(node, exp.And):
            return self.may_match(node.left, stats) and self.may_match(node.right, stats)
        if isinstance(node, exp.Or):
            return self.may_match(node.left, stats) or self.may_match(node.right, stats)
        op = type(node)
        if op in _FLIP and isinstance(node, exp.Binary):
            left, right = node.left, node.right
            col = self._column(left)
            if col is None:
                col, left, right, op = self._column(right), right, left, _FLIP[op]
            if col is None:
                return True
            v = self._literal(right, col[1])
            if v is None:
                return True
            lo, hi, _n, _r = _bounds(stats, *col)
            return _cmp(op, lo, hi, v)
        if isinstance(node, exp.In):
            col = self._column(node.this)
            if col is None or node.args.get("query") is not None:
                return True
            values = [self._literal(e, col[1]) for e in node.expressions]
            if not values or any(v is None for v in values):
                return True
            lo, hi, _n, _r = _bounds(stats, *col)
            return any(_cmp(exp.EQ, lo, hi, v) for v in values)
        if isinstance(node, exp.Between):
            col = self._column(node.this)
            if col is None:
                return True
            low, high = self._literal(node.args["low"], col[1]), self._literal(node.args["high"], col[1])
            lo, hi, _n, _r = _bounds(stats, *col)
            return (low is None or _cmp(exp.GTE, lo, hi, low)) and (high is None or _cmp(exp.LTE, lo, hi, high))
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            col = self._column(node.this)
            if col is None:
                return True
            _lo, _hi, nulls, _r = _bounds(stats, *col)
            return nulls is None or nulls > 0
        if isinstance(node, exp.Not) and isinstance(node.this, exp.Is) and isinstance(node.this.expression, exp.Null):
            col = self._column(node.this.this)
            if col is None:
                return True
            _lo, _hi, nulls, rows = _bounds(stats, *col)
            return nulls is None or rows is None or nulls < rows
        return True


def file_filter(where: str, schema: pa.Schema, partition_columns: Sequence[str],
                stats_names: Mapping[str, str] | None = None) -> Callable[[AddFile], bool]:
    """A test `add -> may hold a row matching where` (True whenever the stats cannot tell). `stats_names` maps
    logical column names to the keys of the stats (physical names, `stats_keys`)."""
    tree = parse(where)
    ev = _Evaluator(where, schema, partition_columns, stats_names)

    def may_match(add: AddFile) -> bool:
        if not add.stats:
            return True
        try:
            stats = json.loads(add.stats)
        except ValueError:
            return True
        return not isinstance(stats, dict) or ev.may_match(tree, stats)

    return may_match


def stats_keys(metadata: Metadata) -> dict[str, str]:
    """Top-level logical column name -> its key in file stats: the physical name on a column-mapping table."""
    if TableProperties.of(metadata).column_mapping_mode not in ("name", "id"):
        return {}
    out: dict[str, str] = {}
    for f in metadata.schema().get("fields", []):
        name = (f.get("metadata") or {}).get(PHYSICAL_NAME_KEY)
        if isinstance(name, str):
            out[f["name"]] = name
    return out


def skip_files(files: Sequence[AddFile], where: str | None, schema: pa.Schema, partition_columns: Sequence[str],
               stats_names: Mapping[str, str] | None = None) -> list[AddFile]:
    """`files` without those whose stats prove no row matches `where`."""
    if where is None or not files:
        return list(files)
    keep = file_filter(where, schema, partition_columns, stats_names)
    return [a for a in files if keep(a)]
