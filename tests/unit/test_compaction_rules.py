"""OPTIMIZE against DELETE/UPDATE/MERGE on deletion-vector tables, through `decide` (pure rules, no I/O).

The seeds: with deletion vectors, OPTIMIZE cannot conflict with DELETE, UPDATE
or MERGE unless ZORDER BY is used. A row-mapped compaction and a row change of
a file it merged commit in either order, the deleted rows moved through the
compaction's row map; a ZORDER BY keeps the file-level rules. Each case checks
the rows the table shows afterwards against the rows each file holds (`Files`),
so a lost update or a resurrected row fails.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from deltacoord.coordinator.rules.compaction import compaction_of
from deltacoord.coordinator.rules.outcomes import Accepted, Rejected
from deltacoord.schemas.actions import Action, AddFile, DeletionVector, RemoveFile
from deltacoord.schemas.deletion_vectors import inline_descriptor, inline_rows
from deltacoord.schemas.errors import ConcurrentDeleteDeleteException, DeltaConcurrentModificationException
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.row_map import ROW_MAP_KEY, RowGroup, Source, Target, decode_row_map, encode_row_map
from tests.unit.builders import NOW, Harness, proposal

S, WS = "Serializable", "WriteSerializable"
DV = {"delta.enableDeletionVectors": "true"}


@dataclass
class Files:
    """The rows (ids) each data file physically holds, to read a table state the way a reader does."""

    content: dict[str, list[int]] = field(default_factory=dict)
    n: int = 0

    def file(self, ids: Sequence[int], data_change: bool = True, **parts: object) -> AddFile:
        self.n += 1
        path = f"part-{self.n:05d}.parquet"
        self.content[path] = list(ids)
        stats = json.dumps({"numRecords": len(ids), "minValues": {"x": min(ids)}, "maxValues": {"x": max(ids)}})
        pv = {k: str(v) for k, v in parts.items()}
        return AddFile(path, pv, 100, NOW, data_change, stats)

    def visible(self, h: Harness) -> list[int]:
        out: list[int] = []
        for a in live_files(h):
            gone = set(inline_rows(a.deletion_vector).tolist()) if a.deletion_vector else set()
            out += [x for i, x in enumerate(self.content[a.path]) if i not in gone]
        return sorted(out)

    def live_ids(self, a: AddFile) -> list[int]:
        gone = set(inline_rows(a.deletion_vector).tolist()) if a.deletion_vector else set()
        return [x for i, x in enumerate(self.content[a.path]) if i not in gone]


def live_files(h: Harness) -> list[AddFile]:
    """The table's live files, replaying every commit the harness applied."""
    live: dict[tuple[str, str | None], AddFile] = {}
    for actions in h.log:
        for a in actions:
            if isinstance(a, RemoveFile):
                live.pop(a.key(), None)
            elif isinstance(a, AddFile):
                live[(a.path, a.deletion_vector.unique_id() if a.deletion_vector else None)] = a
    return list(live.values())


class Table(Harness):
    """A harness that keeps every committed commit's actions (for `live_files`)."""

    def __init__(self, files: Sequence[AddFile], isolation: str = WS, partition_by: Sequence[str] = ()) -> None:
        self.log: list[tuple[Action, ...]] = []
        super().__init__(partition_by, isolation=isolation, config=DV, files=files)

    def run(self, p: Proposal, now_ms: int | None = None) -> Accepted | Rejected:  # type: ignore[override]
        r = super().run(p, now_ms)
        assert isinstance(r, (Accepted, Rejected))
        if isinstance(r, Accepted):
            self.log.append(r.actions)
        return r

    def live(self, path: str) -> AddFile:
        return next(a for a in live_files(self) if a.path == path)


