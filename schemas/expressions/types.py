"""Typing rules shared by every evaluator: value categories, text to typed value, literal coercion.

Delta stores partition values (and this engine reads typed literals) as text;
a value's *category* decides how it compares: strings as text, numbers
numerically (`'10' > '9'` on an integer column is true), dates and timestamps
as instants, booleans as booleans. Comparing two categories follows Spark's
implicit casts:

* an untyped string literal takes the other side's category (`date > '2024-01-01'`);
* a date meets a timestamp as midnight UTC of that date;
* a string *column* meets a typed value by casting the column (`country = 1`
  compares numbers); a value that does not cast is decided by each evaluator
  on the safe side (the partition matcher counts it as a match).

Every evaluator (partition rows, Arrow, min/max stats) takes its categories
and conversions from here.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any


def number(text: str) -> int | Decimal | float:
    """A numeric literal's value: int when integral as written, Decimal otherwise (floats only for NaN/inf)."""
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        pass
    try:
        d = Decimal(s)
    except InvalidOperation:
        raise ValueError(f"not a number: {s!r}") from None
    if d.is_nan() or d.is_infinite():
        return float(d)
    if d == d.to_integral_value() and "e" not in s.lower() and "." not in s:
        return int(d)
    return d


# Value categories used for comparisons.
STR, NUM, DATE, TS, BOOL = "string", "numeric", "date", "timestamp", "boolean"

INTEGRAL = frozenset({"byte", "short", "integer", "int", "long", "bigint", "tinyint", "smallint"})
FLOATING = frozenset({"float", "double", "real"})
_UTC = _dt.UTC


#: Delta types whose min/max statistics a condition can compare (binary, decimal and nested types are not).
STATS_TYPES = frozenset({"string", "long", "integer", "short", "byte", "float", "double", "boolean", "date",
                         "timestamp", "timestamp_ntz"})


def category_of(type_name: str) -> str:
    """The category of a Delta primitive type name ("integer", "date", "decimal(10,2)", ...)."""
    t = type_name.lower()
    if t in INTEGRAL or t in FLOATING or t.startswith("decimal"):
        return NUM
    if t == "date":
        return DATE
    if t in ("timestamp", "timestamp_ntz"):
        return TS
    if t == "boolean":
        return BOOL
    return STR  # string, binary and anything else compare as text


def to_date(s: str) -> _dt.date:
    s = s.strip()
    try:
        return _dt.date.fromisoformat(s[:10] if len(s) > 10 and s[10] in " T" else s)
    except ValueError as e:
        raise ValueError(f"not a date: {s!r}") from e


def to_timestamp(s: str) -> _dt.datetime:
    """An aware datetime; a value written without a zone is UTC (Delta writes partition timestamps in UTC)."""
    s = s.strip()
    try:
        d = _dt.datetime.fromisoformat(s)
    except ValueError as e:
        raise ValueError(f"not a timestamp: {s!r}") from e
    return d.replace(tzinfo=_UTC) if d.tzinfo is None else d


def to_bool(s: str) -> bool:
    t = s.strip().lower()
    if t == "true":
        return True
    if t == "false":
        return False
    raise ValueError(f"not a boolean: {s!r}")


def parse_text(text: str, type_name: str) -> Any:
    """The value of `text` (a partition value, a string literal) as Delta type `type_name`.

    Integers give int, floating types float, decimals int or Decimal, dates
    date, timestamps an aware datetime (UTC when no zone is written), booleans
    bool, anything else the text itself. Raises ValueError (or ArithmeticError)
    when the text is not such a value.
    """
    t = type_name.lower()
    if t in INTEGRAL:
        return int(text.strip())
    if t in FLOATING:
        return float(text.strip())
    if t.startswith("decimal"):
        return number(text)
    if t == "date":
        return to_date(text)
    if t in ("timestamp", "timestamp_ntz"):
        return to_timestamp(text)
    if t == "boolean":
        return to_bool(text)
    return text


#: How an untyped string becomes a value of each category.
FROM_TEXT: dict[str, Callable[[str], Any]] = {STR: str, NUM: number, DATE: to_date, TS: to_timestamp, BOOL: to_bool}


def category_of_value(value: Any) -> str | None:
    """The category of a Python value as `syntax.literal` returns it (None for NULL)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, (int, float, Decimal)):
        return NUM
    if isinstance(value, _dt.datetime):
        return TS
    if isinstance(value, _dt.date):
        return DATE
    return STR


def coerce_literal(value: Any, category: str) -> Any:
    """A literal's value as a value of `category` (the other side of a comparison), by the rules above.

    Raises ValueError (or ArithmeticError) when it cannot be one: a string that
    does not parse, a number compared with a date, ...
    """
    if value is None:
        return None
    have = category_of_value(value)
    if have == category:
        return value
    if have == STR:
        return FROM_TEXT[category](value)
    if have == DATE and category == TS:
        return _dt.datetime(value.year, value.month, value.day, tzinfo=_UTC)
    raise ValueError(f"a {have} value cannot be compared with a {category} one")


__all__ = [
    "BOOL",
    "DATE",
    "FLOATING",
    "FROM_TEXT",
    "INTEGRAL",
    "NUM",
    "STATS_TYPES",
    "STR",
    "TS",
    "category_of",
    "category_of_value",
    "coerce_literal",
    "number",
    "parse_text",
    "to_bool",
    "to_date",
    "to_timestamp",
]
