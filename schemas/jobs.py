"""MaxCompute job types and time versions, derived from what every Delta commit already says.

MaxCompute's transaction rules (the `maxcompute` conflict profile) decide a
pair of concurrent jobs by their *job types*. A Delta commit names its
operation and parameters in commitInfo, which is enough to tell the type
without a new field on the wire:

=======================  ==========================================================
job type                 Delta operation (commitInfo.operation + operationParameters)
=======================  ==========================================================
INSERT OVERWRITE         `WRITE` / `CREATE OR REPLACE TABLE AS SELECT` with mode `Overwrite`,
                         `STREAMING UPDATE` with outputMode `Complete`, `TRUNCATE`
INSERT INTO              `WRITE` with mode `Append` (or no mode), `STREAMING UPDATE` otherwise
UPDATE/DELETE            `UPDATE`, `DELETE`, `MERGE`
MINOR COMPACTION         `OPTIMIZE` (parameter `compaction` absent or `minor`)
MAJOR COMPACTION         `OPTIMIZE` with parameter `compaction` = `major`
=======================  ==========================================================

Anything else (CREATE TABLE, SET TBLPROPERTIES, ADD COLUMNS, ...) is no job
of the table: it is decided by Delta's metadata rules alone.

Time versions: MaxCompute gives every commit an ID version (here: the Delta
version) and only commits that change logical data a *time version*;
compaction and clustering reorganise files without changing a row, so they
make none and incremental reads by time skip them. A commit makes a time
version unless each of its file actions has dataChange=false and it changes
neither metadata nor protocol. The coordinator records the answer as
`commitInfo["deltacoord.timeVersion"]` on `maxcompute` tables; readers fall
back to the same rule for commits without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from deltacoord.schemas.actions import Action, AddCDCFile, AddFile, CommitInfo, Metadata, Protocol, RemoveFile

#: commitInfo key holding whether the commit created a new time version (true/false).
TIME_VERSION_KEY = "deltacoord.timeVersion"
#: operationParameters key of OPTIMIZE choosing the compaction kind (`minor` or `major`).
COMPACTION_PARAMETER = "compaction"


class JobType(StrEnum):
    """The five job types of MaxCompute's conflict table (rows and columns in this order)."""

    INSERT_OVERWRITE = "INSERT OVERWRITE/TRUNCATE"
    INSERT_INTO = "INSERT INTO"
    UPDATE_DELETE = "UPDATE/DELETE"
    MINOR_COMPACTION = "MINOR COMPACTION"
    MAJOR_COMPACTION = "MAJOR COMPACTION"

    @property
    def compaction(self) -> bool:
        return self in (JobType.MINOR_COMPACTION, JobType.MAJOR_COMPACTION)


#: The table's order: rows (earlier-finishing job) and columns (later-finishing job).
JOB_TYPES: tuple[JobType, ...] = tuple(JobType)

_OVERWRITE_OPERATIONS = frozenset({"WRITE", "CREATE TABLE AS SELECT", "REPLACE TABLE AS SELECT",
                                   "CREATE OR REPLACE TABLE AS SELECT"})
_ROW_OPERATIONS = frozenset({"UPDATE", "DELETE", "MERGE"})


def _param(parameters: Mapping[str, Any], key: str) -> str:
    v = parameters.get(key)
    if not isinstance(v, str):
        return ""
    return v.strip().strip('"').lower()


def job_type(operation: str | None, parameters: Mapping[str, Any]) -> JobType | None:
    """The job type of a Delta operation, or None when it is not a data job (see the module doc)."""
    op = (operation or "").strip().upper()
    if op in _OVERWRITE_OPERATIONS:
        mode = _param(parameters, "mode")
        return JobType.INSERT_OVERWRITE if mode == "overwrite" else JobType.INSERT_INTO
    if op == "STREAMING UPDATE":
        mode = _param(parameters, "outputMode")
        return JobType.INSERT_OVERWRITE if mode == "complete" else JobType.INSERT_INTO
    if op == "TRUNCATE":
        return JobType.INSERT_OVERWRITE
    if op in _ROW_OPERATIONS:
        return JobType.UPDATE_DELETE
    if op == "OPTIMIZE":
        kind = _param(parameters, COMPACTION_PARAMETER)
        return JobType.MAJOR_COMPACTION if kind == "major" else JobType.MINOR_COMPACTION
    return None


def commit_job_type(commit_info: CommitInfo | None) -> JobType | None:
    """The job type of a committed version, from its commitInfo."""
    if commit_info is None:
        return None
    params = commit_info.values.get("operationParameters")
    return job_type(commit_info.operation, params if isinstance(params, Mapping) else {})


def creates_time_version(actions: Iterable[Action]) -> bool:
    """Whether a commit's actions make a new time version (see the module doc)."""
    files = 0
    for a in actions:
        if isinstance(a, (Metadata, Protocol)):
            return True
        if isinstance(a, (AddFile, RemoveFile, AddCDCFile)):
            if a.data_change:
                return True
            files += 1
    return files == 0


def is_time_version(commit_info: CommitInfo | None, actions: Iterable[Action]) -> bool:
    """What a commit records (`deltacoord.timeVersion`), else the rule applied to its actions."""
    if commit_info is not None:
        recorded = commit_info.values.get(TIME_VERSION_KEY)
        if isinstance(recorded, bool):
            return recorded
    return creates_time_version(actions)


__all__ = ["COMPACTION_PARAMETER", "JOB_TYPES", "TIME_VERSION_KEY", "JobType", "commit_job_type",
           "creates_time_version", "is_time_version", "job_type"]