def delete(t: Table, files: Files, base: AddFile, ids: Sequence[int], read_version: int, op: str = "DELETE",
           predicate: str | None = None, new: Sequence[AddFile] = ()) -> Proposal:
    """Delete (or update, with `new` rows) the rows with `ids` of `base` by a deletion vector."""
    rows = [i for i, x in enumerate(files.content[base.path]) if x in ids]
    old = inline_rows(base.deletion_vector) if base.deletion_vector else np.zeros(0, np.uint64)
    gone = np.union1d(old, np.array(rows, np.uint64))
    actions: list[Action] = [base.to_remove(NOW)]
    if len(gone) < len(files.content[base.path]):
        actions.append(AddFile(base.path, base.partition_values, base.size, base.modification_time, True, base.stats,
                               deletion_vector=inline_descriptor(gone)))
    actions += list(new)
    text = predicate or f"x IN ({', '.join(map(str, ids))})"
    return proposal(read_version, actions, operation=op, predicates=[text], read_files=[base])


def optimize(t: Table, files: Files, inputs: Sequence[AddFile], read_version: int, *, zorder: bool = False,
             outputs: int = 1, row_map: bool = True) -> tuple[Proposal, list[AddFile]]:
    """Compact `inputs` (their live rows, in order) into `outputs` files, recording the row map."""
    rows: list[int] = []
    for a in inputs:
        rows += files.live_ids(a)
    size = -(-len(rows) // outputs)
    outs = [files.file(rows[i:i + size], data_change=False, **dict(inputs[0].partition_values))
            for i in range(0, len(rows), size)]
    actions: list[Action] = [a.to_remove(NOW, data_change=False) for a in inputs] + list(outs)
    groups = [RowGroup(tuple(Source(a.path, len(files.live_ids(a)), a.deletion_vector) for a in inputs),
                       tuple(Target(o.path, len(files.content[o.path])) for o in outs))]
    info = {"engineInfo": "tests", ROW_MAP_KEY: encode_row_map(groups)} if row_map and not zorder else None
    p = proposal(read_version, actions, operation="OPTIMIZE", changes_data=False, read_files=inputs,
                 operation_parameters={"predicate": "[]", "zOrderBy": json.dumps(["x"] if zorder else [])},
                 commit_info=info)
    return p, outs


def setup(level: str = WS, partition_by: Sequence[str] = ()) -> tuple[Table, Files, AddFile, AddFile]:
    files = Files()
    parts = {"country": "a"} if partition_by else {}
    f1 = files.file(range(0, 10), **parts)
    f2 = files.file(range(10, 20), **parts)
    return Table([f1, f2], level, partition_by), files, f1, f2


@pytest.mark.parametrize("level", [S, WS])
@pytest.mark.parametrize("op", ["DELETE", "UPDATE", "MERGE"])
def test_optimize_then_a_row_change_commits_on_the_output(level: str, op: str) -> None:
    t, files, f1, f2 = setup(level)
    v = t.head
    p, [g] = optimize(t, files, [f1, f2], v)
    t.must_commit(p)
    new = [files.file([103])] if op != "DELETE" else []
    r = t.must_commit(delete(t, files, f1, [3], v, op=op, new=new))
    rm = next(a for a in r.actions if isinstance(a, RemoveFile))
    assert rm.path == g.path and rm.deletion_vector is None, "the change now applies to the compaction's output"
    assert inline_rows(t.live(g.path).deletion_vector).tolist() == [3]  # type: ignore[arg-type]
    expect = [x for x in range(20) if x != 3] + ([103] if new else [])
    assert files.visible(t) == sorted(expect)


@pytest.mark.parametrize("level", [S, WS])
@pytest.mark.parametrize("op", ["DELETE", "UPDATE", "MERGE"])
def test_a_row_change_then_optimize_commits_with_a_vector_on_its_output(level: str, op: str) -> None:
    t, files, f1, f2 = setup(level)
    v = t.head
    new = [files.file([113])] if op != "DELETE" else []
    first = t.must_commit(delete(t, files, f2, [13, 14], v, op=op, new=new))
    p, [g] = optimize(t, files, [f1, f2], v)
    r = t.must_commit(p)
    winner_dv = next(a for a in first.actions if isinstance(a, AddFile) and a.path == f2.path).deletion_vector
    rm = next(a for a in r.actions if isinstance(a, RemoveFile) and a.path == f2.path)
    assert rm.deletion_vector == winner_dv, "the compaction removes the file as the winner left it"
    out = next(a for a in r.actions if isinstance(a, AddFile))
    assert out.path == g.path and out.deletion_vector is not None and not out.data_change
    assert inline_rows(out.deletion_vector).tolist() == [13, 14]
    assert json.loads(out.stats or "{}")["tightBounds"] is False
    assert files.visible(t) == sorted([x for x in range(20) if x not in (13, 14)] + ([113] if new else []))


def test_a_whole_file_deleted_before_optimize_is_deleted_from_its_output() -> None:
    t, files, f1, f2 = setup()
    v = t.head
    t.must_commit(delete(t, files, f1, list(range(10)), v))  # every row: the file is removed
    p, [g] = optimize(t, files, [f1, f2], v)
    r = t.must_commit(p)
    assert [a.path for a in r.actions if isinstance(a, RemoveFile)] == [f2.path], "f1 is gone already"
    assert inline_rows(t.live(g.path).deletion_vector).tolist() == list(range(10))  # type: ignore[arg-type]
    assert files.visible(t) == list(range(10, 20))


def test_a_whole_file_deleted_after_optimize_deletes_its_rows_of_the_output() -> None:
    t, files, f1, f2 = setup()
    v = t.head
    p, [g] = optimize(t, files, [f1, f2], v)
    t.must_commit(p)
    t.must_commit(delete(t, files, f2, list(range(10, 20)), v))
    assert inline_rows(t.live(g.path).deletion_vector).tolist() == list(range(10, 20))  # type: ignore[arg-type]
    assert files.visible(t) == list(range(10))


def test_two_optimizes_of_the_same_files_both_commit_and_the_second_changes_nothing() -> None:
    t, files, f1, f2 = setup()
    v = t.head
    first, _ = optimize(t, files, [f1, f2], v)
    t.must_commit(first)
    second, _ = optimize(t, files, [f1, f2], v)
    r = t.must_commit(second)
    assert not [a for a in r.actions if isinstance(a, (AddFile, RemoveFile))], "nothing left to compact"
    assert files.visible(t) == list(range(20))


def test_rows_spread_over_two_outputs_and_later_changes_rebase_on_each_other() -> None:
    t, files, f1, f2 = setup()
    v = t.head
    p, [g1, g2] = optimize(t, files, [f1, f2], v, outputs=2)
    t.must_commit(p)
    t.must_commit(delete(t, files, f1, [1, 2], v))          # rows of g1
    t.must_commit(delete(t, files, f2, [11, 18], v))        # rows of g2
    t.must_commit(delete(t, files, f2, [12], v))            # g2 again: rebased onto the previous vector
    r = t.decide(delete(t, files, f2, [18, 19], v))         # row 18 again
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentDeleteDeleteException)
    assert inline_rows(t.live(g1.path).deletion_vector).tolist() == [1, 2]  # type: ignore[arg-type]
    assert inline_rows(t.live(g2.path).deletion_vector).tolist() == [1, 2, 8]  # type: ignore[arg-type]
    assert files.visible(t) == [x for x in range(20) if x not in (1, 2, 11, 12, 18)]


