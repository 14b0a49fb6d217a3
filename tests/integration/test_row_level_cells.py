"""The seeds' table "write conflicts with row-level concurrency", cell by cell, as real concurrent operations.

Every cell is two operations through the writer (`Table`) and a running
coordinator on an unpartitioned table with deletion vectors, both from one
snapshot, the second committed after the first, at WriteSerializable and at
Serializable (`delta.isolationLevel`). The table holds ids 0-9 in one file
and 10-19 in another. What each cell must do is the seed's table:

=========================  ==========  ========================================================
                           INSERT      UPDATE, DELETE, MERGE INTO                  OPTIMIZE
=========================  ==========  ========================================================
INSERT                     cannot
UPDATE, DELETE, MERGE      WS: cannot; S: can when modifying the same rows      can when modifying the same rows
OPTIMIZE                   cannot      can with ZORDER BY, cannot otherwise        can with ZORDER BY, cannot otherwise
=========================  ==========  ========================================================

"Can conflict" cells are run both ways: rows disjoint from the other
operation's commit (row-level resolution), the same rows conflict. For an
INSERT, "the same rows" are inserted rows the DELETE/UPDATE/MERGE's condition
selects. Partitioned tables keep the file-level rules, and so do complex
conditions (the seeds' limits): one cell each.

Each cell checks the rows afterwards, with our reader and with delta-rs,
against the two operations' effects composed (each computed on the snapshot
both read): a committed pair loses no update and resurrects no row; a
rejected second operation leaves the first one's result.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from deltacoord.reader.deletion_vectors import keep_mask, read_deletion_vector, write_deletion_vector
from deltacoord.reader.log import data_object
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.errors import DeltaConcurrentModificationException
from deltacoord.schemas.row_map import ROW_MAP_KEY
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.test_writer_operations import SCHEMA, Env, data, running_env

pytestmark = pytest.mark.kafka

WS, S = "WriteSerializable", "Serializable"
DAY = "2024-01-01"
OK, CONFLICT = "commit", "conflict"
Row = tuple[Any, ...]

#: The rows an operation selects: A in the first file; B other rows of that file; C overlaps A (row 3).
A, B, C = (2, 3), (6, 7), (3, 4)


@dataclass(frozen=True)
class Op:
    """An operation on `rows` (ids); INSERT inserts new ids, or ids `rows` again when it must match the other's rows."""

    kind: str
    rows: tuple[int, ...] = A

    def __str__(self) -> str:
        return self.kind if self.kind in ("OPTIMIZE", "ZORDER") else f"{self.kind}{list(self.rows)}"


@dataclass(frozen=True)
class Cell:
    first: Op
    second: Op
    ws: str
    s: str
    why: str

    def id(self, level: str) -> str:
        return f"{self.first}-then-{self.second}-{'WS' if level == WS else 'S'}"


DML = ("DELETE", "UPDATE", "MERGE")
NEW = (100, 101)


def _cells() -> list[Cell]:
    """The seed's table as cells: each pair in both orders, outcomes at (WriteSerializable, Serializable)."""
    cells = [Cell(Op("INSERT", NEW), Op("INSERT", (102,)), OK, OK, "INSERT/INSERT: cannot conflict")]
    for d in DML:
        cells += [
            Cell(Op("INSERT", NEW), Op(d, A), OK, OK, "DML/INSERT: the inserted rows are not the DML's rows"),
            Cell(Op("INSERT", A), Op(d, A), OK, CONFLICT,
                 "DML/INSERT: cannot conflict in WS; can in S when modifying the same rows (inserted rows it selects)"),
            Cell(Op(d, A), Op("INSERT", A), OK, OK, "DML/INSERT: an INSERT reads nothing, so nothing it read changed"),
            Cell(Op("OPTIMIZE"), Op(d, A), OK, OK, "OPTIMIZE/DML: cannot conflict without ZORDER BY"),
            Cell(Op(d, A), Op("OPTIMIZE"), OK, OK, "OPTIMIZE/DML: cannot conflict without ZORDER BY"),
            Cell(Op("ZORDER"), Op(d, A), CONFLICT, CONFLICT, "OPTIMIZE/DML: can conflict when ZORDER BY is used"),
            Cell(Op(d, A), Op("ZORDER"), CONFLICT, CONFLICT, "OPTIMIZE/DML: can conflict when ZORDER BY is used"),
        ]
        for e in DML:
            cells += [
                Cell(Op(d, A), Op(e, B), OK, OK, "DML/DML: other rows of the same file do not conflict"),
                Cell(Op(d, A), Op(e, C), CONFLICT, CONFLICT, "DML/DML: can conflict when modifying the same rows"),
            ]
    cells += [
        Cell(Op("OPTIMIZE"), Op("INSERT", NEW), OK, OK, "OPTIMIZE/INSERT: cannot conflict"),
        Cell(Op("INSERT", NEW), Op("OPTIMIZE"), OK, OK, "OPTIMIZE/INSERT: cannot conflict"),
        Cell(Op("ZORDER"), Op("INSERT", NEW), OK, OK, "OPTIMIZE/INSERT: cannot conflict"),
        Cell(Op("INSERT", NEW), Op("ZORDER"), OK, OK, "OPTIMIZE/INSERT: cannot conflict"),
        # OPTIMIZE/OPTIMIZE of the same files without ZORDER BY: the seed says they cannot conflict. Delta's
        # ConflictChecker fails the second (ConcurrentDeleteDeleteException: both remove the same files), as
        # committing both as they are would show each row twice; here the second commits through the first's
        # row map with every merged row already moved, so it adds and removes nothing.
        Cell(Op("OPTIMIZE"), Op("OPTIMIZE"), OK, OK, "OPTIMIZE/OPTIMIZE: cannot conflict without ZORDER BY"),
        Cell(Op("ZORDER"), Op("ZORDER"), CONFLICT, CONFLICT, "OPTIMIZE/OPTIMIZE: can conflict when ZORDER BY is used"),
        Cell(Op("OPTIMIZE"), Op("ZORDER"), CONFLICT, CONFLICT, "OPTIMIZE/OPTIMIZE: can conflict when ZORDER BY is used"),
        Cell(Op("ZORDER"), Op("OPTIMIZE"), CONFLICT, CONFLICT, "OPTIMIZE/OPTIMIZE: can conflict when ZORDER BY is used"),
    ]
    return cells


