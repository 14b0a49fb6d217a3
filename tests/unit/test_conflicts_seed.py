"""The seed documents' conflict tables and worked examples, replayed through `decide`.

Sources:
* seed 000 (Indonesian) / 004 (Korean): Databricks "Isolation levels and write
  conflicts" -- table "write conflicts WITHOUT row-level concurrency", table
  "write conflicts WITH row-level concurrency", and the delete/insert worked
  example (both start at v0, insert commits v1, delete commits v2).
* seed 003 (Chinese/English): Databricks "Concurrency control" -- the older
  write-conflict table, the partitioning example (UPDATE date > '2010-01-01'
  vs DELETE date < '2010-01-01') and the MERGE example (implicit vs explicit
  partition condition).

Each table cell is an unordered pair of operations. We replay BOTH commit
orders (A wins then B is checked, and the reverse) at both isolation levels
and assert the exact outcome of each order; a second assertion ties the
cell's text to the outcomes: "can conflict" <=> at least one order conflicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from deltacoord.coordinator.rules.outcomes import Accepted, Rejected
from deltacoord.schemas.actions import AddFile
from deltacoord.schemas.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    DeltaConcurrentModificationException,
)
from deltacoord.schemas.messages import Proposal
from tests.unit.builders import Harness, add, dml_op, insert_op, optimize_op, removal_of

S, WS = "Serializable", "WriteSerializable"
OK = None

# Seed files of the unpartitioned table used for the tables: both operations of a
# pair touch the same files, the situation the documents call "can conflict".
F1 = add("part-00000-aaa.parquet")
F2 = add("part-00001-bbb.parquet")


def _op(kind: str, tag: str, rv: int, dv: bool) -> Proposal:
    """One operation of the tables, reading version `rv` of the F1/F2 table."""
    if kind == "INSERT":
        return insert_op(rv, [add(f"part-ins-{tag}.parquet")])
    if kind == "OPTIMIZE":
        return optimize_op(rv, compacted=[F1, F2], output=add(f"part-opt-{tag}.parquet", data_change=False))
    # UPDATE / DELETE / MERGE: a data predicate (the table cannot prune), rewrites F1.
    predicate = {
        "UPDATE": "amount > 100",
        "DELETE": "order_id = 7",
        "MERGE": "s.order_id = t.order_id",
    }[kind]
    # Row-level style DML on a deletion-vector table keeps F1 with a new DV; otherwise F1 is rewritten.
    new = [add(F1.path, dv=f"dv-{tag}")] if dv else [add(f"part-{kind.lower()}-{tag}.parquet")]
    return dml_op(kind, rv, predicates=[predicate], scanned=[F1, F2], rewritten=[F1], new_files=new)


@dataclass(frozen=True)
class Cell:
    row: str
    col: str
    text: str  # the document's words for this pair
    can_conflict: dict[str, bool]  # per isolation level, as the document states it
    # expected outcome when `first` commits first and `second` is then checked
    outcomes: dict[tuple[str, str, str], type[DeltaConcurrentModificationException] | None]


DML = ("UPDATE", "DELETE", "MERGE")


def _cells_without_rlc() -> list[Cell]:
    cells = [
        Cell(
            "INSERT",
            "INSERT",
            "Cannot conflict",
            {S: False, WS: False},
            {("INSERT", "INSERT", lv): OK for lv in (S, WS)},
        ),
        Cell(
            "OPTIMIZE",
            "INSERT",
            "Cannot conflict",
            {S: False, WS: False},
            {**{("INSERT", "OPTIMIZE", lv): OK for lv in (S, WS)}, **{("OPTIMIZE", "INSERT", lv): OK for lv in (S, WS)}},
        ),
        Cell(
            "OPTIMIZE",
            "OPTIMIZE",
            "Can conflict in Serializable and WriteSerializable (003); without deletion vectors: can conflict (000/004)",
            {S: True, WS: True},
            {("OPTIMIZE", "OPTIMIZE", lv): ConcurrentDeleteReadException for lv in (S, WS)},
        ),
    ]
    for d in DML:
        cells.append(
            Cell(
                d,
                "INSERT",
                "Cannot conflict in WriteSerializable. Can conflict in Serializable.",
                {S: True, WS: False},
                {
                    # the INSERT commits first: the DML read files the INSERT added to
                    ("INSERT", d, S): ConcurrentAppendException,
                    ("INSERT", d, WS): OK,
                    # the DML commits first: a blind INSERT never conflicts
                    (d, "INSERT", S): OK,
                    (d, "INSERT", WS): OK,
                },
            )
        )
        for d2 in DML:
            cells.append(
                Cell(
                    d,
                    d2,
                    "Can conflict in Serializable and WriteSerializable.",
                    {S: True, WS: True},
                    {(d2, d, lv): ConcurrentAppendException for lv in (S, WS)},
                )
            )
        cells.append(
            Cell(
                "OPTIMIZE",
                d,
                "Can conflict in Serializable and WriteSerializable (003); can conflict without deletion vectors "
                "(000/004)",
                {S: True, WS: True},
                {
                    # OPTIMIZE's output (dataChange=false, not blind) counts as an append (Delta Spark)
                    ("OPTIMIZE", d, S): ConcurrentAppendException,
                    ("OPTIMIZE", d, WS): ConcurrentAppendException,
                    # OPTIMIZE runs at SnapshotIsolation but loses to a delete of a file it compacted
                    (d, "OPTIMIZE", S): ConcurrentDeleteReadException,
                    (d, "OPTIMIZE", WS): ConcurrentDeleteReadException,
                },
            )
        )
    return cells


CELLS_WITHOUT_RLC = _cells_without_rlc()


def _replay(first: str, second: str, level: str, dv: bool) -> Accepted | Rejected:
    h = Harness(isolation=level, files=[F1, F2])
    rv = h.head
    a = _op(first, "a", rv, dv)
    b = _op(second, "b", rv, dv)
    h.must_commit(a)
    r = h.decide(b)
    assert not isinstance(r, Accepted) or r.version == rv + 2
    assert isinstance(r, (Accepted, Rejected))
    return r


def _assert_outcome(r: Accepted | Rejected, expected: type[Exception] | None, winning_version: int) -> None:
    if expected is None:
        assert isinstance(r, Accepted), f"expected a commit, got {r}"
    else:
        assert isinstance(r, Rejected), f"expected {expected.__name__}, got a commit"
        assert type(r.error) is expected, f"expected {expected.__name__}, got {r.error!r}"
        assert r.winning_version == winning_version


def _ordered_cases(cells: list[Cell]) -> list[tuple[Cell, str, str, str]]:
    out = []
    for c in cells:
        for first, second, level in c.outcomes:
            out.append((c, first, second, level))
    return out


@pytest.mark.parametrize(
    ("cell", "first", "second", "level"),
    _ordered_cases(CELLS_WITHOUT_RLC),
    ids=[f"noRLC-{f}-then-{s}-{lv}" for _, f, s, lv in _ordered_cases(CELLS_WITHOUT_RLC)],
)
def test_write_conflicts_without_row_level_concurrency(cell: Cell, first: str, second: str, level: str) -> None:
    """Seed 000/004 table 'without row-level concurrency' (and seed 003's table), one commit order per case."""
    r = _replay(first, second, level, dv=False)
    _assert_outcome(r, cell.outcomes[(first, second, level)], winning_version=2)


@pytest.mark.parametrize("cell", CELLS_WITHOUT_RLC, ids=[f"{c.row}-vs-{c.col}" for c in CELLS_WITHOUT_RLC])
@pytest.mark.parametrize("level", [S, WS])
def test_table_text_matches_outcomes_without_rlc(cell: Cell, level: str) -> None:
    """'Can conflict' in the seed table <=> some commit order of the pair conflicts at that level."""
    conflicted = False
    for first, second, lv in cell.outcomes:
        if lv == level:
            conflicted |= isinstance(_replay(first, second, level, dv=False), Rejected)
    assert conflicted == cell.can_conflict[level], cell.text


# -- WITH row-level concurrency (seed 000/004 second table) -------------------------------------------
#
# Row-level concurrency (deletion vectors + row-level conflict resolution) is a
# Databricks feature; this engine resolves conflicts per file. The cases below
# encode the CURRENT file-level behaviour on a deletion-vector table, where two
# operations touch different rows of the same file. Row-level resolution is a
# later issue: the cells marked `row_level_differs` are where Databricks would
# let the second operation commit and we report the file-level conflict.


@dataclass(frozen=True)
class RlcCase:
    first: str
    second: str
    level: str
    doc: str
    expected: type[DeltaConcurrentModificationException] | None
    row_level_differs: bool


def _rlc_cases() -> list[RlcCase]:
    out: list[RlcCase] = []
    for lv in (S, WS):
        out.append(RlcCase("INSERT", "INSERT", lv, "INSERT/INSERT: cannot conflict", OK, False))
        out.append(RlcCase("OPTIMIZE", "INSERT", lv, "OPTIMIZE/INSERT: cannot conflict", OK, False))
        out.append(RlcCase("INSERT", "OPTIMIZE", lv, "OPTIMIZE/INSERT: cannot conflict", OK, False))
        for d in DML:
            out.append(
                RlcCase(
                    "INSERT",
                    d,
                    lv,
                    "DML/INSERT: cannot conflict in WriteSerializable; can conflict in Serializable when modifying "
                    "the same row",
                    ConcurrentAppendException if lv == S else OK,
                    lv == S,  # different rows: Databricks resolves it, we conflict at Serializable
                )
            )
            out.append(RlcCase(d, "INSERT", lv, "DML/INSERT: blind INSERT second never conflicts", OK, False))
            out.append(
                RlcCase(
                    d,
                    d,
                    lv,
                    "DML/DML: can conflict when modifying the same row (here: different rows, same file)",
                    ConcurrentAppendException,
                    True,
                )
            )
            out.append(
                RlcCase(
                    d,
                    "OPTIMIZE",
                    lv,
                    "OPTIMIZE/DML: can conflict when ZORDER BY is used, cannot conflict otherwise",
                    ConcurrentDeleteReadException,
                    True,
                )
            )
            out.append(
                RlcCase(
                    "OPTIMIZE",
                    d,
                    lv,
                    "OPTIMIZE/DML: can conflict when ZORDER BY is used, cannot conflict otherwise",
                    ConcurrentAppendException,
                    True,
                )
            )
        out.append(
            RlcCase(
                "OPTIMIZE",
                "OPTIMIZE",
                lv,
                "OPTIMIZE/OPTIMIZE: can conflict when ZORDER BY is used, cannot conflict otherwise",
                ConcurrentDeleteReadException,
                True,
            )
        )
    return out


RLC_CASES = _rlc_cases()


@pytest.mark.parametrize(
    "case",
    RLC_CASES,
    ids=[f"RLC-{c.first}-then-{c.second}-{c.level}{'-fileLevel' if c.row_level_differs else ''}" for c in RLC_CASES],
)
def test_write_conflicts_with_row_level_concurrency_file_level_behaviour(case: RlcCase) -> None:
    """Seed 000/004 table 'with row-level concurrency' on a deletion-vector table.

    Expectations are today's file-level outcomes; where `row_level_differs`
    the document would resolve the conflict per row (a later issue).
    """
    r = _replay(case.first, case.second, case.level, dv=True)
    _assert_outcome(r, case.expected, winning_version=2)


def test_rlc_cells_that_cannot_conflict_do_not_conflict_at_file_level_either() -> None:
    """Every 'cannot conflict' cell of the RLC table that needs no row-level resolution commits here too."""
    for c in RLC_CASES:
        if c.expected is None:
            assert isinstance(_replay(c.first, c.second, c.level, dv=True), Accepted), c


# -- worked example (seed 000/004) -------------------------------------------------------------------


@pytest.mark.parametrize(("level", "commits"), [(S, False), (WS, True)])
def test_worked_example_long_delete_vs_insert(level: str, commits: bool) -> None:
    """t0 deleteTxn starts at v0, t1 insertTxn starts at v0, t2 insert commits v1, t3 delete commits v2.

    Seed 000/004: Serializable -> the delete conflicts; WriteSerializable -> it
    commits, as if the insert had run after it.
    """
    old = add("part-00000-v0.parquet")
    h = Harness(isolation=level, create_files=[old])  # the table holds data at v0
    assert h.head == 0
    delete = dml_op("DELETE", 0, predicates=["amount < 0"], scanned=[old], rewritten=[old], new_files=[])
    insert = insert_op(0, [add("part-00001-new.parquet")])
    assert h.must_commit(insert).version == 1
    r = h.decide(delete)
    if commits:
        assert isinstance(r, Accepted) and r.version == 2
        assert r.commit_info.values["isolationLevel"] == WS
        assert r.commit_info.values["readVersion"] == 0
    else:
        assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentAppendException)
        assert r.winning_version == 1
        assert "WRITE committed at version 1" in str(r.error)


