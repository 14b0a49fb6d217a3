"""The maxcompute profile's pure parts: the table as the seed states it, job types, time versions."""

from __future__ import annotations

import pytest

from coordinator.rules.maxcompute import TABLE, Cell
from schemas.actions import AddFile, CommitInfo, Metadata, RemoveFile
from schemas.jobs import TIME_VERSION_KEY, JobType, creates_time_version, is_time_version, job_type

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
