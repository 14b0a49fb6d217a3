"""Which conditions keep row-level concurrency: the one rule in `schemas/expressions/syntax.py`."""

from __future__ import annotations

import pytest

from deltacoord.schemas.expressions.syntax import is_simple_condition

COLUMNS = ("id", "name", "ts")


@pytest.mark.parametrize("text", [
    "id = 1", "ID > 3 AND name <> 'x'", "id IN (1, 2, 3)", "id BETWEEN 1 AND 9", "name IS NULL",
    "NOT (id + 1 > 2 * id)", "CAST(id AS STRING) = '1'", "ts >= '2024-01-01' OR id = -1",
])
def test_simple(text: str) -> None:
    assert is_simple_condition(text, COLUMNS)


@pytest.mark.parametrize("text", [
    "upper(name) = 'X'",  # a function
    "rand() < 0.5",  # non-deterministic
    "id IN (SELECT id FROM other)",  # a subquery
    "t.id = 1",  # a qualified column
    "other = 1",  # not one of the columns (nested, or not comparable by statistics)
    "id = ",  # does not parse
])
def test_complex(text: str) -> None:
    assert not is_simple_condition(text, COLUMNS)