def test_a_change_of_rows_in_two_merged_files_becomes_one_change_of_the_output() -> None:
    t, files, f1, f2 = setup()
    v = t.head
    p, [g] = optimize(t, files, [f1, f2], v)
    t.must_commit(p)
    both = delete(t, files, f1, [0], v)
    more = delete(t, files, f2, [19], v)
    change = proposal(v, [*both.actions, *more.actions], operation="DELETE", predicates=["x IN (0, 19)"],
                      read_files=[f1, f2])
    r = t.must_commit(change)
    assert [a.path for a in r.actions if isinstance(a, (AddFile, RemoveFile))] == [g.path, g.path]
    assert files.visible(t) == list(range(1, 19))


def test_a_compaction_of_a_file_with_a_vector_maps_ranks_past_the_deleted_rows() -> None:
    t, files, f1, f2 = setup()
    v0 = t.head
    t.must_commit(delete(t, files, f1, [2, 5], v0))
    v = t.head
    f1_now = t.live(f1.path)
    p, [g] = optimize(t, files, [f1_now, f2], v)  # g holds f1's 8 live rows, then f2's
    t.must_commit(p)
    t.must_commit(delete(t, files, f1_now, [6], v))  # physical row 6 of f1 is row 4 of g
    assert inline_rows(t.live(g.path).deletion_vector).tolist() == [4]  # type: ignore[arg-type]
    assert files.visible(t) == [x for x in range(20) if x not in (2, 5, 6)]


