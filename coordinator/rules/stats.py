"""An added file's statistics: what Delta readers parse, checked before a proposal can be ratified.

Delta's protocol (Per-file Statistics) makes `add.stats` a JSON object: `numRecords` a long,
`minValues`/`maxValues` objects of column values (nested for structs), `nullCount` an object of
longs (nested likewise), `tightBounds` a boolean. Readers parse the stats of every file of the
table, so one malformed string (`""`, `{{not json`, `{"numRecords":1e308}`) makes the whole table
unreadable to them (delta-rs: `Kernel error: Json error`). Keys this module does not know are left
alone, as Delta readers leave them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Deeper than any struct nesting a table has; a bound keeps a hostile document from costing recursion.
MAX_DEPTH = 64


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


#: One decoder for every file: `json.loads` with an option builds a new one per call (a tenth of the check).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _count_problem(value: object, where: str) -> str | None:
    """numRecords and nullCount: a non-negative 64-bit integer."""
    if type(value) is not int:
        return f"{where} is {json.dumps(value)[:40]}, not an integer"
    if value < 0:
        return f"{where} is negative"
    if value > INT64_MAX:
        return f"{where} is {value}, beyond a 64-bit integer"
    return None


def _bound_problem(value: object, where: str) -> str | None:
    """A min or max value: a scalar; numbers finite, integers 64-bit."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is not a finite number"
    if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
        return f"{where} is {value}, beyond a 64-bit integer"
    if isinstance(value, list):
        return f"{where} is a list; statistics hold one value per column"
    return None


def _per_column_problem(values: object, where: str, leaf: Callable[[object, str], str | None],
                        depth: int = 0) -> str | None:
    """An object with one entry per column (nested objects for structs), each leaf checked by `leaf`."""
    if not isinstance(values, dict):
        return f"{where} is not a JSON object"
    if leaf is _bound_problem and all(type(v) is str for v in values.values()):
        return None  # strings are always fine bounds (the common case of a string column's min and max)
    if depth > MAX_DEPTH:
        return f"{where} nests deeper than {MAX_DEPTH} levels"
    for name, v in values.items():
        at = f"{where}.{name}"
        problem = _per_column_problem(v, at, leaf, depth + 1) if isinstance(v, dict) else leaf(v, at)
        if problem:
            return problem
    return None


def stats_problem(stats: object) -> str | None:
    """Why `stats` (an `add`'s statistics string, or None) would break a Delta reader, or None."""
    if stats is None:
        return None
    if not isinstance(stats, str):
        return f"stats is {type(stats).__name__}, not a JSON string"
    if stats.strip() == "":
        return "stats is an empty string; leave stats out (null) or give a JSON object"
    try:
        doc = _DECODER.decode(stats)
    except (ValueError, RecursionError) as e:
        return f"stats is not JSON ({str(e)[:80]})"
    if not isinstance(doc, dict):
        return "stats is not a JSON object"
    problem = None
    if "numRecords" in doc:
        problem = _count_problem(doc["numRecords"], "stats.numRecords")
    for key, leaf in (("minValues", _bound_problem), ("maxValues", _bound_problem), ("nullCount", _count_problem)):
        if problem is None and key in doc:
            problem = _per_column_problem(doc[key], f"stats.{key}", leaf)
    if problem is None and "tightBounds" in doc and not isinstance(doc["tightBounds"], bool):
        problem = "stats.tightBounds is not a boolean"
    return problem
