"""Min/max data skipping: sound (never skips a file with a matching row) and useful (skips provably empty ones)."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.schemas.actions import AddFile
from deltacoord.schemas.expressions import arrow as expressions
from deltacoord.schemas.expressions.stats import file_filter, skip_files
from deltacoord.writer import staging

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("d", pa.date32()), ("x", pa.float64()), ("p", pa.string())])
DATA_COLUMNS = ["id", "name", "d", "x"]


def _file(t: pa.Table, path: str = "f.parquet") -> AddFile:
    return AddFile(path, {"p": "a"}, 100, 0, True, stats=staging.file_stats(t, DATA_COLUMNS))


def _table(ids: list[int | None], names: list[str | None] | None = None, days: list[int | None] | None = None) -> pa.Table:
    n = len(ids)
    base = dt.date(2024, 1, 1)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "name": pa.array(names if names is not None else [f"n{i}" for i in range(n)], pa.string()),
        "d": pa.array([None if x is None else base + dt.timedelta(days=x) for x in (days or [0] * n)], pa.date32()),
        "x": pa.array([float(i) for i in range(n)], pa.float64()),
        "p": pa.array(["a"] * n, pa.string()),
    }, schema=SCHEMA)


def _matches(t: pa.Table, where: str) -> bool:
    m = ds.dataset(t).to_table(columns={"m": expressions.compile_filter(where, SCHEMA)}).column("m")
    return bool(pc.any(pc.fill_null(m.combine_chunks(), False)).as_py())


@pytest.mark.parametrize("where,skipped", [
    ("id = 5", True), ("id = 12", False), ("id < 10", True), ("id <= 10", False), ("id > 20", True), ("id >= 20", False),
    ("5 > id", True), ("id IN (1, 2, 30)", True), ("id IN (1, 15)", False), ("id BETWEEN 1 AND 9", True),
    ("id BETWEEN 1 AND 10", False), ("id IS NULL", True), ("id IS NOT NULL", False), ("id != 15", False),
    ("id = 5 OR id = 25", True), ("id = 5 OR id = 15", False), ("id = 5 AND name = 'zzz'", True),
    ("x = 1000.0", False),  # float stats are never trusted (NaN)
    ("p = 'b'", False),  # partition columns are pruned elsewhere, not here
    ("NOT (id = 15)", False), ("id + 1 = 100", False), ("name = 'n1'", False), ("name = 'a'", True),
    ("d = DATE '2023-12-31'", True), ("d >= '2024-01-01'", False), ("d > '2024-01-11'", True),
])
def test_skips_only_what_the_stats_rule_out(where: str, skipped: bool) -> None:
    t = _table(list(range(10, 21)), days=list(range(11)))  # ids 10..20, days 2024-01-01..2024-01-11
    add = _file(t)
    assert file_filter(where, SCHEMA, ["p"])(add) is (not skipped)
    assert _matches(t, where) is False or not skipped, "a skipped file must hold no matching row"


def test_missing_or_bad_stats_keep_the_file() -> None:
    keep = file_filter("id = 5", SCHEMA, ["p"])
    assert keep(AddFile("a", {}, 1, 0, True, stats=None))
    assert keep(AddFile("a", {}, 1, 0, True, stats="not json"))
    assert keep(AddFile("a", {}, 1, 0, True, stats=json.dumps({"numRecords": 3})))
    assert keep(AddFile("a", {}, 1, 0, True, stats=json.dumps({"minValues": {"id": "7"}, "maxValues": {"id": 9}})))
    assert not keep(AddFile("a", {}, 1, 0, True, stats=json.dumps({"minValues": {"id": 7}, "maxValues": {"id": 9}})))


def test_long_strings_bound_only_from_below() -> None:
    long = "m" * 40
    add = _file(_table([1, 2], names=["a", long]))
    assert file_filter(f"name = '{long}z'", SCHEMA, ["p"])(add), "a truncated max is no upper bound"
    assert not file_filter("name < 'a'", SCHEMA, ["p"])(add)


def test_a_maximum_cut_by_another_writer_is_no_upper_bound() -> None:
    # Some Delta writers cut string stats to 32 UTF-16 units and end them with U+FFFD: for
    # characters outside the BMP that is only 17 Python characters, and below the real maximum.
    value = "\U0001F33C" * 20
    stats = {"numRecords": 1, "minValues": {"name": "\U0001F33C" * 16}, "maxValues": {"name": "\U0001F33C" * 16 + "\ufffd"},
             "nullCount": {"name": 0}}
    add = AddFile("f", {}, 1, 0, True, stats=json.dumps(stats))
    assert stats["maxValues"]["name"] < value
    assert file_filter(f"name = '{value}'", SCHEMA, ["p"])(add)
    assert file_filter(f"name >= '{value}'", SCHEMA, ["p"])(add)
    # 31 bytes of multi-byte text is short enough to be exact, and still skips
    short = {"numRecords": 1, "minValues": {"name": "é" * 10}, "maxValues": {"name": "é" * 15}, "nullCount": {"name": 0}}
    assert not file_filter("name > 'ê'", SCHEMA, ["p"])(AddFile("g", {}, 1, 0, True, stats=json.dumps(short)))


def test_skip_files_keeps_order_and_drops_only_ruled_out_files() -> None:
    files = [_file(_table(list(range(i * 10, i * 10 + 10))), f"f{i}") for i in range(5)]
    assert [a.path for a in skip_files(files, "id BETWEEN 15 AND 32", SCHEMA, ["p"])] == ["f1", "f2", "f3"]
    assert skip_files(files, None, SCHEMA, ["p"]) == files


_ints = st.one_of(st.none(), st.integers(-20, 20))
_names = st.one_of(st.none(), st.text(alphabet="abmé\U0001F33C", max_size=3), st.just("m" * 33), st.just("m" * 31 + "z"),
                   st.just("\U0001F33C" * 20), st.just("é" * 16))
_days = st.one_of(st.none(), st.integers(-3, 3))


@st.composite
def _predicates(draw: st.DrawFn, depth: int = 0) -> str:
    if depth < 2 and draw(st.booleans()):
        op = draw(st.sampled_from(["AND", "OR"]))
        left, right = draw(_predicates(depth + 1)), draw(_predicates(depth + 1))
        text = f"({left}) {op} ({right})"
        return f"NOT ({text})" if draw(st.integers(0, 5)) == 0 else text
    col = draw(st.sampled_from(["id", "name", "d"]))
    if col == "id":
        lit = str(draw(st.integers(-25, 25)))
        lits = ", ".join(str(draw(st.integers(-25, 25))) for _ in range(draw(st.integers(1, 3))))
    elif col == "name":
        lit = "'" + draw(st.sampled_from(["", "a", "b", "m", "ab", "m" * 31, "m" * 32, "m" * 33, "m" * 40, "z", "é" * 16,
                                           "é" * 17, "\U0001F33C" * 20, "\U0001F33C" * 21])) + "'"
        lits = ", ".join("'" + draw(st.sampled_from(["a", "b", "m" * 33])) + "'" for _ in range(draw(st.integers(1, 3))))
    else:
        day = dt.date(2024, 1, 1) + dt.timedelta(days=draw(st.integers(-4, 4)))
        lit = f"DATE '{day}'" if draw(st.booleans()) else f"'{day}'"
        lits = lit
    form = draw(st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "flip", "in", "between", "null", "notnull"]))
    if form == "flip":
        return f"{lit} < {col}"
    if form == "in":
        return f"{col} IN ({lits})"
    if form == "between":
        return f"{col} BETWEEN {lit} AND {lit}"
    if form == "null":
        return f"{col} IS NULL"
    if form == "notnull":
        return f"{col} IS NOT NULL"
    return f"{col} {form} {lit}"


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(st.tuples(_ints, _names, _days), min_size=1, max_size=6), where=_predicates())
def test_never_skips_a_file_holding_a_matching_row(rows: list[tuple[int | None, str | None, int | None]], where: str) -> None:
    t = _table([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    if _matches(t, where):
        assert file_filter(where, SCHEMA, ["p"])(_file(t)), f"skipped a file with rows matching {where!r}: {rows}"


def test_bounds_that_are_not_finite_numbers_are_left_out() -> None:
    """JSON has no Infinity or NaN (Delta readers refuse them, and so does the coordinator): such a bound is
    left out, which every reader takes as unknown; the finite bound on the other side stays."""
    from deltacoord.coordinator.rules.stats import stats_problem

    t = _table([1, 2, 3]).set_column(3, "x", pa.array([float("-inf"), 0.5, 2.0], pa.float64()))
    f = _file(t)
    stats = json.loads(f.stats or "")
    assert stats_problem(f.stats) is None
    assert "x" not in stats["minValues"] and stats["maxValues"]["x"] == 2.0 and stats["minValues"]["id"] == 1
    nan = _file(t.set_column(3, "x", pa.array([float("nan")] * 3, pa.float64())))
    assert stats_problem(nan.stats) is None and "x" not in json.loads(nan.stats or "")["maxValues"]
    # Skipping stays sound: a file whose x bound is unknown is kept.
    assert skip_files([f], "x < -100", SCHEMA, ["p"]) == [f]