@pytest.mark.parametrize("level", [S, WS])
def test_zorder_conflicts_in_either_order(level: str) -> None:
    t, files, f1, f2 = setup(level)
    v = t.head
    p, _ = optimize(t, files, [f1, f2], v, zorder=True)
    t.must_commit(p)
    r = t.decide(delete(t, files, f1, [3], v))
    assert isinstance(r, Rejected) and isinstance(r.error, DeltaConcurrentModificationException)

    t, files, f1, f2 = setup(level)
    v = t.head
    t.must_commit(delete(t, files, f1, [3], v))
    p, _ = optimize(t, files, [f1, f2], v, zorder=True)
    r = t.decide(p)
    assert isinstance(r, Rejected) and isinstance(r.error, DeltaConcurrentModificationException)


def test_without_a_row_map_optimize_keeps_the_file_level_rules() -> None:
    t, files, f1, f2 = setup()
    v = t.head
    p, _ = optimize(t, files, [f1, f2], v, row_map=False)
    t.must_commit(p)
    assert isinstance(t.decide(delete(t, files, f1, [3], v)), Rejected)


def test_a_vector_in_a_file_keeps_the_file_level_rules() -> None:
    t, files, f1, f2 = setup()
    v = t.head
    p, _ = optimize(t, files, [f1, f2], v)
    t.must_commit(p)
    change = delete(t, files, f1, [3], v)
    on_disk = DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 40, 1)
    actions = [a if not isinstance(a, AddFile) else AddFile(a.path, a.partition_values, a.size, a.modification_time, True,
                                                            a.stats, deletion_vector=on_disk) for a in change.actions]
    r = t.decide(proposal(v, actions, operation="DELETE", predicates=["x = 3"], read_files=[f1]))
    assert isinstance(r, Rejected)


def test_partitioned_table_optimize_does_not_conflict_but_row_changes_of_one_file_do() -> None:
    t, files, f1, f2 = setup(partition_by=["country"])
    v = t.head
    p, _ = optimize(t, files, [f1, f2], v)
    t.must_commit(p)
    t.must_commit(delete(t, files, f1, [3], v, predicate="country = 'a' AND x = 3"))
    assert files.visible(t) == [x for x in range(20) if x != 3]

    t, files, f1, f2 = setup(partition_by=["country"])
    v = t.head
    t.must_commit(delete(t, files, f1, [3], v, predicate="country = 'a' AND x = 3"))
    r = t.decide(delete(t, files, f1, [4], v, predicate="country = 'a' AND x = 4"))
    assert isinstance(r, Rejected), "partitioned tables keep the file-level rules for row changes"


@pytest.mark.parametrize("predicate", ["x = (SELECT max(x) FROM t)", "x = floor(rand() * 10)", "s.a = 4",
                                       "x IN (SELECT 4)"])
def test_complex_conditions_keep_the_file_level_rules(predicate: str) -> None:
    t, files, f1, _ = setup()
    v = t.head
    t.must_commit(delete(t, files, f1, [3], v))
    r = t.decide(delete(t, files, f1, [4], v, predicate=predicate))
    assert isinstance(r, Rejected) and not isinstance(r.error, ConcurrentDeleteDeleteException)
    # The same change with a plain condition commits.
    t.must_commit(delete(t, files, f1, [4], v))


