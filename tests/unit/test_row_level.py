"""Row-level concurrency on deletion-vector tables, through `decide` (pure rules, no I/O).

The seed documents' table "write conflicts with row-level concurrency" at both
isolation levels, on an unpartitioned table with deletion vectors enabled:
INSERT cannot conflict with DELETE/UPDATE/MERGE at WriteSerializable and
conflicts at Serializable only when its rows are ones the DML would have read;
DELETE/UPDATE/MERGE conflict with each other only when they change the same
row. Partitioned tables and vectors stored in files keep the file-level rules.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest

from deltacoord.coordinator.rules.outcomes import Accepted, Rejected
from deltacoord.schemas.actions import Action, AddFile, DeletionVector, RemoveFile
from deltacoord.schemas.deletion_vectors import decode_roaring64, encode_roaring64, inline_descriptor, inline_rows
from deltacoord.schemas.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
)
from deltacoord.schemas.messages import Proposal
from tests.unit.builders import Harness, add, insert_op, proposal

S, WS = "Serializable", "WriteSerializable"
DV = {"delta.enableDeletionVectors": "true"}


def stats(lo: int, hi: int, n: int = 10) -> str:
    return json.dumps({"numRecords": n, "minValues": {"x": lo}, "maxValues": {"x": hi}})


F = add("part-00000-f.parquet", stats=stats(0, 9))


def with_dv(f: AddFile, dv: DeletionVector | None) -> AddFile:
    return AddFile(f.path, f.partition_values, f.size, f.modification_time, True, f.stats, deletion_vector=dv)


def dml(h: Harness, op: str, base: AddFile, rows: Sequence[int], *, predicate: str, new: Sequence[AddFile] = (),
        read_version: int | None = None) -> Proposal:
    """A DELETE/UPDATE/MERGE marking `rows` of `base` deleted (inline vector) and adding `new` files."""
    old = inline_rows(base.deletion_vector) if base.deletion_vector is not None else np.zeros(0, np.uint64)
    dv = inline_descriptor(np.union1d(old, np.array(rows, np.uint64)))
    actions: list[Action] = [base.to_remove(0), with_dv(base, dv), *new]
    return proposal(h.head if read_version is None else read_version, actions, operation=op, predicates=[predicate],
                    read_files=[base])


def committed_dv(r: Accepted, path: str) -> tuple[DeletionVector | None, DeletionVector | None]:
    rm = next(a for a in r.actions if isinstance(a, RemoveFile) and a.path == path)
    ad = next(a for a in r.actions if isinstance(a, AddFile) and a.path == path)
    return rm.deletion_vector, ad.deletion_vector


@pytest.mark.parametrize("level", [S, WS])
def test_deletes_of_different_rows_of_one_file_commit_with_the_union(level: str) -> None:
    h = Harness(isolation=level, config=DV, files=[F])
    v = h.head
    first = h.must_commit(dml(h, "DELETE", F, [2], predicate="x = 2", read_version=v))
    second = h.must_commit(dml(h, "DELETE", F, [7], predicate="x = 7", read_version=v))
    winner_dv = committed_dv(first, F.path)[1]
    old, new = committed_dv(second, F.path)
    assert old == winner_dv, "the loser's remove names the winner's vector"
    assert new is not None and new.storage_type == "i" and inline_rows(new).tolist() == [2, 7]
    # A third, from the same snapshot, rebases over both.
    third = h.must_commit(dml(h, "UPDATE", F, [4], predicate="x = 4", read_version=v,
                               new=[add("part-00000-u.parquet", stats=stats(40, 40, 1))]))
    assert inline_rows(committed_dv(third, F.path)[1]).tolist() == [2, 4, 7]  # type: ignore[arg-type]


@pytest.mark.parametrize("level", [S, WS])
@pytest.mark.parametrize(("first_op", "second_op"), [("DELETE", "DELETE"), ("UPDATE", "DELETE"), ("MERGE", "UPDATE")])
def test_the_same_row_conflicts(level: str, first_op: str, second_op: str) -> None:
    h = Harness(isolation=level, config=DV, files=[F])
    v = h.head
    h.must_commit(dml(h, first_op, F, [2, 3], predicate="x IN (2, 3)", read_version=v))
    r = h.decide(dml(h, second_op, F, [3, 4], predicate="x IN (3, 4)", read_version=v))
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentDeleteDeleteException)
    assert "row 3" in str(r.error)


@pytest.mark.parametrize("level", [S, WS])
def test_insert_against_dml(level: str) -> None:
    """INSERT then DML: no conflict at WriteSerializable; at Serializable only when the DML would read its rows."""
    for inserted, conflicts in ((stats(100, 120), False), (stats(0, 5), True)):
        h = Harness(isolation=level, config=DV, files=[F])
        v = h.head
        h.must_commit(insert_op(v, [add(f"part-00000-i{inserted[20:22]}.parquet", stats=inserted)]))
        r = h.decide(dml(h, "DELETE", F, [2], predicate="x = 2", read_version=v))
        if level == S and conflicts:
            assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentAppendException)
        else:
            assert isinstance(r, Accepted)
    # DML then INSERT: a blind append never conflicts.
    h = Harness(isolation=level, config=DV, files=[F])
    v = h.head
    h.must_commit(dml(h, "DELETE", F, [2], predicate="x = 2", read_version=v))
    assert isinstance(h.decide(insert_op(v, [add("part-00000-j.parquet", stats=stats(2, 2, 1))])), Accepted)


@pytest.mark.parametrize("level", [S, WS])
def test_an_update_whose_new_rows_a_concurrent_dml_would_read_conflicts(level: str) -> None:
    h = Harness(isolation=level, config=DV, files=[F])
    v = h.head
    h.must_commit(dml(h, "UPDATE", F, [1], predicate="x = 1", read_version=v,
                      new=[add("part-00000-u.parquet", stats=stats(50, 50, 1))]))
    miss = h.decide(dml(h, "DELETE", F, [3], predicate="x = 3", read_version=v))
    assert isinstance(miss, Accepted)
    hit = h.decide(dml(h, "DELETE", F, [3], predicate="x = 3 OR x >= 50", read_version=v))
    assert isinstance(hit, Rejected) and isinstance(hit.error, ConcurrentAppendException)


def test_a_reader_of_the_file_that_changes_nothing_in_it_does_not_conflict() -> None:
    g = add("part-00000-g.parquet", stats=stats(10, 19))
    h = Harness(isolation=S, config=DV, files=[F, g])
    v = h.head
    h.must_commit(dml(h, "DELETE", F, [2], predicate="x = 2", read_version=v))
    p = dml(h, "DELETE", g, [0], predicate="x = 10", read_version=v)
    p = proposal(v, p.actions, operation="DELETE", predicates=["x = 10"], read_files=[F, g])
    assert isinstance(h.decide(p), Accepted)


def test_file_level_rules_without_row_level_concurrency() -> None:
    # A partitioned DV table, a table without DVs, and vectors stored in files: the same two deletes conflict.
    pf = add("part-00000-p.parquet", stats=stats(0, 9), part=1)
    h = Harness(["part"], isolation=WS, config=DV, files=[pf])
    v = h.head
    h.must_commit(dml(h, "DELETE", pf, [2], predicate="part = 1", read_version=v))
    r = h.decide(dml(h, "DELETE", pf, [7], predicate="part = 1", read_version=v))
    assert isinstance(r, Rejected) and isinstance(r.error, (ConcurrentAppendException, ConcurrentDeleteReadException))

    h = Harness(isolation=WS, files=[F])
    v = h.head
    h.must_commit(dml(h, "DELETE", F, [2], predicate="x = 2", read_version=v))
    r = h.decide(dml(h, "DELETE", F, [7], predicate="x = 7", read_version=v))
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentAppendException)

    h = Harness(isolation=WS, config=DV, files=[F])
    v = h.head
    on_disk = DeletionVector("u", "ab" * 10, 40, 1, offset=1)
    h.must_commit(proposal(v, [F.to_remove(0), with_dv(F, on_disk)], operation="DELETE", predicates=["x = 2"],
                           read_files=[F]))
    r = h.decide(dml(h, "DELETE", F, [7], predicate="x = 7", read_version=v))
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentDeleteReadException)


def test_a_whole_file_removal_still_conflicts() -> None:
    h = Harness(isolation=WS, config=DV, files=[F])
    v = h.head
    h.must_commit(proposal(v, [F.to_remove(0, data_change=False), add("part-00000-o.parquet", data_change=False,
                                                                       stats=stats(0, 9))],
                           operation="OPTIMIZE", changes_data=False, read_files=[F]))
    r = h.decide(dml(h, "DELETE", F, [7], predicate="x = 7", read_version=v))
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentDeleteReadException)


def test_inline_bitmaps_round_trip() -> None:
    for rows in ([], [0], [1, 3, 5], list(range(5000)), [2**32 + 1, 7, 70000]):
        dv = inline_descriptor(rows)
        assert inline_rows(dv).tolist() == sorted(rows) and dv.cardinality == len(rows)
        assert decode_roaring64(encode_roaring64(rows)).tolist() == sorted(rows)
