"""Partition predicates: parsing (sqlglot), Delta partition-value typing, widening, 3-valued logic."""

from __future__ import annotations

from typing import Any

import pytest

from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.expressions.partitions import (
    PartitionColumn,
    compile_predicate,
    compile_read_predicates,
    matches,
    partition_schema,
    row_of,
)
from tests.unit.builders import metadata

COLUMNS = {
    "s": "string",
    "i": "integer",
    "l": "long",
    "d": "date",
    "ts": "timestamp",
    "ntz": "timestamp_ntz",
    "b": "boolean",
    "f": "double",
    "dec": "decimal(10,2)",
    "sh": "short",
    "amount": "double",
    "note": "string",
}
PARTS = ("s", "i", "l", "d", "ts", "ntz", "b", "f", "dec", "sh")
MD = metadata(PARTS, columns=COLUMNS)


def m(text: str, **pv: Any) -> bool:
    return matches(text, {k: (None if v is None else str(v)) for k, v in pv.items()}, MD)


# -- typing -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pv", "expected"),
    [
        # integers compare numerically, not as text: '10' > '9'
        ("i > 9", {"i": "10"}, True),
        ("i > '9'", {"i": "10"}, True),
        ("i < 9", {"i": "10"}, False),
        ("l >= 10000000000", {"l": "10000000001"}, True),
        ("sh = -3", {"sh": "-3"}, True),
        ("i = 10", {"i": "010"}, True),
        # strings compare as text
        ("s > '9'", {"s": "10"}, False),
        ("s = 'US'", {"s": "US"}, True),
        ("s = 'us'", {"s": "US"}, False),
        # dates
        ("d > '2010-01-01'", {"d": "2011-03-01"}, True),
        ("d > DATE '2010-01-01'", {"d": "2009-12-31"}, False),
        ("d BETWEEN '2024-01-01' AND '2024-01-31'", {"d": "2024-01-31"}, True),
        ("d BETWEEN '2024-01-01' AND '2024-01-31'", {"d": "2024-02-01"}, False),
        ("d = CAST('2024-02-29' AS DATE)", {"d": "2024-02-29"}, True),
        ("d < TIMESTAMP '2024-01-01 00:00:01'", {"d": "2024-01-01"}, True),  # date promoted to timestamp
        # timestamps: space or ISO form, with or without zone, microseconds
        ("ts = '2000-01-01T12:00:00.000000Z'", {"ts": "2000-01-01 12:00:00"}, True),
        ("ts > TIMESTAMP '2000-01-01 12:00:00'", {"ts": "2000-01-01 12:00:00.000001"}, True),
        ("ts = '2000-01-01 13:00:00+01:00'", {"ts": "2000-01-01T12:00:00Z"}, True),
        ("ntz < '2030-01-01'", {"ntz": "2029-12-31 23:59:59"}, True),
        # booleans, doubles, decimals
        ("b", {"b": "true"}, True),
        ("b = false", {"b": "true"}, False),
        ("NOT b", {"b": "false"}, True),
        ("b IS TRUE", {"b": "true"}, True),
        ("f > 1.5", {"f": "1.75"}, True),
        ("f < 1e3", {"f": "999.5"}, True),
        ("dec = 10.50", {"dec": "10.5"}, True),
        ("dec IN (1.25, 10.5)", {"dec": "10.50"}, True),
        ("CAST(i AS STRING) = '7'", {"i": "7"}, True),
        ("CAST(s AS INT) > 5", {"s": "6"}, True),
    ],
)
def test_partition_value_typing(text: str, pv: dict[str, str], expected: bool) -> None:
    assert m(text, **pv) is expected