# -- partitioning example (seed 003 / 000) --------------------------------------------------------------


def _dates_table(partitioned: bool, level: str) -> tuple[Harness, list[AddFile]]:
    files = [
        add("date=2009-06-01/a.parquet", date="2009-06-01") if partitioned else add("a.parquet"),
        add("date=2009-12-31/b.parquet", date="2009-12-31") if partitioned else add("b.parquet"),
        add("date=2011-03-01/c.parquet", date="2011-03-01") if partitioned else add("c.parquet"),
        add("date=2012-01-01/d.parquet", date="2012-01-01") if partitioned else add("d.parquet"),
    ]
    h = Harness(("date",) if partitioned else (), isolation=level, files=files)
    return h, files


def _update_after_2010(h: Harness, files: list[AddFile], partitioned: bool) -> Proposal:
    scanned = files[2:] if partitioned else files
    rewritten = files[2:] if partitioned else [files[1], files[2], files[3]]  # unpartitioned: mixed files
    new = (
        [add("date=2011-03-01/c2.parquet", date="2011-03-01"), add("date=2012-01-01/d2.parquet", date="2012-01-01")]
        if partitioned
        else [add("bcd2.parquet")]
    )
    return dml_op("UPDATE", h.head, predicates=["date > '2010-01-01'"], scanned=scanned, rewritten=rewritten, new_files=new)


