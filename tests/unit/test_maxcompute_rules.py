"""The maxcompute profile's pure parts: the table as the seed states it, job types, time versions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from deltacoord.coordinator.rules import profiles
from deltacoord.coordinator.rules.maxcompute import TABLE, Cell
from deltacoord.coordinator.rules.outcomes import Accepted, Duplicate, Rejected
from deltacoord.schemas.actions import Action, AddFile, CommitInfo, Metadata, RemoveFile
from deltacoord.schemas.deletion_vectors import inline_rows
from deltacoord.schemas.errors import ConcurrentJobException
from deltacoord.schemas.jobs import TIME_VERSION_KEY, JobType, creates_time_version, is_time_version, job_type
from deltacoord.schemas.messages import Proposal
from tests.unit.builders import Harness
from tests.unit.test_compaction_rules import DV, WS, Files, Table, delete, live_files, optimize

IO, II, UD, MI, MA = JOB = tuple(JobType)
F, W, N, C = Cell.LATER_FAILS, Cell.OVERWRITES, Cell.NEW_DATA, Cell.COMPACTS

#: The seed's table, row = earlier-finishing job, column = later-finishing job.
SEED = {
    IO: (W, F, F, F, F),
    II: (W, F, F, C, F),
    UD: (W, F, F, C, F),
    MI: (W, N, N, F, C),
    MA: (W, N, N, F, F),
}


@pytest.mark.parametrize("earlier", JOB)
def test_table_is_the_seed(earlier: JobType) -> None:
    assert tuple(TABLE[(earlier, later)] for later in JOB) == SEED[earlier]


@pytest.mark.parametrize(
    ("operation", "parameters", "expected"),
    [
        ("WRITE", {"mode": "Overwrite"}, IO),
        ("WRITE", {"mode": "Append"}, II),
        ("WRITE", {}, II),
        ("TRUNCATE", {}, IO),
        ("STREAMING UPDATE", {"outputMode": "Append"}, II),
        ("STREAMING UPDATE", {"outputMode": "Complete"}, IO),
        ("UPDATE", {"predicate": "[]"}, UD),
        ("DELETE", {}, UD),
        ("MERGE", {}, UD),
        ("OPTIMIZE", {}, MI),
        ("OPTIMIZE", {"compaction": "minor"}, MI),
        ("OPTIMIZE", {"compaction": "major"}, MA),
        ("CREATE TABLE", {}, None),
        ("SET TBLPROPERTIES", {}, None),
    ],
)
def test_job_type_from_the_operation(operation: str, parameters: dict[str, str], expected: JobType | None) -> None:
    assert job_type(operation, parameters) is expected


def _add(data_change: bool) -> AddFile:
    return AddFile("a.parquet", {}, 1, 0, data_change)


def test_time_versions() -> None:
    assert creates_time_version([_add(True)])
    assert not creates_time_version([_add(False), RemoveFile("b.parquet", 0, False)])  # compaction
    assert creates_time_version([])  # nothing but commitInfo: not a reorganisation
    assert creates_time_version([_add(False), Metadata(id="m", schema_string="{}")])
    recorded = CommitInfo({TIME_VERSION_KEY: False})
    assert not is_time_version(recorded, [_add(True)])  # what the commit records wins
    assert is_time_version(CommitInfo({}), [_add(True)])


# --------------------------------------------------------------------------- compactions and row changes

MC = {"deltacoord.conflictProfile": "maxcompute"}


class McTable(Table):
    """A `maxcompute` table (with deletion vectors unless `dvs` is false), decided by its profile."""

    def __init__(self, files: Sequence[AddFile], partition_by: Sequence[str] = (), *, dvs: bool = True) -> None:
        self.log: list[tuple[Action, ...]] = []
        Harness.__init__(self, partition_by, isolation=WS, config={**MC, **(DV if dvs else {})}, files=files)

    def decide(self, p: Proposal, now_ms: int | None = None) -> Accepted | Rejected | Duplicate:
        return profiles.decide(self.state, p, self.tick() if now_ms is None else now_ms)


def mc_setup(partitioned: bool = False, dvs: bool = True) -> tuple[McTable, Files, AddFile, AddFile, AddFile]:
    """A big file (ids 0..9) and two small ones (10..14, 15..19)."""
    files = Files()
    parts = {"date": "2024-01-01"} if partitioned else {}
    big, s1, s2 = files.file(range(10), **parts), files.file(range(10, 15), **parts), files.file(range(15, 20), **parts)
    return McTable([big, s1, s2], ["date"] if partitioned else (), dvs=dvs), files, big, s1, s2


def compact(t: McTable, files: Files, inputs: Sequence[AddFile], read_version: int, kind: str) -> Proposal:
    p, _ = optimize(t, files, inputs, read_version)
    return replace(p, operation_parameters={**p.operation_parameters, "compaction": kind})


def output_vector(t: McTable, r: Accepted | Rejected | Duplicate) -> list[int]:
    assert isinstance(r, Accepted)
    out = [a for a in live_files(t) if a.deletion_vector is not None]
    assert len(out) == 1
    return inline_rows(out[0].deletion_vector).tolist()  # type: ignore[arg-type]


def info(r: Accepted | Rejected | Duplicate) -> dict[str, object]:
    assert isinstance(r, Accepted)
    ci = r.actions[0]
    assert isinstance(ci, CommitInfo)
    return dict(ci.values)


@pytest.mark.parametrize("partitioned", [False, True])
@pytest.mark.parametrize("kind", ["minor", "major"])
@pytest.mark.parametrize("op", ["UPDATE", "DELETE"])
def test_update_after_a_compaction_of_its_file_moves_to_the_output(partitioned: bool, kind: str, op: str) -> None:
    t, files, big, s1, s2 = mc_setup(partitioned)
    v = t.head
    inputs = [s1, s2] if kind == "minor" else [big, s1, s2]
    t.must_commit(compact(t, files, inputs, v, kind))
    new = [files.file([112], **dict(s1.partition_values))] if op == "UPDATE" else []
    r = t.run(delete(t, files, s1, [12], v, op=op, new=new))
    assert isinstance(r, Accepted), r
    assert files.visible(t) == sorted([x for x in range(20) if x != 12] + ([112] if new else []))
    # Row 12 is rank 2 of s1, which the output holds after the big file's 10 rows in a major compaction.
    assert output_vector(t, r) == [2 + (10 if kind == "major" else 0)]
    assert info(r)[TIME_VERSION_KEY] is True
    assert info(r)["deltacoord.rebase"] == {"over": [v + 1], "removesAdded": 0, "removesDropped": 0,
                                            "rowsMovedOver": [v + 1]}


@pytest.mark.parametrize("partitioned", [False, True])
@pytest.mark.parametrize("whole", [False, True], ids=["some-rows", "whole-file"])
def test_minor_compaction_after_an_update_of_its_input_marks_the_rows_in_its_output(partitioned: bool,
                                                                                   whole: bool) -> None:
    t, files, _, s1, s2 = mc_setup(partitioned)
    v = t.head
    gone = list(range(15, 20)) if whole else [16, 18]
    t.must_commit(delete(t, files, s2, gone, v))
    r = t.must_commit(compact(t, files, [s1, s2], v, "minor"))
    assert output_vector(t, r) == [5 + (x - 15) for x in gone]
    assert files.visible(t) == [x for x in range(20) if x not in gone]
    assert info(r)[TIME_VERSION_KEY] is False  # still no time version: every file action dataChange=false
    assert info(r)["deltacoord.rebase"]["rowsMovedOver"] == [v + 1]
    assert all(not a.data_change for a in r.actions if isinstance(a, (AddFile, RemoveFile)))


def test_major_after_an_update_still_fails() -> None:
    t, files, big, s1, s2 = mc_setup()
    v = t.head
    t.must_commit(delete(t, files, s1, [12], v))
    r = t.decide(compact(t, files, [big, s1, s2], v, "major"))
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentJobException)


@pytest.mark.parametrize("first", ["compact", "delete"])
def test_without_deletion_vectors_the_refusal_names_them(first: str) -> None:
    t, files, _, s1, s2 = mc_setup(dvs=False)
    v = t.head
    whole = delete(t, files, s1, list(range(10, 15)), v)  # no vectors: the whole file goes
    minor = compact(t, files, [s1, s2], v, "minor")
    t.must_commit(minor if first == "compact" else whole)
    r = t.decide(whole if first == "compact" else minor)
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentJobException)
    assert "delta.enableDeletionVectors = true" in str(r.error)


def test_without_a_row_map_the_update_fails_naming_why() -> None:
    t, files, _, s1, s2 = mc_setup()
    v = t.head
    p = compact(t, files, [s1, s2], v, "minor")
    t.must_commit(replace(p, commit_info=CommitInfo({"engineInfo": "tests"})))
    r = t.decide(delete(t, files, s1, [12], v))
    assert isinstance(r, Rejected) and isinstance(r.error, ConcurrentJobException)
    assert "no row map recorded" in str(r.error)
    assert files.visible(t) == list(range(20))


def test_an_update_follows_two_compactions() -> None:
    """MINOR merges s1 and s2 into m, then a MAJOR that read it merges the big file and m into o; a DELETE of a
    row of s2 from before both lands in o."""
    t, files, big, s1, s2 = mc_setup()
    v = t.head
    t.must_commit(compact(t, files, [s1, s2], v, "minor"))
    [m] = [a for a in live_files(t) if a.path not in (big.path, s1.path, s2.path)]
    t.must_commit(compact(t, files, [big, m], t.head, "major"))
    r = t.run(delete(t, files, s2, [19], v))
    assert isinstance(r, Accepted), r
    assert output_vector(t, r) == [19]  # o holds big's 10 rows, then s1's 5, then s2's
    assert files.visible(t) == list(range(19))