# -- NULL and three-valued logic ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "expected"),
    [
        ("i = 1", None, False),
        ("i <> 1", None, False),
        ("NOT (i = 1)", None, False),  # NOT unknown is unknown: no match
        ("i IS NULL", None, True),
        ("i IS NULL", "", True),  # an empty string is NULL
        ("i IS NOT NULL", "", False),
        ("i IS NOT NULL", "3", True),
        ("i = 1 OR true", None, True),
        ("i = 1 AND false", None, False),
        ("i = 1 OR i IS NULL", None, True),
        ("i IN (1, 2)", None, False),
        ("i IN (1, NULL)", "1", True),
        ("i IN (1, NULL)", "2", False),  # unknown
        ("i NOT IN (1, NULL)", "2", False),  # NOT unknown
        ("i NOT IN (1, 2)", "3", True),
        ("i <=> NULL", None, True),
        ("i <=> 1", None, False),
        ("i = NULL", "1", False),
        ("s = ''", "", False),  # '' is NULL for a partition value, and NULL = '' is unknown
    ],
)
def test_three_valued_logic(text: str, value: str | None, expected: bool) -> None:
    col = "s" if text.startswith("s ") else "i"
    assert m(text, **{col: value}) is expected


# -- widening of data-column conjuncts ----------------------------------------------------------------------


def test_conjunct_on_a_data_column_is_dropped() -> None:
    p = compile_predicate("i = 1 AND amount > 5", partition_schema(MD))
    assert p.dropped_conjuncts == 1 and not p.matches_all
    assert p(row_of({"i": "1"}, partition_schema(MD)))
    assert not p(row_of({"i": "2"}, partition_schema(MD)))


def test_predicate_only_on_data_columns_matches_everything() -> None:
    p = compile_predicate("amount > 5 AND note LIKE '%x%'", partition_schema(MD))
    assert p.matches_all and p.dropped_conjuncts == 2
    assert p(row_of({}, partition_schema(MD)))


def test_or_mixing_partition_and_data_columns_is_dropped_whole() -> None:
    """Delta's example: `part = 1 OR year > 2019` is a data filter."""
    assert m("i = 1 OR amount > 2019", i="7")


def test_unsupported_constructs_inside_data_conjuncts_are_fine() -> None:
    """A data filter is dropped before compilation, so functions and subqueries there are not errors."""
    assert m("i = 1 AND upper(note) IN (SELECT x FROM t)", i="1")
    assert not m("i = 1 AND upper(note) IN (SELECT x FROM t)", i="2")


def test_nested_and_inside_parentheses_is_split() -> None:
    p = compile_predicate("(i = 1 AND amount > 0) AND (s = 'x')", partition_schema(MD))
    assert p.dropped_conjuncts == 1


def test_qualified_columns_and_merge_join_conditions() -> None:
    """MERGE example (seed 003): `s.date = t.date` joins source and target -> a data filter;
    `t.country = 'US'` is a target partition filter."""
    schema = partition_schema(metadata(("date", "country")))
    p = compile_predicate("s.user_id = t.user_id AND s.date = t.date AND t.country = 'US'", schema)
    assert p.dropped_conjuncts == 2
    assert p(row_of({"date": "2024-01-01", "country": "US"}, schema))
    assert not p(row_of({"date": "2024-01-01", "country": "DE"}, schema))


def test_column_names_are_case_insensitive_and_backticks_work() -> None:
    assert m("I = 4 AND `s` = 'a'", i="4", s="a")


def test_unparsable_partition_value_matches_conservatively() -> None:
    assert m("i = 1", i="not_a_number")
    assert m("d > '2020-01-01'", d="yesterday")


def test_missing_partition_key_is_null() -> None:
    assert not m("i = 1")
    assert m("i IS NULL")


def test_column_mapping_physical_names() -> None:
    md = metadata(("date",), physical={"date": "col-1"}, config={"delta.columnMapping.mode": "name"})
    schema = partition_schema(md)
    assert schema == (PartitionColumn("date", "col-1", "date"),)
    assert matches("date = '2024-01-01'", {"col-1": "2024-01-01"}, md)
    assert not matches("date = '2024-01-01'", {"col-1": "2024-01-02"}, md)