def _delete_before_2010(h: Harness, files: list[AddFile], partitioned: bool) -> Proposal:
    scanned = files[:2] if partitioned else files
    rewritten = files[:2] if partitioned else [files[0], files[1]]
    new = [] if partitioned else [add("b3.parquet")]
    return dml_op("DELETE", h.head, predicates=["date < '2010-01-01'"], scanned=scanned, rewritten=rewritten, new_files=new)


@pytest.mark.parametrize("level", [S, WS])
@pytest.mark.parametrize("update_first", [True, False], ids=["update-first", "delete-first"])
def test_partitioning_example_conflicts_when_not_partitioned_by_date(level: str, update_first: bool) -> None:
    """Seed 003: UPDATE ... WHERE date > '2010-01-01' and DELETE ... WHERE date < '2010-01-01' conflict
    if the table is not partitioned by date (both may modify the same files)."""
    h, files = _dates_table(False, level)
    upd, dele = _update_after_2010(h, files, False), _delete_before_2010(h, files, False)
    first, second = (upd, dele) if update_first else (dele, upd)
    h.must_commit(first)
    r = h.decide(second)
    assert isinstance(r, Rejected)
    # unpartitioned: the winner's rewritten files are appends the second txn should have read
    assert isinstance(r.error, ConcurrentAppendException)
    assert r.error.partition is None  # no partition hint on an unpartitioned table


