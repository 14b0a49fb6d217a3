"""Row-level concurrency on deletion-vector tables: pure rules, no I/O.

The seed documents' "write conflicts with row-level concurrency": on a table
with deletion vectors enabled and no partition columns, DELETE, UPDATE and
MERGE that change different rows of the same file do not conflict.

What a transaction changed is in its proposal: a deletion-vector update of a
file is a `remove`/`add` pair with the same path, the remove carrying the
vector the writer read and the add the new one; the rows it newly deleted
(deleted or updated rows: an UPDATE rewrites its rows to new files) are the
new vector minus the old. Inline vectors (`i`) are decoded here; a vector in a
file would need I/O, so such an update falls back to the file-level rules.
The writer keeps vectors inline up to `schemas.deletion_vectors.DEFAULT_INLINE_MAX_BYTES`.

When a winner and the current transaction both replaced the vector of one
file and their changed rows are disjoint, the current transaction is rebased:
its remove names the winner's vector and its add carries the union, inline.
Rows the winner's UPDATE or MERGE wrote to new files are matched against the
current transaction's read predicates by the files' min/max statistics
(`schemas.expressions.stats`), so a concurrent change of other rows does not
conflict while one whose new rows the current transaction would have read does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from schemas.actions import Action, AddFile, DeletionVector, Metadata, RemoveFile
from schemas.deletion_vectors import DeletionVectorError, inline_descriptor, inline_rows
from schemas.expressions.syntax import ExpressionError
from schemas.properties import TableProperties

if TYPE_CHECKING:
    import pyarrow as pa

Rows = npt.NDArray[np.uint64]


@dataclass(frozen=True, slots=True)
class DvUpdate:
    """One file's deletion vector replaced in a commit: `remove` (old vector) and `add` (new vector)."""

    remove: RemoveFile
    add: AddFile

    @property
    def path(self) -> str:
        return self.add.path

    @property
    def old(self) -> DeletionVector | None:
        return self.remove.deletion_vector

    @property
    def new(self) -> DeletionVector:
        assert self.add.deletion_vector is not None
        return self.add.deletion_vector


def row_level_table(metadata: Metadata | None) -> bool:
    """Row-level concurrency applies: deletion vectors enabled and no partition columns (the seeds' first case)."""
    return metadata is not None and not metadata.partition_columns and TableProperties.of(metadata).deletion_vectors


def dv_updates(actions: Iterable[Action]) -> dict[str, DvUpdate]:
    """The deletion-vector updates of a commit, by path: a remove and an add of one path, the add with a vector."""
    removes: dict[str, RemoveFile] = {}
    adds: dict[str, AddFile] = {}
    for a in actions:
        if isinstance(a, RemoveFile):
            removes[a.path] = a
        elif isinstance(a, AddFile) and a.deletion_vector is not None:
            adds[a.path] = a
    return {p: DvUpdate(removes[p], add) for p, add in adds.items() if p in removes}


def _rows(dv: DeletionVector | None) -> Rows | None:
    if dv is None:
        return np.zeros(0, dtype=np.uint64)
    if dv.storage_type != "i":
        return None
    try:
        return inline_rows(dv)
    except DeletionVectorError:
        return None


def changed_rows(update: DvUpdate) -> Rows | None:
    """Rows the update newly deleted (new vector minus old); None when a vector is not inline
    (or does not decode), which sends the file back to the file-level rules."""
    old, new = _rows(update.old), _rows(update.new)
    if old is None or new is None:
        return None
    return np.setdiff1d(new, old, assume_unique=True)


def same_vector(a: DeletionVector | None, b: DeletionVector | None) -> bool:
    return (a.unique_id() if a else None) == (b.unique_id() if b else None)


def rebased_update(current: DvUpdate, current_rows: Rows, winner: DvUpdate) -> DvUpdate | None:
    """`current` moved on top of `winner` (same file, disjoint rows): it removes the winner's vector and adds
    the union of the winner's vector and its own rows, inline. None when the winner's vector is not inline."""
    base = _rows(winner.new)
    if base is None:
        return None
    union = np.union1d(base, current_rows)
    return DvUpdate(replace(current.remove, deletion_vector=winner.new, stats=winner.add.stats),
                    replace(current.add, deletion_vector=inline_descriptor(union)))


def _stats_schema(metadata: Metadata) -> pa.Schema:
    """The top-level primitive columns (a condition on any other column cannot skip a file).

    Arrow is imported here, not at module level: the deciding process loads it only for row-level tables.
    """
    import pyarrow as pa

    primitives = {"string": pa.string(), "long": pa.int64(), "integer": pa.int32(), "short": pa.int16(),
                  "byte": pa.int8(), "float": pa.float32(), "double": pa.float64(), "boolean": pa.bool_(),
                  "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us")}
    fields = metadata.schema().get("fields", [])
    return pa.schema([pa.field(f["name"], primitives[f["type"]]) for f in fields
                      if isinstance(f.get("type"), str) and f["type"] in primitives])


class NewRowMatcher:
    """Whether files a winner added may hold rows the current transaction's read predicates select (stats)."""

    def __init__(self, predicates: Sequence[str], metadata: Metadata) -> None:
        self.tests: list[Callable[[AddFile], bool]] = []
        self.everything = not predicates
        if self.everything:
            return
        from schemas.expressions.stats import file_filter  # Arrow, only for row-level tables

        try:
            schema = _stats_schema(metadata)
            self.tests = [file_filter(p, schema, metadata.partition_columns) for p in predicates]
        except (ExpressionError, ValueError, KeyError, TypeError):
            self.everything = True  # a condition the stats cannot judge: every new file may match

    def first_match(self, files: Iterable[AddFile]) -> AddFile | None:
        for f in files:
            if self.everything or any(t(f) for t in self.tests):
                return f
        return None


__all__ = ["DvUpdate", "NewRowMatcher", "changed_rows", "dv_updates", "rebased_update", "row_level_table", "same_vector"]
