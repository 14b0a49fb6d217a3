"""The writer's declared reads and the coordinator's matching agree (hypothesis).

For random WHERE conditions over partition and data columns, and random files
with partition values, rows and min/max stats:

* the files a DELETE/UPDATE declares as read (`deltacoord.schemas.expressions.files_read`,
  what `deltacoord.writer.row_changes.rewrite` declares) include every file holding a row the
  condition selects: a concurrent removal of such a file is always a
  ConcurrentDeleteReadException;
* every declared file is one the coordinator's append matching treats as read
  (its partition matches the read predicate): a concurrent append into any
  partition the writer read is always a ConcurrentAppendException;
* without stats to skip by, the declared files are exactly the files the
  coordinator's matching treats as read.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.reader.snapshot import delta_schema_to_arrow
from deltacoord.schemas.actions import AddFile, Metadata
from deltacoord.schemas.expressions.arrow import compile_filter
from deltacoord.schemas.expressions.partitions import compile_read_predicates, partition_schema, row_of
from deltacoord.schemas.expressions.scan import files_read
from deltacoord.writer import staging

FIELDS = [("p", "integer"), ("q", "string"), ("id", "long"), ("name", "string")]
METADATA = Metadata(
    id="agreement",
    schema_string=json.dumps({"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}}
                                                           for n, t in FIELDS]}),
    partition_columns=("p", "q"),
)
SCHEMA = delta_schema_to_arrow(METADATA.schema())
DATA_COLUMNS = ["id", "name"]

_p_values = st.one_of(st.none(), st.integers(-2, 3))
_q_values = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "US"]))
_ids = st.one_of(st.none(), st.integers(-3, 8))
_names = st.one_of(st.none(), st.sampled_from(["", "a", "m", "zz", "m" * 40]))


def _lits(draw: st.DrawFn, values: st.SearchStrategy[str]) -> str:
    return ", ".join(draw(values) for _ in range(draw(st.integers(1, 3))))


@st.composite
def _atom(draw: st.DrawFn) -> str:
    col = draw(st.sampled_from(["p", "q", "id", "name"]))
    if col in ("p", "id"):
        ints = st.integers(-3, 9).map(str)
        lit = draw(ints if col == "id" else st.one_of(ints, ints.map(lambda v: f"'{v}'")))  # '3' is an integer too
        form = draw(st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "flip", "in", "between", "null", "notnull"]))
        lits = _lits(draw, ints)
        hi = draw(ints)
    else:
        strings = st.sampled_from(["", "a", "b", "c", "m", "US", "zz", "m" * 40]).map(lambda v: f"'{v}'")
        lit = draw(strings)
        form = draw(st.sampled_from(["=", "!=", "<", ">=", "flip", "in", "null", "notnull"]))
        lits = _lits(draw, strings)
        hi = draw(strings)
    if form == "flip":
        return f"{lit} < {col}"
    if form == "in":
        return f"{col} IN ({lits})"
    if form == "between":
        return f"{col} BETWEEN {lit} AND {hi}"
    if form == "null":
        return f"{col} IS NULL"
    if form == "notnull":
        return f"{col} IS NOT NULL"
    return f"{col} {form} {lit}"


@st.composite
def _condition(draw: st.DrawFn, depth: int = 0) -> str:
    if depth < 3 and draw(st.integers(0, 2)) > 0:
        left, right = draw(_condition(depth + 1)), draw(_condition(depth + 1))
        text = f"({left}) {draw(st.sampled_from(['AND', 'OR']))} ({right})"
        return f"NOT ({text})" if draw(st.integers(0, 5)) == 0 else text
    atom = draw(_atom())
    return f"NOT ({atom})" if draw(st.integers(0, 6)) == 0 else atom


_file = st.tuples(_p_values, _q_values, st.lists(st.tuples(_ids, _names), min_size=1, max_size=5))


def _rows(p: int | None, q: str | None, rows: list[tuple[int | None, str | None]]) -> pa.Table:
    n = len(rows)
    return pa.table({
        "p": pa.array([p] * n, pa.int32()), "q": pa.array([q] * n, pa.string()),
        "id": pa.array([r[0] for r in rows], pa.int64()), "name": pa.array([r[1] for r in rows], pa.string()),
    }, schema=SCHEMA)


def _holds_a_match(t: pa.Table, where: str) -> bool:
    m = ds.dataset(t).to_table(columns={"m": compile_filter(where, SCHEMA)}).column("m")
    return bool(pc.any(pc.fill_null(m.combine_chunks(), False)).as_py())


@settings(max_examples=400, deadline=None)
@given(files=st.lists(_file, min_size=1, max_size=6), where=_condition())
def test_declared_reads_cover_every_match_and_stay_inside_the_coordinators_matching(
        files: list[tuple[int | None, str | None, list[tuple[int | None, str | None]]]], where: str) -> None:
    tables = [_rows(p, q, rows) for p, q, rows in files]
    adds = [AddFile(f"f{i}.parquet", {"p": None if p is None else str(p), "q": q}, 100, 0, True,
                    stats=staging.file_stats(t, DATA_COLUMNS)) for i, ((p, q, _r), t) in enumerate(zip(files, tables, strict=True))]
    pschema = partition_schema(METADATA)
    coordinator = compile_read_predicates([where], pschema)  # what the append check matches added files with
    matched = {a.path for a in adds if coordinator(row_of(a.partition_values, pschema))}
    truly = {a.path for a, t in zip(adds, tables, strict=True) if _holds_a_match(t, where)}

    declared = {a.path for a in files_read(adds, where, METADATA, SCHEMA)}
    assert truly <= declared, f"{where!r}: files with matching rows not declared: {sorted(truly - declared)}"
    assert declared <= matched, f"{where!r}: declared files the coordinator would not guard: {sorted(declared - matched)}"

    without_stats = [AddFile(a.path, a.partition_values, a.size, a.modification_time, True) for a in adds]
    assert {a.path for a in files_read(without_stats, where, METADATA, SCHEMA)} == matched, where
