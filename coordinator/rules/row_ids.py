"""Row ids for a commit of a row-tracking table, assigned by the coordinator when it accepts the commit.

Delta writers assign `baseRowId`s themselves from the high-water mark of the version they read, so two
concurrent appends claim the same ids and Delta Spark has to re-assign them on conflict. Here the one
coordinator of the table assigns them at decision time, in version order: a file a commit adds fresh gets
the next `numRecords` ids and `defaultRowCommitVersion` = the commit's version; a file re-added with a new
deletion vector keeps the ids and version of the file it replaces; the commit carries the new high-water
mark. A writer never writes the `delta.rowTracking` domain (a proposal's own is replaced).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from deltacoord.schemas.actions import Action, AddFile, DomainMetadata, RemoveFile
from deltacoord.schemas.row_tracking import DOMAIN, high_water_mark_action


def num_records(add: AddFile) -> int | None:
    """The file's physical row count from its stats (None when the stats do not say, or say a negative count)."""
    n = add.num_records()
    return n if n is not None and n >= 0 else None


def missing_num_records(actions: Sequence[Action]) -> list[str]:
    """Paths of fresh files without numRecords: their rows cannot be given ids."""
    replaced = {a.path for a in actions if isinstance(a, RemoveFile)}
    return [a.path for a in actions if isinstance(a, AddFile) and a.path not in replaced and num_records(a) is None]


def assign_row_ids(actions: Sequence[Action], hwm: int, version: int) -> tuple[Action, ...]:
    """`actions` with row ids assigned from the high-water mark `hwm`, committed as `version`.

    Every add gets both fields, fresh or kept; a domain action with the new mark is appended when fresh
    ids were handed out. Files without numRecords must have been refused (`missing_num_records`).
    """
    removed = {a.path: a for a in actions if isinstance(a, RemoveFile)}
    out: list[Action] = []
    mark = hwm
    for a in actions:
        if isinstance(a, DomainMetadata) and a.domain == DOMAIN:
            continue
        if isinstance(a, AddFile):
            old = removed.get(a.path)
            if old is not None and (a.base_row_id is not None or old.base_row_id is not None):
                base = old.base_row_id if old.base_row_id is not None else a.base_row_id
                commit = old.default_row_commit_version if old.default_row_commit_version is not None \
                    else a.default_row_commit_version
                a = replace(a, base_row_id=base, default_row_commit_version=commit if commit is not None else version)
            else:
                n = num_records(a)
                assert n is not None, f"{a.path} has no numRecords (refused by validation)"
                a = replace(a, base_row_id=mark + 1, default_row_commit_version=version)
                mark += n
        out.append(a)
    if mark != hwm:
        out.append(high_water_mark_action(mark))
    return tuple(out)


__all__ = ["assign_row_ids", "missing_num_records", "num_records"]