CELLS = _cells()
CASES = [pytest.param(c, level, id=c.id(level)) for c in CELLS for level in (WS, S)]


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def two_files(env: Env, path: Path, level: str, partition_by: tuple[str, ...] = ()) -> Table:
    """A deletion-vector table at `level` with ids 0-9 in one file and 10-19 in another."""
    t = env.table(path)
    t.create(SCHEMA, partition_by=partition_by, properties={"delta.enableDeletionVectors": "true",
                                                           "delta.isolationLevel": level})
    t.append(data(list(range(10)), DAY, "v"))
    t.append(data(list(range(10, 20)), DAY, "v"))
    return t


def ids_in(rows: tuple[int, ...]) -> str:
    return f"id IN ({', '.join(map(str, rows))})"


def run(t: Table, op: Op, snap: Snapshot) -> None:
    """Run `op` from `snap` through the writer (committed, or raising the coordinator's conflict)."""
    if op.kind == "INSERT":
        t.append(data(list(op.rows), DAY, "i"), snapshot=snap)
    elif op.kind == "DELETE":
        t.delete(ids_in(op.rows), snapshot=snap)
    elif op.kind == "UPDATE":
        t.update(ids_in(op.rows), {"value": "'u'"}, snapshot=snap)
    elif op.kind == "MERGE":
        t.merge(data(list(op.rows), DAY, "m"), f"s.id = t.id AND t.{ids_in(op.rows)}", when_matched_update="*",
                snapshot=snap)
    elif op.kind == "OPTIMIZE":
        t.optimize(snapshot=snap)
    elif op.kind == "ZORDER":
        t.optimize(zorder_by=["value", "id"], snapshot=snap)
    else:
        raise AssertionError(op.kind)


def effect(op: Op, before: list[Row]) -> Callable[[list[Row]], list[Row]]:
    """What `op` does, decided on the rows it read (`before`), as a change applicable to any later rows."""
    selected = {r for r in before if r[0] in op.rows}
    if op.kind == "INSERT":
        return lambda rows: [*rows, *((i, DAY, "i") for i in op.rows)]
    if op.kind in ("DELETE", "UPDATE", "MERGE"):
        value = {"DELETE": None, "UPDATE": "u", "MERGE": "m"}[op.kind]

        def change(rows: list[Row]) -> list[Row]:
            kept = [r for r in rows if r not in selected]
            return kept if value is None else kept + [(r[0], r[1], value) for r in selected]
        return change
    return lambda rows: rows  # OPTIMIZE changes no row


def rows_of(t: Table) -> list[Row]:
    return sorted(tuple(r.values()) for r in Snapshot.load(t.uri).to_pyarrow().to_pylist())


def delta_rs_rows(env: Env, t: Table) -> list[Row]:
    """The latest version as delta-rs reads it (its DataFusion scan applies deletion vectors)."""
    env.settle()
    dt = DeltaTable(str(t.root))
    out = pa.table(QueryBuilder().register("t", dt).execute("SELECT id, date, value FROM t").read_all())
    return sorted(tuple(r.values()) for r in out.to_pylist())


def play(env: Env, t: Table, first: Op, second: Op) -> tuple[str, list[Row]]:
    """Both operations from one snapshot, the second after the first; the second's outcome and the rows
    a correct result must show."""
    snap = t.snapshot()
    before = rows_of(t)
    run(t, first, snap)
    expect = effect(first, before)(before)
    try:
        run(t, second, snap)
    except DeltaConcurrentModificationException:
        outcome = CONFLICT
    else:
        outcome = OK
        expect = effect(second, before)(expect)
    return outcome, sorted(expect)