@pytest.mark.parametrize("level", [S, WS])
@pytest.mark.parametrize("update_first", [True, False], ids=["update-first", "delete-first"])
def test_partitioning_example_no_conflict_when_partitioned_by_date(level: str, update_first: bool) -> None:
    """Seed 003: 'Partitioning the table by date will avoid the conflict.'"""
    h, files = _dates_table(True, level)
    upd, dele = _update_after_2010(h, files, True), _delete_before_2010(h, files, True)
    first, second = (upd, dele) if update_first else (dele, upd)
    h.must_commit(first)
    r = h.decide(second)
    assert isinstance(r, Accepted), r
    assert r.version == 3


# -- MERGE example (seed 003 / 000) -----------------------------------------------------------------------

IMPLICIT = "s.user_id = t.user_id AND s.date = t.date AND s.country = t.country"


def _merge(h: Harness, day: str, country: str, files: list[AddFile], explicit: bool) -> Proposal:
    cond = IMPLICIT + (f" AND t.date = '{day}' AND t.country = '{country}'" if explicit else "")
    own = [f for f in files if f.partition_values == {"date": day, "country": country}]
    scanned = own if explicit else files  # the implicit condition scans the whole table
    new = [add(f"date={day}/country={country}/merged-{country}.parquet", date=day, country=country)]
    return dml_op("MERGE", h.head, predicates=[cond], scanned=scanned, rewritten=own, new_files=new)