def test_row_maps_that_do_not_add_up_are_ignored() -> None:
    good = encode_row_map([RowGroup((Source("a", 3, None),), (Target("g", 3),))])
    assert decode_row_map(good) is not None
    for bad in ([{"sources": [["a", 3, None]], "targets": [["g", 2]]}], [{"sources": [["a", -1, None]], "targets": []}],
                [{"sources": [], "targets": []}], "x", [{"sources": [["a", 1, None], ["a", 1, None]], "targets": [["g", 2]]}]):
        assert decode_row_map(bad) is None, bad
    # A map naming a file the commit does not remove, or an output it does not add, is not relied on.
    f = AddFile("g", {}, 1, 0, False, json.dumps({"numRecords": 3}))
    rm = RemoveFile("a", 0, False)
    info = {ROW_MAP_KEY: good}
    assert compaction_of("OPTIMIZE", {}, info, [rm, f], committed=False) is not None
    assert compaction_of("OPTIMIZE", {}, info, [f], committed=False) is None
    assert compaction_of("OPTIMIZE", {}, info, [rm], committed=False) is None
    assert compaction_of("OPTIMIZE", {"zOrderBy": '["x"]'}, info, [rm, f], committed=False) is None
    wrong_count = AddFile("g", {}, 1, 0, False, json.dumps({"numRecords": 4}))
    assert compaction_of("OPTIMIZE", {}, info, [rm, wrong_count], committed=False) is None


@pytest.mark.parametrize("level", [S, WS])
def test_a_file_only_read_may_be_removed_by_a_winner(level: str) -> None:
    """A DELETE that scanned a file (its statistics could not skip it) but selected none of its rows does not
    conflict with a winner deleting that file's last rows; complex conditions keep the file-level rules."""
    t, files, f1, f2 = setup(level)
    v = t.head
    t.must_commit(delete(t, files, f1, list(range(10)), v))  # f1 removed
    reader = delete(t, files, f2, [12], v, predicate="x >= 5 AND x <= 12")
    reader = proposal(v, reader.actions, operation="DELETE", predicates=reader.read_predicates, read_files=[f1, f2])
    t.must_commit(reader)
    assert files.visible(t) == [x for x in range(10, 20) if x != 12]

    t, files, f1, f2 = setup(level)
    v = t.head
    t.must_commit(delete(t, files, f1, list(range(10)), v))
    reader = delete(t, files, f2, [12], v)
    complex_reader = proposal(v, reader.actions, operation="DELETE", predicates=["x = (SELECT 12)"], read_files=[f1, f2])
    assert isinstance(t.decide(complex_reader), Rejected)


@pytest.mark.parametrize("bad", [
    [{"sources": [["part-00001.parquet", 10, {"storageType": "i", "pathOrInlineDv": "0", "sizeInBytes": "x",
                                              "cardinality": 1}]], "targets": [["g", 10]]}],
    [{"sources": [["part-00001.parquet", 10, "not a vector"]], "targets": [["g", 10]]}],
    [{"sources": [["part-00001.parquet", 10, None, "extra"]], "targets": [["g", 10]]}],
    [["sources", "targets"]],
    {"sources": []},
])
def test_a_hostile_row_map_is_ignored_not_raised(bad: object) -> None:
    """A writer's row map is input: one that does not decode leaves the file-level rules, never an exception."""
    t, files, f1, f2 = setup()
    v = t.head
    p, _ = optimize(t, files, [f1, f2], v, row_map=False)
    hostile = proposal(v, p.actions, operation="OPTIMIZE", changes_data=False, read_files=[f1, f2],
                       commit_info={"engineInfo": "tests", ROW_MAP_KEY: bad})
    t.must_commit(delete(t, files, f1, [3], v))
    assert isinstance(t.decide(hostile), Rejected)


def test_an_inline_vector_that_is_no_bitmap_keeps_the_file_level_rules() -> None:
    t, files, f1, _ = setup()
    v = t.head
    t.must_commit(delete(t, files, f1, [3], v))
    # The right magic number, then a bitmap cut short: decoding it fails inside `struct`, not with a DV error.
    garbage = DeletionVector("i", "^Bg9^0rr910000000000iXQKl", 20, 1)
    change = delete(t, files, f1, [4], v)
    actions = [a if not isinstance(a, AddFile) else AddFile(a.path, a.partition_values, a.size, a.modification_time, True,
                                                            a.stats, deletion_vector=garbage) for a in change.actions]
    assert isinstance(t.decide(proposal(v, actions, operation="DELETE", predicates=["x = 4"], read_files=[f1])), Rejected)
