"""The bulk stats check (`stats_problems`, Arrow's JSON reader) answers exactly as the per-file one does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.coordinator.rules.stats import stats_problem, stats_problems

#: The bulk pass from this many files on, in these tests (the coordinator's threshold is higher).
BULK_FROM = 256

BASE = json.dumps({"numRecords": 10, "minValues": {"id": 1, "name": "a", "x": 0.5, "s": {"a": 1}},
                   "maxValues": {"id": 9, "name": "z", "x": 9.5, "s": {"a": 2}},
                   "nullCount": {"id": 0, "name": 1, "x": 0, "s": {"a": 0}}, "tightBounds": True})

leaf = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4), st.none(), st.booleans(), st.lists(st.integers(), max_size=2))
columns = st.dictionaries(st.sampled_from(["id", "name", "x", "y"]),
                          st.one_of(leaf, st.dictionaries(st.sampled_from(["a", "b"]), leaf, max_size=2)), max_size=3)
document = st.fixed_dictionaries({}, optional={
    "numRecords": leaf, "minValues": st.one_of(columns, leaf), "maxValues": st.one_of(columns, leaf),
    "nullCount": st.one_of(columns, leaf), "tightBounds": leaf, "other": leaf})
raw = st.sampled_from(["", "   ", "{{not json", "[1]", "1", '{"numRecords":1}{"numRecords":2}', '{"numRecords":\n1}',
                       '{"numRecords":NaN}', '{"numRecords":1e308}', '{"a":1,"a":2}', "null", '{"numRecords":1} x',
                       '{"numRecords":1},"z":1', '{"numRecords":1},"s":{"numRecords":-1}', '{"numRecords":1}, "i":0'])
stats_text = st.one_of(document.map(lambda d: json.dumps(d, allow_nan=True)), raw)


def _expected(stats: list[Any]) -> dict[int, str]:
    return {i: p for i, s in enumerate(stats) if (p := stats_problem(s)) is not None}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=BULK_FROM + 40), stats_text), max_size=6),
       st.sampled_from([None, BASE]))
def test_bulk_answers_as_the_per_file_check(inserted: list[tuple[int, str]], filler: str | None) -> None:
    stats: list[Any] = [BASE if filler else json.dumps({"numRecords": i}) for i in range(BULK_FROM + 40)]
    for at, s in inserted:
        stats.insert(at, s)
    stats.insert(3, None)
    assert stats_problems(stats, BULK_FROM) == _expected(stats)


def test_a_clean_commit_checks_no_file_one_by_one(monkeypatch: Any) -> None:
    import deltacoord.coordinator.rules.stats as mod

    calls: list[object] = []
    real = mod.stats_problem
    monkeypatch.setattr(mod, "stats_problem", lambda s: calls.append(s) or real(s))
    stats = [json.dumps({"numRecords": i, "minValues": {"id": i, "v": f"{i}"}, "maxValues": {"id": i, "x": i + 0.5},
                         "nullCount": {"id": 0, "v": 0}, "tightBounds": True}) for i in range(1000)]
    assert mod.stats_problems(stats, BULK_FROM) == {}
    assert calls == [], "every document vouched for in one pass"
    stats[500] = '{"numRecords": -1}'
    assert mod.stats_problems(stats, BULK_FROM) == {500: "stats.numRecords is negative"}
    assert calls == ['{"numRecords": -1}'], "only the suspect row is asked again"
    stats[500] = '{"numRecords": 1},"z":1'
    assert mod.stats_problems(stats, BULK_FROM) == {500: mod.stats_problem(stats[500])} != {}, "a document that goes on is refused"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=BULK_FROM + 40), stats_text), max_size=6),
       st.sampled_from([1, 7, 64]))
def test_bulk_answers_as_the_per_file_check_slice_by_slice(inserted: list[tuple[int, str]], slice_rows: int) -> None:
    import deltacoord.coordinator.rules.stats as mod

    stats: list[Any] = [BASE if i % 2 else json.dumps({"numRecords": i}) for i in range(BULK_FROM + 40)]
    for at, s in inserted:
        stats.insert(at, s)
    saved = mod.BULK_SLICE
    mod.BULK_SLICE = slice_rows
    try:
        assert stats_problems(stats, BULK_FROM) == _expected(stats)
    finally:
        mod.BULK_SLICE = saved


def test_a_clean_commit_read_in_slices_checks_no_file_one_by_one(monkeypatch: Any) -> None:
    import deltacoord.coordinator.rules.stats as mod

    monkeypatch.setattr(mod, "BULK_SLICE", 300)
    calls: list[object] = []
    real = mod.stats_problem
    monkeypatch.setattr(mod, "stats_problem", lambda s: calls.append(s) or real(s))
    stats = [json.dumps({"numRecords": i, "minValues": {"id": i}, "maxValues": {"id": i}}) for i in range(1000)]
    stats[950] = '{"numRecords": -1}'
    assert mod.stats_problems(stats, BULK_FROM) == {950: "stats.numRecords is negative"}
    assert calls == ['{"numRecords": -1}'], "only the suspect row of the last slice is asked again"


@pytest.mark.parametrize("bad", ['{"other": Infinity}', '{"other": -Infinity}', '{"numRecords": 1, "x": {"y": NaN}}'])
@pytest.mark.parametrize("slice_rows", [1, 7])
def test_not_a_json_number_in_a_key_no_check_reads_is_refused_in_bulk(bad: str, slice_rows: int,
                                                                      monkeypatch: Any) -> None:
    """Arrow's JSON reader takes NaN and Infinity anywhere; the per-file check refuses them, and so must the bulk
    pass, even in a key it does not read (found by the slice test above with a slice of one document)."""
    import deltacoord.coordinator.rules.stats as mod

    monkeypatch.setattr(mod, "BULK_SLICE", slice_rows)
    stats: list[Any] = [json.dumps({"numRecords": i}) for i in range(BULK_FROM + 3)]
    stats[0] = bad
    assert stats_problems(stats, BULK_FROM) == {0: mod.stats_problem(bad)} != {}


def test_the_bulk_pass_never_imports_pandas() -> None:
    """The bulk pass reads Arrow's buffers itself: `fill_null`, `to_numpy` and `pa.scalar` import pandas, about 50 MB
    the deciding process holds for good after its first large commit otherwise. Missing columns (nulls), doubles and
    a refused row are all read."""
    import subprocess
    import sys

    code = """
