"""Compactions on deletion-vector tables: moving deleted rows across an OPTIMIZE. Pure rules, no I/O.

The seed documents: on a table with deletion vectors, OPTIMIZE cannot conflict
with DELETE, UPDATE or MERGE (nor with another OPTIMIZE) unless ZORDER BY is
used. Committing both must still lose no update and resurrect no row, so a
compaction records where each merged row went (`deltacoord.schemas.row_map`) and the
coordinator moves the other side's deleted rows through that map:

* the compaction committed first (the *winner*), a DELETE/UPDATE/MERGE second:
  the rows it deleted in a merged file (new vector minus the old one, or every
  live row when it removed the whole file) are deleted in the compaction's
  output instead: its remove/add pair of the merged file becomes one of the
  output file, with the output's vector plus those rows;
* the DELETE/UPDATE/MERGE (or any commit that removed a merged file, another
  compaction included) first, the compaction second: the compaction's output
  gets a vector marking the rows the winner deleted, and its remove of the
  merged file names the winner's vector (or is dropped when the winner removed
  the file); an output with every row deleted is not added.

Row `r` of a merged file is its `rank(r)`-th live row under the vector the
compaction read (its *basis*), hence `rank(r) = r - |{d in basis: d < r}|`.
Vectors are decoded only when inline (`storageType = 'i'`); any other vector,
a missing or inconsistent map, or a ZORDER BY (rows reordered) leaves the
file-level rules in force.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from deltacoord.coordinator.rules.row_level import Rows, decoded, same_vector
from deltacoord.schemas.actions import Action, AddFile, RemoveFile
from deltacoord.schemas.row_map import ROW_MAP_KEY, decode_row_map, zorder_columns


@dataclass(frozen=True, slots=True)
class Segment:
    """Ranks `first`..`first+count-1` of a merged file are rows `at`..`at+count-1` of `target`."""

    target: str
    at: int
    first: int
    count: int


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the live rows of one merged file went."""

    source: str
    rows: int
    #: Rows the compaction's basis vector marks deleted (sorted), or None when it cannot be decoded.
    basis: Rows | None
    segments: tuple[Segment, ...]

    def ranks(self, rows: Rows) -> Rows | None:
        """The ranks of physical rows of the merged file; None when one is not a live row of the basis."""
        if self.basis is None:
            return None
        if not len(rows):
            return np.zeros(0, dtype=np.uint64)
        if len(self.basis) and len(np.intersect1d(rows, self.basis, assume_unique=True)):
            return None
        ranks = rows - np.searchsorted(self.basis, rows).astype(np.uint64)
        if int(ranks[-1]) >= self.rows:
            return None
        return ranks

    def every_rank(self) -> Rows:
        return np.arange(self.rows, dtype=np.uint64)

    def targets(self, ranks: Rows) -> dict[str, Rows]:
        """The rows of the output files that the given ranks became, by output path."""
        out: dict[str, Rows] = {}
        for s in self.segments:
            lo, hi = np.searchsorted(ranks, [s.first, s.first + s.count])
            if hi > lo:
                out[s.target] = ranks[lo:hi] - np.uint64(s.first) + np.uint64(s.at)
        return out


@dataclass(frozen=True, slots=True)
class Compaction:
    """A row-mapped compaction's placements by merged path, its output files and their row counts by path."""

    placements: Mapping[str, Placement]
    outputs: Mapping[str, AddFile]
    sizes: Mapping[str, int]


#: Operations that rewrite files without changing rows and may carry a row map: OPTIMIZE, and REORG ... APPLY
#: (PURGE), which rewrites files to drop the rows their deletion vectors delete.
ROW_MAPPED_OPERATIONS = frozenset({"OPTIMIZE", "REORG"})


def is_zorder(operation: str | None, parameters: Mapping[str, Any] | None) -> bool:
    """An OPTIMIZE ... ZORDER BY (its rows are reordered: no row map can hold)."""
    return operation == "OPTIMIZE" and isinstance(parameters, Mapping) and bool(zorder_columns(parameters))


def compaction_of(operation: str | None, parameters: Mapping[str, Any] | None, info: Mapping[str, Any],
                  actions: Iterable[Action], *, committed: bool) -> Compaction | None:
    """The row map of an OPTIMIZE (`info` is its commitInfo), checked against its actions; None when there is
    none to rely on.

    A proposal (`committed=False`) must remove each merged file with the vector the map names as its basis and
    add each output, all with dataChange=false, an output's numRecords (when its stats give one) being its row
    count in the map. A committed compaction may lack the removes and outputs its rebase dropped (a merged file
    a concurrent commit removed, an output left without rows): those have no placement.
    """
    if operation not in ROW_MAPPED_OPERATIONS or is_zorder(operation, parameters):
        return None
    groups = decode_row_map(info.get(ROW_MAP_KEY))
    if groups is None:
        return None
    removed: dict[str, RemoveFile] = {}
    added: dict[str, AddFile] = {}
    for a in actions:
        if isinstance(a, RemoveFile):
            removed[a.path] = a
        elif isinstance(a, AddFile):
            added[a.path] = a
    placements: dict[str, Placement] = {}
    outputs: dict[str, AddFile] = {}
    sizes: dict[str, int] = {}
    for g in groups:
        for t in g.targets:
            out = added.get(t.path)
            if out is None and committed:
                continue
            if out is None or out.data_change or out.num_records() not in (None, t.rows):
                return None
            outputs[t.path] = out
            sizes[t.path] = t.rows
        # Walk the sources' ranks and the targets' rows side by side.
        ti, t_used = 0, 0
        for s in g.sources:
            segments: list[Segment] = []
            first = 0
            while first < s.rows:
                t = g.targets[ti]
                n = min(s.rows - first, t.rows - t_used)
                segments.append(Segment(t.path, t_used, first, n))
                first += n
                t_used += n
                if t_used == t.rows:
                    ti, t_used = ti + 1, 0
            r = removed.get(s.path)
            if r is None and committed:
                continue
            if r is None or r.data_change or (not committed and not same_vector(r.deletion_vector, s.basis)):
                return None
            placements[s.path] = Placement(s.path, s.rows, decoded(s.basis), tuple(segments))
    return Compaction(placements, outputs, sizes)


__all__ = ["ROW_MAPPED_OPERATIONS", "Compaction", "Placement", "Segment", "compaction_of", "is_zorder"]
