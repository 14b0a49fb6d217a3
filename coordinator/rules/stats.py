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
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Deeper than any struct nesting a table has; a bound keeps a hostile document from costing recursion.
MAX_DEPTH = 64


class _NotJson(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON number")


def _long_problem(value: object, where: str) -> str | None:
    if type(value) is not int:
        return f"{where} is {json.dumps(value)[:40]}, not an integer"
    if not INT64_MIN <= value <= INT64_MAX:
        return f"{where} is {value}, beyond a 64-bit integer"
    return None


def _values_problem(values: object, where: str, depth: int = 0) -> str | None:
    """minValues/maxValues: an object of scalars or nested objects; numbers finite, integers 64-bit."""
    if not isinstance(values, dict):
        return f"{where} is not a JSON object"
    if depth > MAX_DEPTH:
        return f"{where} nests deeper than {MAX_DEPTH} levels"
    for name, v in values.items():
        at = f"{where}.{name}"
        if isinstance(v, dict):
            problem = _values_problem(v, at, depth + 1)
            if problem:
                return problem
        elif isinstance(v, float) and not math.isfinite(v):
            return f"{at} is not a finite number"
        elif type(v) is int and not INT64_MIN <= v <= INT64_MAX:
            return f"{at} is {v}, beyond a 64-bit integer"
        elif isinstance(v, list):
            return f"{at} is a list; statistics hold one value per column"
    return None


def _null_count_problem(counts: object, where: str, depth: int = 0) -> str | None:
    if not isinstance(counts, dict):
        return f"{where} is not a JSON object"
    if depth > MAX_DEPTH:
        return f"{where} nests deeper than {MAX_DEPTH} levels"
    for name, v in counts.items():
        at = f"{where}.{name}"
        problem = (_null_count_problem(v, at, depth + 1) if isinstance(v, dict)
                   else _long_problem(v, at) or (f"{at} is negative" if v < 0 else None))
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
        doc = json.loads(stats, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:
        return f"stats is not JSON ({str(e)[:80]})"
    if not isinstance(doc, dict):
        return "stats is not a JSON object"
    if "numRecords" in doc:
        problem = _long_problem(doc["numRecords"], "stats.numRecords")
        if problem:
            return problem
        if doc["numRecords"] < 0:
            return "stats.numRecords is negative"
    for key in ("minValues", "maxValues"):
        if key in doc:
            problem = _values_problem(doc[key], f"stats.{key}")
            if problem:
                return problem
    if "nullCount" in doc:
        problem = _null_count_problem(doc["nullCount"], "stats.nullCount")
        if problem:
            return problem
    if "tightBounds" in doc and not isinstance(doc["tightBounds"], bool):
        return "stats.tightBounds is not a boolean"
    return None