import json, sys
from deltacoord.coordinator.rules.stats import stats_problems
docs = [json.dumps({"numRecords": i, "minValues": {"id": i, "x": 0.5} if i % 3 else {"id": i},
                    "maxValues": {"id": i}, "nullCount": {"id": 0} if i % 5 else {}}) for i in range(2000)]
docs[7] = '{"numRecords": -1}'
assert stats_problems(docs, 1000) == {7: "stats.numRecords is negative"}
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


_EDGE_INTS = st.one_of(st.integers(), st.sampled_from([0, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1]))
_LEAF = st.one_of(_EDGE_INTS, st.booleans(), st.none(), st.text(max_size=3), st.floats(), st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=3), st.one_of(_LEAF, st.dictionaries(st.text(max_size=3), _LEAF, max_size=3)),
                       max_size=4))
def test_a_column_of_a_plain_integer_is_passed_as_the_leaf_check_passes_it(values: dict[str, Any]) -> None:
    """The per-column walk skips a 64-bit integer (non-negative for a count) without the leaf check: the same
    answers as asking the leaf check of every column."""
    import deltacoord.coordinator.rules.stats as mod

    def leaf_by_leaf(vals: object, where: str, leaf: Any) -> str | None:
        assert isinstance(vals, dict)
        for name, v in vals.items():
            problem = leaf_by_leaf(v, f"{where}.{name}", leaf) if isinstance(v, dict) else leaf(v, f"{where}.{name}")
            if problem:
                return problem
        return None

    for leaf in (mod._bound_problem, mod._count_problem):
        if leaf is mod._bound_problem and all(type(v) is str for v in values.values()):
            continue  # the walk's own earlier shortcut: strings are always fine bounds
        assert mod._per_column_problem(values, "stats.x", leaf) == leaf_by_leaf(values, "stats.x", leaf)