def _two_partition_table(level: str) -> tuple[Harness, list[AddFile]]:
    files = [
        add("date=2024-05-01/country=US/u.parquet", date="2024-05-01", country="US"),
        add("date=2024-05-02/country=DE/d.parquet", date="2024-05-02", country="DE"),
    ]
    return Harness(("date", "country"), isolation=level, files=files), files


@pytest.mark.parametrize("level", [S, WS])
def test_merge_example_implicit_condition_conflicts(level: str) -> None:
    """Seed 003: the join-only condition 'can scan the entire table and can conflict with concurrent
    operations updating any other partitions'."""
    h, files = _two_partition_table(level)
    us = _merge(h, "2024-05-01", "US", files, explicit=False)
    de = _merge(h, "2024-05-02", "DE", files, explicit=False)
    h.must_commit(us)
    r = h.decide(de)
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentAppendException)
    assert r.error.partition == "[date=2024-05-01, country=US]"
    assert r.error.winning_operation == "MERGE"


@pytest.mark.parametrize("level", [S, WS])
def test_merge_example_explicit_partition_condition_does_not_conflict(level: str) -> None:
    """Seed 003: adding `t.date = <date> AND t.country = <country>` makes concurrent MERGEs on different
    dates and countries safe."""
    h, files = _two_partition_table(level)
    us = _merge(h, "2024-05-01", "US", files, explicit=True)
    de = _merge(h, "2024-05-02", "DE", files, explicit=True)
    h.must_commit(us)
    r = h.decide(de)
    assert isinstance(r, Accepted), r


@pytest.mark.parametrize("level", [S, WS])
def test_merge_example_explicit_condition_same_partition_still_conflicts(level: str) -> None:
    """The explicit condition only helps when the partitions differ: two MERGEs into US/2024-05-01 conflict."""
    h, files = _two_partition_table(level)
    one = _merge(h, "2024-05-01", "US", files, explicit=True)
    two = _merge(h, "2024-05-01", "US", files, explicit=True)
    h.must_commit(one)
    r = h.decide(two)
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentAppendException)


def test_blind_insert_documented_as_never_conflicting_even_same_partition() -> None:
    """Seed 003: 'files added by blind INSERT operations do not conflict with any operation, even if they
    touch the same partition' (WriteSerializable) -- and 'if the isolation level is set to Serializable,
    then blind appends may conflict'."""
    for level, expect_conflict in ((WS, False), (S, True)):
        h, files = _two_partition_table(level)
        upd = dml_op(
            "UPDATE",
            h.head,
            predicates=["date = '2024-05-01' AND country = 'US'"],
            scanned=[files[0]],
            rewritten=[files[0]],
            new_files=[add("date=2024-05-01/country=US/u2.parquet", date="2024-05-01", country="US")],
        )
        h.must_commit(insert_op(h.head, [add("date=2024-05-01/country=US/ins.parquet", date="2024-05-01", country="US")]))
        r = h.decide(upd)
        assert isinstance(r, Rejected) is expect_conflict, (level, r)


def test_removal_of_helper_keeps_partition_values() -> None:
    f = add("date=2024-05-01/x.parquet", date="2024-05-01")
    assert removal_of(f).partition_values == {"date": "2024-05-01"}
