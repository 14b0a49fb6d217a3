"""Where a compaction put each row: the row map an OPTIMIZE records in its commitInfo.

A compaction without ZORDER BY concatenates the live rows of the files it
merges, in order, and writes them out in order. Recording that order makes a
deletion vector portable across the compaction: row `r` of a merged file is
the `rank(r)`-th live row of that file, which is one known position of one
output file. With it the coordinator lets OPTIMIZE and DELETE/UPDATE/MERGE on
a deletion-vector table commit in either order (the seed documents: "OPTIMIZE
cannot conflict unless ZORDER BY is used"), moving the rows the other side
deleted onto the right file (`deltacoord.coordinator.rules.compaction`). A ZORDER BY
reorders rows, so it records no map and keeps the file-level rules.

The map is `commitInfo["deltacoord.rowMap"]`, a list of groups::

    {"sources": [[path, liveRows, deletionVector or null], ...],
     "targets": [[path, rows], ...]}

The live rows of the sources (physical order, rows the source's deletion
vector -- the one the compaction read, its *basis* -- marks are skipped),
concatenated in the order listed, are the rows of the targets, concatenated in
the order listed. Both counts add up to the same total.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deltacoord.schemas.actions import DeletionVector

#: commitInfo key of a compaction's row map.
ROW_MAP_KEY = "deltacoord.rowMap"
#: OPTIMIZE's operationParameters key listing the ZORDER BY columns (a JSON list; "[]" without one), as Delta writes it.
ZORDER_PARAMETER = "zOrderBy"


@dataclass(frozen=True, slots=True)
class Source:
    """A merged file: its `rows` live rows under `basis` (the vector the compaction read) in physical order."""

    path: str
    rows: int
    basis: DeletionVector | None


@dataclass(frozen=True, slots=True)
class Target:
    """An output file of `rows` rows."""

    path: str
    rows: int


@dataclass(frozen=True, slots=True)
class RowGroup:
    """The sources' live rows, concatenated, are the targets' rows, concatenated."""

    sources: tuple[Source, ...]
    targets: tuple[Target, ...]


def encode_row_map(groups: Sequence[RowGroup]) -> list[dict[str, Any]]:
    """The commitInfo value of a row map."""
    return [{"sources": [[s.path, s.rows, None if s.basis is None else s.basis.to_json()] for s in g.sources],
             "targets": [[t.path, t.rows] for t in g.targets]} for g in groups]


def _count(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise ValueError(f"row count {v!r} is not a non-negative integer")
    return v


def _path(v: Any) -> str:
    if type(v) is not str or not v:
        raise ValueError(f"path {v!r} is not a non-empty string")
    return v


def _vector(v: Any) -> DeletionVector | None:
    if v is None:
        return None
    dv = DeletionVector.from_json(v)
    if not (type(dv.storage_type) is str and type(dv.path_or_inline_dv) is str and type(dv.size_in_bytes) is int
            and type(dv.cardinality) is int and (dv.offset is None or type(dv.offset) is int)):
        raise ValueError("deletion vector descriptor with fields of the wrong types")
    return dv


def decode_row_map(value: Any) -> tuple[RowGroup, ...] | None:
    """The groups of a commitInfo row map; None when it is absent or malformed (the file-level rules then apply)."""
    if not isinstance(value, list) or not value:
        return None
    groups: list[RowGroup] = []
    try:
        for g in value:
            sources = tuple(Source(_path(p), _count(n), _vector(dv)) for p, n, dv in g["sources"])
            targets = tuple(Target(_path(p), _count(n)) for p, n in g["targets"])
            if not sources or sum(s.rows for s in sources) != sum(t.rows for t in targets):
                return None
            groups.append(RowGroup(sources, targets))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    paths = [s.path for g in groups for s in g.sources]
    outputs = [t.path for g in groups for t in g.targets]
    if len(set(paths)) != len(paths) or len(set(outputs)) != len(outputs):
        return None
    return tuple(groups)


def zorder_columns(parameters: Mapping[str, Any]) -> list[str]:
    """The ZORDER BY columns of an OPTIMIZE's operationParameters ([] without ZORDER BY, or when unreadable as such)."""
    raw = parameters.get(ZORDER_PARAMETER)
    if raw is None:
        return []
    try:
        cols = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return [str(raw)]  # present but not a JSON list: treat it as a ZORDER BY (the file-level rules)
    if isinstance(cols, list):
        return [str(c) for c in cols]
    return [str(cols)]


__all__ = ["ROW_MAP_KEY", "ZORDER_PARAMETER", "RowGroup", "Source", "Target", "decode_row_map", "encode_row_map",
           "zorder_columns"]