def test_partition_schema_from_metadata() -> None:
    schema = partition_schema(metadata(("date", "part")))
    assert [(c.name, c.type_name, c.category) for c in schema] == [
        ("date", "date", "date"),
        ("part", "integer", "numeric"),
    ]
    assert partition_schema(metadata()) == ()
    assert partition_schema(None) == ()


def test_partition_schema_errors_are_invalid_proposals() -> None:
    with pytest.raises(InvalidProposalError) as e:
        partition_schema(metadata(("nope",)))
    assert e.value.reason == "BAD_SCHEMA"


# -- union of predicates, memo, cache ---------------------------------------------------------------------


def test_matcher_is_the_union_of_predicates() -> None:
    schema = partition_schema(MD)
    mt = compile_read_predicates(["i = 1", "i = 2"], schema)
    assert mt(row_of({"i": "1"}, schema)) and mt(row_of({"i": "2"}, schema))
    assert not mt(row_of({"i": "3"}, schema))
    assert compile_read_predicates([], schema).matches_none
    assert compile_read_predicates(["i = 1", "amount > 0"], schema).matches_all


def test_compiled_predicates_are_cached() -> None:
    schema = partition_schema(MD)
    assert compile_predicate("i = 42", schema) is compile_predicate("i = 42", schema)
    other = partition_schema(metadata(("i",), columns={"i": "string"}))
    assert compile_predicate("i = 42", other) is not compile_predicate("i = 42", schema)


def test_string_column_against_a_number_is_cast_like_spark() -> None:
    assert m("s = 1", s="01")
    assert not m("s = 1", s="2")
    assert m("s = 1", s="abc")  # cannot be cast: conservative match


def test_same_text_typed_by_schema() -> None:
    """'10' > '9' is true for an integer column and false for a string column."""
    as_int = metadata(("p",), columns={"p": "integer"})
    as_str = metadata(("p",), columns={"p": "string"})
    assert matches("p > '9'", {"p": "10"}, as_int)
    assert not matches("p > '9'", {"p": "10"}, as_str)


# -- errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("i = = 1", "does not parse"),
        ("i = 1 AND", "does not parse"),
        ("", "empty predicate"),
        ("   ", "empty predicate"),
        ("SELECT 1", "statement"),
        ("i = 1; DROP TABLE t", "exactly one expression"),
        ("i + 1 > 2", "unsupported construct"),
        ("rand() < 0.5", "unsupported construct"),
        ("upper(s) = 'X'", "unsupported construct"),
        ("i IN (SELECT 1)", "subquery"),
        ("i = 'abc'", "not a valid numeric"),
        ("d = 'not-a-date'", "not a valid date"),
        ("b = DATE '2024-01-01'", "cannot compare"),
        ("i", "not a boolean"),
        ("CAST(i AS ARRAY<INT>) = 1", "unsupported cast"),
        ("i IN (s)", "literals"),
        ("x" * 70_000, "longer than"),
    ],
)
def test_bad_predicates_raise_invalid_proposal(text: str, fragment: str) -> None:
    with pytest.raises(InvalidProposalError) as e:
        compile_predicate(text, partition_schema(MD))
    assert e.value.reason == "BAD_PREDICATE"
    assert fragment in str(e.value)
    if text.strip() and len(text) < 100:
        assert text in str(e.value)  # the message names the predicate


def test_deeply_nested_predicate_is_an_error_not_a_crash() -> None:
    text = "(" * 3000 + "i = 1" + ")" * 3000
    with pytest.raises(InvalidProposalError) as e:
        compile_predicate(text, partition_schema(MD))
    assert e.value.reason == "BAD_PREDICATE"


def test_predicate_without_columns_is_constant() -> None:
    assert m("1 = 1")
    assert not m("1 = 2")
    assert not m("false")