@pytest.mark.parametrize(("cell", "level"), CASES)
def test_seed_cell(env: Env, tmp_path: Path, cell: Cell, level: str) -> None:
    t = two_files(env, tmp_path / "t", level)
    outcome, expect = play(env, t, cell.first, cell.second)
    assert outcome == (cell.ws if level == WS else cell.s), cell.why
    assert rows_of(t) == expect, "no lost update, no resurrected row"
    assert delta_rs_rows(env, t) == expect, "delta-rs reads the same rows"


def test_optimize_records_its_row_map_and_zorder_its_columns(env: Env, tmp_path: Path) -> None:
    """What the rules read: a compaction's row map, or Delta's zOrderBy parameter (and no map) for ZORDER BY."""
    t = two_files(env, tmp_path / "t", WS)
    v = t.optimize().version
    t.wait_published(v)
    info = t.history(1)[0]
    assert info["operationParameters"]["zOrderBy"] == "[]"
    [group] = info[ROW_MAP_KEY]
    assert [s[1] for s in group["sources"]] == [10, 10] and [n for _p, n in group["targets"]] == [20]
    t.append(data([5, 15], DAY, "z"))
    v = t.optimize(zorder_by=["value"]).version
    t.wait_published(v)
    info = t.history(1)[0]
    assert json.loads(info["operationParameters"]["zOrderBy"]) == ["value"] and ROW_MAP_KEY not in info
    values = [r["value"] for r in Snapshot.load(t.uri).to_pyarrow().to_pylist()]
    assert values == sorted(values), "one Z-order column: the rows are sorted by it"


@pytest.mark.parametrize("level", [WS, S])
def test_partitioned_table_keeps_file_level_rules(env: Env, tmp_path: Path, level: str) -> None:
    """Row-level concurrency needs an unpartitioned table: other rows of the same file conflict."""
    t = two_files(env, tmp_path / "t", level, partition_by=("date",))
    outcome, expect = play(env, t, Op("DELETE", A), Op("DELETE", B))
    assert outcome == CONFLICT
    assert rows_of(t) == expect == delta_rs_rows(env, t)
    # OPTIMIZE without ZORDER BY still does not conflict on a deletion-vector table (the seed's table without
    # row-level concurrency says so too).
    t = two_files(env, tmp_path / "t2", level, partition_by=("date",))
    outcome, expect = play(env, t, Op("OPTIMIZE"), Op("DELETE", A))
    assert outcome == OK
    assert rows_of(t) == expect == delta_rs_rows(env, t)


def delete_by_own_evaluation(t: Table, snap: Snapshot, condition: str, ids: tuple[int, ...]) -> None:
    """A DELETE from another engine that evaluated `condition` itself (a subquery this writer cannot run):
    it marks the rows with `ids` deleted by a deletion vector and declares `condition` as read."""
    tx = t.begin(snap)
    tx.read_predicate(condition)
    for add in snap.files():
        table = data_object(t.storage, add.path).read_parquet_file().read()
        alive = keep_mask(table.num_rows, read_deletion_vector(t.storage, add.deletion_vector)) \
            if add.deletion_vector is not None else [True] * table.num_rows
        hits = [i for i, x in enumerate(table.column("id").to_pylist()) if x in ids and alive[i]]
        tx.read_file(add)
        if not hits:
            continue
        old = read_deletion_vector(t.storage, add.deletion_vector).tolist() if add.deletion_vector is not None else []
        dv = write_deletion_vector(t.storage, sorted(set(old) | set(hits)))
        stats = json.loads(add.stats or "{}")
        tx.remove(add)
        tx.add(dataclasses.replace(add, deletion_vector=dv, data_change=True,
                                   stats=json.dumps({**stats, "tightBounds": False})))
    tx.commit("DELETE", parameters={"predicate": json.dumps([condition])})


@pytest.mark.parametrize("level", [WS, S])
def test_complex_condition_keeps_file_level_rules(env: Env, tmp_path: Path, level: str) -> None:
    """The seeds' limits: a condition with a subquery follows the file-level rules, so other rows of the same
    file conflict; the same rows deleted under a plain condition commit (the control)."""
    condition = f"id IN (SELECT id FROM t WHERE {ids_in(B)})"
    for name, text, want in (("complex", condition, CONFLICT), ("plain", ids_in(B), OK)):
        t = two_files(env, tmp_path / name, level)
        snap = t.snapshot()
        before = rows_of(t)
        t.delete(ids_in(A), snapshot=snap)
        try:
            delete_by_own_evaluation(t, snap, text, B)
            outcome = OK
        except DeltaConcurrentModificationException:
            outcome = CONFLICT
        assert outcome == want, name
        gone = set(A) | (set(B) if want == OK else set())
        assert rows_of(t) == [r for r in before if r[0] not in gone] == delta_rs_rows(env, t)
